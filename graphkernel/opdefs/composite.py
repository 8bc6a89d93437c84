"""Factories for composite ops: registered like basic ops, with ``composite=True``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ops import (
    Attrs,
    NoAttrs,
    OpDef,
    OpKind,
    check_dtype,
    check_scalar_fits,
    register,
)
from graphkernel.tensor_types import TensorType

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(np.asarray(x, np.float64)), dtype=np.float64).astype(x.dtype)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def elementwise_infer(cls: str):
    """Inputs share one dtype (of class ``cls``); the output broadcasts their shapes."""
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        for t in ins[1:]:
            if t.dtype != ins[0].dtype:
                raise ShapeError(f"input dtypes differ ({ins[0].dtype.value} vs "
                                 f"{t.dtype.value}); insert a Cast")
        check_dtype(ins[0], cls)
        return [TensorType(symbolic.broadcast_shapes(*(t.shape for t in ins)), ins[0].dtype)]

    return infer


def scalar_attrs_fit(infer, *keys: str):
    """``infer``, after checking that the attributes ``keys`` (a fill value, clamp bounds),
    which become elements of the first input's dtype, are values of that dtype."""
    def checked(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        for k in keys:
            check_scalar_fits(attrs[k], ins[0], f"attribute '{k}'")
        return infer(ins, attrs)

    return checked


def composite(name: str, arity: tuple[int, int | None], infer, reference,
              attrs: type[Attrs] = NoAttrs, aliases: tuple[str, ...] = (), category: str = "",
              kind: OpKind = OpKind.ELEMWISE, writes: tuple[tuple[int, int], ...] = ()) -> OpDef:
    return register(OpDef(name, kind, arity, infer, reference, attrs=attrs, composite=True,
                          aliases=aliases, category=category, writes=writes))


def elementwise(name: str, arity: int, fn: Callable, attrs: type[Attrs] = NoAttrs,
                aliases: tuple[str, ...] = (), cls: str = "float", category: str = "",
                scalars: tuple[str, ...] = ()) -> OpDef:
    """A composite elementwise op: ``fn(*inputs, **attrs)`` is its reference; ``scalars``
    name attributes that must be values of the input's dtype (see ``scalar_attrs_fit``)."""
    return composite(name, (arity, arity), scalar_attrs_fit(elementwise_infer(cls), *scalars),
                     lambda xs, a, ctx: fn(*xs, **a), attrs, aliases, category)
