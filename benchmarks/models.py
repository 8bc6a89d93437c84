"""Synthetic transformer-like graphs for benchmarks (built with the graph API)."""

from __future__ import annotations

import numpy as np

from graphkernel import Graph, TensorType, Value

HIDDEN, HEADS, FFN = 64, 4, 256


def _layer(g: Graph, x: Value, i: int, rng: np.random.Generator) -> Value:
    def w(*shape):
        return g.const((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    def node(op, ins, name, **attrs):
        return g.add_node(op, ins, attrs, name=f"l{i}.{name}").outputs[0]

    ones, zeros = g.const(np.ones(HIDDEN, np.float32)), g.const(np.zeros(HIDDEN, np.float32))
    h = node("LayerNorm", [x, ones, zeros], "ln1")
    flat = node("Reshape", [h], "flat", shape=[-1, HIDDEN])
    qkv = node("Add", [node("MatMul", [flat, w(HIDDEN, 3 * HIDDEN)], "qkv"), w(3 * HIDDEN)],
               "qkv_bias")
    q, k, v = g.add_node("Split", [qkv], {"axis": 1, "sizes": [HIDDEN] * 3},
                         name=f"l{i}.split").outputs
    heads = []
    for name, t in (("q", q), ("k", k), ("v", v)):
        t = node("Reshape", [t], f"{name}_r", shape=["b", 16, HEADS, HIDDEN // HEADS])
        heads.append(node("Transpose", [t], f"{name}_t", perm=[0, 2, 1, 3]))
    s = node("BatchMatMul", [heads[0], heads[1]], "scores", transpose_b=True)
    s = node("Mul", [s, g.const(np.float32(0.25))], "scale")
    p = node("Softmax", [s], "softmax", axis=-1)
    o = node("BatchMatMul", [p, heads[2]], "ctx")
    o = node("Reshape", [node("Transpose", [o], "ctx_t", perm=[0, 2, 1, 3])], "ctx_r",
             shape=[-1, HIDDEN])
    o = node("Add", [node("MatMul", [o, w(HIDDEN, HIDDEN)], "proj"), w(HIDDEN)], "proj_bias")
    x = node("Add", [x, node("Reshape", [o], "proj_r", shape=["b", 16, HIDDEN])], "res1")
    h = node("LayerNorm", [x, ones, zeros], "ln2")
    h = node("Reshape", [h], "ffn_flat", shape=[-1, HIDDEN])
    h = node("Add", [node("MatMul", [h, w(HIDDEN, FFN)], "fc1"), w(FFN)], "fc1_bias")
    h = node("GeLU", [h], "gelu", approximate="tanh")
    h = node("Add", [node("MatMul", [h, w(FFN, HIDDEN)], "fc2"), w(HIDDEN)], "fc2_bias")
    return node("Add", [x, node("Reshape", [h], "ffn_r", shape=["b", 16, HIDDEN])], "res2")


def transformer(layers: int, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph(f"transformer_{layers}")
    x = g.add_input("x", TensorType(("b", 16, HIDDEN), "float32"))
    for i in range(layers):
        x = _layer(g, x, i, rng)
    g.set_outputs([x])
    return g


def transformer_of_size(nodes: int) -> Graph:
    """A transformer with about ``nodes`` nodes (as built, before expansion)."""
    per_layer = len(transformer(1)) - 1  # the input x is not a node
    return transformer(max(1, round(nodes / per_layer)))
