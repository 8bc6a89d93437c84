"""Rewrite every-s-th-column slices of a product with constant weights → contiguous blocks.

An interleaved gate/up product (GPT-OSS's experts: ``gate, up = h[..., ::2], h[..., 1::2]``)
is read through slices with a step: a kernel loads each part element by element, and the
strided loads pull the whole rows once per part. When the product's right operand is a
constant whose columns are the product's last axis (frozen weights: a MatMul without
``transpose_b``, a GroupedMatMul's [E, K, N] experts), and so is everything added to the
product on the way (a constant, or a constant table's rows gathered by index: the experts'
biases by expert id), the columns can be reordered in the constants instead: residue class
k of step s goes to the block [k*N/s, (k+1)*N/s). Every output column is the same dot
product (and the same sums, products) as before, only in another place; each part is then a
contiguous block of every row, read in place as a half is (``silu(gate) * up`` of one
product). Only where the slices are the value's only readers, together take every column
once, and every value on the way is read by the next op alone.

Parts of each head are the same reordering with blocks instead of single columns. A
projection viewed as heads (``[..., G, C]``: its last axis N cut into G heads of C columns)
and cut along C into parts (a gated delta rule's ``b`` and ``a`` of each key head, an
attention's query and gate, a fused ``q, k, v, z``) is read through slices of the view: a part
of every head is G runs of a few columns, one per head, which no row split of a vector
kernel reads with a broadcast over the heads (a per-head bias), and such kernels ran op by
op. With the constant weight's columns (a Linear's rows, ``transpose_b``) ordered part by
part, head by head within a part, each part is one contiguous block of every row,
``G * width`` columns from ``G * begin``, seen as ``[..., G, width]`` by a reshape: the same
elements in the same order. Only where the reshape is the product's only reader, its last
two axes are static and span exactly N, its readers are step-1 slices of the last axis that
take every column once, two at least, and some part is read with its heads merged into one
row (a reshape to rows of whole ``G * width`` columns: the gates, the gate, ``cat(q, k, v)``).
Parts all read head by head (``[.., G, width]`` kept: a fused QKV's heads moved for attention,
a rotary's halves of each head) are read in place as they are, and are left so.
"""

from __future__ import annotations

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import add_like
from graphkernel.registry import PassResult, counted

PRODUCTS = ("MatMul", "GroupedMatMul")
ADDS = ("Add", "Sub", "Mul")  # elementwise: every operand's columns move alike


def _const(v: Value) -> np.ndarray | None:
    p = v.producer
    return None if p is None or p.op != "Constant" else np.asarray(p.attrs["value"])


def _parts(v: Value) -> tuple[int, list[Node]] | None:
    """(s, the slices) when ``v``'s only readers are StridedSlices of its static last axis
    with one step s > 1, each taking the whole residue class of its start, every class
    once."""
    rank, n = v.type.rank, v.shape[-1] if v.type.rank else None
    users = list(dict.fromkeys(v.users))
    if not users or not isinstance(n, int) or len(users) != len(v.users):
        return None
    step, starts = None, []
    for u in users:
        a = u.attrs if u.op == "StridedSlice" else None
        if a is None or u.inputs[0] is not v or len(a["begin"]) != 1 or \
                (a["axes"] if a["axes"] is not None else [0])[0] % rank != rank - 1:
            return None
        b, e, s = slice(a["begin"][0], a["end"][0], (a["strides"] or [1])[0]).indices(n)
        if s <= 1 or (step is not None and s != step) or n % s or \
                len(range(b, e, s)) != n // s:
            return None
        step = s
        starts.append(b)
    if sorted(starts) != list(range(step)):
        return None
    return step, users


def _head_parts(graph: Graph, v: Value) -> tuple[int, int, list[Node]] | None:
    """(G, C, the slices) when ``v``'s only reader is a reshape cutting its static last axis
    N into its last two axes ``[G, C]`` (heads, each C columns wide), read only by
    StridedSlices of that last axis C with step 1 that together take every column of it
    once, two parts at least; else None."""
    users = list(dict.fromkeys(v.users))
    n = v.shape[-1] if v.type.rank else None
    if len(users) != 1 or len(v.users) != 1 or users[0].op != "Reshape" or \
            not isinstance(n, int):
        return None
    r = users[0].outputs[0]
    shape = r.shape
    # the reshape's last two axes span exactly N: element j of a row is then (j // C, j % C)
    # of them, whatever the reshape does to the axes before (a batch axis split off)
    if graph.is_output(r) or len(shape) < 2 or \
            len(users[0].attrs.get("shape") or ()) != len(shape) or \
            not all(isinstance(d, int) for d in shape[-2:]) or shape[-2] * shape[-1] != n or \
            shape[-2] < 2:
        return None
    G, C = shape[-2], shape[-1]
    slices = list(dict.fromkeys(r.users))
    if len(slices) < 2 or len(slices) != len(r.users):
        return None
    spans = []
    for u in slices:
        a = u.attrs if u.op == "StridedSlice" else None
        if a is None or u.inputs[0] is not r or len(a["begin"]) != 1 or \
                (a["axes"] if a["axes"] is not None else [0])[0] % len(shape) != len(shape) - 1:
            return None
        b, e, st = slice(a["begin"][0], a["end"][0], (a["strides"] or [1])[0]).indices(C)
        if st != 1 or e <= b:
            return None
        spans.append((b, e))
    ends = 0
    for b, e in sorted(spans):  # the parts tile [0, C): each column once
        if b != ends:
            return None
        ends = e
    # some part read with its heads merged into one row (a reshape to rows of whole G * c
    # columns): across heads it is runs of c columns, which a row split with a per-head
    # broadcast cannot read; parts read head by head ([.., G, c] kept: a rotary's halves of
    # each head) are read in place as they are, and are left so
    merged = any(w.op == "Reshape" and isinstance(w.outputs[0].shape[-1], int) and
                 w.outputs[0].shape[-1] % (G * (e - b)) == 0
                 for u, (b, e) in zip(slices, spans, strict=True) for w in u.outputs[0].users)
    return (G, C, slices) if ends == C and merged else None


def _edges(v: Value, n: int) -> list[tuple[Node, int, int]] | None:
    """The (node, input slot, axis) of every constant (or gathered constant table) to reorder so
    that ``v``'s columns move, or None when ``v`` is not such a product, perhaps plus such
    values."""
    p = v.producer
    if p is None:
        return None
    if p.op in PRODUCTS:
        w = p.inputs[1]
        c = _const(w)
        # the product's columns are the weight's last axis, or its rows when it is read
        # transposed (a Linear's [N, K] weight: ``transpose_b``)
        axis = -2 if p.op == "MatMul" and p.attrs.get("transpose_b") else -1
        if c is None or c.ndim < 2 or c.shape[axis] != n or len(w.users) != 1 or \
                (axis == -1 and p.attrs.get("transpose_b")):
            return None
        return [(p, 1, axis)]
    if p.op not in ADDS or len(p.outputs) != 1:
        return None
    out: list[tuple[Node, int, int]] = []
    for slot, x in enumerate(p.inputs):
        c = _const(x)
        if c is not None:
            if c.ndim and c.shape[-1] == n:
                if len(x.users) != 1:
                    return None
                out.append((p, slot, -1))
            elif c.ndim and c.shape[-1] != 1:
                return None
            continue
        if x.type.rank and x.shape[-1] == 1 and n != 1:
            continue  # one value per row: the same for every column
        if len(x.users) != 1 or not x.type.rank or x.shape[-1] != n:
            return None
        g = x.producer
        if g is not None and g.op == "Gather" and g.attrs.get("axis", 0) == 0 and \
                (t := _const(g.inputs[0])) is not None and t.ndim == 2 and t.shape[1] == n \
                and len(g.inputs[0].users) == 1:
            out.append((g, 0, -1))  # a table's rows gathered by index: its columns move
            continue
        got = _edges(x, n)
        if got is None:
            return None
        out += got
    return out if out else None


def _reorder(graph: Graph, node: Node, slot: int, axis: int, perm: np.ndarray) -> None:
    x = node.inputs[slot]
    c = np.take(_const(x), perm, axis=axis)
    graph.replace_input(node, slot, graph.const(c, name=graph.fresh_name(f"{x.name}/blocks"),
                                                origin=x.producer.origin))


def interleaved_columns(graph, ctx) -> PassResult:
    """Rewrite every-s-th-column slices, or slices of each head's columns, of a product whose
    weights (and what is added to it) are constants → contiguous column blocks, the
    constants' columns reordered."""
    notes = []
    for v in [o for n in graph.nodes if n.op in PRODUCTS + ADDS for o in n.outputs]:
        if v.graph is None or graph.is_output(v) or (m := _parts(v)) is None:
            continue
        step, slices = m
        n = v.shape[-1]
        edges = _edges(v, n)
        if edges is None or not ctx.should_apply(f"{v.name}: columns in blocks", slices):
            continue
        perm = np.concatenate([np.arange(k, n, step) for k in range(step)])
        for node, slot, axis in edges:
            _reorder(graph, node, slot, axis, perm)
        width = n // step
        for u in slices:
            k = u.attrs["begin"][0] % n
            graph.replace_all_uses(u.outputs[0], add_like(graph, u, "StridedSlice", [v], {
                "begin": [k * width], "end": [(k + 1) * width], "strides": [1],
                "axes": [v.type.rank - 1]}))
        notes.append(f"{v.name}: {step} interleaved parts of {n} columns as contiguous blocks "
                     f"({len(edges)} constant(s) reordered)")
    for v in [o for n in graph.nodes if n.op in PRODUCTS + ADDS for o in n.outputs]:
        if v.graph is None or graph.is_output(v) or (m := _head_parts(graph, v)) is None:
            continue
        heads, width, slices = m
        n = v.shape[-1]
        edges = _edges(v, n)
        if edges is None or not ctx.should_apply(f"{v.name}: head parts in blocks", slices):
            continue
        spans = {id(u): slice(u.attrs["begin"][0], u.attrs["end"][0]).indices(width)[:2]
                 for u in slices}
        order = sorted(slices, key=lambda u: spans[id(u)][0])
        # part by part, each head's columns of the part: part k's block is then contiguous
        perm = np.concatenate([np.arange(h * width + b, h * width + e)
                               for u in order for b, e in [spans[id(u)]]
                               for h in range(heads)])
        for node, slot, axis in edges:
            _reorder(graph, node, slot, axis, perm)
        for u in slices:
            b, e = spans[id(u)]
            part = add_like(graph, u, "StridedSlice", [v], {
                "begin": [heads * b], "end": [heads * e], "strides": [1],
                "axes": [v.type.rank - 1]})
            shape = list(u.inputs[0].producer.attrs["shape"])
            graph.replace_all_uses(u.outputs[0], add_like(
                graph, u, "Reshape", [part], {"shape": shape[:-1] + [e - b]}))
        notes.append(f"{v.name}: {len(slices)} parts of each of {heads} heads of {width} "
                     f"columns as contiguous blocks ({len(edges)} constant(s) reordered)")
    if notes:
        graph.remove_dead()
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'interleaved product')} read in blocks")
