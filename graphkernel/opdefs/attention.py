"""FusedAttention: scaled dot-product attention as one op, the contract of the vendor's fused
attention operator (CANN's FlashAttentionScore, ``torch_npu.npu_fusion_attention``).

``out = Softmax(Mask(scale * (pse + Q·Kᵀ), atten_mask)) · V`` — the form the operator
documents (pse_type 1; inference, so no dropout). Q, K, V are read in one of the documented
layouts (``BSH``, ``SBH``, ``BSND``, ``BNSD``; H = N·D) and the output has the query's layout.
K/V may have fewer heads than Q (N2 dividing N1: grouped-query attention, each K/V head
shared by N1/N2 query heads). The masks (``mask``: none, one or both, inputs in this order
after Q, K, V): ``pse`` (a float bias added before the scale) in [B,N1,S1,S2], [B,N1,1,S2]
(one row for every query: ALiBi) or [1,N1,S1,S2]; ``atten_mask`` (bool/uint8, 1 = masked
out) in [B,N1,S1,S2], [B,1,S1,S2], [1,1,S1,S2] or [S1,S2]. ``causal`` masks out every key
after the query's position (key j > query i): the operator's sparse_mode 2 (leftUpCausal),
which reads its own compressed 2048×2048 mask instead of a [.., S1, S2] one, so a causal
mask built from a symbolic sequence length costs nothing; it excludes an ``atten_mask``
input. ``window`` w > 0 keeps only the last w keys up to the query (a sliding window: keys
j <= i - w masked too): the band mode, sparse_mode 4 with pre_tokens w - 1, next_tokens 0.
Limits: D a multiple of 16 and at most 512, N1 at most 256, fp16/bf16/fp32 operands.

The numpy reference accumulates both products in fp32 and takes the softmax in fp32; the
result is rounded once to the inputs' type. A row whose every key is masked out has no
defined softmax; the reference writes zeros there. The simulator checks the extern launch
against this reference.

With ``stats`` the op also returns the operator's softmax statistics, what its gradient
reads: ``softmax_max`` (each row's largest scaled, masked score) and ``softmax_sum`` (the
row's sum of ``exp(score - softmax_max)``), fp32 [B, N1, S1, 8] — the operator writes each
row's value 8 times (one 32-byte block). A row whose every key is masked out has
``softmax_max`` 0 and ``softmax_sum`` 0. ``logsumexp = softmax_max + log(softmax_sum)``.

FusedAttentionGrad is the operator's gradient, CANN's FlashAttentionScoreGrad
(``torch_npu.npu_fusion_attention_grad``): from Q, K, V, the output's gradient dY, the
forward's output (``attention_in``) and its ``softmax_max``/``softmax_sum`` (plus the same
masks and attributes as the forward) it recomputes the probabilities
``P = exp(scale * (pse + Q·Kᵀ) masked - softmax_max) / softmax_sum`` and returns
``dV = Pᵀ·dY``, ``dQ = scale · dS·K``, ``dK = scale · dSᵀ·Q`` with
``dS = P ∘ (dY·Vᵀ - rowsum(dY ∘ attention_in))``; with fewer K/V heads, dK and dV sum over
the query heads sharing each K/V head. Inputs: Q, K, V, dY, attention_in, softmax_max,
softmax_sum, then the masks; outputs dQ, dK, dV in the operands' layouts and types.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ops import Attrs, OpDef, OpKind, register
from graphkernel.tensor_types import DType, TensorType

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD")
DTYPES = (DType.float16, DType.bfloat16, DType.float32)
MASK_DTYPES = (DType.bool, DType.uint8)
MAX_HEAD_SIZE = 512
MAX_HEADS = 256
HEAD_ALIGN = 16


class FusedAttentionAttrs(Attrs):
    layout: Literal["BSH", "SBH", "BSND", "BNSD"] = "BNSD"
    head_num: int = Field(ge=1, le=MAX_HEADS)  # N1, the query's heads
    scale: float = 1.0
    mask: Literal["none", "atten_mask", "pse", "pse_and_atten_mask"] = "none"
    causal: bool = False  # key j > query i masked out (sparse_mode 2)
    window: int = Field(default=0, ge=0)  # with causal, keys j <= i - window too (0: none)


class FusedAttentionFwdAttrs(FusedAttentionAttrs):
    stats: bool = False  # also return softmax_max and softmax_sum (what the gradient reads)


STATS_WIDTH = 8  # softmax_max / softmax_sum: [B, N1, S1, 8], each row's value 8 times
GRAD_LEAD = 7  # FusedAttentionGrad's inputs before its masks: q, k, v, dy, out, max, sum


def mask_kinds(mask: str) -> list[str]:
    """The mask inputs ``mask`` names, in input order."""
    return {"none": [], "atten_mask": ["atten_mask"], "pse": ["pse"],
            "pse_and_atten_mask": ["pse", "atten_mask"]}[mask]


def split_dims(t: TensorType, layout: str, heads: int | None, head_size=None) -> tuple:
    """(B, N, S, D) of an operand in ``layout``; for BSH/SBH the heads come from ``heads`` or
    from ``head_size`` (H = N·D)."""
    want = 3 if layout in ("BSH", "SBH") else 4
    if t.rank != want:
        raise ShapeError(f"layout {layout} takes rank-{want} operands, got {t}")
    if layout == "BSND":
        b, s, n, d = t.shape
    elif layout == "BNSD":
        b, n, s, d = t.shape
    else:
        b, s, h = t.shape if layout == "BSH" else (t.shape[1], t.shape[0], t.shape[2])
        if not isinstance(h, int):
            raise ShapeError(f"layout {layout}: the hidden size H must be static, got {h!r}")
        if heads is None:
            if head_size is None or h % head_size:
                raise ShapeError(f"hidden size {h} of K/V is not a multiple of the head "
                                 f"size {head_size}")
            heads = h // head_size
        if h % heads:
            raise ShapeError(f"hidden size {h} is not a multiple of head_num {heads}")
        n, d = heads, h // heads
    return b, n, s, d


def limits(dtype: DType, n1, n2, d) -> str | None:
    """Why the operator cannot take these operands (its documented limits), or None."""
    if dtype not in DTYPES:
        return (f"dtype {dtype.value} (the fused attention operator takes "
                f"{', '.join(t.value for t in DTYPES)})")
    if not isinstance(d, int) or d % HEAD_ALIGN or d > MAX_HEAD_SIZE:
        return f"head size D={d} (the operator needs a multiple of {HEAD_ALIGN}, at most " \
               f"{MAX_HEAD_SIZE})"
    if not isinstance(n1, int) or n1 > MAX_HEADS:
        return f"{n1} query heads (the operator takes at most {MAX_HEADS})"
    if not isinstance(n2, int) or n1 % n2:
        return f"{n2} K/V heads do not divide the {n1} query heads"
    return None


def mask_shapes(kind: str, b, n1, s1, s2) -> list[tuple]:
    """The documented shapes of a mask of ``kind`` for these dims."""
    if kind == "atten_mask":
        return [(b, n1, s1, s2), (b, 1, s1, s2), (1, 1, s1, s2), (s1, s2)]
    return [(b, n1, s1, s2), (b, n1, 1, s2), (1, n1, s1, s2)]


def _check(ins: list[TensorType], attrs: dict, lead: int) -> tuple:
    """Check Q, K, V (the first three inputs) and the masks (from input ``lead`` on) against
    the operator's contract; (B, N1, S1, S2) of the scores."""
    q, k, v = ins[:3]
    layout, n1 = attrs["layout"], attrs["head_num"]
    if not (q.dtype == k.dtype == v.dtype):
        raise ShapeError(f"q, k, v dtypes differ ({q.dtype.value}, {k.dtype.value}, "
                         f"{v.dtype.value})")
    if k.shape != v.shape:
        raise ShapeError(f"k and v shapes differ ({k} vs {v})")
    b, nq, s1, d = split_dims(q, layout, n1)
    if nq != n1:
        raise ShapeError(f"q has {nq} heads, head_num says {n1}")
    bk, n2, s2, dk = split_dims(k, layout, None, head_size=d)
    if bk != b or dk != d:
        raise ShapeError(f"k {k} does not match q {q} in batch or head size (layout {layout})")
    why = limits(q.dtype, n1, n2, d)
    if why is not None:
        raise ShapeError(f"unsupported {why}")
    kinds = mask_kinds(attrs["mask"])
    if attrs.get("window") and not attrs.get("causal"):
        raise ShapeError(f"window={attrs['window']} without causal (a window is a band "
                         "that ends at the query)")
    if attrs.get("causal") and "atten_mask" in kinds:
        raise ShapeError(f"causal with mask={attrs['mask']}: the causal mode is the "
                         "operator's own atten_mask (accepted masks: none, pse)")
    if len(ins) != lead + len(kinds):
        raise ShapeError(f"mask={attrs['mask']} takes {lead + len(kinds)} inputs, got "
                         f"{len(ins)}")
    for kind, m in zip(kinds, ins[lead:], strict=True):
        ok = MASK_DTYPES if kind == "atten_mask" else DTYPES
        if m.dtype not in ok:
            raise ShapeError(f"{kind} of dtype {m.dtype.value} (accepted: "
                             f"{', '.join(t.value for t in ok)})")
        shapes = mask_shapes(kind, b, n1, s1, s2)
        if tuple(m.shape) not in shapes:
            raise ShapeError(f"{kind} of shape {list(m.shape)} (accepted: "
                             f"{' or '.join(str(list(s)) for s in shapes)})")
    return b, n1, s1, s2


def stats_type(b, n1, s1) -> TensorType:
    """The type of softmax_max and softmax_sum."""
    return TensorType((b, n1, s1, STATS_WIDTH), DType.float32)


def _infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    b, n1, s1, _ = _check(ins, attrs, 3)
    out = [TensorType(ins[0].shape, ins[0].dtype)]
    return out + [stats_type(b, n1, s1)] * 2 if attrs.get("stats") else out


def _infer_grad(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    if len(ins) < GRAD_LEAD:
        raise ShapeError(f"takes q, k, v, dy, attention_in, softmax_max, softmax_sum and the "
                         f"masks; got {len(ins)} inputs")
    b, n1, s1, _ = _check(ins, attrs, GRAD_LEAD)
    q = ins[0]
    for what, t in (("dy", ins[3]), ("attention_in", ins[4])):
        if t != q:
            raise ShapeError(f"{what} {t} differs from q {q}")
    want = stats_type(b, n1, s1)
    for what, t in (("softmax_max", ins[5]), ("softmax_sum", ins[6])):
        if not (t.dtype == want.dtype and t.rank == 4
                and all(symbolic.canon(x) == symbolic.canon(y)
                        for x, y in zip(t.shape, want.shape, strict=True))):
            raise ShapeError(f"{what} {t} (accepted: {want})")
    return [TensorType(t.shape, t.dtype) for t in ins[:3]]


def to_bnsd(x: np.ndarray, layout: str, head_size: int) -> np.ndarray:
    """An operand in ``layout`` as [B, N, S, D]."""
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(0, 2, 1, 3)
    if layout == "SBH":
        x = x.transpose(1, 0, 2)
    b, s, h = x.shape
    return x.reshape(b, s, h // head_size, head_size).transpose(0, 2, 1, 3)


def from_bnsd(x: np.ndarray, layout: str) -> np.ndarray:
    """[B, N, S, D] in ``layout``."""
    if layout == "BNSD":
        return x
    x = x.transpose(0, 2, 1, 3)  # B S N D
    if layout == "BSND":
        return x
    b, s, n, d = x.shape
    x = x.reshape(b, s, n * d)
    return x if layout == "BSH" else x.transpose(1, 0, 2)


def _head_size(q: np.ndarray, attrs: dict) -> int:
    return q.shape[-1] if attrs["layout"] in ("BSND", "BNSD") else q.shape[-1] // attrs[
        "head_num"]


def _scores(qh: np.ndarray, kh: np.ndarray, masks: dict[str, np.ndarray], attrs: dict
            ) -> np.ndarray:
    """scale * (pse + Q·Kᵀ) with masked-out scores at -inf, fp32 [B, N1, S1, S2] (K with
    its heads repeated to N1)."""
    s = np.matmul(qh, np.swapaxes(kh, -1, -2), dtype=np.float32)
    if "pse" in masks:
        s = s + masks["pse"].astype(np.float32)
    s = s * np.float32(attrs["scale"])
    if "atten_mask" in masks:
        keep = ~masks["atten_mask"].astype(bool)
        s = np.where(keep, s, -np.inf)
    if attrs.get("causal"):
        s1, s2 = s.shape[-2:]
        j, i = np.arange(s2)[None, :], np.arange(s1)[:, None]
        keep = (j <= i) & ((j > i - attrs["window"]) if attrs.get("window") else True)
        s = np.where(keep, s, -np.inf)
    return s


def _bnsd(xs, attrs: dict, d: int) -> list[np.ndarray]:
    return [to_bnsd(np.asarray(x, np.float32), attrs["layout"], d) for x in xs]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, masks: dict[str, np.ndarray],
              attrs: dict, stats: bool = False):
    """The operator's result in fp32 (the caller rounds it to the inputs' type); with
    ``stats``, (result, softmax_max, softmax_sum)."""
    d = _head_size(q, attrs)
    qh, kh, vh = _bnsd((q, k, v), attrs, d)
    group = attrs["head_num"] // kh.shape[1]  # query heads per K/V head
    kh, vh = np.repeat(kh, group, axis=1), np.repeat(vh, group, axis=1)
    s = _scores(qh, kh, masks, attrs)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, np.float32(0))  # all masked: 0
    e = np.exp(s - top, dtype=np.float32)
    total = np.sum(e, axis=-1, keepdims=True, dtype=np.float32)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # all masked: zeros
    out = from_bnsd(np.matmul(p, vh, dtype=np.float32), attrs["layout"])
    if not stats:
        return out
    wide = (*top.shape[:-1], STATS_WIDTH)
    return out, np.broadcast_to(top, wide).copy(), np.broadcast_to(total, wide).copy()


def attention_grad(q, k, v, dy, out, smax, ssum, masks: dict[str, np.ndarray], attrs: dict
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) in fp32 and the operands' layouts (see the module docstring)."""
    d = _head_size(q, attrs)
    qh, kh, vh, dyh, oh = _bnsd((q, k, v, dy, out), attrs, d)
    n2 = kh.shape[1]
    group = attrs["head_num"] // n2
    kr, vr = np.repeat(kh, group, axis=1), np.repeat(vh, group, axis=1)
    s = _scores(qh, kr, masks, attrs)
    top = np.asarray(smax, np.float32)[..., :1]
    total = np.asarray(ssum, np.float32)[..., :1]
    e = np.exp(s - top, dtype=np.float32)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # all masked: zeros
    scale = np.float32(attrs["scale"])
    dv = np.matmul(np.swapaxes(p, -1, -2), dyh, dtype=np.float32)
    dp = np.matmul(dyh, np.swapaxes(vr, -1, -2), dtype=np.float32)
    delta = np.sum(dyh * oh, axis=-1, keepdims=True, dtype=np.float32)
    ds = p * (dp - delta)
    dq = np.matmul(ds, kr, dtype=np.float32) * scale
    dk = np.matmul(np.swapaxes(ds, -1, -2), qh, dtype=np.float32) * scale

    def shared(x: np.ndarray) -> np.ndarray:  # the query heads' sum for each K/V head
        b, _, s2, dd = x.shape
        return x.reshape(b, n2, group, s2, dd).sum(axis=2, dtype=np.float32)

    layout = attrs["layout"]
    return from_bnsd(dq, layout), from_bnsd(shared(dk), layout), from_bnsd(shared(dv), layout)


def _reference(xs, attrs, ctx):
    masks = dict(zip(mask_kinds(attrs["mask"]), xs[3:], strict=True))
    got = attention(xs[0], xs[1], xs[2], masks, attrs, stats=attrs["stats"])
    got = got if attrs["stats"] else (got,)
    return tuple(r.astype(dt) for r, dt in zip(got, ctx.out_dtypes, strict=True))


def _reference_grad(xs, attrs, ctx):
    masks = dict(zip(mask_kinds(attrs["mask"]), xs[GRAD_LEAD:], strict=True))
    got = attention_grad(*xs[:GRAD_LEAD], masks, attrs)
    return tuple(r.astype(dt) for r, dt in zip(got, ctx.out_dtypes, strict=True))


register(OpDef("FusedAttention", OpKind.OPAQUE, (3, 5), _infer, _reference,
               attrs=FusedAttentionFwdAttrs, category="nn",
               doc="softmax(mask(scale*(pse + Q·Kᵀ))) · V in one launch (the vendor's fused "
                   "attention operator); with stats, also its softmax_max and softmax_sum"))
register(OpDef("FusedAttentionGrad", OpKind.OPAQUE, (GRAD_LEAD, GRAD_LEAD + 2), _infer_grad,
               _reference_grad, attrs=FusedAttentionAttrs, category="nn",
               doc="dQ, dK, dV of FusedAttention in one launch (the vendor's fused attention "
                   "gradient operator), from the forward's output and softmax statistics"))
