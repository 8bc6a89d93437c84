"""Rewrite a matrix product with one row or one column → a product and a sum on the vector
unit, when the contraction is short.

``[.., M, K] @ [.., K, 1]`` is ``ReduceSum(A * Bᵀ, last axis)``: a row of K products per
output element. On the cube unit it is a product whose every base tile is 1/16 used, its own
launch, with the operands usually laid out for it by a transpose kernel (a state-space
model's readout ``h @ C`` per token, a gate of one output); on the vector unit it is an
elementwise product and a reduction that fuse with the work around them. ``M = 1`` is the
same along the other axis. Low-precision operands are widened to float32 first, as the
cube unit accumulates them. A product whose wide operand is shared by batch elements (``[B,
1, K] @ [K, N]``) stays: it is B rows of one matrix product, and the elementwise product
would be ``[B, K, N]``, the weight written B times over. Runs after the attention pass,
whose matching reads products.

``torch.matmul`` of tensors of rank 4 or more is traced as a view merging the batch axes, a
``bmm`` and a view splitting them again. The product and sum are then made over the batch
axes of the operand as it was before the merge (the merge and split are views of the same
data), and a consumer that splits the result again reads it directly: a transpose around the
product (a scan's state moved to ``[B, L, D, N]`` for the readout by ``C`` and the result
moved back to ``[B, D, L]``) then sees its pair through elementwise work and a reduction
(``transpose_hoist``) instead of through a view that merges the axes it moves.
"""

from __future__ import annotations

import math

from graphkernel import symbolic
from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.passes.rewrite import rewrite_each
from graphkernel.registry import PassResult, counted

MAX_K = 1024  # a contraction at most this long (a row of a vector kernel)


def _view(graph: Graph, n: Node, v: Value, swap: bool) -> Value:
    if not swap:
        return v
    perm = list(range(v.type.rank))
    perm[-2:] = perm[-2:][::-1]
    return graph.add_node("Transpose", [v], {"perm": perm}, origin=n.origin,
                          name=graph.fresh_name(f"{n.name}/t")).outputs[0]


def _unmerged(n: Node, wide: Value, other: Value) -> Value | None:
    """The operand before a view merging its batch axes into one (``[*bs, R, C]`` viewed as
    ``[prod(bs), R, C]``), when ``n`` is a batched product of rank 3 whose other operand has
    the same batch extent (not broadcast), else None."""
    p = wide.producer
    if n.op != "BatchMatMul" or wide.type.rank != 3 or other.type.rank != 3 or \
            p is None or p.op != "Reshape":
        return None
    x = p.inputs[0]
    shape = list(x.shape)
    if x.type.rank < 4 or not all(isinstance(d, int) for d in (*shape, *wide.shape)) or \
            shape[-2:] != list(wide.shape[-2:]) or math.prod(shape[:-2]) != wide.shape[0] or \
            other.shape[0] != wide.shape[0]:
        return None
    return x


def _broadcast_over_batch(n: Node, wide: Value) -> bool:
    """Whether ``wide`` (the operand of N columns when M = 1, of M rows when N = 1) is shared
    by batch elements of the product ``n``: a projection's weight applied to ``[B, 1, K]``
    (one token per batch element, as an ONNX export leaves an attention pooling head's
    MLP). The product is then M = B rows of one matrix product, a cube launch; as Mul +
    ReduceSum it would write the weight B times over."""
    out = list(n.outputs[0].shape[:-2])
    own = list(wide.shape[:-2])
    own = [1] * (len(out) - len(own)) + own
    return any(symbolic.canon(x) != symbolic.canon(y) for x, y in zip(own, out, strict=True))


def _rewrite(graph: Graph, n: Node, views: list[Value]) -> Value | None:
    """The vector form of ``n`` (None: not rewritten). Made over unmerged batch axes, the
    operand's merging view and the result's merged view are appended to ``views``: either
    may be left with no reader."""
    a, b = n.inputs
    if not a.dtype.is_float or a.type.rank < 2 or b.type.rank < 2:
        return None
    ta, tb = n.attrs.get("transpose_a", False), n.attrs.get("transpose_b", False)
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    n_ = b.shape[-2] if tb else b.shape[-1]
    if not isinstance(k, int) or k > MAX_K or (n_ != 1 and m != 1):
        return None
    if _broadcast_over_batch(n, b if n_ != 1 else a):
        return None
    out_t = n.outputs[0].dtype

    def add(op, ins, **attrs):
        return graph.add_node(op, ins, attrs, origin=n.origin,
                              name=graph.fresh_name(f"{n.name}/{op.lower()}")).outputs[0]

    merged = None
    if n_ == 1 and not ta and _unmerged(n, a, b) is not None:  # [*bs, M, K] as it was made
        views.append(a)
        a = _unmerged(n, a, b)
        b = add("Reshape", [_view(graph, n, b, tb)], shape=[*a.shape[:-2], k, 1])
        merged, tb = list(n.outputs[0].shape), False
    elif m == 1 and n_ != 1 and not tb and _unmerged(n, b, a) is not None:
        views.append(b)
        b = _unmerged(n, b, a)
        a = add("Reshape", [_view(graph, n, a, ta)], shape=[*b.shape[:-2], 1, k])
        merged, ta = list(n.outputs[0].shape), False
    A, B = _view(graph, n, a, ta), _view(graph, n, b, tb)  # [.., M, K], [.., K, N]
    if out_t != DType.float32:
        A, B = add("Cast", [A], dtype=DType.float32), add("Cast", [B], dtype=DType.float32)
    if n_ == 1:  # [.., M, K] * [.., 1, K], summed over K
        row = add("Reshape", [B], shape=[*B.shape[:-2], 1, k])
        y = add("ReduceSum", [add("Mul", [A, row])], axis=[-1], keep_dims=True)
    else:  # [.., K, 1] * [.., K, N], summed over K
        col = add("Reshape", [A], shape=[*A.shape[:-2], k, 1])
        y = add("ReduceSum", [add("Mul", [col, B])], axis=[-2], keep_dims=True)
    if out_t != DType.float32:
        y = add("Cast", [y], dtype=out_t)
    if merged is not None:  # views of the result read y (one view, not two); the merged
        # form stays for any other reader
        for u in list(n.outputs[0].users):
            if u.op == "Reshape":
                graph.replace_input(u, 0, y)
        views.append(add("Reshape", [y], shape=merged))
        return views[-1]
    if tuple(y.shape) != tuple(n.outputs[0].shape):  # (MatMul's operands broadcast alike)
        y = add("BroadcastTo", [y], shape=list(n.outputs[0].shape))
    return y


def matvec(graph, ctx) -> PassResult:
    """Rewrite MatMul/BatchMatMul with M = 1 or N = 1 and K <= MAX_K → Mul + ReduceSum."""
    views: list[Value] = []
    done = rewrite_each(graph, ctx, ("MatMul", "BatchMatMul"), "on the vector unit",
                        lambda g, n: _rewrite(g, n, views))
    for v in reversed(views):  # (the merged views no reader is left with)
        if v.producer is not None and v.producer.graph is not None and not v.uses and \
                not graph.is_output(v):
            graph.erase_node(v.producer)
    notes = [f"{name}: a product of width 1 as Mul + ReduceSum" for name in done]
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'product')} on the vector unit")
