"""Algebraic simplification: a numbered table of exact rewrite rules.

Every rule is exact in IEEE arithmetic (it never changes a result beyond the sign
of a zero). Rules that are not exact are deliberately absent: ``exp(log x) -> x``
turns the NaN of a negative x into x, and ``x * 0 -> 0`` turns NaN/Inf into 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.ir import Dim, DType, Graph, Node, Value
from graphkernel.passes.constant_fold import GROWTH_LIMIT
from graphkernel.passes.rewrite import add_like, const_array, replace_with, splat
from graphkernel.registry import PassResult

Rewrite = Callable[[Graph, Node], Value | None]


def _operand_if_identity(node: Node, ident: float, commutative: bool) -> Value | None:
    """x op c -> x when c is a splat of the identity and x already has the output type."""
    a, b = node.inputs
    out = node.outputs[0].type
    if splat(b) == ident and a.type == out:
        return a
    if commutative and splat(a) == ident and b.type == out:
        return b
    return None


def _producer(v: Value, op: str) -> Node | None:
    p = v.producer
    return p if p is not None and p.op == op else None


def _mul_neg_one(g: Graph, n: Node) -> Value | None:
    a, b = n.inputs
    for x, c in ((a, b), (b, a)):
        if splat(c) == -1.0 and x.type == n.outputs[0].type and x.dtype.is_float:
            return add_like(g, n, "Neg", [x])
    return None


def _pow_two(g: Graph, n: Node) -> Value | None:
    x, e = n.inputs
    if splat(e) == 2.0 and x.type == n.outputs[0].type and x.dtype.is_float:
        return add_like(g, n, "Mul", [x, x])
    return None


def _fold_neg(op_from: str, op_to: str) -> Rewrite:
    def rw(g: Graph, n: Node) -> Value | None:
        x, y = n.inputs
        neg = _producer(y, "Neg")
        if neg is None:
            return None
        return add_like(g, n, op_to, [x, neg.inputs[0]])

    return rw


def _involution(op: str) -> Rewrite:
    def rw(g: Graph, n: Node) -> Value | None:
        inner = _producer(n.inputs[0], op)
        return inner.inputs[0] if inner is not None else None

    return rw


def _concat_parts(g: Graph, n: Node) -> Value | None:
    """Concat without its empty parts (a part of size 0 along the axis adds nothing, as the
    empty cache a decoder concatenates its first keys to); of a single part, that part."""
    axis = n.attrs["axis"] % n.outputs[0].type.rank
    parts = [v for v in n.inputs if v.shape[axis] != 0]
    if len(parts) == 1 and parts[0].type == n.outputs[0].type:
        return parts[0]
    if not parts or len(parts) == len(n.inputs):
        return None
    return add_like(g, n, "Concat", parts, dict(n.attrs))


def _slice_whole(g: Graph, n: Node) -> Value | None:
    """StridedSlice with step 1 on every axis it lists and its input's type -> the input:
    every axis is taken whole. Dynamo writes ``x[:, :, :]`` of a symbolic axis as
    ``slice(0, 2**63 - 1)``, which static shapes would have dropped while tracing; left in,
    it hides a grouped-query K/V repeat from the attention pattern."""
    x = n.inputs[0]
    if any(s != 1 for s in n.attrs["strides"] or ()) or x.type != n.outputs[0].type:
        return None
    return x


def _gather_slice(g: Graph, n: Node) -> Value | None:
    """Gather(x, [a, a+k, …, a+(m-1)k]) along an axis of static length d, every index in
    [-d, d), k > 0 (or one index) -> StridedSlice(x, a:a+m·k:k) — a view of x (strided)
    rather than a gather. A scalar index drops the axis as Gather does: a Squeeze after.
    Fused-QKV projections are split this way (Falcon's ``qkv[..., -2, :]`` for K)."""
    x, idx = n.inputs
    arr = const_array(idx)
    axis = n.attrs["axis"] % x.type.rank
    d = x.shape[axis]
    if arr is None or arr.ndim > 1 or arr.size == 0 or not isinstance(d, int) or \
            arr.dtype.kind not in "iu":
        return None
    flat = arr.reshape(-1).astype(np.int64)
    if np.any(flat < -d) or np.any(flat >= d):
        return None  # out of range: Gather's error, which a slice would clamp away
    flat = np.where(flat < 0, flat + d, flat)
    step = int(flat[1] - flat[0]) if flat.size > 1 else 1
    if step <= 0 or np.any(np.diff(flat) != step):
        return None
    start = int(flat[0])
    sl = add_like(g, n, "StridedSlice", [x], {"begin": [start],
                                                "end": [start + step * (flat.size - 1) + 1],
                                                "strides": [step], "axes": [axis]})
    return sl if arr.ndim == 1 else add_like(g, n, "Squeeze", [sl], {"axis": [axis]})


def _sliced_conv(g: Graph, n: Node) -> tuple[Node, Node | None, int, int] | None:
    """(convolution, the Squeeze between, its spatial axis 0 (H) or 1 (W), outputs dropped)
    when ``n`` keeps the first outputs of a padded convolution (through an optional Squeeze)
    along one spatial axis and only ``n`` reads them."""
    a = n.attrs
    if len(a["begin"]) != 1 or a["begin"][0] not in (0, None) or (a["strides"] or [1]) != [1]:
        return None
    x = n.inputs[0]
    found = _conv_axis(g, x, (a["axes"] or [0])[0] % x.type.rank)
    if found is None:
        return None
    conv, view, conv_out, axis, spatial = found
    end, length = a["end"][0], conv_out.shape[axis]
    dropped = -end if end < 0 else length - end if isinstance(length, int) else 0
    if dropped <= 0:
        return None
    return conv, view, spatial.index(axis), dropped


def _slice_conv_padding(g: Graph, n: Node) -> Value | None:
    """conv(x, pad end p)[..., :-m] -> conv(x, pad end p - m*stride): the dropped outputs
    are the last m, whose windows are the only ones reading the last m*stride padded
    positions (wav2vec2's positional convolution with an even kernel)."""
    found = _sliced_conv(g, n)
    if found is None:
        return None
    conv, view, sp, dropped = found
    pads, stride = list(conv.attrs["pads"]), conv.attrs["strides"][sp]
    if pads[2 + sp] < dropped * stride:
        return None
    pads[2 + sp] -= dropped * stride
    return _conv_with_pads(g, n, conv, view, pads)


def _gather_prefix_conv_padding(g: Graph, n: Node) -> Value | None:
    """conv(x, pad end p)[..., Range(0, n)] -> conv(x, pad end p - m*stride) when the
    convolution's output along that spatial axis is ``n + m`` (symbolically: a causal
    convolution over a symbolic length ``L``, padded by ``k-1`` on both sides and sliced to
    ``L``, which the torch frontend writes as a Gather of the rows ``0 .. L-1``). The kept
    rows are the first ``n``, exactly the outputs of the convolution with ``m*stride`` less
    padding at the end (as ``slice_conv_padding`` for a static slice)."""
    x, idx = n.inputs
    r = idx.producer
    if r is None or r.op != "Range" or r.attrs["start"] != 0 or r.attrs["delta"] != 1 or \
            len(idx.uses) != 1 or g.is_output(idx):
        return None
    found = _conv_axis(g, x, n.attrs["axis"] % x.type.rank)
    if found is None:
        return None
    conv, view, conv_out, axis, spatial = found
    sp = spatial.index(axis)
    pads, stride = list(conv.attrs["pads"]), conv.attrs["strides"][sp]
    kept, length = r.attrs["length"], conv_out.shape[axis]
    dropped = next((m for m in range(1, pads[2 + sp] // stride + 1)
                    if _offset_eq(kept, m, length)), 0)
    if not dropped:
        return None
    pads[2 + sp] -= dropped * stride
    return _conv_with_pads(g, n, conv, view, pads)


def _conv_axis(g: Graph, x: Value, axis: int):
    """(convolution, the Squeeze between or None, the convolution's output, ``axis`` of ``x``
    as the output's axis, the output's spatial axes) when ``x`` is a convolution's output
    (through an optional Squeeze) read only once, and ``axis`` is one of its spatial axes."""
    view = _producer(x, "Squeeze")
    conv_out = view.inputs[0] if view is not None else x
    conv = _producer(conv_out, "Conv2D")
    if conv is None or view is not None and view.attrs["axis"] is None \
            or any(len(v.uses) != 1 or g.is_output(v) for v in (x, conv_out)):
        return None
    if view is not None:  # the Squeeze's input axis that ``axis`` is
        gone = {a % conv_out.type.rank for a in view.attrs["axis"]}
        axis = [i for i in range(conv_out.type.rank) if i not in gone][axis]
    spatial = (2, 3) if conv.attrs["data_format"] == "NCHW" else (1, 2)
    if axis not in spatial:
        return None
    return conv, view, conv_out, axis, spatial


def _conv_with_pads(g: Graph, n: Node, conv: Node, view: Node | None, pads: list) -> Value | None:
    """``conv`` again with ``pads`` (and its Squeeze ``view`` after it), standing for ``n``'s
    output; nothing added when its type is not ``n``'s (a length the shapes cannot show
    equal)."""
    mark = len(g)
    new = add_like(g, conv, "Conv2D", list(conv.inputs), dict(conv.attrs) | {"pads": pads})
    if view is not None:
        new = add_like(g, view, "Squeeze", [new], dict(view.attrs))
    if new.type != n.outputs[0].type:
        for extra in reversed(g.nodes[mark:]):
            g.erase_node(extra)
        return None
    return new


def _offset_eq(d: Dim, m: int, other: Dim) -> bool:
    """Whether ``d + m`` is ``other`` (dims, symbolic or not)."""
    try:
        return symbolic.eq(symbolic.floor_affine(d, m), other)
    except ShapeError:
        return False


def _pad_into_conv(g: Graph, n: Node) -> Value | None:
    """conv(pad(x, zeros around H and W)) -> conv(x, pads + those): TensorFlow's "SAME"
    padding written as an explicit pad (a zero contributes 0·w either way)."""
    pad = _producer(n.inputs[0], "Pad")
    if pad is None or pad.attrs["mode"] != "constant" or pad.attrs["value"] != 0.0:
        return None
    x, r = pad.inputs[0], pad.inputs[0].type.rank
    p = pad.attrs["pads"]
    spatial = (2, 3) if n.attrs["data_format"] == "NCHW" else (1, 2)
    if r != 4 or any(v < 0 for v in p) or any(p[a] or p[r + a] for a in range(r)
                                              if a not in spatial):
        return None
    h, w = spatial
    t, left, b, right = n.attrs["pads"]
    pads = [t + p[h], left + p[w], b + p[r + h], right + p[r + w]]
    return add_like(g, n, "Conv2D", [x, *n.inputs[1:]], dict(n.attrs) | {"pads": pads})


def _broadcast_const(g: Graph, n: Node, arr: np.ndarray) -> Value | None:
    """``arr`` (of the output's rank, axes of 1 where it repeats) broadcast to ``n``'s static
    output shape: a Constant of that shape when it is small (as constant_fold would fold
    it), else a Constant of ``arr`` and a BroadcastTo."""
    out = n.outputs[0].type
    if not out.is_static:
        return None
    arr = arr.astype(out.dtype.np)
    small = out.nbytes <= arr.nbytes + GROWTH_LIMIT
    full = np.ascontiguousarray(np.broadcast_to(arr, tuple(out.shape))) if small else arr
    c = g.add_node("Constant", [], {"value": full}, name=g.fresh_name(f"{n.name}_folded"),
                   origin=n.origin).outputs[0]
    return c if small else add_like(g, n, "BroadcastTo", [c], {"shape": list(out.shape)})


def _gather_splat_data(g: Graph, n: Node) -> Value | None:
    """Gather or GatherElements from a constant whose elements are all equal -> that value
    (whatever the indices: RoBERTa-style token types gathered from a buffer of zeros by
    position ids)."""
    arr = const_array(n.inputs[0])
    if arr is None or arr.size == 0 or not np.all(arr == arr.reshape(-1)[0]):
        return None
    return _broadcast_const(g, n, arr.reshape(-1)[:1].reshape((1,) * n.outputs[0].type.rank))


def _gather_splat_index(g: Graph, n: Node) -> Value | None:
    """Gather(constant table, index k everywhere) -> row k of the table, broadcast (one
    embedding row for every position: the token type 0 of an encoder called without
    token types)."""
    x, idx = n.inputs
    b = _producer(idx, "BroadcastTo")  # (a splat broadcast: rule 20's result)
    table, arr = const_array(x), const_array(b.inputs[0] if b is not None else idx)
    if table is None or arr is None or arr.size == 0 or arr.dtype.kind not in "iu":
        return None
    k = int(arr.reshape(-1)[0])
    axis = n.attrs["axis"] % table.ndim
    d = table.shape[axis]
    if not np.all(arr == k) or not -d <= k < d:
        return None
    row = np.take(table, [k % d], axis=axis)
    shape = table.shape[:axis] + (1,) * idx.type.rank + table.shape[axis + 1:]
    return _broadcast_const(g, n, row.reshape(shape))


def _slice_of_slice(g: Graph, n: Node) -> Value | None:
    """x[a][b] -> x[a, b] for StridedSlices of different axes: one slice of x, not a slice
    of a slice (each a launch when left alone: Swin's patch merging ``x[:, 0::2, 1::2]``
    takes rows, then columns of those rows)."""
    inner = _producer(n.inputs[0], "StridedSlice")
    if inner is None:
        return None
    rank = n.outputs[0].type.rank

    def axes(m: Node) -> list[int]:
        a = m.attrs["axes"] if m.attrs["axes"] is not None else range(len(m.attrs["begin"]))
        return [x % rank for x in a]

    a1, a2 = axes(inner), axes(n)
    if set(a1) & set(a2):
        return None
    merged = {}
    for m, ax in ((inner, a1), (n, a2)):
        strides = m.attrs["strides"] or [1] * len(ax)
        for k, axis in enumerate(ax):
            merged[axis] = (m.attrs["begin"][k], m.attrs["end"][k], strides[k])
    order = sorted(merged)
    return add_like(g, n, "StridedSlice", [inner.inputs[0]],
                    {"begin": [merged[a][0] for a in order], "end": [merged[a][1] for a in order],
                     "strides": [merged[a][2] for a in order], "axes": order})


MOVES = ("Reshape", "ExpandDims", "Squeeze", "Identity", "Transpose")


def _view_of(x: Value, op: str, depth: int = 16) -> Node | None:
    """The ``op`` node whose result ``x`` is element for element, through a chain of views
    and transposes that moves nothing: the chain, reduced (consecutive reshapes merged,
    consecutive transposes composed, a transpose moving only axes of size 1 taken as a
    reshape, a reshape to its input's shape dropped), is empty. None when there is no such
    node or the chain moves data."""
    chain: list[Node] = []
    v = x
    while (p := v.producer) is not None and p.op in MOVES and len(chain) < depth:
        chain.append(p)
        v = p.inputs[0]
    src = v.producer
    if src is None or src.op != op or not chain:
        return src if src is not None and src.op == op else None
    if not all(isinstance(d, int) for u in (v, *(c.outputs[0] for c in chain)) for d in u.shape):
        return None
    # forward, as (perm or None for a reshape, output shape)
    steps: list[tuple[list[int] | None, tuple]] = [
        (list(c.attrs["perm"]) if c.op == "Transpose" else None, tuple(c.outputs[0].shape))
        for c in reversed(chain)]
    start = tuple(v.shape)
    changed = True
    while changed:
        changed = False
        shape = start
        for i, (perm, out) in enumerate(steps):
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            if perm is not None and [p for p in perm if shape[p] != 1] == sorted(
                    p for p in perm if shape[p] != 1):
                steps[i] = (None, out)  # moves only axes of 1: a reshape
            elif perm is None and out == shape:
                del steps[i]
            elif perm is None and nxt is not None and nxt[0] is None:
                del steps[i]  # reshape then reshape: the second
            elif perm is not None and nxt is not None and nxt[0] is not None:
                composed = [perm[q] for q in nxt[0]]
                del steps[i]
                steps[i] = (composed, nxt[1])
            else:
                shape = out
                continue
            changed = True
            break
    return src if not steps else None


def _slice_of_concat(g: Graph, n: Node) -> Value | None:
    """cat([a, b, …], axis)[.., i:j] -> the piece spanning exactly i:j of that axis (step 1,
    static sizes): a view of a piece is the piece. Transformers' latent attention builds its
    key as two slice copies into one buffer (``k[..., :d].copy_(k_nope)``, then
    ``k[..., d:].copy_(k_rot)``): the second reads the first's result back through a slice
    of exactly the piece the first wrote, two Concat kernels where one writes the key.

    The Concat may be seen through views and transposes that together move nothing (each
    element where it was, the same shape): an in-place write into a view of a tensor
    (Funnel's ``positional_attn *= cls_mask`` on a slice of a reshaped product) comes out of
    functionalization as slice_scatters back into the whole tensor, which the next read
    takes through the same views again (``_view_of``)."""
    cat = _view_of(n.inputs[0], "Concat")
    if cat is None or len(n.attrs["begin"]) != 1:
        return None
    x = n.inputs[0]
    rank = x.type.rank
    axis = (n.attrs["axes"][0] if n.attrs["axes"] is not None else 0) % rank
    if axis != cat.attrs["axis"] % rank or (n.attrs["strides"] or [1])[0] != 1 or \
            any(not isinstance(v.shape[axis], int) for v in cat.inputs):
        return None
    begin, end, _ = slice(n.attrs["begin"][0], n.attrs["end"][0]).indices(x.shape[axis])
    at = 0
    for piece in cat.inputs:
        if (at, at + piece.shape[axis]) == (begin, end) and piece.type == n.outputs[0].type:
            return piece
        at += piece.shape[axis]
    return None


def _idempotent(op: str) -> Rewrite:
    def rw(g: Graph, n: Node) -> Value | None:
        return n.inputs[0] if _producer(n.inputs[0], op) is not None else None

    return rw


def _float_to_bool(g: Graph, n: Node) -> Value | None:
    """Cast of a float to bool -> x != 0: the same truth (NaN true, -0.0 false) as a
    comparison the vector kernels run (a cast to an integer type is not generated), e.g. a
    mixture of experts' group mask before it selects the experts' scores."""
    x = n.inputs[0]
    if n.attrs["dtype"] is not DType.bool or not x.dtype.is_float:
        return None
    return add_like(g, n, "NotEqual", [x, g.const(np.zeros((), x.dtype.np))])


@dataclass(frozen=True)
class Rule:
    number: int
    name: str
    op: str
    rewrite: Rewrite


RULES: list[Rule] = [
    Rule(1, "mul_one", "Mul", lambda g, n: _operand_if_identity(n, 1.0, True)),   # x*1 -> x
    Rule(2, "add_zero", "Add", lambda g, n: _operand_if_identity(n, 0.0, True)),  # x+0 -> x
    Rule(3, "sub_zero", "Sub", lambda g, n: _operand_if_identity(n, 0.0, False)),  # x-0 -> x
    Rule(4, "div_one", "Div", lambda g, n: _operand_if_identity(n, 1.0, False)),  # x/1 -> x
    Rule(5, "pow_one", "Pow", lambda g, n: _operand_if_identity(n, 1.0, False)),  # x**1 -> x
    Rule(6, "neg_neg", "Neg", _involution("Neg")),                  # -(-x) -> x
    Rule(7, "not_not", "LogicalNot", _involution("LogicalNot")),    # !!x -> x
    Rule(8, "abs_abs", "Abs", _idempotent("Abs")),                  # |(|x|)| -> |x|
    Rule(9, "identity", "Identity", lambda g, n: n.inputs[0]),      # Identity(x) -> x
    Rule(10, "mul_neg_one", "Mul", _mul_neg_one),                   # x*-1 -> -x
    Rule(11, "pow_two", "Pow", _pow_two),                           # x**2 -> x*x
    Rule(12, "add_neg", "Add", _fold_neg("Add", "Sub")),            # x+(-y) -> x-y
    Rule(13, "sub_neg", "Sub", _fold_neg("Sub", "Add")),            # x-(-y) -> x+y
    Rule(14, "broadcast_identity", "BroadcastTo",                   # BroadcastTo(x, x.shape)
         lambda g, n: n.inputs[0] if n.inputs[0].type == n.outputs[0].type else None),  # -> x
    Rule(15, "concat_parts", "Concat", _concat_parts),  # cat([x]) -> x; cat drops empty parts
    Rule(16, "gather_slice", "Gather", _gather_slice),  # x[[a, a+k, …]] -> x[a::k] (a view)
    Rule(17, "slice_conv_padding", "StridedSlice",  # conv(x, pad p)[..., :-m]
         _slice_conv_padding),                       # -> conv(x, pad p - m*stride)
    Rule(18, "slice_whole", "StridedSlice", _slice_whole),  # x[0:end≥d:1] -> x (d symbolic too)
    Rule(19, "pad_into_conv", "Conv2D", _pad_into_conv),  # conv(pad(x, 0 on H, W))
    #                                                       -> conv(x, pads + those)
    Rule(20, "gather_splat_data", "Gather", _gather_splat_data),  # gather(splat c, i) -> c
    Rule(21, "gather_elements_splat_data", "GatherElements", _gather_splat_data),
    Rule(22, "gather_splat_index", "Gather", _gather_splat_index),  # gather(T, k) -> T[k]
    Rule(23, "slice_of_slice", "StridedSlice", _slice_of_slice),  # x[a][b] -> x[a, b]
    Rule(24, "float_to_bool", "Cast", _float_to_bool),  # bool(x) -> x != 0 (x float)
    Rule(25, "slice_of_concat", "StridedSlice", _slice_of_concat),  # cat(a, b)[a's span] -> a
    Rule(26, "gather_prefix_conv_padding", "Gather",  # conv(x, pad p)[..., Range(0, n)]
         _gather_prefix_conv_padding),                 # -> conv(x, pad p - m*stride)
]
RULES_BY_OP: dict[str, list[Rule]] = {}
for _r in RULES:
    RULES_BY_OP.setdefault(_r.op, []).append(_r)


def arith_simplify(graph, ctx) -> PassResult:
    """Rewrite by the numbered rules in RULES (x*1 -> x, -(-x) -> x, x+(-y) -> x-y …)."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.graph is None:
            continue  # erased by an earlier rewrite in this sweep
        for rule in RULES_BY_OP.get(node.op, ()):
            mark = len(graph)
            new = rule.rewrite(graph, node)
            if new is None:
                continue
            desc = f"rule {rule.number} {rule.name} on {node.name}"
            if not ctx.should_apply(desc, [node]):
                if len(graph) != mark and new.producer is not None and not new.uses:
                    graph.erase_node(new.producer)
                continue
            replace_with(graph, node, new)
            key = f"rule {rule.number} {rule.name}"
            counts[key] = counts.get(key, 0) + 1
            break
    total = sum(counts.values())
    notes = [f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: int(kv[0].split()[1]))]
    return PassResult(total > 0, total, notes,
                      ", ".join(f"{k.split()[2]} x{v}" for k, v in sorted(counts.items())))
