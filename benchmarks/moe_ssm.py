"""Mixture-of-experts and state-space models (examples/moe_ssm_models.py) through
torch.compile: launches against TorchInductor's, outputs and training gradients against eager,
and the export path's fused/ideal GM bytes at opt_level 2.

    python benchmarks/moe_ssm.py [model ...] [--no-training] [--no-export]

Launches are counted as in vs_inductor.py (Inductor: fused kernels + extern calls;
graphkernel: its launches by kind). ``grads`` is zoo_training.py's check of one training step
(every parameter's gradient against eager, a difference judged against float64). ``GM`` is
``torch.export`` + the pipeline at opt_level 2: fused GM bytes over the ideal (every
cluster-able region one kernel), the target being <= 1.05.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from graphkernel import progress  # noqa: E402


def gm_ratio(model, args, name: str) -> float:
    """fused/ideal GM bytes of the exported inference graph at opt_level 2."""
    import graphkernel
    import graphkernel.torch as gt

    res = graphkernel.compile(gt.export_graph(model, args, name=name), "--opt_level=2", env={})
    extra = res.report.extra
    return extra["gm_bytes_fused"] / extra["gm_bytes_ideal"] if extra["gm_bytes_ideal"] else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="models to measure (default: all)")
    ap.add_argument("--no-training", action="store_true", help="skip the gradient check")
    ap.add_argument("--no-export", action="store_true", help="skip the export path's GM ratio")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)
    from moe_ssm_models import FAMILY, builders
    from vs_inductor import KINDS, inductor, ours_compiled, warm_up
    from zoo_training import measure

    zoo = builders()
    unknown = sorted(set(a.models) - set(zoo))
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)} (accepted: {', '.join(zoo)})",
              file=sys.stderr)
        return 2
    zoo = {k: v for k, v in zoo.items() if not a.models or k in a.models}
    progress.auto()
    warm_up()
    print(f"{'model':<13} {'family':<19} {'ind':>4} | " + " ".join(f"{k:>6}" for k in KINDS)
          + f" {'total':>5} {'ratio':>5} | {'out':<5} {'grads':<9} {'GM':>5}")
    ratios: dict[str, list[float]] = {}
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            shown.describe(name)
            model, args = build(), inputs()
            k, e, _, _ = inductor(model, args)
            launches, _, fallbacks, _, ok = ours_compiled(model, args)
            total = sum(launches.values())
            ratio = total / (k + e)
            ratios.setdefault(FAMILY[name], []).append(ratio)
            grads = "-"
            if not a.no_training:
                r = measure(build, inputs)
                bad = [p for p in r["differ"] if r["judged"].get(p) == "graphkernel's"]
                grads = "match" if not bad else f"{len(bad)}/{r['params']} DIFF"
            gm = "-" if a.no_export else f"{gm_ratio(build(), inputs(), name):.3f}"
            progress.write(f"{name:<13} {FAMILY[name]:<19} {k + e:>4} | "
                           + " ".join(f"{launches[x]:>6}" for x in KINDS)
                           + f" {total:>5} {ratio:>5.2f} | {'match' if ok else 'DIFF':<5} "
                           f"{grads:<9} {gm:>5}"
                           + (f"  opaque: {', '.join(sorted(fallbacks))}" if fallbacks else ""),
                           sys.stdout)
            shown.advance()
    for fam, rs in ratios.items():
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"{fam}: geometric mean of graphkernel/Inductor launches {geo:.2f}, "
              f"worst {max(rs):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
