"""GroupedMatMul: the products of a mixture-of-experts layer, one expert's weight per group of
rows.

``x`` [S, K] holds the tokens routed to the experts, sorted by expert; ``offs`` [E] the end of
each expert's rows (a running count: rows ``offs[e-1] .. offs[e]`` belong to expert ``e``,
``offs[-1] = 0``); ``w`` [E, K, N] the experts' weights stacked. Row ``s`` of the result is
``x[s] @ w[e]`` for the expert ``e`` of its group; rows past ``offs[E-1]`` (routed to no
expert) are zeros. This is the contract of torch's ``_grouped_mm`` for a 2-D input and 3-D
weights, and of ``transformers::grouped_mm_fallback`` (the MoE layers' default on the CPU
and for float32 weights), and the single-tensor form of the vendor's GroupedMatmul operator
(``torch_npu.npu_grouped_matmul`` with ``group_list`` a running count, codegen/extern.py).

``GroupedMatMulWeightGrad`` (x [S, K], dy [S, N], offs [E]) is its weights' gradient, one
product per group along the rows: ``dw[e] = x[rows of e]ᵀ @ dy[rows of e]`` [E, K, N] (zero
for an expert with no rows); the input's gradient is a GroupedMatMul of ``dy`` with the
weights transposed.
"""

from __future__ import annotations

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ops import OpDef, OpKind, check_dtype, register
from graphkernel.tensor_types import TensorType


def _groups(offs: np.ndarray, rows: int) -> list[tuple[int, int]]:
    """(start, end) of each group's rows, clamped to the rows there are."""
    ends = np.minimum(np.asarray(offs, np.int64).reshape(-1), rows)
    starts = np.concatenate([[0], ends[:-1]])
    return [(int(a), int(max(a, b))) for a, b in zip(starts, ends, strict=True)]


def _check_common(x: TensorType, offs: TensorType, experts, what: str) -> None:
    check_dtype(x, "float", f"{what} input")
    check_dtype(offs, "int", f"{what} offs")
    if x.rank != 2 or offs.rank != 1:
        raise ShapeError(f"{what} takes x [S, K] and offs [E], got {x} and {offs}")
    if isinstance(offs.shape[0], int) and isinstance(experts, int) and offs.shape[0] != experts:
        raise ShapeError(f"{what}: offs has {offs.shape[0]} entries for {experts} experts")


def _gmm_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, w, offs = ins
    _check_common(x, offs, w.shape[0] if w.rank == 3 else None, "GroupedMatMul")
    if w.rank != 3 or w.dtype != x.dtype:
        raise ShapeError(f"GroupedMatMul takes weights [E, K, N] of the input's dtype, got {w}")
    if isinstance(x.shape[1], int) and isinstance(w.shape[1], int) and x.shape[1] != w.shape[1]:
        raise ShapeError(f"GroupedMatMul: x has K={x.shape[1]}, the weights K={w.shape[1]}")
    return [TensorType((x.shape[0], w.shape[2]), x.dtype)]


def _gmm_ref(xs, a, ctx):
    x, w, offs = xs
    out = np.zeros((x.shape[0], w.shape[2]), dtype=np.float32)
    for e, (s, t) in enumerate(_groups(offs, x.shape[0])):
        if t > s:
            out[s:t] = x[s:t].astype(np.float32) @ w[e].astype(np.float32)
    return out.astype(x.dtype)


def _wgrad_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, dy, offs = ins
    _check_common(x, offs, None, "GroupedMatMulWeightGrad")
    if dy.rank != 2 or dy.dtype != x.dtype:
        raise ShapeError(f"GroupedMatMulWeightGrad takes dy [S, N] of x's dtype, got {dy}")
    return [TensorType((offs.shape[0], x.shape[1], dy.shape[1]), x.dtype)]


def _wgrad_ref(xs, a, ctx):
    x, dy, offs = xs
    out = np.zeros((len(offs), x.shape[1], dy.shape[1]), dtype=np.float32)
    for e, (s, t) in enumerate(_groups(offs, x.shape[0])):
        if t > s:
            out[e] = x[s:t].astype(np.float32).T @ dy[s:t].astype(np.float32)
    return out.astype(x.dtype)


register(OpDef("GroupedMatMul", OpKind.OPAQUE, (3, 3), _gmm_infer, _gmm_ref, category="nn",
               doc="row groups times their expert's weights (a mixture of experts' products)"))
register(OpDef("GroupedMatMulWeightGrad", OpKind.OPAQUE, (3, 3), _wgrad_infer, _wgrad_ref,
               category="nn", doc="the weights' gradient of a GroupedMatMul, per row group"))
