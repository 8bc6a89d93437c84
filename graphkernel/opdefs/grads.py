"""Composite gradient ops of training graphs (expanded by expanders/grads.py)."""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from graphkernel.errors import ShapeError
from graphkernel.opdefs.activations import GeLUAttrs, SoftplusAttrs
from graphkernel.opdefs.arithmetic import BiasAddAttrs, channel_axis
from graphkernel.opdefs.composite import composite, elementwise, erf, sigmoid
from graphkernel.opdefs.norms import LayerNormAttrs, SoftmaxAttrs, ln_axes, softmax_axes
from graphkernel.opdefs.pooling import window_out
from graphkernel.opdefs.reduce import float_sum
from graphkernel.ops import Attrs, OpKind, check_dtype
from graphkernel.tensor_types import TensorType

G = "grad"
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def gelu_grad(dy, x, y, approximate="none"):
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
        t = np.tanh(u)
        du = SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)
    cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return dy * (cdf + x * pdf)


def fast_gelu_grad(dy, x):
    """FastGeLU(x) = x * sigmoid(1.702 x) on both sides of 0."""
    s = sigmoid(1.702 * x)
    return dy * (s + 1.702 * x * s * (1 - s))


def silu_grad(dy, x):
    s = sigmoid(x)
    return dy * (s + x * s * (1 - s))


def softplus_grad(dy, x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, dy, dy * sigmoid(beta * x))


elementwise("ReluGrad", 2, lambda dy, x: np.where(x > 0, dy, 0), cls="numeric", category=G)
elementwise("SigmoidGrad", 2, lambda y, dy: dy * y * (1 - y), category=G)
elementwise("TanhGrad", 2, lambda y, dy: dy * (1 - y * y), category=G)
elementwise("SqrtGrad", 2, lambda y, dy: dy / (2 * y), category=G)
elementwise("RsqrtGrad", 2, lambda y, dy: -0.5 * dy * y ** 3, category=G)
elementwise("GeLUGrad", 3, gelu_grad, GeLUAttrs, aliases=("GeluGrad",), category=G)
elementwise("FastGeLUGrad", 2, fast_gelu_grad, aliases=("FastGeluGrad",), category=G)
elementwise("SiLUGrad", 2, silu_grad, aliases=("SiLUGradExt",), category=G)
elementwise("SoftplusGrad", 2, softplus_grad, SoftplusAttrs, aliases=("SoftplusGradExt",),
            category=G)
elementwise("SigmoidCrossEntropyWithLogitsGrad", 3,
            lambda x, y, dout: (sigmoid(x) - y) * dout, category=G)


def _bias_add_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy = ins[0]
    check_dtype(dy, "numeric")
    c = channel_axis(dy.rank, attrs["data_format"])
    return [TensorType((dy.shape[c],), dy.dtype)]


def _bias_add_grad_ref(xs, a, ctx):
    dy = xs[0]
    c = channel_axis(dy.ndim, a["data_format"])
    return float_sum(dy, tuple(i for i in range(dy.ndim) if i != c))


composite("BiasAddGrad", (1, 1), _bias_add_grad_infer, _bias_add_grad_ref, BiasAddAttrs,
          category=G, kind=OpKind.REDUCE)


def _softmax_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    y, dy = ins
    check_dtype(y, "float")
    if y != dy:
        raise ShapeError(f"y {y} and dy {dy} must have the same type")
    softmax_axes(y.rank, attrs["axis"])
    return [y]


def _softmax_grad_ref(xs, a, ctx):
    y, dy = xs
    ax = softmax_axes(y.ndim, a["axis"])
    return (dy - (dy * y).sum(axis=ax, keepdims=True)) * y


def _log_softmax_grad_ref(xs, a, ctx):
    y, dy = xs
    ax = softmax_axes(y.ndim, a["axis"])
    return dy - np.exp(y) * dy.sum(axis=ax, keepdims=True)


composite("SoftmaxGrad", (2, 2), _softmax_grad_infer, _softmax_grad_ref, SoftmaxAttrs,
          category=G, kind=OpKind.REDUCE)
composite("LogSoftmaxGrad", (2, 2), _softmax_grad_infer, _log_softmax_grad_ref, SoftmaxAttrs,
          category=G, kind=OpKind.REDUCE)


def _ln_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy, x, var, mean, gamma = ins
    check_dtype(x, "float")
    if dy != x:
        raise ShapeError(f"dy {dy} and x {x} must have the same type")
    axes, p = ln_axes(x.rank, attrs)
    stat = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    for name, t in (("var", var), ("mean", mean)):
        if t.shape != stat:
            raise ShapeError(f"{name} {t} must have shape {list(stat)}")
    if gamma.shape != x.shape[p:]:
        raise ShapeError(f"gamma {gamma} must have shape {list(x.shape[p:])}")
    return [x, gamma, gamma]


def _ln_grad_ref(xs, a, ctx):
    dy, x, var, mean, g = xs
    axes, p = ln_axes(x.ndim, a)
    ax = tuple(axes)
    n = int(np.prod([x.shape[i] for i in axes]))
    rstd = 1 / np.sqrt(var + a["epsilon"])
    xhat = (x - mean) * rstd
    dxhat = dy * g
    dx = rstd / n * (n * dxhat - dxhat.sum(axis=ax, keepdims=True)
                     - xhat * (dxhat * xhat).sum(axis=ax, keepdims=True))
    batch = tuple(range(p))
    return dx, float_sum(dy * xhat, batch), float_sum(dy, batch)


composite("LayerNormGrad", (5, 5), _ln_grad_infer, _ln_grad_ref, LayerNormAttrs, category=G,
          kind=OpKind.REDUCE)


class WeightNormAttrs(Attrs):
    """``dim``: the axis of ``v`` a norm is kept for (-1: one norm over the whole tensor)."""

    dim: int = 0


def _weight_norm_axes(rank: int, dim: int) -> list[int]:
    """The axes of ``v`` each norm sums over: all but ``dim`` (all when ``dim`` is -1)."""
    if dim != -1 and not -rank <= dim < rank:
        raise ShapeError(f"dim {dim} is out of range for rank {rank} (accepted: -1 or "
                         f"{-rank}..{rank - 1})")
    return [a for a in range(rank) if dim == -1 or a != dim % rank]


def _weight_norm_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dw, v, g, norms = ins
    check_dtype(v, "float")
    if dw != v:
        raise ShapeError(f"dw {dw} and v {v} must have the same type")
    kept = [d for a, d in enumerate(v.shape)
            if a not in _weight_norm_axes(v.rank, attrs["dim"])]
    for name, t in (("g", g), ("norms", norms)):
        if t.dtype != v.dtype or [d for d in t.shape if d != 1] != [d for d in kept if d != 1]:
            raise ShapeError(f"{name} {t} must hold one {v.dtype.value} per index of v's kept "
                             f"axis ({kept or [1]}, other dims 1)")
    return [v, g]


def _weight_norm_grad_ref(xs, a, ctx):
    # w = v g / |v| (the norm over every axis but dim): dg = sum(dw v) / |v|,
    # dv = g / |v| (dw - v dg / |v|)
    dw, v, g, norms = xs
    axes = tuple(_weight_norm_axes(v.ndim, a["dim"]))
    dot = (dw * v).sum(axis=axes, keepdims=True)
    norms = norms.reshape(dot.shape)
    dg = dot / norms
    dv = g.reshape(dot.shape) / norms * (dw - v * (dg / norms))
    return dv, dg.reshape(g.shape)


composite("WeightNormGrad", (4, 4), _weight_norm_grad_infer, _weight_norm_grad_ref,
          WeightNormAttrs, category=G, kind=OpKind.REDUCE)


class _ConvGradAttrs(Attrs):
    """The forward convolution's geometry (NCHW, weights [M, C/group, kh, kw]): as Conv2D's."""

    strides: list[int] = Field(default=[1, 1], min_length=2, max_length=2)
    pads: list[int] = Field(default=[0, 0, 0, 0], min_length=4, max_length=4)  # t, l, b, r
    dilations: list[int] = Field(default=[1, 1], min_length=2, max_length=2)
    group: int = Field(default=1, ge=1)


class Conv2DBackpropInputAttrs(_ConvGradAttrs):
    """``input_size``: the forward input's shape [N, C, H, W] (the gradient's shape), which
    dy's size alone does not fix when the stride skips trailing rows or columns."""

    input_size: list[int] = Field(min_length=4, max_length=4)


class Conv2DBackpropFilterAttrs(_ConvGradAttrs):
    """``filter_size``: the forward weight's shape [M, C/group, kh, kw]."""

    filter_size: list[int] = Field(min_length=4, max_length=4)


def _conv_grad_check(dy: TensorType, x: tuple, w: tuple, attrs: dict) -> None:
    """dy must be the output of the convolution of an input of shape ``x`` by a weight of
    shape ``w`` with these attributes: a ShapeError saying what differs otherwise."""
    check_dtype(dy, "float")
    if dy.rank != 4 or not dy.is_static:
        raise ShapeError(f"dy {dy} must be a static NCHW tensor")
    if any(not isinstance(d, int) or d < 1 for d in (*x, *w)):
        raise ShapeError(f"input {list(x)} and weight {list(w)} must be static positive sizes")
    g = attrs["group"]
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    m, cg, kh, kw = w
    if m % g or x[1] != cg * g:
        raise ShapeError(f"weight {list(w)} does not fit group {g} and input channels {x[1]} "
                         f"(accepted: M a multiple of group, C = C/group x group)")
    want = (x[0], m, window_out(x[2], kh, sh, pt, pb, dh), window_out(x[3], kw, sw, pl, pr, dw))
    if dy.shape != want:
        raise ShapeError(f"dy {dy} is not the output of a convolution of {list(x)} by "
                         f"{list(w)} with these attributes (that output is {list(want)})")


def _conv_input_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy, w = ins
    if dy.dtype != w.dtype or w.rank != 4 or not w.is_static:
        raise ShapeError(f"w {w} must be a static [M, C/group, kh, kw] weight of dy's dtype "
                         f"{dy.dtype.value}")
    _conv_grad_check(dy, tuple(attrs["input_size"]), w.shape, attrs)
    return [TensorType(tuple(attrs["input_size"]), dy.dtype)]


def _conv_filter_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy, x = ins
    if dy.dtype != x.dtype or x.rank != 4 or not x.is_static:
        raise ShapeError(f"x {x} must be a static NCHW input of dy's dtype {dy.dtype.value}")
    _conv_grad_check(dy, x.shape, tuple(attrs["filter_size"]), attrs)
    return [TensorType(tuple(attrs["filter_size"]), dy.dtype)]


def _taps(a: dict, k: tuple[int, int], out: tuple[int, int]):
    """Per kernel tap (i, j): the slices of the padded input the forward read at that tap for
    every output position, rows i*dh, i*dh + sh, ... (OH of them) and the same for columns."""
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    for i in range(k[0]):
        for j in range(k[1]):
            yield i, j, (slice(i * dh, i * dh + (out[0] - 1) * sh + 1, sh),
                         slice(j * dw, j * dw + (out[1] - 1) * sw + 1, sw))


def _conv_input_grad_ref(xs, a, ctx):
    # y[n, m, oy, ox] = sum_{c, i, j} xpad[n, c, oy sh + i dh, ox sw + j dw] w[m, c, i, j]:
    # each tap scatters dy w back onto the padded input positions it read
    dy, w = xs
    n, c, h, wd = a["input_size"]
    g, (pt, pl, pb, pr) = a["group"], a["pads"]
    m, cg, kh, kw = w.shape
    oh, ow = dy.shape[2:]
    dyg = dy.reshape(n, g, m // g, oh, ow)
    wg = w.reshape(g, m // g, cg, kh, kw)
    dxp = np.zeros((n, g, cg, pt + h + pb, pl + wd + pr), dy.dtype)
    for i, j, (rows, cols) in _taps(a, (kh, kw), (oh, ow)):
        dxp[:, :, :, rows, cols] += np.einsum("ngmyx,gmc->ngcyx", dyg, wg[..., i, j])
    return dxp[:, :, :, pt:pt + h, pl:pl + wd].reshape(n, c, h, wd)


def _conv_filter_grad_ref(xs, a, ctx):
    # dw[m, c, i, j] = sum_{n, oy, ox} dy[n, m, oy, ox] xpad[n, c, oy sh + i dh, ox sw + j dw]
    dy, x = xs
    m, cg, kh, kw = a["filter_size"]
    g, (pt, pl, pb, pr) = a["group"], a["pads"]
    n, _, h, wd = x.shape
    oh, ow = dy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))).reshape(n, g, cg, pt + h + pb,
                                                                  pl + wd + pr)
    dyg = dy.reshape(n, g, m // g, oh, ow)
    dw = np.zeros((g, m // g, cg, kh, kw), dy.dtype)
    for i, j, (rows, cols) in _taps(a, (kh, kw), (oh, ow)):
        dw[..., i, j] = np.einsum("ngmyx,ngcyx->gmc", dyg, xp[:, :, :, rows, cols])
    return dw.reshape(m, cg, kh, kw)


composite("Conv2DBackpropInput", (2, 2), _conv_input_grad_infer, _conv_input_grad_ref,
          Conv2DBackpropInputAttrs, category=G, kind=OpKind.OPAQUE)
composite("Conv2DBackpropFilter", (2, 2), _conv_filter_grad_infer, _conv_filter_grad_ref,
          Conv2DBackpropFilterAttrs, category=G, kind=OpKind.OPAQUE)
