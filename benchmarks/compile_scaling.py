"""Compile time against graph size: transformer-like graphs through the whole pipeline.

    python benchmarks/compile_scaling.py [--sizes 1000,10000,100000] [--profile] [--no-emit]
                                         [--copy]

Each size is compiled at opt_level 2 in a fresh process, in place (``copy=False``, as the
``graphkernel`` program and the torch backend compile a graph they built; ``--copy``: on a
copy, the API's default), so the peak memory printed is that
size's own: the pass pipeline (codegen pass included), then the kernel project written to a
temporary folder (``emit``: rendering every kernel, as ``graphkernel compile --out`` does).
Prints wall and CPU seconds, nodes/s and peak RSS per size (until the project is written),
and the growth of the time against N and N log N. ``gc s``, not part of the time: one full
garbage collection right after, over everything then alive (the input graph as well as the
compiled one) — what the program's next full collection costs, whenever its allocations
trigger one (the ``graphkernel`` program itself exits without one). ``--profile`` adds the
seconds of every pass per size and the top functions (cProfile, a second run of the largest size).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphkernel  # noqa: E402
from benchmarks.models import transformer_of_size  # noqa: E402
from graphkernel import progress  # noqa: E402


def measure(target: int, emit: bool, profile: bool, copy: bool) -> dict:
    """Build and compile one graph in this process; the figures as a dict."""
    from graphkernel.codegen.backend import write_project

    g = transformer_of_size(target)
    n_input = len(g)  # the graph is compiled in place
    prof = cProfile.Profile() if profile else None
    w0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    # in place (copy=False), as the graphkernel program and the torch backend compile the
    # graph they built; --copy measures the API's default, which copies the caller's graph
    res = graphkernel.compile(g, "--opt_level=2", env={}, copy=copy)
    w1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if emit:
            write_project(res, tmp)
        w2, c2 = time.perf_counter(), time.process_time()
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if prof:
            prof.disable()
        # not timed: one full collection over everything alive (the input graph and the
        # compiled one), what the process's next full collection costs
        g0 = time.perf_counter()
        gc.collect()
        gc_s = time.perf_counter() - g0
        manifest = json.loads((Path(tmp) / "manifest.json").read_text()) if emit else None
    passes: dict[str, float] = {}
    for p in res.report.passes:
        if p.ran:
            passes[p.label] = passes.get(p.label, 0.0) + p.seconds
    out = {
        "target": target, "input": n_input,
        "expanded": next(p.nodes_after for p in res.report.passes if p.name == "cluster"),
        "after": len(res.graph), "kernels": res.report.extra["kernels_fused"],
        "pipeline_s": w1 - w0, "emit_s": w2 - w1, "wall_s": w2 - w0, "cpu_s": c2 - c0,
        "peak_mb": peak_mb, "gc_s": gc_s,
        "passes": passes,
        "distinct": len(manifest["kernels"]) if manifest is not None else None,
    }
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        out["cprofile"] = buf.getvalue()
    return out


def in_child(target: int, emit: bool, copy: bool, profile: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--one", str(target)]
    cmd += [] if emit else ["--no-emit"]
    cmd += ["--copy"] if copy else []
    cmd += ["--cprofile"] if profile else []
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--profile", action="store_true",
                    help="also print seconds per pass and the top functions (cProfile)")
    ap.add_argument("--no-emit", dest="emit", action="store_false",
                    help="stop after the pass pipeline (no kernel project)")
    ap.add_argument("--copy", action="store_true",
                    help="compile a copy of the graph (the API's default) instead of in place")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's single size
    ap.add_argument("--cprofile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.emit, args.cprofile, args.copy)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    progress.auto()  # on a terminal: which size is being compiled
    with progress.task("sizes", len(sizes)) as shown:
        for target in sizes:
            shown.describe(f"{target} nodes")
            rows.append(in_child(target, args.emit, args.copy))
            shown.advance()
    print(f"{'target':>8} {'input':>8} {'expanded':>9} {'after':>7} {'kernels':>8} "
          f"{'distinct':>8} {'pipeline':>9} {'emit':>6} {'wall s':>7} {'cpu s':>6} "
          f"{'nodes/s':>8} {'peak MB':>8} {'gc s':>6}")
    for r in rows:
        distinct = "-" if r["distinct"] is None else r["distinct"]
        print(f"{r['target']:>8} {r['input']:>8} {r['expanded']:>9} {r['after']:>7} "
              f"{r['kernels']:>8} {distinct:>8} {r['pipeline_s']:>9.2f} {r['emit_s']:>6.2f} "
              f"{r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} {r['expanded'] / r['wall_s']:>8.0f} "
              f"{r['peak_mb']:>8.0f} {r['gc_s']:>6.2f}")
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        n0, n1 = a["expanded"], b["expanded"]
        k = math.log(b["wall_s"] / a["wall_s"]) / math.log(n1 / n0)
        nlogn = (n1 * math.log(n1)) / (n0 * math.log(n0))
        print(f"time ~ N^{k:.2f} from {n0} to {n1} expanded nodes: x{b['wall_s'] / a['wall_s']:.0f}"
              f" (N log N: x{nlogn:.0f}; CPU time x{b['cpu_s'] / a['cpu_s']:.0f})")
    if args.profile:
        names = list(dict.fromkeys(p for r in rows for p in r["passes"]))
        print()
        print(f"{'pass (seconds)':<20}" + "".join(f"{r['target']:>10}" for r in rows))
        for name in names:
            print(f"{name:<20}" + "".join(f"{r['passes'].get(name, 0.0):>10.2f}" for r in rows))
        print(f"{'emit':<20}" + "".join(f"{r['emit_s']:>10.2f}" for r in rows))
        big = max(rows, key=lambda r: r["target"])
        prof = in_child(big["target"], args.emit, args.copy, profile=True)
        print(f"\ntop functions at {big['target']} nodes (cProfile, by own time; the profiler "
              f"slows the run to {prof['wall_s']:.1f} s):")
        lines = prof["cprofile"].splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
        print("\n".join(ln.replace(str(ROOT) + "/", "") for ln in lines[start:] if ln.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
