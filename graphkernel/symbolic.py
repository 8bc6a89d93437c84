"""Tensor dimensions that are either ints or symbolic monomials.

A symbolic dim is a string: a symbol (``"s0"``) or a product of an integer
coefficient and symbols (``"4*s0*s1"``). Monomials are closed under the
operations shape inference needs most (flatten, split into factors, concat of
equal symbols); anything else raises ``ShapeError`` naming the dims involved.

A symbol may be *derived* from another: ``s0__m10_d5`` is ``floor((s0 - 10) / 5)`` and
``s0__p1_d1`` is ``s0 + 1`` (the sizes a convolution, a pooling window or a slice from
the end make of a symbolic length). Its name says how to compute it from its base, so it
needs no table: ``evaluate`` computes it when the base is bound, and elsewhere it is a
symbol like any other. Derived symbols compose (``floor((floor((x+a)/d) + b)/e)`` is
``floor((x + a + b*d)/(d*e))``), so their base is always a plain symbol. The base may be
scaled: ``q__t8_p3_d1`` is ``8*q + 3`` (a length the guards hold to be a multiple of 8,
``8*q``, that a convolution pads by 3).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence

from graphkernel.errors import ShapeError

Dim = int | str
Shape = tuple[Dim, ...]

_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Monomial = tuple[int, tuple[str, ...]]


def parse_dim(d: Dim) -> Monomial:
    """Split a dim into (coefficient, sorted symbols)."""
    if type(d) is int and d >= 0:
        return d, ()
    if type(d) is str:
        return _parse_str(d)
    return _parse_other(d)


@functools.lru_cache(maxsize=4096)
def _parse_str(d: str) -> Monomial:
    return _parse_other(d)


def _parse_other(d: Dim) -> Monomial:
    if isinstance(d, bool):
        raise ShapeError(f"invalid dim {d!r}: expected an int >= 0 or a symbol such as 's0'")
    if isinstance(d, int):
        if d < 0:
            raise ShapeError(f"invalid dim {d}: dims must be >= 0")
        return d, ()
    if not isinstance(d, str):
        raise ShapeError(f"invalid dim {d!r}: expected an int >= 0 or a symbol such as 's0'")
    coef, syms = 1, []
    for part in d.replace(" ", "").split("*"):
        if part.isdigit():
            coef *= int(part)
        elif _SYMBOL.match(part):
            syms.append(part)
        else:
            raise ShapeError(
                f"invalid symbolic dim {d!r}: expected a symbol ('s0') or a product "
                "of an integer and symbols ('4*s0*s1')"
            )
    return coef, tuple(sorted(syms))


_DERIVED = re.compile(r"^(?P<base>[A-Za-z_][A-Za-z0-9_]*?)__(?:t(?P<mul>[2-9]|[1-9]\d+)_)?"
                      r"(?P<sign>[pm])(?P<add>\d+)_d(?P<div>[1-9]\d*)$")


def derived(d: str) -> tuple[str, int, int] | None:
    """(base, a, d) of a derived symbol ``floor((base + a) / d)``; None for a plain one (or
    one of a scaled base: ``scaled``)."""
    got = scaled(d)
    if got is None or got[1] != 1:
        return None
    return got[0], got[2], got[3]


def scaled(d: str) -> tuple[str, int, int, int] | None:
    """(base, m, a, d) of a derived symbol ``floor((m*base + a) / d)``; None for a plain
    one."""
    m = _DERIVED.match(d)
    if m is None:
        return None
    if len(m["add"]) > 12 or len(m["div"]) > 12 or len(m["mul"] or "") > 12:
        return None  # beyond any size: a plain name
    add = int(m["add"]) * (-1 if m["sign"] == "m" else 1)
    return m["base"], int(m["mul"] or 1), add, int(m["div"])


def floor_affine(d: Dim, add: int, div: int = 1) -> Dim:
    """``floor((d + add) / div)``: an int for a static dim, a derived symbol for a symbol;
    ``ShapeError`` for a product (``2*s0 + 1`` is not a dim graphkernel can name)."""
    if div < 1:
        raise ShapeError(f"cannot divide a dim by {div}")
    if type(d) is int:
        if d + add < 0:
            raise ShapeError(f"dim {d} {'+' if add >= 0 else '-'} {abs(add)} is negative")
        return (d + add) // div
    coef, syms = parse_dim(d)
    got = scaled(syms[0]) if len(syms) == 1 else None
    # a multiple of a plain symbol (``8*q``) is a scaled base: ``8*q + 3`` is ``q__t8_p3_d1``
    if len(syms) != 1 or (coef != 1 and got is not None):
        raise ShapeError(f"cannot express floor(({d} {'+' if add >= 0 else '-'} {abs(add)})"
                         f" / {div}): only a single symbol can be offset or divided")
    base, m, a0, d0 = got or (syms[0], coef, 0, 1)
    # floor((floor((m*x+a0)/d0)+add)/div) = floor((m*x + a0 + add*d0)/(d0*div))
    total_add, total_div = a0 + add * d0, d0 * div
    # floor((m*x + a)/d) = floor((m/g*x + floor(a/g))/(d/g)) for g = gcd(m, d) (m/g*x is
    # whole): one spelling per size (``floor((8*q + 7)/8)`` is ``q``)
    g = math.gcd(m, total_div)
    m, total_add, total_div = m // g, total_add // g, total_div // g
    if total_div == 1 and total_add == 0:
        return make_dim(m, [base])
    sign = "p" if total_add >= 0 else "m"
    mul = f"t{m}_" if m != 1 else ""
    return f"{base}__{mul}{sign}{abs(total_add)}_d{total_div}"


def pretty(d: Dim) -> str:
    """A dim as a user reads it: ``s0__m5_d5`` -> ``(s0-5)//5``, ``s0__p1_d1`` -> ``s0+1``."""
    if type(d) is int:
        return str(d)
    coef, syms = parse_dim(d)
    parts = [str(coef)] if coef != 1 else []
    for s in syms:
        got = scaled(s)
        if got is None:
            parts.append(s)
            continue
        base, m, a, dv = got
        base = f"{m}*{base}" if m != 1 else base
        term = f"{base}{'+' if a >= 0 else '-'}{abs(a)}" if a else base
        parts.append(f"({term})" if dv == 1 and (parts or len(syms) > 1) else
                     term if dv == 1 else f"({term})//{dv}")
    return "*".join(parts)


def make_dim(coef: int, syms: Sequence[str]) -> Dim:
    if not syms or coef == 0:
        return coef
    parts = ([str(coef)] if coef != 1 else []) + sorted(syms)
    return "*".join(parts)


def canon(d: Dim) -> Dim:
    """The canonical spelling of a dim (``"s1*2*s0"`` -> ``"2*s0*s1"``)."""
    if type(d) is int and d >= 0:
        return d
    if type(d) is str:
        return _canon_str(d)
    coef, syms = parse_dim(d)
    return make_dim(coef, syms)


@functools.lru_cache(maxsize=4096)
def _canon_str(d: str) -> Dim:
    coef, syms = _parse_str(d)
    return make_dim(coef, syms)


def eq(a: Dim, b: Dim) -> bool:
    """Whether two dims are the same extent (equal once canonical: ``"s0*2"`` is ``"2*s0"``)."""
    return canon(a) == canon(b)


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def symbols(d: Dim) -> tuple[str, ...]:
    return parse_dim(d)[1]


def mul(a: Dim, b: Dim) -> Dim:
    if type(a) is int and type(b) is int:
        return a * b
    ca, sa = parse_dim(a)
    cb, sb = parse_dim(b)
    return make_dim(ca * cb, sa + sb)


def numel(shape: Sequence[Dim]) -> Dim:
    if all(type(d) is int for d in shape):
        n = 1
        for d in shape:
            n *= d
        return n
    if all(type(d) is int or type(d) is str for d in shape):  # (True == 1 as a cache key)
        return _symbolic_numel(tuple(shape))
    return _symbolic_numel.__wrapped__(shape)  # raises for what is no dim


@functools.lru_cache(maxsize=4096)
def _symbolic_numel(shape: Sequence[Dim]) -> Dim:
    """``numel`` of a shape with a symbolic dim (few distinct ones per graph: cached)."""
    out: Dim = 1
    for d in shape:
        out = mul(out, d)
    return out


def div(a: Dim, b: Dim) -> Dim | None:
    """Exact quotient a / b, or None when it is not a monomial."""
    ca, sa = parse_dim(a)
    cb, sb = parse_dim(b)
    if cb == 0:
        return None
    rest = list(sa)
    for s in sb:
        if s not in rest:
            return None
        rest.remove(s)
    if ca % cb:
        return None
    return make_dim(ca // cb, rest)


def add(a: Dim, b: Dim) -> Dim:
    """``a + b``: like terms summed (``s0 + 2*s0``); a single symbol offset by a number is the
    derived symbol ``s0 + n`` (a KV cache of ``s0`` positions and one new token)."""
    ca, sa = parse_dim(a)
    cb, sb = parse_dim(b)
    if sa == sb or ca == 0 or cb == 0:
        return make_dim(ca + cb, sa or sb)
    if not sb and ca == 1 and len(sa) == 1:
        return floor_affine(a, cb)
    if not sa and cb == 1 and len(sb) == 1:
        return floor_affine(b, ca)
    raise ShapeError(f"cannot add dims {a!r} and {b!r}: only like symbolic terms, or one "
                     "symbol and a number, can be summed")


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    if type(d) is int:
        return d
    coef, syms = parse_dim(d)
    for s in syms:
        coef *= _symbol_value(s, env)
    return coef


def _symbol_value(s: str, env: Mapping[str, int]) -> int:
    if s in env:
        return env[s]
    got = scaled(s)
    if got is None:
        raise ShapeError(f"symbol {s!r} is not bound by any graph input")
    base, mul, add, div = got
    return (mul * _symbol_value(base, env) + add) // div


def bind(d: Dim, actual: int, env: dict[str, int]) -> bool:
    """Bind the free symbol of ``d`` so that it evaluates to ``actual``.

    Returns False when the dim cannot equal ``actual`` under ``env``. A derived symbol whose
    base is bound is known; one whose base is free binds the base when it is ``base + a``,
    else binds under its own name (``evaluate`` looks names up before computing them).
    """
    coef, syms = parse_dim(d)
    free, known = [], coef
    for s in syms:
        try:
            known *= _symbol_value(s, env)
        except ShapeError:
            free.append(s)
    if not free:
        return known == actual
    if len(free) != 1 or known == 0 or actual % known:
        return False
    value, got = actual // known, scaled(free[0])
    if got is not None and got[3] == 1:  # m*base + a: binds the base
        base, m, a, _ = got
        if value - a < 0 or (value - a) % m:
            return False
        env[base] = (value - a) // m
    else:
        env[free[0]] = value
    return True


def broadcast_dims(a: Dim, b: Dim) -> Dim:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, str) and isinstance(b, int):
        return b
    if isinstance(b, str) and isinstance(a, int):
        return a
    raise ShapeError(f"dims {a!r} and {b!r} are not broadcast-compatible")


def broadcast_shapes(*shapes: Sequence[Dim]) -> Shape:
    """numpy broadcasting over int or symbolic dims."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = [1] * (rank - len(s)) + list(s)
        for i, d in enumerate(padded):
            try:
                out[i] = broadcast_dims(out[i], d)
            except ShapeError:
                raise ShapeError(
                    "shapes " + " and ".join(str(list(x)) for x in shapes)
                    + " cannot be broadcast together"
                ) from None
    return tuple(out)


def format_shape(shape: Sequence[Dim]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
