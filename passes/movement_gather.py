"""Rewrite a connected region of data-movement ops (slices, concatenations, pads, views,
transposes, broadcasts, constant-index gathers and scatters, selects under a constant
condition, widening casts of integers) → one Gather per value the region hands out, when
that saves launches.

Sliding-window and block-sparse attention build their score layouts by moving data only:
a product's output is padded (a Concat with a constant block), re-strided (``as_strided``:
a Gather at constant positions), cut into chunk diagonals (slices), copied into a zeroed
buffer (``slice_scatter``: slices concatenated with constant blocks), and masked at the
window's edges (a Select whose condition and fill are constants). Each slice and
concatenation of that machinery runs as a small kernel of its own, and none of them
computes anything: every element of the region's result is either an element of one of
the region's inputs or an element of one of its constants.

Indices given as data move the same way. BigBird's random-block plan is an input of the
graph (one int32 table per head): it is concatenated, widened to int64 (a Cast that keeps
every value), broadcast over the batch, sliced per window and broadcast again over each
block's rows before a GatherElements or a ScatterElements reads it. Each of those integer
ops is a launch of its own (the vector kernels compute integers in bitwise ops only), so
in a region of integers every op but a view counts. A value the region hands out that is
wider than its inputs and read only as indices (``INDEX_OPERAND``: the ops read index
values, not their type) is gathered in the inputs' own type; any other reader keeps the
region as it is. A ScatterElements by constant indices (``slice_scatter``'s) places its
updates' elements and keeps the others: movement too.

The pass follows every element: it runs the ops' own reference implementations on arrays
of element positions instead of values (the inputs' elements numbered one after another,
then the constants' elements), with the constant operands that steer the movement (a
Select's condition, a Gather's indices) as they are. What comes out for each value the
region hands out is, per element, the position it is read from. That value is then one
Gather of the inputs' elements at those positions (int32 indices, a Constant), and where
some elements are constants, a Select of those constants under a constant mask, which is
elementwise and joins its consumer's kernel. A value reading several inputs gathers from
their concatenation (one Concat of the flattened inputs it reads: only those, which are
computed before it, so that the rewrite makes no cycle when the region's own results come
back into it through other work). Exact: every element is moved, none is computed, and
each lands where the region put it.

Applied when the shapes are static, the region's slices, concatenations and gathers
outnumber the launches it becomes by ``MIN_SAVED`` (a region that is a single slice or a
single concatenation stays: the patterns fuse those with their neighbours; so do slices and
one Concat of values computed by vector work, and a region reading such values that places
no constant, whose slices and Concats the ``concat`` pattern stores from the kernels
computing them), and the
position tables stay under ``MAX_ELEMENTS`` elements in all (the positions followed through
the region under four times that); anything else is left as it is, with the reason logged.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops
from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.ops import RefContext
from graphkernel.passes.rewrite import connected_regions, const_array
from graphkernel.registry import PassResult, counted

# op -> the input positions that carry data (the others must be constants that steer the
# movement: a Select's condition, a Gather's indices)
DATA_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Reshape": (0,), "ExpandDims": (0,), "Squeeze": (0,), "Transpose": (0,),
    "BroadcastTo": (0,), "StridedSlice": (0,), "Slice": (0,),
    "Concat": None,  # every input
    "Gather": (0,),  # indices: a constant
    "Select": (1, 2),  # condition: a constant
    "Cast": (0,),  # integers widened only (``_widens``): every value kept
    "ScatterElements": (0, 2),  # indices: a constant; updates placed, none added
}
# ops that run as launches (or the core of one) when the patterns leave them alone
MOVING = frozenset({"StridedSlice", "Slice", "Concat", "Gather", "ScatterElements"})
# ops that are views of integer data; any other op of integers runs as a launch of its own
# (a vector kernel computes integers in bitwise ops only: an index broadcast, sliced,
# transposed or widened is a lone kernel)
INT_VIEWS = frozenset({"Reshape", "ExpandDims", "Squeeze"})
# op -> the input that holds indices (any integer type: the op reads their values only)
INDEX_OPERAND = {"Gather": 1, "GatherElements": 1, "ScatterElements": 1}
MIN_SAVED = 2  # launches a rewrite must save at least (1 in a region that gathers already)
MAX_ELEMENTS = 1 << 20  # elements of all position tables of one region


def _data_positions(n: Node) -> tuple[int, ...]:
    got = DATA_INPUTS[n.op]
    return tuple(range(len(n.inputs))) if got is None else got


def _widens(a: DType, b: DType) -> bool:
    """Whether a Cast from integer type ``a`` to ``b`` keeps every value (int32 indices
    widened to torch's int64: a value moved, nothing computed)."""
    return a.is_int and b in (DType.int32, DType.int64) and (
        a == b or b.itemsize > a.itemsize)


def _moves(n: Node) -> bool:
    """Whether ``n`` only moves data, with static shapes, steered by constants only."""
    if n.op not in DATA_INPUTS or len(n.outputs) != 1 or not n.outputs[0].type.is_static:
        return False
    if n.op == "Cast" and not _widens(n.inputs[0].dtype, n.outputs[0].dtype):
        return False
    if n.op == "ScatterElements" and n.attrs.get("reduction", "none") != "none":
        return False  # (an added update is computed)
    if any(not v.type.is_static for v in n.inputs):
        return False
    data = _data_positions(n)
    steer = [i for i in range(len(n.inputs)) if i not in data]
    if any(const_array(n.inputs[i]) is None for i in steer):
        return False
    return not all(const_array(n.inputs[i]) is not None for i in data)  # (folded anyway)


def _regions(graph: Graph) -> list[list[Node]]:
    """Connected regions of moving nodes (joined through data edges), in graph order."""
    return connected_regions([n for n in graph.nodes if _moves(n)],
                             lambda n: (n.inputs[i] for i in _data_positions(n)))


class _Plan:
    """Where each element of a region's outgoing values is read from."""

    def __init__(self, graph: Graph, region: list[Node]) -> None:
        self.region = region
        mine = {id(n) for n in region}
        self.sources: list[Value] = []  # the region's non-constant inputs, in order
        self.consts: list[np.ndarray] = []  # its constant data, flattened, in order
        seen: set[int] = set()
        for n in region:
            for i in _data_positions(n):
                v = n.inputs[i]
                if (v.producer is None or id(v.producer) not in mine) and \
                        const_array(v) is None and id(v) not in seen:
                    seen.add(id(v))
                    self.sources.append(v)
        self.outs = [n.outputs[0] for n in region if graph.is_output(n.outputs[0]) or any(
            id(u) not in mine for u, _ in n.outputs[0].uses)]
        self.n_src = sum(int(v.type.numel) for v in self.sources)

    def positions(self) -> dict[int, np.ndarray]:
        """Per outgoing value, the position of each element: below ``n_src`` an element of
        the sources (numbered one after another), from there on one of ``pool``."""
        env: dict[int, np.ndarray] = {}
        at = 0
        for v in self.sources:
            k = int(v.type.numel)
            env[id(v)] = np.arange(at, at + k, dtype=np.int64).reshape(v.type.shape)
            at += k
        for n in self.region:
            data = _data_positions(n)
            xs = []
            for i, v in enumerate(n.inputs):
                if id(v) in env:
                    xs.append(env[id(v)])
                    continue
                arr = const_array(v)
                if i in data:  # constant data: its elements numbered into the pool
                    k = int(arr.size)
                    env[id(v)] = np.arange(at, at + k, dtype=np.int64).reshape(arr.shape)
                    self.consts.append(np.asarray(arr).reshape(-1))
                    at += k
                    xs.append(env[id(v)])
                else:
                    xs.append(np.asarray(arr))
            out = n.outputs[0]
            shape = tuple(int(d) for d in out.type.shape)
            got = ops.get(n.op).reference(xs, n.attrs, RefContext(
                (shape,), (np.dtype(np.int64),), n.name))
            got = np.asarray(got[0] if isinstance(got, tuple | list) else got)
            if got.shape != shape or got.dtype.kind not in "iu":
                raise ValueError(f"{n.name} ({n.op}) moved positions to {got.shape} "
                                 f"{got.dtype}, not {shape}")
            env[id(out)] = got.astype(np.int64)
        return {id(v): env[id(v)] for v in self.outs}

    def pool(self, dtype: DType) -> np.ndarray:
        if not self.consts:
            return np.zeros(0, dtype.np)
        return np.concatenate(self.consts).astype(dtype.np)


VECTOR_KINDS = (ops.OpKind.ELEMWISE, ops.OpKind.BROADCAST, ops.OpKind.REDUCE)


def _left_to_patterns(plan: _Plan) -> bool:
    """A region that does not gather and reads values computed by vector work, with either
    at most one Concat and only such values, or no constant to place: the ``concat`` pattern
    pulls slices and Concats of such values into the kernel that computes them (a Concat of
    a norm's shifted rows stored piece by piece; a rotary's halves concatenated back, the
    heads cut from a fused projection read by that kernel), where they cost no launch, which
    a Gather (a launch of its own, joining no kernel) would: the count of slices and
    Concats overstates what such a region costs. A region that pads or masks with constants
    (sliding-window chunks) keeps its count: a constant block is not stored by the kernels
    computing the values beside it."""
    if any(n.op == "Gather" for n in plan.region):
        return False
    vector = [v.producer is not None and v.producer.op not in ops.PRODUCT_OPS
              and ops.get(v.producer.op).kind in VECTOR_KINDS for v in plan.sources]
    if all(vector) and sum(n.op == "Concat" for n in plan.region) < 2:
        return True
    places = any(n.op == "Select" or any(const_array(n.inputs[i]) is not None
                                         for i in _data_positions(n)) for n in plan.region)
    return any(vector) and not places


def _moving(graph: Graph, plan: _Plan) -> int:
    """The region's launches as the patterns leave them (an estimate): its slices,
    concatenations, gathers and scatters, and, in a region that gathers, the transposes
    inside it (a Gather outside the lookup form joins no kernel at opt_level 2, and what it
    reads is stored for it); in a region of integers whose values are read only as indices,
    every op but a view (``INT_VIEWS``: an index broadcast, sliced, transposed or widened
    for a gather or scatter runs alone; integers read as data may join the kernel reading
    them, so there they are not counted)."""
    outs = {id(v) for v in plan.outs}
    gathers = any(n.op == "Gather" for n in plan.region)
    indices = all(_index_only(graph, v) for v in plan.outs)
    return sum(n.op in MOVING or (gathers and n.op == "Transpose" and id(n.outputs[0])
                                  not in outs)
               or (indices and n.outputs[0].dtype.is_int and n.op not in INT_VIEWS)
               for n in plan.region)


def _index_only(graph: Graph, v: Value) -> bool:
    """Whether ``v`` is read only as the indices of gathers and scatters."""
    return not graph.is_output(v) and all(INDEX_OPERAND.get(u.op) == i for u, i in v.uses)


def _dtype_refusal(graph: Graph, plan: _Plan) -> str:
    """Why the region's values cannot be gathered from its sources in their own type; ""
    when they can. The sources share one type; an outgoing value of a wider integer type
    (after a widening Cast) is only read as indices (``INDEX_OPERAND``), which read values,
    not types, so it is handed out as gathered, in the sources' type."""
    if not plan.outs or not plan.sources:
        return "no outgoing value or no input"
    src = {v.dtype for v in plan.sources}
    if len(src) != 1:
        return f"inputs of several types ({', '.join(sorted(map(str, src)))})"
    (dt,) = src
    for v in plan.outs:
        if v.dtype == dt:
            continue
        if not _widens(dt, v.dtype):
            return f"{v.name} is {v.dtype}, its inputs {dt}"
        if not _index_only(graph, v):
            return (f"{v.name} is {v.dtype}, its inputs {dt}, and it is read as other than "
                    "indices")
    return ""


def _read(plan: _Plan, pos: np.ndarray) -> tuple[int, ...]:
    """The sources (by index) whose elements ``pos`` reads, in order."""
    bounds = np.cumsum([0] + [int(v.type.numel) for v in plan.sources])
    got = pos[pos < plan.n_src]
    return tuple(int(k) for k in np.unique(np.searchsorted(bounds, got, "right") - 1))


def _launches(plan: _Plan, where: dict[int, np.ndarray]) -> int:
    """Launches the rewrite makes: one Gather per outgoing value that reads a source (a
    Select of constants joins its consumer), and a Concat of the sources of each value
    that reads more than one (one per set of sources)."""
    reads = [_read(plan, pos) for pos in where.values()]
    return sum(bool(r) for r in reads) + len({r for r in reads if len(r) > 1})


def _rewrite(graph: Graph, plan: _Plan, where: dict[int, np.ndarray]) -> None:
    """Each outgoing value as a Gather of the sources it reads (their concatenation when it
    reads several: only those, so that no Gather reads a value computed from another
    one's result), under a Select of the constants it places. Values are gathered in the
    sources' type (a widened index stays narrow: ``_dtype_refusal``)."""
    dtype = plan.sources[0].dtype
    pool = plan.pool(dtype)
    sizes = [int(v.type.numel) for v in plan.sources]
    bounds = np.cumsum([0] + sizes)
    first = plan.region[0]
    origin = tuple(dict.fromkeys(o for n in plan.region for o in n.origin))
    flat: dict[tuple[int, ...], Value] = {}

    def name(base: str) -> str:
        return graph.fresh_name(f"{first.name}/{base}")

    def flattened(ks: tuple[int, ...]) -> Value:
        """Sources ``ks`` flattened, one after another."""
        if ks not in flat:
            parts = [graph.add_node("Reshape", [plan.sources[k]], {"shape": [sizes[k]]},
                                    name=name("flat"), origin=origin).outputs[0]
                     for k in ks]
            flat[ks] = parts[0] if len(parts) == 1 else graph.add_node(
                "Concat", parts, {"axis": 0}, name=name("sources"), origin=origin).outputs[0]
        return flat[ks]

    for out in plan.outs:
        pos = where[id(out)]
        from_pool = pos >= plan.n_src
        ks = _read(plan, pos)
        if not ks:
            new = graph.add_node("Constant", [], {"value": pool[pos - plan.n_src]},
                                 name=name("constant"), origin=origin).outputs[0]
        else:
            at = np.zeros(len(sizes), np.int64)  # where each source starts in what is read
            at[list(ks)] = np.cumsum([0] + [sizes[k] for k in ks])[:-1]
            k_of = np.searchsorted(bounds, np.where(from_pool, 0, pos), "right") - 1
            idx = np.where(from_pool, 0, pos - bounds[k_of] + at[k_of]).astype(np.int32)
            table = graph.add_node("Constant", [], {"value": idx}, name=name("positions"),
                                   origin=origin).outputs[0]
            new = graph.add_node("Gather", [flattened(ks), table], {"axis": 0},
                                 name=name("gather"), origin=origin).outputs[0]
            if from_pool.any():
                fill = np.where(from_pool, pool[np.where(from_pool, pos - plan.n_src, 0)],
                                np.zeros((), dtype.np)).astype(dtype.np)
                mask = graph.add_node("Constant", [], {"value": from_pool}, name=name("mask"),
                                      origin=origin).outputs[0]
                fills = graph.add_node("Constant", [], {"value": fill}, name=name("fill"),
                                       origin=origin).outputs[0]
                new = graph.add_node("Select", [mask, fills, new], {}, name=name("select"),
                                     origin=origin).outputs[0]
        graph.replace_all_uses(out, new)
    for n in reversed(plan.region):
        if n.graph is not None and not any(v.uses or graph.is_output(v) for v in n.outputs):
            graph.erase_node(n)


def movement_gather(graph, ctx) -> PassResult:
    """Rewrite a region of slices, concatenations, views and constant-steered gathers and
    selects → one Gather (and a Select of its constants) per value it hands out, when that
    saves launches."""
    notes = []
    for region in _regions(graph):
        plan = _Plan(graph, region)
        moving = _moving(graph, plan)
        least = 1 if any(n.op == "Gather" for n in region) else MIN_SAVED
        if moving < least + 1:
            continue
        where_ = f"{region[0].name} ({len(region)} ops, {moving} slices/concats/gathers)"
        why = _dtype_refusal(graph, plan)
        if why:
            ctx.log(f"{where_}: kept ({why})")
            continue
        if _left_to_patterns(plan):
            ctx.log(f"{where_}: kept (values computed by vector work, moved without a gather "
                    "or a constant: the concat pattern stores them from the kernels "
                    "computing them)")
            continue
        size = sum(int(v.type.numel) for v in plan.outs)
        inner = sum(int(n.outputs[0].type.numel) for n in region)
        if size > MAX_ELEMENTS or inner > 4 * MAX_ELEMENTS or plan.n_src >= 1 << 31:
            ctx.log(f"{where_}: kept ({size} positions to tabulate, {inner} to follow; at "
                    f"most {MAX_ELEMENTS} and {4 * MAX_ELEMENTS})")
            continue
        try:
            where = plan.positions()
        except Exception as e:  # noqa: BLE001 - a reference refusing positions: keep it
            ctx.log(f"{where_}: kept (positions not followed: {e})")
            continue
        after = _launches(plan, where)
        if moving - after < least:
            ctx.log(f"{where_}: kept ({after} launches after, saving under {least})")
            continue
        if not ctx.should_apply(f"{where_} as {after} gathers", region):
            continue
        _rewrite(graph, plan, where)
        notes.append(f"{where_}: {len(plan.outs)} values as gathers of "
                     f"{len(plan.sources)} inputs ({moving} -> {after} launches)")
    for note in notes:
        ctx.log(note)
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'region')} of data movement as gathers")
