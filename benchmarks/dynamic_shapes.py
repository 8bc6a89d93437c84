"""Dynamic shapes through torch.compile over the model zoo: one compile, three input sizes.

    python benchmarks/dynamic_shapes.py [--families] [model ...]

Each zoo model is compiled once with ``torch.compile(model, backend="graphkernel",
dynamic=True)`` (inference, no grad) and called with three input sizes: three sequence
lengths for the text and audio models, three batch sizes for the vision models and Whisper's
encoder (their configs fix the image size and the number of frames). A row prints the graphs
graphkernel compiled, Dynamo's recompiles, which input dims stayed symbolic, the launches of
the compiled graphs and how many kernels the code generator could not generate for symbolic
sizes (each falls back to one launch per op: "cg fallb"), whether every
call matched eager (accuracy.md: fp32 against eager fp32) and the seconds of the first call
and of the two later ones (which must not compile again). A ``generate()`` loop (three
prompt lengths) may make two graphs: the prompt's and one new token's against the growing
cache (the second is Dynamo's one recompile).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from graphkernel import progress  # noqa: E402

TEXT_LENGTHS = (8, 16, 24)
AUDIO_LENGTHS = (400, 480, 560)
BATCHES = (2, 3, 4)  # not 1: Dynamo specialises a size-1 dim even with dynamic=True


def sizes(name: str, example) -> list[tuple]:
    """Three argument tuples for ``name``, varying what the model's config leaves free: the
    length of its token ids (every int64 input), else a raw waveform's length, else the
    batch of every input."""
    import torch

    g = torch.Generator().manual_seed(1)
    if any(x.dtype == torch.int64 for x in example):  # token ids: vary the sequence length
        base = min(x.shape[1] for x in example if x.dtype == torch.int64)
        return [tuple(torch.randint(0, int(x.max()) + 1, (x.shape[0], n * base // 16),
                                    generator=g)
                      if x.dtype == torch.int64 else x for x in example)
                for n in TEXT_LENGTHS]
    if len(example) == 1 and example[0].dim() == 2:  # raw audio: vary the number of samples
        return [(torch.rand(example[0].shape[0], n, generator=g) * 2 - 1,)
                for n in AUDIO_LENGTHS]
    return [tuple(torch.rand(b, *x.shape[1:], generator=g) for x in example) for b in BATCHES]


def label(calls: list[tuple]) -> str:
    """'length 8, 16, 24' or 'batch 2, 3, 4': the first axis that varies over ``calls``."""
    for i, x in enumerate(calls[0]):
        for axis, n in enumerate(x.shape):
            if n != calls[1][i].shape[axis]:
                return (("batch " if axis == 0 else "length ")
                        + ", ".join(str(c[i].shape[axis]) for c in calls))
    return "-"


def graphs_allowed(name: str) -> int:
    """Graphs one compile may make: 1; a generate() loop's model 2 (the prompt's graph and
    the graph of one new token against the growing cache)."""
    from export_models import family

    return 2 if family(name) == "kv-cache" else 1


def dynamo_graphs(model, calls) -> int:
    """Graphs Dynamo itself makes of ``model`` under ``dynamic=True`` over ``calls``, with a
    backend that runs each graph as it is (``backend="eager"``): the floor no backend can go
    under (a Python branch or a size-1 specialisation on the length recompiles whatever
    the backend; Mamba's associative scan recurses on halves of the length)."""
    import torch
    from export_models import compile_model

    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = compile_model(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for args in calls:
            compiled(*args)
    torch._dynamo.reset()
    return len(graphs)


def measure(model, calls) -> dict:
    import torch
    from export_models import compile_model

    import graphkernel.torch as gt

    torch._dynamo.reset()
    gt.reset_stats()
    compiled = compile_model(model, backend="graphkernel", dynamic=True)
    ok, seconds = True, []
    with torch.no_grad():
        for args in calls:
            want = model(*args)
            t0 = time.perf_counter()
            got = compiled(*args)
            seconds.append(time.perf_counter() - t0)
            try:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
            except AssertionError:
                ok = False
    s = gt.stats()
    symbolic = sorted({d for g in s["per_graph"] for d in g.get("symbols", [])})
    return {"graphs": s["graphs"], "recompiles": s["recompiles"], "symbolic": symbolic,
            "fallbacks": s["fallbacks"], "ok": ok, "first": seconds[0],
            "later": sum(seconds[1:]), "launches": sum(s["launches"].values()),
            "by_kind": s["launches"],
            "codegen_fallbacks": sum(g["codegen_fallbacks"] for g in s["per_graph"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="models to measure (default: the zoo)")
    ap.add_argument("--families", action="store_true",
                    help="also the further architectures (export_models.families)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    from export_models import select

    zoo = select(a.models, more=a.families)
    if zoo is None:
        return 2
    progress.auto()
    print("torch.compile(dynamic=True), inference: one compile serving three input sizes")
    print(f"{'model':<16} {'sizes':<22} {'graphs':>6} {'recompiles':>10} "
          f"{'symbolic dims':<18} {'launches':>8} {'cg fallb':>8} {'eager':<6} {'first s':>8} "
          f"{'later s':>8}")
    short = []
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            shown.describe(name)
            calls = sizes(name, inputs())
            r = measure(build(), calls)
            if r["graphs"] > graphs_allowed(name) or not r["ok"] or r["fallbacks"]:
                short.append(name)
            progress.write(
                f"{name:<16} {label(calls):<22} {r['graphs']:>6} "
                f"{r['recompiles']:>10} {','.join(r['symbolic']) or '-':<18} "
                f"{r['launches']:>8} {r['codegen_fallbacks']:>8} "
                f"{'match' if r['ok'] else 'DIFF':<6} {r['first']:>8.2f} {r['later']:>8.2f}",
                sys.stdout)
            shown.advance()
    print("one compile, three sizes, matching eager: "
          + ("every model" if not short else "not on " + ", ".join(short)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
