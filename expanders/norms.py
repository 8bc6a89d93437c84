"""Expansions of LayerNorm, RMSNorm and BatchNorm (computed in fp32 for fp16/bf16 inputs)."""

from __future__ import annotations

from collections.abc import Callable

from graphkernel.expanders.base import expander, static_dims
from graphkernel.opdefs.norms import bn_axes, bn_param_shape, ln_axes


def _norm_axes(node):
    return ln_axes(node.inputs[0].type.rank, node.attrs)[0]


@expander("LayerNorm", validators=[static_dims(_norm_axes, "normalized dims (from "
                                                           "begin_norm_axis)")])
def layer_norm(b, x, gamma, beta, *, begin_norm_axis, begin_params_axis, epsilon):
    # mean = sum(x)/N; var = sum((x - mean)^2)/N; y = (x - mean) rsqrt(var + eps) gamma + beta
    axes, _ = ln_axes(x.type.rank, {"begin_norm_axis": begin_norm_axis,
                                    "begin_params_axis": begin_params_axis})
    mean = b.reduce_mean(x, axes, keep_dims=True)
    centered = b.sub(x, mean)
    var = b.reduce_mean(b.square(centered), axes, keep_dims=True)
    y = b.mul(centered, b.rsqrt(b.add(var, epsilon)))
    return [b.add(b.mul(y, gamma), beta), mean, var]


@expander("RMSNorm", validators=[static_dims(
    lambda n: list(range(n.attrs["axis"] % n.inputs[0].type.rank, n.inputs[0].type.rank)),
    "normalized dims")])
def rms_norm(b, x, gamma, *, epsilon, axis):
    # rstd = rsqrt(mean(x^2) + eps); y = x rstd gamma
    axes = list(range(axis % x.type.rank, x.type.rank))
    rstd = b.rsqrt(b.add(b.reduce_mean(b.square(x), axes, keep_dims=True), epsilon))
    return [b.mul(b.mul(x, rstd), gamma), rstd]


def _bn_stat_dims(node):
    return bn_axes(node.inputs[0].type.rank, node.attrs["axis"])[1]


def _bn_reduced(x, axis) -> tuple[int, list[int], Callable]:
    """(the channel axis, the axes of more than one element the statistics reduce over, a
    function viewing a reduction over them as the channel's [C]). An axis of one element
    reduces nothing: left out, the reductions of a norm over [1, C, K] (a weight
    standardisation's, a batch of one image's) are over one run of trailing axes, whole rows
    a kernel reduces in one pass, not runs split into passes."""
    c, axes = bn_axes(x.type.rank, axis)
    red = [a for a in axes if x.shape[a] != 1] or axes
    if red == axes:
        return c, axes, lambda b, v: v
    return c, red, lambda b, v: b.reshape(v, [x.shape[c]])


@expander("BatchNorm")
def batch_norm(b, x, scale, bias, mean, var, *, epsilon, axis):
    # PyTorch's CPU form: alpha = scale / sqrt(var + eps); beta = bias - mean alpha;
    # y = x alpha + beta (a per-channel affine: constants when the parameters are frozen)
    c, _ = bn_axes(x.type.rank, axis)
    shape = bn_param_shape(x.type.rank, c)
    alpha = b.div(scale, b.sqrt(b.add(var, epsilon)))
    beta = b.sub(bias, b.mul(mean, alpha))
    return b.add(b.mul(x, b.reshape(alpha, shape)), b.reshape(beta, shape))


@expander("BatchNormTraining", validators=[static_dims(_bn_stat_dims, "reduced dims")])
def batch_norm_training(b, x, scale, bias, *running, epsilon, momentum, axis):
    # shifted data: k = the channel's first element, d = x - k (exact for x near k);
    # mean = sum(x)/N; var = sum((d - mean_d)^2)/N over every axis but the channel's;
    # rstd = 1 / sqrt(var + eps); y = (d - mean_d) alpha + bias, alpha = scale rstd.
    # A channel of large mean and small spread (a nearly saturated activation) keeps its
    # digits as PyTorch's, which accumulates in float64: the mean's rounding, times an rstd
    # of up to 1/sqrt(eps), would otherwise be noise in y and in every gradient through it.
    # running stats: (1 - m) r + m mean, (1 - m) r + m var N / (N - 1)
    c, axes, per_channel = _bn_reduced(x, axis)
    shape = bn_param_shape(x.type.rank, c)
    n = 1
    for a in axes:
        n *= x.shape[a]
    k = b.op("StridedSlice", x, begin=[0] * len(axes), end=[1] * len(axes),
             strides=[1] * len(axes), axes=list(axes))
    d = b.sub(x, k)
    mean_d = b.reduce_mean(d, axes, keep_dims=True)
    centered = b.sub(d, mean_d)
    var = per_channel(b, b.reduce_mean(b.square(centered), axes))
    # the mean returned (the running mean's and the backward's) is summed directly: k +
    # mean(d) cancels when |k| is far above |mean| (a channel of mean ~0.01 whose first
    # element is ~1) and keeps an ulp of k, which (x - mean) rstd in the backward carries
    # into every gradient of the channel; the direct sum's rounding is the mean's own
    mean = per_channel(b, b.reduce_mean(x, axes))
    rstd = b.div(1.0, b.sqrt(b.add(var, epsilon)))
    alpha = b.mul(scale, rstd)
    y = b.add(b.mul(centered, b.reshape(alpha, shape)), b.reshape(bias, shape))
    if not running:
        return [y, mean, rstd]
    rm, rv = running
    keep = 1.0 - momentum
    new_mean = b.add(b.mul(rm, keep), b.mul(mean, momentum))
    new_var = b.add(b.mul(rv, keep), b.mul(var, momentum * n / max(n - 1, 1)))
    return [y, mean, rstd, new_mean, new_var]


@expander("BatchNormGrad", validators=[static_dims(_bn_stat_dims, "reduced dims")])
def batch_norm_grad(b, dy, x, scale, mean, rstd, *, epsilon, axis):
    # xhat = (x - mean) rstd; dbias = sum(dy); dscale = sum(dy xhat);
    # dx = scale rstd / N (N dy - dbias - xhat dscale)
    c, axes, per_channel = _bn_reduced(x, axis)
    shape = bn_param_shape(x.type.rank, c)
    n = 1
    for a in axes:
        n *= x.shape[a]
    pc = lambda v: b.reshape(v, shape)  # noqa: E731
    xhat = b.mul(b.sub(x, pc(mean)), pc(rstd))
    dbias = per_channel(b, b.reduce_sum(dy, axes))
    dscale = per_channel(b, b.reduce_sum(b.mul(dy, xhat), axes))
    inner = b.sub(b.sub(b.mul(dy, float(n)), pc(dbias)), b.mul(xhat, pc(dscale)))
    dx = b.mul(pc(b.mul(b.mul(scale, rstd), 1.0 / n)), inner)
    return [dx, dscale, dbias]
