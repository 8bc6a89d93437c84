"""Rewrite two vector kernels sharing a read of one value in one loop space -> one kernel: one
launch goes (and a value both read whole is read from GM once).

Where a value's readers cannot join its producer (a scan's running values, read by several
kernels; a product's result read by two epilogues the product group did not take), the
patterns leave each reader a kernel of its own. When two such kernels compute every output in
the same shape (one loop space: each element of each output is computed at one index of it),
share a read of one value, and do not depend on each other, one kernel computes both, as
TorchInductor fuses nodes that share a read over the same iteration space. The value is read
whole by both (then read from GM once), or is a computed value or graph input (not a
constant) whose parts the two read, kernels that reduce nothing (each then reads what it
read, and one launch goes): the kernels rotating Q and K in one shape read parts of one
fused projection (its slices, or a Split's outputs). Two computations that only share a
table read broadcast (a bias, the rotary angles) stay apart. Unlike
``parallel_fusion`` (level 3, any two kernels sharing an input), the loop spaces must be one,
so the joined kernel runs the tiles each ran, and the code generator must schedule the joined
body (probed before the rewrite). Kernels that leave only reduced values, all reducing the
same axes of one shape, run the tiles of that shape: two of them (or one and a reduction left
a launch of its own: a bias's gradient summed over the batch beside a norm weight's) reading
one value whole in that shape join the same way."""

from __future__ import annotations

from types import SimpleNamespace

from graphkernel import ops, symbolic
from graphkernel.fusion import SUPPORTED_DTYPES
from graphkernel.ir import Graph, Node, Value
from graphkernel.kernels import (
    build_kernel,
    merge_parallel,
    next_kernel_name,
    parallel_body,
    scheduled,
    separate_slice_reads,
)
from graphkernel.ops import RESHAPE_OPS, OpKind
from graphkernel.passes.parallel_fusion import (
    _ops,
    _product,
    join_kernel_pairs,
    reaches,
)
from graphkernel.registry import PassResult, counted


def _loop_space(k: Node) -> tuple | None:
    """The one shape and dtype every output of kernel ``k`` has, or None."""
    spaces = {(tuple(symbolic.canon(d) for d in v.shape), v.type.dtype) for v in k.outputs}
    return next(iter(spaces)) if len(spaces) == 1 else None


def _read_whole(v: Value, k: Node) -> bool:
    """Whether kernel ``k`` reads ``v`` with as many elements as it computes per output."""
    return symbolic.eq(v.type.numel, k.outputs[0].type.numel)


def _reduce_space(k: Node) -> tuple | None:
    """(input shape, reduced axes, output shapes and dtypes) of a vector kernel whose every
    reduction reduces the same axes of one shape and whose every output is a reduced value
    (the sums over the batch that a training backward takes for a bias's and a norm
    weight's gradients), else None. Such a kernel's loop space is that input shape: two of
    them reducing the same axes of the same shape run the same tiles."""
    from graphkernel.patterns.reduce import reduce_signatures

    if k.op != "GraphKernel" or _product(k):
        return None
    body = k.subgraph
    if any(n.op in ("Scan", "ElemAny") for n in body.nodes):
        return None
    sigs = reduce_signatures(SimpleNamespace(nodes=body.nodes))
    if len(sigs) != 1:
        return None
    ((shape, axes),) = sigs
    reduced = {id(v) for n in body.nodes if ops.get(n.op).kind == OpKind.REDUCE
               for v in n.outputs}
    if not all(id(_base(v)) in reduced for v in body.outputs):
        return None
    return (tuple(symbolic.canon(d) for d in shape), tuple(axes),
            tuple((tuple(symbolic.canon(d) for d in v.shape), v.type.dtype)
                  for v in k.outputs[:1]))


def _read_whole_reduced(v: Value, k: Node) -> bool:
    """Whether reducing kernel ``k`` reads ``v`` whole in the shape its reductions reduce."""
    shape = _reduce_space(k)[0]
    return symbolic.eq(v.type.numel, symbolic.numel(shape))


def _reduces(k: Node) -> bool:
    return any(ops.get(n.op).kind == OpKind.REDUCE for n in k.subgraph.nodes)


def _candidate(k: Node) -> bool:
    return k.op == "GraphKernel" and not _product(k) and _loop_space(k) is not None


def _sliced(k: Node, v: Value) -> bool:
    """Whether kernel ``k`` reads ``v`` only through slices (of a view of it)."""
    body = k.subgraph
    for outer, inner in zip(k.inputs, body.inputs, strict=True):
        if outer is not v:
            continue
        seen = [inner]
        while seen:
            x = seen.pop()
            for u in x.users:
                if u.op in RESHAPE_OPS:
                    seen += list(u.outputs)
                elif u.op not in ("Slice", "StridedSlice"):
                    return False
    return any(outer is v for outer in k.inputs)


def _part_readers(v: Value) -> list[Node]:
    """Kernels reading parts of ``v``, a computed value or a graph input, reducing nothing
    (a kernel's loop space is then its outputs' shape): through slices (of views of ``v``),
    or a whole output of those ``v``'s producer makes (a Split's parts): the kernels rotating
    Q and K read parts of one fused projection. Not a constant, and not a value read
    broadcast: two computations sharing only a table (a bias, the rotary angles) are not
    siblings."""
    if v.producer is not None and v.producer.op == "Constant":
        return []
    outs = v.producer.outputs if v.producer is not None else [v]
    return [k for o in outs for w in _views_of(o) for k in dict.fromkeys(w.users)
            if _candidate(k) and not _reduces(k)
            and (_sliced(k, w) or len(outs) > 1 and _read_whole(w, k))]


def sibling_fusion(graph: Graph, ctx) -> PassResult:
    """Rewrite two independent vector kernels sharing a read of one value, every output of
    both in one shape -> one kernel, when the code generator schedules it."""
    same = lambda a, b: _loop_space(a) == _loop_space(b)  # noqa: E731
    joined = join_kernel_pairs(
        graph, ctx, lambda: [v for n in graph.nodes for v in n.outputs] + list(graph.inputs),
        lambda v: [u for u in dict.fromkeys(v.users) if _candidate(u) and _read_whole(v, u)],
        same, "sibling")
    joined += join_kernel_pairs(
        graph, ctx, lambda: [n.outputs[0] for n in graph.nodes
                             if n.outputs and n.op != "Constant"] + list(graph.inputs),
        lambda v: list(dict.fromkeys(_part_readers(v))), same, "sibling")
    joined += join_kernel_pairs(
        graph, ctx, lambda: [v for n in graph.nodes for v in n.outputs] + list(graph.inputs),
        lambda v: [u for u in dict.fromkeys(v.users) if _reduce_space(u) is not None
                   and _read_whole_reduced(v, u)],
        lambda a, b: _reduce_space(a) == _reduce_space(b), "sibling")
    notes = [f"{a.name} | {b.name} -> {k.name} (both read {v.name})" for a, b, k, v in joined]
    for s, k, merged in _join_lone_reductions(graph, ctx):
        joined.append((s, k, merged, s.inputs[0]))
        notes.append(f"{s.name} (a reduction alone) | {k.name} -> {merged.name} (both reduce "
                     f"{s.inputs[0].name} over the same axes)")
    for s, k, merged in _join_lone_slices(graph, ctx):
        joined.append((s, k, merged, s.inputs[0]))
        notes.append(f"{s.name} (a slice copied alone) | {k.name} -> {merged.name} (both read "
                     f"{_base(s.inputs[0]).name})")
    return PassResult(bool(joined), len(joined), [
        f"{counted(len(joined), 'kernel pair')} reading one value in one loop space joined",
        *notes] if joined else [])


def _base(v: Value) -> Value:
    """``v`` seen through reshape views."""
    while v.producer is not None and v.producer.op in RESHAPE_OPS:
        v = v.producer.inputs[0]
    return v


def _views_of(v: Value) -> list[Value]:
    """``v`` and every value that is ``v`` through reshape views."""
    out, todo = [], [v]
    while todo:
        x = todo.pop()
        out.append(x)
        todo += [o for u in x.users if u.op in RESHAPE_OPS for o in u.outputs]
    return out


def _joinable(k: Node, s: Node) -> bool:
    """Whether the code generator schedules kernel ``k`` with the lone op ``s`` beside it
    (probed on a graph of its own: ``graph`` is not touched)."""
    body = Graph(s.name)
    x = body.add_input(s.inputs[0].name, s.inputs[0].type)
    body.set_outputs([body.add_node(s.op, [x], dict(s.attrs), name=s.name).outputs[0]])
    alone = SimpleNamespace(subgraph=body, inputs=[s.inputs[0]], outputs=[s.outputs[0]])
    if not scheduled(k):
        return False
    for rebound in (False, True):  # (the code generator's retry: one input per slice)
        joined, ins = parallel_body([k, alone], "probe")
        if rebound and not separate_slice_reads(joined, ins):
            return False
        probe = Graph("probe")
        node = probe.add_node("GraphKernel", [probe.add_input(f"in{i}", v.type)
                                              for i, v in enumerate(ins)],
                              {"subgraph": joined, "pattern": "parallel"})
        if scheduled(node):
            return True
    return False


def _join_lone_slices(graph: Graph, ctx) -> list[tuple[Node, Node, Node]]:
    """A slice copied by a launch of its own (a fused projection's V part, copied because the
    attention operator reads V whole while the K part beside it is rotated by a kernel)
    joins a kernel of its loop space reading the same projection (through views, in part)
    when neither depends on the other and the code generator schedules the two together:
    the slice's rows are copied by that kernel's launch. Returns (slice, kernel, joined)."""
    done = []
    for s in [n for n in graph.nodes if n.op == "StridedSlice"]:
        if any(st != 1 for st in (s.attrs.get("strides") or [1])) or \
                s.outputs[0].dtype not in SUPPORTED_DTYPES:
            continue
        space = (tuple(symbolic.canon(d) for d in s.outputs[0].shape), s.outputs[0].dtype)
        partner = _partner(graph, ctx, s, _part_readers(_base(s.inputs[0])), space,
                           _loop_space)
        if partner is not None:
            done.append((s, partner, _absorb(graph, ctx, s, partner, "slice")))
    return done


def _partner(graph: Graph, ctx, s: Node, kernels, space, space_of) -> Node | None:
    """The first of ``kernels`` whose ``space_of`` is ``space``, with room for one op more
    (``composite_op_limit_size``), independent of ``s`` and joinable with it, that the flags
    let join ``s``; else None."""
    limit = ctx.flags.composite_op_limit_size
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for k in kernels:
        if k is s or space_of(k) != space or _ops(k) + 1 > limit:
            continue
        a, b = sorted((s, k), key=lambda n: order[id(n)])
        if reaches(graph, a, b, order) or not _joinable(k, s):
            continue
        if ctx.should_apply(f"{s.name} | {k.name}", [s, k]):
            return k
    return None


def _absorb(graph: Graph, ctx, s: Node, partner: Node, kind: str) -> Node:
    """``s`` made a kernel of its own (``kind``) and merged beside ``partner``."""
    lone = build_kernel(graph, [s], next_kernel_name(ctx.analyses, [s], kind), kind)
    return merge_parallel(graph, partner, lone, next_kernel_name(
        ctx.analyses, list(partner.subgraph.nodes), "sibling"))


def _lone_reduce_space(n: Node) -> tuple | None:
    """``_reduce_space`` of a reduction left outside the kernels (a bias's gradient summed
    over the batch, a launch of its own), else None."""
    from graphkernel.opdefs.reduce import reduce_axes

    if n.op == "GraphKernel" or n.op in ("Scan", "ElemAny") or len(n.inputs) != 1 or \
            len(n.outputs) != 1 or ops.get(n.op).kind != OpKind.REDUCE or \
            n.outputs[0].dtype not in SUPPORTED_DTYPES or \
            not isinstance(n.attrs.get("axis", None), (list, tuple, type(None))):
        return None
    x, y = n.inputs[0].type, n.outputs[0]
    return (tuple(symbolic.canon(d) for d in x.shape), tuple(reduce_axes(x.rank,
                                                                         n.attrs.get("axis"))),
            ((tuple(symbolic.canon(d) for d in y.shape), y.type.dtype),))


def _join_lone_reductions(graph: Graph, ctx) -> list[tuple[Node, Node, Node]]:
    """A reduction left a launch of its own (the sum over the batch of a gradient: a bias's
    gradient) joins a kernel reading the same value whole that reduces the same axes of the
    same shape and leaves only reduced values (the sum over the batch of that gradient times
    the normalised input: the norm weight's gradient), when neither depends on the other and
    the code generator schedules the two together: one launch reduces both over the same
    tiles, reading the shared value once. Each sum is the same ops on the same values.
    Returns (reduction, kernel, joined)."""
    done = []
    for s in [n for n in graph.nodes if _lone_reduce_space(n) is not None]:
        partner = _partner(graph, ctx, s, dict.fromkeys(s.inputs[0].users),
                           _lone_reduce_space(s), _reduce_space)
        if partner is not None:
            done.append((s, partner, _absorb(graph, ctx, s, partner, "reduce_output")))
    return done
