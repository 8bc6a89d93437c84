"""Compact work (values of one element per row or fewer) that a kernel's loop space cannot
place, such as columns sliced out of a gate's outputs and combined before they scale every
row of a bias (WavLM's gated relative position bias): the kernel is split where the compact
work is spread over the loop space, the compact work one kernel of its own loop space,
rather than taken apart op by op."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import run_sim
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def _gated_bias(rows: int = 39) -> Graph:
    """gate = sigmoid(z) cut into its two columns a, b; a * (b * c - 1) + 2 scales each row
    of the bias (one value per row)."""
    g = Graph("gated_bias")
    z = g.add_input("z", TensorType((2, 4, rows, 2), "float32"))
    bias = g.add_input("bias", TensorType((8, rows, rows), "float32"))
    gate = g.add_node("Sigmoid", [z]).output
    a = g.add_node("StridedSlice", [gate], {"begin": [0], "end": [1], "strides": [1],
                                             "axes": [3]}).output
    b = g.add_node("StridedSlice", [gate], {"begin": [1], "end": [2], "strides": [1],
                                             "axes": [3]}).output
    c = g.const(np.float32(1.5))
    t = g.add_node("Sub", [g.add_node("Mul", [b, c]).output, g.const(np.float32(1.0))]).output
    out = g.add_node("Add", [g.add_node("Mul", [a, t]).output, g.const(np.float32(2.0))]).output
    rowwise = g.add_node("Reshape", [out], {"shape": [8, rows, 1]}).output
    g.set_outputs([g.add_node("Mul", [rowwise, bias]).output])
    return g


def test_compact_work_is_split_off_whole_where_it_spreads_over_the_loop_space():
    g = _gated_bias()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    fallbacks = res.report.extra.get("fallbacks") or []
    assert len(fallbacks) == 1 and "spreads it over the loop space" in fallbacks[0]["reason"]
    launches = [n for n in res.graph.nodes if n.op != "Constant"]
    # the gate; its columns' combination one kernel; the scaled bias a launch of its own
    assert [n.op for n in launches] == ["GraphKernel", "GraphKernel", "Mul"], launches
    inside = [m.op for m in launches[1].subgraph.nodes if m.op not in ("Constant", "Reshape")]
    assert sorted(inside) == ["Add", "Mul", "Mul", "StridedSlice", "StridedSlice", "Sub"]
    rng = np.random.default_rng(0)
    feeds = {"z": rng.standard_normal((2, 4, 39, 2)).astype(np.float32),
             "bias": rng.standard_normal((8, 39, 39)).astype(np.float32)}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    (want,) = Interpreter(g).run(feeds)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
