"""Scan: an associative scan along one axis (the running sum, product, maximum or minimum,
and the first-order linear recurrence ``h[t] = a[t] * h[t-1] + b[t]``).

Prefix sums and products (``cumsum``, ``cumprod``) and the selective-scan recurrence of
state-space models are one op with a ``combine`` rule, so a single vector kernel can carry
the running value along the axis while the work before and after it (the exponentials of a
discretised state matrix, an output gate) fuses around it. The rules are associative, which
is what lets torch trace them as a tree of slices (its generic ``associative_scan``): the
result does not depend on the grouping, only on the order along the axis.

The ``loop`` rule is not associative: it runs a step body of elementwise ops along the axis,
one position after the other, carrying several states (an unrolled recurrence re-rolled by
``scan_loop``: RWKV's numerator, denominator and running maximum). Its operands are the
sequences the steps read a position of, led, without ``first``, by K operands whose first
position along the axis holds the states before the first step. ``body`` lists the step's
ops in order, ``args`` their operands as slots: 0..K-1 the states, K.. the operands'
positions, then the body's own results in order; ``states`` names the slots that become
the states of the next step and ``out`` the slot written at each position of the result.
``first`` (with ``first_args``, ``first_states``, ``first_out``), when given, is the first
position's own work, reading no state (the first step of an unrolled loop, whose initial
constants folding has merged into its ops): it leaves the states, and no operand holds them.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ops import Attrs, OpDef, OpKind, check_dtype, normalize_axis, register
from graphkernel.tensor_types import TensorType

# combine rule -> (operands, the combination of the running value l with the next element r)
COMBINES: dict[str, tuple[int, str]] = {
    "add": (1, "l + r"),
    "mul": (1, "l * r"),
    "max": (1, "max(l, r)"),
    "min": (1, "min(l, r)"),
    # (a, b) pairs: (a_l, b_l) then (a_r, b_r) is (a_l * a_r, a_r * b_l + b_r); the second
    # component, started from h = 0, is the recurrence h[t] = a[t] * h[t-1] + b[t]
    "linear": (2, "a_r * l + b_r"),
    # a step body carrying several states (not associative: run in order)
    "loop": (0, "body"),
}

# the ops a loop's step body may hold (elementwise, without attributes: one vector
# instruction each on the kernel's rows) -> their arity
LOOP_OPS: dict[str, int] = {
    "Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Maximum": 2, "Minimum": 2,
    "Exp": 1, "Log": 1, "Abs": 1, "Sqrt": 1, "Reciprocal": 1, "Neg": 1}


class ScanAttrs(Attrs):
    axis: int = 0
    combine: Literal["add", "mul", "max", "min", "linear", "loop"] = "add"
    body: list[str] = []          # loop: the step's ops, in order
    args: list[list[int]] = []    # loop: each op's operand slots
    states: list[int] = []        # loop: the slot each state takes after a step
    out: int = -1                 # loop: the slot written at each position
    first: list[str] = []         # loop: the first position's own ops (none: the body's)
    first_args: list[list[int]] = []
    first_states: list[int] = []
    first_out: int = -1


def check_loop(n_in: int, attrs: dict) -> str | None:
    """Why a loop's attributes do not describe a step body over ``n_in`` operands, or None."""
    body, args, states, out = attrs["body"], attrs["args"], attrs["states"], attrs["out"]
    k = len(states)
    if k == 0:
        return "no state"
    if len(body) != len(args) or not body:
        return "one operand list per op of a non-empty body"
    for j, (op, a) in enumerate(zip(body, args, strict=True)):
        if op not in LOOP_OPS or len(a) != LOOP_OPS[op]:
            return f"op {j} ({op}, {len(a)} operands) is not an elementwise op of the body"
        if any(not 0 <= x < k + n_in + j for x in a):
            return f"op {j} reads a slot not computed before it"
    total = k + n_in + len(body)
    if any(not 0 <= x < total for x in (*states, out)):
        return "a state or the output names no slot"
    first = attrs["first"]
    if first:
        if len(first) != len(attrs["first_args"]) or len(attrs["first_states"]) != k:
            return "one operand list per op of the first step, and a slot per state"
        for j, (op, a) in enumerate(zip(first, attrs["first_args"], strict=True)):
            if op not in LOOP_OPS or len(a) != LOOP_OPS[op]:
                return f"op {j} of the first step ({op}) is not an elementwise op"
            if any(not k <= x < k + n_in + j for x in a):
                return f"op {j} of the first step reads a state or a slot not computed"
        if any(not k <= x < k + n_in + len(first)
               for x in (*attrs["first_states"], attrs["first_out"])):
            return "a state or the output of the first step names no slot"
    elif n_in < k:
        return f"{k} states over {n_in} operands"
    return None


def _scan_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    want = COMBINES[attrs["combine"]][0]
    if attrs["combine"] == "loop":
        why = check_loop(len(ins), attrs)
        if why:
            raise ShapeError(f"Scan combine='loop': {why}")
    elif len(ins) != want:
        raise ShapeError(f"Scan combine={attrs['combine']!r} takes {want} input(s), got "
                         f"{len(ins)}")
    for t in ins:
        check_dtype(t, "float")
        if tuple(t.shape) != tuple(ins[0].shape) or t.dtype != ins[0].dtype:
            raise ShapeError("Scan operands must have one shape and dtype, got "
                             f"{[str(x) for x in ins]}")
    normalize_axis(attrs["axis"], ins[0].rank)
    return [ins[0]]


_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scan_ref(xs, a, ctx):
    x = xs[0]
    axis = a["axis"] % x.ndim
    if a["combine"] == "loop":
        return _loop_ref(xs, a, axis)
    if a["combine"] in _UFUNC:
        return _UFUNC[a["combine"]].accumulate(x, axis=axis, dtype=x.dtype)
    coef, b = np.moveaxis(x, axis, 0), np.moveaxis(xs[1], axis, 0)
    out = np.empty_like(b)
    h = np.zeros_like(b[0]) if len(b) else None
    for t in range(len(b)):  # sequential, as the recurrence reads
        h = coef[t] * h + b[t]
        out[t] = h
    return np.moveaxis(out, 0, axis)


_LOOP_FN = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
            "Maximum": np.maximum, "Minimum": np.minimum, "Exp": np.exp, "Log": np.log,
            "Abs": np.abs, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Neg": np.negative}


def _loop_ref(xs, a, axis):
    """The step body run at each position in order, its ops in the body's order."""
    seq = [np.moveaxis(x, axis, 0) for x in xs]
    k = len(a["states"])
    out = np.empty_like(seq[0])
    states = [s[0].copy() for s in seq[:k]] if len(seq[0]) and not a["first"] else []
    with np.errstate(all="ignore"):
        for t in range(len(seq[0])):
            first = t == 0 and a["first"]
            slots = (states or [None] * k) + [s[t] for s in seq]
            body, args, keep, row = (a["first"], a["first_args"], a["first_states"],
                                     a["first_out"]) if first else (a["body"], a["args"],
                                                                    a["states"], a["out"])
            for op, arg in zip(body, args, strict=True):
                slots.append(_LOOP_FN[op](*(slots[j] for j in arg)).astype(out.dtype))
            out[t] = slots[row]
            states = [slots[j].copy() for j in keep]
    return np.moveaxis(out, 0, axis)


register(OpDef("Scan", OpKind.REDUCE, (1, None), _scan_infer, _scan_ref, attrs=ScanAttrs,
               category="reduce",
               doc="running combination along one axis: add, mul, max, min, the linear "
                   "recurrence h[t] = a[t] * h[t-1] + b[t], or a step body carrying several "
                   "states (loop)"))
