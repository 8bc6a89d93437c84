"""graphkernel vs TorchInductor (CPU) on the model zoo.

    python benchmarks/vs_inductor.py [--attn sdpa|eager] [--export] [model ...]

Table 1 is what a PyTorch user gets: each zoo model compiled with ``torch.compile`` on both
sides (inference, no grad, the same inputs, caches off, Dynamo reset in between).
Inductor's launches are read from its generated code: fused kernels (``cpp_fused_*``) and
extern calls (``extern_kernels.*``, its matmuls and convolutions, and the ATen ops it calls
as they are, ``torch.ops.aten.*``: its attention with sdpa models). graphkernel's are its
launches by kind (``graphkernel.torch.stats()``): vector kernels, cube (a matrix product
alone), mix (a product with fused vector work), extern and Opaque (ops run through torch).
Compile time is the first call on both sides (Dynamo + AOT + the backend); graphkernel's
outputs are checked against eager. The models are built with the library's default attention
(``--attn sdpa``: ``F.scaled_dot_product_attention``) or with eager attention (``--attn
eager``: explicit matmuls and softmax, as in the earlier tables); ``FA/layer`` is
graphkernel's fused-attention launches per attention layer (the layers counted in an eager
forward: calls of scaled_dot_product_attention or softmax), the target being 1.
Parameters are frozen on graphkernel's side (its default
under no_grad); Inductor reads them as inputs through strided views, which costs it nothing.

Table 2 (``--export``) is the export path: ``graphkernel.torch.export_graph`` + the pipeline
at opt_level 2, with graphkernel's fusion time (the passes up to split) against Inductor's
(the time spent in ``Scheduler.__init__``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from graphkernel import progress  # noqa: E402

KINDS = ("vector", "cube", "mix", "extern", "opaque")


def inductor(model, args):
    """(fused kernels, extern calls, fusion seconds, first-call seconds)."""
    import torch
    import torch._inductor.config as cfg
    import torch._inductor.scheduler as sched
    from torch._inductor.utils import run_and_get_code

    cfg.fx_graph_cache = False
    spent = {"s": 0.0}
    orig = sched.Scheduler.__init__

    def timed(self, *a, **k):
        t = time.perf_counter()
        orig(self, *a, **k)
        spent["s"] += time.perf_counter() - t

    sched.Scheduler.__init__ = timed
    try:
        torch._dynamo.reset()
        t0 = time.perf_counter()
        with torch.no_grad():
            _, code = run_and_get_code(torch.compile(model, backend="inductor"), *args)
        total = time.perf_counter() - t0
    finally:
        sched.Scheduler.__init__ = orig
    kernels = externs = 0
    for src in code:  # one module per compiled graph
        body = src[src.find("def call("):] if "def call(" in src else src
        kernels += len(set(re.findall(r"cpp_fused_\w+", src)))
        externs += len(re.findall(r"extern_kernels\.\w+\(", body))
        # ATen ops it calls as they are (its fallback kernels: scaled_dot_product_attention)
        externs += len(re.findall(r"= torch\.ops\.\w+\.\w+\.\w+\(", body))
    return kernels, externs, spent["s"], total


def ours_compiled(model, args):
    """(launches by kind, graphs, fallbacks, first-call seconds, matches eager)."""
    import torch

    import graphkernel.torch as gt

    torch._dynamo.reset()
    gt.reset_stats()
    with torch.no_grad():
        want = model(*args)
        t0 = time.perf_counter()
        got = torch.compile(model, backend="graphkernel")(*args)
        total = time.perf_counter() - t0
    try:  # accuracy.md: fp32 against eager fp32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
        ok = True
    except AssertionError:
        ok = False
    s = gt.stats()
    return s["launches"], s["graphs"], s["fallbacks"], total, ok


def ours_exported(model, args, name):
    """(vector kernels, other launches, GM bytes, fusion seconds, seconds)."""
    import graphkernel
    import graphkernel.torch as gt

    t0 = time.perf_counter()
    g = gt.export_graph(model, args, name=name)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    total = time.perf_counter() - t0
    until_split = sum(p.seconds for p in res.report.passes
                      if p.stage in ("preprocess", "expand", "simplify", "cluster", "split"))
    by_kind = gt.launch_counts(res.graph)
    return (by_kind["vector"], sum(by_kind.values()) - by_kind["vector"],
            res.report.extra["gm_bytes_fused"], until_split, total)


def warm_up() -> None:
    """Pay each side's one-time costs (imports, Inductor's C++ toolchain) outside the table."""
    import torch

    import graphkernel.torch as gt

    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.rand(2, 8)
    inductor(m, (x,))
    ours_compiled(m, (x,))
    gt.reset_stats()


def compiled_table(zoo) -> None:
    from export_models import attention_layers

    print("torch.compile, inference (launches: Inductor fused + extern; graphkernel by kind)")
    print(f"{'model':<16} {'ind fused':>9} {'extern':>6} {'total':>5} | {'vector':>6} "
          f"{'cube':>4} {'mix':>3} {'extern':>6} {'opaque':>6} {'total':>5} {'FA/layer':>8} | "
          f"{'compile s (ind/ours)':>20}  eager")
    misses, fallbacks, wrong, unfused = [], {}, [], []
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            shown.describe(f"{name}: Inductor")
            model, args = build(), inputs()
            k, e, _, t_ind = inductor(model, args)
            shown.describe(f"{name}: graphkernel")
            launches, _, fb, t_ours, ok = ours_compiled(model, args)
            layers = attention_layers(model, args)
            total = sum(launches.values())
            if total > k + e:
                misses.append(f"{name} {total}/{k + e}")
            if not ok:
                wrong.append(name)
            if layers and launches["extern"] != layers:
                unfused.append(f"{name} {launches['extern']}/{layers}")
            fallbacks.update(fb)
            per = f"{launches['extern'] / layers:g}" if layers else "-"
            progress.write(f"{name:<16} {k:>9} {e:>6} {k + e:>5} | "
                           + " ".join(f"{launches[x]:>{max(len(x), 3)}}" for x in KINDS)
                           + f" {total:>5} {per:>8} | {t_ind:>9.2f} / {t_ours:<8.2f}  "
                           + ("match" if ok else "DIFF"), sys.stdout)
            shown.advance()
    print("launches <= Inductor's (fused + extern): "
          + ("met on every model" if not misses else "missed on " + ", ".join(misses)))
    print("one fused attention per attention layer: " + (
        "every model" if not unfused else "not on " + ", ".join(unfused)))
    print("outputs match eager: " + ("every model" if not wrong else "not on " + ", ".join(wrong)))
    print("Opaque fallbacks: " + ("none" if not fallbacks else
                                  "; ".join(f"{k}: {v}" for k, v in sorted(fallbacks.items()))))


def export_table(zoo) -> None:
    print("torch.export + pipeline at opt_level 2")
    print(f"{'model':<16} {'ind fused':>9} {'extern':>6} | {'vector':>6} {'other':>5} "
          f"{'GM MB':>6} | {'fusion s (ind/ours)':>20} {'compile s (ind/ours)':>21}")
    worst = 0.0
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            shown.describe(f"{name}: Inductor")
            model, args = build(), inputs()
            k, e, s_ind, t_ind = inductor(model, args)
            shown.describe(f"{name}: graphkernel")
            v, o, gm, s_ours, t_ours = ours_exported(model, args, name)
            worst = max(worst, s_ours / t_ind)
            progress.write(f"{name:<16} {k:>9} {e:>6} | {v:>6} {o:>5} {gm / 2**20:>6.2f} | "
                           f"{s_ind:>9.3f} / {s_ours:<8.3f} {t_ind:>9.2f} / {t_ours:<9.2f}",
                           sys.stdout)
            shown.advance()
    print(f"pipeline time / Inductor end-to-end compile: worst {worst:.3f} (target <= 0.1)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="zoo models to measure (default: all)")
    ap.add_argument("--export", action="store_true", help="also print the export-path table")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                    help="the models' attention: the library default (sdpa) or eager")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)  # fallbacks: in the table
    from export_models import select

    zoo = select(a.models, a.attn)
    if zoo is None:
        return 2
    progress.auto()  # on a terminal: which model
    warm_up()
    compiled_table(zoo)
    if a.export:
        print()
        export_table(zoo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
