"""Recognise scaled dot-product attention and rewrite it into one FusedAttention op (the
vendor's fused attention operator, launched as an extern kernel).

The pattern, as the frontends and the Softmax expander leave it::

    S = BatchMatMul(Q, Kᵀ)        Kᵀ by transpose_b or a Transpose of K's last two axes (or
                                  of [.., S, N, D] to [.., N, D, S]: head split and Kᵀ in one)
                                  (torch's math path: Kᵀ · c, Kᵀ broadcast to every head)
    S = S * c | c * S | S / c     the scale (or Q = Q * c: folded into Q; none: scale 1)
    S = S + M                     optional masks (either side; two: a bias, then a mask)
    S = Select(C, low, S)         or a masked_fill of the scores (C: True = masked out), or
    S = Select(C, S, low)         the scores kept where C holds (GPT-Neo): not C masks out
    S = Maximum(S, low)           optional, anywhere among the masks: masked-out scores kept
                                  finite (XGLM clamps at the lowest float); low <= -65504
                                  changes only scores below it, whose weight is 0 either way
                                  (a row whose every key is masked out aside, as for masks)
    P = Div(E, ReduceSum(E)),  E = Exp(S - ReduceMax(S))   (casts around it in fp16/bf16)
    P = Select(no key left, 0, P) optional: torch's guard of a row whose every key is masked
                                  out (not any(S != -inf)), or ONNX's Where(IsNaN(P), 0, P):
                                  the operator's own zeros for such a row
    O = BatchMatMul(P, V)

with reshape views anywhere between (batch and heads merged into one axis and split again).
Q, K and V must each be a [B, N, S, D] value (seen through views) — or, when all three have
other batch axes (windows × heads, or [B·N, S, D] with no head split behind it), they are read
as [X, 1, S, D], each of the X matrices a head of its own (``_merged``); a head split with
more than one batch axis in front ([.., S, N, D] -> [.., N, S, D]: LongT5's batch × blocks) is
read with its batch axes as one and its heads kept (``_batched``), views in every layout — :
a head split (``Reshape [B,S,H] -> [B,S,N,D]`` + ``Transpose(0,2,1,3)``) before it is read in
place (BSH or BSND) rather than materialised; K/V repeated for grouped-query attention
(``ExpandDims`` + ``BroadcastTo [B,N2,r,S,D]`` + ``Reshape``, or one head broadcast to all:
multi-query) are read with their N2 heads, and so are K/V repeated before their head split
(``BroadcastTo [B,S,N2,r,D]`` + ``Reshape [B,S,N,D]``: Falcon's grouped projection), in BSND
or BSH, with per-head work on the repeated K (rotary embedding) done on its N2 heads; the
head merge on the output (``Transpose(0,2,1,3)``) is written by the operator in BSH/BSND. The
operator takes one layout for Q, K, V and the output, so the layout is the best all four
allow (BNSD when any of them is not a head split/merge). nn.MultiheadAttention's heads are
split sequence first (``[S, B, H]`` viewed ``[S, B·N, D]``, ``Transpose(1, 0, 2)``; an ONNX
export moves K to Kᵀ by ``Transpose(1, 2, 0)``) and merged back the same way: when all four
are, the layout is SBH. A constant operand (a pooling head's learned query, projected and
scaled at compile time) is laid out at compile time in whichever layout the others need.

Masks: a mask whose values are only 0 and "minus infinity" (at most -65504, the fp16 lowest:
exp of it underflows to 0) — a constant, or ``Select(cond, low, 0)`` — and the condition of
a masked_fill of the scores with such a value become the boolean ``atten_mask`` (1 = masked
out); any other additive mask becomes ``pse``, divided by the
scale (the operator computes ``scale * (pse + Q·Kᵀ)``); two such biases are one pse, their
sum (``_summed_biases``: exact up to the order of float summation); two masks that are
only 0 and minus infinity (or conditions) are one atten_mask, their union (``_united``: a
score either sends to minus infinity has weight 0 either way). BLOOM's ALiBi bias arrives as
[B·N, 1, S2]: split to [B, N, 1, S2], a documented pse shape. A constant pse in a shape the
operator does not document grows (broadcast) to one it does: [1,N,S1,S2] when it does not
vary over the batch, else [B,N,S1,S2]. Other
masks in shapes the operator does not document are broadcast when that costs no more than
the unfused attention would: a [B,1,1,S2] key-padding mask to [B,N,1,S2], a mask of every
score shared by the heads ([B,1,S1,S2] or [1,1,S1,S2], a decoder's 4-d mask computed in
another graph) to [B,N,S1,S2] (as many values as the scores the unfused attention writes and
reads back); others ([B,1,S1,1]) are refused rather than broadcast.

A FusedAttention the frontend made (scaled_dot_product_attention, ONNX's Attention: BNSD) is
read in the best layout the same way: its head splits read in place, the head merge written
by the operator, Q's constant factor taken into the scale.

Attention with sinks (``attention_sinks``) leaves the softmax's row max and sum read by the
sink's share of each row as well: the operator then also returns its softmax statistics
(``stats``), which replace them.

A function of the scores before the softmax other than the scale and the masks (Gemma 2's
soft-capping, ``cap * tanh(scores / cap)``) is refused, the function named: the operator
computes ``softmax(mask(scale * (pse + Q·Kᵀ)))`` and takes no such function (none of its
documented inputs is one), so the scores' product keeps the capping and the softmax in its
MIX kernel and P·V is a cube kernel.

Every candidate (a softmax between two products, or a FusedAttention from the frontend) is
recorded in ``analyses.attention`` with its verdict; ``graphkernel explain`` shows the
reasons of the refused ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphkernel import symbolic
from graphkernel.analyses import AttentionMatch
from graphkernel.errors import GraphKernelError
from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.opdefs.attention import from_bnsd, limits, mask_shapes
from graphkernel.ops import RESHAPE_OPS, VIEW_OPS
from graphkernel.passes.causal_mask import causal_band
from graphkernel.passes.head_layout import Rebuild, bsnd_builder
from graphkernel.passes.qkv_split import Built, sliced_source, split_parts
from graphkernel.passes.rewrite import const_array, splat
from graphkernel.registry import PassResult, counted

LOWEST = -65504.0  # a mask value at or below this masks out (exp underflows to 0 in fp32)
HEAD_SPLIT = [0, 2, 1, 3]
LAYOUTS = ("BNSD", "BSND", "BSH")  # in the order of what they need absorbed


def _split_perm(rank: int) -> list[int]:
    """The head split (and merge) of a rank-``rank`` value [.., S, N, D] <-> [.., N, S, D]:
    the sequence and head axes swapped behind any number of leading batch axes
    (``HEAD_SPLIT`` at rank 4)."""
    return [*range(rank - 3), rank - 2, rank - 3, rank - 1]


class Refused(Exception):
    """A candidate the operator cannot take, with the reason."""


@dataclass
class _Operand:
    """One of Q, K, V (or the output): its [B, N, S, D] dims and the value each layout reads
    (BNSD may be missing: K seen only as a [B, S, N, D] value transposed straight to Kᵀ)."""

    shape: tuple
    reads: dict[str, Value] = field(default_factory=dict)  # layout -> value read
    # layout -> what builds the value read, made only when that layout is picked (elementwise
    # work on a head split, such as rotary embedding, computed again in BSND)
    builds: dict[str, Rebuild] = field(default_factory=dict)
    sources: list[Value] = field(default_factory=list)  # the head splits a build reads
    built: Built | None = None  # what was built, when something was
    one_head: bool = False  # [B, 1, S, D]: its BSND and BSH are views (the axis of 1 moved)
    # layout -> what makes the value read when that layout is picked (grouped-query K/V read
    # with their own heads: views of the value before its head repetition)
    lazy: dict[str, Callable[[list[str]], Value]] = field(default_factory=dict)
    merged: bool = False  # [X, 1, S, D]: its batch axes read as one, one head each
    batched: bool = False  # [.., S, N, D] head split: its batch axes read as one (``_batched``)

    @property
    def best(self) -> int:
        views = ("BSND", "BSH") if self.one_head else ()
        return max(LAYOUTS.index(k) for k in (*self.reads, *self.builds, *views, *self.lazy)
                   if k in LAYOUTS)

    def offers(self, layout: str) -> bool:
        """Whether the operand can be read in ``layout``."""
        return layout in self.reads or layout in self.builds or layout in self.lazy or (
            self.one_head and layout in ("BSND", "BSH"))

    def read(self, layout: str, what: str, notes: list[str]) -> Value:
        """The value read in ``layout``, built now when it is to be built."""
        if layout not in self.reads and layout in self.lazy:
            self.reads[layout] = self.lazy[layout](notes)
        if layout not in self.reads and layout not in self.builds and self.one_head:
            b, _, s, d = self.shape
            base = self.reads["BNSD"]
            self.reads[layout] = base.graph.add_node(
                "Reshape", [base], {"shape": [b, s, 1, d] if layout == "BSND" else [b, s, d]},
                name=base.graph.fresh_name(f"{base.name}/{layout.lower()}"),
                origin=base.producer.origin if base.producer is not None else ()).outputs[0]
            notes.append(f"{what}'s one head read in {layout} as a view")
        if layout not in self.reads:
            self.reads[layout] = self.builds[layout](self.sources)
            self.built = Built(self.builds[layout], self.reads[layout], self.sources[0])
            notes.append(f"{what}'s elementwise work on its head split computed in {layout} "
                         "(no head transpose)")
        return self.reads[layout]


@dataclass
class _Match:
    pv: Node
    qk: Node
    nodes: list[Node]  # every node the operator replaces (the pattern's inside)
    q: Value
    k: Value
    v: Value
    scale: float = 1.0
    k_bsnd: bool = False  # k is [B, S, N, D] (its head split and Kᵀ were one Transpose)
    k_sbh: bool = False  # k is [S, B·N, D] (sequence first; head split and Kᵀ one Transpose)
    k_heads: int = 1  # Kᵀ broadcast from one head to this many (multi-query attention)
    kt: Node | None = None  # the Transpose making Kᵀ (it may stay, read elsewhere too)
    # each additive mask and the rank of the scores it is added to ([B, N, S1, S2] or
    # [B·N, S1, S2])
    masks: list[tuple[Value, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was done beyond the plain rewrite
    # the softmax's row max and row sum: read elsewhere, they are the operator's statistics
    rows: tuple[Node, Node] | None = None
    # the boolean masks among ``masks`` that are True where a score is kept (where(cond,
    # scores, low)): the operator's mask is their negation
    keep: list[Value] = field(default_factory=list)


def _producer(v: Value, *ops: str) -> Node | None:
    p = v.producer
    return p if p is not None and p.op in ops else None


def _views(v: Value, seen: list[Node]) -> Value:
    """``v`` seen through reshape views (and a Concat of one input, an identity), recording
    the nodes walked in ``seen``."""
    while (p := v.producer) is not None and (
            p.op in VIEW_OPS or p.op == "Concat" and len(p.inputs) == 1):
        seen.append(p)
        v = p.inputs[0]
    return v


def _cast(v: Value, seen: list[Node]) -> Value:
    """``v`` seen through one Cast (the Softmax expander's fp32 round trip)."""
    p = _producer(v, "Cast")
    if p is not None:
        seen.append(p)
        return p.inputs[0]
    return v


def reduces_last_axis(node: Node) -> bool:
    """Whether the reduction ``node`` runs along its input's last axis, keeping it."""
    rank = node.inputs[0].type.rank
    return list(node.attrs["axis"]) == [rank - 1] and node.attrs["keep_dims"]


def softmax_input(p: Value, seen: list[Node]) -> Value | None:
    """The input of the expanded softmax (over the last axis) producing ``p``, or None; the
    softmax's nodes are appended to ``seen``."""
    p = _cast(p, seen)
    div = _producer(p, "Div")
    if div is None:
        return None
    e, total = div.inputs
    rsum = _producer(total, "ReduceSum")
    exp = _producer(e, "Exp")
    if rsum is None or exp is None or rsum.inputs[0] is not e or not reduces_last_axis(rsum):
        return None
    sub = _producer(exp.inputs[0], "Sub")
    if sub is None:
        return None
    inner: list[Node] = []
    x = _cast(sub.inputs[0], inner)
    rmax = _producer(_cast(sub.inputs[1], inner), "ReduceMax")
    if rmax is None or rmax.inputs[0] is not x or not reduces_last_axis(rmax):
        return None
    seen += [div, rsum, exp, sub, *inner, rmax]
    return x


def _scores(x: Value, seen: list[Node], depth: int = 0, keep: list[Value] | None = None
            ) -> tuple[Node, float, list[tuple[Value, int]]] | None:
    """(the Q·Kᵀ product, the scale, the masks added to it: (value, rank of the sum)) behind
    the softmax input ``x``; at most two masks (a bias such as ALiBi, then a mask). The
    boolean masks that say which scores are kept (True = attended: ``where(cond, scores,
    low)``) rather than masked out are also added to ``keep``."""
    x = _views(x, seen)
    add = _producer(x, "Add")
    if add is not None and depth < 2:
        for side, other in ((0, 1), (1, 0)):
            probe: list[Node] = []
            held: list[Value] = []
            found = _scores(add.inputs[side], probe, depth + 1, held)
            if found is not None:
                seen += [add, *probe]
                if keep is not None:
                    keep += held
                rank = add.outputs[0].type.rank
                return found[0], found[1], [*found[2], (add.inputs[other], rank)]
    clamp = _producer(x, "Maximum")
    if clamp is not None:  # max(scores, lowest): masked-out scores kept finite (XGLM)
        for side, other in ((0, 1), (1, 0)):
            f = _fill(clamp.inputs[other])
            if f is not None and f <= LOWEST and \
                    clamp.inputs[side].type == clamp.outputs[0].type:
                probe: list[Node] = []
                held: list[Value] = []
                found = _scores(clamp.inputs[side], probe, depth, held)
                if found is not None:
                    seen += [clamp, *probe]
                    if keep is not None:
                        keep += held
                    return found
    sel = _producer(x, "Select")
    if sel is not None and depth < 2:  # masked_fill(cond, low): the scores where cond is False
        cond, low, kept = sel.inputs
        f = splat(low)
        if cond.dtype is DType.bool and f is not None and f <= LOWEST:
            probe = []
            found = _scores(kept, probe, depth + 1, keep)
            if found is not None:
                seen += [sel, *probe]
                return found[0], found[1], [*found[2], (cond, sel.outputs[0].type.rank)]
        # where(cond, scores, low): the scores where cond is True (GPT-Neo's causal bias
        # buffer); cond's negation is the mask, recorded in ``keep`` to be negated
        cond, kept, low = sel.inputs
        f = splat(low)
        if cond.dtype is DType.bool and f is not None and f <= LOWEST:
            probe, held = [], []
            found = _scores(kept, probe, depth + 1, held)
            if found is not None:
                seen += [sel, *probe]
                if keep is not None:
                    keep += [*held, cond]
                return found[0], found[1], [*found[2], (cond, sel.outputs[0].type.rank)]
    found = _scaled(x, seen)
    return None if found is None else (found[0], found[1], [])


def _score_function(x: Value, depth: int = 8) -> str | None:
    """The ops other than the scale and masks (Add, Sub, Mul, Div, Select, Cast, views) on
    the path from the scores' product to the softmax input ``x``: a function of the scores
    the operator has no input for (Gemma 2's soft-capping: ``Tanh``); None when there is
    none or the path does not end at a product."""
    plain = {"Add", "Sub", "Mul", "Div", "Select", "Cast"}
    found: list[str] = []
    while depth > 0 and x.producer is not None:
        p = x.producer
        depth -= 1
        if p.op == "BatchMatMul":
            others = [op for op in dict.fromkeys(found) if op not in plain]
            return ", ".join(others) if others else None
        if p.op not in VIEW_OPS:
            found.append(p.op)
        # follow the operand that leads to a product (the scores), not a mask
        x = next((v for v in p.inputs if _reaches_product(v, depth)), None)
        if x is None:
            return None
    return None


def _reaches_product(v: Value, depth: int) -> bool:
    """Whether a product is ``v`` or behind it within ``depth`` ops."""
    if v.producer is None or depth <= 0:
        return False
    p = v.producer
    return p.op == "BatchMatMul" or any(_reaches_product(u, depth - 1) for u in p.inputs)


def _scaled(x: Value, seen: list[Node]) -> tuple[Node, float] | None:
    """(product, scale) of ``x`` = product · c, c · product, product / c or the product."""
    x = _views(x, seen)
    op = _producer(x, "Mul", "Div")
    scale = 1.0
    if op is not None:
        a, b = op.inputs
        sides = [(a, b)] if op.op == "Div" else [(a, b), (b, a)]
        for s, c in sides:
            f = splat(c)
            if f is not None and f != 0:
                scale = 1.0 / f if op.op == "Div" else f
                seen.append(op)
                x = _views(s, seen)
                break
        else:
            return None
    qk = _producer(x, "BatchMatMul")
    if qk is None or qk.attrs["transpose_a"]:
        return None
    return qk, scale


def _fill(v: Value) -> float | None:
    """The value of a constant whose elements are all equal, or of one broadcast to a shape
    (under dynamic shapes a fill of a symbolic shape stays a BroadcastTo: ``full_like``)."""
    f = splat(v)
    if f is None and v.producer is not None and v.producer.op == "BroadcastTo":
        f = splat(v.producer.inputs[0])
    return f


def _guarded(p: Value, seen: list[Node]) -> tuple[Value, Node | None]:
    """``p`` seen through the guard torch puts after the softmax of masked scores: zeros
    for a row whose every key is masked out, ``Select(no key left, 0, P)`` where no key
    left is ``not any(x != -inf)`` over the row (the operator writes zeros there too), or
    the ONNX exporter's ``Where(IsNaN(P), 0, P)`` (such a row's softmax is NaN; a NaN input
    would give zeros there where the operator gives NaN). Returns (P, the guard's Equal,
    whose input must be the softmax's) or (p, None)."""
    sel = _producer(p, "Select")
    if sel is None or _fill(sel.inputs[1]) != 0.0:
        return p, None
    nan = _producer(sel.inputs[0], "IsNan")
    if nan is not None and nan.inputs[0] is sel.inputs[2]:
        seen += [sel, nan]
        return _views(sel.inputs[2], seen), None
    chain: list[Node] = [sel]
    nots = [_producer(sel.inputs[0], "LogicalNot")]
    red = _producer(nots[0].inputs[0], "ReduceMax") if nots[0] is not None else None
    nots.append(_producer(red.inputs[0], "LogicalNot") if red is not None else None)
    eq = _producer(nots[1].inputs[0], "Equal") if nots[1] is not None else None
    if eq is None or not reduces_last_axis(red) or _fill(eq.inputs[1]) != -np.inf:
        return p, None
    chain += [nots[0], red, nots[1], eq]
    seen += chain
    return _views(sel.inputs[2], seen), eq


def _scale_folded(v: Value, seen: list[Node]) -> tuple[Value, float]:
    """(x, c) when ``v`` is x · c (or x / (1/c)) for a constant c read only here, seen through
    views that keep its type (the scale applied to Q or to Kᵀ: torch's math path puts
    sqrt(scale) on both), else (v, 1)."""
    probe: list[Node] = []
    base = _views(v, probe)
    mul = _producer(base, "Mul") or _producer(base, "Div")
    if mul is None or any(len(n.outputs[0].users) != 1 for n in (*probe, mul)):
        return v, 1.0
    for s, c in ((0, 1), (1, 0)) if mul.op == "Mul" else ((0, 1),):
        f, x = splat(mul.inputs[c]), mul.inputs[s]
        if f is not None and f != 0 and np.isfinite(f) and (
                x.type == v.type or x.type.rank == 4 and x.dtype == v.dtype):
            seen += [*probe, mul]
            return x, (f if mul.op == "Mul" else 1.0 / f)
    return v, 1.0


def _key_side(k: Value, seen: list[Node]) -> tuple[Value, float, int]:
    """(Kᵀ or K, constant factor, head repeat) of the scores' second operand: seen through
    views, products with a constant (torch's math path scales Kᵀ by sqrt(scale)) and a
    broadcast of one K/V head to every query head (multi-query attention repeating Kᵀ)."""
    factor, repeat = 1.0, 1
    while (p := k.producer) is not None:
        if p.op in VIEW_OPS:
            k = p.inputs[0]
        elif p.op in ("Mul", "Div") and (f := _factor(p)) is not None:
            factor *= f[0]
            k = f[1]
        elif p.op == "BroadcastTo" and (r := _head_broadcast(p)) is not None:
            repeat *= r
            k = p.inputs[0]
        else:
            break
        seen.append(p)
    return k, factor, repeat


def _factor(mul: Node) -> tuple[float, Value] | None:
    """(c, x) of ``x * c``, ``c * x`` or ``x / (1/c)`` for a finite nonzero constant c of one
    value (DeBERTa divides Kᵀ by sqrt(d))."""
    for s, c in ((0, 1), (1, 0)) if mul.op == "Mul" else ((0, 1),):
        f = splat(mul.inputs[c])
        if f is not None and f != 0 and np.isfinite(f) and \
                mul.inputs[s].type == mul.outputs[0].type:
            return (f if mul.op == "Mul" else 1.0 / f), mul.inputs[s]
    return None


def _head_broadcast(bt: Node) -> int | None:
    """N when ``bt`` broadcasts a rank-4 [B, 1, X, Y] to [B, N, X, Y]."""
    src, out = bt.inputs[0].type, bt.outputs[0].type
    if src.rank != 4 or out.rank != 4 or src.shape[1] != 1 or not isinstance(out.shape[1], int):
        return None
    if (src.shape[0], *src.shape[2:]) != (out.shape[0], *out.shape[2:]):
        return None
    return out.shape[1]


def _match(pv: Node) -> _Match | None:
    """The attention pattern ending at the product ``pv`` (P·V), or None when the product is
    not one (its first operand is no softmax). Raises Refused, with the reason, for a
    candidate (a softmax before ·V) the operator cannot take."""
    inside: list[Node] = [pv]
    p = _views(pv.inputs[0], inside)
    drop = _producer(p, "Opaque", "Mul")
    if drop is not None:
        label = str(drop.attrs.get("label", "")) + str(drop.attrs.get("spec", ""))
        probe: list[Node] = []
        if any(softmax_input(_guarded(_views(v, probe), probe)[0], probe) is not None
               for v in drop.inputs):
            if drop.op == "Opaque" and "dropout" not in label.lower():
                raise Refused(f"the probabilities pass through {drop.name} ({label[:60]}, "
                              "run through another framework) before ·V")
            if drop.op == "Opaque":
                raise Refused("dropout between the softmax and ·V (training): torch's "
                              "random stream runs it; the operator's keep_prob would draw "
                              "other numbers")
            raise Refused(f"the probabilities are multiplied ({drop.name}) before ·V "
                          "(dropout, a head mask): the operator has no such input")
    p, guard = _guarded(p, inside)
    start = len(inside)
    x = softmax_input(p, inside)
    if x is None:
        return None
    rows = (next(n for n in inside[start:] if n.op == "ReduceMax"),
            next(n for n in inside[start:] if n.op == "ReduceSum"))
    if pv.attrs["transpose_a"] or pv.attrs["transpose_b"]:
        raise Refused(f"the probabilities' product {pv.name} transposes an operand")
    if guard is not None and guard.inputs[0] is not x:
        raise Refused("the masked-row guard tests other scores than the softmax's")
    keep: list[Value] = []
    found = _scores(x, inside, keep=keep)
    if found is None:
        fn = _score_function(x)
        if fn is not None:
            raise Refused(f"the scores pass through {fn} before the softmax (a function of "
                          "the scores, such as soft-capping cap · tanh(scores / cap)): the "
                          "operator computes softmax(mask(scale · (pse + Q·Kᵀ))) and takes no "
                          "function of the scores")
        raise Refused("the softmax's input is not Q·Kᵀ, scaled by a constant, plus at most "
                      "two masks")
    qk, scale, masks = found
    inside.append(qk)
    q, k = qk.inputs
    q, f = _scale_folded(q, inside)  # the scale folded into Q
    scale *= f
    k_bsnd, k_sbh, heads, kt = False, False, 1, None
    if not qk.attrs["transpose_b"]:  # Kᵀ by a Transpose of K's last two axes (views after)
        k, f, heads = _key_side(k, inside)  # (the scale on Kᵀ, its heads repeated)
        scale *= f
        t = _producer(k, "Transpose")
        rank = t.inputs[0].type.rank if t is not None else 0
        perm = list(t.attrs["perm"]) if t is not None else []
        if rank >= 4 and perm == _split_perm(rank)[:-2] + [rank - 1, rank - 3]:
            # [.., S, N, D] -> [.., N, D, S]: head split and Kᵀ at once (leading batch axes:
            # LongT5's batch × blocks, read as one)
            k_bsnd = True
        elif perm == [1, 2, 0] and heads == 1:  # [S, B·N, D] -> [B·N, D, S] (sequence first)
            k_sbh = True
        elif perm != [*range(rank - 2), rank - 1, rank - 2]:
            raise Refused(f"the scores' product {qk.name} does not read Kᵀ (no transpose of "
                          "K's last two axes)")
        k = t.inputs[0]  # what it no longer needs dies with the rewrite
        kt = t
    else:
        k, f = _scale_folded(k, inside)
        scale *= f
    return _Match(pv, qk, inside, q, k, pv.inputs[1], scale=scale, masks=masks,
                  k_bsnd=k_bsnd, k_sbh=k_sbh, k_heads=heads, kt=kt, rows=rows, keep=keep)


def _layout(*operands: _Operand) -> str:
    """The layout the operator reads Q, K, V and writes its output in: SBH when all four
    offer it (sequence-first head splits and merges: nn.MultiheadAttention), else the best
    of BNSD, BSND and BSH that all allow."""
    if all(x.offers("SBH") for x in operands):
        return "SBH"
    return LAYOUTS[min(x.best for x in operands)]


def _same(a, b) -> bool:
    return symbolic.canon(a) == symbolic.canon(b)


def _heads(v: Value, inside: frozenset[int] = frozenset(), kv: bool = False,
           batch=None) -> tuple[_Operand, int]:
    """Q, K or V (an operand of a product, [B·N, S, D] or [B, N, S, D]) as its [B, N, S, D]
    value and the layouts it can be read in; the second item is how many times each head
    is repeated (grouped-query K/V: N1/N2). ``inside``: ids of the pattern's nodes. With
    ``kv``, heads repeated in BSND before the head split (``_repeated``) are read with their
    N2 heads too (only in the layouts ``_grouped`` offers). A constant operand (a learned
    query, folded) is read in every layout (``_constant``; ``batch``: B, when it is
    [B·N, S, D]); a sequence-first head split (``_seq_first``) in BNSD and SBH."""
    seen: list[Node] = []
    base = _views(v, seen)
    repeat = 1
    bt = _producer(base, "BroadcastTo")
    if bt is not None and bt.outputs[0].type.rank == 5:  # [B, N2, r, S, D] of [B, N2, S, D]
        b, n2, r, s, d = bt.outputs[0].type.shape
        src = _views(bt.inputs[0], seen)
        if tuple(src.type.shape) == (b, n2, s, d) and isinstance(r, int):
            base, repeat = src, r
            seen.append(bt)
    elif bt is not None and bt.outputs[0].type.rank == 4:  # [B, N, S, D] of [B, 1, S, D]
        b, r, s, d = bt.outputs[0].type.shape
        src = _views(bt.inputs[0], seen)
        if tuple(src.type.shape) == (b, 1, s, d) and isinstance(r, int):
            base, repeat = src, r
            seen.append(bt)
    if repeat == 1 and const_array(base) is not None:
        return _constant(v, base, batch), 1
    if repeat == 1 and (first := _seq_first(v, base)) is not None:
        return first, 1
    t = _producer(base, "Transpose")
    if repeat == 1 and base.type.rank > 4 and t is not None and \
            list(t.attrs["perm"]) == _split_perm(base.type.rank) and \
            (batched := _batched(t.inputs[0], base)) is not None and \
            _views_of(v, batched.shape):
        return batched, 1
    if base.type.rank != 4:
        if repeat == 1 and (merged := _merged(v)) is not None:
            return merged, 1
        raise Refused(f"operand {v.name} of shape {list(v.type.shape)} is not seen as "
                      "[B, N, S, D] (batch and heads cannot be told apart)")
    b, n, s, d = base.type.shape
    heads = symbolic.mul(n, repeat)
    shape = tuple(v.type.shape)
    if not (len(shape) == 4 and _same(shape[1], heads) and (shape[0], *shape[2:]) == (b, s, d)
            or len(shape) == 3 and _same(shape[0], symbolic.mul(b, heads))
            and shape[1:] == (s, d)):
        raise Refused(f"operand {v.name} of shape {list(shape)} is not a view of "
                      f"{base.name} {list(base.type.shape)} with its heads repeated")
    op = _Operand((b, n, s, d), {"BNSD": base})
    t = _producer(base, "Transpose")
    if t is not None and list(t.attrs["perm"]) == HEAD_SPLIT:
        if kv and repeat == 1 and (rep := _repeated(t.inputs[0])) is not None:
            return _grouped(rep[0], rep[1], None), rep[2]
        _split_reads(op, t.inputs[0])
    else:
        build = bsnd_builder(base, {id(x) for x in seen} | inside)
        if build is not None:
            src = build.split_source() if kv and repeat == 1 and build.per_head() else None
            if src is not None and (rep := _repeated(src)) is not None:
                return _grouped(rep[0], rep[1], build), rep[2]
            op.builds["BSND"] = build
    return op, repeat


def _views_of(v: Value, shape4: tuple) -> bool:
    """Whether the product operand ``v`` is a view of [B, N, S, D] values ``shape4`` that
    keeps its last two axes: B·N matrices of [S, D], in the same row-major order."""
    b, n, s, d = shape4
    shape = tuple(v.type.shape)
    return len(shape) >= 3 and _same(shape[-2], s) and _same(shape[-1], d) and \
        _same(symbolic.numel(shape[:-2]), symbolic.mul(b, n))


def _merged(v: Value) -> _Operand | None:
    """An operand [.., S, D] whose batch axes are not seen as one batch and one head axis
    (merged [B·N, S, D] with no head split behind it, or more than two batch axes:
    windows × heads, Hiera's masked units, LongT5's blocks): read as [X, 1, S, D], X the
    product of its batch axes, each of them one head. Attention is computed for each index
    of the batch axes alone, so any grouping of them into B and N gives the same result,
    provided Q, K and V are all read so (``_rewrite`` checks it); N = 1 is within every
    head limit."""
    shape = tuple(v.type.shape)
    if len(shape) < 3 or not all(isinstance(x, int) for x in shape):
        return None
    x = int(np.prod(shape[:-2]))
    graph = v.graph
    view = graph.add_node("Reshape", [v], {"shape": [x, 1, *shape[-2:]]},
                          name=graph.fresh_name(f"{v.name}/bnsd"),
                          origin=v.producer.origin if v.producer is not None else ())
    return _Operand((x, 1, *shape[-2:]), {"BNSD": view.outputs[0]}, one_head=True,
                    merged=True)


def _merged_products(m: _Match, q: _Operand, k: _Operand, v: _Operand) -> str | None:
    """Why Q, K and V read as [X, 1, S, D] (``_merged``) are not what the two products
    pair, or None: all three so read, with one X, and each product operand of X matrices
    of the operands' sequence and head sizes (views that keep the last two axes; the
    batch axes flattened in one order)."""
    if not (q.merged and k.merged and v.merged):
        return "Q, K and V are not all read with their batch axes as one"
    x, _, s1, d = q.shape
    _, _, s2, _ = k.shape
    kt = (s2, d) if m.qk.attrs["transpose_b"] else (d, s2)
    for operand, want in ((m.qk.inputs[0], (s1, d)), (m.qk.inputs[1], kt),
                          (m.pv.inputs[1], (s2, v.shape[3]))):
        shape = tuple(operand.type.shape)
        if len(shape) < 3 or shape[-2:] != want or \
                not all(isinstance(y, int) for y in shape) or int(np.prod(shape[:-2])) != x:
            return (f"product operand {operand.name} {list(shape)} is not {x} matrices of "
                    f"{list(want)}")
    if k.shape[0] != x or v.shape[0] != x:
        return f"Q, K and V differ in their batch axes ({x}, {k.shape[0]}, {v.shape[0]})"
    return None


def _constant(v: Value, base: Value, batch) -> _Operand:
    """A constant operand: a learned query (an attention pooling head's probe, projected and
    scaled at compile time) is [B, N, S, D], or [B·N, S, D] with B the other operands' batch
    (``batch``). Any layout of a constant is another constant: every layout is offered,
    made when it is picked."""
    arr = const_array(base)
    shape = tuple(base.type.shape if base.type.rank == 4 else v.type.shape)
    if len(shape) == 3 and isinstance(batch, int) and batch > 0 and shape[0] % batch == 0:
        shape = (batch, shape[0] // batch, *shape[1:])
    if len(shape) != 4:
        raise Refused(f"constant operand {v.name} of shape {list(v.type.shape)} is not seen "
                      "as [B, N, S, D] (its batch is not known)")
    arr = np.asarray(arr).reshape(shape)
    op = _Operand(shape)
    graph = base.graph
    origin = base.producer.origin

    def read(layout: str) -> Callable[[list[str]], Value]:
        def make(notes: list[str]) -> Value:
            notes.append(f"constant {v.name} laid out in {layout} at compile time")
            return graph.const(np.ascontiguousarray(from_bnsd(arr, layout)), v.dtype,
                               name=graph.fresh_name(f"{v.name}/{layout.lower()}"),
                               origin=origin)
        return make

    op.lazy = {layout: read(layout) for layout in (*LAYOUTS, "SBH")}
    return op


def _seq_first(v: Value | None, base: Value) -> _Operand | None:
    """nn.MultiheadAttention's head split, sequence first: ``base`` [B·N, S, D] is a
    Transpose(1, 0, 2) of [S, B·N, D] (the operand ``v`` is ``base`` or a [B, N, S, D] view
    of it), or with ``v`` None, ``base`` is that [S, B·N, D] value itself (an ONNX export
    moves it straight to Kᵀ). It is a view of the [S, B, H] projection (H = N·D): read in SBH
    as that projection (a view), in BNSD as the head split viewed. B and N come from the
    view farthest back of the form [.., S, B, H] or [.., S, B, N, D] (leading axes of 1):
    the projection's own batch and heads. None when ``base`` is no such value."""
    if v is None:
        x, t = base, None
        if x.type.rank != 3:
            return None
        s, bn, d = x.type.shape
    else:
        t = _producer(base, "Transpose")
        if t is None or list(t.attrs["perm"]) != [1, 0, 2] or base.type.rank != 3:
            return None
        x = t.inputs[0]
        bn, s, d = base.type.shape
    if not isinstance(d, int):
        return None
    chain = [x]
    while (p := chain[-1].producer) is not None and p.op in VIEW_OPS:
        chain.append(p.inputs[0])
    found = next(((u, dims) for u in reversed(chain)
                  if (dims := _sbh_dims(list(u.type.shape), bn, s, d)) is not None), None)
    if found is None:
        return None
    u, (b, n) = found
    origin = t.origin if t is not None else x.producer.origin if x.producer else ()
    op = _Operand((b, n, s, d))

    def view(y: Value, want: list, perm: list | None = None) -> Callable[[list[str]], Value]:
        return _lazy_view(y, want, "heads", origin, perm)

    if v is not None and tuple(v.type.shape) == (b, n, s, d):
        op.reads["BNSD"] = v
    elif v is not None:
        op.lazy["BNSD"] = view(base, [b, n, s, d])
    else:  # (the head split the graph did not have: a copy, made only if BNSD is picked)
        op.lazy["BNSD"] = view(x, [b, n, s, d], [1, 0, 2])
    src = view(u, [s, b, n * d])

    def sbh(notes: list[str]) -> Value:
        notes.append(f"{u.name}'s heads read sequence first (SBH), not transposed")
        return src(notes)
    op.lazy["SBH"] = sbh
    return op


def _sbh_dims(shape: list, bn, s, d: int) -> tuple | None:
    """(B, N) when ``shape`` is [S, B, N·D] or [S, B, N, D] (after leading axes of 1) with
    B·N = ``bn``, else None."""
    while True:
        dims = shape if len(shape) == 3 else [*shape[:2], shape[2] * d] if len(shape) == 4 \
            and shape[3] == d and isinstance(shape[2], int) else None
        if dims is not None and _same(dims[0], s) and isinstance(dims[2], int) and \
                dims[2] % d == 0 and _same(symbolic.mul(dims[1], dims[2] // d), bn):
            return dims[1], dims[2] // d
        if len(shape) <= 3 or shape[0] != 1:
            return None
        shape = shape[1:]


def _repeated(x: Value) -> tuple[Value, int, int] | None:
    """(y, N2, r) when ``x`` ([B, S, N, D], a head split's source) is K/V heads repeated in
    BSND for grouped-query attention: ``y`` [B, S, N2, 1, D] broadcast to [B, S, N2, r, D]
    and viewed as [B, S, N2·r, D] (each K/V head shared by r consecutive query heads), or
    ``y`` [B, S, 1, D] broadcast to [B, S, N, D] (multi-query: N2 = 1); else None."""
    seen: list[Node] = []
    r = _producer(x, "Reshape")
    bt = _producer(r.inputs[0], "BroadcastTo") if r is not None else None
    if bt is None:
        bt = _producer(x, "BroadcastTo")
    if bt is None or x.type.rank != 4:
        return None
    b, s, n, d = x.type.shape
    y = _views(bt.inputs[0], seen)
    out = tuple(bt.outputs[0].type.shape)
    if bt.outputs[0] is x:  # [B, S, 1, D] -> [B, S, N, D]
        if tuple(y.type.shape) == (b, s, 1, d) and isinstance(n, int):
            return y, 1, n
        return None
    if len(out) != 5 or tuple(y.type.shape) != (*out[:3], 1, out[4]):
        return None
    b5, s5, n2, rep, d5 = out
    if (b5, s5, d5) != (b, s, d) or not isinstance(rep, int) or not isinstance(n2, int) or \
            not _same(n, n2 * rep):
        return None
    return y, n2, rep


def _grouped(y: Value, n2: int, build: Rebuild | None) -> _Operand:
    """K or V read with its N2 heads, before their repetition (``_repeated``'s ``y``): views
    of ``y`` in BSND and BSH (in BNSD it would be a copy, as the repetition is), or — when
    per-head work such as rotary embedding was done on the repeated heads — that work done
    on ``y``'s N2 heads instead (the same per head: the tables do not vary over heads), in
    BSND."""
    b, s, d = y.type.shape[0], y.type.shape[1], y.type.shape[-1]
    op = _Operand((b, n2, s, d))
    graph = y.graph
    origin = y.producer.origin if y.producer is not None else ()
    made: dict[str, Value] = {}

    def view(shape: list) -> Value:
        key = str(shape)
        if key not in made:
            made[key] = graph.add_node("Reshape", [y], {"shape": shape}, origin=origin,
                                       name=graph.fresh_name(f"{y.name}/kv")).outputs[0]
        return made[key]

    def bsnd(notes: list[str]) -> Value:
        notes.append(f"{y.name}'s {n2} K/V heads read before their repetition")
        return view([b, s, n2, d])

    if build is None:
        op.lazy["BSND"] = bsnd

        def bsh(notes: list[str]) -> Value:
            notes.append(f"{y.name}'s {n2} K/V heads read before their repetition")
            return view([b, s, symbolic.mul(n2, d)])
        op.lazy["BSH"] = bsh
        return op

    def built(notes: list[str]) -> Value:
        src = bsnd(notes)
        value = build(op.sources, on=src)
        op.built = Built(build, value, src)
        notes.append("its per-head work done on the K/V heads before their repetition")
        return value

    op.lazy["BSND"] = built
    return op


def _split_reads(op: _Operand, bsnd: Value) -> None:
    """Add the reads of a head split: its [B, S, N, D] value and the [B, S, H] it views."""
    b, n, s, d = op.shape
    op.reads["BSND"] = bsnd
    r = _producer(bsnd, "Reshape")
    src = r.inputs[0] if r is not None else None
    if src is not None and src.type.rank == 3 and src.type.shape[:2] == (b, s) and \
            _same(src.type.shape[2], symbolic.mul(n, d)):
        op.reads["BSH"] = src


def _bsnd(v: Value) -> tuple[_Operand, int]:
    """K given as its [B, S, N, D] value (or [.., S, N, D]: ``_batched``)."""
    if v.type.rank > 4:
        return _batched(v), 1
    b, s, n, d = v.type.shape
    op = _Operand((b, n, s, d))
    _split_reads(op, v)
    return op, 1


def _batched(src: Value, split: Value | None = None) -> _Operand:
    """An operand whose head split has more than one batch axis in front: ``src`` is
    [.., S, N, D] (LongT5's local attention: batch × blocks, then the block's keys and the
    heads) and ``split`` its head split [.., N, S, D] (None: K, whose head split and Kᵀ were
    one Transpose). The batch axes are read as one, B their product: a view either way
    (row-major order keeps each (batch, block) pair's matrices together), so the operand
    is read in BSND or BSH in place, or in BNSD as a view of the split. Q, K, V and the
    output pair their matrices in the one order of B·N, as the products did (``_rewrite``
    checks the B of each)."""
    *batch, s, n, d = src.type.shape
    b = symbolic.numel(batch)
    op = _Operand((b, n, s, d), batched=True)

    def view(x: Value, shape: list) -> Callable[[list[str]], Value]:
        return _lazy_view(x, shape, "batch", x.producer.origin if x.producer else ())

    if split is not None:
        op.lazy["BNSD"] = view(split, [b, n, s, d])
    op.lazy["BSND"] = view(src, [b, s, n, d])
    op.lazy["BSH"] = view(src, [b, s, symbolic.mul(n, d)])
    return op


def _lazy_view(y: Value, shape: list, suffix: str, origin, perm: list | None = None
               ) -> Callable[[list[str]], Value]:
    """An operand layout made only if it is picked: ``y`` (transposed by ``perm`` first,
    if given) viewed as ``shape``, new nodes named ``<y>/<suffix>``."""
    def make(notes: list[str]) -> Value:
        graph, y2 = y.graph, y
        if perm is not None:
            y2 = graph.add_node("Transpose", [y], {"perm": perm}, origin=origin,
                                name=graph.fresh_name(f"{y.name}/{suffix}")).outputs[0]
        if tuple(y2.type.shape) == tuple(shape):
            return y2
        return graph.add_node("Reshape", [y2], {"shape": shape}, origin=origin,
                              name=graph.fresh_name(f"{y.name}/{suffix}")).outputs[0]
    return make


def _sbh(v: Value) -> tuple[_Operand, int]:
    """K given as its sequence-first [S, B·N, D] value (``_seq_first``)."""
    op = _seq_first(None, v)
    if op is None:
        raise Refused(f"K {v.name} of shape {list(v.type.shape)} is not seen as a "
                      "sequence-first [S, B, N·D] projection")
    return op, 1


def _output(pv: Node, b, n, s, d) -> _Operand:
    """The product ``pv``'s result as [B, N, S1, D] and, when its only use is a head merge,
    the value each layout would replace."""
    out = pv.outputs[0]
    op = _Operand((b, n, s, d), {"BNSD": out})
    users = out.users
    # sequence first (nn.MultiheadAttention): [B·N, S1, D] moved by Transpose(1, 0, 2), or
    # [B, N, S1, D] by Transpose(2, 0, 1, 3), is [S1, B, H] viewed: what SBH writes
    first = {3: ([1, 0, 2], (symbolic.mul(b, n), s, d)), 4: ([2, 0, 1, 3], (b, n, s, d))}
    perm, dims = first.get(out.type.rank, (None, None))
    if len(users) == 1 and users[0].op == "Transpose" and list(users[0].attrs["perm"]) == perm \
            and all(_same(x, y) for x, y in zip(out.type.shape, dims, strict=True)) \
            and not pv.graph.is_output(out):
        op.reads["SBH"] = users[0].outputs[0]
    # the head merge: of [B, N, S1, D], or of [.., N, S1, D] with more than one batch axis
    # in front (LongT5's batch × blocks: B their product, ``_batched``)
    while len(users) == 1 and users[0].op in RESHAPE_OPS and users[0].outputs[0].type.rank >= 4:
        out = users[0].outputs[0]
        users = out.users
    shape = tuple(out.type.shape)
    if len(shape) < 4 or not _same(symbolic.numel(shape[:-3]), b) or \
            any(not _same(x, y) for x, y in zip(shape[-3:], (n, s, d), strict=True)):
        return op
    if len(users) == 1 and users[0].op == "Transpose" and \
            list(users[0].attrs["perm"]) == _split_perm(len(shape)) and \
            not pv.graph.is_output(out):
        op.reads["BSND"] = op.reads["BSH"] = users[0].outputs[0]
    return op


def _masks(graph: Graph, m: _Match, node: Node, shape4: tuple
           ) -> tuple[str, list[Value], int | None]:
    """The masks as the operator takes them: (the op's mask attr, the inputs in order, the
    causal mode's window (0: none) when it replaces a boolean mask, else None)."""
    got: dict[str, Value | int] = {}
    for mv, rank in _united(graph, m, node, _negated(graph, m, node)):
        kind, value = _mask(graph, m, node, shape4, mv, rank)
        if kind in got or {kind, *got} >= {"causal", "atten_mask"}:
            what = "pse" if kind == "pse" else "atten_mask"  # causal is its own atten_mask
            raise Refused(f"two masks map to the operator's {what} ({mv.name} and "
                          "another): it takes one")
        got[kind] = value
    kinds = [k for k in ("pse", "atten_mask") if k in got]
    return "_and_".join(kinds) or "none", [got[k] for k in kinds], got.get("causal")


def _negated(graph: Graph, m: _Match, node: Node) -> list[tuple[Value, int]]:
    """The masks (after ``_summed_biases``) with each condition that says which scores are
    kept (``where(cond, scores, low)``: True = attended) negated into one that says which are
    masked out, as the operator's atten_mask does: ``where(c, S, low)`` is
    ``masked_fill(S, not c, low)``, the same values."""
    out = []
    for mv, rank in _summed_biases(graph, m, node):
        if any(mv is c for c in m.keep):
            arr = const_array(mv)
            neg = graph.const(np.logical_not(arr.astype(bool)), DType.bool,
                              origin=node.origin) if arr is not None else \
                graph.add_node("LogicalNot", [mv], name=graph.fresh_name(f"{node.name}/kept"),
                               origin=node.origin).outputs[0]
            m.notes.append(f"mask {mv.name} says which scores are kept (where(cond, scores, "
                           "low)): its negation is the atten_mask")
            mv = neg
        out.append((mv, rank))
    return out


def _united(graph: Graph, m: _Match, node: Node, masks: list[tuple[Value, int]]
            ) -> list[tuple[Value, int]]:
    """Two masks of only 0 and minus infinity (or masked_fill conditions) on scores of one
    rank as one atten_mask, their union (masked out where either masks out): a score that
    either mask sends to minus infinity has weight 0 either way (GPT-Neo's causal bias
    buffer, then the model's 0/minimum attention mask). Constants are united at compile time;
    otherwise a LogicalOr (a vector op on the masks, not the scores)."""
    found = [(i, mv, rank, *_boolean(mv)) for i, (mv, rank) in enumerate(masks)]
    bools = [x for x in found if x[3] is not None or x[4] is not None]
    if len(bools) != 2 or bools[0][2] != bools[1][2]:
        return masks
    (i, a, rank, ca, aa), (j, b, _, cb, ab) = bools
    try:
        if aa is not None and ab is not None:
            union = graph.const(np.logical_or(aa, ab), DType.bool, origin=node.origin)
        else:
            x = ca if ca is not None else graph.const(aa, DType.bool, origin=node.origin)
            y = cb if cb is not None else graph.const(ab, DType.bool, origin=node.origin)
            union = graph.add_node("LogicalOr", [x, y], origin=node.origin,
                                   name=graph.fresh_name(f"{node.name}/masks")).outputs[0]
    except (GraphKernelError, ValueError):  # shapes that do not broadcast together
        return masks
    m.notes.append(f"masks {a.name} and {b.name} united into one atten_mask")
    return [x for k, x in enumerate(masks) if k not in (i, j)] + [(union, rank)]


def _summed_biases(graph: Graph, m: _Match, node: Node) -> list[tuple[Value, int]]:
    """The masks, two float biases added to the scores one after the other (neither only 0
    and minus infinity: both would be the operator's pse) taken as their sum, one pse:
    ``(S + a) + b`` is ``S + (a + b)`` up to the order of float summation (Funnel's
    positional and token-type scores, a T5 position bias and a padding mask)."""
    biases = [(mv, rank) for mv, rank in m.masks
              if mv.dtype is not DType.bool and all(x is None for x in _boolean(mv))]
    if len(biases) != 2:
        return m.masks
    (a, ra), (b, rb) = biases
    if ra != rb or a.dtype != b.dtype or a.type.rank != b.type.rank:
        return m.masks
    try:
        total = graph.add_node("Add", [a, b], name=graph.fresh_name(f"{node.name}/pse_sum"),
                               origin=node.origin).outputs[0]
    except GraphKernelError:  # shapes that do not broadcast together
        return m.masks
    m.notes.append(f"biases {a.name} and {b.name} summed into one pse")
    return [x for x in m.masks if x[0] is not a and x[0] is not b] + [(total, ra)]


def _mask(graph: Graph, m: _Match, node: Node, shape4: tuple, mv: Value, rank: int
          ) -> tuple[str, Value | int]:
    """One mask as the operator takes it: (kind, value), new nodes added to ``graph``."""
    b, n1, s1, s2 = shape4
    origin = node.origin
    if rank == 3 and mv.type.rank == 3 and mv.type.shape[0] != 1:  # over the merged B·N
        if not _same(mv.type.shape[0], symbolic.mul(b, n1)):
            raise Refused(f"mask {mv.name} {list(mv.type.shape)} varies over the merged batch "
                          "and head axis, not as [B·N, S1, S2]")
        split = [b, n1, *mv.type.shape[1:]]
        arr = const_array(mv)
        mv = graph.const(arr.reshape(split), origin=origin) if arr is not None else \
            graph.add_node("Reshape", [mv], {"shape": split}, origin=origin,
                           name=graph.fresh_name(f"{node.name}/mask_view")).outputs[0]
    shape = tuple(mv.type.shape)
    if rank == mv.type.rank and rank not in (3, 4) and all(isinstance(x, int) for x in shape) \
            and all(isinstance(x, int) for x in shape4) \
            and int(np.prod(shape)) == int(np.prod(shape4)):
        # added to the scores in another view ([X, h, w, h', w']: ViTDet's decomposed
        # relative positions): as many values as the scores, so the sum's own shape (no
        # broadcast), and view(S) + M is view(S + M viewed as the scores)
        arr = const_array(mv)
        mv = graph.const(arr.reshape(shape4), origin=origin) if arr is not None else \
            graph.add_node("Reshape", [mv], {"shape": list(shape4)}, origin=origin,
                           name=graph.fresh_name(f"{node.name}/mask_view")).outputs[0]
        m.notes.append(f"mask of shape {list(shape)} viewed as the scores {list(shape4)}")
    lead = tuple(mv.type.shape[:-3])
    if rank == mv.type.rank and len(lead) > 1 and _batch_scores(m, mv, shape4) and (
            all(_same(x, 1) for x in lead) or _same(symbolic.numel(lead), b)):
        # added to scores [.., N, S1, S2] with more than one batch axis (``_batched``: batch ×
        # blocks), the same for all of them or one for each (a mask broadcasts: an axis as
        # long as the scores' or 1, so a product of B is every axis): read as one too
        view = [1 if all(_same(x, 1) for x in lead) else b, *mv.type.shape[-3:]]
        arr = const_array(mv)
        mv = graph.const(arr.reshape(view), origin=origin) if arr is not None else \
            graph.add_node("Reshape", [mv], {"shape": view}, origin=origin,
                           name=graph.fresh_name(f"{node.name}/mask_view")).outputs[0]
        m.notes.append(f"mask of shape {list(shape)} read with its batch axes as one: "
                       f"{view}")
    cond, arr = _boolean(mv)
    window = causal_band(cond, s1, s2) if cond is not None else None
    if window is not None:
        band = f" with a window of {window} keys" if window else ""
        m.notes.append(f"mask {mv.name} is causal{band} (built from positions): the "
                       "operator's causal mode, no mask input")
        return "causal", window
    if cond is not None or arr is not None:
        shape = tuple(cond.type.shape if cond is not None else arr.shape)
        rank = len(shape)
        full = (1,) * (4 - rank) + shape if rank < 4 else shape
        documented = mask_shapes("atten_mask", b, n1, s1, s2)
        want = shape if shape in documented else full if full in documented else None
        if want is None:
            raise Refused(f"mask {mv.name} of shape {list(shape)}: the operator's atten_mask "
                          f"takes {' or '.join(str(list(x)) for x in documented)}")
        if arr is not None:
            return "atten_mask", graph.const(arr.reshape(want), DType.bool, origin=origin)
        if want != shape:
            cond = graph.add_node("Reshape", [cond], {"shape": list(want)},
                                  name=graph.fresh_name(f"{node.name}/mask"),
                                  origin=origin).outputs[0]
        return "atten_mask", cond
    shape = tuple(mv.type.shape)
    full = (1,) * (4 - len(shape)) + shape
    want = _pse_shape(mv, full, (b, n1, s1, s2))
    if mv.dtype != m.q.dtype:
        raise Refused(f"mask {mv.name} is {mv.dtype.value}, the operands "
                      f"{m.q.dtype.value}")
    if want != full:
        m.notes.append(f"pse {mv.name} {list(shape)} broadcast to {list(want)} (a shape the "
                       "operator takes)")
    arr = const_array(mv)
    if arr is not None:  # pse enters before the scale: pse = mask / scale
        arr = arr.astype(np.float64).reshape(full)
        arr = np.broadcast_to(arr[:1] if want[0] == 1 else arr, want) / m.scale
        return "pse", graph.const(np.ascontiguousarray(arr), mv.dtype, origin=origin)
    pse = mv
    if m.scale != 1.0:
        c = graph.const(1.0 / m.scale, mv.dtype, origin=origin)
        pse = graph.add_node("Mul", [mv, c], name=graph.fresh_name(f"{node.name}/pse"),
                             origin=origin).outputs[0]
    if full != shape:
        pse = graph.add_node("Reshape", [pse], {"shape": list(full)},
                             name=graph.fresh_name(f"{node.name}/pse_view"),
                             origin=origin).outputs[0]
    if want != full:
        pse = graph.add_node("BroadcastTo", [pse], {"shape": list(want)},
                             name=graph.fresh_name(f"{node.name}/pse_rows"),
                             origin=origin).outputs[0]
    return "pse", pse


def _batch_scores(m: _Match, mv: Value, shape4: tuple) -> bool:
    """Whether the mask ``mv`` is added (or its condition applied) in the pattern to scores
    seen as [.., N, S1, S2], the batch axes in front B in all (not another view of them,
    such as ViTDet's [X, h, w, h', w'])."""
    b, n1, s1, s2 = shape4
    inside = {id(x) for x in m.nodes}
    for u in mv.users:
        shape = tuple(u.outputs[0].type.shape) if id(u) in inside else ()
        if len(shape) > 4 and _same(symbolic.numel(shape[:-3]), b) and \
                all(_same(x, y) for x, y in zip(shape[-3:], (n1, s1, s2), strict=True)):
            return True
    return False


def _pse_shape(mv: Value, full: tuple, shape4: tuple) -> tuple:
    """The documented pse shape a bias of 4-d shape ``full`` is given as: itself when
    documented, else, for a constant, the smallest documented shape it broadcasts to —
    [1, N, S1, S2] when its values do not vary over the batch, else [B, N, S1, S2]. A
    computed bias of one row per head ([.., N, 1, S2]) is broadcast to [B, N, 1, S2], one of
    every score shared by the heads ([.., 1, S1, S2]) to [B, N, S1, S2] (the values the
    unfused attention's scores would be); one in another shape is refused (growing it would
    be a launch writing B·N·S1·S2 values for a smaller mask)."""
    b, n1, s1, s2 = shape4
    documented = mask_shapes("pse", b, n1, s1, s2)
    if full in documented:
        return full
    arr = const_array(mv)
    fits = all(_same(x, 1) or _same(x, y) for x, y in zip(full, shape4, strict=True))
    if arr is None and fits and _same(full[2], 1):
        # one row of biases per head (ALiBi sliced by a symbolic length): broadcast to
        # [B, N, 1, S2], S1 times fewer values than the scores
        return (b, n1, 1, s2)
    if arr is None and fits and _same(full[1], 1) and _same(full[2], s1) and \
            _same(full[3], s2):
        # a score mask shared by the heads ([B, 1, S1, S2], [1, 1, S1, S2]: a decoder's 4-d
        # causal mask fed from an earlier graph): broadcast to [B, N, S1, S2], as many
        # values as the scores the attention would otherwise write and read back itself
        return (b, n1, s1, s2)
    if arr is None or not fits or not all(isinstance(x, int) for x in shape4[1:]):
        raise Refused(f"mask {mv.name} of shape {list(mv.type.shape)}: the operator's pse "
                      f"takes {' or '.join(str(list(x)) for x in documented)} (a constant "
                      "bias that broadcasts to them is grown to one; this one "
                      + ("is computed)" if arr is None else "does not broadcast)"))
    same_batches = full[0] == 1 or bool(np.all(arr.reshape(full) == arr.reshape(full)[:1]))
    return (1, n1, s1, s2) if same_batches else (b, n1, s1, s2)


def _boolean(mv: Value) -> tuple[Value | None, np.ndarray | None]:
    """A mask whose values are only 0 and minus infinity: (the condition of a Select that
    makes it, None) or (None, its constant as bools, True = masked out); else (None, None).
    A boolean mask (a masked_fill's condition) is its own condition."""
    arr = const_array(mv)
    if mv.dtype is DType.bool:
        return (mv, None) if arr is None else (None, arr.astype(bool))
    if arr is not None:
        a = arr.astype(np.float64)
        if np.all((a == 0) | (a <= LOWEST)) and np.any(a != 0):
            return None, a != 0
        return None, None
    sel = _producer(_cast(mv, []), "Select")  # (cast to the scores' type, maybe)
    if sel is None:
        return None, None
    cond, yes, no = sel.inputs
    fy, fn = _fill(yes), _fill(no)
    if fy is None or fn is None or cond.dtype is not DType.bool:
        return None, None
    if fy <= LOWEST and fn == 0:
        return cond, None
    if fy == 0 and fn <= LOWEST:
        graph = mv.graph
        neg = graph.add_node("LogicalNot", [cond], name=graph.fresh_name(f"{sel.name}/not"),
                             origin=sel.origin).outputs[0]
        return neg, None
    return None, None


def _used_outside(m: _Match, allowed: tuple[Node, ...] = ()) -> Node | None:
    """A node of the pattern whose result is read outside it (or is a graph output), other
    than those ``allowed`` read by nodes outside it."""
    ids = {id(n) for n in m.nodes}
    outputs = {id(v) for v in m.pv.graph.outputs}
    for n in m.nodes:
        if n is m.pv or any(n is a for a in allowed) and not any(
                id(v) in outputs for v in n.outputs):
            continue
        for v in n.outputs:
            if id(v) in outputs or any(id(u) not in ids for u in v.users):
                return n
    return None


def _unscaled(graph: Graph, r: Value, origin: tuple) -> tuple[Value, float]:
    """Q as read in its layout with a constant factor taken out of it: views of x·c (Whisper
    scales Q right after its projection, before the head split) give the same views of x
    and c, which joins the operator's scale. Only where nothing else reads x·c."""
    seen: list[Node] = []
    base = _views(r, seen)
    mul = _producer(base, "Mul")
    if mul is None or len(base.users) != 1 or graph.is_output(base):
        return r, 1.0  # x·c is read elsewhere too: keep it (correct either way, not cheaper)
    for x, c in (mul.inputs, reversed(mul.inputs)):
        f = splat(c)
        if f is not None and np.isfinite(f) and f != 0 and x.type == base.type:
            if x.type == r.type:
                return x, f
            return graph.add_node("Reshape", [x], {"shape": list(r.type.shape)},
                                  name=graph.fresh_name(f"{x.name}/q"),
                                  origin=origin).outputs[0], f
    return r, 1.0


def _rewrite(graph: Graph, m: _Match, ctx) -> AttentionMatch:
    """Check the match against the operator's limits and replace it; the record says how.
    (The operator's limits are checked before the pattern's other uses: the reason a
    candidate could never be one launch comes first.)"""
    inside = frozenset(map(id, [*m.nodes, *([m.kt] if m.kt is not None else [])]))
    try:
        q, _ = _heads(m.q, inside)
    except Refused:  # a constant [B·N, S, D] query: B is K's
        if const_array(_views(m.q, [])) is None:
            raise
        q = None
    k, rep_k = _bsnd(m.k) if m.k_bsnd else _sbh(m.k) if m.k_sbh else _heads(m.k, inside)
    rep_k *= m.k_heads
    v, rep_v = _heads(m.v, inside)
    if q is None:
        q, _ = _heads(m.q, inside, batch=k.shape[0])
    if any(x.merged for x in (q, k, v)) and any(x.batched for x in (q, k, v)):
        # some head splits behind their batch axes, others with no head axis seen (one
        # head moved by a Transpose is a view): all read as [X, 1, S, D], where they can be
        q, v = (_merged(x) or y if y.batched else y for x, y in ((m.q, q), (m.v, v)))
        if k.batched and not m.k_bsnd:
            k = _merged(m.k) or k
    if q.merged or k.merged or v.merged:
        if m.k_heads != 1 or m.k_bsnd or m.k_sbh:
            raise Refused("Q, K and V are not all read with their batch axes as one")
        why = _merged_products(m, q, k, v)
        if why is not None:
            raise Refused(why)
        m.notes.append(f"batch axes read as one: {q.shape[0]} heads of one")
    if any(x.batched for x in (q, k, v)) and (
            not _same(q.shape[0], k.shape[0]) or not _same(q.shape[0], v.shape[0])):
        raise Refused(f"Q, K and V differ in their batch ({q.shape[0]}, {k.shape[0]}, "
                      f"{v.shape[0]})")
    if k.batched and m.k_bsnd and not _views_of(m.qk.inputs[1], (*k.shape[:2],
                                                                 *k.shape[:1:-1])):
        raise Refused(f"the scores' product reads {m.qk.inputs[1].name} "
                      f"{list(m.qk.inputs[1].type.shape)}, not K's {k.shape[0]}·{k.shape[1]} "
                      f"matrices Kᵀ of [{k.shape[3]}, {k.shape[2]}]")
    b, n1, s1, d = q.shape
    _, n2, s2, dk = k.shape
    if rep_k == rep_v and k.shape[:3] == v.shape[:3] and dk == d and v.shape[3] != d:
        raise Refused(f"V's head size {v.shape[3]} differs from Q's and K's {d} (LeViT's "
                      "wider values): the operator takes one head size D for Q, K and V")
    if rep_k != rep_v or k.shape != v.shape or dk != d:
        raise Refused("K and V differ in heads, sequence or head size")
    if n2 == 1 and rep_k == 1 and isinstance(n1, int):  # one K/V head broadcast by the
        rep_k = rep_v = n1  # products themselves (an ONNX export of multi-query attention)
    if isinstance(n2, int) and isinstance(rep_k, int) and n2 * rep_k != n1:
        raise Refused(f"K/V heads {n2} repeated {rep_k} times do not give the {n1} query heads")
    why = limits(m.q.dtype, n1, n2, d)
    if why is not None:
        raise Refused(f"unsupported {why}")
    bad = _used_outside(m, m.rows if m.rows and _sink_share(m) else ())
    if bad is not None and any(graph.is_output(x) for x in bad.outputs):
        # (T5-style decoder blocks return their attention weights: a compiled block's
        # frame returns them whether or not its caller keeps them)
        raise Refused(f"{bad.name} ({bad.op}) is also used outside the attention: the graph "
                      "returns it (the operator returns no probabilities; computing them "
                      "as well takes Q·Kᵀ and the softmax again, the launch fusing saves)")
    if bad is not None:
        raise Refused(f"{bad.name} ({bad.op}) is also used outside the attention (e.g. "
                      "probabilities kept for the backward)")
    if not isinstance(m.scale, float) or not np.isfinite(m.scale):
        raise Refused(f"scale {m.scale} is not a finite number")
    out = _output(m.pv, b, n1, s1, d)
    layout = _layout(q, k, v, out)
    origin = tuple(dict.fromkeys(o for n in m.nodes for o in n.origin))
    q.reads[layout], factor = _unscaled(graph, q.read(layout, "Q", m.notes), origin)
    for what, x in (("K", k), ("V", v)):
        if layout in x.builds or layout in x.lazy:
            x.read(layout, what, m.notes)
    m.scale *= factor
    kind, masks, causal = _masks(graph, m, m.pv, (b, n1, s1, s2))
    name = graph.fresh_name(f"attention_{m.qk.name}")
    if layout not in k.reads:  # K only as [B, S, N, D]: its head split, as the graph had it
        k.reads[layout] = graph.add_node("Transpose", [k.reads["BSND"]], {"perm": HEAD_SPLIT},
                                         name=graph.fresh_name(f"{name}/k"),
                                         origin=origin).outputs[0]
    ins = [q.reads[layout], k.reads[layout], v.reads[layout], *masks]
    attrs = {"layout": layout, "head_num": n1, "scale": m.scale, "mask": kind,
             "causal": causal is not None, "window": causal or 0}
    read = [] if _used_outside(m) is None else list(m.rows)  # (the statistics read)
    if read:
        attrs["stats"] = True
    try:
        node = graph.add_node("FusedAttention", ins, attrs, name=name, origin=origin)
    except GraphKernelError as e:  # a limit the checks above do not know of
        raise Refused(f"the operator does not take it: {e}") from None
    fa = node.outputs[0]
    for row, stat in zip(read, node.outputs[1:], strict=True):
        _statistic(graph, row.outputs[0], stat, origin)
    if read:
        m.notes.append("its softmax's row max and sum read as the operator's statistics")
    target = out.reads[layout]
    if target.type != fa.type:
        fa = graph.add_node("Reshape", [fa], {"shape": list(target.type.shape)},
                            name=graph.fresh_name(f"{name}/view"), origin=origin).outputs[0]
    graph.replace_all_uses(target, fa)
    read = [*ins[:3], *q.sources, *k.sources, *v.sources]
    m.notes += split_parts(graph, [s for s in map(sliced_source, read) if s is not None],
                           [x.built for x in (q, k, v) if x.built is not None])
    return AttentionMatch(m.qk.name, [n.name for n in m.nodes], "fused",
                          f"layout {layout}, {n1} heads" + (f" ({n2} K/V heads)" if n2 != n1
                                                            else "") + f", mask {kind}"
                          + (" + causal" if causal is not None else "")
                          + "".join(f"; {x}" for x in m.notes), name)


def _sink_share(m: _Match) -> bool:
    """Whether the softmax's row max ``m`` and row sum ``z`` are read outside the pattern only
    by a sink's share of the row, ``z / (z + exp(sink - m))`` (``attention_sinks``). The
    operator's statistics are the graph's values on every row with a key left; on a row
    whose every key is masked out they are 0 and 0 where the graph has the mask's value and
    the count of keys, and the share is 0 either way (as is the output row)."""
    rmax, rsum = (n.outputs[0] for n in m.rows)
    inside = {id(n) for n in m.nodes}

    def outside(v: Value) -> list[Node]:
        return [u for u in v.users if id(u) not in inside]

    subs = outside(rmax)
    if len(subs) != 1 or subs[0].op != "Sub" or subs[0].inputs[1] is not rmax:
        return False
    exp = subs[0].outputs[0].users
    if len(exp) != 1 or exp[0].op != "Exp":
        return False
    add = exp[0].outputs[0].users
    if len(add) != 1 or add[0].op != "Add" or not any(x is rsum for x in add[0].inputs):
        return False
    div = add[0].outputs[0].users
    return len(div) == 1 and div[0].op == "Div" and div[0].inputs[0] is rsum and \
        {id(u) for u in outside(rsum)} == {id(add[0]), id(div[0])}


def _statistic(graph: Graph, row: Value, stat: Value, origin: tuple) -> None:
    """Redirect the readers of the softmax's row max or row sum ``row`` ([.., S1, 1] of the
    scores) to the operator's statistic ``stat`` ([B, N1, S1, 8], each row's value 8 times):
    the largest of a row's 8 copies (a row reduction the vector kernels take with the work
    reading it; a slice of one column would be a strided load of its own), in ``row``'s
    shape and type."""
    def add(op: str, ins: list[Value], attrs: dict) -> Value:
        return graph.add_node(op, ins, attrs, name=graph.fresh_name(f"{stat.name}/{op}"),
                              origin=origin).outputs[0]

    v = add("ReduceMax", [stat], {"axis": [stat.type.rank - 1], "keep_dims": True})
    if v.dtype != row.dtype:
        v = add("Cast", [v], {"dtype": row.dtype})
    if tuple(v.shape) != tuple(row.shape):
        v = add("Reshape", [v], {"shape": list(row.shape)})
    graph.replace_all_uses(row, v)


def _kept(fa: Node, reason: str) -> AttentionMatch:
    what = "FusedAttention" if fa.op == "FusedAttention" else "its gradient"
    return AttentionMatch(fa.name, [fa.name], "fused", f"{what} from the frontend, "
                          f"{reason}", fa.name)


def _relayout(graph: Graph, fa: Node) -> AttentionMatch:
    """A FusedAttention the frontend made (BNSD, from scaled_dot_product_attention) read in
    the best layout its operands and output allow (head splits read in place, grouped-query
    repeats read with their K/V heads, the head merge written by the operator), Q's constant
    factor taken into the scale — the decomposed pattern's rewrites, for the op itself."""
    a = fa.attrs
    if a["layout"] != "BNSD":
        return _kept(fa, f"layout {a['layout']}")
    inside = frozenset({id(fa)})
    q, _ = _heads(fa.inputs[0], inside)
    b, n1, s1, d = q.shape
    out = _output(fa, b, n1, s1, d)
    # K/V repeated in BSND are read with their own heads when both are and the layout
    # picked is one they offer; else as the repeated heads the frontend gave
    for kv in (True, False):
        k, rep_k = _heads(fa.inputs[1], inside, kv)
        v, rep_v = _heads(fa.inputs[2], inside, kv)
        if rep_k != rep_v or k.shape != v.shape:
            if kv:
                continue
            k = _Operand(tuple(fa.inputs[1].shape), {"BNSD": fa.inputs[1]})
            v = _Operand(tuple(fa.inputs[2].shape), {"BNSD": fa.inputs[2]})
        for x in (k, v):  # multi-query K/V of one head: any layout is a view of it
            x.one_head = x.shape[1] == 1 and "BNSD" in x.reads
        layout = _layout(q, k, v, out)
        if all(x.offers(layout) for x in (k, v)):
            break
    notes: list[str] = []
    origin = fa.origin
    read_q = q.read(layout, "Q", notes)
    factor = 1.0
    if "pse" not in a["mask"]:  # (a pse was divided by the scale: it stays as it is)
        read_q, factor = _unscaled(graph, read_q, origin)
    ins = [read_q, k.read(layout, "K", notes), v.read(layout, "V", notes)]
    if layout == "BNSD" and factor == 1.0 and all(x is y for x, y in zip(ins, fa.inputs)):
        return _kept(fa, "layout BNSD (an operand or the output is not a head split or "
                     "merge)")
    attrs = dict(a) | {"layout": layout, "scale": a["scale"] * factor}
    name = graph.fresh_name(fa.name)
    try:
        new = graph.add_node(fa.op, [*ins, *fa.inputs[3:]], attrs, name=name, origin=origin)
    except GraphKernelError as e:  # a limit the checks above do not know of
        raise Refused(f"the operator does not take it in layout {layout}: {e}") from None
    target, got = out.reads[layout], new.outputs[0]
    if target.type != got.type:
        got = graph.add_node("Reshape", [got], {"shape": list(target.type.shape)},
                             name=graph.fresh_name(f"{name}/view"), origin=origin).outputs[0]
    graph.replace_all_uses(target, got)
    for old_v, new_v in zip(fa.outputs[1:], new.outputs[1:], strict=True):  # statistics
        graph.replace_all_uses(old_v, new_v)
    read = [*ins, *q.sources, *k.sources, *v.sources]
    notes += split_parts(graph, [x for x in map(sliced_source, read) if x is not None],
                         [x.built for x in (q, k, v) if x.built is not None])
    if factor != 1.0:
        notes.append(f"Q's factor {factor:g} taken into the scale")
    n2 = k.shape[1]
    return AttentionMatch(fa.name, [fa.name], "fused",
                          f"FusedAttention from the frontend, read in layout {layout}, "
                          f"{n1} heads" + (f" ({n2} K/V heads)" if n2 != n1 else "")
                          + f", mask {a['mask']}" + (" + causal" if a["causal"] else "")
                          + "".join(f"; {x}" for x in notes), name)


def attention(graph, ctx) -> PassResult:
    """Rewrite Q·Kᵀ -> scale -> mask -> softmax -> ·V (and the head split/merge around it)
    -> one FusedAttention op, the vendor's fused attention operator as an extern kernel; a
    FusedAttention the frontend made is read in the best layout its neighbours allow."""
    found: list[AttentionMatch] = ctx.analyses.attention
    fused = 0
    for fa in [n for n in graph.nodes if n.op in ("FusedAttention", "FusedAttentionGrad")]:
        if fa.op == "FusedAttentionGrad":
            found.append(_kept(fa, f"layout {fa.attrs['layout']} (the forward's saved "
                                   "operands)"))
            continue
        if not ctx.should_apply(f"attention layout of {fa.name}", [fa]):
            found.append(_kept(fa, f"layout {fa.attrs['layout']} (not rewritten: bisect)"))
            continue
        try:
            with graph.recording() as added:
                rec = _relayout(graph, fa)
        except Refused as e:
            for n in reversed(added):
                if n.graph is graph and not any(v.users for v in n.outputs):
                    graph.erase_node(n)
            found.append(AttentionMatch(fa.name, [fa.name], "refused", str(e), fa.name))
            continue
        found.append(rec)
        fused += rec.op != fa.name
    for pv in list(graph.nodes):
        if pv.graph is None or pv.op != "BatchMatMul":
            continue
        try:
            m = _match(pv)
            if m is None:
                continue
        except Refused as e:
            found.append(AttentionMatch(pv.name, [pv.name], "refused", str(e)))
            continue
        names = [n.name for n in m.nodes]
        if not ctx.should_apply(f"attention {m.qk.name} .. {pv.name}", m.nodes):
            continue
        try:
            with graph.recording() as added:
                rec = _rewrite(graph, m, ctx)
        except Refused as e:
            for n in reversed(added):  # a mask node made before the refusal
                if n.graph is graph and not any(v.users for v in n.outputs):
                    graph.erase_node(n)
            found.append(AttentionMatch(m.qk.name, names, "refused", str(e)))
            ctx.log(f"attention at {m.qk.name} refused: {e}")
            continue
        found.append(rec)
        fused += 1
    if fused:
        graph.remove_dead()
    refused = sum(a.verdict == "refused" for a in found)
    return PassResult(fused > 0, fused, [f"{counted(fused, 'attention')} as one launch"
                                         + (f" ({refused} refused)" if refused else "")])
