"""Index maps of views: where each element of a value sits in a GM buffer.

A map is affine: element ``(i0, i1, ...)`` of a value sits at ``base + sum(i_j * strides[j])``
of a buffer. Views (Reshape, ExpandDims, Squeeze, Identity, Transpose) move no data; they
only change the map. ``through_views`` walks a chain of views back from a value stored in GM
to the computed value it shows and gives that value's map: the kernel then stores the
computed value's rows straight to their places (a channel shuffle's Transpose, an attention
head merge) instead of ending the kernel at the view. ``sink_concats`` moves an op that every
operand of a Concat ends with past the Concat, so the Concat reads kernel inputs (loaded
piece by piece into one tile).
"""

from __future__ import annotations

import numpy as np

from graphkernel import symbolic
from graphkernel.ir import Dim, Graph, Node, Value
from graphkernel.ops import VIEW_OPS
from graphkernel.symbolic import eq


def contiguous(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Row-major element strides of ``shape``."""
    return tuple(symbolic.numel(shape[i + 1:]) for i in range(len(shape)))


def _groups(a: list[Dim], b: list[Dim]) -> list[tuple[list[int], list[int]]] | None:
    """Pairs of runs of positions of ``a`` and ``b`` (dims other than 1) with equal products,
    covering both in order (how a reshape regroups axes); None when they do not regroup."""
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while not eq(pa, pb):
            if symbolic.div(pb, pa) is not None and i < len(a):  # a's run is the smaller
                ga.append(i)
                pa = symbolic.mul(pa, a[i])
                i += 1
            elif symbolic.div(pa, pb) is not None and j < len(b):
                gb.append(j)
                pb = symbolic.mul(pb, b[j])
                j += 1
            else:
                return None
        out.append((ga, gb))
    return out if i == len(a) and j == len(b) else None


def reshape_map(src: tuple[Dim, ...], dst: tuple[Dim, ...], strides: tuple[Dim, ...]
                ) -> tuple[Dim, ...] | None:
    """The strides over ``src`` of the elements of a reshape of ``src`` into ``dst`` whose
    map has ``strides`` over ``dst``; None when the reshape merges axes that the map keeps
    apart (no affine map exists). Axes of extent 1 get stride 0."""
    sa = [k for k, d in enumerate(src) if not eq(d, 1)]
    da = [k for k, d in enumerate(dst) if not eq(d, 1)]
    groups = _groups([src[k] for k in sa], [dst[k] for k in da])
    if groups is None:
        return None
    out: list[Dim] = [0] * len(src)
    for ga, gb in groups:
        axes = [da[k] for k in gb]
        for k, nxt in zip(axes, axes[1:], strict=False):  # one flat run in the map
            if not eq(strides[k], symbolic.mul(strides[nxt], dst[nxt])):
                return None
        run: Dim = strides[axes[-1]]
        for k in reversed([sa[x] for x in ga]):
            out[k] = run
            run = symbolic.mul(run, src[k])
    return tuple(out)


def step_back(n: Node, strides: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """The map over the input of view ``n`` given the map of its output; None if not affine."""
    if n.op in VIEW_OPS or n.op == "Cast":
        return reshape_map(tuple(n.inputs[0].shape), tuple(n.outputs[0].shape), strides)
    if n.op == "Transpose":  # out[j] = in[perm-permuted j]: input axis perm[k] has out's k
        out: list[Dim] = [0] * len(strides)
        for k, p in enumerate(n.attrs["perm"]):
            out[p] = strides[k]
        return tuple(out)
    return None


def through_views(v: Value, source: Value, is_view) -> tuple[Dim, ...] | None:
    """The map over ``source`` of the elements of ``v``, a chain of views of ``source``
    stored contiguously: the strides at which each element of ``source`` lands in ``v``'s
    buffer. ``is_view(node)`` says which producers are views. None if no affine map exists."""
    strides = contiguous(tuple(v.shape))
    while v is not source:
        n = v.producer
        if n is None or not is_view(n):
            return None
        got = step_back(n, strides)
        if got is None:
            return None
        strides, v = got, n.inputs[0]
    return strides


def column_slice(n: Node) -> tuple[int, int] | None:
    """(first column, width) when ``n`` is a Slice/StridedSlice that keeps every axis but the
    last whole and takes a run of consecutive columns of a static last axis (rotary
    embedding's halves): a view of each row at a column offset. None otherwise."""
    if n.op not in ("Slice", "StridedSlice") or not n.inputs[0].shape:
        return None
    src, out = tuple(n.inputs[0].shape), tuple(n.outputs[0].shape)
    last = len(src) - 1
    if not isinstance(src[last], int) or any(not eq(a, b) for a, b in zip(src[:last],
                                                                            out[:last])):
        return None
    if n.op == "Slice":
        return n.attrs["begin"][last], out[last]
    a = n.attrs
    axes = a["axes"] if a["axes"] is not None else list(range(len(a["begin"])))
    steps = a["strides"] or [1] * len(a["begin"])
    start = 0
    for b, e, st, ax in zip(a["begin"], a["end"], steps, axes, strict=True):
        ax %= len(src)
        if ax != last:
            if st != 1 and not eq(src[ax], 1):
                return None
            continue
        if st != 1:
            return None
        start = slice(b, e, st).indices(src[last])[0]
    return start, out[last]


def column_source(v: Value, elementwise, unit: int = 1, depth: int = 0) -> Value | None:
    """The value whose columns ``v`` shows: ``v`` is a slice of the last axis (of a slice...)
    of it, a Concat of such pieces along the last axis, or elementwise ops on them with other
    operands of their own width (``-x[..., h:]``, ``x[..., :r] * cos``). None otherwise, or
    when a slice starts at a column that is not a multiple of ``unit``."""
    n = v.producer
    if n is None or depth > 64:
        return None
    if column_slice(n) is not None:
        while v.producer is not None and column_slice(v.producer) is not None:
            if column_slice(v.producer)[0] % unit:
                return None
            v = v.producer.inputs[0]
        return v
    if n.op == "Concat" and column_concat(n, elementwise, unit, depth + 1):
        return column_source(n.inputs[0], elementwise, unit, depth + 1)
    if not elementwise(n) or len(n.outputs) != 1:
        return None
    srcs = [column_source(x, elementwise, unit, depth + 1) for x in n.inputs
            if not eq(x.type.numel, 1)]
    found = [s for s in srcs if s is not None]
    if not found or len({symbolic.canon(s.shape[-1]) for s in found}) != 1:
        return None
    return found[0]


def column_concat(n: Node, elementwise, unit: int = 1, depth: int = 0) -> bool:
    """A Concat along the last axis whose operands all show columns of values with rows of
    one length (rotary embedding's ``cat(-x[..., h:], x[..., :h])``): the code generator
    copies each piece to its columns of one tile. ``unit``: every piece starts at a multiple
    of it, in the Concat and where it is sliced from (the UB block, in elements)."""
    if n.op != "Concat" or not n.outputs[0].shape:
        return False
    rank = len(n.outputs[0].shape)
    if n.attrs["axis"] % rank != rank - 1:
        return False
    at = 0
    for x in n.inputs:
        if not isinstance(x.shape[-1], int) or at % unit:
            return False
        at += x.shape[-1]
    srcs = [column_source(x, elementwise, unit, depth) for x in n.inputs]
    return all(s is not None for s in srcs) and len(
        {symbolic.canon(s.shape[-1]) for s in srcs}) == 1


def _same_scalar(vals: list[Value]) -> bool:
    """One scalar for every piece: the same value, or equal one-element constants."""
    if not all(eq(v.type.numel, 1) for v in vals):
        return False
    if all(v is vals[0] for v in vals):
        return True
    consts = [v.producer for v in vals]
    if not all(c is not None and c.op == "Constant" for c in consts):
        return False
    first = np.asarray(consts[0].attrs["value"])
    return all(v.dtype == vals[0].dtype and np.array_equal(np.asarray(c.attrs["value"]), first)
               for v, c in zip(vals, consts, strict=True))


def _shared_op(pieces: list[Value]) -> list[list[Value]] | None:
    """When every piece is the result of one op (same attributes, distinct nodes) whose
    operands are pieces of their own shape or one shared scalar: the operand columns that
    are pieces (one Concat each after the op moves past it); else None."""
    ms = [v.producer for v in pieces]
    m0 = ms[0]
    if any(m is None or m.op != m0.op or m.attrs != m0.attrs or len(m.inputs) != len(m0.inputs)
           for m in ms) or len({id(m) for m in ms}) != len(ms):
        return None
    cols = []
    for j in range(len(m0.inputs)):
        col = [m.inputs[j] for m in ms]
        if _same_scalar(col):
            continue
        if not all(tuple(v.shape) == tuple(x.shape) and v.dtype == col[0].dtype
                   for v, x in zip(col, pieces, strict=True)):
            return None
        cols.append(col)
    return cols


def sinkable(n: Node, elementwise) -> bool:
    """A Concat whose operands are all results of one elementwise op (same attributes), each
    read only by the Concat, with operands of the piece's own shape or one shared scalar:
    op(a_k, ...) concatenated equals op(Concat(a_k), ...)."""
    if n.op != "Concat" or len(n.inputs) < 2:
        return False
    ms = [x.producer for x in n.inputs]
    if any(m is None or len(m.outputs) != 1 or not elementwise(m) for m in ms):
        return False
    graph_outs = {id(v) for v in n.graph.outputs}
    if any(len(x.uses) != 1 or id(x) in graph_outs for x in n.inputs):
        return False
    return _shared_op(list(n.inputs)) is not None


def sink_concats(sub: Graph, elementwise) -> tuple[Graph, dict[int, Node]]:
    """``sub`` itself when no Concat's operands share their last op; else a copy where each
    such op runs once after the Concat (repeatedly: Relu(x + b) pieces become one Relu and
    one Add of Concats), so the Concat reads kernel inputs, loaded into one tile. Also a map
    from each new node to the Concat of ``sub`` it came from."""
    if not any(sinkable(n, elementwise) for n in sub.nodes):
        return sub, {}
    g = sub.copy()
    back = {id(a): b for a, b in zip(g.nodes, sub.nodes, strict=True)}
    moved: dict[int, Node] = {}
    while True:
        n = next((n for n in g.nodes if sinkable(n, elementwise)), None)
        if n is None:
            break
        source = moved.get(id(n), back.get(id(n)))
        ms = [x.producer for x in n.inputs]
        ins = []
        for j in range(len(ms[0].inputs)):
            col = [m.inputs[j] for m in ms]
            if _same_scalar(col):
                ins.append(col[0])
                continue
            cat = g.add_node("Concat", col, {"axis": n.attrs["axis"]}, origin=n.origin)
            moved[id(cat)] = source
            ins.append(cat.output)
        op = g.add_node(ms[0].op, ins, dict(ms[0].attrs), origin=ms[0].origin)
        moved[id(op)] = source
        g.replace_all_uses(n.outputs[0], op.output)
        g.remove_dead()
        g.toposort()
    return g, moved


def sinks_to_inputs(pieces: list[Value], inside, elementwise) -> bool:
    """Whether a Concat of ``pieces`` becomes, after ``sink_concats``, Concats of values from
    outside the kernel (``inside(node)``: the node is in the kernel), each read once inside
    it: what the code generator loads piece by piece."""
    ms = [v.producer for v in pieces]
    if all(m is None or not inside(m) for m in ms):
        return all(sum(1 for u, _ in v.uses if inside(u)) == 1 for v in pieces)
    if any(m is None or not inside(m) or len(m.outputs) != 1 or not elementwise(m)
           or len(v.uses) != 1 for m, v in zip(ms, pieces, strict=True)):
        return False
    cols = _shared_op(pieces)
    return cols is not None and all(sinks_to_inputs(c, inside, elementwise) for c in cols)
