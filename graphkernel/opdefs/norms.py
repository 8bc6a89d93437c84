"""Composite normalizations and softmax (expanded by expanders/norms.py, softmax.py)."""

from __future__ import annotations

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.opdefs.composite import composite
from graphkernel.opdefs.reduce import float_mean, float_sum
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



class BatchNormAttrs(Attrs):
    """``axis``: the channel axis the parameters run along (1: NC[D]HW)."""

    epsilon: float = 1e-5
    axis: int = 1


class BatchNormTrainingAttrs(BatchNormAttrs):
    momentum: float = 0.1


def bn_axes(rank: int, axis: int) -> tuple[int, list[int]]:
    """(the channel axis, the axes the statistics reduce over: every other one)."""
    c = dim_axis(axis, rank)
    return c, [i for i in range(rank) if i != c]


def bn_param_shape(rank: int, c: int) -> list[int]:
    """A [C] parameter's shape against the input: C at the channel axis, 1 elsewhere."""
    return [-1 if i == c else 1 for i in range(rank)]


def _bn_params(x: TensorType, params: list[TensorType], axis: int, names: str) -> int:
    check_dtype(x, "float")
    c, _ = bn_axes(x.rank, axis)
    for name, t in zip(names.split(), params, strict=True):
        if t.dtype != x.dtype or t.rank != 1 or (
                isinstance(x.shape[c], int) and t.shape[0] != x.shape[c]):
            raise ShapeError(f"{name} {t} must be {x.dtype.value}[{x.shape[c]}] (the input's "
                             f"channel axis {c})")
    return c


def _bn_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    _bn_params(ins[0], ins[1:], attrs["axis"], "scale bias mean var")
    return [ins[0]]


def _per_channel(v: np.ndarray, rank: int, c: int) -> np.ndarray:
    return v.reshape(bn_param_shape(rank, c))


def _bn_ref(xs, a, ctx):
    # PyTorch's CPU form: alpha = scale / sqrt(var + eps), beta = bias - mean alpha
    x, scale, bias, mean, var = xs
    c, _ = bn_axes(x.ndim, a["axis"])
    alpha = scale / np.sqrt(var + a["epsilon"])
    beta = bias - mean * alpha
    return x * _per_channel(alpha, x.ndim, c) + _per_channel(beta, x.ndim, c)


composite("BatchNorm", (5, 5), _bn_infer, _bn_ref, BatchNormAttrs, category=N,
          kind=OpKind.BROADCAST)


def _bn_train_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    names = "scale bias running_mean running_var"
    c = _bn_params(x, ins[1:], attrs["axis"], " ".join(names.split()[:len(ins) - 1]))
    stat = TensorType((x.shape[c],), x.dtype)
    return [x, stat, stat] + ([stat, stat] if len(ins) == 5 else [])


def _bn_train_ref(xs, a, ctx):
    x, scale, bias = xs[:3]
    c, axes = bn_axes(x.ndim, a["axis"])
    ax = tuple(axes)
    n = x.size // x.shape[c]
    mean = float_mean(x, ax)  # (accumulated in float64, as PyTorch's CPU batch norm)
    var = float_mean((x - _per_channel(mean, x.ndim, c)) ** 2, ax)
    rstd = 1 / np.sqrt(var + a["epsilon"])
    y = (x - _per_channel(mean, x.ndim, c)) * _per_channel(scale * rstd, x.ndim, c) \
        + _per_channel(bias, x.ndim, c)
    if len(xs) == 3:
        return y, mean, rstd
    m = a["momentum"]
    rm, rv = xs[3:]
    unbiased = var * (n / max(n - 1, 1))
    return y, mean, rstd, (1 - m) * rm + m * mean, (1 - m) * rv + m * unbiased


composite("BatchNormTraining", (3, 5), _bn_train_infer, _bn_train_ref, BatchNormTrainingAttrs,
          category=N, kind=OpKind.REDUCE)


def _bn_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy, x = ins[:2]
    if dy != x:
        raise ShapeError(f"dy {dy} and x {x} must have the same type")
    c = _bn_params(x, ins[2:], attrs["axis"], "scale mean rstd")
    stat = TensorType((x.shape[c],), x.dtype)
    return [x, stat, stat]


def _bn_grad_ref(xs, a, ctx):
    # xhat = (x - mean) rstd; dbias = sum(dy); dscale = sum(dy xhat);
    # dx = scale rstd / N (N dy - dbias - xhat dscale)
    dy, x, scale, mean, rstd = xs
    c, axes = bn_axes(x.ndim, a["axis"])
    ax = tuple(axes)
    n = x.size // x.shape[c]
    pc = lambda v: _per_channel(v, x.ndim, c)  # noqa: E731
    xhat = (x - pc(mean)) * pc(rstd)
    dbias = float_sum(dy, ax)
    dscale = float_sum(dy * xhat, ax)
    dx = pc(scale * rstd / n) * (n * dy - pc(dbias) - xhat * pc(dscale))
    return dx, dscale, dbias


composite("BatchNormGrad", (5, 5), _bn_grad_infer, _bn_grad_ref, BatchNormAttrs, category=N,
          kind=OpKind.REDUCE)
