"""Composite arithmetic and shape helpers (expanded by expanders/arithmetic.py)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.opdefs.composite import (
    composite,
    elementwise,
    elementwise_infer,
    scalar_attrs_fit,
)
from graphkernel.opdefs.reduce import ReduceAttrs, float_mean, reduce_axes, reduced_shape
from graphkernel.ops import Attrs, OpKind, check_dtype, dim_axis
from graphkernel.tensor_types import TensorType

C = "arithmetic"


class BiasAddAttrs(Attrs):
    data_format: Literal["NCHW", "NHWC", "ND"] = "ND"


def channel_axis(rank: int, data_format: str) -> int:
    """The channel axis of a BiasAdd input; a 0-d input has none (a ShapeError)."""
    if rank == 0:
        raise ShapeError("a 0-d (scalar) input has no channel axis; the op needs an input of "
                         "rank >= 1")
    return 1 if data_format == "NCHW" and rank >= 2 else rank - 1


def _bias_add_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, b = ins
    check_dtype(x, "numeric")
    if b.dtype != x.dtype:
        raise ShapeError(f"bias dtype {b.dtype.value} differs from input {x.dtype.value}")
    c = channel_axis(x.rank, attrs["data_format"])
    if b.rank != 1 or b.shape[0] != x.shape[c]:
        raise ShapeError(f"bias {b} must be 1-D with the channel size {x.shape[c]!r} "
                         f"(axis {c} for {attrs['data_format']})")
    return [x]


def _bias_add_ref(xs, a, ctx):
    x, b = xs
    c = channel_axis(x.ndim, a["data_format"])
    shape = [1] * x.ndim
    shape[c] = -1
    return x + b.reshape(shape)


class AddcmulAttrs(Attrs):
    value: float = 1.0


def _div_mod(a, b):
    return np.floor_divide(a, b) if a.dtype.kind in "iu" else np.floor(a / b)


composite("AddN", (2, None), elementwise_infer("numeric"),
          lambda xs, a, ctx: np.sum(np.broadcast_arrays(*xs), axis=0, dtype=xs[0].dtype),
          category=C)
composite("BiasAdd", (2, 2), _bias_add_infer, _bias_add_ref, BiasAddAttrs, category=C)
elementwise("Square", 1, lambda x: x * x, cls="numeric", category=C)
elementwise("SquaredDifference", 2, lambda a, b: (a - b) ** 2, cls="numeric", category=C)
elementwise("Addcmul", 3, lambda x, t1, t2, value: x + value * t1 * t2, AddcmulAttrs,
            category=C)
elementwise("FusedMulAdd", 3, lambda a, b, c: a * b + c, cls="numeric", category=C)
elementwise("DivMod", 2, _div_mod, cls="numeric", category=C)


def _mean_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    check_dtype(x, "float")
    axes = reduce_axes(x.rank, attrs["axis"])
    return [TensorType(reduced_shape(x, axes, attrs["keep_dims"]), x.dtype)]


composite("ReduceMean", (1, 1), _mean_infer,
          lambda xs, a, ctx: float_mean(xs[0], tuple(reduce_axes(xs[0].ndim, a["axis"])),
                                        a["keep_dims"]),
          ReduceAttrs, aliases=("MeanExt",), category=C, kind=OpKind.REDUCE)


class TileAttrs(Attrs):
    multiples: list[int] = Field(min_length=1)


def _tile_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, m = ins[0], attrs["multiples"]
    if any(k < 0 for k in m):
        raise ShapeError(f"multiples {m} must be >= 0")
    if len(m) < x.rank:
        raise ShapeError(f"multiples {m} has fewer entries than the input rank {x.rank}")
    shape = (1,) * (len(m) - x.rank) + x.shape
    return [TensorType(tuple(symbolic.mul(d, k) for d, k in zip(shape, m, strict=True)),
                       x.dtype)]


composite("Tile", (1, 1), _tile_infer, lambda xs, a, ctx: np.tile(xs[0], a["multiples"]),
          TileAttrs, category=C, kind=OpKind.BROADCAST)


class RepeatAttrs(Attrs):
    repeats: int = Field(ge=0)
    axis: int = 0


def _repeat_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    ax = dim_axis(attrs["axis"], x.rank)
    shape = list(x.shape)
    shape[ax] = symbolic.mul(shape[ax], attrs["repeats"])
    return [TensorType(tuple(shape), x.dtype)]


composite("RepeatInterleaveInt", (1, 1), _repeat_infer,
          lambda xs, a, ctx: np.repeat(xs[0], a["repeats"], axis=a["axis"]), RepeatAttrs,
          category=C, kind=OpKind.BROADCAST)


class FillAttrs(Attrs):
    value: float


def _like_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    return [ins[0]]


composite("OnesLike", (1, 1), _like_infer, lambda xs, a, ctx: np.ones_like(xs[0]),
          category=C, kind=OpKind.BROADCAST)
composite("ZerosLike", (1, 1), _like_infer, lambda xs, a, ctx: np.zeros_like(xs[0]),
          category=C, kind=OpKind.BROADCAST)
composite("FillV2", (1, 1), scalar_attrs_fit(_like_infer, "value"),
          lambda xs, a, ctx: np.full_like(xs[0], a["value"]), FillAttrs, category=C,
          kind=OpKind.BROADCAST)
