"""A Split of the last axis whose parts only vector work reads → one slice per part.

A Split is a launch of its own: it copies every part of its operand to a buffer of the
part's own. When each part is read only by ops a vector kernel computes (elementwise work,
reductions, scans; through views), each part is instead a ``StridedSlice`` of the last
axis, which the kernel reading it loads in place as columns of its rows: no launch, no copy.
A state-space layer's ``x_proj`` output cut into ``dt``, ``B`` and ``C`` (each normalised,
FalconMamba) and Mamba2's convolved ``x``, ``B`` and ``C`` are read so. A part that a matrix
product, a convolution or another operator reads keeps the Split (a slice would be a launch
of its own for each such part, and no fewer launches than the one Split).

Such a Split of a matrix product's result along the axis a constant weight spans (its rows
N, or M when the weight is the left operand) is instead taken into the product: one product
per part, each on its rows of the weight (sliced when compiling), the result's views
repeated on each: ``(A·W)[..., a:b] = A·W[a:b]``, exactly, each element being the same sum
of the same products. A state-space layer's ``in_proj`` (``x`` for the convolution, the gate
``z``) and ``x_proj`` (``dt`` for ``dt_proj``, ``B``, ``C``) are cut so. The pieces read one
operand in common, so the products join as one product-group kernel (``matmul_group``): one
launch where the product and the Split were two. Elementwise work between the product and
the Split whose other operands are single values (a clamp's bounds: DBRX's clipped fused
QKV) is repeated on each piece, ``clip(A·W)[..., a:b] = clip(A·W[a:b])`` exactly (each
element from the same element and the same values), and runs in the piece's epilogue. The
views may cut the columns into trailing axes and move them (a ViT's fused QKV seen as ``[B,
S, 3, H, D]``, moved to ``[3, B, H, S, D]`` and split along its first axis): when the Split's
axis, followed back through the transposes, is the outermost of the axes the columns were
cut into, each part is a contiguous range of the weight's rows (``H·D`` per element of the
part), and the view and the transposes are repeated on each piece. A
weight that is a graph input (training)
keeps the Split: a slice of it would be a copy of its own. The cut is taken before the
slices when a part is normalised along the cut axis (FalconMamba's RMS norms of ``dt``,
``B`` and ``C``): as slices each part's reduction is a vector kernel of its own, while cut,
each runs in its product's epilogue and the products share one launch (each reads the
activation again: a few KB here, against three launches a layer).
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops
from graphkernel.ir import Graph, Node, Value
from graphkernel.opdefs.reduce import reduce_axes
from graphkernel.ops import RESHAPE_OPS, OpKind
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted

VECTOR_KINDS = (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.REDUCE)
SLICES = ("Slice", "StridedSlice")


def _vector_read(v: Value, outputs: set[int]) -> bool:
    """Whether every reader of ``v`` (through views) is vector work, and it has readers: not
    a graph output (a training forward keeps the parts for the backward graph; stored, each
    slice would be a launch of its own)."""
    if not v.users or id(v) in outputs:
        return False
    for u in v.users:
        if u.op in RESHAPE_OPS or u.op in SLICES:
            if not all(_vector_read(o, outputs) for o in u.outputs):
                return False
        elif u.op == "Concat":  # (a rotate-half's halves swapped)
            continue
        elif not ops.exists(u.op) or ops.get(u.op).kind not in VECTOR_KINDS or \
                u.op == "Gather" or u.graph is None:
            return False
    return True


def _parts(graph: Graph, n: Node) -> list[Value] | None:
    x = n.inputs[0]
    axis = n.attrs["axis"] % x.type.rank
    outputs = {id(v) for v in graph.outputs}
    if axis != x.type.rank - 1 or not x.dtype.is_float or \
            not all(_vector_read(o, outputs) for o in n.outputs):
        return None
    out, start = [], 0
    for size in n.attrs["sizes"]:
        out.append(add_like(graph, n, "StridedSlice", [x], {
            "begin": [start], "end": [start + size], "strides": [1], "axes": [axis]}))
        start += size
    return out


def _scalar_work(p: Node) -> int | None:
    """The operand index of the one full-size operand of elementwise op ``p`` whose other
    operands are single elements (a clamp's bounds: ``Maximum(x, -c)``), else None. Such work
    commutes with cutting ``x`` along any axis: each element of a part is computed from the
    same element of ``x`` and the same scalars."""
    if not ops.exists(p.op) or ops.get(p.op).kind is not OpKind.ELEMWISE or \
            len(p.outputs) != 1 or not p.inputs:
        return None
    out = p.outputs[0].type
    full = [i for i, u in enumerate(p.inputs) if tuple(u.type.shape) == tuple(out.shape)
            and u.dtype == out.dtype]
    if len(full) != 1:
        return None
    rest = [u for i, u in enumerate(p.inputs) if i != full[0]]
    if not all(const_array(u) is not None and const_array(u).size == 1 for u in rest):
        return None
    return full[0]


def _weight_cut(n: Node) -> tuple[Node, list[tuple[Node, int, int]], int, int, int] | None:
    """(the product, the views between it and Split ``n`` -- each with the axis of its result
    the parts cut and the extent of that axis per element of a part --, which of its operands
    is the constant weight, the weight's axis the parts cut, the weight's rows per element of
    a part) when ``n`` splits a product's result along the rows or columns of a constant
    weight and nothing else reads the product; else None. The views may reshape the cut
    columns into trailing axes and cut the outermost of them (a fused QKV projection
    ``[B·S, 3·H·D]`` seen as ``[B, S, 3, H, D]``, cut into its three parts of ``H·D``
    columns each) and move axes (that projection's parts moved before the batch, its heads
    before the positions). A batched constant weight (``[B, N, K]``, a channels-first
    product's weight repeated per batch element) is cut along the same matrix axis of each
    of its matrices."""
    x = n.inputs[0]
    axis = n.attrs["axis"] % x.type.rank
    views: list[tuple[Node, int, int]] = []
    v, ax, unit = x, axis, 1
    if len(x.users) != 1:
        return None  # (the whole is read beside the Split: it stays)
    while v.producer is not None and (v.producer.op in ("Reshape", "Transpose") or
                                      _scalar_work(v.producer) is not None):
        p = v.producer
        if p.op == "Transpose":
            views.insert(0, (p, ax, unit))
            ax = p.attrs["perm"][ax]
            v = p.inputs[0]
            if len(v.users) != 1:
                return None
            continue
        if p.op != "Reshape":  # elementwise work on scalars: on each part as on the whole
            views.insert(0, (p, ax, unit))
            v = p.inputs[_scalar_work(p)]
            if len(v.users) != 1:
                return None
            continue
        src, out = p.inputs[0], list(v.shape)
        if not src.shape or len(src.users) != 1 or \
                not all(isinstance(d, int) for d in (*out, src.shape[-1])):
            return None
        # the trailing axes of the view that are the source's last axis
        first, inner = len(out), 1
        while first > 0 and inner < src.shape[-1]:
            first -= 1
            inner *= out[first]
        if inner != src.shape[-1] or ax < first or any(out[k] != 1 for k in range(first, ax)):
            return None  # a view keeping the last axis whole, the parts cut along it
        views.insert(0, (p, ax, unit))
        unit *= int(np.prod(out[ax + 1:], dtype=np.int64))
        ax, v = src.type.rank - 1, src
    mm = v.producer
    if mm is None or mm.op not in ("MatMul", "BatchMatMul") or len(v.users) != 1 or \
            set(mm.attrs) - {"transpose_a", "transpose_b"}:
        return None
    r = v.type.rank
    if ax == r - 1:  # columns N: rows of a [N, K] weight, or columns of a [K, N] one
        which, w_axis = 1, 0 if mm.attrs.get("transpose_b") else 1
    elif ax == r - 2:  # rows M: rows of an [M, K] weight, or columns of a [K, M] one
        which, w_axis = 0, 1 if mm.attrs.get("transpose_a") else 0
    else:
        return None
    w = const_array(mm.inputs[which])
    if w is None or w.ndim < 2 or mm.inputs[1 - which] is mm.inputs[which]:
        return None
    # (a batched weight: its matrix axes last)
    return mm, views, which, w_axis + w.ndim - 2, unit


def _reduced_along_last(v: Value, seen: set[int] | None = None) -> bool:
    """Whether vector work reading ``v`` (through views that keep its last axis, and
    elementwise ops) reduces its last axis: a normalisation of the part, which a kernel of its
    own computes over the part's width."""
    seen = set() if seen is None else seen
    if id(v) in seen or not v.type.rank:
        return False
    seen.add(id(v))
    last = v.shape[-1]
    for u in v.users:
        if not ops.exists(u.op):
            continue
        kind = ops.get(u.op).kind
        if kind is OpKind.REDUCE and u.op.startswith("Reduce"):
            if v.type.rank - 1 in reduce_axes(v.type.rank, u.attrs.get("axis")):
                return True
        elif (u.op in RESHAPE_OPS and u.outputs[0].type.rank
              and u.outputs[0].shape[-1] == last) or kind is OpKind.ELEMWISE:
            if any(_reduced_along_last(o, seen) for o in u.outputs
                   if o.type.rank and o.shape[-1] == last):
                return True
    return False


def _normalised_parts(n: Node) -> bool:
    """Whether a part of Split ``n`` is normalised along the cut axis (FalconMamba's ``dt``,
    ``B`` and ``C`` RMS norms of ``x_proj``'s columns): read in place as slices, each part's
    reduction is a vector kernel of its own beside the product; cut into products, each
    reduction runs in its product's epilogue and the products share one launch."""
    return any(_reduced_along_last(o) for o in n.outputs)


def _cut(graph: Graph, n: Node) -> list[Value] | None:
    """Split ``n`` of a constant-weight product's result -> one product per part on its rows
    of the weight (the views between repeated on each), or None."""
    found = _weight_cut(n)
    if found is None:
        return None
    mm, views, which, w_axis, unit = found
    wv = mm.inputs[which]
    w = const_array(wv)
    out, start = [], 0
    for size in n.attrs["sizes"]:
        piece = np.ascontiguousarray(np.take(w, range(start * unit, (start + size) * unit),
                                             axis=w_axis))
        c = graph.add_node("Constant", [], {"value": piece},
                           name=graph.fresh_name(f"{wv.name}_rows"),
                           origin=wv.producer.origin).outputs[0]
        ins = [mm.inputs[0], c] if which == 1 else [c, mm.inputs[1]]
        cur = add_like(graph, mm, mm.op, ins, dict(mm.attrs))
        for p, ax, per in views:
            if p.op == "Transpose":  # the part moved as the whole
                cur = add_like(graph, p, "Transpose", [cur], dict(p.attrs))
                continue
            if p.op != "Reshape":  # x op scalars, the part in the whole's place
                at = _scalar_work(p)
                cur = add_like(graph, p, p.op, [cur if i == at else u
                                                for i, u in enumerate(p.inputs)],
                               dict(p.attrs))
                continue
            shape = list(p.outputs[0].shape)
            shape[ax] = size * per
            cur = add_like(graph, p, "Reshape", [cur], {**p.attrs, "shape": shape})
        out.append(cur)
        start += size
    return out


def split_slices(graph, ctx) -> PassResult:
    """Rewrite Split(x, last axis) → StridedSlice per part when only vector work reads it;
    a Split of a constant weight's product → one product per part on its rows of the weight
    (before the slices when a part is normalised along the cut axis)."""
    notes = []
    for n in list(graph.nodes):
        if n.graph is None or n.op != "Split" or not ctx.should_apply(
                f"{n.name} as slices", [n]):
            continue
        with graph.recording() as made:
            parts = None if _normalised_parts(n) and _weight_cut(n) is not None else \
                _parts(graph, n)
        cut = False
        if parts is None:
            for m in reversed(made):
                graph.erase_node(m)
            if _weight_cut(n) is None or not ctx.should_apply(
                    f"{n.name} as products on the weight's rows", [n]):
                continue
            with graph.recording() as made:
                parts = _cut(graph, n)
            if parts is None:
                for m in reversed(made):
                    graph.erase_node(m)
                continue
            cut = True
        dead = _weight_cut(n) if cut else None
        for old, new in zip(n.outputs, parts, strict=True):
            graph.replace_all_uses(old, new)
        graph.erase_node(n)
        if dead is not None:  # the whole product and its views, now read by nothing
            mm, views, _, _, _ = dead
            for m in reversed([mm, *(p for p, _, _ in views)]):
                graph.erase_node(m)
            notes.append(f"{n.name}: {len(parts)} parts, each a product on its rows of "
                         f"{mm.name}'s weight")
            continue
        notes.append(f"{n.name}: {len(parts)} parts read in place as slices of the last axis")
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'Split')} read as slices or cut into products")
