"""The attention pass reads the operator's softmax statistics only for a sink's share of
each row (``attention_sinks``' epilogue), never for another reader of the softmax's row max
(the statistics are 0 on a row with no key left, where the graph has the mask's value)."""

from __future__ import annotations

import math

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import Interpreter, random_inputs

HEADS, SEQ, DIM = 4, 8, 16


def _graph(share: bool) -> Graph:
    """Q·Kᵀ / sqrt(D) + causal mask, its softmax written out (row max m, row sum z), · V;
    ``share``: m and z also read by ``z / (z + exp(sink - m))`` multiplying the output, else
    m read by an Add of its own (a second output)."""
    g = Graph("sinks")
    q, k, v = (g.add_input(n, TensorType((2, HEADS, SEQ, DIM), "float32")) for n in "qkv")
    s = g.add_node("BatchMatMul", [q, k], {"transpose_b": True}).output
    s = g.add_node("Div", [s, g.const(math.sqrt(DIM), "float32")]).output
    low = np.triu(np.full((SEQ, SEQ), -np.inf, np.float32), 1)
    s = g.add_node("Add", [s, g.const(low)]).output
    row = {"axis": [3], "keep_dims": True}
    m = g.add_node("ReduceMax", [s], row).output
    e = g.add_node("Exp", [g.add_node("Sub", [s, m]).output]).output
    z = g.add_node("ReduceSum", [e], row).output
    o = g.add_node("BatchMatMul", [g.add_node("Div", [e, z]).output, v]).output
    if share:
        sink = g.const(np.linspace(-1, 1, HEADS, dtype=np.float32).reshape(1, HEADS, 1, 1))
        t = g.add_node("Exp", [g.add_node("Sub", [sink, m]).output]).output
        w = g.add_node("Div", [z, g.add_node("Add", [z, t]).output]).output
        g.set_outputs([g.add_node("Mul", [o, w]).output])
    else:
        g.set_outputs([o, g.add_node("Add", [m, g.const(1.0, "float32")]).output])
    return g


def _run(share: bool):
    g = _graph(share)
    ins = random_inputs(g, seed=0)
    want = Interpreter(g).run(ins)
    res = graphkernel.compile(_graph(share), "--opt_level=2 --disable_pass=codegen", env={})
    res.graph.validate()
    got = Interpreter(res.graph).run(ins)
    fused = [n for n in res.graph.nodes if n.op == "FusedAttention"]
    return want, got, fused


def test_a_sinks_share_reads_the_statistics():
    want, got, fused = _run(share=True)
    assert len(fused) == 1 and fused[0].attrs["stats"], fused
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_another_reader_of_the_row_max_keeps_the_attention_as_written():
    want, got, fused = _run(share=False)
    assert not fused
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
