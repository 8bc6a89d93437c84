"""Recognise a boolean attention mask that is the causal one (or a causal band), built
from positions.

A model that builds its causal mask from the sequence length (LLaMA's
``arange(S)[None, :] <= arange(S)[:, None]``, through ``where(keep, 0, lowest)``; Mistral's
sliding window adds ``& (arange(S)[None, :] > arange(S)[:, None] - w)``) leaves comparisons
of position vectors: a ``Range`` seen along the key axis (the last) and along the query axis
(the one before). With a symbolic length the mask cannot be folded to a constant, and its
int64 positions are data no vector kernel takes; the fused attention operator has a causal
mode of its own (sparse_mode 2; a band, sparse_mode 4) that needs none of it.

``causal_band(cond, s1, s2)`` reads ``cond`` (True = masked out), seen as [.., S1, S2], as
the set of key offsets ``d = j - i`` a query ``i`` keeps. Each comparison of positions
``start + delta·k + c`` (the same start and delta > 0 on both sides; offsets ``c`` from
adding or subtracting an integer constant need delta 1; int32/int64 positions, or whole ones
in float64, which stay distinct for any length) keeps an interval of ``d``;
``&`` intersects intervals, a negation complements a half-line, constant True keeps all.
Views and broadcasts that only add or repeat leading axes are seen through. The mask is
causal when the kept set is ``d <= 0``, a causal band of ``w`` keys when it is
``-(w - 1) <= d <= 0``; requires S1 = S2 (then the operator's left-up and right-down
alignments agree).
"""

from __future__ import annotations

import math

import numpy as np

from graphkernel import symbolic
from graphkernel.ir import DType, Node, Value
from graphkernel.ops import VIEW_OPS
from graphkernel.passes.rewrite import splat

ANDS = ("BitwiseAnd", "LogicalAnd")
# the comparison with its operands swapped: x op y == y SWAPPED[op] x
SWAPPED = {"Greater": "Less", "Less": "Greater", "GreaterEqual": "LessEqual",
           "LessEqual": "GreaterEqual", "Equal": "Equal"}
INF = math.inf
Interval = tuple[float, float]  # the offsets d = j - i kept, lo <= d <= hi (inclusive)


def _same(a, b) -> bool:
    return symbolic.canon(a) == symbolic.canon(b)


def _last_two_kept(v: Value) -> Value:
    """``v`` seen through views and broadcasts whose last two dims are their input's."""
    while (p := v.producer) is not None and (p.op in VIEW_OPS or p.op == "BroadcastTo"):
        x = p.inputs[0]
        if x.type.rank < 2 or not all(_same(a, b) for a, b in zip(x.shape[-2:], v.shape[-2:],
                                                                  strict=True)):
            break
        v = x
    return v


def _varying(shape: tuple) -> list[int]:
    """The axes of ``shape`` (counted from the end: -1, -2, ...) whose size is not 1."""
    return [i - len(shape) for i, d in enumerate(shape) if not (isinstance(d, int) and d == 1)]


def _int_splat(v: Value) -> int | None:
    f = splat(v)
    return int(f) if f is not None and v.dtype.is_int and float(f).is_integer() else None


def _exact(dtype: DType, start: float, delta: float) -> bool:
    """Positions ``start + delta·k`` of this type are distinct for any length a device holds:
    integers of 32 bits or more (an int8 or int16 arange wraps at 128 or 32768 keys), or
    whole numbers in float64 (exact to 2**53). float16 rounds 2049 to 2048 and float32
    2**24 + 1 to 2**24, and a fractional step rounds too: two keys at one position."""
    if dtype.is_int:
        return dtype.itemsize >= 4
    return dtype is DType.float64 and float(start).is_integer() and float(delta).is_integer()


def _whole(p: Node) -> bool:
    """A StridedSlice from 0 by 1 that keeps its input's type: the whole axis (a slice
    ``[:]`` of a symbolic axis, as the frontend sees it before ``slice_whole`` drops it)."""
    if p.op != "StridedSlice" or p.outputs[0].type != p.inputs[0].type:
        return False
    a = p.attrs
    return all(b == 0 for b in a["begin"]) and all(st == 1 for st in (a["strides"] or [1]))


def _position(v: Value) -> tuple[int, float, float, object, int] | None:
    """(axis from the end, start, delta, length, offset) when ``v`` is a Range seen through
    views that only add unit axes, plus or minus an integer constant; else None."""
    axes = _varying(tuple(v.shape))
    if len(axes) != 1:
        return None
    axis, offset = axes[0], 0
    while (p := v.producer) is not None and (p.op in VIEW_OPS or p.op in ("Add", "Sub")
                                             or _whole(p)):
        if p.op in VIEW_OPS or _whole(p):
            v = p.inputs[0]
        else:  # x + c, c + x, x - c
            sides = [(0, 1), (1, 0)] if p.op == "Add" else [(0, 1)]
            for s, c in sides:
                k = _int_splat(p.inputs[c])
                if k is not None and len(_varying(tuple(p.inputs[s].shape))) == 1:
                    offset += k if p.op == "Add" else -k
                    v = p.inputs[s]
                    break
            else:
                return None
        if len(_varying(tuple(v.shape))) != 1:
            return None
    p = v.producer
    if p is None or p.op != "Range":
        return None
    start, delta = p.attrs["start"], p.attrs["delta"]
    if not isinstance(start, int | float) or not isinstance(delta, int | float) or \
            delta <= 0 or not _exact(p.outputs[0].dtype, start, delta):
        return None
    return axis, start, delta, p.attrs["length"], offset


def _compared(op: str, c: int) -> Interval | None:
    """The offsets d kept by ``d op c``."""
    return {"Greater": (c + 1, INF), "GreaterEqual": (c, INF), "Less": (-INF, c - 1),
            "LessEqual": (-INF, c), "Equal": (c, c)}.get(op)


def _complement(iv: Interval | None) -> Interval | None:
    """The offsets not in a half-line (a half-line again); None for anything else."""
    if iv is None:
        return None
    lo, hi = iv
    if lo == -INF and hi < INF:
        return hi + 1, INF
    if hi == INF and lo > -INF:
        return -INF, lo - 1
    return None


def _interval(v: Value, s1, s2) -> Interval | None:
    """The key offsets d where ``v`` [.., S1, S2] is True, when it is an interval."""
    v = _last_two_kept(v)
    p = v.producer
    if p is None:
        return None
    if p.op == "Constant" and v.dtype is DType.bool:
        arr = np.asarray(p.attrs["value"])
        return (-INF, INF) if arr.size and bool(np.all(arr)) else None
    if p.op == "LogicalNot":
        return _complement(_interval(p.inputs[0], s1, s2))
    if p.op in ANDS and v.dtype is DType.bool:
        parts = [_interval(x, s1, s2) for x in p.inputs]
        if any(x is None for x in parts):
            return None
        return max(a[0] for a in parts), min(a[1] for a in parts)
    if p.op not in SWAPPED:
        return None
    x, y = (_position(u) for u in p.inputs)
    if x is None or y is None or x[1:3] != y[1:3]:
        return None
    op = p.op
    if x[0] == -2 and y[0] == -1:  # query op key: read it as key SWAPPED[op] query
        x, y, op = y, x, SWAPPED[op]
    if (x[0], y[0]) != (-1, -2) or not (_same(x[3], s2) and _same(y[3], s1)):
        return None
    if (x[4] or y[4]) and x[2] != 1:
        return None  # an offset in positions of step delta != 1 is no whole index offset
    return _compared(op, y[4] - x[4])  # j + cx op i + cy  <=>  j - i op cy - cx


def causal_band(cond: Value, s1, s2) -> int | None:
    """0 when ``cond`` (True = masked out) masks exactly the keys after the query (causal);
    w > 0 when it also masks all but the last w keys up to it (a causal band: a sliding
    window); None otherwise."""
    if not _same(s1, s2) or cond.type.rank < 2:
        return None
    v = _last_two_kept(cond)
    if v.producer is not None and v.producer.op == "LogicalNot":
        keep = _interval(v.producer.inputs[0], s1, s2)  # cond = not keep: any interval
    else:
        keep = _complement(_interval(cond, s1, s2))
    if keep is None or keep[1] != 0 or keep[0] > 0:
        return None
    return 0 if keep[0] == -INF else int(1 - keep[0])
