"""Opaque compute ops: MatMul, BatchMatMul, Conv2D (NCHW or NHWC), MaxPool, AvgPool (NCHW)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import Field

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ops import CUBE, Attrs, OpDef, OpKind, check_dtype, register
from graphkernel.tensor_types import TensorType


class MatMulAttrs(Attrs):
    transpose_a: bool = False
    transpose_b: bool = False


def _mm_dims(a: TensorType, b: TensorType, attrs: dict) -> tuple:
    if a.dtype != b.dtype:
        raise ShapeError(f"input dtypes differ ({a.dtype.value} vs {b.dtype.value})")
    check_dtype(a, "numeric")
    m, k = a.shape[-2:][::-1] if attrs["transpose_a"] else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if attrs["transpose_b"] else b.shape[-2:]
    if k != k2 and not (isinstance(k, str) or isinstance(k2, str)):
        raise ShapeError(f"contraction dims differ: {k!r} vs {k2!r}")
    return m, n


def _matmul_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    a, b = ins
    if a.rank != 2 or b.rank != 2:
        raise ShapeError("MatMul takes 2-D inputs; use BatchMatMul for batched operands")
    m, n = _mm_dims(a, b, attrs)
    return [TensorType((m, n), a.dtype)]


def _bmm_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    a, b = ins
    if a.rank < 2 or b.rank < 2:
        raise ShapeError("BatchMatMul takes inputs of rank >= 2")
    m, n = _mm_dims(a, b, attrs)
    batch = symbolic.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorType(batch + (m, n), a.dtype)]


def _matmul_ref(xs, attrs, ctx):
    a, b = xs
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


register(OpDef("MatMul", OpKind.OPAQUE, (2, 2), _matmul_infer, _matmul_ref, attrs=MatMulAttrs,
               category="nn", unit=CUBE, product=True))
register(OpDef("BatchMatMul", OpKind.OPAQUE, (2, 2), _bmm_infer, _matmul_ref,
               attrs=MatMulAttrs, category="nn", unit=CUBE, product=True))


class Conv2DAttrs(Attrs):
    strides: list[int] = Field(default=[1, 1], min_length=2, max_length=2)
    pads: list[int] = Field(default=[0, 0, 0, 0], min_length=4, max_length=4)  # t, l, b, r
    dilations: list[int] = Field(default=[1, 1], min_length=2, max_length=2)
    group: int = Field(default=1, ge=1)
    # the layout of the input and the output; the weight is [M, C/group, kh, kw] in both
    data_format: Literal["NCHW", "NHWC"] = "NCHW"


# where N, C, H, W sit in a 4-D tensor of each layout
LAYOUT_AXES = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 3, 1, 2)}
NCHW_TO_NHWC = (0, 2, 3, 1)  # Transpose perm taking NCHW data to NHWC
NHWC_TO_NCHW = (0, 3, 1, 2)


def _window_out(size, k: int, s: int, p0: int, p1: int, d: int, ceil: bool = False) -> int:
    if not isinstance(size, int):
        if ceil:
            raise ShapeError(f"spatial dim {size!r} is symbolic: ceil mode needs it static")
        # floor((size + p0 + p1 - d*(k-1) - 1) / s) + 1, as one derived symbol
        return symbolic.floor_affine(size, p0 + p1 - d * (k - 1) - 1 + s, s)
    span = size + p0 + p1 - d * (k - 1) - 1
    if span < 0:
        raise ShapeError(f"window {k} (dilation {d}) is larger than the padded size "
                         f"{size + p0 + p1}")
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p0:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def _conv_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, w = ins[0], ins[1]
    check_dtype(x, "float")
    fmt = attrs["data_format"]
    if x.rank != 4 or w.rank != 4:
        raise ShapeError(f"Conv2D takes {fmt} input and MCkk weights")
    if x.dtype != w.dtype:
        raise ShapeError(f"input dtypes differ ({x.dtype.value} vs {w.dtype.value})")
    g = attrs["group"]
    n_ax, c_ax, h_ax, w_ax = LAYOUT_AXES[fmt]
    c, m = x.shape[c_ax], w.shape[0]
    if isinstance(c, int) and c != w.shape[1] * g:
        raise ShapeError(f"input channels {c} != weight channels {w.shape[1]} x group {g}")
    if isinstance(m, int) and m % g:
        raise ShapeError(f"output channels {m} are not a multiple of group {g}")
    if len(ins) == 3 and tuple(ins[2].shape) != (m,):
        raise ShapeError(f"bias shape {list(ins[2].shape)} must be [{m}]")
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    oh = _window_out(x.shape[h_ax], w.shape[2], sh, pt, pb, dh)
    ow = _window_out(x.shape[w_ax], w.shape[3], sw, pl, pr, dw)
    out = (x.shape[n_ax], m, oh, ow)  # NCHW
    if fmt == "NHWC":
        out = tuple(out[i] for i in NCHW_TO_NHWC)
    return [TensorType(out, x.dtype)]


def _windows(x: np.ndarray, k: tuple[int, int], s, d, pads, fill: float, extra=(0, 0)):
    """[N, C, OH, OW, kh, kw] windows of x padded by pads (+ extra at the end for ceil mode)."""
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb + extra[0]), (pl, pr + extra[1])),
                constant_values=fill)
    eff = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    win = sliding_window_view(xp, eff, axis=(2, 3))
    return win[:, :, ::s[0], ::s[1], ::d[0], ::d[1]]


def _conv_ref(xs, attrs, ctx):
    x, w = xs[0], xs[1]
    nhwc = attrs["data_format"] == "NHWC"
    if nhwc:
        x = x.transpose(NHWC_TO_NCHW)
    n, c = x.shape[:2]
    m, cg, kh, kw = w.shape
    g = attrs["group"]
    oh, ow = (ctx.out_shapes[0][1:3] if nhwc else ctx.out_shapes[0][2:])
    win = _windows(x, (kh, kw), attrs["strides"], attrs["dilations"], attrs["pads"], 0.0)
    win = win[:, :, :oh, :ow]
    # im2col per group: [G, N*OH*OW, Cg*kh*kw] @ [G, Cg*kh*kw, M/G]
    cols = win.reshape(n, g, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    cols = cols.reshape(g, n * oh * ow, cg * kh * kw)
    wk = w.reshape(g, m // g, cg * kh * kw).transpose(0, 2, 1)
    out = np.matmul(cols, wk)  # [G, N*OH*OW, M/G]
    out = out.reshape(g, n, oh, ow, m // g).transpose(1, 0, 4, 2, 3).reshape(n, m, oh, ow)
    if len(xs) == 3:
        out = out + xs[2].reshape(1, m, 1, 1)
    return np.ascontiguousarray(out.transpose(NCHW_TO_NHWC)) if nhwc else out


register(OpDef("Conv2D", OpKind.OPAQUE, (2, 3), _conv_infer, _conv_ref, attrs=Conv2DAttrs,
               aliases=("Conv2d",), category="nn", unit=CUBE))


class PoolAttrs(Attrs):
    kernel_size: list[int] = Field(min_length=2, max_length=2)
    strides: list[int] = Field(default=[1, 1], min_length=2, max_length=2)
    pads: list[int] = Field(default=[0, 0, 0, 0], min_length=4, max_length=4)
    dilations: list[int] = Field(default=[1, 1], min_length=2, max_length=2)
    ceil_mode: bool = False


class AvgPoolAttrs(PoolAttrs):
    count_include_pad: bool = False


def _pool_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    check_dtype(x, "numeric")
    if x.rank != 4:
        raise ShapeError("2-D pooling takes an NCHW input")
    (kh, kw), (sh, sw) = attrs["kernel_size"], attrs["strides"]
    (pt, pl, pb, pr), (dh, dw) = attrs["pads"], attrs["dilations"]
    oh = _window_out(x.shape[2], kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = _window_out(x.shape[3], kw, sw, pl, pr, dw, attrs["ceil_mode"])
    return [TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)]


def _pool_extra(x: np.ndarray, attrs: dict, out_hw) -> tuple[int, int]:
    """Extra end padding so ceil-mode windows exist (never counted, never the max)."""
    extra = []
    for i in range(2):
        k, s, d = attrs["kernel_size"][i], attrs["strides"][i], attrs["dilations"][i]
        need = (out_hw[i] - 1) * s + d * (k - 1) + 1
        have = x.shape[2 + i] + attrs["pads"][i] + attrs["pads"][i + 2]
        extra.append(max(0, need - have))
    return extra[0], extra[1]


def _maxpool_ref(xs, attrs, ctx):
    x = xs[0]
    oh, ow = ctx.out_shapes[0][2:]
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    extra = _pool_extra(x, attrs, (oh, ow))
    win = _windows(x, attrs["kernel_size"], attrs["strides"], attrs["dilations"], attrs["pads"],
                   fill, extra)
    return win[:, :, :oh, :ow].max(axis=(-1, -2))


def _avgpool_ref(xs, attrs, ctx):
    x = xs[0]
    oh, ow = ctx.out_shapes[0][2:]
    k, s, d, pads = attrs["kernel_size"], attrs["strides"], attrs["dilations"], attrs["pads"]
    extra = _pool_extra(x, attrs, (oh, ow))
    total = _windows(x, k, s, d, pads, 0.0, extra)[:, :, :oh, :ow].sum(axis=(-1, -2))
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype if x.dtype.kind == "f" else np.float64)
    pad_val = 1.0 if attrs["count_include_pad"] else 0.0
    ones = np.pad(ones, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
                  constant_values=pad_val)
    count = _windows(ones, k, s, d, (0, 0, 0, 0), 0.0, extra)[:, :, :oh, :ow].sum(axis=(-1, -2))
    return total / count


register(OpDef("MaxPool", OpKind.OPAQUE, (1, 1), _pool_infer, _maxpool_ref, attrs=PoolAttrs,
               category="nn"))
register(OpDef("AvgPool", OpKind.OPAQUE, (1, 1), _pool_infer, _avgpool_ref, attrs=AvgPoolAttrs,
               aliases=("AveragePool",), category="nn"))
