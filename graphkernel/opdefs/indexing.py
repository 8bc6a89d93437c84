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
# Ties. Any choice among equal values is a valid top-k, so the rule is an attribute:
# ``ties`` "first" (ONNX's TopK, and a stable sort): the lower index first, the values in
# order; "torch.topk" and "torch.sort": the choice and the order of ``torch.topk`` /
# ``torch.sort`` (not stable) on the same tensor, which the torch frontend asks for, since
# a torch program's result is eager's. torch's CPU selection (a partial sort or a
# selection then a sort, by the size of k against the axis) keeps among equal values
# whichever its algorithm leaves: not a documented rule, so it is not imitated -- the node
# is computed by torch itself, as Inductor calls aten.topk as an extern kernel. ``sorted``
# False (torch.topk's ``sorted=False``, "torch.topk" only): the values in torch's own
# unsorted order.


class TopKAttrs(Attrs):
    k: int = Field(ge=0)
    axis: int = -1
    largest: bool = True
    ties: Literal["first", "torch.topk", "torch.sort"] = "first"
    sorted: bool = True


def _topk_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    check_dtype(x, "numeric")
    axis = dim_axis(attrs["axis"], x.rank)
    d = x.shape[axis]
    if not isinstance(d, int):
        raise ShapeError("TopK needs a static size along its axis")
    if attrs["k"] > d:
        raise ShapeError(f"k={attrs['k']} exceeds the axis size {d}")
    if attrs.get("ties") == "torch.sort" and attrs["k"] != d:
        raise ShapeError(f"TopK with ties 'torch.sort' is a sort: k={attrs['k']} must be the "
                         f"axis size {d}")
    shape = tuple(attrs["k"] if i == axis else s for i, s in enumerate(x.shape))
    return [TensorType(shape, x.dtype), TensorType(shape, DType.int64)]


def first_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """The indices of ``x`` along ``axis`` from the largest (or smallest) value, the lower
    index first among equal values, NaN above every number (as torch and ONNX rank it)."""
    if x.dtype.kind in "iu":  # ~x = -x - 1: descending without -x's overflow (INT_MIN, uint)
        key = ~x if largest else x
    elif x.dtype.kind == "b":
        key = ~x if largest else x
    else:
        key = -x if largest else x
        if x.dtype.kind == "f":  # NaN counts as the largest value, as in torch
            key = np.where(np.isnan(x), -np.inf if largest else np.inf, key)
    return np.argsort(key, axis=axis, kind="stable")  # ties: the lower index first


def torch_select(x: np.ndarray, k: int, axis: int, largest: bool, ties: str = "torch.topk",
                 ordered: bool = True) -> np.ndarray:
    """The indices ``torch.topk`` (``ties`` "torch.topk") or ``torch.sort`` (``"torch.sort"``,
    the whole axis) picks from ``x`` along ``axis``, computed by torch on the same values
    (bfloat16 widened to float32 exactly: the same comparisons, so the same choice)."""
    try:
        import torch
    except ImportError as e:  # (a graph file may ask for torch's rule without torch)
        from graphkernel.errors import ExecutionError
        raise ExecutionError(f"TopK with ties {ties!r} is computed by torch, which is not "
                             "installed (pip install torch)") from e
    a = x.astype(np.float32) if x.dtype.kind == "V" or x.dtype.name == "bfloat16" else x
    t = torch.from_numpy(np.array(a, copy=True, order="C"))
    if ties == "torch.sort":
        return torch.sort(t, dim=axis, descending=largest).indices.numpy()
    return torch.topk(t, k, dim=axis, largest=largest, sorted=ordered).indices.numpy()


def _topk_ref(xs, a, ctx):
    x = xs[0]
    axis = a["axis"] % x.ndim
    ties = a.get("ties", "first")
    if ties == "first":
        idx = np.take(first_order(x, axis, a["largest"]), np.arange(a["k"]), axis=axis)
    else:
        idx = torch_select(x, a["k"], axis, a["largest"], ties, a.get("sorted", True))
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


register(OpDef("TopK", OpKind.OPAQUE, (1, 1), _topk_infer, _topk_ref, attrs=TopKAttrs,
               category="reduce", doc="the k largest (or smallest) values and their indices (ties: "
                                       "the lower index first, or torch's choice)"))
