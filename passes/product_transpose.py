"""Fold a transpose of the last two axes into a matrix product: of its result, by computing
the transposed product, and of an operand whose leading axes were merged into rows, by a
batched product reading the operand with its transpose flag.

A transpose that moves the last axis is a kernel of its own (the vector code generator transposes
in UB only a small value, its kernel then one tile on one core), while the cube unit reads either
operand transposed for free (the Matmul API's ``isTransA``/``isTransB``). The frontend already
folds ``x.transpose(-1, -2)`` feeding a product; two forms stay, both common around a state-space
block's projections:

- the product's result moved: ``(x @ W.T).view(B, L, C).transpose(1, 2)`` (a projection to
  channels-first for a convolution or a scan). With ``(A·B)ᵀ = Bᵀ·Aᵀ`` it is
  ``BatchMatMul(W, x.view(B, L, K), transpose_b=True)``, the weight read for every batch
  element (batch stride 0);
- an operand moved and merged: ``x.transpose(1, 2).reshape(B * L, C) @ W.T`` (channels-first
  data projected). Per batch element it is ``x[b]ᵀ·Wᵀ``: ``BatchMatMul(x, W,
  transpose_a=True)`` viewed back as ``[B * L, N]``.

Both are exact (each output element is the same dot product over the same K).
"""

from __future__ import annotations

import math

from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import swaps_last_two
from graphkernel.passes.rewrite import add_like
from graphkernel.registry import PassResult, counted

PRODUCTS = ("MatMul", "BatchMatMul")


def _static(*vs: Value) -> bool:
    return all(isinstance(d, int) for v in vs for d in v.shape)


def result_foldable(graph: Graph, v: Value, members: set[int]) -> bool:
    """Whether a transpose of the last two axes of ``v`` would fold into the product computing
    it (``_result_moved``) once the nodes ``members`` (its other readers, about to be
    rebuilt on the transposed value) are gone: ``v`` is a product's result, or a view of it
    splitting its rows into leading axes, read by nothing else."""
    def only(x: Value) -> bool:
        return not graph.is_output(x) and all(id(u) in members for u, _ in x.uses)

    rs = None
    if v.producer is not None and v.producer.op == "Reshape":
        if not only(v):
            return False
        rs, v = v.producer, v.producer.inputs[0]
        if len(v.uses) != 1 or graph.is_output(v):
            return False
    elif not only(v):
        return False
    p = v.producer
    if p is None or p.op not in PRODUCTS or not _static(*p.inputs, v):
        return False
    if rs is None:
        return True
    out = list(rs.outputs[0].shape)
    return p.op == "MatMul" and not p.attrs.get("transpose_a") and len(out) >= 3 and \
        isinstance(out[-1], int) and out[-1] == v.shape[-1] and \
        math.prod(out[:-1]) == v.shape[0]


def fold_result(graph: Graph, t: Node) -> Value | None:
    """The transposed product standing for Transpose ``t`` of a product's result (or of its
    rows' view), or None; ``t`` is left for the caller to replace."""
    if not swaps_last_two(t):
        return None
    with graph.recording() as made:
        y = _result_moved(graph, t)
    if y is None:
        for m in reversed(made):
            graph.erase_node(m)
    return y


def _result_moved(graph: Graph, t: Node) -> Value | None:
    """T(P) or T(reshape(P)) for a product P read only there → the transposed product."""
    v = t.inputs[0]
    rs = None
    if v.producer is not None and v.producer.op == "Reshape" and len(v.uses) == 1 and \
            not graph.is_output(v):
        rs, v = v.producer, v.producer.inputs[0]
    p = v.producer
    if p is None or p.op not in PRODUCTS or len(v.uses) != 1 or graph.is_output(v):
        return None
    a, b = p.inputs
    ta, tb = bool(p.attrs.get("transpose_a")), bool(p.attrs.get("transpose_b"))
    if not _static(a, b, t.outputs[0]):
        return None
    if rs is None:  # (A·B)ᵀ = Bᵀ·Aᵀ, batch axes broadcast alike either way round
        return add_like(graph, t, p.op, [b, a], {"transpose_a": not tb, "transpose_b": not ta})
    # reshape(P) splits P's rows into leading axes: [M, N] -> [*bs, m, N]
    out = list(rs.outputs[0].shape)
    if p.op != "MatMul" or ta or len(out) < 3 or out[-1] != v.shape[-1] or \
            math.prod(out[:-1]) != v.shape[0]:
        return None
    a3 = add_like(graph, t, "Reshape", [a], {"shape": [*out[:-1], a.shape[1]]})
    return add_like(graph, t, "BatchMatMul", [b, a3], {"transpose_a": not tb,
                                                        "transpose_b": True})


def _operand_moved(graph: Graph, p: Node) -> Value | None:
    """MatMul(reshape(T(x)), W) with the reshape merging T's leading axes into rows →
    reshape(BatchMatMul(x, W, transpose_a=True))."""
    if p.op != "MatMul" or p.attrs.get("transpose_a"):
        return None
    a, b = p.inputs
    rs = a.producer
    if rs is None or rs.op != "Reshape":
        return None
    t = rs.inputs[0].producer
    if t is None or t.op != "Transpose" or not swaps_last_two(t) or \
            len(a.uses) != 1 or len(t.outputs[0].uses) != 1 or graph.is_output(a) or \
            graph.is_output(t.outputs[0]):
        return None  # (read elsewhere, the transpose would stay: nothing saved)
    x, moved = t.inputs[0], t.outputs[0]
    if not _static(x, a, b) or moved.type.rank < 3 or list(a.shape) != [
            math.prod(moved.shape[:-1]), moved.shape[-1]]:
        return None
    y = add_like(graph, p, "BatchMatMul", [x, b], {"transpose_a": True,
                                                   "transpose_b": bool(p.attrs.get(
                                                       "transpose_b"))})
    return add_like(graph, p, "Reshape", [y], {"shape": list(p.outputs[0].shape)})


def product_transpose(graph, ctx) -> PassResult:
    """Rewrite T(A·B) → Bᵀ·Aᵀ and reshape(T(x))·W → reshape(xᵀ·W) for a transpose of the
    last two axes (the cube reads operands transposed; the vector unit cannot move them)."""
    notes = []
    for n in list(graph.nodes):
        if n.graph is None or n.op not in ("Transpose", "MatMul"):
            continue
        result = n.op == "Transpose"
        if result and not swaps_last_two(n):
            continue
        with graph.recording() as made:
            y = _result_moved(graph, n) if result else _operand_moved(graph, n)
        what = "as the transposed product" if result else "reads its operand transposed"
        if y is None or not ctx.should_apply(f"{n.name} {what}", [n]):
            for m in reversed(made):  # (a declined rewrite leaves nothing behind)
                graph.erase_node(m)
            continue
        graph.replace_all_uses(n.outputs[0], y)
        graph.erase_node(n)
        notes.append(f"{n.name}: {what} ({counted(len(made), 'node')} made)")
    if notes:
        graph.remove_dead()
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'transpose')} folded into products")
