"""A transpose next to a normalisation over rows: a convolution's output moved channels-last
and LayerNorm-ed (ConvNeXt's blocks, a patch embedding's `flatten(2).transpose(1, 2)` then
LayerNorm in Swin, SigLIP and ViT-style models, an audio encoder's feature projection), and
a LayerNorm's result cut into windows (Swin's window partition). Each row is reduced within
itself, so the transpose joins the normalising kernel as it joins elementwise work: the
kernel loads the input as it lies and gathers it in UB (or stores the result through the
transposed map), and the transpose is no launch of its own. A reduction over other rows than
the transposed value's stays apart. Checked in the simulator against the reference."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.traffic import launches
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
RNG = np.random.default_rng(11)


def _layer_norm(g: Graph, x, width: int):
    gamma = g.const(RNG.standard_normal(width).astype(np.float32))
    beta = g.const(RNG.standard_normal(width).astype(np.float32))
    attrs = {"begin_norm_axis": -1, "begin_params_axis": -1, "epsilon": 1e-6}
    return g.add_node("LayerNorm", [x, gamma, beta], attrs).outputs[0]


def _moved_then_normed(shape=(2, 16, 4, 4)) -> Graph:
    """ConvNeXt's ``x.permute(0, 2, 3, 1)`` of a [B, C, H, W] value, then LayerNorm over C."""
    g = Graph("moved_norm")
    x = g.add_input("x", TensorType(shape, "float32"))
    t = g.add_node("Transpose", [x], {"perm": [0, 2, 3, 1]}).output
    g.set_outputs([_layer_norm(g, t, shape[1])])
    return g


def _patches_then_normed(shape=(2, 16, 4, 4)) -> Graph:
    """A patch embedding's ``flatten(2).transpose(1, 2)`` then LayerNorm over the channels."""
    g = Graph("patches_norm")
    x = g.add_input("x", TensorType(shape, "float32"))
    b, c, h, w = shape
    f = g.add_node("Reshape", [x], {"shape": [b, c, h * w]}).output
    t = g.add_node("Transpose", [f], {"perm": [0, 2, 1]}).output
    g.set_outputs([_layer_norm(g, t, c)])
    return g


def _normed_then_windows(shape=(2, 8, 8, 16), window=4) -> Graph:
    """Swin's LayerNorm then window partition: [B, H, W, C] viewed as
    [B, H/w, w, W/w, w, C], moved to [B, H/w, W/w, w, w, C] (the channels stay last)."""
    g = Graph("norm_windows")
    x = g.add_input("x", TensorType(shape, "float32"))
    b, h, w, c = shape
    y = _layer_norm(g, x, c)
    y = g.add_node("Reshape", [y], {"shape": [b, h // window, window, w // window, window,
                                              c]}).output
    t = g.add_node("Transpose", [y], {"perm": [0, 1, 3, 2, 4, 5]}).output
    g.set_outputs([g.add_node("Reshape", [t], {"shape": [-1, window * window, c]}).output])
    return g


def _normed_kept_and_windowed(shape=(2, 8, 8, 16), window=4) -> Graph:
    """Swin's first block: the LayerNorm's result is the residual (a graph output here) and,
    cut into windows, the attention's input: the kernel stores both, the windows through the
    transposed map (rows of the channels stay whole)."""
    g = Graph("norm_kept_windows")
    x = g.add_input("x", TensorType(shape, "float32"))
    b, h, w, c = shape
    y = _layer_norm(g, x, c)
    v = g.add_node("Reshape", [y], {"shape": [b, h // window, window, w // window, window,
                                              c]}).output
    t = g.add_node("Transpose", [v], {"perm": [0, 1, 3, 2, 4, 5]}).output
    win = g.add_node("Reshape", [t], {"shape": [-1, window * window, c]}).output
    g.set_outputs([win, y])
    return g


def _windows_merged_plus(shape=(2, 2, 2, 4, 4, 16)) -> Graph:
    """Swin's window merge then the residual: [B, h, w, wh, ww, C] read as
    [B, h, wh, w, ww, C] (its rows of C lie at offsets no one stride reaches), plus a value
    of the merged shape. The kernel gathers the windows in UB."""
    g = Graph("windows_merged")
    x = g.add_input("x", TensorType(shape, "float32"))
    b, h, w, wh, ww, c = shape
    r = g.add_input("r", TensorType((b, h * wh * w * ww, c), "float32"))
    t = g.add_node("Transpose", [x], {"perm": [0, 1, 3, 2, 4, 5]}).output
    v = g.add_node("Reshape", [t], {"shape": [b, h * wh * w * ww, c]}).output
    g.set_outputs([g.add_node("Add", [v, r]).output])
    return g


def _patches_merged_then_normed(shape=(2, 8, 8, 16)) -> Graph:
    """Swin's patch merge: the four positions of each 2 x 2 patch side by side
    ([B, H/2, 2, W/2, 2, C] read as [B, H/2, W/2, 2, 2, C], rows of 4 C), then LayerNorm over
    the 4 C: the kernel gathers the patches in UB and normalises rows of the gathered tile."""
    g = Graph("patch_merge")
    x = g.add_input("x", TensorType(shape, "float32"))
    b, h, w, c = shape
    v = g.add_node("Reshape", [x], {"shape": [b, h // 2, 2, w // 2, 2, c]}).output
    t = g.add_node("Transpose", [v], {"perm": [0, 1, 3, 4, 2, 5]}).output
    m = g.add_node("Reshape", [t], {"shape": [b, h // 2, w // 2, 4 * c]}).output
    g.set_outputs([_layer_norm(g, m, 4 * c)])
    return g


def _normed_then_moved(shape=(2, 12, 16)) -> Graph:
    """LayerNorm over the last axis, then the last two axes swapped (channels first again)."""
    g = Graph("norm_moved")
    x = g.add_input("x", TensorType(shape, "float32"))
    y = _layer_norm(g, x, shape[-1])
    g.set_outputs([g.add_node("Transpose", [y], {"perm": [0, 2, 1]}).output])
    return g


def _run(g: Graph, shape):
    res = graphkernel.compile(g, "", env={})
    feeds = {v.name: RNG.standard_normal(v.shape if v.name != "x" else shape).astype(
        np.float32) for v in g.inputs}
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    want = Interpreter(g).run(feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return res


@pytest.mark.parametrize("make,shape", [(_moved_then_normed, (2, 16, 4, 4)),
                                        (_patches_then_normed, (2, 16, 4, 4)),
                                        (_normed_then_windows, (2, 8, 8, 16)),
                                        (_normed_then_moved, (2, 12, 16)),
                                        (_normed_kept_and_windowed, (2, 8, 8, 16)),
                                        (_windows_merged_plus, (2, 2, 2, 4, 4, 16)),
                                        (_patches_merged_then_normed, (2, 8, 8, 16))])
def test_a_transpose_joins_the_kernel_beside_it(make, shape):
    """One launch (not a transpose kernel and the LayerNorm's or the sum's), the transpose
    inside it, no fallback, and the simulator's numbers match the reference."""
    res = _run(make(), shape)
    ks = launches(res.graph)
    assert len(ks) == 1, ks
    assert "Transpose" in ks[0]["op_list"]
    assert not res.report.extra["fallbacks"]


def test_a_value_beyond_one_gather_keeps_the_transpose_apart():
    """A [2, 64, 256] value moved to [2, 256, 64] is more than one in-UB Gather moves (255
    repeats of 64 floats): the transpose stays a launch of its own beside the LayerNorm, and
    both still match."""
    g = Graph("too_large")
    x = g.add_input("x", TensorType((2, 64, 256), "float32"))
    t = g.add_node("Transpose", [x], {"perm": [0, 2, 1]}).output
    g.set_outputs([_layer_norm(g, t, 64)])
    res = _run(g, (2, 64, 256))
    ks = launches(res.graph)
    assert len(ks) == 2
    assert not any({"Transpose", "ReduceSum"} <= set(k.get("op_list", [k["op"]])) for k in ks)


def test_a_column_reduction_keeps_the_transpose_apart():
    """A sum over the positions (not within a row) of the moved value: the in-UB transpose
    needs one tile of whole rows, so the transpose is not taken into the reducing kernel."""
    g = Graph("columns")
    x = g.add_input("x", TensorType((2, 16, 12), "float32"))
    t = g.add_node("Transpose", [x], {"perm": [0, 2, 1]}).output
    g.set_outputs([g.add_node("ReduceSum", [t], {"axis": [1], "keep_dims": True}).output])
    res = _run(g, (2, 16, 12))
    ks = launches(res.graph)
    assert len(ks) == 2
    assert not any({"Transpose", "ReduceSum"} <= set(k.get("op_list", [k["op"]])) for k in ks)


def test_a_product_normed_then_moved_keeps_the_transpose_out_of_the_mix_kernel():
    """SigLIP's pooling head: a projection, LayerNorm over its rows (one MIX kernel: the
    product and its epilogue), then the result moved sequence-first. A MIX epilogue takes no
    transpose, so the transpose is not joined to that kernel (no fallback, which would run
    the product's epilogue op by op), and the numbers match."""
    g = Graph("product_norm_moved")
    x = g.add_input("x", TensorType((32, 64), "float32"))
    w = g.const(RNG.standard_normal((64, 64)).astype(np.float32) / 8)
    y = _layer_norm(g, g.add_node("MatMul", [x, w]).output, 64)
    y = g.add_node("Reshape", [y], {"shape": [2, 16, 64]}).output
    g.set_outputs([g.add_node("Transpose", [y], {"perm": [1, 0, 2]}).output])
    res = _run(g, (32, 64))
    assert not res.report.extra["fallbacks"]
    assert any(k["kind"] == "mix" for k in launches(res.graph))


def test_a_transposed_bias_read_broadcast_by_a_softmax_stays_apart():
    """Swin's relative-position bias: a ``[N, N, heads]`` table moved to ``[heads, N, N]`` and
    added to every window's scores ``[windows, heads, N, N]`` before their softmax. The
    transposed value is read broadcast there, which a value gathered in UB cannot be: the
    transpose stays out of the softmax's kernel, and no kernel runs op by op."""
    g = Graph("bias_softmax")
    s = g.add_input("s", TensorType((4, 2, 8, 8), "float32"))
    tab = g.add_input("tab", TensorType((8, 8, 2), "float32"))
    t = g.add_node("Transpose", [tab], {"perm": [2, 0, 1]}).output
    y = g.add_node("Add", [s, t]).output
    g.set_outputs([g.add_node("Softmax", [y], {"axis": -1}).output])
    res = graphkernel.compile(g, "", env={})
    assert not res.report.extra["fallbacks"]
    feeds = {"s": RNG.standard_normal((4, 2, 8, 8)).astype(np.float32),
             "tab": RNG.standard_normal((8, 8, 2)).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    want = Interpreter(g).run(feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
