"""Counts computed in float32 and stored as int64 (``small_ints``: a one-hot scatter's
``.long().sum(0)``): the kernel converts them toward zero on storing (the vector unit's
float -> int64 Cast), as torch's ``.long()`` does; the simulator checks that Cast pair and
its mode, and the real headers type-check it."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import realcheck
from graphkernel.codegen.backend import render_all, run_sim, schedules
from graphkernel.interpreter import run_graph
from graphkernel.torch import launch_counts
from tests.codegen.test_realcheck import headers, needs_headers


def summed_then_long() -> Graph:
    """``x.sum(0).long()`` (floats with fractions, of both signs: truncated toward 0)."""
    g = Graph()
    x = g.add_input("x", TensorType((24, 40), "float32"))
    s = g.add_node("ReduceSum", [x], {"axis": [0], "keep_dims": False}).output
    g.set_outputs([g.add_node("Cast", [s], {"dtype": "int64"}).output])
    return g


def expert_counts() -> Graph:
    """JetMoE's ``zeros(N, E).scatter(1, topk_ids, 1).long().sum(0)`` and the ids."""
    g = Graph()
    logits = g.add_input("logits", TensorType((16, 8), "float32"))
    _, ids = g.add_node("TopK", [logits], {"k": 2, "axis": 1}).outputs
    zeros = g.const(np.zeros((16, 8), np.float32))
    ones = g.add_node("BroadcastTo", [g.const(np.float32(1))], {"shape": [16, 2]}).output
    gates = g.add_node("ScatterElements", [zeros, ids, ones], {"axis": 1}).output
    wide = g.add_node("Cast", [gates], {"dtype": "int64"}).output
    g.set_outputs([g.add_node("ReduceSum", [wide], {"axis": [0], "keep_dims": False}).output,
                   ids])
    return g


def test_a_float_sum_is_stored_as_int64_truncated():
    g = summed_then_long()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 1, launch_counts(res.graph)
    feeds = {"x": np.random.default_rng(0).uniform(-3, 3, (24, 40)).astype(np.float32)}
    (got,), _ = run_sim(res, feeds)
    (want,) = run_graph(g, feeds)
    assert np.asarray(got).dtype == np.int64 and np.any(want < 0)
    # the float sums may differ in their last bit (summation order): compare the truncations
    # of the interpreter's sums where those are not within a rounding of an integer
    s = feeds["x"].sum(0, dtype=np.float32)
    clear = np.abs(s - np.round(s)) > 1e-3
    np.testing.assert_array_equal(np.asarray(got)[clear], want[clear])


def test_expert_counts_are_the_scatter_and_one_kernel():
    """The int64 cast and sum of the scatter ran alone (no int64 in the vector unit): 4
    launches (TopK, scatter, cast, sum) -> 3, the counts exact in the simulator."""
    g = expert_counts()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 3, launch_counts(res.graph)
    feeds = {"logits": np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    for o, w in zip(got, run_graph(g, feeds), strict=True):
        np.testing.assert_array_equal(np.asarray(o), w)


@needs_headers
def test_an_int64_store_compiles_against_the_real_headers():
    rendered = render_all(schedules(graphkernel.compile(summed_then_long(), "--opt_level=2",
                                                        env={})))
    assert len(rendered) == 1 and "CAST_TRUNC" in "".join(rendered[0].files.values())
    results = realcheck.check_rendered(rendered, headers())
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
