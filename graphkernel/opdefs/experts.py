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

from typing import Literal

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ir import DType
from graphkernel.opdefs.indexing import torch_select
from graphkernel.ops import Attrs, OpDef, OpKind, check_dtype, register
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


# ------------------------------------------------------------------ token routing
# A mixture of experts' token permutation around its grouped products, as the vendor's
# routing operators define it (torch_npu ``npu_moe_init_routing``,
# ``npu_moe_compute_expert_tokens``, ``npu_moe_finalize_routing``; codegen/extern.py).
# N tokens each routed to K experts give N*K (token, expert) pairs. ``row_idx`` [N, K]
# names each pair by a row of the expanded layout (the operators' convention: pair (t, k)
# is row ``k * N + t``, token ``row % N``).
#
# MoeInitRouting (x [N, H], row_idx [N, K], expert_idx [N, K]) sorts the pairs by expert,
# ties in row-major pair order (a stable sort of ``expert_idx`` flattened): the j-th sorted
# pair's row ``r_j = row_idx.flat[order[j]]`` gives ``expanded_x[j] = x[r_j % N]``
# [N*K, H], ``expanded_row_idx[r_j] = j`` [N*K] (where each row went) and
# ``expanded_expert_idx[j]`` [N*K] the sorted expert ids.
#
# MoeComputeExpertTokens (sorted expert ids [S]) -> [E]: the end of each expert's rows, the
# count of ids <= e (the groups' running count GroupedMatMul reads as ``offs``).
#
# MoeFinalizeRouting (rows [N*K, H], skip [N, H], bias [E, H], scales [N, K],
# expanded_row_idx [N*K], expert_idx [N, K]) -> [N, H]:
# ``out[t] = skip[t] + sum_k scales[t, k] * (rows[expanded_row_idx[k * N + t]] +
# bias[expert_idx[t, k]])``: each token's experts' rows back in token order, weighted and
# summed.


def _routing_ids(t: TensorType, what: str) -> None:
    check_dtype(t, "int", what)


def _init_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, rows, ids = ins
    check_dtype(x, "float", "MoeInitRouting input")
    _routing_ids(rows, "MoeInitRouting row_idx")
    _routing_ids(ids, "MoeInitRouting expert_idx")
    if x.rank != 2 or ids.rank != 2 or tuple(rows.shape) != tuple(ids.shape) or \
            not ids.is_static:
        raise ShapeError(f"MoeInitRouting takes x [N, H], row_idx and expert_idx [N, K] "
                         f"(static), got {x}, {rows}, {ids}")
    n, k = ids.shape
    if isinstance(x.shape[0], int) and x.shape[0] != n:
        raise ShapeError(f"MoeInitRouting: x has {x.shape[0]} tokens, expert_idx {n}")
    s = n * k
    return [TensorType((s, x.shape[1]), x.dtype), TensorType((s,), ids.dtype),
            TensorType((s,), ids.dtype)]


def _init_ref(xs, a, ctx):
    x, rows, ids = xs
    n = ids.shape[0]
    order = np.argsort(ids.reshape(-1), kind="stable")
    src = rows.reshape(-1)[order].astype(np.int64)
    where = np.zeros(len(order), ids.dtype)
    where[src] = np.arange(len(order))
    return x[src % n], where, ids.reshape(-1)[order]


class ExpertTokensAttrs(Attrs):
    experts: int = 1


def _tokens_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    (ids,) = ins
    _routing_ids(ids, "MoeComputeExpertTokens input")
    if ids.rank != 1 or attrs["experts"] < 1:
        raise ShapeError(f"MoeComputeExpertTokens takes sorted ids [S] and experts >= 1, got "
                         f"{ids} and {attrs['experts']}")
    return [TensorType((attrs["experts"],), ids.dtype)]


def _tokens_ref(xs, a, ctx):
    ids = xs[0]
    return np.searchsorted(ids, np.arange(a["experts"]), side="right").astype(ids.dtype)


def _finalize_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    rows, skip, bias, scales, where, ids = ins
    for t, what in ((rows, "rows"), (skip, "skip"), (bias, "bias"), (scales, "scales")):
        if t.dtype != rows.dtype:
            raise ShapeError(f"MoeFinalizeRouting: {what} {t} is not of the rows' dtype")
    check_dtype(rows, "float", "MoeFinalizeRouting rows")
    _routing_ids(where, "MoeFinalizeRouting expanded_row_idx")
    _routing_ids(ids, "MoeFinalizeRouting expert_idx")
    if rows.rank != 2 or skip.rank != 2 or bias.rank != 2 or scales.rank != 2 or \
            where.rank != 1 or tuple(ids.shape) != tuple(scales.shape):
        raise ShapeError(f"MoeFinalizeRouting takes rows [N*K, H], skip [N, H], bias [E, H], "
                         f"scales and expert_idx [N, K], expanded_row_idx [N*K], got "
                         f"{[str(t) for t in ins]}")
    return [skip]


def _finalize_ref(xs, a, ctx):
    rows, skip, bias, scales, where, ids = xs
    n, k = scales.shape
    out = skip.astype(np.float32).copy()
    w = np.asarray(where, np.int64)
    for j in range(k):
        picked = rows[w[j * n:(j + 1) * n]].astype(np.float32)
        out += scales[:, j:j + 1].astype(np.float32) * (
            picked + bias[np.asarray(ids[:, j], np.int64)].astype(np.float32))
    return out.astype(skip.dtype)


register(OpDef("MoeInitRouting", OpKind.OPAQUE, (3, 3), _init_infer, _init_ref,
               category="nn", doc="a mixture of experts' tokens sorted by expert: the rows, "
                                  "where each went, the sorted expert ids"))
register(OpDef("MoeComputeExpertTokens", OpKind.OPAQUE, (1, 1), _tokens_infer, _tokens_ref,
               attrs=ExpertTokensAttrs, category="nn",
               doc="the end of each expert's rows among sorted expert ids"))
register(OpDef("MoeFinalizeRouting", OpKind.OPAQUE, (6, 6), _finalize_infer, _finalize_ref,
               category="nn", doc="a mixture of experts' rows back in token order, weighted "
                                  "and summed per token, plus a skip"))


# ------------------------------------------------------------------ gating
# MoeGatingTopKSoftmax (logits x [..., E]) -> (weights y [..., K] of x's dtype, expert ids
# [..., K] int32): a router's softmax over the experts and its TopK in one operator, as the
# vendor's MoeGatingTopKSoftmaxV2 defines it (``torch_npu.npu_moe_gating_top_k_softmax_v2``;
# codegen/extern.py). ``renorm`` 0: the K largest of softmax(x); 1: the K largest logits,
# then a softmax over those K (the picked weights renormalised to sum to 1: softmax is
# monotonic, so the same experts, and exp(x_i - m) / sum over the K picked is the picked
# softmax weights divided by their sum). Ties: the lower expert first, as TopK; ``ties``
# "torch.topk" (from a torch program's TopK of that rule): the experts torch.topk picks from
# the ranked values (opdefs/indexing.py) -- softmax(x) (renorm 0) or x (renorm 1; softmax is
# monotonic, so torch's comparisons, and its choice, are the same on either unless two
# logits' probabilities round to one value).


class GatingAttrs(Attrs):
    k: int = 1
    renorm: int = 0
    ties: Literal["first", "torch.topk"] = "first"


def _gating_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    (x,) = ins
    check_dtype(x, "float", "MoeGatingTopKSoftmax input")
    k, experts = attrs["k"], x.shape[-1] if x.rank else None
    if x.rank not in (2, 3) or not isinstance(experts, int) or not 0 < k <= min(experts, 1024) \
            or attrs["renorm"] not in (0, 1):
        raise ShapeError(f"MoeGatingTopKSoftmax takes x [N, E] or [B, N, E] (E static), "
                         f"0 < k <= min(E, 1024) and renorm 0 or 1, got {x}, k={k}, "
                         f"renorm={attrs['renorm']}")
    shape = (*x.shape[:-1], k)
    return [TensorType(shape, x.dtype), TensorType(shape, DType.int32)]


def _softmax_last(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gating_ref(xs, a, ctx):
    x = xs[0]
    f = x.astype(np.float32)
    key = f if a["renorm"] else _softmax_last(f)
    idx = _top(key, a["k"], a.get("ties", "first"))
    picked = np.take_along_axis(key, idx, axis=-1)
    y = _softmax_last(picked) if a["renorm"] else picked
    return y.astype(x.dtype), idx.astype(np.int32)


register(OpDef("MoeGatingTopKSoftmax", OpKind.OPAQUE, (1, 1), _gating_infer, _gating_ref,
               attrs=GatingAttrs, category="nn",
               doc="a router's softmax over the experts and its TopK (renorm 1: the picked "
                   "weights renormalised)"))


# -------------------------------------------------------- group-limited gating
# MoeGatingTopK (logits x [N, E], bias [E]) -> (weights y [N, K] of x's dtype, expert ids
# [N, K] int32): DeepSeek-V3's router as the vendor's MoeGatingTopK defines it
# (``torch_npu.npu_moe_gating_top_k``, aclnnMoeGatingTopK; codegen/extern.py). The scores
# are sigmoid(x) (``norm_type`` 1) or softmax(x) (0); the experts are ranked by the scores
# plus ``bias``, in ``group_count`` groups of E / group_count: each group scored by its best
# expert (``group_select_mode`` 0) or the sum of its best two (1), the ``k_group`` best
# groups kept and the K best experts of those picked. ``y`` is the picked experts' scores
# (without the bias) divided by their sum plus ``eps``, times ``routed_scaling_factor``.
# Ties: the lower group, the lower expert first; ``ties`` "torch.topk": both choices
# torch.topk's on the same values (the group scores; the masked ranking, -inf outside the
# kept groups, as the program masks it: passes/moe_routing.py). The operator's limits (the
# vendor's): E <= 2048, E divisible by group_count into groups of more than
# group_select_mode experts, 32-aligned groups within 2048 experts, 1 <= k_group <=
# group_count, k at most the experts of k_group groups.
EXPERTS_MAX = 2048


class GroupGatingAttrs(Attrs):
    k: int = 1
    k_group: int = 1
    group_count: int = 1
    group_select_mode: int = 0
    norm_type: int = 1
    routed_scaling_factor: float = 1.0
    eps: float = 1e-20
    ties: Literal["first", "torch.topk"] = "first"


def group_gating_refusal(experts: object, a: dict) -> str | None:
    """Why the vendor's MoeGatingTopK cannot take ``experts`` experts with attributes ``a``
    (None when it can)."""
    g, kg, k = a["group_count"], a["k_group"], a["k"]
    if not isinstance(experts, int) or not 0 < experts <= EXPERTS_MAX:
        return f"E = {experts} experts (the operator takes a static E <= {EXPERTS_MAX})"
    if a["group_select_mode"] not in (0, 1) or a["norm_type"] not in (0, 1):
        return "group_select_mode and norm_type are 0 or 1"
    if g <= 0 or experts % g or experts // g <= a["group_select_mode"]:
        return (f"{g} groups of {experts} experts (E divisible by the groups, each of more "
                "than group_select_mode experts)")
    if -(-(experts // g) // 32) * 32 * g > EXPERTS_MAX:
        return f"{g} groups of {experts // g} experts, 32-aligned, exceed {EXPERTS_MAX}"
    if not 1 <= kg <= g or not 1 <= k <= kg * (experts // g):
        return (f"k = {k} of k_group = {kg} groups of {g} (1 <= k_group <= groups, k at most "
                "the experts of k_group groups)")
    return None


def _group_gating_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    x, bias = ins
    check_dtype(x, "float", "MoeGatingTopK input")
    experts = x.shape[-1] if x.rank else None
    why = group_gating_refusal(experts, attrs) if x.rank == 2 else "x is not [N, E]"
    if why is None and (bias.rank != 1 or bias.shape[0] != experts or bias.dtype != x.dtype):
        why = f"bias {bias} is not [E] of x's dtype"
    if why is not None:
        raise ShapeError(f"MoeGatingTopK takes x [N, E] and bias [E]: {why}; got {x}, "
                         f"{bias}")
    shape = (x.shape[0], attrs["k"])
    return [TensorType(shape, x.dtype), TensorType(shape, DType.int32)]


def _top(v: np.ndarray, k: int, ties: str = "first") -> np.ndarray:
    """Indices of the k largest along the last axis: the lower index first on ties, or
    (``ties`` "torch.topk") torch.topk's choice."""
    if ties == "torch.topk":
        return torch_select(v, k, v.ndim - 1, True)
    return np.argsort(-v, axis=-1, kind="stable")[..., :k]


def _group_gating_ref(xs, a, ctx):
    x, bias = xs
    f = x.astype(np.float32)
    scores = 1.0 / (1.0 + np.exp(-f)) if a["norm_type"] == 1 else _softmax_last(f)
    value = scores + bias.astype(np.float32)
    n, experts = value.shape
    g = a["group_count"]
    grouped = value.reshape(n, g, experts // g)
    if a["group_select_mode"] == 1:
        best = np.take_along_axis(grouped, _top(grouped, 2), axis=-1).sum(-1)  # (values)
    else:
        best = grouped.max(-1)
    keep = np.zeros((n, g), bool)
    ties = a.get("ties", "first")
    np.put_along_axis(keep, _top(best, a["k_group"], ties), True, axis=-1)
    masked = np.where(np.repeat(keep, experts // g, axis=-1), value, -np.inf)
    idx = _top(masked, a["k"], ties)
    y = np.take_along_axis(scores, idx, axis=-1)
    y = y / (y.sum(-1, keepdims=True) + np.float32(a["eps"])) * np.float32(
        a["routed_scaling_factor"])
    return y.astype(x.dtype), idx.astype(np.int32)


register(OpDef("MoeGatingTopK", OpKind.OPAQUE, (2, 2), _group_gating_infer, _group_gating_ref,
               attrs=GroupGatingAttrs, category="nn",
               doc="a group-limited router (sigmoid or softmax scores, a bias for the ranking, "
                   "the best groups, then the best experts of those; the picked scores "
                   "renormalised and scaled)"))
