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
"""

from __future__ import annotations

import math

from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import add_like, rewrite_each
from graphkernel.registry import PassResult, counted


def _tiled(v: Value) -> tuple[Value, list[int], list[int]] | None:
    """(X, X's shape without the size-1 axes of S, the batch factors) when ``v`` is
    reshape(broadcast(X, S), [P, r, c]) and the reshape only merges S's batch axes (size-1
    axes aside) into P."""
    rs = v.producer
    if rs is None or rs.op != "Reshape" or len(rs.outputs[0].uses) != 1:
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


def _rewrite(graph: Graph, n: Node) -> Value | None:
    for side in (1, 0):
        found = _tiled(n.inputs[side])
        other = n.inputs[1 - side]
        if found is None or other.type.rank != 3 or \
                other.type.shape[0] != n.inputs[side].type.shape[0]:
            continue
        x, x_shape, factors = found
        xs = add_like(graph, n, "Reshape", [x], {"shape": x_shape}) \
            if x_shape != list(x.shape) else x
        os = add_like(graph, n, "Reshape", [other], {"shape": [*factors, *other.shape[-2:]]})
        y = add_like(graph, n, "BatchMatMul", [os, xs] if side == 1 else [xs, os],
                     dict(n.attrs))
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
