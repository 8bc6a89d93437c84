"""Scaled dot-product attention as PyTorch and ONNX define it, built from graphkernel ops.

``forward`` builds ``softmax(Q·Kᵀ · scale + mask) · V`` (and, for a backward, its
logsumexp) for Q [B, N1, L, E] and K/V [B, N2, S, E] (N2 dividing N1: grouped-query
attention) as one FusedAttention (the vendor's fused attention operator) when the operator
takes it, else as the exact decomposition, with the reason it is not one op. ``backward``
builds dQ, dK, dV from the forward's output and logsumexp: one FusedAttentionGrad, or the
exact decomposition. The semantics are torch's:

- ``scale`` None is ``1/sqrt(E)``;
- ``causal`` masks out key j > query i (top-left aligned when L != S, as torch's
  ``is_causal``; the operator's sparse_mode 2);
- ``mask``: boolean (True: the key takes part) or additive, of any shape that broadcasts to
  [B, N1, L, S]. A boolean one (or an additive one of only 0 and minus infinity, which torch
  makes of a boolean one) is the operator's ``atten_mask`` (1 = masked out) — its causal
  mode when it is the causal mask built from positions (``passes/causal_mask.py``) — and any
  other is ``pse`` (the operator adds it before the scale: ``mask / scale``). A mask in a
  shape the operator does not document is broadcast to the smallest one it does;
- a row whose every key is masked out gives zeros (torch's flash and math paths), and its
  logsumexp is 0 (torch's CPU flash attention);
- logsumexp is ``softmax_max + log(softmax_sum)`` of the operator's statistics, and the
  gradient reads it back as ``softmax_max = logsumexp``, ``softmax_sum = 1`` (the same
  probabilities: ``exp(s - lse) = exp(s - max) / sum``).

Dropout is never built here: a caller with ``dropout_p > 0`` leaves the op to torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphkernel import symbolic
from graphkernel.errors import GraphKernelError
from graphkernel.ir import DType, Graph, Value
from graphkernel.opdefs.attention import STATS_WIDTH, limits
from graphkernel.passes.causal_mask import causal_band
from graphkernel.passes.rewrite import const_array, splat

LOWEST = -65504.0  # at or below: masked out (exp underflows to 0 in fp32)


@dataclass
class Spec:
    """One attention: Q [B, N1, L, E], K [B, N2, S, E], V [B, N2, S, Ev]."""

    q: Value
    k: Value
    v: Value
    mask: Value | None = None  # bool (True: takes part) or additive, broadcast to [B,N1,L,S]
    scale: float | None = None  # None: 1/sqrt(E)
    causal: bool = False

    @property
    def factor(self) -> float:
        e = self.q.shape[-1]
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(e)


class Builder:
    """Adds nodes to ``graph`` named after ``base`` with ``origin`` (the user's op)."""

    def __init__(self, graph: Graph, base: str, origin: tuple[str, ...]) -> None:
        self.g, self.base, self.origin = graph, base, origin

    def __call__(self, op: str, inputs: list[Value], attrs: dict | None = None
                 ) -> Value | list[Value]:
        n = self.g.add_node(op, inputs, attrs or {}, name=self.g.fresh_name(self.base),
                            origin=self.origin)
        return n.outputs[0] if len(n.outputs) == 1 else list(n.outputs)

    def const(self, value, dtype: DType) -> Value:
        return self.g.const(np.asarray(value, dtype.np), dtype, origin=self.origin,
                            name=self.g.fresh_name(f"{self.base}_c"))


def _same(a, b) -> bool:
    return symbolic.canon(a) == symbolic.canon(b)


def _dims(s: Spec) -> tuple:
    """(B, N1, N2, L, S, E) or a GraphKernelError when the operands are not attention's."""
    q, k, v = s.q, s.k, s.v
    if not (q.type.rank == k.type.rank == v.type.rank == 4):
        raise GraphKernelError(f"q, k, v of ranks {q.type.rank}, {k.type.rank}, "
                               f"{v.type.rank} (4 expected)")
    b, n1, length, e = q.shape
    bk, n2, src, ek = k.shape
    if not (_same(b, bk) and _same(e, ek) and _same(k.shape[2], v.shape[2])
            and _same(k.shape[1], v.shape[1])):
        raise GraphKernelError(f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} "
                               "do not make an attention")
    if not _same(n1, n2) and not (isinstance(n1, int) and isinstance(n2, int)
                                  and n1 % n2 == 0):
        raise GraphKernelError(f"{n2} K/V heads do not divide the {n1} query heads")
    return b, n1, n2, length, src, e


def _repeat(b: Builder, x: Value, r: int) -> Value:
    """[B, N2, S, D] with each head repeated r times: [B, N2·r, S, D] (grouped-query K/V)."""
    if r == 1:
        return x
    bb, n2, s, d = x.shape
    y = b("ExpandDims", [x], {"axis": [2]})
    y = b("BroadcastTo", [y], {"shape": [bb, n2, r, s, d]})
    return b("Reshape", [y], {"shape": [bb, n2 * r, s, d]})


def _shared(b: Builder, x: Value, n2, r: int) -> Value:
    """[B, N2·r, S, D] summed over each group of r heads: [B, N2, S, D]."""
    if r == 1:
        return x
    bb, _, s, d = x.shape
    y = b("Reshape", [x], {"shape": [bb, n2, r, s, d]})
    return b("ReduceSum", [y], {"axis": [2], "keep_dims": False})


# ----------------------------------------------------------------- masks
def _rank4(b: Builder, m: Value) -> Value:
    if m.type.rank == 4:
        return m
    if m.type.rank > 4:
        raise GraphKernelError(f"mask of rank {m.type.rank} (at most 4)")
    shape = [1] * (4 - m.type.rank) + list(m.shape)
    arr = const_array(m)
    if arr is not None:
        return b.const(arr.reshape(shape), m.dtype)
    return b("Reshape", [m], {"shape": shape})


def _grown(b: Builder, m: Value, want: tuple) -> Value:
    """``m`` broadcast to ``want`` (a constant grows in place; anything else costs a
    BroadcastTo)."""
    if all(_same(x, y) for x, y in zip(m.shape, want, strict=True)):
        return m
    arr = const_array(m)
    if arr is not None and all(isinstance(x, int) for x in want):
        return b.const(np.ascontiguousarray(np.broadcast_to(arr, want)), m.dtype)
    return b("BroadcastTo", [m], {"shape": list(want)})


def _masked_out(b: Builder, m: Value) -> Value | None:
    """A bool value of ``m``'s shape, True where ``m`` masks a key out, when ``m`` is a
    boolean mask (True: takes part) or an additive one of only 0 and minus infinity (a
    ``Select`` of 0 and -inf, seen through casts and views); else None."""
    dead = _dead(b, m)
    if dead is None or dead.type.shape == m.type.shape:
        return dead
    arr = const_array(dead)
    if arr is not None:
        return b.const(arr.reshape(m.shape), DType.bool)
    return b("Reshape", [dead], {"shape": list(m.shape)})


def _dead(b: Builder, m: Value) -> Value | None:
    if m.dtype is DType.bool:
        arr = const_array(m)
        return b.const(~arr, DType.bool) if arr is not None else b("LogicalNot", [m])
    arr = const_array(m)
    if arr is not None:
        a = arr.astype(np.float64)
        if np.all((a == 0) | (a <= LOWEST)) and np.any(a != 0):
            return b.const(a != 0, DType.bool)
        return None
    p = m.producer
    while p is not None and p.op in ("Cast", "Identity", "Reshape", "ExpandDims"):
        m = p.inputs[0]
        p = m.producer
    if p is None or p.op != "Select" or p.inputs[0].dtype is not DType.bool \
            or p.inputs[0].type.shape != p.outputs[0].type.shape:
        return None
    cond, yes, no = p.inputs
    fy, fn = splat(yes), splat(no)
    if fy is None or fn is None:
        return None
    if fy == 0 and fn <= LOWEST:  # where(keep, 0, -inf)
        return b("LogicalNot", [cond])
    if fy <= LOWEST and fn == 0:
        return cond
    return None


@dataclass
class OperatorMasks:
    """The masks as the operator takes them."""

    kind: str = "none"  # the op's mask attribute
    inputs: list[Value] | None = None
    causal: bool = False
    window: int = 0
    note: str = ""


def operator_masks(b: Builder, s: Spec) -> OperatorMasks:
    """``s``'s mask and causal flag as the operator's attributes and mask inputs; a
    GraphKernelError (the reason) when the operator cannot take them."""
    bb, n1, _, length, src, _ = _dims(s)
    out = OperatorMasks(inputs=[], causal=s.causal)
    if s.mask is None:
        return out
    m = _rank4(b, s.mask)
    mb, mn, ml, ms = m.shape
    for got, full, what in ((mb, bb, "batch"), (mn, n1, "heads"), (ml, length, "queries"),
                            (ms, src, "keys")):
        if not (_same(got, 1) or _same(got, full)):
            raise GraphKernelError(f"mask {list(s.mask.shape)} does not broadcast to the "
                                   f"scores' {what} {full!r}")
    dead = _masked_out(b, m)
    if dead is not None:
        window = causal_band(dead, length, src) if _same(length, src) else None
        if window is not None:
            out.causal, out.window = True, window
            out.note = "a causal mask built from positions: the operator's causal mode"
            return out
        if s.causal:
            raise GraphKernelError("is_causal together with a mask that is not the causal "
                                   "one (the operator's causal mode takes no atten_mask)")
        # documented: [1,1,L,S], [B,1,L,S], [B,N1,L,S] (the [L,S] form is [1,1,L,S])
        one_head = _same(mn, 1)
        want = (1 if _same(mb, 1) and one_head else bb, 1 if one_head else n1, length, src)
        dead = _grown(b, dead, want)
        out.kind, out.inputs = "atten_mask", [dead]
        if tuple(m.shape) != want:
            out.note = f"mask {list(s.mask.shape)} broadcast to {list(want)}"
        return out
    if m.dtype != s.q.dtype:
        m = b("Cast", [m], {"dtype": s.q.dtype})
    # documented: [B,N1,1,S] (one row for every query), [1,N1,L,S], [B,N1,L,S]
    want = (bb, n1, 1, src) if _same(ml, 1) else (1, n1, length, src) if _same(mb, 1) \
        else (bb, n1, length, src)
    arr = const_array(m)
    if arr is not None:  # pse enters before the scale: mask / scale
        pse = b.const(arr.astype(np.float64) / s.factor, s.q.dtype)
    else:
        pse = b("Mul", [m, b.const(1.0 / s.factor, s.q.dtype)])
    pse = _grown(b, pse, want)
    out.kind, out.inputs = "pse", [pse]
    if tuple(m.shape) != want:
        out.note = f"additive mask {list(s.mask.shape)} broadcast to {list(want)}"
    return out


def why_not_fused(s: Spec) -> str | None:
    """Why the operator cannot take ``s`` (before its masks are looked at), or None."""
    try:
        _, n1, n2, _, _, e = _dims(s)
    except GraphKernelError as err:
        return str(err)
    if not all(_same(a, b) for a, b in zip(s.k.shape, s.v.shape, strict=True)):
        return f"V's head size {s.v.shape[-1]!r} differs from Q's and K's {e!r}"
    if not (s.q.dtype == s.k.dtype == s.v.dtype):
        return "q, k, v dtypes differ"
    return limits(s.q.dtype, n1, n2, e)


# ---------------------------------------------------------------- forward
def forward(b: Builder, s: Spec, stats: bool = False
            ) -> tuple[Value, Value | None, str | None]:
    """(output [B, N1, L, Ev], logsumexp [B, N1, L] fp32 when ``stats``, the reason it is
    not one FusedAttention or None)."""
    masks, why = _fusable(b, s)
    if masks is not None:
        return (*_fused(b, s, masks, stats), None)
    out, lse = _decomposed(b, s, stats)
    return out, lse, why


def _fusable(b: Builder, s: Spec) -> tuple[OperatorMasks | None, str | None]:
    """(the operator's masks, None) when the attention is one fused operator, else (None,
    why not), with whatever building the masks added taken out of the graph again."""
    why = why_not_fused(s)
    if why is not None:
        return None, why
    with b.g.recording() as added:
        try:
            return operator_masks(b, s), None
        except GraphKernelError as e:
            why = str(e)
    _undo(b.g, added)
    return None, why


def _undo(g: Graph, added: list) -> None:
    for n in reversed(added):
        if n.graph is g and not any(v.users for v in n.outputs):
            g.erase_node(n)


def _attrs(s: Spec, masks: OperatorMasks) -> dict:
    return {"layout": "BNSD", "head_num": s.q.shape[1], "scale": s.factor,
            "mask": masks.kind, "causal": masks.causal, "window": masks.window}


def _fused(b: Builder, s: Spec, masks: OperatorMasks, stats: bool
           ) -> tuple[Value, Value | None]:
    attrs = _attrs(s, masks) | {"stats": stats}
    got = b("FusedAttention", [s.q, s.k, s.v, *masks.inputs], attrs)
    if not stats:
        return got, None
    out, smax, ssum = got
    zero = b.const(0.0, DType.float32)
    lse = b("Add", [smax, b("Log", [ssum])])
    lse = b("Select", [b("Equal", [ssum, zero]), zero, lse])  # all masked: 0
    # each row's value is written 8 times: their max is it (the arithmetic before a row
    # reduction fuses into one kernel with it)
    return out, b("ReduceMax", [lse], {"axis": [3], "keep_dims": False})


def _scores(b: Builder, s: Spec, kr: Value) -> tuple[Value, bool]:
    """scale · Q·Kᵀ + mask (+ the causal mask), and whether a mask can mask a whole row."""
    dt = s.q.dtype
    x = b("BatchMatMul", [s.q, kr], {"transpose_b": True})
    x = b("Mul", [x, b.const(s.factor, dt)])
    low = b.const(-np.inf, dt)
    zero = b.const(0.0, dt)
    if s.mask is not None:
        m = s.mask
        add = b("Select", [m, zero, low]) if m.dtype is DType.bool else b("Cast", [m], {
            "dtype": dt}) if m.dtype != dt else m
        x = b("Add", [x, add])
    if s.causal:
        length, src = s.q.shape[2], s.k.shape[2]
        if isinstance(length, int) and isinstance(src, int):
            keep = np.arange(src)[None, :] <= np.arange(length)[:, None]
            bias = b.const(np.where(keep, 0.0, -np.inf), dt)
        else:
            i = b("ExpandDims", [b("Range", [], {"length": length, "dtype": DType.int64})],
                  {"axis": [1]})
            j = b("Range", [], {"length": src, "dtype": DType.int64})
            bias = b("Select", [b("LessEqual", [j, i]), zero, low])
        x = b("Add", [x, bias])
    return x, s.mask is not None


def _decomposed(b: Builder, s: Spec, stats: bool) -> tuple[Value, Value | None]:
    """The exact decomposition: the scores, their softmax (zeros for a row whose every key
    is masked out), the product with V; the logsumexp (0 for such a row)."""
    _, n1, n2, *_ = _dims(s)
    r = 1 if _same(n1, n2) else n1 // n2
    x, maskable = _scores(b, s, _repeat(b, s.k, r))
    p = b("Softmax", [x], {"axis": -1})
    dt = s.q.dtype
    low, zero = b.const(-np.inf, dt), b.const(0.0, dt)
    if maskable:  # torch's guard: no key left in the row -> zeros, not NaN
        kept = b("LogicalNot", [b("Equal", [x, low])])
        dead = b("LogicalNot", [b("ReduceMax", [kept], {"axis": [3], "keep_dims": True})])
        p = b("Select", [dead, zero, p])
    out = b("BatchMatMul", [p, _repeat(b, s.v, r)])
    if not stats:
        return out, None
    top = b("ReduceMax", [x], {"axis": [3], "keep_dims": True})
    top = b("Select", [b("Equal", [top, low]), zero, top])
    total = b("ReduceSum", [b("Exp", [b("Sub", [x, top])])], {"axis": [3], "keep_dims": True})
    lse = b("Select", [b("Equal", [total, zero]), zero, b("Add", [top, b("Log", [total])])])
    lse = b("Squeeze", [lse], {"axis": [3]})
    return out, lse if lse.dtype is DType.float32 else b("Cast", [lse], {
        "dtype": DType.float32})


# --------------------------------------------------------------- backward
def backward(b: Builder, s: Spec, dy: Value, out: Value, lse: Value
             ) -> tuple[list[Value], str | None]:
    """([dQ, dK, dV], the reason it is not one FusedAttentionGrad or None) from the
    output's gradient ``dy``, the forward's output and its logsumexp [B, N1, L]."""
    masks, why = _fusable(b, s)
    if masks is not None:
        return _fused_grad(b, s, masks, dy, out, lse), None
    return _decomposed_grad(b, s, dy, out, lse), why


def _fused_grad(b: Builder, s: Spec, masks: OperatorMasks, dy: Value, out: Value,
                lse: Value) -> list[Value]:
    bb, n1, length = s.q.shape[:3]
    wide = [bb, n1, length, STATS_WIDTH]
    lse = lse if lse.dtype is DType.float32 else b("Cast", [lse], {"dtype": DType.float32})
    smax = b("BroadcastTo", [b("ExpandDims", [lse], {"axis": [3]})], {"shape": wide})
    ssum = b("BroadcastTo", [b.const(1.0, DType.float32)], {"shape": wide})
    return list(b("FusedAttentionGrad", [s.q, s.k, s.v, dy, out, smax, ssum, *masks.inputs],
                  _attrs(s, masks)))


def _decomposed_grad(b: Builder, s: Spec, dy: Value, out: Value, lse: Value) -> list[Value]:
    """P = exp(scores - lse) (0 where masked out); dV = Pᵀ·dY; dS = P ∘ (dY·Vᵀ -
    rowsum(dY ∘ out)); dQ = scale · dS·K; dK = scale · dSᵀ·Q (K/V heads summed over their
    query heads)."""
    _, n1, n2, *_ = _dims(s)
    r = 1 if _same(n1, n2) else n1 // n2
    dt = s.q.dtype
    kr, vr = _repeat(b, s.k, r), _repeat(b, s.v, r)
    x, _ = _scores(b, s, kr)
    lse = b("ExpandDims", [lse if lse.dtype == dt else b("Cast", [lse], {"dtype": dt})],
            {"axis": [3]})
    p = b("Exp", [b("Sub", [x, lse])])
    dv = b("BatchMatMul", [p, dy], {"transpose_a": True})
    dp = b("BatchMatMul", [dy, vr], {"transpose_b": True})
    delta = b("ReduceSum", [b("Mul", [dy, out])], {"axis": [3], "keep_dims": True})
    ds = b("Mul", [p, b("Sub", [dp, delta])])
    scale = b.const(s.factor, dt)
    dq = b("Mul", [b("BatchMatMul", [ds, kr]), scale])
    dk = b("Mul", [b("BatchMatMul", [ds, s.q], {"transpose_a": True}), scale])
    return [dq, _shared(b, dk, n2, r), _shared(b, dv, n2, r)]
