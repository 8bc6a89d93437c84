"""conv_matmul: a 1x1 convolution (one group, no pads, stride 1) is a product of its channels
(NCHW: a batched product with the weight shared by the batch; NHWC: pixels as rows) with the
same values; other convolutions stay convolutions, each with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, ops_of

RNG = np.random.default_rng(5)


def conv_graph(k=1, fmt="NCHW", bias="const", weight_input=False, group=1, pads=0, stride=1,
               hw=(6, 5), batch=2):
    g = Graph("t")
    c, m = 8, 12
    shape = (batch, c, *hw) if fmt == "NCHW" else (batch, *hw, c)
    x = g.add_input("x", TensorType(shape, "float32"))
    w_arr = RNG.standard_normal((m, c // group, k, k)).astype(np.float32)
    w = g.add_input("w", TensorType(w_arr.shape, "float32")) if weight_input else g.const(w_arr)
    ins = [x, w]
    if bias == "const":
        ins.append(g.const(RNG.standard_normal(m).astype(np.float32)))
    elif bias == "input":
        ins.append(g.add_input("b", TensorType((m,), "float32")))
    y = g.add_node("Conv2D", ins, {"pads": [pads] * 4, "group": group, "data_format": fmt,
                                   "strides": [stride, stride]}).output
    g.set_outputs([g.add_node("Relu", [y]).output])
    return g


def same(before, after):
    for seed in (0, 1):
        feeds = random_inputs(before, seed)
        for a, b in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", ["const", "input", None])
def test_nchw_one_by_one_is_a_batched_product(bias):
    g = conv_graph(bias=bias)
    out, res = apply_pass("conv_matmul", g)
    assert res.modified and res.rewrites == 1
    ops = ops_of(out)
    assert "Conv2D" not in ops and "BatchMatMul" in ops
    mm = next(n for n in out.nodes if n.op == "BatchMatMul")
    assert tuple(mm.inputs[0].shape) == (12, 8) and tuple(mm.inputs[1].shape) == (2, 8, 30)
    assert ("Add" in ops) == (bias is not None)
    same(g, out)


def test_nhwc_one_by_one_is_a_product_of_pixels():
    g = conv_graph(fmt="NHWC", bias="const")
    out, res = apply_pass("conv_matmul", g)
    assert res.rewrites == 1
    mm = next(n for n in out.nodes if n.op == "MatMul")
    assert tuple(mm.inputs[0].shape) == (60, 8) and mm.attrs["transpose_b"]
    same(g, out)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_one_pixel_per_image_is_a_product_of_the_images(fmt):
    """A squeeze-and-excitation block's convolution on the pooled channels: the images are
    the rows of a 2-D product (its bias then a row of the tile, its gate in the epilogue)."""
    g = conv_graph(fmt=fmt, hw=(1, 1), batch=3)
    out, res = apply_pass("conv_matmul", g)
    assert res.rewrites == 1 and "Conv2D" not in ops_of(out)
    mm = next(n for n in out.nodes if n.op == "MatMul")
    assert tuple(mm.inputs[0].shape) == (3, 8) and tuple(mm.inputs[1].shape) == (12, 8)
    assert mm.attrs["transpose_b"]
    same(g, out)


@pytest.mark.parametrize(("kw", "why"), [
    ({"k": 3, "pads": 1}, "a 3x3 kernel"),
    ({"group": 2}, "2 groups"),
    ({"pads": 1}, "pads [1, 1, 1, 1]"),
    ({"stride": 2}, "strides [2, 2]"),
    ({"weight_input": True}, "weights that are not constants"),
    ({"hw": (1, 1), "batch": 1}, "one pixel of one image"),
])
def test_other_convolutions_stay_convolutions_with_the_reason(kw, why):
    g = conv_graph(**kw)
    out, res = apply_pass("conv_matmul", g)
    assert not res.modified and ops_of(out) == ops_of(g)
    if kw.get("k", 1) == 1:
        assert any(why in note for note in res.notes), res.notes


def test_explain_shows_each_decision():
    import graphkernel
    from graphkernel.explain import explain, format_explain

    g = conv_graph()
    text = format_explain(explain(graphkernel.compile(g, "--opt_level=2", env={})))
    assert "1x1 convolutions (conv_matmul):" in text and "product" in text
    g = conv_graph(stride=2)
    d = explain(graphkernel.compile(g, "--opt_level=2", env={}))
    assert [c["verdict"] for c in d["conv_products"]] == ["kept"]
    assert "strides [2, 2]" in d["conv_products"][0]["reason"]
    off = graphkernel.compile(conv_graph(), "--opt_level=2 --disable_pass=conv_matmul", env={})
    body = {m.op for n in off.graph.nodes if n.op == "GraphKernel" for m in n.subgraph.nodes}
    ops = {n.op for n in off.graph.nodes} | body  # (a convolution kernel's, conv_fusion)
    assert "Conv2D" in ops and not ops & {"MatMul", "BatchMatMul"}
