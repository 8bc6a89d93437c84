"""A small graph-builder API for expanders and rewrite passes.

    b = Builder(graph, origin=node.origin, prefix=node.name)
    y = b.mul(x, b.const(0.5, like=x))      # or simply b.mul(x, 0.5)
    s = b.reduce_sum(y, [-1], keep_dims=True)

Python numbers are turned into scalar constants of the other operand's dtype.
Every node created gets the builder's origin, so rewrites keep pointing at the
user's nodes; ``created`` lists them (to roll back a failed expansion).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphkernel.ir import DType, Graph, Node, Value

Operand = Value | float | int | bool


class Builder:
    def __init__(self, graph: Graph, origin: Sequence[str] = (), prefix: str = "b") -> None:
        self.g = graph
        self.origin = tuple(origin)
        self.prefix = prefix
        self.created: list[Node] = []

    # ------------------------------------------------------------- core
    def op(self, op: str, *inputs: Value, **attrs: Any) -> Value:
        return self.op_multi(op, *inputs, **attrs)[0]

    def op_multi(self, op: str, *inputs: Value, **attrs: Any) -> list[Value]:
        node = self.g.add_node(op, list(inputs), attrs,
                               name=self.g.fresh_name(f"{self.prefix}/{op.lower()}"),
                               origin=self.origin or None)
        self.created.append(node)
        return list(node.outputs)

    def const(self, value: Any, dtype: DType | str | None = None, like: Value | None = None
              ) -> Value:
        if like is not None:
            dtype = like.dtype
        arr = np.asarray(value, dtype=DType.parse(dtype).np if dtype is not None else None)
        return self.op("Constant", value=arr)

    def _pair(self, a: Operand, b: Operand) -> tuple[Value, Value]:
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise TypeError("at least one operand must be a Value")
        if not isinstance(a, Value):
            a = self.const(a, like=b)
        if not isinstance(b, Value):
            b = self.const(b, like=a)
        return a, b

    def rollback(self) -> None:
        """Erase every node this builder created (in reverse), when none is used elsewhere."""
        for node in reversed(self.created):
            if node.graph is not None and not any(v.uses for v in node.outputs):
                self.g.erase_node(node)
        self.created = []

    # ------------------------------------------------------- elementwise
    def _bin(self, op: str, a: Operand, b: Operand) -> Value:
        x, y = self._pair(a, b)
        return self.op(op, x, y)

    def add(self, a: Operand, b: Operand) -> Value:
        return self._bin("Add", a, b)

    def sub(self, a: Operand, b: Operand) -> Value:
        return self._bin("Sub", a, b)

    def mul(self, a: Operand, b: Operand) -> Value:
        return self._bin("Mul", a, b)

    def div(self, a: Operand, b: Operand) -> Value:
        return self._bin("Div", a, b)

    def pow(self, a: Operand, b: Operand) -> Value:
        return self._bin("Pow", a, b)

    def maximum(self, a: Operand, b: Operand) -> Value:
        return self._bin("Maximum", a, b)

    def minimum(self, a: Operand, b: Operand) -> Value:
        return self._bin("Minimum", a, b)

    def floor_div(self, a: Operand, b: Operand) -> Value:
        return self._bin("FloorDiv", a, b)

    def greater(self, a: Operand, b: Operand) -> Value:
        return self._bin("Greater", a, b)

    def greater_equal(self, a: Operand, b: Operand) -> Value:
        return self._bin("GreaterEqual", a, b)

    def less(self, a: Operand, b: Operand) -> Value:
        return self._bin("Less", a, b)

    def select(self, cond: Value, a: Operand, b: Operand) -> Value:
        x, y = self._pair(a, b)
        return self.op("Select", cond, x, y)

    def square(self, x: Value) -> Value:
        return self.mul(x, x)

    def __getattr__(self, name: str):
        """Unary ops by snake_case name: ``b.exp(x)``, ``b.log1p(x)``, ``b.rsqrt(x)`` …"""
        op = _UNARY_NAMES.get(name)
        if op is None:
            raise AttributeError(name)
        return lambda x: self.op(op, x)

    def cast(self, x: Value, dtype: DType | str) -> Value:
        dt = DType.parse(dtype)
        return x if x.dtype == dt else self.op("Cast", x, dtype=dt)

    def sigmoid(self, x: Value) -> Value:
        """1 / (1 + exp(-x)) in basic ops."""
        return self.reciprocal(self.add(self.exp(self.neg(x)), 1.0))

    # ---------------------------------------------------------- reductions
    def reduce_sum(self, x: Value, axes: Sequence[int] | None, keep_dims: bool = False) -> Value:
        return self.op("ReduceSum", x, axis=list(axes) if axes is not None else None,
                       keep_dims=keep_dims)

    def reduce_max(self, x: Value, axes: Sequence[int] | None, keep_dims: bool = False) -> Value:
        return self.op("ReduceMax", x, axis=list(axes) if axes is not None else None,
                       keep_dims=keep_dims)

    def reduce_mean(self, x: Value, axes: Sequence[int], keep_dims: bool = False) -> Value:
        """ReduceSum / N; the reduced dims must be static. A correctly rounded division, not a
        multiply by a rounded 1/N: normalizations amplify that extra rounding (LayerNorm on a
        nearly constant row scales it by rsqrt(eps))."""
        n = 1
        for a in axes:
            d = x.shape[a]
            if not isinstance(d, int):
                raise ValueError(f"reduced dim {a} of {x.type} is symbolic")
            n *= d
        return self.div(self.reduce_sum(x, axes, keep_dims), float(n))

    # ------------------------------------------------------------- shapes
    def reshape(self, x: Value, shape: Sequence[Any]) -> Value:
        return x if tuple(shape) == x.shape else self.op("Reshape", x, shape=list(shape))

    def broadcast_to(self, x: Value, shape: Sequence[Any]) -> Value:
        return x if tuple(shape) == x.shape else self.op("BroadcastTo", x, shape=list(shape))

    def assign(self, ref: Value, value: Value) -> Value:
        """Assign(ref, value). A ref this builder widened (fp16 -> fp32 inside an expansion)
        is unwrapped: the parameter itself is written, in its own dtype."""
        p = ref.producer
        if p is not None and p.op == "Cast" and any(p is n for n in self.created):
            ref = p.inputs[0]
            value = self.cast(value, ref.dtype)
        return self.op("Assign", ref, value)


_UNARY_NAMES = {
    "abs": "Abs", "neg": "Neg", "exp": "Exp", "expm1": "Expm1", "log": "Log", "log1p": "Log1p",
    "sqrt": "Sqrt", "rsqrt": "Rsqrt", "reciprocal": "Reciprocal", "tanh": "Tanh", "erf": "Erf",
    "sign": "Sign", "floor": "Floor", "identity": "Identity", "logical_not": "LogicalNot",
    "is_finite": "IsFinite",
}
