"""Simulator build time against ``--jobs``: every generated kernel of a model built from a cold
cache by 1, 2, … parallel g++ runs. Prints a table (wall seconds and the g++ runs' CPU seconds
per jobs count: on an idle machine wall time falls toward CPU / jobs) and checks
that every jobs count gives the same outputs.

    python benchmarks/sim_build_jobs.py [--jobs 1,2] [--opt-level 2] [MODEL.json ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphkernel  # noqa: E402
from graphkernel.codegen.backend import run_sim, shared_kernels  # noqa: E402
from graphkernel.codegen.sim import runner  # noqa: E402
from graphkernel.frontends import load_model  # noqa: E402
from graphkernel.interpreter import random_inputs  # noqa: E402


def default_models() -> list[str]:
    """Models with many distinct kernels: the ONNX package's light CNNs when onnx is
    installed, else the bundled transformers."""
    try:
        import onnx
    except ImportError:
        return [str(ROOT / "examples/models" / f"{m}.json") for m in ("bert", "llama", "vit")]
    light = Path(onnx.__file__).parent / "backend/test/data/light"
    return [str(light / f"light_{m}.onnx") for m in ("densenet121", "inception_v2",
                                                      "resnet50")]


def _child_cpu() -> float:
    """CPU seconds of finished child processes (the g++ runs)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--jobs", default="1,2", help="jobs counts to compare (default 1,2)")
    ap.add_argument("--opt-level", type=int, default=2)
    args = ap.parse_args()
    counts = [int(j) for j in args.jobs.split(",")]
    heads = " | ".join(f"jobs={j}: wall (g++ CPU) s" for j in counts)
    print(f"| model | distinct kernels | {heads} | same outputs |")
    print("|---|---|" + "---|" * len(counts) + "---|")
    for path in args.models or default_models():
        g = load_model(path)
        res = graphkernel.compile(g, f"--opt_level={args.opt_level}", env={})
        feeds = random_inputs(g, 0)
        n = len(res.analyses.codegen) - len(shared_kernels(res))
        times, outs = [], []
        for jobs in counts:
            with tempfile.TemporaryDirectory() as cache:
                os.environ["GRAPHKERNEL_SIM_CACHE"] = cache
                os.environ["GRAPHKERNEL_JOBS"] = str(jobs)
                runner._LIBS.clear()  # nothing loaded in this process counts either
                t, c = time.perf_counter(), _child_cpu()
                got, _ = run_sim(res, feeds)
                times.append((time.perf_counter() - t, _child_cpu() - c))
                outs.append(got)
        same = all(all(np.array_equal(a, b, equal_nan=True) for a, b in zip(o, outs[0],
                                                                              strict=True))
                   for o in outs)
        print(f"| {Path(path).stem} | {n} | "
              + " | ".join(f"{wall:.1f} ({cpu:.1f})" for wall, cpu in times)
              + f" | {'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
