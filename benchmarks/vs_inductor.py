"""graphkernel vs TorchInductor (CPU) on the model zoo.

    python benchmarks/vs_inductor.py

For each zoo model: TorchInductor compiles it (caches off) and we count, from its generated
code, the fused kernels (`cpp_fused_*`) and the extern calls (`extern_kernels.*`); its
fusion decisions are timed as the time spent in `Scheduler.__init__` (where it fuses), its
end-to-end compile time as the first call. graphkernel imports the same model and runs its
pipeline up to split; vector kernels are fused kernels plus vector ops left alone, opaque
calls are matmuls (with any fused epilogue, like Inductor's extern addmm), convolutions, data
movement left as launches (transpose, concat, split, gather) and ops run through ATen.
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from graphkernel import progress  # noqa: E402


def inductor(model, args):
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
    src = "\n".join(code)
    body = src[src.find("def call("):] if "def call(" in src else src
    kernels = len(set(re.findall(r"cpp_fused_\w+", src)))
    externs = len(re.findall(r"extern_kernels\.\w+\(", body))
    return kernels, externs, spent["s"], total


def ours(model, args, name):
    import graphkernel
    import graphkernel.torch as gt
    from graphkernel import ops
    from graphkernel.ops import OpKind

    t0 = time.perf_counter()
    g = gt.export_graph(model, args, name=name)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    total = time.perf_counter() - t0
    until_split = sum(p.seconds for p in res.report.passes
                      if p.stage in ("preprocess", "expand", "simplify", "cluster", "split"))
    vector = opaque = 0
    for n in res.graph.nodes:
        if n.op in ("Constant", "Reshape", "ExpandDims", "Squeeze"):
            continue
        # a matmul with its fused epilogue is a matmul call, like Inductor's extern addmm
        mm = n.op == "GraphKernel" and any(m.op in ("MatMul", "BatchMatMul")
                                           for m in n.subgraph.nodes)
        if not mm and (n.op == "GraphKernel" or ops.get(n.op).kind <= OpKind.REDUCE):
            vector += 1
        else:
            opaque += 1
    return vector, opaque, res.report.extra["gm_bytes_fused"], until_split, total


def main() -> int:
    warnings.simplefilter("ignore")
    from export_models import builders

    print(f"{'model':<16} {'inductor kernels':>16} {'extern':>7} {'ours vector':>11} "
          f"{'opaque':>7} {'GM MB':>7} {'fusion s (ind/ours)':>20} {'compile s (ind/ours)':>21}")
    worst_ratio = 0.0
    misses = []
    progress.auto()  # on a terminal: which model
    todo = builders()
    with progress.task("models", len(todo)) as shown:
        for name, (build, inputs) in todo.items():
            shown.describe(f"{name}: Inductor")
            model, args = build(), inputs()
            k, e, s_ind, t_ind = inductor(model, args)
            shown.describe(f"{name}: graphkernel")
            v, o, gm, s_ours, t_ours = ours(model, args, name)
            worst_ratio = max(worst_ratio, s_ours / t_ind)
            if v > k:
                misses.append(name)
            progress.write(f"{name:<16} {k:>16} {e:>7} {v:>11} {o:>7} {gm / 2**20:>7.2f} "
                           f"{s_ind:>9.3f} / {s_ours:<8.3f} {t_ind:>9.2f} / {t_ours:<9.2f}",
                           sys.stdout)
            shown.advance()
    print(f"vector kernels <= Inductor's fused kernels: "
          f"{'met on every model' if not misses else 'missed on ' + ', '.join(misses)}")
    print(f"pipeline time / Inductor end-to-end compile: worst {worst_ratio:.3f} (target <= 0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
