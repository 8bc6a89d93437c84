"""A training step through torch.compile over the model zoo: gradients against eager.

    python benchmarks/zoo_training.py [model ...]

Each zoo model (eval mode, so dropout draws nothing on either side) runs one step of
``model(x).pow(2).mean().backward()`` eagerly and through ``torch.compile(model,
backend="graphkernel")``; a row prints the graphs compiled (forward and backward), launches
by kind over both, the ATen ops left to torch (Opaque) with their reasons, the seconds of
the compiled step, and whether every parameter's gradient matches eager (accuracy.md:
rtol 1e-3, atol 1e-5 for fp32 gradients, the same None pattern). Where that check fails,
the judge is accuracy.md's: a float64 copy of the model gives the reference, and graphkernel's
gradient is wrong only when its RMSE against it is more than twice eager fp32's own (an
ill-conditioned gradient, such as DeiT's class token through two LayerNorms, is noise in
eager fp32 too).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from graphkernel import progress  # noqa: E402

KINDS = ("vector", "cube", "mix", "extern", "opaque")


def step(model, args) -> tuple[dict, dict, float, bool]:
    """(stats, mismatching parameters, seconds of the compiled step, grads match)."""
    import torch

    import graphkernel.torch as gt

    def grads(fn):
        model.zero_grad(set_to_none=True)
        fn(*args).pow(2).mean().backward()
        return {k: p.grad for k, p in model.named_parameters()}

    torch._dynamo.reset()
    gt.reset_stats()
    exact = copy.deepcopy(model).double()  # before any step: the same weights in float64
    want = grads(model)
    t0 = time.perf_counter()
    got = grads(torch.compile(model, backend="graphkernel"))
    seconds = time.perf_counter() - t0
    bad, ref = {}, None
    for k, g in want.items():
        if (g is None) != (got[k] is None):
            bad[k] = "None on one side"
        elif g is not None:
            try:
                torch.testing.assert_close(got[k], g, rtol=1e-3, atol=1e-5)
            except AssertionError:
                if ref is None:
                    exact.zero_grad(set_to_none=True)
                    exact(*(a.double() if a.is_floating_point() else a for a in args)
                          ).pow(2).mean().backward()
                    ref = {n: p.grad for n, p in exact.named_parameters()}
                ours, theirs = (float((x.double() - ref[k]).pow(2).mean().sqrt())
                                for x in (got[k], g))
                if ours > 2 * theirs:
                    bad[k] = f"RMSE vs float64 {ours:.3g}, eager fp32's {theirs:.3g}"
    return gt.stats(), bad, seconds, not bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="zoo models to measure (default: all)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)  # fallbacks: in the table
    from export_models import select

    zoo = select(a.models)
    if zoo is None:
        return 2
    progress.auto()
    print("torch.compile training step (forward + backward graphs): gradients against eager")
    print(f"{'model':<16} {'graphs':>6} | " + " ".join(f"{k:>6}" for k in KINDS)
          + f" | {'step s':>7}  grads")
    wrong, opaque = [], {}
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            shown.describe(name)
            s, bad, seconds, ok = step(build(), inputs())
            if not ok:
                wrong.append(f"{name} ({'; '.join(f'{k}: {v}' for k, v in bad.items())})")
            for k, v in s["fallbacks"].items():
                opaque.setdefault(f"{k}: {v}", []).append(name)
            progress.write(f"{name:<16} {s['graphs']:>6} | "
                           + " ".join(f"{s['launches'][k]:>6}" for k in KINDS)
                           + f" | {seconds:>7.2f}  {'match' if ok else 'DIFF'}", sys.stdout)
            shown.advance()
    print("gradients match eager: " + ("every model" if not wrong else "not on "
                                       + ", ".join(wrong)))
    print("ATen ops left to torch: " + ("none" if not opaque else "; ".join(
        f"{k} ({', '.join(v)})" for k, v in sorted(opaque.items()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
