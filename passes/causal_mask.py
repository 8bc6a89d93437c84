"""Recognise a boolean attention mask that is the causal one, built from positions.

A model that builds its causal mask from the sequence length (LLaMA's
``arange(S)[None, :] <= arange(S)[:, None]``, through ``where(keep, 0, lowest)``) leaves a
comparison of two position vectors: ``Range`` seen along the key axis (the last) and along
the query axis (the one before). With a symbolic length the mask cannot be folded to a
constant, and its int64 positions are data no vector kernel takes; the fused attention
operator has a causal mode of its own (sparse_mode 2) that needs none of it.

``masks_later_keys(cond, s1, s2)`` says whether ``cond`` (True = masked out), seen as
[.., S1, S2], is exactly ``key j > query i``: positions ``start + delta·k`` (the same start,
delta > 0, so the comparison of positions is the comparison of indices) from Ranges of
length S1 (queries) and S2 (keys), S1 = S2, compared with ``>``/``<`` or the negation of
``<=``/``>=``; views and broadcasts that only add or repeat leading axes are seen through.
"""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.ir import Value

VIEWS = ("Reshape", "ExpandDims", "Squeeze", "Identity")
# the comparison with its operands swapped: x op y == y SWAPPED[op] x
SWAPPED = {"Greater": "Less", "Less": "Greater", "GreaterEqual": "LessEqual",
           "LessEqual": "GreaterEqual"}


def _same(a, b) -> bool:
    return symbolic.canon(a) == symbolic.canon(b)


def _last_two_kept(v: Value) -> Value:
    """``v`` seen through views and broadcasts whose last two dims are their input's."""
    while (p := v.producer) is not None and p.op in (*VIEWS, "BroadcastTo"):
        x = p.inputs[0]
        if x.type.rank < 2 or not all(_same(a, b) for a, b in zip(x.shape[-2:], v.shape[-2:],
                                                                  strict=True)):
            break
        v = x
    return v


def _varying(shape: tuple) -> list[int]:
    """The axes of ``shape`` (counted from the end: -1, -2, ...) whose size is not 1."""
    return [i - len(shape) for i, d in enumerate(shape) if not (isinstance(d, int) and d == 1)]


def _position(v: Value) -> tuple[int, float, float, object] | None:
    """(axis from the end, start, delta, length) when ``v`` is a Range seen through views
    that only add unit axes; else None."""
    axes = _varying(tuple(v.shape))
    if len(axes) != 1:
        return None
    axis = axes[0]
    while (p := v.producer) is not None and p.op in VIEWS:
        v = p.inputs[0]
        if len(_varying(tuple(v.shape))) != 1:
            return None
    p = v.producer
    if p is None or p.op != "Range":
        return None
    start, delta = p.attrs["start"], p.attrs["delta"]
    if not isinstance(start, int | float) or not isinstance(delta, int | float) or delta <= 0:
        return None
    return axis, start, delta, p.attrs["length"]


def masks_later_keys(cond: Value, s1, s2) -> bool:
    """Whether ``cond`` [.., S1, S2] is True exactly where key j > query i (see above)."""
    if not _same(s1, s2) or cond.type.rank < 2:
        return False
    v = _last_two_kept(cond)
    negated = v.producer is not None and v.producer.op == "LogicalNot"
    if negated:
        v = _last_two_kept(v.producer.inputs[0])
    cmp = v.producer
    if cmp is None or cmp.op not in SWAPPED or not (_same(v.shape[-2], s1)
                                                   and _same(v.shape[-1], s2)):
        return False
    x, y = (_position(u) for u in cmp.inputs)
    if x is None or y is None or x[1:3] != y[1:3]:
        return False
    op = cmp.op
    if x[0] == -2 and y[0] == -1:  # query op key: read it as key SWAPPED[op] query
        x, y, op = y, x, SWAPPED[op]
    if (x[0], y[0]) != (-1, -2) or not (_same(x[3], s2) and _same(y[3], s1)):
        return False
    return op == ("LessEqual" if negated else "Greater")
