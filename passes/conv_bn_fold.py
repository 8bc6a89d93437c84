"""Fold a per-channel affine with constant factors into the convolution before it.

An inference batch norm after a convolution expands to ``conv(x, W, b) * alpha + beta`` with
``alpha = scale / sqrt(var + eps)`` and ``beta = bias - mean * alpha``; when the parameters
are frozen (the torch backend's default under ``no_grad``, every ONNX initializer) both are
constants once folded, and the pair is the convolution itself with weights ``W * alpha``
(per output channel) and bias ``b * alpha + beta``: one cube launch instead of a cube launch
and a vector pass over its output. Any ``Mul`` or ``Add`` of a constant that varies along the
output channels only (or not at all) folds the same way, one at a time.

This pass changes rounding: the product is formed on scaled weights instead of being scaled
after (both in the graph's precision; the factors are combined in float64 and rounded once),
a difference of an ulp or so per output, within the project's fp32 tolerance
(docs/accuracy.md). The convolution's output must have no other reader (its value would
change) and not be a graph output.
"""

from __future__ import annotations

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import const_array, replace_with
from graphkernel.registry import PassResult


def _channel_vector(c: np.ndarray, out: Value, axis: int) -> np.ndarray | None:
    """``c`` as an [M] vector over the convolution's output channels when, broadcast against
    the output, it varies along the channel axis only; else None."""
    rank, m = out.type.rank, out.shape[axis]
    if c.ndim > rank or not isinstance(m, int):
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, m):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (m,))


def _fold(g: Graph, n: Node) -> Value | None:
    """The new convolution's output standing in for ``n`` (a Mul or Add), or None."""
    for y, other in (n.inputs, n.inputs[::-1]):
        conv = y.producer
        if conv is None or conv.op != "Conv2D" or len(y.uses) != 1 or g.is_output(y):
            continue
        c = const_array(other)
        w = const_array(conv.inputs[1])
        b = const_array(conv.inputs[2]) if len(conv.inputs) == 3 else None
        if c is None or w is None or (len(conv.inputs) == 3 and b is None):
            continue
        if n.outputs[0].type != y.type or other.dtype != y.dtype:
            continue
        axis = 1 if conv.attrs["data_format"] == "NCHW" else 3
        vec = _channel_vector(np.asarray(c), y, axis)
        if vec is None:
            continue
        bias = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        w64 = w.astype(np.float64)
        if n.op == "Mul":
            w64, bias = w64 * vec.reshape(-1, 1, 1, 1), bias * vec
        else:
            bias = bias + vec
        if n.op == "Mul" and b is None:
            new_b = None
        else:
            new_b = bias.astype(w.dtype)
        ins = [conv.inputs[0], g.const(w64.astype(w.dtype), name=g.fresh_name(f"{conv.name}_w"))]
        if new_b is not None:
            ins.append(g.const(new_b, name=g.fresh_name(f"{conv.name}_b")))
        new = g.add_node("Conv2D", ins, dict(conv.attrs), name=g.fresh_name(conv.name),
                         origin=tuple(dict.fromkeys(conv.origin + n.origin)))
        return new.outputs[0]
    return None


def conv_bn_fold(graph, ctx) -> PassResult:
    """Rewrite conv(x, W, b) * alpha -> conv(x, W alpha, b alpha) and conv(x, W, b) + beta ->
    conv(x, W, b + beta) for constant per-output-channel alpha and beta (a frozen batch norm)."""
    if not any(n.op == "Conv2D" for n in graph.nodes):  # (no walk of a graph without one)
        return PassResult(False, 0)
    folded = 0
    changed = True
    while changed:
        changed = False
        for node in graph.nodes:
            if node.graph is None or node.op not in ("Mul", "Add"):
                continue
            conv = next((v.producer for v in node.inputs
                         if v.producer is not None and v.producer.op == "Conv2D"), None)
            mark = len(graph)
            new = _fold(graph, node)
            if new is None:
                continue
            if not ctx.should_apply(f"{node.name} ({node.op}) into {conv.name}", [node, conv]):
                for extra in reversed(graph.nodes[mark:]):
                    graph.erase_node(extra)
                continue
            replace_with(graph, node, new)
            if conv.graph is not None and not any(v.uses for v in conv.outputs):
                params = [v.producer for v in conv.inputs[1:]]
                graph.erase_node(conv)
                for p in params:  # (the pass runs after dce: the old weights go here)
                    if p.graph is not None and not any(v.uses or graph.is_output(v)
                                                       for v in p.outputs):
                        graph.erase_node(p)
            folded += 1
            changed = True
    return PassResult(folded > 0, folded)
