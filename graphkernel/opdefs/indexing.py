"""Index-driven ops: Range (an arithmetic sequence, its length possibly symbolic),
GatherElements and ScatterElements (ONNX's element-wise gather and scatter along one axis),
IndexPut (whole slices along one axis set or added at a 1-D index), TopK (the k largest or
smallest along an axis, with their indices)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ir import DType, TensorType
from graphkernel.ops import Attrs, OpDef, OpKind, check_dtype, dim_axis, normalize_axis, register


# ------------------------------------------------------------------- Range
class RangeAttrs(Attrs):
    """``start + delta * i`` for i in [0, length); ``length`` may be a symbolic dim."""

    start: float | int = 0
    delta: float | int = 1
    length: int | str
    dtype: DType = DType.int64


def _range_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    length = symbolic.canon(attrs["length"])
    return [TensorType((length,), attrs["dtype"])]


def _range_ref(xs, a, ctx):
    n = ctx.out_shapes[0][0]
    dt = ctx.out_dtypes[0]
    if np.dtype(dt).kind in "iu":  # exact integer steps, as torch.arange computes them
        return (int(a["start"]) + int(a["delta"]) * np.arange(n, dtype=np.int64)).astype(dt)
    return (a["start"] + a["delta"] * np.arange(n, dtype=np.float64)).astype(dt)


register(OpDef("Range", OpKind.OPAQUE, (0, 0), _range_infer, _range_ref, attrs=RangeAttrs,
               category="shape",
               doc="start + delta * i for i < length (length may be symbolic)"))


# ---------------------------------------------------- GatherElements/ScatterElements
class ElementsAttrs(Attrs):
    axis: int = 0


def _check_index(data: TensorType, idx: TensorType, what: str) -> int:
    check_dtype(idx, "int", "indices")
    if idx.rank != data.rank:
        raise ShapeError(f"indices rank {idx.rank} != {what} rank {data.rank}")
    return data.rank


def _gather_el_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    data, idx = ins
    rank = _check_index(data, idx, "data")
    axis = normalize_axis(attrs["axis"], rank)
    for i, (d, k) in enumerate(zip(data.shape, idx.shape, strict=True)):
        if i != axis and isinstance(d, int) and isinstance(k, int) and k > d:
            raise ShapeError(f"indices dim {i} ({k}) exceeds the data dim ({d})")
    return [TensorType(idx.shape, data.dtype)]


def _gather_el_ref(xs, a, ctx):
    data, idx = xs
    axis = a["axis"] % data.ndim
    # torch.gather allows indices smaller than the data in the other dims: take that corner
    corner = tuple(slice(None) if i == axis else slice(0, k) for i, k in enumerate(idx.shape))
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return np.take_along_axis(data[corner], idx, axis=axis)


register(OpDef("GatherElements", OpKind.GATHER, (2, 2), _gather_el_infer, _gather_el_ref,
               attrs=ElementsAttrs, category="shape",
               doc="out[..i..] = data[..idx[..i..]..] along axis (torch.gather)"))


class ScatterAttrs(Attrs):
    axis: int = 0
    reduction: Literal["none", "add"] = "none"


def _scatter_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    data, idx, upd = ins
    rank = _check_index(data, idx, "data")
    normalize_axis(attrs["axis"], rank)
    if upd.dtype != data.dtype:
        raise ShapeError(f"updates dtype {upd.dtype.value} != data dtype {data.dtype.value}")
    if upd.rank != rank:
        raise ShapeError(f"updates rank {upd.rank} != data rank {rank}")
    return [data]


def _scatter_ref(xs, a, ctx):
    data, idx, upd = xs
    axis = a["axis"] % data.ndim
    out = data.copy()
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    upd = upd[tuple(slice(0, k) for k in idx.shape)]
    pos = list(np.indices(idx.shape, sparse=True))
    pos[axis] = idx
    if a["reduction"] == "add":
        np.add.at(out, tuple(pos), upd)
    else:  # later updates win, as in a sequential loop (torch leaves duplicates unspecified)
        out[tuple(pos)] = upd
    return out


register(OpDef("ScatterElements", OpKind.OPAQUE, (3, 3), _scatter_infer, _scatter_ref,
               attrs=ScatterAttrs, category="shape",
               doc="data with data[..idx[..i..]..] = updates[..i..] (or += with 'add')"))


class IndexPutAttrs(Attrs):
    axis: int = 0
    reduction: Literal["none", "add"] = "none"


def _index_put_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    data, idx, upd = ins
    check_dtype(idx, "int", "indices")
    if idx.rank != 1:
        raise ShapeError(f"IndexPut indices must be 1-D, got rank {idx.rank}")
    axis = normalize_axis(attrs["axis"], data.rank)
    if upd.dtype != data.dtype:
        raise ShapeError(f"updates dtype {upd.dtype.value} != data dtype {data.dtype.value}")
    want = (*data.shape[:axis], idx.shape[0], *data.shape[axis + 1:])
    if upd.rank != data.rank or not all(map(symbolic.eq, upd.shape, want)):
        raise ShapeError(f"updates shape {upd.shape} != {want} (the data's with the indexed "
                         "axis the indices' length)")
    return [data]


def _index_put_ref(xs, a, ctx):
    data, idx, upd = xs
    axis = a["axis"] % data.ndim
    shape = [1] * data.ndim
    shape[axis] = idx.shape[0]
    rows = np.broadcast_to(idx.reshape(shape), upd.shape)  # ScatterElements' indices
    return _scatter_ref([data, rows, upd], a, ctx)


register(OpDef("IndexPut", OpKind.OPAQUE, (3, 3), _index_put_infer, _index_put_ref,
               attrs=IndexPutAttrs, category="shape",
               doc="data with its slices idx[i] along axis set to (or += with 'add') the "
                   "slices i of updates (torch's index_put / index_add with one index)"))


# -------------------------------------------------------------------- TopK
class TopKAttrs(Attrs):
    k: int = Field(ge=0)
    axis: int = -1
    largest: bool = True


def _topk_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    check_dtype(x, "numeric")
    axis = dim_axis(attrs["axis"], x.rank)
    d = x.shape[axis]
    if not isinstance(d, int):
        raise ShapeError("TopK needs a static size along its axis")
    if attrs["k"] > d:
        raise ShapeError(f"k={attrs['k']} exceeds the axis size {d}")
    shape = tuple(attrs["k"] if i == axis else s for i, s in enumerate(x.shape))
    return [TensorType(shape, x.dtype), TensorType(shape, DType.int64)]


def _topk_ref(xs, a, ctx):
    x = xs[0]
    axis = a["axis"] % x.ndim
    key = -x if a["largest"] else x
    if x.dtype.kind == "f":  # NaN counts as the largest value, as in torch
        key = np.where(np.isnan(x), -np.inf if a["largest"] else np.inf, key)
    order = np.argsort(key, axis=axis, kind="stable")  # ties: the lower index first
    idx = np.take(order, np.arange(a["k"]), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


register(OpDef("TopK", OpKind.OPAQUE, (1, 1), _topk_infer, _topk_ref, attrs=TopKAttrs,
               category="reduce", doc="the k largest (or smallest) values and their indices"))
