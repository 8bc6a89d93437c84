"""Code generation quality: kernels generated / fallen back, simulator GM traffic vs ideal,
cores used, modeled time unfused vs fused, and accuracy of the generated kernels.

    python benchmarks/codegen_quality.py [--opt-level 2] [--target ascend910b]

Models: the bundled examples (examples/*.json, examples/models/*.json) and the ONNX light
models ResNet-50 and SqueezeNet. Every generated kernel runs in the CPU simulator on random
inputs (symbolic dims = 4); "GM sim/ideal" is the simulator's count of GM bytes over the
kernels' ideal (inputs read once, outputs written once); "cores" is the mean launch width;
"match" is whether the whole compiled graph, run through the generated kernels, agrees with
the op-by-op run (accuracy.md). Modeled times come from the cost model (not measurements);
"SK saved" is the launches (and modeled microseconds of launch overhead) SuperKernels save
(opt_level 3 or --flags --enable_super_kernel). "scalar" and "syncs" are the simulator's
counts over all cores of the scalar UB/GM accesses (GetValue/SetValue) and the pipe syncs
(event pairs, PipeBarrier<PIPE_ALL>); "pipe us" is the cost model's time for them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphkernel  # noqa: E402
from graphkernel import progress  # noqa: E402
from graphkernel.bisect import Evaluator  # noqa: E402
from graphkernel.codegen.backend import run_sim  # noqa: E402
from graphkernel.frontends import load_model  # noqa: E402
from graphkernel.interpreter import random_inputs  # noqa: E402


def models() -> list[tuple[str, str]]:
    out = [(p.stem, str(p)) for p in sorted((ROOT / "examples").glob("*.json"))]
    out += [(p.stem, str(p)) for p in sorted((ROOT / "examples" / "models").glob("*.json"))]
    try:
        import onnx

        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        out += [(n, os.path.join(light, f"light_{n}.onnx")) for n in ("resnet50", "squeezenet")]
    except ImportError:
        print("(onnx not installed: ONNX light models skipped)")
    return out


def measure(path: str, flags: str) -> dict:
    g = load_model(path)
    res = graphkernel.compile(g, flags, env={})
    ex = res.report.extra
    feeds = random_inputs(g, 0, {s: 4 for v in g.inputs for d in v.shape
                                 if isinstance(d, str) for s in [d]})
    t0 = time.perf_counter()
    outs, be = run_sim(res, feeds)
    sim_s = time.perf_counter() - t0
    match = not Evaluator(g, feeds).judge(outs).bad  # as `graphkernel verify` judges
    stats = list(be.stats.values())
    gm = sum(s.gm_read + s.gm_written for s in stats)
    ideal = sum(s.ideal for s in stats)
    return {"generated": len(stats), "fallbacks": len(ex.get("fallbacks", [])),
            "fallback_reasons": [f["reason"] for f in ex.get("fallbacks", [])],
            "gm_ratio": gm / ideal if ideal else 1.0,
            "cores": sum(s.block_dim for s in stats) / len(stats) if stats else 0.0,
            "us_unfused": ex.get("modeled_us_unfused", 0.0),
            "us_fused": ex.get("modeled_us_fused", 0.0), "match": match, "sim_s": sim_s,
            "sk_saved": ex.get("super_kernel_summary", {}).get("launches_before", 0)
            - ex.get("super_kernel_summary", {}).get("launches_after", 0),
            "sk_us": ex.get("super_kernel_summary", {}).get("modeled_us_saved", 0.0),
            "scalar": sum(s.scalar for s in stats), "syncs": sum(s.syncs for s in stats),
            "pipe_us": sum(s.pipe_us for s in stats), "unscheduled": be.unscheduled}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opt-level", type=int, default=2)
    ap.add_argument("--target", default="ascend910b")
    ap.add_argument("--flags", default="", help="more flags, e.g. --enable_super_kernel")
    args = ap.parse_args()
    flags = f"--opt_level={args.opt_level} --target={args.target} {args.flags}"
    print(f"{'model':<20} {'generated':>9} {'fallback':>8} {'GM sim/ideal':>12} {'cores':>6} "
          f"{'us unfused':>10} {'us fused':>9} {'SK saved':>9} {'match':>6} {'sim s':>6} "
          f"{'scalar':>8} {'syncs':>7} {'pipe us':>7}")
    reasons: dict[str, int] = {}
    total = [0, 0]
    progress.auto()  # on a terminal: which model, which pass, which kernel
    todo = models()
    with progress.task("models", len(todo)) as shown:
        for name, path in todo:
            shown.describe(name)
            m = measure(path, flags)
            total[0] += m["generated"]
            total[1] += m["fallbacks"]
            for r in m["fallback_reasons"]:
                reasons[r] = reasons.get(r, 0) + 1
            progress.write(f"{name:<20} {m['generated']:>9} {m['fallbacks']:>8} "
                           f"{m['gm_ratio']:>12.3f} {m['cores']:>6.1f} {m['us_unfused']:>10.1f} "
                           f"{m['us_fused']:>9.1f} {m['sk_saved']:>3} {m['sk_us']:>5.1f} "
                           f"{'yes' if m['match'] else 'NO':>6} {m['sim_s']:>6.2f} "
                           f"{m['scalar']:>8} {m['syncs']:>7} {m['pipe_us']:>7.2f}", sys.stdout)
            if m["unscheduled"]:
                progress.write(f"  kernels run by the interpreter: {m['unscheduled']}",
                               sys.stdout)
            shown.advance()
    print(f"kernels generated: {total[0]}, fallbacks: {total[1]}")
    for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>3} x {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
