"""Rewrite a product whose K operand holds a constant-zero block along K: drop the block and
the other operand's matching K range.

A chunked state-space scan carries its states across chunks with a product over the chunks,
``new_states = decay · cat(zeros, states)``: the Concat puts a zero chunk (no state before
the first chunk) in front of the chunk states along the product's K axis, a launch and a
round trip of the states of its own. Along K a zero block adds nothing to any sum:
``A · [0; S] = A[:, k0:] · S`` (and ``[0, S] · B = S · B[k0:, :]`` for the left operand), so
the product reads the other operand sliced along K (a first-element offset: the product's
own addressing) and the Concat goes (or keeps only its other pieces). Exact: the same
products, with the zero terms left out of each sum (``0 · x`` is ``0`` for finite ``x``;
an infinite or NaN ``x`` against a zero would have made a NaN, left out now; float
summation order aside).

The Concat may reach the product through views (Reshape, ExpandDims, Squeeze, Transpose)
that keep its axis whole (the axis is followed through each: the same element prefix and
extent through a reshape, its place through a transpose); they are made again on the
smaller value. Taken when the Concat and the views are read by the product alone, the zero
pieces are constants of zeros and the other pieces are one contiguous range of K; a Concat
read by anything else, symbolic shapes, or zero pieces between the others are left as they
are (logged).
"""

from __future__ import annotations

import math

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import OpKind, get
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted

PRODUCTS = ("MatMul", "BatchMatMul")
VIEWS = ("Reshape", "ExpandDims", "Squeeze", "Transpose")


def _static(v: Value) -> bool:
    return all(isinstance(d, int) for d in v.shape)


def _follow(axis: int, n: Node) -> int | None:
    """Where axis ``axis`` of view ``n``'s input is in its output, kept whole; or None."""
    x, y = n.inputs[0], n.outputs[0]
    if n.op == "Transpose":
        return list(n.attrs["perm"]).index(axis)
    before, extent = math.prod(x.shape[:axis]), x.shape[axis]
    for b, d in enumerate(y.shape):
        if d == extent and math.prod(y.shape[:b]) == before:
            return b
    return None


def _k_axis(mm: Node, i: int, rank: int) -> int:
    """Operand ``i``'s K axis (non-negative)."""
    last = bool(mm.attrs.get("transpose_b")) if i == 1 else not mm.attrs.get("transpose_a")
    return rank - 1 if last else rank - 2


def _zero(v: Value) -> bool:
    c = const_array(v)
    return c is not None and c.size > 0 and not np.any(np.asarray(c))


def _find(graph: Graph, mm: Node, i: int) -> tuple[Node, list[Node], list[int]] | str | None:
    """(the Concat, the views from it to the product, the Concat's axis after each view)
    when operand ``i`` of ``mm`` is a Concat with a zero piece along K through views; a
    reason when there is one that cannot be taken; None when there is none."""
    v, chain = mm.inputs[i], []
    while v.producer is not None and v.producer.op in VIEWS:
        chain.insert(0, v.producer)
        v = v.producer.inputs[0]
    cat = v.producer
    if cat is None or cat.op != "Concat" or not any(_zero(x) for x in cat.inputs):
        return None
    if not all(_static(n.outputs[0]) for n in [cat, *chain]):
        return f"{cat.name}: symbolic shapes"
    for n in [cat, *chain]:
        if len(n.outputs[0].users) != 1 or graph.is_output(n.outputs[0]):
            return f"{cat.name}: {n.outputs[0].name} is read by more than the product"
    axis = cat.attrs["axis"] % cat.outputs[0].type.rank
    axes = [axis]
    for n in chain:
        axis = _follow(axis, n)
        if axis is None:
            return f"{cat.name}: {n.op} {n.name} does not keep the concatenated axis whole"
        axes.append(axis)
    if axis != _k_axis(mm, i, mm.inputs[i].type.rank):
        return f"{cat.name}: concatenated along the product's M or N, not K"
    pieces = [not _zero(x) for x in cat.inputs]
    kept = [k for k, p in enumerate(pieces) if p]
    if not kept:
        return f"{cat.name}: every piece is zero"
    if kept != list(range(kept[0], kept[-1] + 1)):
        return f"{cat.name}: a zero piece between the others"
    return cat, chain, axes


def _rewrite(graph: Graph, mm: Node, i: int, cat: Node, chain: list[Node], axes: list[int]
             ) -> str:
    ax = axes[0]
    sizes = [x.shape[ax] for x in cat.inputs]
    kept = [k for k, x in enumerate(cat.inputs) if not _zero(x)]
    k0, k1 = sum(sizes[:kept[0]]), sum(sizes[:kept[-1] + 1])
    parts = [cat.inputs[k] for k in kept]
    v = parts[0] if len(parts) == 1 else add_like(graph, cat, "Concat", parts, dict(cat.attrs))
    for n, at in zip(chain, axes[1:]):
        attrs = dict(n.attrs)
        if n.op == "Reshape":
            shape = list(n.outputs[0].shape)
            shape[at] = k1 - k0
            attrs["shape"] = shape
        v = add_like(graph, n, n.op, [v], attrs)
    other = mm.inputs[1 - i]
    sliced, old, where = _sliced(graph, mm, other, _k_axis(mm, 1 - i, other.type.rank), k0,
                                 k1)
    ins = [sliced, v] if i == 1 else [v, sliced]
    y = add_like(graph, mm, mm.op, ins, dict(mm.attrs))
    graph.replace_all_uses(mm.outputs[0], y)
    for n in [mm, *reversed(chain), cat, *old]:
        graph.erase_node(n)
    return (f"{mm.name}: the zero block of {cat.name} along K left out (K {sum(sizes)} -> "
            f"{k1 - k0}), the other operand sliced from K = {k0}{where}")


def _step(n: Node, v: Value, axis: int) -> tuple[int, Value | None] | None:
    """The slice of ``v`` (``n``'s result) along ``axis`` moved above ``n``: (the axis in
    the value above, that value; None when ``n`` broadcasts along the axis: no slice at
    all); None when ``n`` does not commute with it. ``n`` commutes when it is a view keeping
    the axis whole, a Scan along another axis, a broadcast along it, or elementwise work
    whose one operand of the full extent along the axis (and ``n``'s shape) is not a
    constant (constants are sliced when compiling, broadcast operands read as they are)."""
    if len(n.outputs) != 1 or not _static(v):
        return None
    if n.op in VIEWS:
        x = n.inputs[0]
        if not _static(x):
            return None
        back = next((a for a in range(x.type.rank)
                     if x.shape[a] == v.shape[axis] and _follow(a, n) == axis), None)
        return None if back is None else (back, x)
    if n.op == "BroadcastTo":
        x = n.inputs[0]
        at = axis - (v.type.rank - x.type.rank)
        return (axis, None) if at < 0 or x.shape[at] == 1 else None
    if n.op == "Scan":
        ok = len(n.inputs) == 1 and n.attrs["axis"] % v.type.rank != axis
        return (axis, n.inputs[0]) if ok else None
    if get(n.op).kind != OpKind.ELEMWISE or get(n.op).writes:
        return None
    full = [x for x in n.inputs if (at := axis - (v.type.rank - x.type.rank)) >= 0
            and x.shape[at] != 1 and const_array(x) is None]
    if len(full) != 1 or tuple(full[0].shape) != tuple(v.shape):
        return None
    return axis, full[0]


def _sliced(graph: Graph, mm: Node, v: Value, axis: int, k0: int, k1: int
            ) -> tuple[Value, list[Node], str]:
    """``v[..., k0:k1, ...]`` along ``axis``, the slice moved up through the work computing
    ``v`` for the product alone that commutes with it (``_step``), so that the work runs on
    the kept part only; the nodes it replaces (product side first) and a note."""
    path: list[tuple[Node, int]] = []  # (node, the axis in its result)
    top: Value | None = v
    while top is not None and top.producer is not None and len(top.users) == 1 and \
            top.producer.op != "Constant" and not graph.is_output(top):
        n = top.producer
        got = _step(n, top, axis)
        if got is None:
            break
        path.append((n, axis))
        axis, top = got
    cur = None if top is None else add_like(
        graph, mm, "StridedSlice", [top], {"begin": [k0], "end": [k1], "strides": [1],
                                           "axes": [axis]})
    for n, at in reversed(path):
        y = n.outputs[0]
        shape = list(y.shape)
        shape[at] = k1 - k0
        if n.op == "BroadcastTo":
            cur = add_like(graph, n, "BroadcastTo", [n.inputs[0]], {"shape": shape})
            continue
        if n.op in VIEWS or n.op == "Scan":
            attrs = dict(n.attrs) | ({"shape": shape} if n.op == "Reshape" else {})
            cur = add_like(graph, n, n.op, [cur], attrs)
            continue
        ins = []
        for x in n.inputs:
            xa = at - (y.type.rank - x.type.rank)
            if xa < 0 or x.shape[xa] == 1:
                ins.append(x)
            elif const_array(x) is not None:
                c = np.take(np.asarray(const_array(x)), np.arange(k0, k1), axis=xa)
                ins.append(graph.add_node("Constant", [], {"value": c},
                                          name=graph.fresh_name(f"{x.name}_k"),
                                          origin=n.origin).outputs[0])
            else:
                ins.append(cur)
        cur = add_like(graph, n, n.op, ins, dict(n.attrs))
    moved = [n.op for n, _ in path if n.op not in VIEWS]
    where = "" if not moved else f", the slice moved up through {' '.join(moved)}" + (
        " (a broadcast: no slice)" if top is None else "")
    return cur, [n for n, _ in path], where


def product_zero_blocks(graph: Graph, ctx) -> PassResult:
    """Rewrite A · cat(0, S) along K → A[..., k0:] · S (either operand, through views): the
    constant-zero pieces dropped, the other operand sliced along K (the slice moved up
    through elementwise work, scans along other axes and broadcasts that compute it)."""
    notes = []
    for mm in [n for n in graph.nodes if n.op in PRODUCTS]:
        for i in (0, 1):
            found = _find(graph, mm, i)
            if found is None:
                continue
            if isinstance(found, str):
                ctx.log(f"product_zero_blocks: {mm.name} kept: {found}")
                continue
            if not ctx.should_apply(f"{mm.name} zero block of {found[0].name}", [mm]):
                continue
            notes.append(_rewrite(graph, mm, i, *found))
            break
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'product')} without a zero block along K")
