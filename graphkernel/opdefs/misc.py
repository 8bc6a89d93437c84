"""Constant, Assign and Opaque (externally implemented). GraphKernel, the op holding a fused
subgraph, is defined with the IR it holds, in graphkernel/kernels.py."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import ValidationInfo, field_validator

from graphkernel import limits
from graphkernel.errors import ExecutionError, GraphError, ShapeError, did_you_mean
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
    """The value's type, remembered by its shape and dtype (an array attribute keeps a
    Constant out of the inference memo, and a model holds thousands of a few types)."""
    v = attrs["value"]
    key = (v.shape, v.dtype)
    t = _CONST_TYPES.get(key)
    if t is None:
        if len(_CONST_TYPES) >= 4096:
            _CONST_TYPES.clear()
        t = _CONST_TYPES[key] = TensorType(tuple(int(d) for d in v.shape), DType.parse(v.dtype))
    return [t]


_CONST_TYPES: dict[tuple, TensorType] = {}


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
SpecCheck = Callable[[dict[str, Any]], str | None]
_OPAQUE_IMPLS: dict[str, OpaqueFactory] = {}
_SPEC_CHECKS: dict[str, SpecCheck] = {}


def register_opaque_impl(name: str, factory: OpaqueFactory,
                         check: SpecCheck | None = None) -> None:
    """Register how Opaque nodes with ``impl=name`` execute: ``factory(spec)`` returns
    a callable from input arrays to output arrays. ``check(spec)`` says what is wrong with
    a spec's structure (or None); it runs whenever such a node is built, so that a model
    file naming something the executor would refuse fails when it is loaded.

    A spec comes from a model file, which is data: a factory must accept only the operations
    of its framework that it means to run (see ``graphkernel.frontends.opaque``)."""
    _OPAQUE_IMPLS[name] = factory
    if check is not None:
        _SPEC_CHECKS[name] = check


def opaque_impls() -> list[str]:
    return sorted(_OPAQUE_IMPLS)


class OpaqueAttrs(Attrs):
    """``impl`` names an executor (``onnx``, ``aten``, ``python``); ``spec`` is its JSON-able
    description of the operation; ``out_types`` are given since no inference exists;
    ``fn`` optionally carries an in-memory callable (not saved to files)."""

    fn: Any = None  # first: the checks below depend on it
    impl: str
    spec: dict[str, Any] = {}
    out_types: list[TensorType]
    label: str = ""

    @field_validator("fn")
    @classmethod
    def _fn(cls, v: Any) -> Any:
        if v is not None and not callable(v):
            raise ValueError("'fn' is an in-memory callable; it cannot come from a file")
        return v

    @field_validator("impl")
    @classmethod
    def _impl(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("fn") is not None:
            return v
        if v in _PROVIDERS and v not in _SPEC_CHECKS:
            importlib.import_module(_PROVIDERS[v])
        if v not in _OPAQUE_IMPLS and v not in _PROVIDERS:
            known = sorted({*_PROVIDERS, *_OPAQUE_IMPLS})
            raise ValueError(f"unknown Opaque impl {v!r}" + did_you_mean(v, known)
                             + f" (accepted: {', '.join(known)})")
        return v

    @field_validator("spec")
    @classmethod
    def _spec(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """A spec holds only what its impl accepts: checked now, before anything runs."""
        check = _SPEC_CHECKS.get(info.data.get("impl", ""))
        if info.data.get("fn") is None and check is not None and (p := check(v)) is not None:
            raise ValueError(p)
        return v

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        if v and (p := limits.name_problem(v)) is not None:
            raise ValueError(p)
        return v

    @field_validator("out_types", mode="before")
    @classmethod
    def _types(cls, v: Any) -> list[TensorType]:
        out = []
        for t in v:
            if isinstance(t, TensorType):
                out.append(t)
            elif isinstance(t, dict) and set(t) == {"shape", "dtype"} \
                    and isinstance(t["shape"], list):
                for d in t["shape"]:
                    if (p := limits.dim_problem(d)) is not None:
                        raise ValueError(p)
                out.append(TensorType(tuple(t["shape"]), DType.parse(t["dtype"])))
            else:
                raise ValueError(f"expected a {{shape, dtype}} object, got {t!r}")
        return out


# Where the executors of the built-in impls live (imported on first use; the module imports
# torch or onnx only when a node runs).
_PROVIDERS = {"onnx": "graphkernel.frontends.opaque", "aten": "graphkernel.frontends.opaque"}


def _opaque_ref(xs, attrs, ctx):
    fn = attrs["fn"]
    if fn is None:
        impl = attrs["impl"]
        if impl not in _OPAQUE_IMPLS and impl in _PROVIDERS:
            importlib.import_module(_PROVIDERS[impl])
        if impl not in _OPAQUE_IMPLS:
            raise ExecutionError(
                f"node '{ctx.node_name}': no executor for Opaque impl {impl!r}"
                + did_you_mean(impl, _OPAQUE_IMPLS)
                + f" (available: {', '.join(opaque_impls()) or 'none'}; 'onnx' needs "
                "`pip install graphkernel[onnx]`, 'aten' needs torch)")
        try:
            fn = _OPAQUE_IMPLS[impl](attrs["spec"])
        except GraphError as e:
            raise GraphError(f"node '{ctx.node_name}' (Opaque, impl {impl!r}): {e}") from None
        if getattr(fn, "takes_out_shapes", False):  # (checks its outputs before making them)
            try:
                return tuple(fn(list(xs), ctx.out_shapes))
            except GraphError as e:
                raise GraphError(f"node '{ctx.node_name}' (Opaque, impl {impl!r}): {e}") \
                    from None
    return tuple(fn(list(xs)))


register(OpDef("Opaque", OpKind.OPAQUE, (0, None), lambda ins, a: list(a["out_types"]),
               _opaque_ref, attrs=OpaqueAttrs, category="opaque"))
