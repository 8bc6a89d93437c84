"""interleaved_columns: every-s-th-column parts of a product with constant weights (GPT-OSS's
interleaved gate/up) become contiguous blocks, the constants' columns reordered; exact. Left
as they are: weights that are no constant, parts that leave columns out, a value also read
whole."""

import numpy as np

from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results

K, N = 8, 12


def _gated(grouped: bool = False, weight_input: bool = False, parts=(0, 1), step: int = 2,
           whole: bool = False, transposed: bool = False) -> Graph:
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
        wshape = (N, K) if transposed else (K, N)  # a Linear's [N, K] weight read transposed
        w = g.add_input("w", TensorType(wshape, "float32")) if weight_input else \
            g.const(rng.standard_normal(wshape).astype(np.float32))
        h = g.add_node("MatMul", [x, w], {"transpose_a": False,
                                          "transpose_b": transposed}).output
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


def test_a_weight_read_transposed_has_its_rows_reordered():
    g = _gated(transposed=True)
    h, res = apply_pass("interleaved_columns", g)
    assert res.rewrites == 1 and _steps(h) == [1, 1], res.notes
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


def _heads(parts=((0, 2), (2, 4)), weight_input: bool = False, whole: bool = False,
           bias: bool = True, merged: bool = True) -> Graph:
    """A Linear's output ([N, K] weight read transposed) viewed as [1, 16, 2 heads, 4] and cut
    into the column blocks ``parts`` of each head (a gated delta rule's b and a), each part
    seen as [1, 16, 8 // 4 * width]: what every head's part is, in one row."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.add_input("x", TensorType((16, 32), "float32"))
    w = g.add_input("w", TensorType((8, 32), "float32")) if weight_input else \
        g.const(rng.standard_normal((8, 32)).astype(np.float32))
    h = g.add_node("MatMul", [x, w], {"transpose_a": False, "transpose_b": True}).output
    if bias:
        h = g.add_node("Add", [h, g.const(rng.standard_normal(8).astype(np.float32))]).output
    r = g.add_node("Reshape", [h], {"shape": [1, 16, 2, 4]}).output
    outs = []
    for b, e in parts:
        p = g.add_node("StridedSlice", [r], {"begin": [b], "end": [e], "strides": [1],
                                             "axes": [3]}).output
        if merged:  # the heads' parts in one row (else read head by head)
            p = g.add_node("Reshape", [p], {"shape": [1, 16, 2 * (e - b)]}).output
        outs.append(g.add_node("Exp", [p]).output)
    g.set_outputs(outs + ([r] if whole else []))
    return g


def test_parts_of_each_head_become_blocks():
    """Each head's columns 0:2 and 2:4 of a product read transposed from a constant weight,
    with a constant bias: two contiguous column blocks (weight rows and bias reordered), each
    part a slice of the product's own columns, the same numbers."""
    g = _heads()
    h, res = apply_pass("interleaved_columns", g)
    assert res.rewrites == 1 and "2 parts of each of 2 heads" in res.notes[0], res.notes
    assert "2 constant(s) reordered" in res.notes[0]
    got = sorted((n.attrs["begin"][0], n.attrs["end"][0], n.inputs[0].type.rank)
                 for n in h.nodes if n.op == "StridedSlice")
    assert got == [(0, 4, 2), (4, 8, 2)]  # blocks of the product's [16, 8], not of the view
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_unequal_and_three_parts_of_each_head():
    for parts in (((0, 1), (1, 4)), ((2, 4), (0, 1), (1, 2))):
        g = _heads(parts=parts, bias=False)
        h, res = apply_pass("interleaved_columns", g)
        assert res.rewrites == 1, (parts, res.notes)
        assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_head_parts_left_as_they_are():
    for g in (_heads(weight_input=True),  # the weights are an input (training)
              _heads(parts=((0, 2),)),  # one part: nothing to cut
              _heads(parts=((0, 1), (2, 4))),  # column 1 of each head is read by no one
              _heads(parts=((0, 3), (2, 4))),  # column 2 read twice
              _heads(whole=True),  # the heads are read whole too
              _heads(merged=False)):  # each part read head by head: read in place already
        h, res = apply_pass("interleaved_columns", g)
        assert res.rewrites == 0, res.notes
