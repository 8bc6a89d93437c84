"""Compile time against graph size: transformer-like graphs through opt_level 2 up to split.

    python benchmarks/compile_scaling.py [--sizes 1000,10000,100000]

Prints seconds and nodes/s per size and the fitted exponent of time ~ N^k.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import graphkernel  # noqa: E402
from benchmarks.models import transformer_of_size  # noqa: E402
from graphkernel import progress  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    args = ap.parse_args()
    rows = []
    sizes = [int(s) for s in args.sizes.split(",")]
    progress.auto()  # on a terminal: which size, which pass (timings include the display)
    with progress.task("sizes", len(sizes)) as shown:
        for target in sizes:
            shown.describe(f"{target} nodes")
            g = transformer_of_size(target)
            t0 = time.perf_counter()
            res = graphkernel.compile(g, "--opt_level=2", env={})
            secs = time.perf_counter() - t0
            n = next(p.nodes_after for p in res.report.passes if p.name == "cluster")
            rows.append((target, len(g), n, len(res.graph), secs,
                         res.report.extra["kernels_fused"]))
            shown.advance()
    print(f"{'target':>8} {'input':>8} {'expanded':>9} {'after':>7} {'kernels':>8} "
          f"{'seconds':>8} {'nodes/s':>9}")
    for target, n_in, n_exp, n_out, secs, k in rows:
        print(f"{target:>8} {n_in:>8} {n_exp:>9} {n_out:>7} {k:>8} {secs:>8.2f} "
              f"{n_exp / secs:>9.0f}")
    if len(rows) >= 2:
        (_, _, n0, _, t0, _), (_, _, n1, _, t1, _) = rows[0], rows[-1]
        print(f"time ~ N^{math.log(t1 / t0) / math.log(n1 / n0):.2f} "
              f"(from {n0} to {n1} expanded nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
