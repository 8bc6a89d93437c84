"""Expansions of Softmax and LogSoftmax: the max in the input precision, the rest in fp32."""

from __future__ import annotations

from graphkernel.expanders.base import expander
from graphkernel.ir import DType
from graphkernel.opdefs.norms import softmax_axes


def _shifted(b, x, axis):
    """(x - max(x)) in fp32, the max taken in the input precision (it is exact there)."""
    axes = list(softmax_axes(x.type.rank, axis))
    m = b.reduce_max(x, axes, keep_dims=True)
    return b.sub(b.cast(x, DType.float32 if x.dtype.is_low_precision else x.dtype),
                 b.cast(m, DType.float32 if x.dtype.is_low_precision else x.dtype)), axes


@expander("Softmax", fp32_inside=False)
def softmax(b, x, *, axis):
    # e = exp(x - max x); y = e / sum(e)
    d, axes = _shifted(b, x, axis)
    e = b.exp(d)
    return b.cast(b.div(e, b.reduce_sum(e, axes, keep_dims=True)), x.dtype)


@expander("LogSoftmax", fp32_inside=False)
def log_softmax(b, x, *, axis):
    # (x - max) - log(sum(exp(x - max)))
    d, axes = _shifted(b, x, axis)
    return b.cast(b.sub(d, b.log(b.reduce_sum(b.exp(d), axes, keep_dims=True))), x.dtype)
