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


def _rows(b, x, axis, body):
    """``body(x, axis)`` over the rows of ``x``: when every axis after the normalized ones is
    of static size 1 (ConvBERT's ``softmax(k.reshape(-1, K, 1), dim=1)``), those axes are
    dropped first and restored after, so the normalized axes are the last ones, as row
    reductions are fused and scheduled (the same elements summed in the same order)."""
    axes = softmax_axes(x.type.rank, axis)
    shape = list(x.type.shape)
    if not axes or axes[-1] == len(shape) - 1 or any(d != 1 for d in shape[axes[-1] + 1:]):
        return body(x, axis)
    rows = b.reshape(x, shape[:axes[-1] + 1])
    return b.reshape(body(rows, list(axes)), shape)


def _softmax(b, x, axis):
    # e = exp(x - max x); y = e / sum(e)
    d, axes = _shifted(b, x, axis)
    e = b.exp(d)
    return b.cast(b.div(e, b.reduce_sum(e, axes, keep_dims=True)), x.dtype)


def _log_softmax(b, x, axis):
    # (x - max) - log(sum(exp(x - max)))
    d, axes = _shifted(b, x, axis)
    return b.cast(b.sub(d, b.log(b.reduce_sum(b.exp(d), axes, keep_dims=True))), x.dtype)


@expander("Softmax", fp32_inside=False)
def softmax(b, x, *, axis):
    return _rows(b, x, axis, lambda y, a: _softmax(b, y, a))


@expander("LogSoftmax", fp32_inside=False)
def log_softmax(b, x, *, axis):
    return _rows(b, x, axis, lambda y, a: _log_softmax(b, y, a))
