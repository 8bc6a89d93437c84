"""A transpose of the last two axes folded into a matrix product: of its result (the
transposed product) and of an operand merged into rows (a batched product reading it
transposed); refused where the transpose or the product is read elsewhere or the permutation
is another."""

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def _w(g, shape, seed=0):
    return g.const(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _projected_channels_first():
    """(x @ W.T).view(B, L, C).transpose(1, 2): a projection moved to channels-first."""
    g = Graph()
    x = g.add_input("x", TensorType((6, 8), "float32"))             # [B*L, K]
    mm = g.add_node("MatMul", [x, _w(g, (12, 8))], {"transpose_b": True}).output
    v = g.add_node("Reshape", [mm], {"shape": [2, 3, 12]}).output
    g.set_outputs([g.add_node("Transpose", [v], {"perm": [0, 2, 1]}).output])
    return g


def test_a_projection_moved_to_channels_first_is_the_transposed_product():
    g = _projected_channels_first()
    h, res = apply_pass("product_transpose", g)
    assert res.rewrites == 1 and "Transpose" not in ops_of(h)
    bmm = h.outputs[0].producer
    assert bmm.op == "BatchMatMul" and list(bmm.outputs[0].shape) == [2, 12, 3]
    assert (bmm.attrs["transpose_a"], bmm.attrs["transpose_b"]) == (False, True)
    assert bmm.inputs[0].producer.op == "Constant"  # the weight, read for every batch row
    assert_same_results(g, h, exact=False, rtol=1e-5)


def test_a_batched_product_moved_swaps_its_operands():
    g = Graph()
    a = g.add_input("a", TensorType((2, 4, 5), "float32"))
    b = g.add_input("b", TensorType((2, 3, 5), "float32"))
    p = g.add_node("BatchMatMul", [a, b], {"transpose_b": True}).output   # [2, 4, 3]
    g.set_outputs([g.add_node("Transpose", [p], {"perm": [0, 2, 1]}).output])
    h, res = apply_pass("product_transpose", g)
    bmm = h.outputs[0].producer
    assert res.rewrites == 1 and bmm.op == "BatchMatMul"
    assert [v.name for v in bmm.inputs] == ["b", "a"]
    assert (bmm.attrs["transpose_a"], bmm.attrs["transpose_b"]) == (False, True)
    assert_same_results(g, h, exact=False, rtol=1e-5)


def _channels_first_projected(extra_reader=False):
    """x.transpose(1, 2).reshape(B * L, C) @ W.T: channels-first data projected."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 8, 3), "float32"))          # [B, C, L]
    t = g.add_node("Transpose", [x], {"perm": [0, 2, 1]}).output
    rows = g.add_node("Reshape", [t], {"shape": [6, 8]}).output
    mm = g.add_node("MatMul", [rows, _w(g, (5, 8))], {"transpose_b": True}).output
    g.set_outputs([mm, t] if extra_reader else [mm])
    return g


def test_channels_first_data_projected_is_read_transposed():
    g = _channels_first_projected()
    h, res = apply_pass("product_transpose", g)
    assert res.rewrites == 1 and "Transpose" not in ops_of(h)
    view = h.outputs[0].producer
    bmm = view.inputs[0].producer
    assert view.op == "Reshape" and bmm.op == "BatchMatMul" and bmm.inputs[0].name == "x"
    assert (bmm.attrs["transpose_a"], bmm.attrs["transpose_b"]) == (True, True)
    assert_same_results(g, h, exact=False, rtol=1e-5)


def test_refused_when_the_transpose_or_the_product_is_read_elsewhere_or_moves_other_axes():
    h, res = apply_pass("product_transpose", _channels_first_projected(extra_reader=True))
    assert res.rewrites == 0
    g = _projected_channels_first()
    g.set_outputs([*g.outputs, g.value("matmul")])  # the product itself is an output too
    h, res = apply_pass("product_transpose", g)
    assert res.rewrites == 0
    g = Graph()
    a = g.add_input("a", TensorType((2, 4, 5), "float32"))
    p = g.add_node("BatchMatMul", [a, a], {"transpose_b": True}).output
    g.set_outputs([g.add_node("Transpose", [p], {"perm": [1, 0, 2]}).output])
    h, res = apply_pass("product_transpose", g)
    assert res.rewrites == 0 and ops_of(h) == ["BatchMatMul", "Transpose"]


@pytest.mark.sim
@pytest.mark.slow
def test_the_folded_products_run_as_cube_kernels_in_the_simulator():
    """Through the pipeline: no transpose launch left, the cube kernels (a weight broadcast
    over the batch, an operand read transposed) match the reference in the simulator."""
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.traffic import launches

    for g in (_projected_channels_first(), _channels_first_projected()):
        res = graphkernel.compile(g, "--opt_level=2", env={})
        assert [e["kind"] for e in launches(res.graph)] == ["cube"]
        feeds = random_inputs(g, 0)
        sim, _ = run_sim(res, feeds)
        np.testing.assert_allclose(sim[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-5)
