"""product_zero_blocks: a product whose operand is a Concat with a constant-zero block along K
reads the other operand sliced along K instead (``A · [0; S] = A[:, k0:] · S``), the slice
moved up through the work computing that operand; refusals leave the graph as it was."""

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen.backend import run_sim
from graphkernel.interpreter import random_inputs
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

RNG = np.random.default_rng(3)


def _states(chunks=2, zero_at=0, decay="input", extra_reader=False, axis=1) -> Graph:
    """A chunked scan's states across chunks: ``cat(zeros, S)`` along the chunks (axis 1 of
    ``[B, c, H, D]``), moved to ``[B·H, c, D]`` (ExpandDims, Transpose, Reshape), times a
    decay ``[B·H, z, c]`` over the chunks: an input, or (``decay="segsum"``) the exp of a
    masked cumulative sum of a value broadcast along the chunks it is read against."""
    g = Graph("states")
    b, h, d = 2, 3, 8
    s = g.add_input("s", TensorType((b, chunks, h, d), "float32"))
    zero = g.const(np.zeros((b, 1, h, d), np.float32))
    pieces = [zero, s] if zero_at == 0 else [s, zero] if zero_at == 1 else None
    if pieces is None:  # a zero piece between two others
        pieces = [s, zero, s]
    cat = g.add_node("Concat", pieces, {"axis": axis}).output
    c = cat.shape[1]
    v = g.add_node("ExpandDims", [cat], {"axis": [4]}).output
    v = g.add_node("Transpose", [v], {"perm": [0, 2, 1, 3, 4]}).output
    v = g.add_node("Reshape", [v], {"shape": [b * h, c, d]}).output
    if decay == "input":
        a = g.add_input("a", TensorType((b * h, c + 1, c), "float32"))
    else:  # exp(segsum): x broadcast along the chunks read, summed down the rows, masked
        x = g.add_input("x", TensorType((b * h, c + 1), "float32"))
        e = g.add_node("ExpandDims", [x], {"axis": [2]}).output
        e = g.add_node("BroadcastTo", [e], {"shape": [b * h, c + 1, c]}).output
        tril = np.tril(np.ones((c + 1, c), bool), -1)
        e = g.add_node("Select", [g.const(tril), e, g.const(np.float32(0))]).output
        e = g.add_node("Scan", [e], {"axis": 1}).output
        e = g.add_node("Select", [g.const(np.tril(np.ones((c + 1, c), bool))), e,
                                  g.const(np.float32(-np.inf))]).output
        a = g.add_node("Exp", [e]).output
    y = g.add_node("BatchMatMul", [a, v]).output
    g.set_outputs([y, cat] if extra_reader else [y])
    return g


def test_the_zero_chunk_goes_and_the_decay_is_read_from_k0():
    g = _states()
    after, res = apply_pass("product_zero_blocks", g)
    assert res.modified and "Concat" not in ops_of(after)
    (mm,) = [n for n in after.nodes if n.op == "BatchMatMul"]
    assert mm.inputs[0].producer.op == "StridedSlice"
    assert mm.inputs[0].producer.attrs["begin"] == [1] and mm.inputs[0].shape[-1] == 2
    assert tuple(mm.inputs[1].shape) == (6, 2, 8)  # the states alone, through the views
    assert_same_results(g, after, exact=False, rtol=1e-6, atol=1e-6)


def test_a_zero_block_at_the_end_of_k_is_left_out_too():
    g = _states(zero_at=1)
    after, res = apply_pass("product_zero_blocks", g)
    assert res.modified and "Concat" not in ops_of(after)
    (sl,) = [n for n in after.nodes if n.op == "StridedSlice"]
    assert (sl.attrs["begin"], sl.attrs["end"]) == ([0], [2])
    assert_same_results(g, after, exact=False, rtol=1e-6, atol=1e-6)


def test_the_slice_moves_up_to_the_broadcast_and_goes():
    """The decay is exp(segsum): the slice along the chunks read commutes with the Exp, the
    Selects (their masks sliced when compiling), the Scan down the rows and the broadcast,
    which then broadcasts to the kept chunks only: no slice, no Concat."""
    g = _states(decay="segsum")
    after, res = apply_pass("product_zero_blocks", g)
    assert res.modified
    assert "Concat" not in ops_of(after) and "StridedSlice" not in ops_of(after)
    (bc,) = [n for n in after.nodes if n.op == "BroadcastTo"]
    assert bc.attrs["shape"] == [6, 4, 2]
    assert "moved up through Exp Select Scan Select BroadcastTo" in res.notes[0]
    feeds = random_inputs(g, 0)
    from graphkernel.interpreter import run_graph
    for want, got in zip(run_graph(g, feeds), run_graph(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_what_cannot_be_taken_is_left_as_it_was():
    cases = {"between": _states(zero_at=2), "read": _states(extra_reader=True)}
    for name, g in cases.items():
        after, res = apply_pass("product_zero_blocks", g)
        assert not res.modified, name
        assert ops_of(after) == ops_of(g), name


def test_a_zero_block_along_n_is_no_k_block():
    """The Concat along D (the product's N): not a K block, left as it was."""
    g = Graph("n")
    s = g.add_input("s", TensorType((4, 3, 5), "float32"))
    a = g.add_input("a", TensorType((4, 2, 3), "float32"))
    cat = g.add_node("Concat", [g.const(np.zeros((4, 3, 2), np.float32)), s],
                     {"axis": 2}).output
    g.set_outputs([g.add_node("BatchMatMul", [a, cat]).output])
    after, res = apply_pass("product_zero_blocks", g)
    assert not res.modified and "Concat" in ops_of(after)


def test_through_the_pipeline_the_concat_is_no_launch_and_the_numbers_hold():
    g = _states(decay="segsum")
    base = graphkernel.compile(g, "--opt_level=2 --disable_pass=product_zero_blocks", env={})
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert "Concat" in ops_of(base.graph) and "Concat" not in ops_of(res.graph)
    launches = [n for n in res.graph.nodes if n.op not in ("Constant", "Reshape")]
    assert len(launches) < len([n for n in base.graph.nodes
                                if n.op not in ("Constant", "Reshape")])
    feeds = {k: v for k, v in random_inputs(g, 1).items()}
    got, _ = run_sim(res, feeds)
    assert not Evaluator(g, feeds).judge(got).bad


def test_a_zero_block_of_the_left_operand_slices_the_right_operands_rows():
    """``[S, 0] · Wᵀ = S · W[:, :6]ᵀ`` (W's K its last axis, read transposed): W, an input,
    is sliced along its last axis and the Concat goes."""
    g = Graph("left")
    s = g.add_input("s", TensorType((4, 6), "float32"))
    cat = g.add_node("Concat", [s, g.const(np.zeros((4, 2), np.float32))], {"axis": 1}).output
    w = g.add_input("w", TensorType((5, 8), "float32"))
    g.set_outputs([g.add_node("MatMul", [cat, w], {"transpose_b": True}).output])
    after, res = apply_pass("product_zero_blocks", g)
    assert res.modified and "Concat" not in ops_of(after)
    (sl,) = [n for n in after.nodes if n.op == "StridedSlice"]
    assert (sl.attrs["begin"], sl.attrs["end"], sl.attrs["axes"]) == ([0], [6], [1])
    assert_same_results(g, after, exact=False, rtol=1e-6, atol=1e-6)
