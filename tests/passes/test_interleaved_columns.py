"""interleaved_columns: every-s-th-column parts of a product with constant weights (GPT-OSS's
interleaved gate/up) become contiguous blocks, the constants' columns reordered; exact. Left
as they are: weights that are no constant, parts that leave columns out, a value also read
whole."""

import numpy as np

from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results

K, N = 8, 12


def _gated(grouped: bool = False, weight_input: bool = False, parts=(0, 1), step: int = 2,
           whole: bool = False) -> Graph:
    """gate = h[..., k::step] parts of h = x @ W + b, clamped, times each other."""
    rng = np.random.default_rng(0)
    g = Graph()
    if grouped:  # experts' rows by expert, the bias of each row's expert gathered
        x = g.add_input("x", TensorType((10, K), "float32"))
        offs = g.const(np.array([3, 7, 10], np.int32))
        w = g.const(rng.standard_normal((3, K, N)).astype(np.float32))
        h = g.add_node("GroupedMatMul", [x, w, offs]).output
        ids = g.const(np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2], np.int64))
        bias = g.add_node("Gather", [g.const(rng.standard_normal((3, N)).astype(np.float32)),
                                     ids], {"axis": 0}).output
    else:
        x = g.add_input("x", TensorType((10, K), "float32"))
        w = g.add_input("w", TensorType((K, N), "float32")) if weight_input else \
            g.const(rng.standard_normal((K, N)).astype(np.float32))
        h = g.add_node("MatMul", [x, w]).output
        bias = g.const(rng.standard_normal(N).astype(np.float32))
    h = g.add_node("Add", [h, bias]).output
    got = [g.add_node("StridedSlice", [h], {"begin": [k], "end": [N], "strides": [step],
                                            "axes": [1]}).output for k in parts]
    out = g.add_node("Minimum", [got[0], g.const(np.float32(0.5))]).output
    for part in got[1:]:
        out = g.add_node("Mul", [out, part]).output
    g.set_outputs([out, h] if whole else [out])
    return g


def _steps(g: Graph) -> list[int]:
    return [n.attrs["strides"][0] for n in g.nodes if n.op == "StridedSlice"]


def test_interleaved_parts_of_a_product_become_blocks():
    g = _gated()
    h, res = apply_pass("interleaved_columns", g)
    assert res.rewrites == 1 and _steps(h) == [1, 1], res.notes
    begins = sorted(n.attrs["begin"][0] for n in h.nodes if n.op == "StridedSlice")
    assert begins == [0, N // 2]
    # the same products of the same columns; a BLAS may sum a column differently by its
    # position in the matrix, so the comparison is to float rounding, not bitwise
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_grouped_experts_and_their_gathered_biases_are_reordered():
    g = _gated(grouped=True)
    h, res = apply_pass("interleaved_columns", g)
    assert res.rewrites == 1 and _steps(h) == [1, 1], res.notes
    assert "2 constant(s) reordered" in res.notes[0]
    # the same products of the same columns; a BLAS may sum a column differently by its
    # position in the matrix, so the comparison is to float rounding, not bitwise
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_three_interleaved_parts():
    g = _gated(parts=(2, 0, 1), step=3)
    h, res = apply_pass("interleaved_columns", g)
    assert res.rewrites == 1 and _steps(h) == [1, 1, 1]
    # the same products of the same columns; a BLAS may sum a column differently by its
    # position in the matrix, so the comparison is to float rounding, not bitwise
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_left_as_they_are():
    for g in (_gated(weight_input=True),  # the weights are an input (training)
              _gated(parts=(0,)),  # the odd columns are read by no one
              _gated(whole=True)):  # the product is read whole too
        h, res = apply_pass("interleaved_columns", g)
        assert res.rewrites == 0 and _steps(h) == _steps(g)
