"""conv_bn_fold: a constant per-output-channel Mul/Add after a convolution goes into its
weights and bias; anything else (a factor varying along H, another reader, a parameter that
is a graph input) is left alone."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, ops_of

RNG = np.random.default_rng(3)


def conv_graph(tail, bias=True, groups=1, fmt="NCHW", weight_input=False):
    g = Graph("t")
    shape = (2, 4, 6, 5) if fmt == "NCHW" else (2, 6, 5, 4)
    x = g.add_input("x", TensorType(shape, "float32"))
    w_arr = RNG.standard_normal((6, 4 // groups, 3, 3)).astype(np.float32)
    w = g.add_input("w", TensorType(w_arr.shape, "float32")) if weight_input else g.const(w_arr)
    ins = [x, w] + ([g.const(RNG.standard_normal(6).astype(np.float32))] if bias else [])
    y = g.add_node("Conv2D", ins, {"pads": [1, 1, 1, 1], "group": groups,
                                   "data_format": fmt}).output
    g.set_outputs(tail(g, y))
    return g


def close(before, after):
    """Equal up to the rounding of products on scaled weights (an ulp of the output's
    scale: a sum of nine signed terms may cancel to far below its terms)."""
    for seed in (0, 1):
        feeds = random_inputs(before, seed)
        for a, b in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * float(np.abs(a).max()))


def vec(g, shape):
    return g.const(RNG.uniform(0.5, 2, shape).astype(np.float32))


def affine(shape):
    def tail(g, y):
        z = g.add_node("Mul", [y, vec(g, shape)]).output
        return [g.add_node("Relu", [g.add_node("Add", [z, vec(g, shape)]).output]).output]
    return tail


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("shape", [(6, 1, 1), (1, 6, 1, 1), (1,)])
def test_batch_norm_affine_folds_into_the_convolution(bias, groups, shape):
    g = conv_graph(affine(shape), bias, groups)
    out, res = apply_pass("conv_bn_fold", g)
    assert res.modified and res.rewrites == 2
    assert ops_of(out) == ["Conv2D", "ReLU"]
    assert len(next(n for n in out.nodes if n.op == "Conv2D").inputs) == 3
    close(g, out)


def test_channels_last_convolution_folds_along_its_last_axis():
    g = conv_graph(affine((6,)), fmt="NHWC")
    out, res = apply_pass("conv_bn_fold", g)
    assert res.rewrites == 2 and ops_of(out) == ["Conv2D", "ReLU"]
    close(g, out)


@pytest.mark.parametrize("case", ["along_h", "two_readers", "graph_output", "weight_input"])
def test_left_alone(case):
    if case == "along_h":  # a factor per row, not per channel
        g = conv_graph(lambda g, y: [g.add_node("Mul", [y, vec(g, (6, 1))]).output])
    elif case == "two_readers":  # the convolution's output is read elsewhere too
        g = conv_graph(lambda g, y: [g.add_node("Mul", [y, vec(g, (6, 1, 1))]).output, y])
    elif case == "graph_output":
        g = conv_graph(lambda g, y: [g.add_node("Add", [y, vec(g, (6, 1, 1))]).output, y])
    else:  # weights not frozen: a graph input
        g = conv_graph(affine((6, 1, 1)), weight_input=True)
    out, res = apply_pass("conv_bn_fold", g)
    assert not res.modified and ops_of(out) == ops_of(g)
