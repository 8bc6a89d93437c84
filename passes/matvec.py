"""Rewrite a matrix product with one row or one column → a product and a sum on the vector
unit, when the contraction is short.

``[.., M, K] @ [.., K, 1]`` is ``ReduceSum(A * Bᵀ, last axis)``: a row of K products per
output element. On the cube unit it is a product whose every base tile is 1/16 used, its own
launch, with the operands usually laid out for it by a transpose kernel (a state-space
model's readout ``h @ C`` per token, a gate of one output); on the vector unit it is an
elementwise product and a reduction that fuse with the work around them. ``M = 1`` is the
same along the other axis. Low-precision operands are widened to float32 first, as the
cube unit accumulates them. Runs after the attention pass, whose matching reads products.
"""

from __future__ import annotations

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


def _rewrite(graph: Graph, n: Node) -> Value | None:
    a, b = n.inputs
    if not a.dtype.is_float or a.type.rank < 2 or b.type.rank < 2:
        return None
    ta, tb = n.attrs.get("transpose_a", False), n.attrs.get("transpose_b", False)
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    n_ = b.shape[-2] if tb else b.shape[-1]
    if not isinstance(k, int) or k > MAX_K or (n_ != 1 and m != 1):
        return None
    out_t = n.outputs[0].dtype

    def add(op, ins, **attrs):
        return graph.add_node(op, ins, attrs, origin=n.origin,
                              name=graph.fresh_name(f"{n.name}/{op.lower()}")).outputs[0]

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
    if tuple(y.shape) != tuple(n.outputs[0].shape):  # (MatMul's operands broadcast alike)
        y = add("BroadcastTo", [y], shape=list(n.outputs[0].shape))
    return y


def matvec(graph, ctx) -> PassResult:
    """Rewrite MatMul/BatchMatMul with M = 1 or N = 1 and K <= MAX_K → Mul + ReduceSum."""
    done = rewrite_each(graph, ctx, ("MatMul", "BatchMatMul"), "on the vector unit", _rewrite)
    notes = [f"{name}: a product of width 1 as Mul + ReduceSum" for name in done]
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'product')} on the vector unit")
