"""Data-movement ops: BroadcastTo, Reshape, ExpandDims, Squeeze, Transpose, Slice,
StridedSlice, Concat, Split, Gather, OneHot, CumSum."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ops import (
    Attrs,
    OpDef,
    OpKind,
    check_dtype,
    dim_axes,
    dim_axis,
    normalize_axes,
    normalize_axis,
    register,
)
from graphkernel.symbolic import Dim
from graphkernel.tensor_types import DType, TensorType

INT_MAX = 2**63 - 1


# ---------------------------------------------------------------- BroadcastTo
class ShapeAttrs(Attrs):
    shape: list[int | str]


def _broadcast_to_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    target = list(attrs["shape"])
    if len(target) < x.rank:
        raise ShapeError(f"target shape {target} has lower rank than the input")
    offset = len(target) - x.rank
    out: list[Dim] = []
    for i, d in enumerate(target):
        src = x.shape[i - offset] if i >= offset else 1
        if d == -1:
            if i < offset:
                raise ShapeError(f"-1 at position {i} of {target} has no input dim to keep")
            d = src
        if isinstance(d, int) and d < 0:
            raise ShapeError(f"invalid target dim {d} (only -1, meaning 'keep', is allowed)")
        if src != 1 and src != d and not (isinstance(src, str) and isinstance(d, int)):
            raise ShapeError(f"input dim {src!r} cannot broadcast to {d!r} (target {target})")
        out.append(d)
    return [TensorType(tuple(out), x.dtype)]


register(OpDef("BroadcastTo", OpKind.BROADCAST, (1, 1), _broadcast_to_infer,
               lambda xs, a, ctx: np.broadcast_to(xs[0], ctx.out_shapes[0]), attrs=ShapeAttrs,
               category="shape"))


# -------------------------------------------------------------------- Reshape
def _reshape_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    target = list(attrs["shape"])
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"shape {target} has more than one -1")
    known: Dim = 1
    for d in target:
        if isinstance(d, int) and d < -1:
            raise ShapeError(f"invalid dim {d} in shape {target}")
        if d != -1:
            known = symbolic.mul(known, d)
    total = x.numel
    if -1 in target:
        rest = symbolic.div(total, known) if known != 0 else None
        if rest is None:
            raise ShapeError(f"cannot infer -1 in {target}: {total!r} elements are not a "
                             f"multiple of {known!r}")
        target = [rest if d == -1 else d for d in target]
    elif symbolic.canon(known) != symbolic.canon(total):
        raise ShapeError(f"cannot reshape {total!r} elements into {target} ({known!r} elements)")
    return [TensorType(tuple(target), x.dtype)]


register(OpDef("Reshape", OpKind.RESHAPE, (1, 1), _reshape_infer,
               lambda xs, a, ctx: xs[0].reshape(ctx.out_shapes[0]), attrs=ShapeAttrs,
               category="shape", view=True))


# ----------------------------------------------------------- ExpandDims/Squeeze
class AxisListAttrs(Attrs):
    axis: list[int]


class OptAxisListAttrs(Attrs):
    axis: list[int] | None = None


def _expand_dims_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    rank = x.rank + len(attrs["axis"])
    axes = normalize_axes(attrs["axis"], rank)
    it = iter(x.shape)
    shape = tuple(1 if i in axes else next(it) for i in range(rank))
    return [TensorType(shape, x.dtype)]


def _squeeze_axes(x: TensorType, axis: list[int] | None) -> list[int]:
    if axis is None:
        if not x.is_static:
            raise ShapeError("squeeze without axes needs a static shape; give the axes")
        return [i for i, d in enumerate(x.shape) if d == 1]
    axes = normalize_axes(axis, x.rank)
    if x.rank == 0:  # torch's squeeze(x, 0) of a scalar: nothing to squeeze
        return []
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of size {x.shape[a]!r} (must be 1)")
    return axes


def _squeeze_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    axes = _squeeze_axes(x, attrs["axis"])
    return [TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)]


def _reshape_ref(xs, a, ctx):
    return xs[0].reshape(ctx.out_shapes[0])


register(OpDef("ExpandDims", OpKind.RESHAPE, (1, 1), _expand_dims_infer, _reshape_ref,
               attrs=AxisListAttrs, aliases=("Unsqueeze",), category="shape", view=True))
register(OpDef("Squeeze", OpKind.RESHAPE, (1, 1), _squeeze_infer, _reshape_ref,
               attrs=OptAxisListAttrs, category="shape", view=True))


# ------------------------------------------------------------------ Transpose
class PermAttrs(Attrs):
    perm: list[int]


def _transpose_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {perm} is not a permutation of 0..{x.rank - 1}")
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


register(OpDef("Transpose", OpKind.TRANSPOSE, (1, 1), _transpose_infer,
               lambda xs, a, ctx: np.transpose(xs[0], a["perm"]), attrs=PermAttrs,
               category="shape"))


# ---------------------------------------------------------- Slice/StridedSlice
class SliceAttrs(Attrs):
    """MindSpore Slice: ``size[i] == -1`` means "to the end"."""

    begin: list[int]
    size: list[int]


def _slice_bounds(x: TensorType, attrs: dict) -> list[tuple[int, int]]:
    begin, size = attrs["begin"], attrs["size"]
    if len(begin) != x.rank or len(size) != x.rank:
        raise ShapeError(f"begin {begin} and size {size} must both have rank {x.rank}")
    bounds = []
    for i, (b, s, d) in enumerate(zip(begin, size, x.shape, strict=True)):
        if not isinstance(d, int):
            if b == 0 and s == -1:
                bounds.append((0, -1))
                continue
            raise ShapeError(f"axis {i} has symbolic size {d!r}; only the whole axis can be taken")
        end = d if s == -1 else b + s
        if b < 0 or s < -1 or end > d:
            raise ShapeError(f"axis {i}: begin {b} size {s} is outside [0, {d})")
        bounds.append((b, end))
    return bounds


def _slice_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    bounds = _slice_bounds(x, attrs)
    shape = tuple(d if e == -1 else e - b for (b, e), d in zip(bounds, x.shape, strict=True))
    return [TensorType(shape, x.dtype)]


def _slice_ref(xs, a, ctx):
    x = xs[0]
    idx = tuple(slice(b, None if s == -1 else b + s) for b, s in zip(a["begin"], a["size"],
                                                                       strict=True))
    return x[idx]


register(OpDef("Slice", OpKind.SLICE, (1, 1), _slice_infer, _slice_ref, attrs=SliceAttrs,
               category="shape"))


class StridedSliceAttrs(Attrs):
    """Python slicing per listed axis: ``x[begin:end:stride]``, clamped to the dim."""

    begin: list[int]
    end: list[int]
    strides: list[int] | None = None
    axes: list[int] | None = None


def _strided_plan(x: TensorType, attrs: dict) -> list[slice]:
    begin, end = attrs["begin"], attrs["end"]
    strides = attrs["strides"] or [1] * len(begin)
    axes = attrs["axes"] if attrs["axes"] is not None else list(range(len(begin)))
    if not len(begin) == len(end) == len(strides) == len(axes):
        raise ShapeError("begin, end, strides and axes must have the same length")
    axes = dim_axes(axes, x.rank)
    plan = [slice(None)] * x.rank
    for b, e, s, ax in zip(begin, end, strides, axes, strict=True):
        if s == 0:
            raise ShapeError(f"stride 0 on axis {ax}")
        plan[ax] = slice(b, e, s)
    return plan


def _strided_len(sl: slice, d: Dim, axis: int) -> Dim:
    if isinstance(d, str):
        whole = (sl.step in (None, 1) and sl.start in (None, 0)
                 and (sl.stop is None or sl.stop >= INT_MAX // 2))
        if whole:
            return d
        if sl.stop == 0 and (sl.step is None or sl.step > 0):
            return 0  # x[b:0]: nothing, whatever d is (a stop of 0 is not "to the end")
        start = sl.start or 0
        stop = 0 if sl.stop is None or sl.stop >= INT_MAX // 2 else sl.stop
        if sl.step in (None, 1) and start >= 0 and stop <= 0:  # x[b:-e]: d - b - e elements
            return symbolic.floor_affine(d, stop - start)
        if sl.step in (None, 1) and start < 0 and stop == 0:  # x[-k:]: the last k (d >= k)
            return -start
        raise ShapeError(f"axis {axis} has symbolic size {d!r}; only the whole axis, "
                         "x[b:-e] (b >= 0, step 1) or x[-k:] can be taken")
    b = max(min(sl.start, INT_MAX), -INT_MAX) if sl.start is not None else None
    e = max(min(sl.stop, INT_MAX), -INT_MAX) if sl.stop is not None else None
    return len(range(*slice(b, e, sl.step).indices(d)))


def _strided_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    plan = _strided_plan(x, attrs)
    shape = tuple(_strided_len(sl, d, i) for i, (sl, d) in enumerate(zip(plan, x.shape,
                                                                          strict=True)))
    return [TensorType(shape, x.dtype)]


def _strided_ref(xs, a, ctx):
    x = xs[0]
    # Python slices clamp exactly as the inference does (never via slice.indices, whose
    # stop of -1 for "before the start" numpy would read as "the last element").
    return x[tuple(_strided_plan(TensorType(x.shape, DType.float32), a))]


register(OpDef("StridedSlice", OpKind.SLICE, (1, 1), _strided_infer, _strided_ref,
               attrs=StridedSliceAttrs, category="shape"))


# ---------------------------------------------------------------- Concat/Split
class AxisAttrs(Attrs):
    axis: int = 0


def _concat_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    first = ins[0]
    axis = dim_axis(attrs["axis"], first.rank)
    total: Dim = 0
    for t in ins:
        if t.dtype != first.dtype or t.rank != first.rank:
            raise ShapeError(f"all inputs need dtype {first.dtype.value} and rank {first.rank}")
        for i, (d, e) in enumerate(zip(t.shape, first.shape, strict=True)):
            if i != axis and d != e:
                raise ShapeError(f"inputs differ on axis {i} ({d!r} vs {e!r}), which is not "
                                 f"the concat axis {axis}")
        total = symbolic.add(total, t.shape[axis])
    shape = list(first.shape)
    shape[axis] = total
    return [TensorType(tuple(shape), first.dtype)]


register(OpDef("Concat", OpKind.CONCAT, (1, None), _concat_infer,
               lambda xs, a, ctx: np.concatenate(xs, axis=a["axis"]), attrs=AxisAttrs,
               category="shape"))


class SplitAttrs(Attrs):
    axis: int = 0
    sizes: list[int] = Field(min_length=1)


def _split_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    axis = dim_axis(attrs["axis"], x.rank)
    sizes = attrs["sizes"]
    if any(s < 0 for s in sizes):
        raise ShapeError(f"split sizes {sizes} must be >= 0")
    if x.shape[axis] != sum(sizes):
        raise ShapeError(f"split sizes {sizes} sum to {sum(sizes)}, axis {axis} has "
                         f"{x.shape[axis]!r}")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append(TensorType(tuple(shape), x.dtype))
    return outs


def _split_ref(xs, a, ctx):
    cuts = np.cumsum(a["sizes"])[:-1]
    return tuple(np.split(xs[0], cuts, axis=a["axis"]))


register(OpDef("Split", OpKind.SLICE, (1, 1), _split_infer, _split_ref, attrs=SplitAttrs,
               category="shape"))


# ---------------------------------------------------------------- Gather/OneHot
def _gather_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    params, idx = ins
    check_dtype(idx, "int", "indices")
    axis = dim_axis(attrs["axis"], params.rank)
    shape = params.shape[:axis] + idx.shape + params.shape[axis + 1:]
    return [TensorType(shape, params.dtype)]


def _gather_ref(xs, a, ctx):
    params, idx = xs
    axis = a["axis"] % params.ndim
    n = params.shape[axis]
    idx = np.where(idx < 0, idx + n, idx)
    return np.take(params, idx, axis=axis)


register(OpDef("Gather", OpKind.GATHER, (2, 2), _gather_infer, _gather_ref, attrs=AxisAttrs,
               category="shape"))


class OneHotAttrs(Attrs):
    depth: int = Field(ge=0)
    on_value: float = 1.0
    off_value: float = 0.0
    axis: int = -1
    dtype: DType = DType.float32


def _one_hot_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    idx = ins[0]
    check_dtype(idx, "int", "indices")
    axis = normalize_axis(attrs["axis"], idx.rank + 1)
    shape = list(idx.shape)
    shape.insert(axis, attrs["depth"])
    return [TensorType(tuple(shape), attrs["dtype"])]


def _one_hot_ref(xs, a, ctx):
    idx = xs[0].astype(np.int64)
    depth = a["depth"]
    idx = np.where(idx < 0, idx + depth, idx)
    hot = idx[..., None] == np.arange(depth)
    out = np.where(hot, a["on_value"], a["off_value"])
    return np.moveaxis(out, -1, a["axis"] % (idx.ndim + 1))


register(OpDef("OneHot", OpKind.OPAQUE, (1, 1), _one_hot_infer, _one_hot_ref,
               attrs=OneHotAttrs, category="shape"))


class CumSumAttrs(Attrs):
    axis: int = 0
    exclusive: bool = False
    reverse: bool = False


def _cumsum_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    check_dtype(ins[0], "numeric")
    normalize_axis(attrs["axis"], ins[0].rank)
    return [ins[0]]


def _cumsum_ref(xs, a, ctx):
    x = xs[0]
    if x.ndim == 0:  # the sum of the one element (none of it when exclusive)
        return np.zeros_like(x) if a["exclusive"] else x.copy()
    axis = a["axis"] % x.ndim
    if a["reverse"]:
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if a["exclusive"]:
        out = np.roll(out, 1, axis=axis)
        np.moveaxis(out, axis, 0)[0] = 0
    if a["reverse"]:
        out = np.flip(out, axis)
    return out


register(OpDef("CumSum", OpKind.OPAQUE, (1, 1), _cumsum_infer, _cumsum_ref, attrs=CumSumAttrs,
               category="shape"))
