"""Each numbered rule: a positive case, a negative case, and preserved results."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.passes.arith_simplify import RULES
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

F = TensorType((3, 4), "float32")


def build(expr):
    g = Graph("t")
    x = g.add_input("x", F)
    y = g.add_input("y", F)
    g.set_outputs([expr(g, x, y)])
    return g


def op(g, name, *ins, **attrs):
    return g.add_node(name, list(ins), attrs).output


def c(g, v, shape=()):
    return g.const(np.full(shape, v, np.float32))


CASES = {
    1: (lambda g, x, y: op(g, "Mul", c(g, 1.0), x), []),
    2: (lambda g, x, y: op(g, "Add", x, c(g, 0.0, (4,))), []),
    3: (lambda g, x, y: op(g, "Sub", x, c(g, 0.0)), []),
    4: (lambda g, x, y: op(g, "Div", x, c(g, 1.0)), []),
    5: (lambda g, x, y: op(g, "Pow", x, c(g, 1.0)), []),
    6: (lambda g, x, y: op(g, "Neg", op(g, "Neg", x)), []),
    8: (lambda g, x, y: op(g, "Abs", op(g, "Abs", x)), ["Abs"]),
    9: (lambda g, x, y: op(g, "Exp", op(g, "Identity", x)), ["Exp"]),
    10: (lambda g, x, y: op(g, "Mul", x, c(g, -1.0)), ["Neg"]),
    11: (lambda g, x, y: op(g, "Pow", x, c(g, 2.0)), ["Mul"]),
    12: (lambda g, x, y: op(g, "Add", x, op(g, "Neg", y)), ["Sub"]),
    13: (lambda g, x, y: op(g, "Sub", x, op(g, "Neg", y)), ["Add"]),
    14: (lambda g, x, y: op(g, "Exp", op(g, "BroadcastTo", x, shape=[3, 4])), ["Exp"]),
    15: (lambda g, x, y: op(g, "Exp", op(g, "Concat", x, axis=0)), ["Exp"]),
    16: (lambda g, x, y: op(g, "Gather", x, idx(g, [0, 2]), axis=1), ["StridedSlice"]),
    18: (lambda g, x, y: op(g, "Exp", op(g, "StridedSlice", x, begin=[0], end=[2**63 - 1],
                                         strides=[1], axes=[1])), ["Exp"]),
}


def idx(g, values):
    return g.const(np.array(values, np.int64))


@pytest.mark.parametrize("values, axis, want", [
    ([-2], 0, (1, 2, 1)),            # Falcon's qkv[..., [-2], :]: one index, negative
    ([1, 2, 3], 1, (1, 4, 1)),       # consecutive
    ([3, 1], 1, None),               # decreasing: a negative step (kept a Gather)
    ([0, 1, 3], 1, None),            # uneven steps
    ([4], 1, None),                  # out of range: Gather's error is kept
    ([[0, 1]], 1, None),             # 2-D indices
])
def test_rule_16_gather_slice(values, axis, want):
    g = build(lambda g, x, y: op(g, "Gather", x, idx(g, values), axis=axis))
    if want is None:
        h, res = apply_pass("arith_simplify", g)
        assert not res.modified and ops_of(h) == ["Gather"]
        return
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert "rule 16 gather_slice: 1" in res.notes
    sl = h.outputs[0].producer
    assert sl.op == "StridedSlice" and (sl.attrs["begin"][0], sl.attrs["end"][0],
                                        sl.attrs["strides"][0]) == want
    assert_same_results(g, h)


def test_rule_16_scalar_index_drops_the_axis():
    """x[..., -1, :] as a Gather of a 0-d index: a slice, then a Squeeze of the axis."""
    g = build(lambda g, x, y: op(g, "Gather", x, g.const(np.array(-1, np.int64)), axis=0))
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert "rule 16 gather_slice: 1" in res.notes
    assert ops_of(h) == ["StridedSlice", "Squeeze"] and h.outputs[0].shape == (4,)
    assert_same_results(g, h)


def test_rule_15_drops_empty_parts():
    """cat(empty, x, y) -> cat(x, y); cat(x, empty) -> x (a decoder's first cache update)."""
    g = build(lambda g, x, y: op(g, "Concat", g.const(np.zeros((3, 0), np.float32)), x, y,
                                 axis=-1))
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert "rule 15 concat_parts: 1" in res.notes
    assert ops_of(h) == ["Concat"] and len(h.outputs[0].producer.inputs) == 2
    assert_same_results(g, h)
    g = build(lambda g, x, y: op(g, "Concat", x, g.const(np.zeros((0, 4), np.float32)), axis=0))
    h, _ = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert ops_of(h) == []
    assert_same_results(g, h)


def sliced_conv(length, pads=(0, 2, 0, 2), stride=1, end=-1, squeeze=True, fmt="NCHW"):
    """x[1, 4, 1, length] -> Conv2D (kernel 1x4, group 2) -> [Squeeze] -> [..., :end] along
    the conv's W, as wav2vec2's positional convolution."""
    g = Graph("t")
    shape = (1, 4, 1, length) if fmt == "NCHW" else (1, 1, length, 4)
    x = g.add_input("x", TensorType(shape, "float32"))
    w = g.const(np.random.default_rng(0).standard_normal((4, 2, 1, 4)).astype(np.float32))
    y = op(g, "Conv2D", x, w, pads=list(pads), strides=[1, stride], group=2, data_format=fmt)
    axis = 3 if fmt == "NCHW" else 2
    if squeeze:
        y = op(g, "Squeeze", y, axis=[1 if fmt == "NHWC" else 2])
        axis -= 1
    g.set_outputs([op(g, "StridedSlice", y, begin=[0], end=[end], axes=[axis])])
    return g


@pytest.mark.parametrize("length,kw", [
    (10, {}), (10, {"squeeze": False}), (10, {"fmt": "NHWC"}),
    (11, {"pads": (0, 3, 0, 4), "stride": 2, "end": -2}),  # 2 outputs, 2 x stride 2 of pad
    (10, {"end": 10}),                                      # x[..., :10] of 11 outputs
    ("n", {}),                                              # a symbolic length
])
def test_rule_17_slice_of_a_padded_conv_is_less_end_padding(length, kw):
    g = sliced_conv(length, **kw)
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert "rule 17 slice_conv_padding: 1" in res.notes
    assert "StridedSlice" not in ops_of(h)
    conv = next(n for n in h.nodes if n.op == "Conv2D")
    pads, stride = kw.get("pads", (0, 2, 0, 2)), kw.get("stride", 1)
    dropped = -kw.get("end", -1) if kw.get("end", -1) < 0 else 1
    assert conv.attrs["pads"][3] == pads[3] - dropped * stride
    assert h.outputs[0].type == g.outputs[0].type
    if isinstance(length, str):
        feeds = random_inputs(g, 0, dims={"n": 13})
        for a, b in zip(run_graph(g, feeds), run_graph(h, feeds), strict=True):
            np.testing.assert_array_equal(a, b)
    else:
        assert_same_results(g, h)


@pytest.mark.parametrize("kw", [
    {"pads": (0, 2, 0, 0)},              # no end padding: the slice drops real outputs
    {"pads": (0, 2, 0, 1), "stride": 2, "end": -1, "squeeze": False},  # 1 < 1 x stride 2
])
def test_rule_17_keeps_a_slice_the_padding_cannot_absorb(kw):
    h, res = apply_pass("arith_simplify", sliced_conv(10, **kw))
    assert not any("rule 17" in n for n in res.notes)
    assert "StridedSlice" in ops_of(h)


def gathered_conv(length, kept, pads=(0, 3, 0, 3), squeeze=True, fmt="NCHW"):
    """x[1, 4, 1, length] -> Conv2D (kernel 1x4, group 2) -> [Squeeze] -> Gather of the rows
    Range(0, kept) along the conv's W: a causal convolution over a symbolic length sliced
    back to it, as the torch frontend writes ``conv(x)[..., :L]``."""
    g = Graph("t")
    shape = (1, 4, 1, length) if fmt == "NCHW" else (1, 1, length, 4)
    x = g.add_input("x", TensorType(shape, "float32"))
    w = g.const(np.random.default_rng(0).standard_normal((4, 2, 1, 4)).astype(np.float32))
    y = op(g, "Conv2D", x, w, pads=list(pads), group=2, data_format=fmt)
    axis = 3 if fmt == "NCHW" else 2
    if squeeze:
        y = op(g, "Squeeze", y, axis=[1 if fmt == "NHWC" else 2])
        axis -= 1
    idx = op(g, "Range", start=0, length=kept, dtype="int64")
    g.set_outputs([op(g, "Gather", y, idx, axis=axis)])
    return g


@pytest.mark.parametrize("length,kept,kw", [
    ("n", "n", {}), ("n", "n", {"fmt": "NHWC", "squeeze": False}),
    ("8*q", "8*q", {}),                       # a length guarded to a multiple of 8
    ("n", "n__p1_d1", {}),                    # one output past the input's length kept
    (10, 10, {}),                             # static: 13 outputs, the first 10
])
def test_rule_26_prefix_gather_of_a_padded_conv_is_less_end_padding(length, kept, kw):
    g = gathered_conv(length, kept, **kw)
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert "rule 26 gather_prefix_conv_padding: 1" in res.notes
    assert not {"Gather", "Range"} & set(ops_of(h))
    conv = next(n for n in h.nodes if n.op == "Conv2D")
    assert conv.attrs["pads"][3] == (1 if kept == "n__p1_d1" else 0)
    assert h.outputs[0].type == g.outputs[0].type
    syms = {"n": 13} if "n" in str(length) else {"q": 3} if "q" in str(length) else {}
    feeds = random_inputs(g, 0, dims=syms)
    for a, b in zip(run_graph(g, feeds), run_graph(h, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("why", ["not from 0", "not a prefix", "read elsewhere"])
def test_rule_26_keeps_a_gather_the_padding_cannot_absorb(why):
    """Rows from 1 on (not the first outputs), more rows dropped than the end padding holds
    (the last real outputs), or the convolution read by other work: the Gather stays."""
    # "not a prefix": n + 1 outputs (end padding 1), the first n - 3 kept: 4 dropped
    g = gathered_conv("n", "n__m3_d1", pads=(0, 3, 0, 1)) if why == "not a prefix" else \
        gathered_conv("n", "n")
    if why == "not from 0":
        next(n for n in g.nodes if n.op == "Range").attrs["start"] = 1
    if why == "read elsewhere":
        conv = next(n for n in g.nodes if n.op == "Conv2D")
        g.set_outputs([g.outputs[0], conv.outputs[0]])
    h, res = apply_pass("arith_simplify", g)
    assert not any("rule 26" in n for n in res.notes)
    assert "Gather" in ops_of(h)


def test_rule_17_keeps_a_conv_read_elsewhere():
    g = sliced_conv(10)
    conv = next(n for n in g.nodes if n.op == "Conv2D")
    g.set_outputs([g.outputs[0], conv.outputs[0]])
    h, res = apply_pass("arith_simplify", g)
    assert not any("rule 17" in n for n in res.notes)


@pytest.mark.parametrize("number", sorted(CASES))
def test_rule(number):
    expr, remaining = CASES[number]
    g = build(expr)
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert res.modified and any(f"rule {number} " in n for n in res.notes), res.notes
    assert ops_of(h) == remaining
    assert_same_results(g, h)


def test_rule_7_not_not():
    g = Graph()
    b = g.add_input("b", TensorType((4,), "bool"))
    g.set_outputs([op(g, "LogicalNot", op(g, "LogicalNot", b))])
    h, res = apply_pass("arith_simplify", g)
    assert "rule 7 not_not: 1" in res.notes
    h.remove_dead()
    assert ops_of(h) == []


def test_every_rule_is_tested():
    assert {r.number for r in RULES} == \
        set(CASES) | {7, 17, 19, 20, 21, 22, 23, 24, 25, 26}  # (below)


def test_rule_18_whole_slice_of_a_symbolic_axis():
    """Dynamo's ``x[:, :s]`` of a symbolic axis: slice(0, 2**63 - 1) keeps all s rows."""
    g = Graph()
    x = g.add_input("x", TensorType(("s", 4), "float32"))
    sl = op(g, "StridedSlice", x, begin=[0], end=[2**63 - 1], strides=[1], axes=[0])
    g.set_outputs([op(g, "Exp", sl)])
    h, res = apply_pass("arith_simplify", g)
    assert "rule 18 slice_whole: 1" in res.notes
    h.remove_dead()
    assert ops_of(h) == ["Exp"] and h.nodes[0].inputs[0] is h.inputs[0]


def test_rule_18_keeps_an_empty_slice_of_a_symbolic_axis():
    """x[0:0] of a symbolic axis is empty, not the whole axis: the slice stays."""
    g = Graph()
    x = g.add_input("x", TensorType(("s", 4), "float32"))
    sl = op(g, "StridedSlice", x, begin=[0], end=[0], strides=[1], axes=[0])
    g.set_outputs([op(g, "Exp", sl)])
    h, res = apply_pass("arith_simplify", g)
    assert "slice_whole" not in res.notes and "StridedSlice" in ops_of(h)
    feeds = {"x": np.ones((5, 4), np.float32)}
    assert run_graph(h, feeds)[0].shape == run_graph(g, feeds)[0].shape == (0, 4)


@pytest.mark.parametrize("expr", [
    lambda g, x, y: op(g, "Mul", x, c(g, 1.0, (2, 3, 4))),   # the 1 broadcasts x: keep
    lambda g, x, y: op(g, "Mul", x, g.const(np.array([1, 1, 1, 2], np.float32))),  # not a splat
    lambda g, x, y: op(g, "Sub", c(g, 0.0), x),                # 0 - x is not x
    lambda g, x, y: op(g, "Div", c(g, 1.0), x),                # 1 / x is not x
    lambda g, x, y: op(g, "Exp", op(g, "Log", x)),             # exp(log x): NaN for x < 0
    lambda g, x, y: op(g, "Mul", x, c(g, 0.0)),                # x * 0: NaN/Inf stay NaN
    lambda g, x, y: op(g, "Concat", x, y, axis=0),             # two non-empty parts stay
    lambda g, x, y: op(g, "StridedSlice", x, begin=[-1], end=[-5], strides=[-1],
                       axes=[1]),                              # whole axis reversed
    lambda g, x, y: op(g, "StridedSlice", x, begin=[1], end=[4], axes=[1]),  # a part
])
def test_non_rewrites(expr):
    g = build(expr)
    h, res = apply_pass("arith_simplify", g)
    assert not res.modified and ops_of(h) == ops_of(g)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("pads,folds", [
    ([0, 0, 0, 1, 0, 0, 1, 2], True),    # TensorFlow "SAME": one before, one/two after
    ([1, 0, 1, 0, 0, 0, 2, 0], False),   # a pad of the batch too
    ([0, 0, -1, 0, 0, 0, 0, 0], False),  # a crop
])
def test_rule_19_pad_into_conv(fmt, pads, folds):
    g = Graph("t")
    x = g.add_input("x", TensorType((1, 4, 5, 6) if fmt == "NCHW" else (1, 5, 6, 4),
                                    "float32"))
    if fmt == "NHWC":  # the same pads on the spatial axes (1, 2)
        pads = [pads[0], pads[2], pads[3], pads[1], pads[4], pads[6], pads[7], pads[5]]
    p = op(g, "Pad", x, pads=pads)
    w = g.const(np.random.default_rng(0).standard_normal((3, 4, 3, 3)).astype(np.float32))
    g.set_outputs([op(g, "Conv2D", p, w, pads=[1, 0, 0, 1], strides=[2, 2], data_format=fmt)])
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert (ops_of(h) == ["Conv2D"]) == folds
    if folds:
        assert "rule 19 pad_into_conv: 1" in res.notes
    assert_same_results(g, h)


def _ids(g: Graph, shape=(2, 16)):
    return g.add_input("ids", TensorType(shape, "int64"))


def test_rules_20_to_22_fold_token_types_gathered_from_zeros_by_position_ids():
    """RoBERTa without token types: a buffer of zeros gathered along the positions (rule 21)
    is zeros whatever the positions; the token-type table read at 0 everywhere (rule 22) is
    its row 0 — one constant, no launch. Gather from a constant of one value (rule 20)."""
    g = Graph()
    ids = _ids(g)
    table = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    zeros = g.const(np.zeros((2, 16), np.int64))
    types = op(g, "GatherElements", zeros, ids, axis=1)
    emb = op(g, "Gather", g.const(table), types, axis=0)
    sevens = op(g, "Gather", g.const(np.full((5, 8), 7.0, np.float32)), ids, axis=0)
    g.set_outputs([op(g, "Add", emb, sevens)])
    h, res = apply_pass("arith_simplify", g)
    assert res.notes == ["rule 20 gather_splat_data: 1", "rule 21 gather_elements_splat_data: 1",
                         "rule 22 gather_splat_index: 1"], res.notes
    h.remove_dead()
    assert ops_of(h) == ["Add"]
    feeds = {"ids": np.random.default_rng(1).integers(0, 2, (2, 16)).astype(np.int64)}
    np.testing.assert_array_equal(run_graph(h, feeds)[0], run_graph(g, feeds)[0])


def test_rules_20_to_22_keep_gathers_of_data_and_of_indices_that_vary():
    g = Graph()
    ids = _ids(g)
    table = g.const(np.arange(16, dtype=np.float32).reshape(2, 8))
    varied = op(g, "GatherElements", g.const(np.arange(32, dtype=np.int64).reshape(2, 16)),
                ids, axis=1)
    g.set_outputs([op(g, "Gather", table, ids, axis=0), varied,
                   op(g, "Gather", table, g.const(np.array([[0, 1]], np.int64)), axis=0)])
    h, res = apply_pass("arith_simplify", g)
    assert not res.modified and ops_of(h) == ops_of(g)


def test_rule_22_keeps_a_broadcast_of_a_large_row_as_a_broadcast():
    """A row repeated past the fold limit stays a small constant and a BroadcastTo."""
    g = Graph()
    ids = _ids(g, (64, 512))
    zeros = op(g, "GatherElements", g.const(np.zeros((64, 512), np.int64)), ids, axis=1)
    table = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    g.set_outputs([op(g, "Gather", g.const(table), zeros, axis=0)])
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert ops_of(h) == ["BroadcastTo"]
    feeds = {"ids": np.zeros((64, 512), np.int64)}
    np.testing.assert_array_equal(run_graph(h, feeds)[0], run_graph(g, feeds)[0])


def test_rule_23_slices_of_different_axes_are_one_slice():
    """Swin's patch merging: every other row, then every other column of those rows, of an
    [B, H, W, C] map: one StridedSlice of the map per quarter (same values)."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 8, 8, 4), "float32"))
    rows = op(g, "StridedSlice", x, begin=[1], end=[2**63 - 1], strides=[2], axes=[1])
    outs = [op(g, "StridedSlice", rows, begin=[b], end=[2**63 - 1], strides=[2], axes=[-2])
            for b in (0, 1)]
    g.set_outputs([op(g, "Concat", *outs, axis=-1)])
    h, res = apply_pass("arith_simplify", g)
    assert "rule 23 slice_of_slice: 2" in res.notes
    h.remove_dead()
    assert ops_of(h) == ["StridedSlice", "StridedSlice", "Concat"]
    assert all(n.inputs[0] is h.inputs[0] for n in h.nodes if n.op == "StridedSlice")
    assert_same_results(g, h)


def test_rule_23_keeps_two_slices_of_one_axis():
    g = Graph()
    x = g.add_input("x", TensorType((2, 8, 4), "float32"))
    a = op(g, "StridedSlice", x, begin=[1], end=[7], strides=[2], axes=[1])
    g.set_outputs([op(g, "StridedSlice", a, begin=[1], end=[3], strides=[1], axes=[1])])
    h, res = apply_pass("arith_simplify", g)
    assert not res.modified and ops_of(h) == ["StridedSlice", "StridedSlice"]


def test_rule_24_float_to_bool_is_a_comparison_with_zero():
    """bool(x) of a float: x != 0, NaN true and -0.0 false as torch has them; a cast of an
    integer to bool, or of a float to another type, is left."""
    g = Graph()
    x = g.add_input("x", TensorType((6,), "float32"))
    i = g.add_input("i", TensorType((6,), "int32"))
    g.set_outputs([op(g, "Cast", x, dtype="bool"), op(g, "Cast", i, dtype="bool"),
                   op(g, "Cast", x, dtype="float16")])
    h, res = apply_pass("arith_simplify", g)
    assert "rule 24 float_to_bool: 1" in res.notes
    h.remove_dead()
    assert sorted(ops_of(h)) == ["Cast", "Cast", "NotEqual"]
    feeds = {"x": np.array([0.0, -0.0, np.nan, 1e-30, -2.0, np.inf], np.float32),
             "i": np.array([0, 1, -1, 2, 0, 3], np.int32)}
    got, want = run_graph(h, feeds), run_graph(g, feeds)
    assert got[0].tolist() == [False, False, True, True, True, True]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_rule_25_slice_of_exactly_one_piece_of_a_concat_is_that_piece():
    """A key written into a buffer as two slice copies (transformers' latent attention):
    the second copy reads back exactly the first piece. A slice spanning two pieces, of
    another axis or with a step is left."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 4, 16, 8), "float32"))
    r = g.add_input("r", TensorType((2, 4, 16, 8), "float32"))
    buf = op(g, "Concat", x, g.const(np.zeros((2, 4, 16, 8), np.float32)), axis=3)
    key = op(g, "Concat", op(g, "StridedSlice", buf, begin=[0], end=[8], strides=[1],
                             axes=[-1]), r, axis=-1)
    across = op(g, "StridedSlice", buf, begin=[4], end=[12], strides=[1], axes=[3])
    stepped = op(g, "StridedSlice", buf, begin=[0], end=[8], strides=[2], axes=[3])
    other = op(g, "StridedSlice", buf, begin=[0], end=[2], strides=[1], axes=[1])
    g.set_outputs([key, across, stepped, other])
    h, res = apply_pass("arith_simplify", g)
    assert "rule 25 slice_of_concat: 1" in res.notes
    h.remove_dead()
    cats = [n for n in h.nodes if n.op == "Concat"]
    assert any(n.inputs[0] is h.inputs[0] and n.inputs[1] is h.inputs[1] for n in cats)
    assert ops_of(h).count("StridedSlice") == 3
    assert_same_results(g, h)


def _written_back(g: Graph, moves: str):
    """Funnel's ``v = y.view(..)[:, :, 1:].view(..)[..., :16]; v *= c`` functionalized: the
    product [4, 32, 32] seen as [2, 4, 32, 16] (through a transpose of an axis of 1), the
    product written back by two slice_scatters (Concats), then read again through the same
    views (``moves``: "identity" the views and transposes back; "swap" a transpose that
    moves data)."""
    y = g.add_input("y", TensorType((4, 32, 32), "float32"))
    c = g.add_input("c", TensorType((2, 4, 16, 16), "float32"))

    def view(v):
        v = op(g, "Reshape", v, shape=[4, 2, 16, 1, 32])
        v = op(g, "Transpose", v, perm=[1, 0, 2, 4, 3])
        return op(g, "Reshape", op(g, "Reshape", v, shape=[2, 4, 16, 32]), shape=[2, 4, 32, 16])

    def region(v):
        rows = op(g, "StridedSlice", v, begin=[1], end=[32], strides=[1], axes=[2])
        return rows, op(g, "StridedSlice", op(g, "Reshape", rows, shape=[2, 4, 16, 31]),
                        begin=[0], end=[16], strides=[1], axes=[3])

    base = view(y)
    rows, inner = region(base)
    scaled = op(g, "Mul", inner, c)
    flat = op(g, "Reshape", rows, shape=[2, 4, 16, 31])
    back = op(g, "Concat", scaled, op(g, "StridedSlice", flat, begin=[16], end=[31],
                                      strides=[1], axes=[3]), axis=3)
    whole = op(g, "Concat", op(g, "StridedSlice", base, begin=[0], end=[1], strides=[1],
                               axes=[2]), op(g, "Reshape", back, shape=[2, 4, 31, 16]), axis=2)
    v = op(g, "Reshape", whole, shape=[2, 4, 16, 32, 1])
    v = op(g, "Transpose", v, perm=[1, 0, 2, 4, 3])
    v = op(g, "Reshape", v, shape=[4, 32, 32])
    if moves == "swap":
        v = op(g, "Transpose", v, perm=[0, 2, 1])
    _, again = region(view(v))
    g.set_outputs([op(g, "Add", again, c)])
    return scaled


def test_rule_25_reads_a_written_back_view_through_views_that_move_nothing():
    """The slices reading the written-back product through views and transposes that put
    every element back where it was are the piece written: both Concats die."""
    g = Graph()
    _written_back(g, "identity")
    h, res = apply_pass("arith_simplify", g)
    assert "rule 25 slice_of_concat: 2" in res.notes
    h.remove_dead()
    assert "Concat" not in ops_of(h)
    assert_same_results(g, h)


def test_rule_25_keeps_a_concat_seen_through_a_transpose_that_moves_data():
    g = Graph()
    _written_back(g, "swap")
    h, res = apply_pass("arith_simplify", g)
    assert not any("slice_of_concat" in n for n in res.notes)
    h.remove_dead()
    assert ops_of(h).count("Concat") == 2
    assert_same_results(g, h)
