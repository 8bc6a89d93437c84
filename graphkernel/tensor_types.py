"""Element types and tensor types: the vocabulary every layer shares.

The op registry (``graphkernel.ops``), the op definitions and the IR (``graphkernel.ir``)
all describe values by a ``TensorType``; it lives below them so none of them imports another
to name a type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import ml_dtypes
import numpy as np

from graphkernel import symbolic
from graphkernel.errors import ShapeError, did_you_mean
from graphkernel.symbolic import Dim, Shape


class DType(StrEnum):
    """Element types graphkernel models; numpy carries each (bf16 via ml_dtypes)."""

    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    float64 = "float64"
    int8 = "int8"
    int16 = "int16"
    int32 = "int32"
    int64 = "int64"
    uint8 = "uint8"
    bool = "bool"

    def __str__(self) -> str:
        return self._value_

    @property
    def np(self) -> np.dtype:
        return _NP_OF[self]

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_low_precision(self) -> bool:
        return self in (DType.float16, DType.bfloat16)

    @classmethod
    def parse(cls, value: Any) -> DType:
        """Accept a DType, a numpy dtype, or a name/alias such as 'fp16' or 'half'."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            key = value.strip().lower()
            if key in _ALIASES:
                return _ALIASES[key]
            raise ShapeError(
                f"unknown dtype {value!r}; accepted: {', '.join(d.value for d in DType)}"
                + did_you_mean(key, [d.value for d in DType])
            )
        try:
            npd = np.dtype(value)
        except TypeError:
            raise ShapeError(f"unknown dtype {value!r}") from None
        found = _BY_NP.get(npd)
        if found is not None:
            return found
        raise ShapeError(
            f"numpy dtype {npd} is not supported; accepted: {', '.join(d.value for d in DType)}"
        )


_NP_OF = {
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float32: np.dtype(np.float32),
    DType.float64: np.dtype(np.float64),
    DType.int8: np.dtype(np.int8),
    DType.int16: np.dtype(np.int16),
    DType.int32: np.dtype(np.int32),
    DType.int64: np.dtype(np.int64),
    DType.uint8: np.dtype(np.uint8),
    DType.bool: np.dtype(np.bool_),
}
_BY_NP = {n: d for d, n in _NP_OF.items()}
_FLOATS = {DType.float16, DType.bfloat16, DType.float32, DType.float64}
_INTS = {DType.int8, DType.int16, DType.int32, DType.int64, DType.uint8}
_ALIASES: dict[str, DType] = {d.value: d for d in DType}
_ALIASES.update(
    fp16=DType.float16, half=DType.float16, bf16=DType.bfloat16, fp32=DType.float32,
    float=DType.float32, fp64=DType.float64, double=DType.float64, int=DType.int32,
    long=DType.int64, bool_=DType.bool, boolean=DType.bool,
)


@dataclass(frozen=True, slots=True)
class TensorType:
    """A tensor's shape (ints or symbolic dims) and element type."""

    shape: Shape
    dtype: DType
    _numel: Dim = field(init=False, repr=False, compare=False, hash=False)
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        shape, numel = self.shape, 1
        for d in shape:  # the common case, all dims static, without a call per dim
            if type(d) is not int or d < 0:
                shape = tuple(symbolic.canon(d) for d in shape)
                numel = symbolic.numel(shape)
                break
            numel *= d
        else:
            if type(shape) is not tuple:
                shape = tuple(shape)
        dtype = self.dtype if type(self.dtype) is DType else DType.parse(self.dtype)
        setattr_ = object.__setattr__
        setattr_(self, "shape", shape)
        setattr_(self, "dtype", dtype)
        setattr_(self, "_numel", numel)
        setattr_(self, "_hash", hash((shape, dtype)))

    def __hash__(self) -> int:  # (kept: types are dict keys of every inference)
        return self._hash

    def __reduce__(self) -> tuple:  # rebuilt, not restored: a str's hash differs by process
        return TensorType, (self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return self._numel

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> Dim:
        return symbolic.mul(self.numel, self.dtype.itemsize)

    def concrete(self, env: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(symbolic.evaluate(d, env) for d in self.shape)

    def __str__(self) -> str:  # (_value_: the enum's plain attribute, not its property)
        return f"{self.dtype._value_}{symbolic.format_shape(self.shape)}"
