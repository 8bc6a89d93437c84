"""Horizontal fusion: independent kernels that read the same input become one launch."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from graphkernel.ir import Graph, Node, Value
from graphkernel.kernels import merge_parallel, next_kernel_name, parallel_body, scheduled
from graphkernel.registry import PassResult, counted


def reaches(graph: Graph, src: Node, dst: Node, order: dict[int, int]) -> bool:
    """Is there a path src -> … -> dst? (search pruned by topological position)"""
    limit = order[id(dst)]
    stack, seen = [src], {id(src)}
    while stack:
        n = stack.pop()
        for u in n.users:
            if u is dst:
                return True
            if id(u) not in seen and order.get(id(u), limit + 1) < limit:
                seen.add(id(u))
                stack.append(u)
    return False


def _product(k: Node) -> bool:
    """Whether ``k`` holds a matrix product: a cube kernel runs one, and products that share
    an operand are joined by matmul_group as a product group instead."""
    from graphkernel.ops import PRODUCT_OPS

    return any(n.op in PRODUCT_OPS for n in k.subgraph.nodes)


def _ops(k: Node) -> int:
    return sum(1 for n in k.subgraph.nodes if n.op != "Constant")


def refused_together(a: Node, b: Node) -> bool:
    """The code generator schedules ``a`` and ``b`` each, but not side by side: their loop
    spaces differ in a way one kernel cannot hold (q's and k's rotary embedding when k has
    fewer heads). Joining them would only be split again by the fallback. (A kernel that
    holds a matrix product is never a candidate: see ``_product``.)"""
    if not (scheduled(a) and scheduled(b)):
        return False  # a product's kernel, or one already refused: as before
    body, ins = parallel_body([a, b], "probe")
    probe = Graph("probe")
    k = probe.add_node("GraphKernel", [probe.add_input(v.name, v.type) for v in ins],
                       {"subgraph": body, "pattern": "parallel"})
    return not scheduled(k)


def join_kernel_pairs(graph: Graph, ctx, values: Callable[[], Iterable[Value]],
                      readers: Callable[[Value], list[Node]],
                      compatible: Callable[[Node, Node], bool], label: str
                      ) -> list[tuple[Node, Node, Node, Value]]:
    """Join two kernels reading one value into one (``merge_parallel``), one pair at a time
    until no pair is left: of ``readers(v)`` for each value of ``values()``, two that
    ``compatible`` takes, within composite_op_limit_size and max_kernel_inputs, that do not
    depend on each other and that the code generator schedules together. Returns each join
    (the two kernels, the joined one, the value they share)."""
    joined = []
    while (pair := _joinable_pair(graph, ctx, values, readers, compatible)) is not None:
        a, b, v = pair
        k = merge_parallel(graph, a, b, next_kernel_name(ctx.analyses, list(a.subgraph.nodes),
                                                         label))
        joined.append((a, b, k, v))
    return joined


def _joinable_pair(graph: Graph, ctx, values, readers, compatible
                   ) -> tuple[Node, Node, Value] | None:
    """The first pair ``join_kernel_pairs`` may join (in graph order), and their value."""
    limit = ctx.flags.composite_op_limit_size
    max_inputs = ctx.flags.max_kernel_inputs  # the target's cap (0: none)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for v in values():
        kernels = readers(v)
        for i in range(len(kernels)):
            for j in range(i + 1, len(kernels)):
                a, b = sorted((kernels[i], kernels[j]), key=lambda k: order[id(k)])
                if not compatible(a, b) or _ops(a) + _ops(b) > limit:
                    continue
                if max_inputs and len({id(x) for x in (*a.inputs, *b.inputs)}) > max_inputs:
                    continue
                if reaches(graph, a, b, order) or refused_together(a, b):
                    continue
                if ctx.should_apply(f"{a.name} | {b.name}", [a, b]):
                    return a, b, v
    return None


def parallel_fusion(graph, ctx) -> PassResult:
    """Rewrite two kernels that share an input and do not depend on each other -> one kernel
    launching both (nvFuser's horizontal mode), within composite_op_limit_size and
    max_kernel_inputs, unless the code generator schedules each but not both together."""
    merged = len(join_kernel_pairs(
        graph, ctx, lambda: [v for n in graph.nodes for v in n.inputs] + list(graph.inputs),
        lambda v: [u for u in v.users if u.op == "GraphKernel"],
        lambda a, b: not (_product(a) or _product(b)), "parallel"))
    return PassResult(merged > 0, merged, [f"{counted(merged, 'kernel pair')} launched together"]
                      if merged else [])
