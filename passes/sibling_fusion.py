"""Rewrite two vector kernels sharing a read of one value in one loop space -> one kernel: one
launch goes (and a value both read whole is read from GM once).

Where a value's readers cannot join its producer (a scan's running values, read by several
kernels; a product's result read by two epilogues the product group did not take), the
patterns leave each reader a kernel of its own. When two such kernels compute every output in
the same shape (one loop space: each element of each output is computed at one index of it),
share a read of one value (whole; or, not a scalar, in part or broadcast by kernels that
reduce nothing), and do not depend on each other, one kernel computes
both, as TorchInductor fuses nodes that share a read over the same iteration space. A value
read whole by both is read from GM once; one read in part or broadcast (a rotary
embedding's angle tables, read by the kernels rotating Q and K in one shape; slices of one
fused projection) is read as each kernel read it, and one launch goes. Unlike
``parallel_fusion`` (level 3, any two kernels sharing an input), the loop spaces must be one,
so the joined kernel runs the tiles each ran, and the code generator must schedule the joined
body (probed before the rewrite)."""

from __future__ import annotations

from graphkernel import ops, symbolic
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import OpKind
from graphkernel.passes.parallel_fusion import _product, join_kernel_pairs
from graphkernel.registry import PassResult, counted


def _loop_space(k: Node) -> tuple | None:
    """The one shape and dtype every output of kernel ``k`` has, or None."""
    spaces = {(tuple(symbolic.canon(d) for d in v.shape), v.type.dtype) for v in k.outputs}
    return next(iter(spaces)) if len(spaces) == 1 else None


def _read_whole(v: Value, k: Node) -> bool:
    """Whether kernel ``k`` reads ``v`` with as many elements as it computes per output."""
    return symbolic.eq(v.type.numel, k.outputs[0].type.numel)


def _shares(v: Value, k: Node) -> bool:
    """Whether ``v`` is a read kernel ``k`` shares with a sibling: read whole, or (not a
    scalar) in part or broadcast by a kernel that reduces nothing, whose loop space is its
    outputs' shape (a rotary embedding's angle tables, read by the kernels rotating Q and K;
    a fused projection read through slices by each of its parts)."""
    if _read_whole(v, k):
        return True
    return not symbolic.eq(v.type.numel, 1) and not any(
        ops.get(n.op).kind == OpKind.REDUCE for n in k.subgraph.nodes)


def sibling_fusion(graph: Graph, ctx) -> PassResult:
    """Rewrite two independent vector kernels sharing a read of one value, every output of
    both in one shape -> one kernel, when the code generator schedules it."""
    joined = join_kernel_pairs(
        graph, ctx, lambda: [v for n in graph.nodes for v in n.outputs] + list(graph.inputs),
        lambda v: [u for u in dict.fromkeys(v.users) if u.op == "GraphKernel"
                   and not _product(u) and _loop_space(u) is not None
                   and _shares(v, u)],
        lambda a, b: _loop_space(a) == _loop_space(b), "sibling")
    notes = [f"{a.name} | {b.name} -> {k.name} (both read {v.name})" for a, b, k, v in joined]
    return PassResult(bool(joined), len(joined), [
        f"{counted(len(joined), 'kernel pair')} reading one value in one loop space joined",
        *notes] if joined else [])
