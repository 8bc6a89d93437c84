"""channels_last: convolutions between layout permutes run in NHWC, the permutes cancel."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.traffic import launches
from graphkernel.explain import explain, format_explain
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.verify import tolerance
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
RNG = np.random.default_rng(0)


def op(g, name, *ins, **attrs):
    return g.add_node(name, list(ins), attrs).output


def depthwise(g, x, c=8):
    w = g.const(RNG.standard_normal((c, 1, 3, 3)).astype(np.float32))
    return g.add_node("Conv2D", [x, w], {"pads": [1, 1, 1, 1], "group": c},
                      name="dwconv").output


def convnext_block() -> Graph:
    """ConvNeXt's block: NHWC data permuted to NCHW for the depthwise convolution and back,
    a per-channel scale in NHWC, the residual added in NCHW."""
    g = Graph("block")
    h = g.add_input("h", TensorType((2, 6, 5, 8), "float32"))
    x = op(g, "Transpose", op(g, "Exp", h), perm=TO_NCHW)
    y = op(g, "Transpose", depthwise(g, x), perm=TO_NHWC)
    y = op(g, "Mul", y, g.const(RNG.standard_normal(8).astype(np.float32)))
    g.set_outputs([op(g, "Add", x, op(g, "Transpose", y, perm=TO_NCHW))])
    return g


def audio_block() -> Graph:
    """wav2vec2's positional convolution: [batch, time, channels] transposed, a 1-D
    convolution as a Conv2D of height 1, an activation, transposed back, the residual."""
    g = Graph("audio")
    x = g.add_input("x", TensorType((2, 9, 8), "float32"))
    t = op(g, "ExpandDims", op(g, "Transpose", x, perm=[0, 2, 1]), axis=[2])
    w = g.const(RNG.standard_normal((8, 2, 1, 4)).astype(np.float32))
    b = g.const(RNG.standard_normal(8).astype(np.float32))
    y = g.add_node("Conv2D", [t, w, b], {"pads": [0, 2, 0, 1], "group": 4},
                   name="posconv").output
    y = op(g, "Tanh", op(g, "Squeeze", y, axis=[2]))
    g.set_outputs([op(g, "Add", x, op(g, "Transpose", y, perm=[0, 2, 1]))])
    return g


def all_nodes(g: Graph) -> list:
    """The graph's nodes and those inside its kernels."""
    return [m for n in g.nodes for m in (n.subgraph.nodes if n.op == "GraphKernel" else [n])]


def transposes(g: Graph) -> int:
    return sum(n.op == "Transpose" for n in g.nodes)


def conv_of(g: Graph):
    return next(n for n in all_nodes(g) if n.op == "Conv2D")


def test_convnext_block_runs_its_convolution_in_nhwc():
    g = convnext_block()
    h, res = apply_pass("channels_last", g)
    h.remove_dead()
    assert res.modified and conv_of(h).attrs["data_format"] == "NHWC"
    # the two permutes around the convolution cancel; the residual add moves to NHWC and
    # one transpose to NCHW is left, for the graph's NCHW output
    assert transposes(g) == 3 and transposes(h) == 1
    assert h.outputs[0].producer.op == "Transpose"
    assert ops_of(h).count("Add") == 1
    assert "dwconv: NHWC: 3 -> 1 Transposes in the graph; next to transpose" in res.notes
    assert_same_results(g, h, exact=False)


def test_audio_block_moves_transposes_through_views_and_elementwise_ops():
    g = audio_block()
    h, res = apply_pass("channels_last", g)
    h.remove_dead()
    assert conv_of(h).attrs["data_format"] == "NHWC"
    assert transposes(h) == 0, h
    assert ops_of(h) == ["ExpandDims", "Conv2D", "Squeeze", "Tanh", "Add"]
    assert_same_results(g, h, exact=False)


def test_a_convolution_gaining_nothing_stays_nchw_and_says_why():
    """An NCHW graph input and one permute after: NHWC would only move the permute."""
    g = Graph("t")
    x = g.add_input("x", TensorType((2, 8, 6, 5), "float32"))
    g.set_outputs([op(g, "Transpose", depthwise(g, x), perm=TO_NHWC)])
    h, res = apply_pass("channels_last", g)
    assert not res.modified and conv_of(h).attrs["data_format"] == "NCHW"
    assert res.notes == ["dwconv: NCHW: NHWC would leave 1 Transposes in the graph, NCHW "
                         "leaves 1"]


def test_a_convolution_without_permutes_is_left_alone():
    g = Graph("t")
    x = g.add_input("x", TensorType((2, 8, 6, 5), "float32"))
    g.set_outputs([op(g, "Relu", depthwise(g, x))])
    h, res = apply_pass("channels_last", g)
    assert not res.modified and res.notes == [] and conv_of(h).attrs["data_format"] == "NCHW"


def test_convolutions_feeding_each_other_switch_together():
    """Alone, each of two chained convolutions would trade one permute for another; together
    the permute between them is never needed."""
    g = Graph("t")
    h0 = g.add_input("h", TensorType((2, 6, 5, 8), "float32"))
    x = op(g, "Transpose", op(g, "Exp", h0), perm=TO_NCHW)
    w = g.const(RNG.standard_normal((8, 8, 1, 1)).astype(np.float32))
    y = g.add_node("Conv2D", [x, w], {}, name="pointwise").output
    y = depthwise(g, y)
    g.set_outputs([op(g, "Exp", op(g, "Transpose", y, perm=TO_NHWC))])
    h, res = apply_pass("channels_last", g)
    h.remove_dead()
    assert transposes(h) == 0
    assert {n.attrs["data_format"] for n in h.nodes if n.op == "Conv2D"} == {"NHWC"}
    assert any("(switched together with dwconv)" in n for n in res.notes), res.notes
    assert_same_results(g, h, exact=False)


@pytest.mark.parametrize("build", [convnext_block, audio_block])
def test_pipeline_on_and_off_compute_the_same(build):
    g = build()
    on = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=channels_last", env={})
    assert {n.attrs["data_format"] for n in all_nodes(on.graph) if n.op == "Conv2D"} == {"NHWC"}
    # (kept NCHW, the depthwise convolution is a window kernel: a Conv2D inside a kernel)
    assert {n.attrs["data_format"] for n in all_nodes(off.graph) if n.op == "Conv2D"} == \
        {"NCHW"}
    rec = next(p for p in off.report.passes if p.name == "channels_last")
    assert not rec.ran and rec.reason.startswith("disabled by --disable_pass=channels_last")
    # (kept NCHW, its transposes are gathered in UB by the kernels around them: still work)
    moved = lambda r: sum(n.op == "Transpose" for n in all_nodes(r.graph))  # noqa: E731
    assert moved(on) < moved(off)
    assert len(launches(on.graph)) < len(launches(off.graph))
    rtol, atol = tolerance("float32")  # (the convolution sums in another order in NHWC)
    for seed in (0, 1):
        feeds = random_inputs(g, seed)
        want = run_graph(g, feeds)
        for got in (run_graph(on.graph, feeds), run_graph(off.graph, feeds)):
            np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)


def test_explain_has_a_convolution_layouts_section():
    res = graphkernel.compile(convnext_block(), "--opt_level=2", env={})
    text = format_explain(explain(res))
    assert "convolution layouts (channels_last):" in text
    assert "  NHWC  dwconv: 3 -> 1 Transposes in the graph; next to transpose" in text
    assert explain(res, "pointwise")["layouts"] == []
    assert [c["conv"] for c in explain(res, "dwconv")["layouts"]] == ["dwconv"]
    off = graphkernel.compile(convnext_block(), "--opt_level=2 --disable_pass=channels_last",
                              env={})
    assert "convolution layouts" not in format_explain(explain(off))


def test_bisect_can_refuse_the_rewrite():
    res = graphkernel.compile(convnext_block(),
                              "--opt_level=2 --bisect_pass=channels_last --bisect_limit=0",
                              env={})
    assert conv_of(res.graph).attrs["data_format"] == "NCHW"
    assert [(c.conv, c.layout, c.reason) for c in res.analyses.layouts] == [
        ("dwconv", "NCHW", "bisect refused the rewrite")]


def test_a_transpose_does_not_pass_a_layout_bound_op():
    """BiasAdd(NCHW) adds along axis 1 whatever the data is: moving a transpose through it
    would add the bias along another axis. The convolution then gains nothing."""
    g = Graph("t")
    h0 = g.add_input("h", TensorType((2, 6, 5, 8), "float32"))
    y = depthwise(g, op(g, "Transpose", op(g, "Exp", h0), perm=TO_NCHW))
    bias = g.const(RNG.standard_normal(8).astype(np.float32))
    y = op(g, "BiasAdd", y, bias, data_format="NCHW")
    g.set_outputs([op(g, "Transpose", y, perm=TO_NHWC)])
    h, res = apply_pass("channels_last", g)
    assert conv_of(h).attrs["data_format"] == "NCHW"
    assert_same_results(g, h)


def conv_norm_stack(layers: int = 3, c: int = 8, t: int = 9) -> Graph:
    """A stack of 1-D grouped convolutions over [batch, time, channels] data, each followed
    by a LayerNorm over the channels written as the models write it (transposed to
    [batch, time, channels], normalised, transposed back) and a GELU in [batch, channels,
    time] (data2vec-audio's positional convolutions); the stack's input and output in
    [batch, time, channels]."""
    g = Graph("stack")
    x = g.add_input("x", TensorType((2, t, c), "float32"))
    h = op(g, "Transpose", x, perm=[0, 2, 1])
    for i in range(layers):
        w = g.const(RNG.standard_normal((c, c // 4, 1, 5)).astype(np.float32))
        b = g.const(RNG.standard_normal(c).astype(np.float32))
        y = g.add_node("Conv2D", [op(g, "ExpandDims", h, axis=[2]), w, b],
                       {"pads": [0, 2, 0, 2], "group": 4}, name=f"conv{i}").output
        y = op(g, "Transpose", op(g, "Squeeze", y, axis=[2]), perm=[0, 2, 1])
        scale = g.const(np.ones(c, np.float32))
        shift = g.const(np.zeros(c, np.float32))
        y = g.add_node("LayerNorm", [y, scale, shift], {}).outputs[0]
        h = op(g, "GeLU", op(g, "Transpose", y, perm=[0, 2, 1]))
    g.set_outputs([op(g, "Transpose", h, perm=[0, 2, 1])])
    return g


def activation_stack(act_out: bool = False) -> Graph:
    """Two 1-D convolutions over [batch, time, channels] data; the first one's result
    transposed to [batch, time, channels] (an Exp there), transposed back and put through
    x * tanh(x) * scale (a per-channel constant [channels, 1]) before the second: the second
    convolution's input permute has to pass an elementwise op with two computed operands
    and a constant to meet its inverse. ``act_out``: that activation is a graph output too."""
    g = Graph("act")
    x = g.add_input("x", TensorType((2, 9, 8), "float32"))
    h = op(g, "Transpose", x, perm=[0, 2, 1])
    outs = []
    for i in range(2):
        w = g.const(RNG.standard_normal((8, 2, 1, 3)).astype(np.float32))
        y = g.add_node("Conv2D", [op(g, "ExpandDims", h, axis=[2]), w],
                       {"pads": [0, 1, 0, 1], "group": 4}, name=f"conv{i}").output
        y = op(g, "Exp", op(g, "Transpose", op(g, "Squeeze", y, axis=[2]), perm=[0, 2, 1]))
        if i == 0:
            z = op(g, "Transpose", y, perm=[0, 2, 1])
            scale = g.const(RNG.standard_normal((8, 1)).astype(np.float32))
            h = op(g, "Mul", op(g, "Mul", z, op(g, "Tanh", z)), scale)
            outs += [h] if act_out else []
    g.set_outputs([y, *outs])
    return g


def test_a_permute_moves_up_through_elementwise_ops_to_meet_its_inverse():
    """Each convolution's new input permute climbs through x * tanh(x) * scale (both
    operands transposed, the constant transposed at once) and cancels the permute that
    ends the layer before; every convolution runs in NHWC and no permute is left."""
    g = activation_stack()
    h, res = apply_pass("channels_last", g)
    h.remove_dead()
    assert {n.attrs["data_format"] for n in h.nodes if n.op == "Conv2D"} == {"NHWC"}
    assert transposes(g) == 4 and transposes(h) == 0
    assert any(n.startswith("conv1: NHWC: ") for n in res.notes), res.notes
    assert_same_results(g, h, exact=False, rtol=1e-6)


def test_a_permute_does_not_climb_past_a_value_read_elsewhere():
    """When the activation's result is also a graph output, hoisting the permute above it
    would compute it twice: it stays, and the second convolution gains nothing."""
    g = activation_stack(act_out=True)
    h, res = apply_pass("channels_last", g)
    h.remove_dead()
    assert any(n.startswith("conv1: NCHW: ") for n in res.notes), res.notes
    assert_same_results(g, h, exact=False, rtol=1e-6)


def test_a_permute_stops_at_an_operand_of_lower_rank():
    """An operand computed at a lower rank (broadcast from the left) would need a reshape
    before it could be transposed: the permute stays above the op, the results the same."""
    g = Graph("t")
    x = g.add_input("x", TensorType((2, 9, 8), "float32"))
    v = g.add_input("v", TensorType((9,), "float32"))
    h = op(g, "Transpose", x, perm=[0, 2, 1])
    w = g.const(RNG.standard_normal((8, 2, 1, 3)).astype(np.float32))
    y = g.add_node("Conv2D", [op(g, "ExpandDims", op(g, "Mul", h, op(g, "Exp", v)), axis=[2]),
                              w], {"pads": [0, 1, 0, 1], "group": 4}, name="conv").output
    g.set_outputs([op(g, "Transpose", op(g, "Squeeze", y, axis=[2]), perm=[0, 2, 1])])
    h2, res = apply_pass("channels_last", g)
    h2.remove_dead()
    assert any(n.op == "Mul" and n.inputs[0].producer.op == "Transpose" for n in h2.nodes)
    assert_same_results(g, h2, exact=False, rtol=1e-6)


def test_a_stack_of_convolutions_with_channel_norms_is_one_vector_kernel_a_layer():
    """Through the pipeline: the LayerNorm between permutes reduces the last axis of NHWC
    data once the convolutions run in NHWC, so each layer's norm and GELU are one vector
    kernel (with the permutes left, the norm reduced a middle axis and took six)."""
    g = conv_norm_stack(layers=3)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    kinds = [e["kind"] for e in launches(res.graph)]
    assert kinds.count("vector") == 3 and len(kinds) == 6, launches(res.graph)
    assert not any(n.op == "Transpose" for n in all_nodes(res.graph))
    for seed in (0, 1):
        feeds = random_inputs(g, seed)
        np.testing.assert_allclose(run_graph(res.graph, feeds)[0], run_graph(g, feeds)[0],
                                   rtol=1e-4, atol=1e-5)
