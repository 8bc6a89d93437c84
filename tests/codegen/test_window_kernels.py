"""Window kernels (codegen/window.py, passes/window_fusion.py): 2-D pools and depthwise
convolutions generated in the vector unit with their neighbours, run in the simulator
against the numpy reference; what the generator refuses stays an op of its own, with the
reason in the fusion log."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen import backend
from graphkernel.codegen.backend import run_sim, schedules
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.codegen.window import WindowSchedule
from graphkernel.ops import RESHAPE_OPS
from tests.codegen.cases import Case, compile_cases

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
RNG = np.random.default_rng(5)


def _attrs(k, s, p, **kw):
    return {"kernel_size": [k, k], "strides": [s, s], "pads": [p] * 4, "dilations": [1, 1],
            **kw}


def _mixer(hw=(9, 7), c=8):
    """PoolFormer's token mixer after its norm: r + scale * (avgpool(y) - y), the average
    over the window's elements inside the input (count_include_pad off)."""
    g = Graph("mixer")
    y = g.add_input("y", TensorType((2, c, *hw), "float32"))
    r = g.add_input("r", TensorType((2, c, *hw), "float32"))
    p = g.add_node("AvgPool", [y], _attrs(3, 1, 1, count_include_pad=False)).output
    d = g.add_node("Sub", [p, y]).output
    m = g.add_node("Mul", [d, g.const(RNG.uniform(0.5, 2, (c, 1, 1)).astype("float32"))])
    g.set_outputs([g.add_node("Add", [r, m.output]).output])
    return g


def _stem(hw=(12, 11), c=8, batch=2):
    """A ReLU, then a 3x3 max pool of stride 2 padded by 1 (a residual network's stem)."""
    g = Graph(f"stem_{batch}")
    x = g.add_input("x", TensorType((batch, c, *hw), "float32"))
    y = g.add_node("Maximum", [x, g.const(np.array(0, np.float32))]).output
    g.set_outputs([g.add_node("MaxPool", [y], _attrs(3, 2, 1)).output])
    return g


def _transition(hw=(8, 10), c=8):
    """A 2x2 average pool of stride 2 (a dense network's transition), then a ReLU6 clamp."""
    g = Graph("transition")
    x = g.add_input("x", TensorType((2, c, *hw), "float32"))
    p = g.add_node("AvgPool", [x], _attrs(2, 2, 0)).output
    y = g.add_node("Maximum", [p, g.const(np.array(0, np.float32))]).output
    g.set_outputs([g.add_node("Minimum", [y, g.const(np.array(6, np.float32))]).output])
    return g


def _depthwise(k=3, stride=1, act="relu6", hw=(10, 9), c=8):
    """A depthwise convolution with its bias, then ReLU6 or SiLU (x * sigmoid(x)), and a
    view of the result as [N, C, H*W] (what a following 1x1 product reads)."""
    g = Graph(f"dw{k}")
    x = g.add_input("x", TensorType((2, c, *hw), "float32"))
    w = g.const(RNG.standard_normal((c, 1, k, k)).astype("float32"))
    b = g.const(RNG.standard_normal(c).astype("float32"))
    y = g.add_node("Conv2D", [x, w, b], {"strides": [stride] * 2, "pads": [k // 2] * 4,
                                         "group": c}).output
    if act == "relu6":
        y = g.add_node("Maximum", [y, g.const(np.array(0, np.float32))]).output
        y = g.add_node("Minimum", [y, g.const(np.array(6, np.float32))]).output
    else:
        y = g.add_node("Mul", [y, g.add_node("Sigmoid", [y]).output]).output
    n, _, h, w_ = y.shape
    g.set_outputs([g.add_node("Reshape", [y], {"shape": [n, c, h * w_]}).output])
    return g


def _causal_conv1d(k=4, c=8, length=12, batch=2):
    """A state-space layer's causal depthwise 1-D convolution as it is imported: ``[B, C, L]``
    expanded to planes of one row, padded on the left only, the row squeezed back out, then
    SiLU on ``[B, C, L]``; its result both as it is and expanded for a later broadcast."""
    g = Graph(f"causal{k}_{batch}")
    x = g.add_input("x", TensorType((batch, c, length), "float32"))
    w = g.const(RNG.standard_normal((c, 1, 1, k)).astype("float32"))
    b = g.const(RNG.standard_normal(c).astype("float32"))
    x4 = g.add_node("ExpandDims", [x], {"axis": [2]}).output
    y = g.add_node("Conv2D", [x4, w, b], {"pads": [0, k - 1, 0, 0], "group": c}).output
    y = g.add_node("Squeeze", [y], {"axis": [2]}).output
    s = g.add_node("Mul", [y, g.add_node("Sigmoid", [y]).output]).output
    g.set_outputs([s, g.add_node("ExpandDims", [s], {"axis": [3]}).output])
    return g


def _causal_nhwc(k=4, c=40, length=16, sizes=(24, 8, 8)):
    """A state-space layer's causal depthwise 1-D convolution in channels last (the input
    projection's ``[B, L, C]`` rows read as ``[B, 1, L, C]`` images), its row squeezed out,
    SiLU, then the channels split into parts (the SSM's x, B and C): one window kernel
    writing the parts."""
    g = Graph(f"causal_nhwc{k}")
    x = g.add_input("x", TensorType((2, 1, length, c), "float32"))
    w = g.const(RNG.standard_normal((c, 1, 1, k)).astype("float32"))
    b = g.const(RNG.standard_normal(c).astype("float32"))
    y = g.add_node("Conv2D", [x, w, b], {"pads": [0, k - 1, 0, 0], "group": c,
                                         "data_format": "NHWC"}).output
    y = g.add_node("Squeeze", [y], {"axis": [1]}).output
    s = g.add_node("Mul", [y, g.add_node("Sigmoid", [y]).output]).output
    g.set_outputs(list(g.add_node("Split", [s], {"axis": -1, "sizes": list(sizes)}).outputs))
    return g


def _causal_band(k=4, c=40, sizes=(24, 8, 8), pr=0):
    """The causal convolution of ``_causal_nhwc`` over a symbolic batch ``b`` and length
    ``L`` (``torch.compile(dynamic=True)``): a window kernel in bands of output pixels.
    ``pr``: padding at the end too (an output longer than the input)."""
    g = Graph(f"causal_band{k}_{pr}")
    x = g.add_input("x", TensorType(("b", 1, "L", c), "float32"))
    w = g.const(RNG.standard_normal((c, 1, 1, k)).astype("float32"))
    b = g.const(RNG.standard_normal(c).astype("float32"))
    y = g.add_node("Conv2D", [x, w, b], {"pads": [0, k - 1, 0, pr], "group": c,
                                         "data_format": "NHWC"}).output
    y = g.add_node("Squeeze", [y], {"axis": [1]}).output
    s = g.add_node("Mul", [y, g.add_node("Sigmoid", [y]).output]).output
    if sizes is None:
        g.set_outputs([s])
    else:
        g.set_outputs(list(g.add_node("Split", [s], {"axis": -1, "sizes": list(sizes)})
                           .outputs))
    return g


def _depthwise_nhwc(k=3, stride=2, hw=(9, 8), c=12):
    """A channels-last 2-D depthwise convolution with strides and padding on every side,
    no bias, then ReLU6."""
    g = Graph(f"dw_nhwc{k}")
    x = g.add_input("x", TensorType((2, *hw, c), "float32"))
    w = g.const(RNG.standard_normal((c, 1, k, k)).astype("float32"))
    y = g.add_node("Conv2D", [x, w], {"strides": [stride] * 2, "pads": [k // 2] * 4,
                                      "group": c, "data_format": "NHWC"}).output
    y = g.add_node("Maximum", [y, g.const(np.array(0, np.float32))]).output
    g.set_outputs([g.add_node("Minimum", [y, g.const(np.array(6, np.float32))]).output])
    return g


def _narrow():
    """A 2x2 max pool of stride 3 padded by 1 on planes 2 wide: the first column tap reads
    only padding (no load; the other taps' copies keep their places), then 2 * |x|."""
    g = Graph("narrow")
    x = g.add_input("x", TensorType((2, 3, 8, 2), "float32"))
    p = g.add_node("MaxPool", [x], _attrs(2, 3, 1)).output
    a = g.add_node("Abs", [p]).output
    g.set_outputs([g.add_node("Mul", [a, g.const(np.array(2, np.float32))]).output])
    return g


def _padded(pool="MaxPool", value=0.0, hw=(11, 10), c=4):
    """A constant pad of height and width (top/left 1, bottom/right 2), then a 3x3 pool of
    stride 2 with no padding of its own (BiT's stem), then a clamp to [-1, 6]."""
    g = Graph(f"padded_{pool}")
    x = g.add_input("x", TensorType((2, c, *hw), "float32"))
    y = g.add_node("Pad", [x], {"pads": [0, 0, 1, 1, 0, 0, 2, 2], "value": value}).output
    extra = {"count_include_pad": False} if pool == "AvgPool" else {}
    p = g.add_node(pool, [y], _attrs(3, 2, 0, **extra)).output
    p = g.add_node("Maximum", [p, g.const(np.array(-1, np.float32))]).output
    g.set_outputs([g.add_node("Minimum", [p, g.const(np.array(6, np.float32))]).output])
    return g


CASES = [Case("depthwise_relu6", _depthwise(), flags=""),
         Case("depthwise_5x5_s2_silu", _depthwise(5, 2, "silu", hw=(12, 11)), flags=""),
         Case("poolformer_mixer", _mixer(), flags=""),
         Case("poolformer_mixer_small_plane", _mixer(hw=(2, 2)), flags=""),
         Case("stem_relu_maxpool_s2", _stem(), flags=""),
         Case("transition_avgpool_s2", _transition(), flags=""),
         Case("maxpool_first_tap_all_padding", _narrow(), flags=""),
         Case("pad_then_maxpool", _padded(value=-0.25), flags=""),
         Case("pad_then_avgpool", _padded("AvgPool"), flags=""),
         Case("causal_conv1d_silu", _causal_conv1d(), flags=""),
         Case("causal_conv1d_k3_silu", _causal_conv1d(3, c=6, length=9), flags=""),
         Case("causal_conv1d_nhwc_silu_split", _causal_nhwc(), flags=""),
         # channels not a whole block (rows at a pitch of 40), a part of 12 of them
         Case("causal_conv1d_nhwc_k3_c36", _causal_nhwc(3, 36, 11, (24, 12)), flags=""),
         Case("depthwise_nhwc_3x3_s2_relu6", _depthwise_nhwc(), flags=""),
         # a large-kernel depthwise convolution: padded by 9 columns, more than a block
         Case("depthwise_19x19_padded_by_9", _depthwise(19, hw=(10, 16), c=4), flags="")]


# over a symbolic batch and length: lengths shorter than the halo, of one band per core,
# and longer than a band that fits the UB (the last band shorter)
LENGTHS = [{"b": 2, "L": 16}, {"b": 3, "L": 2}, {"b": 1, "L": 77}, {"b": 2, "L": 3001}]
BAND_CASES = [Case("causal_conv1d_band_silu_split", _causal_band(), flags="", dims=LENGTHS),
              # NCHW planes over a symbolic batch (a static length: Dynamo specialised it)
              Case("causal_conv1d_symbolic_batch", _causal_conv1d(batch="b"), flags="",
                   dims=[{"b": 1}, {"b": 3}, {"b": 7}]),
              Case("stem_relu_maxpool_symbolic_batch", _stem(batch="b"), flags="",
                   dims=[{"b": 1}, {"b": 5}]),
              # channels not a whole block; padded at the end too: L + 2 outputs
              Case("causal_conv1d_band_k3_c36_longer", _causal_band(3, 36, None, pr=2),
                   flags="", dims=LENGTHS)]


@pytest.fixture(scope="module")
def library():
    return compile_cases(CASES + BAND_CASES)


def _window_kernels(case):
    return {k: s for k, s in schedules(case.result).items() if isinstance(s, WindowSchedule)}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_pool_and_its_neighbours_are_one_window_kernel(case, library):
    nodes = [n for n in case.result.graph.nodes if n.op != "Constant"
             and n.op not in RESHAPE_OPS]  # (a view of an input is no launch)
    assert [n.op for n in nodes] == ["GraphKernel"]  # one launch
    assert not case.result.report.extra["fallbacks"]
    assert len(_window_kernels(case)) == 1
    feeds = case.feeds({})
    got, be = run_sim(case.result, feeds, library=library)
    assert not be.unscheduled
    judged = Evaluator(case.graph, feeds).judge(got)
    assert not judged.bad, f"{case.id}: {judged.reason}"


def test_the_pool_reads_its_plane_once(library):
    """GM traffic: the input once (the copies shifted by a column tap are made in UB), the
    output once."""
    case = CASES[2]
    feeds = case.feeds({})
    _, be = run_sim(case.result, feeds, library=library)
    (st,) = be.stats.values()
    plane = 2 * 8 * 9 * 7 * 4
    assert st.input_reads[0] == plane and st.gm_written == plane


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_traffic_model_counts_what_the_simulator_reads(case, library):
    """The GM-traffic model prices a window kernel's reads as the simulator counts them: the
    pool's input once per column tap (the columns its copy holds), the rest once."""
    from graphkernel.codegen.traffic import launches

    feeds = case.feeds({})
    _, be = run_sim(case.result, feeds, library=library)
    (st,) = [st for st in be.stats.values() if st.name in {s.name for s in
                                                          _window_kernels(case).values()}]
    (entry,) = [e for e in launches(case.result.graph) if e["name"] == st.node]
    assert entry["bytes_read"] == sum(st.input_reads)
    assert entry["bytes_written"] == st.gm_written


def test_the_ideal_joins_a_window_op_with_its_elementwise_consumers(library):
    """The traffic model's lower bound: a depthwise convolution with its activation and view
    is one kernel reading its input once; the fused figure is the window kernel's own reads
    (the input once per column tap), so fused/ideal shows the re-reads."""
    case = CASES[0]
    ex = case.result.report.extra
    x, w, b = (v for v in case.graph.nodes if v.op == "Conv2D").__next__().inputs
    once = sum(v.type.nbytes for v in (x, w, b, case.graph.outputs[0]))
    assert ex["gm_bytes_ideal"] == once
    assert ex["gm_bytes_fused"] > once and ex["kernels_ideal"] == ex["kernels_fused"] == 1


def test_a_max_pool_pads_with_the_lowest_float(library):
    """Negative inputs only: a padding of zeros would show in the border windows."""
    case = CASES[4]
    x = -np.abs(RNG.standard_normal((2, 8, 12, 11))).astype(np.float32) - 1
    g = Graph("neg")
    xi = g.add_input("x", TensorType((2, 8, 12, 11), "float32"))
    g.set_outputs([g.add_node("MaxPool", [xi], _attrs(3, 2, 1)).output])
    res = graphkernel.compile(g, "", env={})
    got, _ = run_sim(res, {"x": x})
    want = Evaluator(g, {"x": x})
    assert not want.judge(got).bad
    assert case  # (the stem case covers the ReLU in front)


@pytest.mark.parametrize("value", [0.0, -np.inf])
def test_a_constant_pad_before_a_max_pool_is_its_padding_by_the_pad_value(value):
    """Negative inputs only: the pad's zeros win the border windows (a pool's own padding,
    the lowest float, would not); a pad by -inf is the lowest float. One launch."""
    g = _padded(value=value)
    res = graphkernel.compile(g, "", env={})
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    x = -np.abs(RNG.standard_normal((2, 4, 11, 10))).astype(np.float32) - 1
    got, be = run_sim(res, {"x": x})
    assert not be.unscheduled
    assert not Evaluator(g, {"x": x}).judge(got).bad
    assert (np.asarray(got[0])[..., 0, :] == (0.0 if value == 0.0 else
                                              np.asarray(got[0])[..., 0, :])).all()


@pytest.mark.parametrize("why, pool, pads, value", [
    ("pads [1, 1, 1, 1] of its own", "MaxPool", 1, 0.0),  # two pad values in one window
    ("an average's padding adds 0", "AvgPool", 0, 1.5)])
def test_a_pad_the_window_kernel_cannot_take_stays_an_op_of_its_own(why, pool, pads, value):
    g = Graph("r")
    x = g.add_input("x", TensorType((1, 4, 8, 8), "float32"))
    y = g.add_node("Pad", [x], {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "value": value}).output
    g.set_outputs([g.add_node(pool, [y], _attrs(3, 1, pads)).output])
    res = graphkernel.compile(g, "", env={})
    ops = [n.op for n in res.graph.nodes if n.op != "Constant"]
    assert ops == ["Pad", "GraphKernel"]  # the pool alone is a window kernel
    refused = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"
               and a.verdict == "rejected"]
    assert refused and why in refused[0].reason
    feeds = {"x": RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    assert not Evaluator(g, feeds).judge(got).bad


def test_a_plane_too_large_for_the_unified_buffer_is_refused():
    g = Graph("big")
    x = g.add_input("x", TensorType((1, 2, 200, 200), "float32"))
    g.set_outputs([g.add_node("MaxPool", [x], _attrs(3, 1, 1)).output])
    res = graphkernel.compile(g, "", env={})
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["MaxPool"]
    (att,) = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"]
    assert att.verdict == "rejected" and "bytes of UB" in att.reason


def test_float16_and_dilated_pools_are_refused_with_the_reason():
    for dtype, dil, why in (("float16", 1, "float32"), ("float32", 2, "dilations")):
        g = Graph("r")
        x = g.add_input("x", TensorType((1, 4, 8, 8), dtype))
        a = _attrs(3, 1, 2 if dil > 1 else 1) | {"dilations": [dil, dil]}
        g.set_outputs([g.add_node("MaxPool", [x], a).output])
        res = graphkernel.compile(g, "", env={})
        assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["MaxPool"]
        (att,) = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"]
        assert why in att.reason


def test_a_pool_of_another_consumer_keeps_the_consumer_as_it_was():
    """A reduction reading the pool (a norm) is not an epilogue: the pool is a window
    kernel alone, the consumer its own kernel."""
    g = Graph("n")
    x = g.add_input("x", TensorType((2, 4, 6, 6), "float32"))
    p = g.add_node("AvgPool", [x], _attrs(3, 1, 1)).output
    s = g.add_node("ReduceSum", [g.add_node("Exp", [p]).output], {"axis": [2, 3],
                                                                  "keep_dims": True})
    g.set_outputs([s.output])
    res = graphkernel.compile(g, "", env={})
    kernels = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert [k.attrs["pattern"] for k in kernels][0] == "window_fusion"
    assert len(kernels) == 2
    feeds = {"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    assert not Evaluator(g, feeds).judge(got).bad


def test_a_window_kernel_without_its_barriers_fails_in_the_simulator():
    """The simulator holds the kernel to the vector unit's ordering: the same kernel with its
    PipeBarriers dropped is an error, not a pass."""
    case = Case("stem_broken", _stem(hw=(6, 6)), flags="")
    res = graphkernel.compile(case.graph, "", env={})

    def drop(name, files):
        return {f: t.replace("PipeBarrier<PIPE_V>();", "") for f, t in files.items()}

    backend.CORRUPT.append(drop)
    try:
        with pytest.raises(SimulatorError, match="PipeBarrier"):
            run_sim(res, case.feeds({}))
    finally:
        backend.CORRUPT.remove(drop)


def test_a_per_channel_operand_of_a_view_of_the_planes_stays_out_of_the_epilogue():
    """On the squeezed ``[B, C, L]`` a ``[C, 1]`` operand is a per-channel value of another
    shape than the output's (the kernel places those against the output's own shape only):
    refused with the reason, the add its own kernel, the numbers right."""
    g = Graph("causal_bias")
    x = g.add_input("x", TensorType((2, 4, 10), "float32"))
    w = g.const(RNG.standard_normal((4, 1, 1, 3)).astype("float32"))
    y = g.add_node("Conv2D", [g.add_node("ExpandDims", [x], {"axis": [2]}).output, w],
                   {"pads": [0, 2, 0, 0], "group": 4}).output
    y = g.add_node("Squeeze", [y], {"axis": [2]}).output
    bias = g.const(RNG.standard_normal((4, 1)).astype("float32"))
    g.set_outputs([g.add_node("Add", [y, bias]).output])
    res = graphkernel.compile(g, "", env={})
    (att,) = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"
              and len(a.areas) > 1]
    assert att.verdict == "rejected" and "is neither a plane, a channel value" in att.reason
    feeds = {"x": RNG.standard_normal((2, 4, 10)).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    assert not Evaluator(g, feeds).judge(got).bad


def test_copies_shifted_at_an_unaligned_destination_fail_in_the_simulator():
    """The shift is made at the spread source (a whole-block offset), never at the
    destination: the same kernel writing each copy one element further on starts a
    BlockReduceMax destination off its 32-byte block, an error, not a pass."""
    import re

    case = Case("mixer_broken", _mixer(), flags="")
    res = graphkernel.compile(case.graph, "", env={})

    def shift_dst(name, files):
        return {f: re.sub(r"BlockReduceMax\(x\[(\d+) \+ q\]", r"BlockReduceMax(x[\1 + q + 1]", t)
                for f, t in files.items()}

    backend.CORRUPT.append(shift_dst)
    try:
        with pytest.raises(SimulatorError, match="is not 32-byte aligned"):
            run_sim(res, case.feeds({}))
    finally:
        backend.CORRUPT.remove(shift_dst)


def test_a_left_padding_wider_than_a_brcb_can_spread_is_refused():
    """The guard before the plane is spread with every chunk: a padding of more columns than
    one Brcb's 255 repeats take (with the smallest chunk) is refused with the reason, and
    the convolution stays an op of its own."""
    g = Graph("wide")
    x = g.add_input("x", TensorType((1, 2, 1, 8), "float32"))
    w = g.const(RNG.standard_normal((2, 1, 1, 3)).astype("float32"))
    g.set_outputs([g.add_node("Conv2D", [x, w], {"pads": [0, 2100, 0, 0], "group": 2})
                   .output])
    res = graphkernel.compile(g, "", env={})
    (att,) = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"]
    assert att.verdict == "rejected" and "more than 255 repeats" in att.reason
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["Conv2D"]


def test_a_channels_last_split_part_off_a_block_stays_a_split_with_the_reason():
    """A part starting at channel 12 (not on a 32-byte block): the kernel writes the SiLU's
    result and the Split stays an op of its own; outputs still match."""
    g = _causal_nhwc(sizes=(12, 28))
    res = graphkernel.compile(g, "", env={})
    assert [n.op for n in res.graph.nodes if n.op not in ("Constant", *RESHAPE_OPS)] == \
        ["GraphKernel", "Split"]
    refused = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"
               and a.verdict == "rejected"]
    assert refused and "starts at channel 12, not on a 32-byte block" in refused[0].reason
    feeds = {"x": RNG.standard_normal((2, 1, 16, 40)).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    assert not Evaluator(g, feeds).judge(got).bad


def test_a_channels_last_convolution_reads_its_image_once_and_its_weights_once_per_core(
        library):
    """GM traffic: the image once (every tap a whole row of its padded copy in UB), the
    weights and bias once per core taking images (2 images: 2 cores), the parts once."""
    case = next(c for c in CASES if c.id == "causal_conv1d_nhwc_silu_split")
    _, be = run_sim(case.result, case.feeds({}), library=library)
    (st,) = be.stats.values()
    image, weights, bias = 2 * 16 * 40 * 4, 40 * 4 * 4, 40 * 4
    assert sorted(st.input_reads) == sorted([image, 2 * weights, 2 * bias])
    assert st.gm_written == image


@pytest.mark.parametrize("case", BAND_CASES, ids=[c.id for c in BAND_CASES])
def test_a_window_over_a_symbolic_length_or_batch_is_one_window_kernel(case, library):
    """One compile serves every size: the host tiling reads N and L from the shapes and
    splits the images into bands (with a halo of k-1 pixels), or counts the planes of a
    symbolic batch; outputs match the reference at each size, the last band of an image
    shorter, lengths shorter than the halo too."""
    nodes = [n for n in case.result.graph.nodes if n.op != "Constant"
             and n.op not in RESHAPE_OPS]
    assert [n.op for n in nodes] == ["GraphKernel"]
    assert not case.result.report.extra["fallbacks"]
    (s,) = _window_kernels(case).values()
    if s.nhwc:
        assert 1 < s.band < 3001  # (a long length takes several bands)
    for dims in case.dims:
        feeds = {"x": RNG.standard_normal(case.graph.inputs[0].type.concrete(dims))
                 .astype(np.float32)}
        got, be = run_sim(case.result, feeds, library=library)
        judged = Evaluator(case.graph, feeds).judge(got)
        assert not judged.bad, f"{case.id} at {dims}: {judged.reason}"
        (st,) = be.stats.values()
        # the input once (and each band's halo inside the image once more)
        assert st.input_reads[0] >= feeds["x"].nbytes
        if not s.nhwc:  # the planes, counted by the host from the batch
            assert st.tiling["units"] == dims["b"] * s.channels


def test_bands_fill_the_cores_and_reread_only_their_halo(library):
    """One image of 77 pixels: one band per vector core; each band reads its own pixels and
    the k-1 before it (inside the image), so the input is read once plus 3 pixels a band."""
    case = BAND_CASES[0]
    feeds = {"x": RNG.standard_normal((1, 1, 77, 40)).astype(np.float32)}
    _, be = run_sim(case.result, feeds, library=library)
    (st,) = be.stats.values()
    from graphkernel.codegen import targets

    cores = targets.load(case.result.config.target).aiv_cores
    band = -(-77 // min(cores, 77))
    starts = range(0, 77, band)
    assert st.block_dim == min(cores, len(starts))
    # band [o, o + band): its pixels and the 3 before it that lie in the image
    pixels = sum(min(o + band, 77) - max(o - 3, 0) for o in starts)
    assert st.input_reads[0] == pixels * 40 * 4
    assert st.gm_written == 77 * 40 * 4


def test_a_symbolic_two_dimensional_depthwise_convolution_is_refused_with_the_reason():
    """Over a symbolic size a window kernel takes images of one row (bands along the
    length); a 2-D image stays a convolution of its own, with the reason logged."""
    g = Graph("dw_sym2d")
    x = g.add_input("x", TensorType(("b", 5, "L", 8), "float32"))
    w = g.const(RNG.standard_normal((8, 1, 3, 3)).astype("float32"))
    g.set_outputs([g.add_node("Conv2D", [x, w], {"pads": [1, 1, 1, 1], "group": 8,
                                                 "data_format": "NHWC"}).output])
    res = graphkernel.compile(g, "", env={})
    refused = [a for a in res.analyses.fusion_attempts if a.pattern == "window_fusion"]
    assert refused and refused[0].verdict == "rejected"
    assert "takes images of one row" in refused[0].reason
