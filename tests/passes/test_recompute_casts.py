"""recompute: a cheap producer recomputed inside the kernel that reads it must be one a kernel
computes. Position ids counted in floats and cast to int64 (an ONNX export of RoBERTa's
embeddings) index a row lookup: the Cast stays outside the lookup's kernel, which would
otherwise be split op by op (the code generator stores integers as int32 only)."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import Interpreter


def _embeddings() -> Graph:
    g = Graph("positions")
    mask = g.add_input("mask", TensorType((2, 16), "float32"))
    table = g.const(np.random.default_rng(0).standard_normal((40, 32)).astype(np.float32))
    pos = g.add_node("Add", [g.add_node("Mul", [mask, g.const(np.float32(3.0))]).output,
                             g.const(np.float32(1.0))]).output
    idx = g.add_node("Cast", [pos], {"dtype": "int64"}).output
    rows = g.add_node("Gather", [table, idx], {"axis": 0}).output
    mean = g.add_node("ReduceMean", [rows], {"axis": [-1], "keep_dims": True}).output
    g.set_outputs([g.add_node("Sub", [rows, mean]).output])
    return g


def test_an_int64_index_cast_is_not_recomputed_into_the_lookup_kernel():
    g = _embeddings()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    # (a 0/1 mask: the ids 1 and 4 are rows of the table)
    feeds = {"mask": np.random.default_rng(1).integers(0, 2, (2, 16)).astype(np.float32)}
    np.testing.assert_allclose(Interpreter(res.graph).run(feeds)[0],
                               Interpreter(g).run(feeds)[0], rtol=1e-6, atol=1e-6)
