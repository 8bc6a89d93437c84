"""Expansions of LayerNorm and RMSNorm (computed in fp32 for fp16/bf16 inputs)."""

from __future__ import annotations

from graphkernel.expanders.base import expander, static_dims
from graphkernel.opdefs.norms import ln_axes


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
