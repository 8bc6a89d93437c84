"""Composite elementwise ops written in the generator's basic ops, for the schedule only.

The vector API has no expm1, log1p, floor division, remainder or atan2 (a power is the
high-level ``Power``). Each is rewritten here, in a copy of the kernel's body that only the
schedule sees (the graph and the op-by-op reference keep the op), with forms that stay
accurate where the naive composition is not:

- ``Expm1(x)``: Kahan's ``(u - 1) * x / log(u)`` with ``u = exp(x)`` (the rounding of ``u``
  cancels between numerator and denominator), ``x`` where ``u == 1``, -1 where ``u == 0``.
- ``Log1p(x)``: ``log(u) * x / (u - 1)`` with ``u = 1 + x``, ``x`` where ``u == 1``.
- ``FloorDiv/FloorMod``: ``q = floor(a / b)``, ``r = a - q * b`` with the product exact
  (Dekker); a quotient rounded up onto an integer leaves ``r`` with the wrong sign, which is
  corrected (``q - 1``, ``r + b``).
- ``Mod`` (C fmod): the same with ``trunc``; a remainder of the wrong sign is moved by ``|b|``
  toward the dividend's sign.
- ``Atan2(y, x)``: ``atan(y / x)``, ``+-pi`` where ``x < 0``, exact for ``y == 0``.
- ``ElemAny(x)``: the maximum over every element of ``x != 0 ? 1 : 0``.

Limits (documented, not hidden): remainders of quotients beyond 2**24 lose the exactness of
``fmod``; ``atan2(+-inf, +-inf)`` is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphkernel.builder import Builder
from graphkernel.ir import Graph, Node, Value

Rule = Callable[[Builder, list[Value]], Value]
PI = float(np.float32(math.pi))


def _expm1(b: Builder, ins: list[Value]) -> Value:
    x = ins[0]
    u = b.exp(x)
    um1 = b.sub(u, 1.0)
    r = b.div(b.mul(um1, x), b.log(u))
    r = b.select(b.op("Equal", um1, b.const(0.0, like=x)), x, r)
    r = b.select(b.op("Equal", u, b.const(0.0, like=x)), -1.0, r)
    return b.select(b.op("IsInf", u), u, r)


def _log1p(b: Builder, ins: list[Value]) -> Value:
    x = ins[0]
    u = b.add(x, 1.0)
    d = b.sub(u, 1.0)
    r = b.div(b.mul(b.log(u), x), d)
    r = b.select(b.op("Equal", d, b.const(0.0, like=x)), x, r)
    return b.select(b.op("IsInf", u), u, r)


def _split(b: Builder, a: Value) -> tuple[Value, Value]:
    """Veltkamp's split of a fp32 value into two halves of 12 significant bits each."""
    c = b.mul(a, 4097.0)
    hi = b.sub(c, b.sub(c, a))
    return hi, b.sub(a, hi)


def _remainder(b: Builder, a: Value, q: Value, d: Value) -> Value:
    """a - q * d with q * d exact (Dekker's product: p + err == q * d), so the remainder is
    rounded once even where it is far below the ulp of q * d."""
    p = b.mul(q, d)
    qh, ql = _split(b, q)
    dh, dl = _split(b, d)
    err = b.add(b.add(b.add(b.sub(b.mul(qh, dh), p), b.mul(qh, dl)), b.mul(ql, dh)),
                b.mul(ql, dl))
    return b.sub(b.sub(a, p), err)


def _floor_quotient(b: Builder, ins: list[Value], rnd: str) -> tuple[Value, Value]:
    a, d = ins
    q = b.op(rnd, b.div(a, d))
    return q, _remainder(b, a, q, d)


def _wrong_sign(b: Builder, r: Value, s: Value) -> Value:
    """A mask: r and s have opposite signs (r * s < 0)."""
    return b.less(b.mul(r, s), b.const(0.0, like=r))


def _floor_div(b: Builder, ins: list[Value]) -> Value:
    q, r = _floor_quotient(b, ins, "Floor")
    return b.select(_wrong_sign(b, r, ins[1]), b.sub(q, 1.0), q)


def _floor_mod(b: Builder, ins: list[Value]) -> Value:
    _, r = _floor_quotient(b, ins, "Floor")
    d = ins[1]
    return b.select(_wrong_sign(b, r, d), b.add(r, d), r)


def _fmod(b: Builder, ins: list[Value]) -> Value:
    _, r = _floor_quotient(b, ins, "Trunc")
    a, d = ins
    return b.select(_wrong_sign(b, r, a), b.add(r, b.mul(b.sign(a), b.abs(d))), r)


def _atan2(b: Builder, ins: list[Value]) -> Value:
    y, x = ins
    zero = b.const(0.0, like=x)
    t = b.op("Atan", b.div(y, x))
    half_turn = b.select(b.greater_equal(y, zero), b.const(PI, like=x), -PI)
    r = b.select(b.less(x, zero), b.add(t, half_turn), t)
    # y == 0: 0 or pi, also for x == 0
    on_axis = b.select(b.less(x, zero), b.const(PI, like=x), zero)
    return b.select(b.op("Equal", y, zero), on_axis, r)


def nonzero(b: Builder, x: Value) -> Value:
    """float32 1.0 where x is nonzero (NaN included), else 0.0."""
    return b.select(b.op("NotEqual", x, b.const(0.0, like=x)), b.const(1.0, "float32"), 0.0)


def _elem_any(b: Builder, ins: list[Value]) -> Value:
    """1.0 when any element is nonzero: the maximum of ``nonzero``."""
    x = ins[0]
    return b.reshape(b.reduce_max(nonzero(b, x), list(range(len(x.shape))), keep_dims=False),
                     [1])


RULES: dict[str, Rule] = {"Expm1": _expm1, "Log1p": _log1p, "FloorDiv": _floor_div,
                          "FloorMod": _floor_mod, "Mod": _fmod, "Atan2": _atan2,
                          "ElemAny": _elem_any}


def _applies(n: Node) -> bool:
    return n.op in RULES and n.outputs[0].dtype.is_float and n.inputs[0].dtype.is_float


def decompose(sub: Graph) -> tuple[Graph, dict[int, Node]]:
    """``sub`` itself when nothing applies; else a copy with every composite op rewritten, and
    a map from each node of the copy to the node of ``sub`` it came from (for fallbacks)."""
    if not any(_applies(n) for n in sub.nodes):
        return sub, {}
    g = Graph(sub.name)
    vmap: dict[int, Value] = {id(v): g.add_input(v.name, v.type) for v in sub.inputs}
    origin: dict[int, Node] = {}
    for n in sub.nodes:
        if not _applies(n):
            origin[id(g.clone_node(n, vmap))] = n
            continue
        b = Builder(g, origin=n.origin, prefix=n.name)
        out = RULES[n.op](b, [vmap[id(v)] for v in n.inputs])
        if out.dtype != n.outputs[0].dtype:
            out = b.cast(out, n.outputs[0].dtype)
        vmap[id(n.outputs[0])] = out
        for m in b.created:
            origin[id(m)] = n
    g.set_outputs([vmap[id(v)] for v in sub.outputs])
    return g, origin
