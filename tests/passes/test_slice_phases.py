"""slice_phases: a Concat of strided slices taking every phase of their axes once (a windowed
vision model's patch merging) becomes one Transpose between views; refused when a phase is
missing or repeated, the order is no transpose's, the Concat runs along a sliced axis, or a
slice takes another value."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import run_sim
from graphkernel.interpreter import Interpreter
from graphkernel.torch import launch_counts
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

END = 2**63 - 1
SWIN = [(0, 0), (1, 0), (0, 1), (1, 1)]  # (row, column) phases in patch merging's order


def _merge(phases=SWIN, shape=(2, 8, 8, 32), axis=3, strides=(2, 2)) -> Graph:
    g = Graph("merge")
    x = g.add_input("x", TensorType(shape, "float32"))
    parts = [g.add_node("StridedSlice", [x], {"begin": list(p), "end": [END, END],
                                              "strides": list(strides), "axes": [1, 2]},
                        name=f"s{i}").output for i, p in enumerate(phases)]
    g.set_outputs([g.add_node("Concat", parts, {"axis": axis}, name="cat").output])
    return g


@pytest.mark.parametrize("phases", [SWIN, [(0, 0), (0, 1), (1, 0), (1, 1)]],
                         ids=["columns-slowest", "rows-slowest"])
def test_every_phase_concatenated_is_one_transpose(phases):
    g = _merge(phases)
    out, res = apply_pass("slice_phases", g)
    assert res.modified and ops_of(out) == ["Reshape", "Transpose", "Reshape"]
    assert_same_results(g, out)


def test_three_axes_and_a_leading_concat_axis():
    g = Graph("cube")
    x = g.add_input("x", TensorType((4, 4, 6, 4), "float32"))
    phases = [(a, b, c) for a in range(2) for b in range(3) for c in range(2)]
    parts = [g.add_node("StridedSlice", [x], {"begin": list(p), "end": [END] * 3,
                                              "strides": [2, 3, 2], "axes": [1, 2, 3]}).output
             for p in phases]
    g.set_outputs([g.add_node("Concat", parts, {"axis": 0}).output])
    out, res = apply_pass("slice_phases", g)
    assert res.modified and "Concat" not in ops_of(out)
    assert_same_results(g, out)


def _two_sources() -> Graph:
    g = _merge()
    y = g.add_input("y", TensorType((2, 8, 8, 32), "float32"))
    cat = g.outputs[0].producer
    last = cat.inputs[3].producer
    other = g.add_node("StridedSlice", [y], dict(last.attrs)).output
    g.set_outputs([g.add_node("Concat", [*cat.inputs[:3], other], {"axis": 3}).output])
    g.erase_node(cat)
    return g


@pytest.mark.parametrize("graph", [
    _merge(SWIN[:3]),                                    # a phase missing
    _merge([(0, 0), (1, 0), (1, 0), (1, 1)]),            # a phase twice
    _merge([(1, 0), (0, 0), (0, 1), (1, 1)]),            # no transpose's order
    _merge(axis=2),                                      # along a sliced axis
    _merge(strides=(2, 4)),                              # columns' phases not all taken
    _two_sources(),                                      # phases of two values
], ids=["missing", "repeated", "order", "sliced-axis", "stride", "two-sources"])
def test_what_is_no_transpose_is_left(graph):
    out, res = apply_pass("slice_phases", graph)
    assert not res.modified and ops_of(out) == ops_of(graph)


def test_patch_merging_then_layer_norm_launches_and_runs_in_the_simulator():
    """Four slices and their Concat were five launches before the norm; now the Transpose
    they become, gathered in UB by the norm's own kernel: one launch, its result matching in
    the simulator."""
    g = _merge()
    w = g.add_input("w", TensorType((128,), "float32"))
    norm = g.add_node("LayerNorm", [g.outputs[0], w, w], {"epsilon": 1e-5}).outputs[0]
    g.set_outputs([norm])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert sum(launch_counts(res.graph).values()) == 1
    assert not [n for n in res.graph.nodes if n.op in ("StridedSlice", "Concat")]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 8, 8, 32)).astype(np.float32),
             "w": rng.standard_normal(128).astype(np.float32)}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=2e-5, atol=2e-5)
