"""Rewrite each 2-D pool left outside the kernels into a window kernel, with the elementwise
kernel that consumes it, when the code generator can make it (codegen/window.py).

A pool is an op of its own after the split (the patterns fuse no opaque op). A window kernel
computes it in the vector unit one plane at a time, and the elementwise work on its result
runs on each pooled row in the same kernel: PoolFormer's token mixer ``pool(x) - x``, scaled
and added to the residual, is one launch instead of two. The consumer joins when it is a
kernel whose every op the window kernel's epilogue takes and the pool's result goes nowhere
else. Each pool is recorded for ``graphkernel explain`` (pattern ``window_fusion``): fused
with its consumer, alone, or refused with the generator's reason (the pool then stays an op
of its own).
"""

from __future__ import annotations

from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.window import WINDOW_OPS, plan_window
from graphkernel.ir import Graph, Node
from graphkernel.kernels import build_kernel, next_kernel_name, unfuse
from graphkernel.registry import PassResult, counted
from graphkernel.runlog import Attempt

PATTERN = "window_fusion"


def _consumer(pool: Node) -> Node | None:
    """The kernel that is the pool's result's only reader, if any."""
    users = {id(u): u for u in pool.outputs[0].users}
    if len(users) != 1:
        return None
    (k,) = users.values()
    return k if k.op == "GraphKernel" else None


def _try(graph: Graph, nodes: list[Node], ctx) -> tuple[Node | None, str]:
    """A window kernel of ``nodes``, or None (the nodes back in the graph) and the reason."""
    k = build_kernel(graph, nodes, next_kernel_name(ctx.analyses, nodes, "window"), PATTERN)
    try:
        plan_window(k, ctx.target)
    except Unsupported as e:
        unfuse(graph, k)
        return None, str(e)
    return k, ""


def window_fusion(graph: Graph, ctx) -> PassResult:
    """Each 2-D float pool outside the kernels as a window kernel, with its elementwise
    consumer kernel when the generator takes it."""
    log = ctx.analyses.fusion_attempts
    fused = alone = 0
    for pool in [n for n in graph.nodes if n.op in WINDOW_OPS]:
        if not ctx.should_apply(f"{PATTERN}: {pool.name}", [pool]):
            continue
        k, why = _try(graph, [pool], ctx)
        if k is None:  # the pool itself cannot be generated: its consumer is left as it is
            log.append(Attempt(PATTERN, [pool.name], [pool.name], 0, "rejected", why))
            ctx.log(f"{PATTERN}: {pool.name} stays an op of its own: {why}")
            continue
        cons = _consumer(k)
        if cons is not None:
            pattern = cons.attrs["pattern"]
            (pool,) = unfuse(graph, k)
            inner = [n for n in unfuse(graph, cons) if n.op != "Constant"]
            names = [pool.name, cons.name]
            merged, why = _try(graph, [pool, *inner], ctx)
            if merged is not None:
                fused += 1
                log.append(Attempt(PATTERN, names, [n.name for n in [pool, *inner]], 1,
                                   "fused"))
                continue
            log.append(Attempt(PATTERN, names, [n.name for n in [pool, *inner]], 0,
                               "rejected", why))
            ctx.log(f"{PATTERN}: {pool.name} with {cons.name} refused: {why}")
            build_kernel(graph, inner, next_kernel_name(ctx.analyses, inner, "elemwise"),
                         pattern)
            k, _ = _try(graph, [pool], ctx)
        alone += 1
        log.append(Attempt(PATTERN, [pool.name], [pool.name], 0, "fused",
                           "a window kernel of its own"))
    summary = f"{counted(fused, 'pool')} fused with its consumer, {alone} alone"
    return PassResult(fused + alone > 0, fused + alone, summary=summary)
