"""Rewrite a batched product whose operand is a tiled (broadcast) tensor → a product that reads
the tensor once per batch element, never materialised.

``x.repeat(B, 1, 1)`` or ``x.expand(B, H, r, c).reshape(B * H, r, c)`` before a ``bmm`` copies
one operand B times: a broadcast kernel writing B copies to global memory, which the product
then reads. A BatchMatMul broadcasts its batch axes as numpy does (the cube kernel reads a
broadcast operand with a batch stride of 0), so the copy is not needed: with the merged batch
axis P = s_1 · … · s_k taken apart again, ``bmm(A[P, m, k], reshape(broadcast(X, S)))`` is
``reshape(bmm(reshape(A, [s_1, …, s_k, m, k]), X'))`` where X' is X without the axes the
reshape drops. DeBERTa's relative attention multiplies every (batch, head) query by its
head's position keys this way. Runs after the attention pass, whose matching reads products.

Views between the broadcast and that last reshape are taken above the broadcast first, onto
the small tensor: a reshape that splits or merges only whole broadcast or whole kept axis
groups, and a transpose (a view when it moves only size-1 axes; a swap of the last two axes
is then read by the product transposed). Mamba2's B and C, repeated over the heads, cut into
chunks and transposed before each chunked product, are read so (one group of heads; with
several, a group's heads merged with the groups mix broadcast and kept axes and are left).
"""

from __future__ import annotations

import math

from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import add_like, rewrite_each
from graphkernel.registry import PassResult, counted


def _tiled(v: Value, fresh: bool = False) -> tuple[Value, list[int], list[int]] | None:
    """(X, X's shape without the size-1 axes of S, the batch factors) when ``v`` is
    reshape(broadcast(X, S), [P, r, c]) and the reshape only merges S's batch axes (size-1
    axes aside) into P. ``fresh``: ``v`` was just built for the product (no reader yet)."""
    rs = v.producer
    if rs is None or rs.op != "Reshape" or len(rs.outputs[0].uses) != (0 if fresh else 1):
        return None
    bt = rs.inputs[0].producer
    if bt is None or bt.op != "BroadcastTo":
        return None
    x, out, s = bt.inputs[0], v.type.shape, bt.outputs[0].shape
    if x.type.rank != len(s) or not all(isinstance(d, int) for d in (*s, *x.shape, *out)):
        return None
    keep = [i for i, d in enumerate(s) if d != 1]
    s_kept, x_kept = [s[i] for i in keep], [x.shape[i] for i in keep]
    if len(out) != 3 or len(s_kept) < 3 or s_kept[-2:] != list(out[-2:]) or \
            math.prod(s_kept[:-2]) != out[0] or x_kept[-2:] != s_kept[-2:]:
        return None
    return x, x_kept, s_kept[:-2]


VIEWS = ("Reshape", "ExpandDims", "Squeeze", "Transpose")


def _regroup(S: list[int], xs: list[int], T: list[int]) -> list[int] | None:
    """The shape of ``X`` (broadcast to ``S``) that broadcasts to ``reshape(·, T)``: each group
    of axes the reshape merges or splits is broadcast whole or not at all (size-1 axes
    aside); None when a group mixes both."""
    si = [i for i, d in enumerate(S) if d != 1]
    tj = [j for j, d in enumerate(T) if d != 1]
    out, i, j = [1] * len(T), 0, 0
    while i < len(si) or j < len(tj):
        gs, gt, ps, pt = [], [], 1, 1
        while True:
            if ps <= pt and i < len(si):
                gs.append(si[i])
                ps *= S[si[i]]
                i += 1
            elif j < len(tj):
                gt.append(tj[j])
                pt *= T[tj[j]]
                j += 1
            else:
                return None
            if ps == pt and gs and gt:
                break
        wide = [xs[a] == S[a] for a in gs]
        if all(wide):
            for b in gt:
                out[b] = T[b]
        elif any(wide):
            return None
    return out


def _sink(graph: Graph, n: Node, v: Value) -> Value | None:
    """``v`` rebuilt with its BroadcastTo below the views between them (reshapes of whole
    broadcast or whole kept axis groups, transposes): ``reshape(transpose(broadcast(X)))``
    → ``reshape(broadcast(transpose(X')))``, so that only a reshape merging batch axes
    stands between the broadcast and the product. Mamba2's ``repeat_interleave`` of B/C over
    heads, split into chunks and transposed before its products, is read this way. None when
    there is no such chain or nothing moves."""
    chain, x = [], v
    while x.producer is not None and x.producer.op in VIEWS:
        chain.append(x.producer)
        x = x.producer.inputs[0]
    b = x.producer
    if b is None or b.op != "BroadcastTo" or not chain:
        return None
    S, src = list(b.outputs[0].shape), b.inputs[0]
    if not all(isinstance(d, int) for d in (*S, *src.shape)) or src.type.rank > len(S):
        return None
    xs = [1] * (len(S) - src.type.rank) + list(src.shape)
    y = add_like(graph, n, "Reshape", [src], {"shape": xs}) if xs != list(src.shape) else src
    chain.reverse()
    moved = 0
    for m in chain:
        T = list(m.outputs[0].shape)
        if m.op == "Transpose":
            perm = m.attrs["perm"]
            moved_axes = [p for p in perm if xs[p] != 1]
            xs = [xs[p] for p in perm]
            if moved_axes == sorted(moved_axes):  # only size-1 axes move: a view
                y = add_like(graph, n, "Reshape", [y], {"shape": xs})
            else:
                y = add_like(graph, n, "Transpose", [y], {"perm": list(perm)})
        else:
            nxt = _regroup(S, xs, T)
            if nxt is None:
                break
            xs = nxt
            y = add_like(graph, n, "Reshape", [y], {"shape": xs})
        S = T
        moved += 1
    if not moved:
        return None
    y = add_like(graph, n, "BroadcastTo", [y], {"shape": S})
    for m in chain[moved:]:
        y = add_like(graph, n, m.op, [y], dict(m.attrs))
    return y


def _unswap(graph: Graph, n: Node, x: Value, shape: list[int]) -> Value | None:
    """``x`` read as ``shape`` (``x`` without size-1 axes) when ``x`` is a transpose that
    swaps its operand's last two axes of size > 1 and moves only size-1 axes otherwise: the
    operand itself as ``shape`` with its last two axes swapped, for the product to read
    transposed. None otherwise."""
    t = x.producer
    if t is None or t.op != "Transpose" or len(x.uses) != 1 or len(shape) < 2:
        return None
    u, perm = t.inputs[0], t.attrs["perm"]
    kept = [i for i, d in enumerate(u.shape) if d != 1]
    order = [p for p in perm if u.shape[p] != 1]
    if len(kept) < 2 or order != [*kept[:-2], kept[-1], kept[-2]]:
        return None
    return add_like(graph, n, "Reshape", [u], {"shape": [*shape[:-2], shape[-1], shape[-2]]})


def _rewrite(graph: Graph, n: Node) -> Value | None:
    ins, fresh = list(n.inputs), [False, False]
    for side in (1, 0):
        if _tiled(ins[side]) is None:
            sunk = _sink(graph, n, ins[side])
            if sunk is not None and _tiled(sunk, fresh=True) is not None:
                ins[side], fresh[side] = sunk, True
    for side in (1, 0):
        found = _tiled(ins[side], fresh[side])
        other = ins[1 - side]
        if found is None or other.type.rank != 3 or \
                other.type.shape[0] != ins[side].type.shape[0]:
            continue
        x, x_shape, factors = found
        attrs = dict(n.attrs)
        flag = "transpose_b" if side == 1 else "transpose_a"
        xs = _unswap(graph, n, x, x_shape)
        if xs is not None:
            attrs[flag] = not attrs.get(flag, False)
        else:
            xs = add_like(graph, n, "Reshape", [x], {"shape": x_shape}) \
                if x_shape != list(x.shape) else x
        os = add_like(graph, n, "Reshape", [other], {"shape": [*factors, *other.shape[-2:]]})
        y = add_like(graph, n, "BatchMatMul", [os, xs] if side == 1 else [xs, os], attrs)
        return add_like(graph, n, "Reshape", [y], {"shape": list(n.outputs[0].shape)})
    return None


def product_broadcast(graph, ctx) -> PassResult:
    """Rewrite BatchMatMul(A, reshape(BroadcastTo(X))) → reshape(BatchMatMul(reshape(A), X))."""
    done = rewrite_each(graph, ctx, ("BatchMatMul",), "reads its tiled operand in place",
                        _rewrite)
    notes = [f"{name}: a tiled operand read in place (batch broadcast)" for name in done]
    if notes:
        graph.remove_dead()
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'product')} reading a tiled operand in place")
