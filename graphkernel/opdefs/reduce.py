"""Reductions: ReduceSum/Max/Min/Prod, ArgMax/ArgMin, ElemAny."""

from __future__ import annotations

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ops import (
    Attrs,
    OpDef,
    OpKind,
    check_dtype,
    normalize_axes,
    normalize_axis,
    register,
)
from graphkernel.tensor_types import DType, TensorType


class ReduceAttrs(Attrs):
    """``axis`` None or [] reduces every axis."""

    axis: list[int] | None = None
    keep_dims: bool = False


def reduce_axes(rank: int, axis: list[int] | None) -> list[int]:
    """The axes reduced, sorted and non-negative. A 0-d input has none to reduce: its axes 0
    and -1 (torch's ``sum(x, dim=0)`` of a scalar) are accepted and reduce nothing."""
    if not axis:
        return list(range(rank))
    axes = sorted(normalize_axes(axis, rank))
    return axes if rank else []


def reduced_shape(t: TensorType, axes: list[int], keep_dims: bool) -> tuple:
    if keep_dims:
        return tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    return tuple(d for i, d in enumerate(t.shape) if i not in axes)


def _reduce_infer(cls: str):
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        x = ins[0]
        check_dtype(x, cls)
        axes = reduce_axes(x.rank, attrs["axis"])
        return [TensorType(reduced_shape(x, axes, attrs["keep_dims"]), x.dtype)]

    return infer


def float_sum(x: np.ndarray, axis: tuple[int, ...] | int | None = None,
              keepdims: bool = False) -> np.ndarray:
    """The sum of ``x`` over ``axis`` in ``x``'s dtype; a float narrower than float64 is
    accumulated in float64 and rounded once. numpy sums float32 pairwise only along a
    contiguous inner run: over the outer axes of an array, or over a transposed view (a
    convolution's output, a batch norm's N, H and W), it adds one by one, and the rounding
    grows with the count and depends on the layout. PyTorch's CPU batch norm gives its
    statistics within an ulp of float64's (measured: its accumulator is wider than fp32); a
    reference adding one by one drifts from it by many ulps on a mean of thousands of
    values, which a float64 judge of a training step then blames on the compiled graph."""
    if x.dtype.kind == "f" and x.dtype.itemsize < 8:
        return np.sum(x, axis=axis, keepdims=keepdims, dtype=np.float64).astype(x.dtype)
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def float_mean(x: np.ndarray, axis: tuple[int, ...] | int | None = None,
               keepdims: bool = False) -> np.ndarray:
    """The mean of a float ``x`` over ``axis``, its sum accumulated as ``float_sum``'s (a
    mean of nothing is NaN, as numpy's)."""
    if not (x.dtype.kind == "f" and x.dtype.itemsize < 8):
        return np.mean(x, axis=axis, keepdims=keepdims)
    axes = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    count = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    s = np.sum(x, axis=axis, keepdims=keepdims, dtype=np.float64)
    return (s / count if count else np.full_like(s, np.nan)).astype(x.dtype)


def _reduce_ref(fn):
    def ref(xs, a, ctx):
        x = xs[0]
        axes = tuple(reduce_axes(x.ndim, a["axis"]))
        if fn is np.sum:
            return float_sum(x, axes, a["keep_dims"])
        if fn is np.prod:
            return fn(x, axis=axes, keepdims=a["keep_dims"], dtype=x.dtype)
        if x.size == 0:  # max/min of nothing: the identity of the reduction
            shape = ctx.out_shapes[0]
            fill = -np.inf if fn is np.max else np.inf
            if x.dtype.kind in "iub":
                info = np.iinfo(x.dtype) if x.dtype.kind != "b" else None
                fill = (info.min if fn is np.max else info.max) if info else fn is np.min
            return np.full(shape, fill, dtype=x.dtype)
        return fn(x, axis=axes, keepdims=a["keep_dims"])

    return ref


for _name, _fn, _cls in [("ReduceSum", np.sum, "numeric"), ("ReduceMax", np.max, "any"),
                         ("ReduceMin", np.min, "any"), ("ReduceProd", np.prod, "numeric")]:
    register(OpDef(_name, OpKind.REDUCE, (1, 1), _reduce_infer(_cls), _reduce_ref(_fn),
                   attrs=ReduceAttrs, category="reduce"))


class ArgAttrs(Attrs):
    axis: int = 0
    keep_dims: bool = False
    select_last_index: bool = False
    dtype: DType = DType.int64


def _arg_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    check_dtype(x, "numeric")
    axis = normalize_axis(attrs["axis"], x.rank)
    if attrs["dtype"] not in (DType.int32, DType.int64):
        raise ShapeError(f"index dtype {attrs['dtype'].value} is not accepted "
                         "(accepted: int32, int64)")
    return [TensorType(reduced_shape(x, [axis], attrs["keep_dims"]), attrs["dtype"])]


def _arg_ref(fn):
    def ref(xs, a, ctx):
        x = xs[0]
        if x.ndim == 0:  # the one element is at index 0
            return np.zeros((), ctx.out_dtypes[0])
        axis = a["axis"] % x.ndim
        if a["select_last_index"]:
            n = x.shape[axis]
            out = n - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            out = fn(x, axis=axis)
        return np.expand_dims(out, axis) if a["keep_dims"] else out

    return ref


register(OpDef("ArgMax", OpKind.OPAQUE, (1, 1), _arg_infer, _arg_ref(np.argmax), attrs=ArgAttrs,
               category="reduce"))
register(OpDef("ArgMin", OpKind.OPAQUE, (1, 1), _arg_infer, _arg_ref(np.argmin), attrs=ArgAttrs,
               category="reduce"))


def _elem_any_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    return [TensorType((1,), DType.float32)]


# MindSpore's ElemAny: a float32 [1] that is 1.0 when any element is nonzero (overflow checks).
register(OpDef("ElemAny", OpKind.REDUCE, (1, 1), _elem_any_infer,
               lambda xs, a, ctx: np.array([1.0 if np.any(xs[0] != 0) else 0.0]),
               category="reduce"))
