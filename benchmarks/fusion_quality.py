"""Fusion quality: kernels and GM bytes unfused / fused / ideal at opt_level 2.

    python benchmarks/fusion_quality.py [--opt-level 2]

Models: the bundled examples and the ONNX light models that ship in the onnx
package. "ideal" puts every connected group of cluster-able ops in one kernel,
ignoring every limit (the lower bound); target: fused/ideal <= 1.10.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphkernel  # noqa: E402
from graphkernel import progress  # noqa: E402
from graphkernel.frontends import load_model  # noqa: E402

LIGHT = ["resnet50", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet",
         "vgg19"]


def models() -> list[tuple[str, str]]:
    out = [(p.stem, str(p)) for p in sorted((ROOT / "examples").glob("*.json"))]
    try:
        import onnx

        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        out += [(name, os.path.join(light, f"light_{name}.onnx")) for name in LIGHT]
    except ImportError:
        print("(onnx not installed: ONNX light models skipped)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opt-level", type=int, default=2)
    args = ap.parse_args()
    print(f"{'model':<20} {'kernels':>15} {'GM MB unfused':>14} {'fused':>9} {'ideal':>9} "
          f"{'fused/ideal':>11}")
    worst = 0.0
    progress.auto()  # on a terminal: which model, which pass
    todo = models()
    with progress.task("models", len(todo)) as shown:
        for name, path in todo:
            shown.describe(name)
            g = load_model(path)
            r = graphkernel.compile(g, f"--opt_level={args.opt_level}", env={}).report.extra
            ratio = r["gm_bytes_fused"] / r["gm_bytes_ideal"] if r["gm_bytes_ideal"] else 1.0
            worst = max(worst, ratio)
            mb = 1 / 2**20
            progress.write(f"{name:<20} {r['kernels_unfused']:>6} -> {r['kernels_fused']:<6} "
                           f"{r['gm_bytes_unfused'] * mb:>14.2f} "
                           f"{r['gm_bytes_fused'] * mb:>9.2f} {r['gm_bytes_ideal'] * mb:>9.2f} "
                           f"{ratio:>11.3f}", sys.stdout)
            shown.advance()
    print(f"worst fused/ideal: {worst:.3f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
