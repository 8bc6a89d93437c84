"""Rewrite each 2-D pool and depthwise convolution left outside the kernels into a window
kernel, with a ReLU before a max pool or a constant pad before a pool, and the elementwise
kernel that consumes it, when the code generator can make it (codegen/window.py).

A pool is an op of its own after the split (the patterns fuse no opaque op), a depthwise
convolution a cube launch. A window kernel computes either in the vector unit one plane at a
time, and the elementwise work on its result runs on each computed row in the same kernel:
PoolFormer's token mixer ``pool(x) - x``, scaled and added to the residual, is one launch
instead of two; a depthwise convolution with its folded batch norm and ReLU6 one instead of
two. The consumer joins when it is a kernel, or an elementwise op outside the kernels (a lone
ReLU), whose every op the window kernel's epilogue takes and the result goes nowhere else.
A Split left outside the kernels that alone reads the result joins last (a channels-last
convolution's channels split into parts, Mamba2's x, B and C after the causal conv and
SiLU): the parts are the kernel's outputs, and the Split's copy is no launch.
Each one is recorded for ``graphkernel explain`` (pattern ``window_fusion``): fused with its
neighbours, alone, or refused with the generator's reason (it then stays as it was).

A TriSolve (a batch of triangular systems, ``passes/trisolve.py``) left outside the kernels is
the same kind of per-matrix kernel: it becomes a forward-substitution kernel of its own
(``codegen/trisolve.py``, pattern ``trisolve``), or stays an op with the generator's reason.
"""

from __future__ import annotations

from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.trisolve import plan_trisolve
from graphkernel.codegen.window import is_window_op, plan_window
from graphkernel.fusion import nbytes
from graphkernel.ir import Graph, Node
from graphkernel.kernels import build_kernel, next_kernel_name, sole_reader, unfuse
from graphkernel.registry import PassResult, counted
from graphkernel.runlog import Attempt

PATTERN = "window_fusion"
TRISOLVE = "trisolve"



def _try(graph: Graph, nodes: list[Node], ctx) -> tuple[Node | None, str, list[Node]]:
    """A window kernel of ``nodes``; or None, the reason and the nodes back in the graph (new
    nodes: the kernel's copies)."""
    k = build_kernel(graph, nodes, next_kernel_name(ctx.analyses, nodes, PATTERN), PATTERN)
    try:
        plan_window(k, ctx.target)
    except Unsupported as e:
        return None, str(e), [n for n in unfuse(graph, k) if n.op != "Constant"]
    return k, "", []


def _prologue(pool: Node) -> Node | None:
    """The op outside the kernels computing a pool's input for it alone: a ReLU or a clamp
    before a max pool, a constant pad before a max or average pool (its padding: the
    generator decides what it takes)."""
    v = pool.inputs[0]
    p = v.producer
    if p is None or p.op == "GraphKernel" or len(v.users) != 1:
        return None
    if p.op == "Pad":
        return p if pool.op in ("MaxPool", "AvgPool") else None
    return p if pool.op == "MaxPool" and p.op in ("ReLU", "Maximum", "Minimum") else None


def _split_of(k: Node) -> Node | None:
    """The Split left outside the kernels that alone reads the window kernel's only result
    (a channels-last convolution's channels split into parts: the kernel writes the parts
    as its outputs, the split's copy goes)."""
    if len(k.outputs) != 1:
        return None
    users = {id(u): u for u in k.outputs[0].users}
    if len(users) != 1:
        return None
    (u,) = users.values()
    return u if u.op == "Split" else None


def _grow(graph: Graph, k: Node, before: list[Node], cons: Node | None, ctx
          ) -> tuple[Node, str]:
    """The window kernel ``k`` with ``before`` (ops outside the kernels) ahead of its nodes
    and ``cons``'s nodes (a kernel) after them, when the generator takes it; otherwise ``k``
    as it was (rebuilt), ``cons`` too, and the reason."""
    pattern = cons.attrs["pattern"] if cons is not None and cons.op == "GraphKernel" else ""
    mine = [n for n in unfuse(graph, k) if n.op != "Constant"]
    kernel = cons is not None and cons.op == "GraphKernel"
    theirs = [n for n in unfuse(graph, cons) if n.op != "Constant"] if kernel else \
        [cons] if cons is not None else []
    merged, why, back = _try(graph, [*before, *mine, *theirs], ctx)
    if merged is not None:
        return merged, ""
    mine = back[len(before):len(before) + len(mine)]
    if theirs and kernel:  # (a lone op stays as it was)
        rest = back[len(before) + len(mine):]
        build_kernel(graph, rest, next_kernel_name(ctx.analyses, rest, pattern), pattern)
    k, _, _ = _try(graph, mine, ctx)
    return k, why


def _trisolves(graph: Graph, ctx) -> int:
    """Each TriSolve outside the kernels as a forward-substitution kernel, when the generator
    takes it; the kernels made."""
    log = ctx.analyses.fusion_attempts
    made = 0
    for n in [n for n in graph.nodes if n.op == "TriSolve"]:
        if not ctx.should_apply(f"{TRISOLVE}: {n.name}", [n]):
            continue
        k = build_kernel(graph, [n], next_kernel_name(ctx.analyses, [n], TRISOLVE), TRISOLVE)
        try:
            plan_trisolve(k, ctx.target)
        except Unsupported as e:
            unfuse(graph, k)
            log.append(Attempt(TRISOLVE, [n.name], [n.name], 0, "rejected", str(e)))
            ctx.log(f"{TRISOLVE}: {n.name} stays an op of its own: {e}")
            continue
        log.append(Attempt(TRISOLVE, [n.name], [n.name], 0, "fused", ""))
        made += 1
    return made


def window_fusion(graph: Graph, ctx) -> PassResult:
    """Each 2-D float pool outside the kernels as a window kernel, with a ReLU before a max
    pool or a constant pad before a pool, and its elementwise consumer kernel, when the
    generator takes them."""
    log = ctx.analyses.fusion_attempts
    fused = alone = 0
    for pool in [n for n in graph.nodes if is_window_op(n)]:
        if not ctx.should_apply(f"{PATTERN}: {pool.name}", [pool]):
            continue
        pro = _prologue(pool)
        k, why, _ = _try(graph, [pool], ctx)
        if k is None:  # the pool itself cannot be generated: its neighbours are left as they are
            log.append(Attempt(PATTERN, [pool.name], [pool.name], 0, "rejected", why))
            ctx.log(f"{PATTERN}: {pool.name} stays an op of its own: {why}")
            continue
        grown = False
        for step in ("prologue", "consumer", "split"):
            before, cons = ([pro], None) if step == "prologue" else \
                ([], _split_of(k) if step == "split" else sole_reader(k))
            if (before and before[0] is None) or (not before and cons is None):
                continue
            names = [pool.name, *(n.name for n in before), *([cons.name] if cons else [])]
            # GM bytes saved: the joined value's round trip (written, then read back)
            saved = 2 * nbytes(before[0].outputs[0] if before else k.outputs[0])
            k, why = _grow(graph, k, before, cons, ctx)
            log.append(Attempt(PATTERN, names, names, 0 if why else saved,
                               "rejected" if why else "fused", why))
            if why:
                ctx.log(f"{PATTERN}: {' + '.join(names)} refused: {why}")
            grown |= not why
        fused += grown
        alone += not grown
    solved = _trisolves(graph, ctx)
    summary = (f"{counted(fused + alone, 'pool')} as window kernels ({fused} with their "
               "neighbours)")
    if solved:
        summary += f"; {counted(solved, 'triangular solve')} as forward-substitution kernels"
    return PassResult(fused + alone + solved > 0, fused + alone + solved, summary=summary)
