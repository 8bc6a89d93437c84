"""Expansions of arithmetic and shape helpers into basic ops."""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.expanders.base import NUMERIC, expander, static_dims
from graphkernel.ir import DType
from graphkernel.opdefs.arithmetic import channel_axis
from graphkernel.opdefs.reduce import reduce_axes


@expander("AddN", dtypes=NUMERIC)
def add_n(b, *xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = b.add(acc, x)  # a chain of Add, in input order (as op-by-op execution sums)
    return acc


@expander("BiasAdd", dtypes=NUMERIC, fp32_inside=False)
def bias_add(b, x, bias, *, data_format):
    c = channel_axis(x.type.rank, data_format)
    shape = [1] * (x.type.rank - c)
    shape[0] = x.shape[c]
    return b.add(x, b.reshape(bias, shape))  # x + bias reshaped to the channel axis


@expander("Square", dtypes=NUMERIC, fp32_inside=False)
def square(b, x):
    return b.mul(x, x)


@expander("SquaredDifference", dtypes=NUMERIC)
def squared_difference(b, x, y):
    d = b.sub(x, y)
    return b.mul(d, d)


@expander("Addcmul")
def addcmul(b, x, t1, t2, *, value):
    return b.add(x, b.mul(b.mul(t1, t2), value))  # x + value t1 t2


@expander("FusedMulAdd", dtypes=NUMERIC)
def fused_mul_add(b, x, y, z):
    return b.add(b.mul(x, y), z)


@expander("DivMod", dtypes=NUMERIC)
def div_mod(b, x, y):
    if x.dtype.is_int:
        return b.floor_div(x, y)
    return b.floor(b.div(x, y))  # floor(a / b)


@expander("ReduceMean",
          validators=[static_dims(lambda n: reduce_axes(n.inputs[0].type.rank, n.attrs["axis"]),
                                  "reduced dims")])
def reduce_mean(b, x, *, axis, keep_dims):
    return b.reduce_mean(x, reduce_axes(x.type.rank, axis), keep_dims)  # sum / N


@expander("Tile", dtypes=NUMERIC | {DType.bool}, fp32_inside=False)
def tile(b, x, *, multiples):
    # [d0, d1] -> reshape [1, d0, 1, d1] -> broadcast [m0, d0, m1, d1] -> reshape [m0 d0, m1 d1]
    shape = (1,) * (len(multiples) - x.type.rank) + tuple(x.shape)
    inter = [d for dim in shape for d in (1, dim)]
    wide = [d for m, dim in zip(multiples, shape, strict=True) for d in (m, dim)]
    y = b.broadcast_to(b.reshape(x, inter), wide)
    return b.reshape(y, [symbolic.mul(m, d) for m, d in zip(multiples, shape, strict=True)])


@expander("RepeatInterleaveInt", dtypes=NUMERIC | {DType.bool}, fp32_inside=False)
def repeat_interleave(b, x, *, repeats, axis):
    ax = axis % x.type.rank
    shape = list(x.shape)
    inter = shape[:ax + 1] + [1] + shape[ax + 1:]
    wide = shape[:ax + 1] + [repeats] + shape[ax + 1:]
    out = list(shape)
    out[ax] = symbolic.mul(shape[ax], repeats)
    return b.reshape(b.broadcast_to(b.reshape(x, inter), wide), out)


def _fill(b, x, value):
    return b.broadcast_to(b.const(value, like=x), list(x.shape))


@expander("OnesLike", dtypes=NUMERIC | {DType.bool}, fp32_inside=False)
def ones_like(b, x):
    return _fill(b, x, 1)


@expander("ZerosLike", dtypes=NUMERIC | {DType.bool}, fp32_inside=False)
def zeros_like(b, x):
    return _fill(b, x, 0)


@expander("FillV2", dtypes=NUMERIC | {DType.bool}, fp32_inside=False)
def fill_v2(b, x, *, value):
    return _fill(b, x, value)
