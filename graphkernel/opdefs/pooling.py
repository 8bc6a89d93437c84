"""Pooling and padding over the spatial axes of NC[D]HW tensors (1-, 2- or 3-D windows), and
their gradients: MaxPool, MaxPoolArgmax, MaxPoolGrad, AvgPool, AvgPoolGrad, AdaptiveAvgPool,
AdaptiveAvgPoolGrad, AdaptiveMaxPool, AdaptiveMaxPoolArgmax, Pad, PadGrad.

Sizes and edge rules are PyTorch's (``pooling_output_shape``): a window's output count is
``floor((in + pads - d·(k-1) - 1 + (ceil ? s-1 : 0)) / s) + 1``, and in ceil mode the last
window must start inside the input or its leading padding. A max over a window takes the
first largest element (a NaN wins, the last one); an index is the element's flat position in
its input plane (``h·W + w``, ``d·H·W + h·W + w``). An average divides by the window's
elements inside the input (and inside the padding with ``count_include_pad``; never the
ceil-mode overhang), or by ``divisor`` when it is set. An adaptive pool's output ``o`` along
an axis of ``I`` inputs and ``O`` outputs covers ``[floor(o·I/O), ceil((o+1)·I/O))``.
"""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import Field

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ops import Attrs, OpDef, OpKind, check_dtype, register
from graphkernel.tensor_types import DType, TensorType

C = "nn"


class PoolAttrs(Attrs):
    kernel_size: list[int] = Field(min_length=1, max_length=3)
    strides: list[int] = Field(default=[1, 1], min_length=1, max_length=3)
    # begins of every spatial axis, then ends (2-D: top, left, bottom, right)
    pads: list[int] = Field(default=[0, 0, 0, 0], min_length=2, max_length=6)
    dilations: list[int] = Field(default=[1, 1], min_length=1, max_length=3)
    ceil_mode: bool = False


class AvgPoolAttrs(PoolAttrs):
    count_include_pad: bool = False
    divisor: int = Field(default=0, ge=0)  # divisor_override (0: the window's count)


class PoolGradAttrs(PoolAttrs):
    input_size: list[int] = Field(min_length=1, max_length=3)  # the forward input's spatial


class AvgPoolGradAttrs(PoolGradAttrs):
    count_include_pad: bool = False
    divisor: int = Field(default=0, ge=0)


class IndexGradAttrs(Attrs):
    input_size: list[int] = Field(min_length=1, max_length=3)


class AdaptiveAttrs(Attrs):
    output_size: list[int] = Field(min_length=1, max_length=3)


class AdaptiveGradAttrs(Attrs):
    input_size: list[int] = Field(min_length=1, max_length=3)


def window_out(size, k: int, s: int, p0: int, p1: int, d: int, ceil: bool = False) -> int:
    """Outputs of a window of ``k`` (dilation ``d``, stride ``s``) over ``size`` padded by
    ``p0`` before and ``p1`` after: PyTorch's rule (see the module docstring)."""
    if k < 1 or s < 1 or d < 1 or p0 < 0 or p1 < 0:
        raise ShapeError(f"window {k}, stride {s}, dilation {d}, pads ({p0}, {p1}): sizes must "
                         "be positive and pads non-negative")
    if not isinstance(size, int):
        if ceil:
            raise ShapeError(f"spatial dim {size!r} is symbolic: ceil mode needs it static")
        # floor((size + p0 + p1 - d*(k-1) - 1) / s) + 1, as one derived symbol
        return symbolic.floor_affine(size, p0 + p1 - d * (k - 1) - 1 + s, s)
    span = size + p0 + p1 - d * (k - 1) - 1
    out = (span + (s - 1 if ceil else 0)) // s + 1  # (Python floors: PyTorch's div_rtn)
    if ceil and out > 0 and (out - 1) * s >= size + p0:
        out -= 1  # the last window must start inside the input or its leading padding
    if out < 1:
        raise ShapeError(f"window {k} (dilation {d}) is larger than the padded size "
                         f"{size + p0 + p1}")
    return out


def _spatial(attrs: dict, x: TensorType, what: str) -> tuple[int, list, list, list, list]:
    """(r, kernel, strides, dilations, pads) checked against an input of rank r + 2."""
    k, s, d, p = (list(attrs[a]) for a in ("kernel_size", "strides", "dilations", "pads"))
    r = len(k)
    if x.rank != r + 2:
        raise ShapeError(f"{r}-D {what} takes an input of rank {r + 2} (N, C and {r} spatial "
                         f"axes), got rank {x.rank}")
    if len(s) != r or len(d) != r or len(p) != 2 * r:
        raise ShapeError(f"{what}: kernel_size {k}, strides {s}, dilations {d} and pads {p} "
                         f"must give {r} values each ({2 * r} pads: begins, then ends)")
    return r, k, s, d, p


def pool_out_shape(x: TensorType, attrs: dict, what: str) -> tuple:
    r, k, s, d, p = _spatial(attrs, x, what)
    out = [window_out(x.shape[2 + i], k[i], s[i], p[i], p[r + i], d[i], attrs["ceil_mode"])
           for i in range(r)]
    return (x.shape[0], x.shape[1], *out)


def _pool_infer(what: str):
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        x = ins[0]
        check_dtype(x, "numeric" if what == "max pooling" else "float")
        return [TensorType(pool_out_shape(x, attrs, what), x.dtype)]

    return infer


def _overhang(in_sp, out_sp, attrs: dict) -> list[int]:
    """Padding past the end so that ceil-mode windows exist (never counted, never a max)."""
    r = len(in_sp)
    extra = []
    for i in range(r):
        k, s, d = attrs["kernel_size"][i], attrs["strides"][i], attrs["dilations"][i]
        need = (out_sp[i] - 1) * s + d * (k - 1) + 1
        have = in_sp[i] + attrs["pads"][i] + attrs["pads"][r + i]
        extra.append(max(0, need - have))
    return extra


def _windows(x: np.ndarray, attrs: dict, out_sp, fill) -> np.ndarray:
    """[N, C, *out, *kernel] windows of x, padded by the pads (and the ceil overhang)."""
    r = x.ndim - 2
    p = attrs["pads"]
    extra = _overhang(x.shape[2:], out_sp, attrs)
    widths = [(0, 0), (0, 0)] + [(p[i], p[r + i] + extra[i]) for i in range(r)]
    xp = np.pad(x, widths, constant_values=fill)
    k, s, d = attrs["kernel_size"], attrs["strides"], attrs["dilations"]
    eff = tuple(d[i] * (k[i] - 1) + 1 for i in range(r))
    win = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + r)))
    sl = (slice(None), slice(None)) + tuple(slice(None, None, s[i]) for i in range(r))
    sl += tuple(slice(None, None, d[i]) for i in range(r))
    win = win[sl]
    return win[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp)]


def _flat(win: np.ndarray, r: int) -> np.ndarray:
    """Windows with their kernel axes flattened into the last one."""
    return win.reshape(win.shape[: 2 + r] + (-1,))


def _plane_index(in_sp, attrs: dict, out_sp) -> np.ndarray:
    """Each window element's flat index in its input plane (-1 in the padding)."""
    idx = np.arange(int(np.prod(in_sp)), dtype=np.int64).reshape((1, 1, *in_sp))
    return _flat(_windows(idx, attrs, out_sp, -1), len(in_sp))


def _max_and_index(x: np.ndarray, attrs: dict, out_sp) -> tuple[np.ndarray, np.ndarray]:
    r = x.ndim - 2
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    vals = _flat(_windows(x, attrs, out_sp, low), r)
    where = np.broadcast_to(_plane_index(x.shape[2:], attrs, out_sp), vals.shape)
    valid = where >= 0
    if x.dtype.kind == "f":
        isnan = np.isnan(vals)
        k = vals.shape[-1]
        last_nan = k - 1 - np.argmax(isnan[..., ::-1], axis=-1)
        masked = np.where(valid & ~isnan, vals, -np.inf)
        first = np.argmax(masked, axis=-1)
        best = np.take_along_axis(masked, first[..., None], -1)[..., 0]
        first_valid = np.argmax(valid, axis=-1)
        pick = np.where(isnan.any(-1), last_nan, np.where(best > -np.inf, first, first_valid))
    else:
        pick = np.argmax(np.where(valid, vals, low), axis=-1)
    value = np.take_along_axis(vals, pick[..., None], -1)[..., 0]
    return value, np.take_along_axis(where, pick[..., None], -1)[..., 0]


def _maxpool_ref(xs, attrs, ctx):
    return _max_and_index(xs[0], attrs, ctx.out_shapes[0][2:])[0]


def _argmax_ref(xs, attrs, ctx):
    return _max_and_index(xs[0], attrs, ctx.out_shapes[0][2:])[1]


def _counts(in_sp, out_sp, attrs: dict, dtype) -> np.ndarray:
    """The divisor of each average window: its elements inside the input (and the padding
    with count_include_pad), or the fixed divisor."""
    if attrs["divisor"]:
        return np.full((1, 1, *out_sp), attrs["divisor"], dtype)
    r = len(in_sp)
    p = attrs["pads"]
    ones = np.ones((1, 1, *in_sp), dtype)
    if attrs["count_include_pad"]:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(p[i], p[r + i]) for i in range(r)],
                      constant_values=1)
        attrs = attrs | {"pads": [0] * (2 * r)}
    return _flat(_windows(ones, attrs, out_sp, 0), r).sum(-1)


def _avgpool_ref(xs, attrs, ctx):
    x = xs[0]
    out_sp = ctx.out_shapes[0][2:]
    total = _flat(_windows(x, attrs, out_sp, 0), x.ndim - 2).sum(-1)
    return total / _counts(x.shape[2:], out_sp, attrs, x.dtype)


register(OpDef("MaxPool", OpKind.OPAQUE, (1, 1), _pool_infer("max pooling"), _maxpool_ref,
               attrs=PoolAttrs, category=C,
               doc="the largest element of each window (1-, 2- or 3-D)"))
register(OpDef("AvgPool", OpKind.OPAQUE, (1, 1), _pool_infer("average pooling"), _avgpool_ref,
               attrs=AvgPoolAttrs, aliases=("AveragePool",), category=C,
               doc="the mean of each window (1-, 2- or 3-D)"))


def _argmax_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    check_dtype(x, "numeric")
    return [TensorType(pool_out_shape(x, attrs, "max pooling"), DType.int64)]


register(OpDef("MaxPoolArgmax", OpKind.OPAQUE, (1, 1), _argmax_infer, _argmax_ref,
               attrs=PoolAttrs, category=C,
               doc="where MaxPool's maxima are: flat indices in each input plane"))


# ----------------------------------------------------------------- gradients
def _grad_shape(dy: TensorType, size: list[int]) -> tuple:
    if dy.rank != len(size) + 2:
        raise ShapeError(f"the gradient of rank {dy.rank} does not match input_size {size} "
                         f"(rank {len(size) + 2} expected)")
    return (dy.shape[0], dy.shape[1], *size)


def _maxgrad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy, idx = ins
    check_dtype(dy, "float")
    if not idx.dtype.is_int or tuple(idx.shape) != tuple(dy.shape):
        raise ShapeError(f"indices {idx} must be integers of the gradient's shape "
                         f"{list(dy.shape)}")
    return [TensorType(_grad_shape(dy, attrs["input_size"]), dy.dtype)]


def _maxgrad_ref(xs, attrs, ctx):
    dy, idx = xs
    n, c = dy.shape[:2]
    plane = int(np.prod(attrs["input_size"]))
    out = np.zeros((n * c, plane), dy.dtype)
    rows = np.repeat(np.arange(n * c), dy[0, 0].size)
    np.add.at(out, (rows, idx.reshape(-1)), dy.reshape(-1))
    return out.reshape((n, c, *attrs["input_size"]))


register(OpDef("MaxPoolGrad", OpKind.OPAQUE, (2, 2), _maxgrad_infer, _maxgrad_ref,
               attrs=IndexGradAttrs, category=C,
               doc="dx: each gradient element added at its window's maximum (by index)"))


def _avggrad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy = ins[0]
    check_dtype(dy, "float")
    x = TensorType(_grad_shape(dy, attrs["input_size"]), dy.dtype)
    want = pool_out_shape(x, attrs, "average pooling gradient")
    if tuple(want) != tuple(dy.shape):
        raise ShapeError(f"the gradient's shape {list(dy.shape)} is not the pooling's output "
                         f"{list(want)} on input_size {attrs['input_size']}")
    return [x]


def _avggrad_ref(xs, attrs, ctx):
    dy = xs[0]
    in_sp = tuple(attrs["input_size"])
    out_sp = dy.shape[2:]
    r = len(in_sp)
    g = dy / _counts(in_sp, out_sp, attrs, dy.dtype)
    p, k, s, d = attrs["pads"], attrs["kernel_size"], attrs["strides"], attrs["dilations"]
    extra = _overhang(in_sp, out_sp, attrs)
    padded = [in_sp[i] + p[i] + p[r + i] + extra[i] for i in range(r)]
    acc = np.zeros(dy.shape[:2] + tuple(padded), dy.dtype)
    for tap in itertools.product(*(range(ki) for ki in k)):
        sl = tuple(slice(tap[i] * d[i], tap[i] * d[i] + (out_sp[i] - 1) * s[i] + 1, s[i])
                   for i in range(r))
        acc[(slice(None), slice(None)) + sl] += g
    return acc[(slice(None), slice(None)) + tuple(slice(p[i], p[i] + in_sp[i])
                                                  for i in range(r))]


register(OpDef("AvgPoolGrad", OpKind.OPAQUE, (1, 1), _avggrad_infer, _avggrad_ref,
               attrs=AvgPoolGradAttrs, category=C,
               doc="dx: each gradient element spread evenly over its window"))


# -------------------------------------------------------------------- adaptive
def adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """The input range ``[start, end)`` of each of ``out`` adaptive windows over ``size``."""
    return [((o * size) // out, -(-((o + 1) * size) // out)) for o in range(out)]


def _adaptive_infer(cls: str, index: bool = False):
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        x = ins[0]
        check_dtype(x, cls)
        o = list(attrs["output_size"])
        if x.rank != len(o) + 2:
            raise ShapeError(f"{len(o)}-D adaptive pooling takes an input of rank "
                             f"{len(o) + 2}, got rank {x.rank}")
        if any(v < 1 for v in o):
            raise ShapeError(f"output_size {o}: every size must be at least 1")
        for d in x.shape[2:]:
            if not isinstance(d, int):
                raise ShapeError(f"adaptive pooling over a symbolic spatial dim {d!r}")
        return [TensorType((x.shape[0], x.shape[1], *o), DType.int64 if index else x.dtype)]

    return infer


def _adaptive_avg_ref(xs, attrs, ctx):
    x = xs[0]
    for i, o in enumerate(attrs["output_size"]):
        ax = 2 + i
        parts = [x.take(range(a, b), axis=ax).mean(axis=ax, keepdims=True)
                 for a, b in adaptive_bounds(x.shape[ax], o)]
        x = np.concatenate(parts, axis=ax)
    return x


def _adaptive_max(x: np.ndarray, out_sp) -> tuple[np.ndarray, np.ndarray]:
    r = x.ndim - 2
    in_sp = x.shape[2:]
    plane = np.arange(int(np.prod(in_sp)), dtype=np.int64).reshape(in_sp)
    vals = np.zeros(x.shape[:2] + tuple(out_sp), x.dtype)
    idx = np.zeros(x.shape[:2] + tuple(out_sp), np.int64)
    bounds = [adaptive_bounds(in_sp[i], out_sp[i]) for i in range(r)]
    for pos in itertools.product(*(range(o) for o in out_sp)):
        box = tuple(slice(*bounds[i][pos[i]]) for i in range(r))
        w = x[(slice(None), slice(None)) + box].reshape(x.shape[:2] + (-1,))
        where = plane[box].reshape(-1)
        if x.dtype.kind == "f":
            isnan = np.isnan(w)
            last_nan = w.shape[-1] - 1 - np.argmax(isnan[..., ::-1], axis=-1)
            first = np.argmax(np.where(isnan, -np.inf, w), axis=-1)
            pick = np.where(isnan.any(-1), last_nan, first)
        else:
            pick = np.argmax(w, axis=-1)
        at = (slice(None), slice(None)) + pos
        vals[at] = np.take_along_axis(w, pick[..., None], -1)[..., 0]
        idx[at] = where[pick]
    return vals, idx


register(OpDef("AdaptiveAvgPool", OpKind.OPAQUE, (1, 1), _adaptive_infer("float"),
               _adaptive_avg_ref, attrs=AdaptiveAttrs, category=C,
               doc="the mean of each adaptive window (output_size windows per axis)"))
register(OpDef("AdaptiveMaxPool", OpKind.OPAQUE, (1, 1), _adaptive_infer("numeric"),
               lambda xs, a, ctx: _adaptive_max(xs[0], a["output_size"])[0],
               attrs=AdaptiveAttrs, category=C,
               doc="the largest element of each adaptive window"))
register(OpDef("AdaptiveMaxPoolArgmax", OpKind.OPAQUE, (1, 1),
               _adaptive_infer("numeric", index=True),
               lambda xs, a, ctx: _adaptive_max(xs[0], a["output_size"])[1],
               attrs=AdaptiveAttrs, category=C,
               doc="where AdaptiveMaxPool's maxima are: flat indices in each input plane"))


def _adaptive_grad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy = ins[0]
    check_dtype(dy, "float")
    return [TensorType(_grad_shape(dy, attrs["input_size"]), dy.dtype)]


def _adaptive_avg_grad_ref(xs, attrs, ctx):
    g = xs[0]
    for i, size in enumerate(attrs["input_size"]):
        ax = 2 + i
        shape = list(g.shape)
        shape[ax] = size
        out = np.zeros(shape, g.dtype)
        for o, (a, b) in enumerate(adaptive_bounds(size, g.shape[ax])):
            part = g.take([o], axis=ax) / (b - a)
            sl = [slice(None)] * g.ndim
            sl[ax] = slice(a, b)
            out[tuple(sl)] += part
        g = out
    return g


register(OpDef("AdaptiveAvgPoolGrad", OpKind.OPAQUE, (1, 1), _adaptive_grad_infer,
               _adaptive_avg_grad_ref, attrs=AdaptiveGradAttrs, category=C,
               doc="dx of AdaptiveAvgPool: each gradient element spread over its window"))


# ----------------------------------------------------------------------- pads
class PadAttrs(Attrs):
    # begins of every axis, then ends (ONNX's order); negative values crop
    pads: list[int] = Field(min_length=0)
    mode: Literal["constant", "reflect", "edge", "wrap"] = "constant"
    value: float = 0.0


def _pad_widths(rank: int, pads: list[int]) -> list[tuple[int, int]]:
    if len(pads) != 2 * rank:
        raise ShapeError(f"pads {pads} must hold {2 * rank} values for rank {rank} (begins, "
                         "then ends)")
    return [(pads[i], pads[rank + i]) for i in range(rank)]


def _pad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x = ins[0]
    widths = _pad_widths(x.rank, attrs["pads"])
    shape = []
    for d, (a, b) in zip(x.shape, widths, strict=True):
        if a == b == 0:
            shape.append(d)
            continue
        if not isinstance(d, int):
            raise ShapeError(f"padding a symbolic dim {d!r}")
        n = d + a + b
        if n < 0 or (attrs["mode"] != "constant" and (n == 0 or d == 0)):
            raise ShapeError(f"pads ({a}, {b}) of a dim of {d} leave {n} elements")
        if attrs["mode"] == "reflect" and (max(a, b) >= d):
            raise ShapeError(f"reflect pads ({a}, {b}) must be smaller than the dim ({d})")
        shape.append(n)
    if attrs["mode"] == "constant":
        from graphkernel.ops import check_scalar_fits

        check_scalar_fits(attrs["value"], x, "attribute 'value'")
    return [TensorType(tuple(shape), x.dtype)]


def _source_index(size: int, a: int, b: int, mode: str) -> np.ndarray:
    """For each position of an axis padded by (a, b), the index of the element it copies (-1:
    the constant). Negative pads crop."""
    pos = np.arange(-a, size + b)
    if mode == "constant":
        return np.where((pos >= 0) & (pos < size), pos, -1)
    if mode == "edge":
        return np.clip(pos, 0, size - 1)
    if mode == "wrap":
        return np.mod(pos, size)
    period = 2 * (size - 1)  # reflect, the edge not repeated
    if period == 0:
        return np.zeros_like(pos)
    m = np.mod(pos, period)
    return np.where(m < size, m, period - m)


def _pad_ref(xs, attrs, ctx):
    x = xs[0]
    widths = _pad_widths(x.ndim, attrs["pads"])
    idx = [_source_index(d, a, b, attrs["mode"]) for d, (a, b) in zip(x.shape, widths,
                                                                       strict=True)]
    if attrs["mode"] != "constant":
        return x[np.ix_(*idx)] if x.ndim else x.copy()
    out = np.full(tuple(len(i) for i in idx), attrs["value"], x.dtype)
    keep = [np.nonzero(i >= 0)[0] for i in idx]
    src = [i[k] for i, k in zip(idx, keep, strict=True)]
    if all(len(k) for k in keep):
        out[np.ix_(*keep)] = x[np.ix_(*src)]
    return out


register(OpDef("Pad", OpKind.OPAQUE, (1, 1), _pad_infer, _pad_ref, attrs=PadAttrs, category=C,
               doc="pads (or crops) every axis: a constant, the reflection, the edge element "
                   "or the wrapped-around elements"))


class PadGradAttrs(PadAttrs):
    pass


def _padgrad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    dy = ins[0]
    check_dtype(dy, "float")
    widths = _pad_widths(dy.rank, attrs["pads"])
    shape = []
    for d, (a, b) in zip(dy.shape, widths, strict=True):
        if not isinstance(d, int) and (a or b):
            raise ShapeError(f"the gradient of a pad of a symbolic dim {d!r}")
        n = d - a - b if (a or b) else d
        if n < 1 and (a or b):
            raise ShapeError(f"pads ({a}, {b}) are larger than the gradient's dim {d}")
        shape.append(n)
    return [TensorType(tuple(shape), dy.dtype)]


def _padgrad_ref(xs, attrs, ctx):
    dy = xs[0]
    shape = ctx.out_shapes[0]
    widths = _pad_widths(dy.ndim, attrs["pads"])
    idx = [_source_index(d, a, b, attrs["mode"]) for d, (a, b) in zip(shape, widths,
                                                                       strict=True)]
    out = np.zeros(shape, dy.dtype)
    keep = [np.nonzero(i >= 0)[0] for i in idx]
    if all(len(k) for k in keep):
        src = dy[np.ix_(*keep)]
        np.add.at(out, np.ix_(*(i[k] for i, k in zip(idx, keep, strict=True))), src)
    return out


register(OpDef("PadGrad", OpKind.OPAQUE, (1, 1), _padgrad_infer, _padgrad_ref,
               attrs=PadGradAttrs, category=C,
               doc="dx of Pad: each gradient element added to the element it copied"))
