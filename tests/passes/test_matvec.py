"""matvec: products with one row or one column and a short contraction become Mul + ReduceSum
on the vector unit; other products stay on the cube."""

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, ops_of


def assert_close(before: Graph, after: Graph, tol: float) -> None:
    """The same results up to summation order (products near 0 need an absolute bound)."""
    for seed in (0, 1):
        feeds = random_inputs(before, seed)
        for a, b in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
            np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=tol,
                                       atol=tol)


def _product(op, a_shape, b_shape, dtype="float32", **attrs) -> Graph:
    g = Graph()
    a = g.add_input("a", TensorType(a_shape, dtype))
    b = g.add_input("b", TensorType(b_shape, dtype))
    g.set_outputs([g.add_node(op, [a, b], attrs).output])
    return g


@pytest.mark.parametrize("op,a,b,attrs", [
    ("BatchMatMul", (32, 8, 16), (32, 16, 1), {}),            # a readout h @ C per token
    ("BatchMatMul", (2, 3, 8, 16), (3, 1, 16), {"transpose_b": True}),  # batch broadcast
    ("BatchMatMul", (4, 16, 1), (4, 16, 8), {"transpose_a": True}),     # one row
    ("MatMul", (5, 64), (64, 1), {}),                          # a gate of one output
    ("MatMul", (1, 64), (64, 5), {}),
])
def test_width_one_products_become_a_product_and_a_sum(op, a, b, attrs):
    g = _product(op, a, b, **attrs)
    h, res = apply_pass("matvec", g)
    assert res.rewrites == 1 and "MatMul" not in ops_of(h) and "BatchMatMul" not in ops_of(h)
    assert {"Mul", "ReduceSum"} <= set(ops_of(h))
    assert_close(g, h, 1e-5)


def test_low_precision_operands_are_summed_in_float32():
    g = _product("MatMul", (6, 32), (32, 1), "float16")
    h, _ = apply_pass("matvec", g)
    red = next(n for n in h.nodes if n.op == "ReduceSum")
    assert red.inputs[0].dtype.value == "float32"
    assert h.outputs[0].dtype.value == "float16"
    assert_close(g, h, 2e-2)


@pytest.mark.parametrize("a,b", [((8, 16), (16, 4)), ((4, 2048), (2048, 1))])
def test_wide_products_and_long_contractions_stay_on_the_cube(a, b):
    h, res = apply_pass("matvec", _product("MatMul", a, b))
    assert res.rewrites == 0 and ops_of(h) == ["MatMul"]
