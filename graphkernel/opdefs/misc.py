"""Constant, Assign and Opaque (externally implemented). GraphKernel, the op holding a fused
subgraph, is defined with the IR it holds, in graphkernel/kernels.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import field_validator

from graphkernel.errors import ExecutionError, ShapeError, did_you_mean
from graphkernel.ops import Attrs, OpDef, OpKind, register
from graphkernel.tensor_types import DType, TensorType


class ConstantAttrs(Attrs):
    value: np.ndarray

    @field_validator("value", mode="before")
    @classmethod
    def _to_array(cls, v: Any) -> np.ndarray:
        arr = np.asarray(v)
        DType.parse(arr.dtype)  # rejects unsupported dtypes with a clear message
        return arr


def _const_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    v = attrs["value"]
    return [TensorType(tuple(int(d) for d in v.shape), DType.parse(v.dtype))]


register(OpDef("Constant", OpKind.VIRTUAL, (0, 0), _const_infer,
               lambda xs, a, ctx: a["value"], attrs=ConstantAttrs, category="misc"))


def _assign_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    ref, value = ins
    if ref != value:
        raise ShapeError(f"Assign value type {value} differs from the parameter type {ref}")
    return [ref]


# Assign(ref, value) returns value and, when ref is a mutable graph input, writes it back.
register(OpDef("Assign", OpKind.ELEMWISE, (2, 2), _assign_infer,
               lambda xs, a, ctx: xs[1], category="misc", writes=((0, 0),)))


# ------------------------------------------------------------------ Opaque
OpaqueFactory = Callable[[dict[str, Any]], Callable[[list[np.ndarray]], list[np.ndarray]]]
_OPAQUE_IMPLS: dict[str, OpaqueFactory] = {}


def register_opaque_impl(name: str, factory: OpaqueFactory) -> None:
    """Register how Opaque nodes with ``impl=name`` execute: ``factory(spec)`` returns
    a callable from input arrays to output arrays."""
    _OPAQUE_IMPLS[name] = factory


def opaque_impls() -> list[str]:
    return sorted(_OPAQUE_IMPLS)


class OpaqueAttrs(Attrs):
    """``impl`` names an executor (``onnx``, ``aten``, ``python``); ``spec`` is its JSON-able
    description of the operation; ``out_types`` are given since no inference exists;
    ``fn`` optionally carries an in-memory callable (not saved to files)."""

    impl: str
    spec: dict[str, Any] = {}
    out_types: list[TensorType]
    label: str = ""
    fn: Any = None

    @field_validator("out_types", mode="before")
    @classmethod
    def _types(cls, v: Any) -> list[TensorType]:
        out = []
        for t in v:
            if isinstance(t, TensorType):
                out.append(t)
            elif isinstance(t, dict) and set(t) == {"shape", "dtype"}:
                out.append(TensorType(tuple(t["shape"]), DType.parse(t["dtype"])))
            else:
                raise ValueError(f"expected a {{shape, dtype}} object, got {t!r}")
        return out


# Where the executors of the built-in impls live (imported on first use).
_PROVIDERS = {"onnx": "graphkernel.frontends.onnx", "aten": "graphkernel.frontends.fx"}


def _opaque_ref(xs, attrs, ctx):
    fn = attrs["fn"]
    if fn is None:
        impl = attrs["impl"]
        if impl not in _OPAQUE_IMPLS and impl in _PROVIDERS:
            import importlib

            importlib.import_module(_PROVIDERS[impl])
        if impl not in _OPAQUE_IMPLS:
            raise ExecutionError(
                f"node '{ctx.node_name}': no executor for Opaque impl {impl!r}"
                + did_you_mean(impl, _OPAQUE_IMPLS)
                + f" (available: {', '.join(opaque_impls()) or 'none'}; 'onnx' needs "
                "`pip install graphkernel[onnx]`, 'aten' needs torch)")
        fn = _OPAQUE_IMPLS[impl](attrs["spec"])
    return tuple(fn(list(xs)))


register(OpDef("Opaque", OpKind.OPAQUE, (0, None), lambda ins, a: list(a["out_types"]),
               _opaque_ref, attrs=OpaqueAttrs, category="opaque"))
