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
the small tensor: reshapes (split or merge whole broadcast or whole kept axis groups; else
the axes are followed as the reshapes cut them, a group's heads merged with the groups cut
back into the two) and transposes (a view when it moves only size-1 axes; a swap of the
last two axes is then read by the product transposed, another stays a transpose of the
small tensor). Mamba2's B and C, repeated over the heads of each group, cut into chunks and
transposed before each chunked product, are read so.
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


def _broadcast_views(v: Value) -> tuple[list[Node], list[int], Value, list[int]] | None:
    """The views between ``v`` and the static BroadcastTo under them (nearest first), the
    broadcast shape, its source and the source's shape padded to that rank; None when ``v``
    is not views of such a broadcast."""
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
    return chain, S, src, [1] * (len(S) - src.type.rank) + list(src.shape)


def _sink_groups(graph: Graph, n: Node, v: Value) -> Value | None:
    """``v`` rebuilt with its BroadcastTo below the views between them (reshapes of whole
    broadcast or whole kept axis groups, transposes): ``reshape(transpose(broadcast(X)))``
    → ``reshape(broadcast(transpose(X')))``, so that only a reshape merging batch axes
    stands between the broadcast and the product. Mamba2's ``repeat_interleave`` of B/C over
    heads, split into chunks and transposed before its products, is read this way (the
    views the broadcast cannot pass stay above it). None when there is no such chain or
    nothing moves."""
    found = _broadcast_views(v)
    if found is None:
        return None
    chain, S, src, xs = found
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


def _refine(S: list[int], xs: list[int], chain: list[Node]):
    """The views ``chain`` applied to ``broadcast(X, S)`` (``X`` of shape ``xs``), followed on
    *fine* axes: the axes of size > 1 of ``S``, cut where a reshape splits one, each kept
    or broadcast as a whole. Returns (fine sizes, broadcast flags, the fine axes in source
    order, in the views' final order), or None when a reshape cuts an axis unevenly."""
    sizes: list[int] = []
    bcast: list[bool] = []
    groups: list[list[int]] = []
    for d, x in zip(S, xs, strict=True):
        if d == 1:
            groups.append([])
            continue
        sizes.append(d)
        bcast.append(x == 1)
        groups.append([len(sizes) - 1])
    order = list(range(len(sizes)))
    for m in chain:
        if m.op == "Transpose":
            groups = [groups[p] for p in m.attrs["perm"]]
            continue
        T = list(m.outputs[0].shape)
        if not all(isinstance(t, int) for t in T):
            return None
        stream = [f for g in groups for f in g]
        new_groups, k = [], 0
        for t in T:
            grp, need = [], t
            while need > 1:
                if k >= len(stream):
                    return None
                f = stream[k]
                if sizes[f] <= need:
                    if need % sizes[f]:
                        return None
                    need //= sizes[f]
                else:  # the view cuts f: its outer part here, the inner part next
                    if sizes[f] % need:
                        return None
                    sizes.append(sizes[f] // need)
                    bcast.append(bcast[f])
                    sizes[f], inner = need, len(sizes) - 1
                    order.insert(order.index(f) + 1, inner)
                    stream.insert(k + 1, inner)
                    need = 1
                grp.append(f)
                k += 1
            new_groups.append(grp)
        if k != len(stream):
            return None
        groups = new_groups
    return sizes, bcast, order, [f for g in groups for f in g]


def _sink_fine(graph: Graph, n: Node, v: Value) -> Value | None:
    """``v`` rebuilt with its BroadcastTo below the views between them (reshapes and
    transposes, followed on the axes they cut: ``_refine``): ``reshape(transpose(reshape(
    broadcast(X))))`` → ``reshape(broadcast(transpose(X')))``, the transpose on the small
    tensor (a view when it moves only size-1 axes), so that only a reshape stands between
    the broadcast and the product. Mamba2's ``repeat_interleave`` of B/C over the heads of
    each group, cut into chunks and transposed before its products, is read this way. None
    when there is no such chain."""
    found = _broadcast_views(v)
    if found is None:
        return None
    chain, S, src, xs = found
    found = _refine(S, xs, chain[::-1])
    if found is None:
        return None
    sizes, bcast, order, final = found
    src_shape = [1 if bcast[f] else sizes[f] for f in order]
    y = add_like(graph, n, "Reshape", [src], {"shape": src_shape})
    perm = [order.index(f) for f in final]
    moved = [p for p in perm if src_shape[p] != 1]
    if moved != sorted(moved):
        y = add_like(graph, n, "Transpose", [y], {"perm": perm})
    else:  # only size-1 axes move: a view
        y = add_like(graph, n, "Reshape", [y], {"shape": [src_shape[p] for p in perm]})
    y = add_like(graph, n, "BroadcastTo", [y], {"shape": [sizes[f] for f in final]})
    return add_like(graph, n, "Reshape", [y], {"shape": list(v.shape)})


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


def _shared_weight(graph: Graph, n: Node) -> Value | None:
    """``bmm(A[b.., m, k], broadcast(W[k, n]))`` → ``reshape(reshape(A, [b·m, k]) @ W)``: one
    matrix broadcast over the batch (a module's weight expanded for a ``bmm``) is a plain
    product of the batch's rows, the copies never written."""
    a, w = n.inputs
    bt = w.producer
    if bt is None or bt.op != "BroadcastTo" or len(w.uses) != 1 or n.attrs.get("transpose_a"):
        return None
    x, out = bt.inputs[0], n.outputs[0].shape
    if not all(isinstance(d, int) for d in (*a.shape, *x.shape, *w.shape)) or a.type.rank < 3:
        return None
    if list(x.shape[-2:]) != list(w.shape[-2:]) or any(d != 1 for d in x.shape[:-2]) or \
            list(a.shape[:-2]) != list(out[:-2]):
        return None
    rows = math.prod(a.shape[:-1])
    flat = add_like(graph, n, "Reshape", [a], {"shape": [rows, a.shape[-1]]})
    w2 = add_like(graph, n, "Reshape", [x], {"shape": list(x.shape[-2:])}) \
        if x.type.rank != 2 else x
    y = add_like(graph, n, "MatMul", [flat, w2],
                 {"transpose_a": False, "transpose_b": bool(n.attrs.get("transpose_b"))})
    return add_like(graph, n, "Reshape", [y], {"shape": list(out)})


def _rewrite(graph: Graph, n: Node) -> Value | None:
    shared = _shared_weight(graph, n)
    if shared is not None:
        return shared
    ins, fresh = list(n.inputs), [False, False]
    for side in (1, 0):  # a broadcast under views: taken below them first (where the other
        # operand is one too, its transposes then move onto its small tensor as well)
        for sink in (_sink_groups, _sink_fine):  # whole axis groups first, else cut axes
            if fresh[side] or _tiled(ins[side]) is not None:
                break
            sunk = sink(graph, n, ins[side])
            if sunk is not None and _tiled(sunk, fresh=True) is not None:
                ins[side], fresh[side] = sunk, True
    for side in (1, 0):
        operand, other = ins[side], ins[1 - side]
        found = _tiled(operand, fresh[side])
        if found is None or other.type.rank != 3 or \
                other.type.shape[0] != operand.type.shape[0]:
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
