"""split_slices: a Split of the last axis read only by vector work becomes one slice per
part (read in place by the kernels); a part read by a product keeps the Split."""

import numpy as np

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, ops_of


def _split(axis=2, product=False) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType((2, 6, 12), "float32"))
    a, b = g.add_node("Split", [x], {"axis": axis, "sizes": [4, 8] if axis == 2 else [2, 4]}
                      ).outputs
    ea = g.add_node("Exp", [g.add_node("Reshape", [a], {"shape": [12, -1]}).output]).output
    if product:
        w = g.const(np.ones((b.shape[-1], 3), np.float32))
        eb = g.add_node("MatMul", [g.add_node("Reshape", [b], {"shape": [-1, b.shape[-1]]})
                                   .output, w]).output
    else:
        eb = g.add_node("ReduceSum", [b], {"axis": [2]}).output
    g.set_outputs([ea, eb])
    return g


def _same(before: Graph, after: Graph) -> None:
    feeds = random_inputs(before, 0)
    for want, got in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_split_read_by_vector_work_becomes_slices():
    g = _split()
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 1 and "Split" not in ops_of(h)
    assert ops_of(h).count("StridedSlice") == 2
    _same(g, h)


def test_a_split_read_by_a_product_or_of_another_axis_is_kept():
    for g in (_split(product=True), _split(axis=1)):
        h, res = apply_pass("split_slices", g)
        assert res.rewrites == 0 and "Split" in ops_of(h)
        _same(g, h)


def test_a_split_whose_part_is_a_graph_output_is_kept():
    """A training forward returns the parts for the backward graph: stored, each slice
    would be a launch of its own, more than the one Split."""
    g = _split()
    a = next(n for n in g.nodes if n.op == "Split").outputs[0]
    g.set_outputs([*g.outputs, a])
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 0 and "Split" in ops_of(h)
