"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, Select, Cast."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ops import Attrs, OpDef, OpKind, check_dtype, register
from graphkernel.tensor_types import DType, TensorType


def _vectorize(fn: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    """numpy has no erf/erfc; math's are correctly rounded in float64."""
    vec = np.frompyfunc(fn, 1, 1)

    def apply(x: np.ndarray) -> np.ndarray:
        return np.asarray(vec(np.asarray(x, np.float64)), dtype=np.float64)

    return apply


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)


def _round_half_even(x: np.ndarray) -> np.ndarray:
    return np.round(x)


# name: (numpy function, accepted dtype class, output dtype or None for "same as input")
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str, DType | None]] = {
    "Abs": (np.abs, "numeric", None),
    "Neg": (np.negative, "numeric", None),
    "Exp": (np.exp, "float", None),
    "Expm1": (np.expm1, "float", None),
    "Log": (np.log, "float", None),
    "Log1p": (np.log1p, "float", None),
    "Sqrt": (np.sqrt, "float", None),
    "Rsqrt": (_rsqrt, "float", None),
    "Reciprocal": (np.reciprocal, "float", None),
    "Sin": (np.sin, "float", None),
    "Cos": (np.cos, "float", None),
    "Tan": (np.tan, "float", None),
    "Asin": (np.arcsin, "float", None),
    "Acos": (np.arccos, "float", None),
    "Atan": (np.arctan, "float", None),
    "Tanh": (np.tanh, "float", None),
    "Erf": (_vectorize(math.erf), "float", None),
    "Erfc": (_vectorize(math.erfc), "float", None),
    "Floor": (np.floor, "float", None),
    "Ceil": (np.ceil, "float", None),
    "Trunc": (np.trunc, "float", None),
    "Round": (_round_half_even, "float", None),  # half to even, like ONNX and numpy
    "Sign": (np.sign, "numeric", None),
    "IsFinite": (np.isfinite, "float", DType.bool),
    "IsNan": (np.isnan, "float", DType.bool),
    "IsInf": (np.isinf, "float", DType.bool),
    "LogicalNot": (np.logical_not, "bool", None),
    "Identity": (lambda x: x, "any", None),
}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics, as ONNX Div on ints)."""
    if a.dtype.kind == "f":
        return a / b
    q = np.floor_divide(a, b)
    fix = (np.mod(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.power(a, np.maximum(b, 0)) * np.where(b < 0, 0, 1).astype(a.dtype)
    return np.power(a, b)


# name: (numpy function, accepted dtype class, output dtype or None, aliases)
BINARY: dict[str, tuple[Callable, str, DType | None, tuple[str, ...]]] = {
    "Add": (np.add, "numeric", None, ()),
    "Sub": (np.subtract, "numeric", None, ()),
    "Mul": (np.multiply, "numeric", None, ()),
    "Div": (_int_div, "numeric", None, ("RealDiv",)),
    "FloorDiv": (np.floor_divide, "numeric", None, ()),
    "FloorMod": (np.mod, "numeric", None, ()),    # sign of the divisor (Python %)
    "Mod": (np.fmod, "numeric", None, ()),        # sign of the dividend (C fmod)
    "Pow": (_pow, "numeric", None, ()),
    "Maximum": (np.maximum, "numeric", None, ()),
    "Minimum": (np.minimum, "numeric", None, ()),
    "Atan2": (np.arctan2, "float", None, ()),     # Atan2(y, x)
    "Equal": (np.equal, "any", DType.bool, ()),
    "NotEqual": (np.not_equal, "any", DType.bool, ()),
    "Greater": (np.greater, "numeric", DType.bool, ()),
    "GreaterEqual": (np.greater_equal, "numeric", DType.bool, ()),
    "Less": (np.less, "numeric", DType.bool, ()),
    "LessEqual": (np.less_equal, "numeric", DType.bool, ()),
    "LogicalAnd": (np.logical_and, "bool", None, ()),
    "LogicalOr": (np.logical_or, "bool", None, ()),
    "BitwiseAnd": (np.bitwise_and, "intbool", None, ()),
    "BitwiseOr": (np.bitwise_or, "intbool", None, ()),
}


def _unary_infer(cls: str, out: DType | None):
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        check_dtype(ins[0], cls)
        return [TensorType(ins[0].shape, out or ins[0].dtype)]

    return infer


def _binary_infer(cls: str, out: DType | None):
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        a, b = ins
        if a.dtype != b.dtype:
            raise ShapeError(f"input dtypes differ ({a.dtype.value} vs {b.dtype.value}); "
                             "insert a Cast so both inputs have the same dtype")
        check_dtype(a, cls)
        return [TensorType(symbolic.broadcast_shapes(a.shape, b.shape), out or a.dtype)]

    return infer


def _unary_ref(fn):
    return lambda xs, attrs, ctx: fn(xs[0])


def _binary_ref(fn):
    return lambda xs, attrs, ctx: fn(xs[0], xs[1])


for _name, (_fn, _cls, _out) in UNARY.items():
    register(OpDef(_name, OpKind.ELEMWISE, (1, 1), _unary_infer(_cls, _out), _unary_ref(_fn),
                   category="unary", view=_name == "Identity"))

for _name, (_fn, _cls, _out, _aliases) in BINARY.items():
    register(OpDef(_name, OpKind.ELEMWISE, (2, 2), _binary_infer(_cls, _out), _binary_ref(_fn),
                   aliases=_aliases, category="binary"))


class CastAttrs(Attrs):
    dtype: DType


def _cast_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    return [TensorType(ins[0].shape, attrs["dtype"])]


def _cast_ref(xs, attrs, ctx):
    x = xs[0]
    if x.dtype.kind == "f" and ctx.out_dtypes[0].kind in "iub":
        if ctx.out_dtypes[0].kind == "b":
            return x != 0
        return np.trunc(x)
    return x


register(OpDef("Cast", OpKind.ELEMWISE, (1, 1), _cast_infer, _cast_ref, attrs=CastAttrs,
               category="unary"))


def _select_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    cond, x, y = ins
    check_dtype(cond, "bool", "condition")
    if x.dtype != y.dtype:
        raise ShapeError(f"branch dtypes differ ({x.dtype.value} vs {y.dtype.value})")
    return [TensorType(symbolic.broadcast_shapes(cond.shape, x.shape, y.shape), x.dtype)]


register(OpDef("Select", OpKind.ELEMWISE, (3, 3), _select_infer,
               lambda xs, attrs, ctx: np.where(xs[0], xs[1], xs[2]), aliases=("Where",),
               category="select"))
