"""A region of data movement (pads as Concats with constant blocks, slices, re-strides as
constant-index Gathers, views, transposes, selects under constant masks: sliding-window
chunk diagonals, blocks of block-sparse attention) is one Gather per value it hands out,
the constants it places a Select under a constant mask: the same elements at the same
places, far fewer launches."""

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import run_sim
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.torch import launch_counts
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def _slice(g, x, begin, end, axes):
    return g.add_node("StridedSlice", [x], {"begin": begin, "end": end,
                                            "strides": [1] * len(axes), "axes": axes}).output


def chunks(b: int = 2, c: int = 3, w: int = 4, fill: float = -1e4) -> Graph:
    """Scores of chunk pairs from a product, padded by a zero row and re-viewed so that the
    diagonals line up, the two halves copied into a zeroed buffer by slices and
    concatenations, the first chunk masked at the window's edge, then a softmax."""
    g = Graph("chunks")
    q = g.add_input("q", TensorType((b * c, w, 8), "float32"))
    k = g.add_input("k", TensorType((b * c, 8, w), "float32"))
    s = g.add_node("BatchMatMul", [q, k]).output
    s = g.add_node("Reshape", [s], {"shape": [b, c, w, w]}).output
    p = g.add_node("Concat", [s, g.const(np.zeros((b, c, 1, w), np.float32))],
                   {"axis": 2}).output  # constant_pad_nd: [b, c, w+1, w]
    d = g.add_node("Reshape", [p], {"shape": [b, c, w, w + 1]}).output
    h = w // 2
    lo = _slice(g, d, [0, 0], [h, h + 1], [2, 3])
    hi = _slice(g, d, [h, h], [w, w + 1], [2, 3])
    top = g.add_node("Concat", [lo, g.const(np.zeros((b, c, h, w - h), np.float32))],
                     {"axis": 3}).output
    bottom = g.add_node("Concat", [g.const(np.zeros((b, c, w - h, h), np.float32)), hi],
                        {"axis": 3}).output
    full = g.add_node("Concat", [top, bottom], {"axis": 2}).output
    first = _slice(g, full, [0], [1], [1])
    rest = _slice(g, full, [1], [c], [1])
    edge = np.zeros((1, 1, w, w + 1), bool)
    edge[..., :h, :2] = True
    first = g.add_node("Select", [g.const(edge), g.const(np.float32(fill)), first]).output
    scores = g.add_node("Concat", [first, rest], {"axis": 1}).output
    e = g.add_node("Exp", [scores]).output
    total = g.add_node("ReduceSum", [e], {"axis": [3], "keep_dims": True}).output
    g.set_outputs([g.add_node("Div", [e, total]).output])
    return g


def restrided(heads: int = 2, n: int = 8, d: int = 4, w: int = 2) -> Graph:
    """``as_strided`` chunks of transposed heads (a Gather at constant storage positions)
    transposed again for a product: the transposes and the Gather are one Gather."""
    g = Graph("restrided")
    x = g.add_input("x", TensorType((n, heads, d), "float32"))
    t = g.add_node("Transpose", [x], {"perm": [1, 0, 2]}).output
    flat = g.add_node("Reshape", [t], {"shape": [heads * n * d]}).output
    nc = n // w - 1
    pos = np.array([[[[hh * n * d + (ci * w + r) * d + j for j in range(d)]
                      for r in range(2 * w)] for ci in range(nc)] for hh in range(heads)])
    ch = g.add_node("Gather", [flat, g.const(pos.astype(np.int64))], {"axis": 0}).output
    ct = g.add_node("Transpose", [ch], {"perm": [0, 1, 3, 2]}).output
    v = g.add_node("Reshape", [ct], {"shape": [heads * nc, d, 2 * w]}).output
    q = g.add_input("q", TensorType((heads * nc, 2 * w, d), "float32"))
    g.set_outputs([g.add_node("BatchMatMul", [q, v]).output])
    return g


def test_a_chunk_diagonal_region_is_one_gather_and_a_masked_select():
    g = chunks()
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    ops = ops_of(h)
    assert ops.count("Gather") == 1 and "Concat" not in ops and "StridedSlice" not in ops, ops
    assert ops.count("Select") == 1, ops  # the pad's zeros and the fill under one mask
    assert_same_results(g, h)


@pytest.mark.parametrize("b,c,w", [(1, 2, 2), (2, 3, 4), (3, 5, 6)])
def test_chunk_diagonals_through_the_pipeline_and_the_simulator(b, c, w):
    """Before: each slice and concatenation a small kernel (9 vector launches at 2x3x4);
    after: the Gather, and the softmax kernel that takes the Select of the constants."""
    g = chunks(b, c, w)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    counts = launch_counts(res.graph)
    assert counts["vector"] == 2 and counts["cube"] == 1, counts
    feeds = random_inputs(g, b)
    got, _ = run_sim(res, feeds)
    np.testing.assert_allclose(got[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-6)
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=movement_gather", env={})
    assert launch_counts(off.graph)["vector"] > counts["vector"] + 2


def test_a_transpose_feeding_a_restride_joins_its_gather():
    g = restrided()
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    ops = ops_of(h)
    assert ops.count("Gather") == 1 and "Transpose" not in ops, ops
    assert_same_results(g, h)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    before = graphkernel.compile(g, "--opt_level=2 --disable_pass=movement_gather", env={})
    assert launch_counts(res.graph)["vector"] < launch_counts(before.graph)["vector"]


def test_two_inputs_are_gathered_from_their_concatenation():
    g = Graph("two")
    a = g.add_input("a", TensorType((4, 6), "float32"))
    b = g.add_input("b", TensorType((4, 6), "float32"))
    left = g.add_node("Concat", [_slice(g, a, [0], [3], [1]), _slice(g, b, [3], [6], [1])],
                      {"axis": 1}).output
    right = g.add_node("Concat", [_slice(g, b, [0], [3], [1]), _slice(g, a, [3], [6], [1])],
                       {"axis": 1}).output
    both = g.add_node("Concat", [left, right], {"axis": 0}).output
    g.set_outputs([g.add_node("Exp", [both]).output])
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    ops = ops_of(h)
    assert ops.count("Concat") == 1 and ops.count("Gather") == 1, ops
    (cat,) = [n for n in h.nodes if n.op == "Concat"]
    assert cat.outputs[0].type.shape == (48,)  # the two inputs, flattened
    assert_same_results(g, h)


def test_a_value_read_outside_the_region_keeps_its_own_gather():
    """Every value the region hands out (here the padded scores, read by a second
    consumer) is one Gather of its own; the results are the same."""
    g = chunks()
    (pad,) = [n for n in g.nodes if n.op == "Concat" and n.inputs[0].producer.op == "Reshape"
              and n.attrs["axis"] == 2 and len(n.inputs) == 2
              and n.inputs[1].producer.op == "Constant"]
    extra = g.add_node("Neg", [pad.outputs[0]]).output
    g.set_outputs(list(g.outputs) + [extra])
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    assert ops_of(h).count("Gather") == 2, ops_of(h)
    assert_same_results(g, h)


def test_a_lone_slice_or_concat_is_left_to_the_patterns():
    g = Graph("lone")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    y = g.add_input("y", TensorType((4, 8), "float32"))
    s = _slice(g, x, [0], [4], [1])
    c = g.add_node("Concat", [s, _slice(g, y, [4], [8], [1])], {"axis": 1}).output
    g.set_outputs([g.add_node("Exp", [c]).output])
    _, res = apply_pass("movement_gather", g)
    assert res.rewrites == 0  # 3 slices/concats become a Concat and a Gather: 1 saved


def test_a_select_under_a_computed_condition_is_not_movement():
    """A mask computed from an input is work, not movement: the region stops at it (on
    each side too few moves are left to rewrite)."""
    g = chunks()
    (sel,) = [n for n in g.nodes if n.op == "Select"]
    m = g.add_input("m", TensorType(tuple(sel.inputs[0].shape), "bool"))
    g.replace_input(sel, 0, m)
    h, _ = apply_pass("movement_gather", g)
    assert_same_results(g, h)
    assert any(n.op == "Select" and n.inputs[0].name == m.name for n in h.nodes)


def test_symbolic_shapes_are_left_as_they_are():
    g = Graph("dyn")
    x = g.add_input("x", TensorType(("s", 8), "float32"))
    parts = [_slice(g, x, [i], [i + 2], [1]) for i in range(0, 8, 2)]
    c = g.add_node("Concat", list(reversed(parts)), {"axis": 1}).output
    g.set_outputs([g.add_node("Exp", [c]).output])
    _, res = apply_pass("movement_gather", g)
    assert res.rewrites == 0


def test_a_region_left_and_reentered_gathers_only_what_each_value_reads():
    """A value the region hands out feeds work outside (an Exp) whose result the region
    reads again (block-sparse attention scatters into a buffer it then slices, its blocks
    picked by a constant-index Gather): each Gather reads the concatenation of only the
    inputs it reads, or the first one would read its own output through the Exp."""
    g = Graph("reentry")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    y = g.add_input("y", TensorType((4, 8), "float32"))
    picked = g.add_node("Gather", [x, g.const(np.array([3, 0, 2, 1], np.int64))],
                        {"axis": 1}).output
    c1 = g.add_node("Concat", [_slice(g, y, [4], [8], [1]), picked], {"axis": 1}).output
    e = g.add_node("Exp", [c1]).output
    top = _slice(g, c1, [0], [2], [0])
    low = _slice(g, e, [2], [4], [0])
    c2 = g.add_node("Concat", [_slice(g, top, [0, 2], [2, 6], [0, 1]),
                               _slice(g, low, [0, 4], [2, 8], [0, 1])], {"axis": 0}).output
    g.set_outputs([g.add_node("Neg", [c2]).output])
    h, res = apply_pass("movement_gather", g)  # (validates: no cycle)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    cats = sorted(n.outputs[0].type.shape[0] for n in h.nodes if n.op == "Concat")
    assert cats == [64, 96], cats  # (y, x) for the first value, (y, x, e) for the second
    assert_same_results(g, h)


def test_a_region_too_large_to_tabulate_is_left_as_it_is(monkeypatch):
    import graphkernel.passes.movement_gather as mg

    monkeypatch.setattr(mg, "MAX_ELEMENTS", 64)  # the chunks' scores hold 2*3*4*5 = 120
    _, res = apply_pass("movement_gather", chunks())
    assert res.rewrites == 0


def test_a_graph_output_in_the_region_keeps_its_name_and_values():
    g = chunks()
    (full,) = [n for n in g.nodes if n.op == "Concat" and n.outputs[0].type.shape == (2, 3, 4, 5)
               and n.inputs[0].producer.op == "Concat"]
    g.set_outputs(list(g.outputs) + [full.outputs[0]], names=["probs", "layout"])
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    assert [name for name, _ in h.named_outputs()] == ["probs", "layout"]
    assert_same_results(g, h)


def test_the_masked_softmax_kernel_compiles_against_the_real_headers():
    """The kernel that takes the constants' Select (a constant mask and fill read as kernel
    inputs) type-checks against the real Ascend C headers (skipped without them)."""
    from graphkernel.codegen.backend import render_all, schedules
    from tests.codegen.test_realcheck import assert_all_compile, headers

    if headers() is None:
        pytest.skip("no Ascend C headers (GRAPHKERNEL_ASCEND_HEADERS)")
    res = graphkernel.compile(chunks(), "--opt_level=2", env={})
    assert_all_compile(render_all(schedules(res)))


def test_slices_and_a_concat_of_vector_work_are_left_to_the_concat_pattern():
    """``cat([x[:, :1], x[:, :-1]])`` of a norm's output (Funnel's shifted rows): the
    ``concat`` pattern stores the pieces from the norm's kernel, no launch of their own,
    which one Gather would be."""
    g = Graph("shift")
    x = g.add_input("x", TensorType((2, 16, 64), "float32"))
    y = g.add_node("Exp", [x]).output
    c = g.add_node("Concat", [_slice(g, y, [0], [1], [1]), _slice(g, y, [0], [15], [1])],
                   {"axis": 1}).output
    g.set_outputs([g.add_node("Neg", [g.add_node("ExpandDims", [c], {"axis": [1]}).output])
                   .output])
    _, res = apply_pass("movement_gather", g)
    assert res.rewrites == 0
    before = graphkernel.compile(g, "--opt_level=2 --disable_pass=movement_gather", env={})
    after = graphkernel.compile(g, "--opt_level=2", env={})
    assert launch_counts(after.graph) == launch_counts(before.graph)
