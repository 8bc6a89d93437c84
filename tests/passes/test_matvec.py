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


def test_one_row_per_batch_element_of_one_shared_weight_stays_one_product():
    """[B, 1, K] @ [K, N] (an ONNX export's projection of one token per batch element) is
    B rows of one product: as Mul + ReduceSum it would write [B, K, N], the weight B times
    over. Per-batch matrices [B, K, N] (nothing shared) still take the vector form."""
    h, res = apply_pass("matvec", _product("BatchMatMul", (2, 1, 64), (64, 128)))
    assert res.rewrites == 0 and ops_of(h) == ["BatchMatMul"]
    h, res = apply_pass("matvec", _product("BatchMatMul", (2, 1, 64), (1, 64, 128)))
    assert res.rewrites == 0
    g = _product("BatchMatMul", (2, 1, 64), (2, 64, 128))
    h, res = apply_pass("matvec", g)
    assert res.rewrites == 1 and {"Mul", "ReduceSum"} <= set(ops_of(h))
    assert_close(g, h, 1e-5)


def _batch_folded(x_shape, c_batch: int, col: bool = True) -> Graph:
    """``torch.matmul`` of rank-4 tensors as traced: a view merging the batch axes, ``bmm``
    and a view splitting them again: ``x [*bs, M, K] @ c [cb, K, 1]`` (or ``c [cb, 1, M] @
    x [*bs, M, K]`` when ``col`` is False) with ``cb`` the merged batch or 1."""
    g = Graph()
    x = g.add_input("x", TensorType(x_shape, "float32"))
    flat = int(np.prod(x_shape[:-2]))
    m, k = x_shape[-2:]
    c = g.add_input("c", TensorType((c_batch, k if col else m), "float32"))
    xm = g.add_node("Reshape", [x], {"shape": [flat, m, k]}).output
    if col:
        cm = g.add_node("Reshape", [c], {"shape": [c_batch, k, 1]}).output
        p = g.add_node("BatchMatMul", [xm, cm]).output
        out = [*x_shape[:-1]]
    else:
        cm = g.add_node("Reshape", [c], {"shape": [c_batch, 1, m]}).output
        p = g.add_node("BatchMatMul", [cm, xm]).output
        out = [*x_shape[:-2], k]
    g.set_outputs([g.add_node("Reshape", [p], {"shape": out}).output])
    return g


@pytest.mark.parametrize("col", [True, False])
def test_a_batch_folded_product_is_summed_over_the_unmerged_axes(col):
    """The product reads the operand as it was before the view merging its batch axes, and
    the view splitting them again reads the sum directly: no merged shape is left."""
    g = _batch_folded((2, 3, 8, 16), 6, col)
    h, res = apply_pass("matvec", g)
    assert res.rewrites == 1
    mul = next(n for n in h.nodes if n.op == "Mul")
    assert any(v.name == "x" for v in mul.inputs)
    red = next(n for n in h.nodes if n.op == "ReduceSum")
    assert red.outputs[0].type.rank == 4
    assert h.outputs[0].producer.inputs[0] is red.outputs[0]
    assert not any(6 in v.shape for n in h.nodes for v in n.outputs if n.op != "Reshape"
                   or n.inputs[0].name != "c")
    assert_close(g, h, 1e-5)


def test_a_broadcast_batch_keeps_the_merged_product():
    """The other operand broadcast over the merged batch (extent 1): the product is made on
    the merged view, as before."""
    g = _batch_folded((2, 3, 8, 16), 1)
    h, res = apply_pass("matvec", g)
    assert res.rewrites == 1
    mul = next(n for n in h.nodes if n.op == "Mul")
    assert not any(v.name == "x" for v in mul.inputs)
    assert_close(g, h, 1e-5)
