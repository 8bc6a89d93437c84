"""TriSolve: a batch of unit-lower-triangular systems solved by forward substitution, the
rows in sequence.

Two forms, both over the last two axes (the axes before them a batch of independent
matrices):

* ``solve``: ``Y = L^-1 X`` for a unit lower-triangular ``L`` [..., n, n] (its diagonal and
  upper triangle are not read: taken as ones and zeros) and ``X`` [..., n, m] — torch's
  ``linalg.solve_triangular(L, X, upper=False, left=True, unitriangular=True)``. Row i of Y
  is ``X[i] - sum_{k<i} L[i, k] * Y[k]``. Several right-hand sides X1 .. Xk (each its own
  width) give k results, each the solve of its own: one system, read once.
* ``rows``: the in-place row recurrence linear-attention references write as a Python loop
  over the rows of one matrix ``A`` [..., n, n] (``for i in 1..n-1: A[i, :i] = A[i, :i] +
  sum_{k<i} A[i, k] * A[k, :i]``, each row reading the rows before it as already updated):
  row 0 and every element on or above the diagonal keep A's value. For a strictly lower A this
  is ``(I - A)^-1 - I``, the within-chunk system of the (gated) delta rule.

The reference runs the rows in order, as the kernel does; each row's sum over k is one
vector sum (the kernel adds the terms k = 0, 1, ... in order: equal up to float summation
order).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ops import Attrs, OpDef, OpKind, check_dtype, register
from graphkernel.tensor_types import TensorType


class TriSolveAttrs(Attrs):
    form: Literal["solve", "rows"] = "solve"


def _infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    solve = attrs["form"] == "solve"
    if (len(ins) < 2) if solve else (len(ins) != 1):
        raise ShapeError(f"TriSolve form={attrs['form']!r} takes "
                         f"{'a system and right-hand sides' if solve else 'one matrix'}, got "
                         f"{len(ins)} input(s)")
    a = ins[0]
    for t in ins:
        check_dtype(t, "float")
        if t.dtype != a.dtype:
            raise ShapeError(f"TriSolve operands of one dtype, got {[str(x) for x in ins]}")
    if a.rank < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"TriSolve: the matrix must be square in its last two axes, got {a}")
    if solve:
        for x in ins[1:]:
            if x.rank != a.rank or tuple(x.shape[:-1]) != tuple(a.shape[:-1]):
                raise ShapeError(f"TriSolve: the right-hand sides {x} must have the "
                                 f"matrix's batch axes and rows {a}")
        return list(ins[1:])
    return [a]


def _ref(xs, a, ctx):
    if a["form"] == "solve":
        L, out = xs[0], []
        for X in xs[1:]:
            Y = np.array(X, copy=True)
            for i in range(1, L.shape[-1]):
                acc = (L[..., i, :i, None] * Y[..., :i, :]).sum(-2)
                Y[..., i, :] = X[..., i, :] - acc
            out.append(Y)
        return out[0] if len(out) == 1 else out
    (A,) = xs
    T = np.array(A, copy=True)
    for i in range(1, A.shape[-1]):
        row = A[..., i, :i]
        T[..., i, :i] = row + (row[..., None] * T[..., :i, :i]).sum(-2)
    return T


register(OpDef("TriSolve", OpKind.OPAQUE, (1, None), _infer, _ref, attrs=TriSolveAttrs,
               category="linalg",
               doc="forward substitution over a batch of unit lower-triangular systems: "
                   "L^-1 X (solve), or the in-place row recurrence A[i, :i] += A[i, :i] @ "
                   "A[:i, :i] of the rows before (rows)"))
