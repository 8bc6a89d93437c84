"""Scan: an associative scan along one axis (the running sum, product, maximum or minimum,
and the first-order linear recurrence ``h[t] = a[t] * h[t-1] + b[t]``).

Prefix sums and products (``cumsum``, ``cumprod``) and the selective-scan recurrence of
state-space models are one op with a ``combine`` rule, so a single vector kernel can carry
the running value along the axis while the work before and after it (the exponentials of a
discretised state matrix, an output gate) fuses around it. The rules are associative, which
is what lets torch trace them as a tree of slices (its generic ``associative_scan``): the
result does not depend on the grouping, only on the order along the axis.
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
}


class ScanAttrs(Attrs):
    axis: int = 0
    combine: Literal["add", "mul", "max", "min", "linear"] = "add"


def _scan_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    want = COMBINES[attrs["combine"]][0]
    if len(ins) != want:
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
    if a["combine"] in _UFUNC:
        return _UFUNC[a["combine"]].accumulate(x, axis=axis, dtype=x.dtype)
    coef, b = np.moveaxis(x, axis, 0), np.moveaxis(xs[1], axis, 0)
    out = np.empty_like(b)
    h = np.zeros_like(b[0]) if len(b) else None
    for t in range(len(b)):  # sequential, as the recurrence reads
        h = coef[t] * h + b[t]
        out[t] = h
    return np.moveaxis(out, 0, axis)


register(OpDef("Scan", OpKind.REDUCE, (1, 2), _scan_infer, _scan_ref, attrs=ScanAttrs,
               category="reduce",
               doc="running combination along one axis: add, mul, max, min or the linear "
                   "recurrence h[t] = a[t] * h[t-1] + b[t]"))
