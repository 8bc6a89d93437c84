"""Tensor dimensions that are either ints or symbolic monomials.

A symbolic dim is a string: a symbol (``"s0"``) or a product of an integer
coefficient and symbols (``"4*s0*s1"``). Monomials are closed under the
operations shape inference needs most (flatten, split into factors, concat of
equal symbols); anything else raises ``ShapeError`` naming the dims involved.
"""

from __future__ import annotations

import functools
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


def make_dim(coef: int, syms: Sequence[str]) -> Dim:
    if not syms or coef == 0:
        return coef
    parts = ([str(coef)] if coef != 1 else []) + sorted(syms)
    return "*".join(parts)


def canon(d: Dim) -> Dim:
    """The canonical spelling of a dim (``"s1*2*s0"`` -> ``"2*s0*s1"``)."""
    if type(d) is int and d >= 0:
        return d
    coef, syms = parse_dim(d)
    return make_dim(coef, syms)


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
    ca, sa = parse_dim(a)
    cb, sb = parse_dim(b)
    if sa == sb or ca == 0 or cb == 0:
        return make_dim(ca + cb, sa or sb)
    raise ShapeError(f"cannot add dims {a!r} and {b!r}: only like symbolic terms can be summed")


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    if type(d) is int:
        return d
    coef, syms = parse_dim(d)
    for s in syms:
        if s not in env:
            raise ShapeError(f"symbol {s!r} is not bound by any graph input")
        coef *= env[s]
    return coef


def bind(d: Dim, actual: int, env: dict[str, int]) -> bool:
    """Bind the free symbol of ``d`` so that it evaluates to ``actual``.

    Returns False when the dim cannot equal ``actual`` under ``env``.
    """
    coef, syms = parse_dim(d)
    free = [s for s in syms if s not in env]
    known = coef
    for s in syms:
        if s in env:
            known *= env[s]
    if not free:
        return known == actual
    if len(set(free)) != 1 or len(free) != 1:
        return False
    if known == 0 or actual % known:
        return False
    env[free[0]] = actual // known
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
