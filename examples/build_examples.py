"""Build the bundled example graphs with the Python API and save them as JSON.

    python examples/build_examples.py

Each example is a block transformer and MLP models are made of, written in basic
ops: an MLP block with bias + GeLU (erf form), a residual Add + LayerNorm, an
attention-score softmax with a scale and an additive mask, and a whole attention
(head split, scores, causal mask, softmax, ·V, head merge).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from graphkernel import Graph, TensorType
from graphkernel.frontends.json_format import save_graph

HERE = Path(__file__).parent
RNG = np.random.default_rng(0)


def mlp_gelu() -> Graph:
    """y = GeLU(x @ W + b), GeLU(h) = 0.5 * h * (1 + erf(h / sqrt(2)))."""
    g = Graph("mlp_gelu")
    x = g.add_input("x", TensorType(("batch", 64), "float32"))
    w = g.const((RNG.standard_normal((64, 256)) / 8).astype(np.float32), name="fc_weight")
    b = g.const((RNG.standard_normal(256) / 8).astype(np.float32), name="fc_bias")
    h = g.add_node("MatMul", [x, w], name="fc").output
    h = g.add_node("Add", [h, b], name="bias_add").output
    t = g.add_node("Mul", [h, g.const(np.float32(1 / math.sqrt(2)))], name="gelu_scale").output
    t = g.add_node("Erf", [t], name="gelu_erf").output
    t = g.add_node("Add", [t, g.const(np.float32(1.0))], name="gelu_add1").output
    t = g.add_node("Mul", [h, t], name="gelu_mul").output
    y = g.add_node("Mul", [t, g.const(np.float32(0.5))], name="gelu_half").output
    g.set_outputs([y])
    return g


def layernorm_residual() -> Graph:
    """y = LayerNorm(x + residual) over the last axis, with gamma and beta."""
    g = Graph("layernorm_residual")
    hidden = 128
    x = g.add_input("x", TensorType(("batch", 16, hidden), "float32"))
    r = g.add_input("residual", TensorType(("batch", 16, hidden), "float32"))
    gamma = g.const((1 + RNG.standard_normal(hidden) / 10).astype(np.float32), name="ln_gamma")
    beta = g.const((RNG.standard_normal(hidden) / 10).astype(np.float32), name="ln_beta")
    inv_n = g.const(np.float32(1 / hidden), name="inv_hidden")
    s = g.add_node("Add", [x, r], name="residual_add").output
    mean = g.add_node("ReduceSum", [s], {"axis": [-1], "keep_dims": True}, name="ln_sum").output
    mean = g.add_node("Mul", [mean, inv_n], name="ln_mean").output
    d = g.add_node("Sub", [s, mean], name="ln_center").output
    sq = g.add_node("Mul", [d, d], name="ln_square").output
    var = g.add_node("ReduceSum", [sq], {"axis": [-1], "keep_dims": True}, name="ln_sqsum").output
    var = g.add_node("Mul", [var, inv_n], name="ln_var").output
    eps = g.const(np.float32(1e-5), name="ln_eps")
    var = g.add_node("Add", [var, eps], name="ln_var_eps").output
    rstd = g.add_node("Rsqrt", [var], name="ln_rstd").output
    y = g.add_node("Mul", [d, rstd], name="ln_normalize").output
    y = g.add_node("Mul", [y, gamma], name="ln_scale").output
    y = g.add_node("Add", [y, beta], name="ln_shift").output
    g.set_outputs([y])
    return g


def attention_softmax() -> Graph:
    """p = softmax(q @ k^T * scale + mask) over the key axis, in float16."""
    g = Graph("attention_softmax")
    heads, seq, dim = 4, 32, 16
    q = g.add_input("q", TensorType(("batch", heads, seq, dim), "float16"))
    k = g.add_input("k", TensorType(("batch", heads, seq, dim), "float16"))
    mask = g.add_input("mask", TensorType(("batch", 1, 1, seq), "float16"))
    s = g.add_node("BatchMatMul", [q, k], {"transpose_b": True}, name="qk").output
    s = g.add_node("Mul", [s, g.const(np.float16(1 / math.sqrt(dim)), name="scale")],
                   name="qk_scale").output
    s = g.add_node("Add", [s, mask], name="mask_add").output
    m = g.add_node("ReduceMax", [s], {"axis": [-1], "keep_dims": True}, name="sm_max").output
    e = g.add_node("Sub", [s, m], name="sm_sub").output
    e = g.add_node("Exp", [e], name="sm_exp").output
    z = g.add_node("ReduceSum", [e], {"axis": [-1], "keep_dims": True}, name="sm_sum").output
    p = g.add_node("Div", [e, z], name="sm_div").output
    g.set_outputs([p])
    return g


def attention() -> Graph:
    """o = merge(softmax(split(q) @ split(k)^T * scale + causal) @ split(v)) in float16, q, k, v
    as [batch, seq, heads * dim]; the causal mask is where(masked, lowest, 0)."""
    g = Graph("attention")
    heads, seq, dim = 4, 32, 16
    lowest = np.finfo(np.float16).min
    split = []
    for name in ("q", "k", "v"):
        x = g.add_input(name, TensorType(("batch", seq, heads * dim), "float16"))
        x = g.add_node("Reshape", [x], {"shape": ["batch", seq, heads, dim]},
                       name=f"{name}_heads").output
        split.append(g.add_node("Transpose", [x], {"perm": [0, 2, 1, 3]},
                                name=f"{name}_split").output)
    masked = g.add_input("masked", TensorType((seq, seq), "bool"))
    s = g.add_node("BatchMatMul", split[:2], {"transpose_b": True}, name="qk").output
    s = g.add_node("Mul", [s, g.const(np.float16(1 / math.sqrt(dim)), name="scale")],
                   name="qk_scale").output
    bias = g.add_node("Select", [masked, g.const(lowest, "float16", name="lowest"),
                                 g.const(np.float16(0), name="zero")], name="causal").output
    s = g.add_node("Add", [s, bias], name="mask_add").output
    p = g.add_node("Softmax", [s], {"axis": -1}, name="probs").output
    o = g.add_node("BatchMatMul", [p, split[2]], name="pv").output
    o = g.add_node("Transpose", [o], {"perm": [0, 2, 1, 3]}, name="merge").output
    o = g.add_node("Reshape", [o], {"shape": ["batch", seq, heads * dim]}, name="out").output
    g.set_outputs([o])
    return g


if __name__ == "__main__":
    for build in (mlp_gelu, layernorm_residual, attention_softmax, attention):
        graph = build()
        graph.validate()
        for path in save_graph(graph, HERE / f"{graph.name}.json"):
            print("wrote", path.relative_to(HERE.parent))
