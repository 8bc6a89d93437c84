"""Composite normalizations and softmax (expanded by expanders/norms.py, softmax.py)."""

from __future__ import annotations

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.opdefs.composite import composite
from graphkernel.ops import Attrs, OpKind, check_dtype, dim_axis, normalize_axes, normalize_axis
from graphkernel.tensor_types import TensorType

N = "norm"


class LayerNormAttrs(Attrs):
    begin_norm_axis: int = -1
    begin_params_axis: int = -1
    epsilon: float = 1e-5


def ln_axes(rank: int, attrs: dict) -> tuple[list[int], int]:
    b = normalize_axis(attrs["begin_norm_axis"], rank)
    p = normalize_axis(attrs["begin_params_axis"], rank)
    return list(range(b, rank)), p


def _ln_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, gamma, beta = ins
    check_dtype(x, "float")
    axes, p = ln_axes(x.rank, attrs)
    for name, t in (("gamma", gamma), ("beta", beta)):
        if t.dtype != x.dtype or t.shape != x.shape[p:]:
            raise ShapeError(f"{name} {t} must be {x.dtype.value}{list(x.shape[p:])} "
                             f"(the input's dims from begin_params_axis {p})")
    stat = TensorType(tuple(1 if i in axes else d for i, d in enumerate(x.shape)), x.dtype)
    return [x, stat, stat]


def _ln_ref(xs, a, ctx):
    x, g, b = xs
    axes, _ = ln_axes(x.ndim, a)
    mean = x.mean(axis=tuple(axes), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=tuple(axes), keepdims=True)
    return (x - mean) / np.sqrt(var + a["epsilon"]) * g + b, mean, var


composite("LayerNorm", (3, 3), _ln_infer, _ln_ref, LayerNormAttrs, category=N,
          kind=OpKind.REDUCE)


class RMSNormAttrs(Attrs):
    epsilon: float = 1e-6
    axis: int = -1


def _rms_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, gamma = ins
    check_dtype(x, "float")
    ax = dim_axis(attrs["axis"], x.rank)
    if gamma.dtype != x.dtype or gamma.shape != x.shape[ax:]:
        raise ShapeError(f"gamma {gamma} must be {x.dtype.value}{list(x.shape[ax:])}")
    rstd = TensorType(tuple(1 if i >= ax else d for i, d in enumerate(x.shape)), x.dtype)
    return [x, rstd]


def _rms_ref(xs, a, ctx):
    x, g = xs
    axes = tuple(range(a["axis"] % x.ndim, x.ndim))
    rstd = 1 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + a["epsilon"])
    return x * rstd * g, rstd


composite("RMSNorm", (2, 2), _rms_infer, _rms_ref, RMSNormAttrs, category=N, kind=OpKind.REDUCE)


class SoftmaxAttrs(Attrs):
    """``axis``: one axis or several (ONNX before opset 13 normalizes over all trailing axes)."""

    axis: int | list[int] = -1


def softmax_axes(rank: int, axis: int | list[int]) -> tuple[int, ...]:
    """The normalized axes, sorted; a 0-d input has none (its axes 0 and -1 are itself, and
    the softmax of one element is 1). An empty list names no axis and is an error."""
    if axis == []:
        raise ShapeError("axis [] names no axis to normalize over; give one or more axes")
    axes = sorted(normalize_axes(axis if isinstance(axis, list) else [axis], rank))
    return tuple(axes) if rank else ()


def _softmax_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    check_dtype(ins[0], "float")
    softmax_axes(ins[0].rank, attrs["axis"])
    return [ins[0]]


def _softmax_ref(xs, a, ctx):
    x = xs[0]
    ax = softmax_axes(x.ndim, a["axis"])
    e = np.exp(x - x.max(axis=ax, keepdims=True))
    return e / e.sum(axis=ax, keepdims=True)


def _log_softmax_ref(xs, a, ctx):
    x = xs[0]
    ax = softmax_axes(x.ndim, a["axis"])
    d = x - x.max(axis=ax, keepdims=True)
    return d - np.log(np.exp(d).sum(axis=ax, keepdims=True))


composite("Softmax", (1, 1), _softmax_infer, _softmax_ref, SoftmaxAttrs, category=N,
          kind=OpKind.REDUCE)
composite("LogSoftmax", (1, 1), _softmax_infer, _log_softmax_ref, SoftmaxAttrs, category=N,
          kind=OpKind.REDUCE)

