"""Interleaved rotary embeddings → split-half rotary, by permuting the features of Q and K.

GPT-J and its relatives rotate each pair of adjacent features of a head: ``x[..., ::2]`` and
``x[..., 1::2]``, then ``stack((-x2, x1), -1).flatten(-2)`` interleaves them back. Steps of 2
along the last axis leave the vector kernels no row split (each rotary is four or five
launches). Attention reads Q and K only through their dot products, which a permutation of
the head's features applied to both leaves unchanged. Under the permutation that puts the
even features of the rotated part first and the odd ones after them, the pairs are the two
halves of the rotated part and the interleaving is a Concat of halves: the rotary LLaMA and
GPT-NeoX write (``rotate_half``), one kernel reading column slices. The permutation is folded
into the rows of the frozen projection weights (and biases) that make Q and K, and into the
cos/sin tables; nothing else may read the permuted values (V, the pass-through features and
any other use stay as they were; a Q or K with another use, such as a KV cache a graph
returns, is left alone). The rotated features may be the first columns of the heads after the
Transpose that moves them first and keeps the features last (GLM's ``q.view(B, S, N, D)
.transpose(1, 2)[..., :n]``, the other columns passed through): when that Transpose is the
projection's heads' one reader, the permutation of the rows passes through it. The heads
may also be cut from a fused product (CodeGen's ``qkv.view(B, S, G, 3·W).split(W)``, each
part reshaped into the heads): when each group of the product's columns holds one head of Q
(and of K) and every other reader takes other columns (V's), the permutation goes to those
columns of the product (``_source_columns``, as for pairs read apart).

DeepSeek writes the rotated pairs back as halves (``cat(x1*cos - x2*sin, x2*cos + x1*sin)``):
when the pair slices are the only readers of x, the same permutation of x's features in the
product that makes it (through column slices, Splits, head splits and Transposes that keep the
features last, each other reader of those values taking other columns) turns the slices into
the halves and changes nothing else; ``rotary_halves`` then makes the rotary one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphkernel import ops
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import VIEW_OPS, OpKind
from graphkernel.passes.rewrite import const_array
from graphkernel.registry import PassResult, counted

FULL, HALF = "full", "half"  # a value over the rotated features (permuted), or over a half


def _last(n: Node) -> int:
    return n.inputs[0].type.rank - 1


def _pair_slice(n: Node) -> int | None:
    """0 or 1 when ``n`` takes every other feature of the last axis from that position."""
    a = n.attrs
    if n.op != "StridedSlice" or len(a["begin"]) != 1 or (a["strides"] or [1])[0] != 2:
        return None
    axis = (a["axes"][0] if a["axes"] is not None else 0) % n.inputs[0].type.rank
    d = n.inputs[0].shape[axis]
    if axis != _last(n) or not isinstance(d, int) or d % 2 or a["begin"][0] not in (0, 1) \
            or a["end"][0] < d:
        return None
    return a["begin"][0]


def _columns(n: Node) -> tuple[int, int] | None:
    """(start, stop) of a step-1 StridedSlice of the static last axis, else None."""
    a = n.attrs
    if n.op != "StridedSlice" or len(a["begin"]) != 1 or (a["strides"] or [1])[0] != 1:
        return None
    x = n.inputs[0]
    axis = (a["axes"][0] if a["axes"] is not None else 0) % x.type.rank
    d = x.shape[axis]
    if axis != x.type.rank - 1 or not isinstance(d, int):
        return None
    start, stop, _ = slice(a["begin"][0], min(a["end"][0], d)).indices(d)
    return start, stop


def _interleave(n: Node) -> tuple[Value, Value] | None:
    """(a, b) when ``n`` is ``Reshape(Concat(ExpandDims(a, -1), ExpandDims(b, -1), -1))``
    merging the new pairs axis into the last (``stack((a, b), -1).flatten(-2)``)."""
    if n.op != "Reshape" or n.inputs[0].producer is None:
        return None
    cat = n.inputs[0].producer
    if cat.op != "Concat" or len(cat.inputs) != 2 or \
            cat.attrs["axis"] % cat.outputs[0].type.rank != cat.outputs[0].type.rank - 1:
        return None
    parts = []
    for v in cat.inputs:
        e = v.producer
        if e is None or e.op not in ("ExpandDims", "Reshape") or v.shape[-1] != 1 or \
                tuple(e.inputs[0].shape) != tuple(v.shape[:-1]) or len(v.uses) != 1:
            return None
        parts.append(e.inputs[0])
    out = n.outputs[0]
    if tuple(out.shape[:-1]) != tuple(parts[0].shape[:-1]) or \
            out.shape[-1] != 2 * parts[0].shape[-1] or len(cat.outputs[0].uses) != 1:
        return None
    return parts[0], parts[1]


@dataclass
class Rotary:
    """One interleaved rotary: its rotated features ``root`` ([.., N, D][..., :n] of a
    projection), the nodes computing it, and the value that leaves it for the attention."""

    root: Value
    n: int
    head: Value  # the projection's [.., N, D] view
    product: Node  # the MatMul making the projection
    bias: Node | None  # its Add of a constant bias, if any
    kinds: dict[int, str] = field(default_factory=dict)  # value id -> FULL or HALF
    nodes: list[Node] = field(default_factory=list)  # in graph order
    exit: Value | None = None
    columns: Columns | None = None  # the heads' columns when cut from a wider product


def _projection(head: Value) -> tuple[Node, Node | None] | None:
    """(MatMul by a constant weight [N·D, in] read transposed or [in, N·D], its bias Add or
    None) making
    ``head`` through Reshapes that split its last axis into [N, D]; None otherwise."""
    v = head
    while v.producer is not None and v.producer.op == "Reshape" and (
            v is head or len(v.uses) == 1):
        v = v.producer.inputs[0]
    p, bias = v.producer, None
    if p is not None and p.op == "Add":
        c = [x for x in p.inputs if const_array(x) is not None]
        rest = [x for x in p.inputs if const_array(x) is None]
        if len(c) != 1 or len(rest) != 1 or c[0].type.rank != 1:
            return None
        bias, p = p, rest[0].producer
        if len(rest[0].uses) != 1:
            return None
    # a torch Linear's weight [N·D, in] read transposed, or an ONNX MatMul's [in, N·D]
    if p is None or p.op not in ("MatMul", "BatchMatMul") or p.attrs.get("transpose_a") or \
            const_array(p.inputs[1]) is None or p.inputs[1].type.rank != 2:
        return None
    width = p.outputs[0].shape[-1]
    if not isinstance(width, int) or head.shape[-2] * head.shape[-1] != width or \
            len(p.outputs[0].uses) != 1:
        return None
    return p, bias


def _stacked(u: Node) -> Node | None:
    """The interleave's Reshape when ``u`` adds the trailing axis of 1 to one of its halves."""
    out = u.outputs[0]
    if u.op not in ("ExpandDims", "Reshape") or len(out.uses) != 1 or out.shape[-1] != 1:
        return None
    cat = out.uses[0][0]
    if cat.op != "Concat" or len(cat.outputs[0].uses) != 1:
        return None
    flat = cat.outputs[0].uses[0][0]
    return flat if _interleave(flat) is not None else None


def _returned(graph: Graph, head: Value, product: Value) -> bool:
    """Whether a value from the projection's product to the head view is a graph output."""
    v = head
    while True:
        if graph.is_output(v):
            return True
        if v is product or v.producer is None or not v.producer.inputs:
            return False
        v = v.producer.inputs[0] if v.producer.op != "Add" else next(
            (x for x in v.producer.inputs if const_array(x) is None), product)


def _region(graph: Graph, root: Value
            ) -> tuple[list[Node], set[int], dict[int, str], Value] | None:
    """The nodes computing a rotary from ``root`` (FULL), the ids of those folded into the
    interleave that follows them, the kind of each value, and the value leaving the region;
    None when some use does not fit the permutation."""
    kinds = {id(root): FULL}
    nodes: dict[int, Node] = {}
    folded: set[int] = set()
    exits: list[Value] = []
    frontier = [root]
    while frontier:
        v = frontier.pop()
        for u, _ in list(v.uses):
            if id(u) in nodes or id(u) in folded or not any(
                    x.uses or graph.is_output(x) for x in u.outputs):
                continue  # (a dead use: dce's)
            if len(u.outputs) != 1:
                return None
            out = u.outputs[0]
            flat = _stacked(u) if kinds[id(v)] == HALF else None
            if flat is not None:
                folded.add(id(u))
                a, b = _interleave(flat)
                if id(a) in kinds and id(b) in kinds:  # (both halves reached)
                    folded.add(id(flat.inputs[0].producer))
                    nodes[id(flat)] = flat
                    kinds[id(flat.outputs[0])] = FULL
                    frontier.append(flat.outputs[0])
                continue
            if _pair_slice(u) is not None and kinds[id(v)] == FULL:
                kinds[id(out)] = HALF
            elif ops.get(u.op).kind == OpKind.ELEMWISE and all(
                    id(x) in kinds or const_array(x) is not None or _pair_repeat(x) is not None
                    for x in u.inputs):
                ks = {kinds[id(x)] for x in u.inputs if id(x) in kinds}
                if len(ks) != 1 or tuple(out.shape) != tuple(v.shape):
                    return None
                if any(id(x) not in kinds and x.type.rank and
                       x.shape[-1] not in (1, v.shape[-1]) for x in u.inputs):
                    return None
                kinds[id(out)] = ks.pop()
            elif u.op == "Concat" and kinds[id(v)] == FULL and u.inputs[0] is v and \
                    all(id(x) not in kinds for x in u.inputs[1:]) and \
                    u.attrs["axis"] % out.type.rank == out.type.rank - 1:
                nodes[id(u)] = u  # the rotated features, then the others: it leaves
                exits.append(out)
                continue
            elif kinds[id(v)] == FULL and v is not root:
                continue  # v leaves the region (checked below: one value leaves it)
            else:
                return None
            nodes[id(u)] = u
            frontier.append(out)
    inside = set(nodes) | folded
    leaving = [m.outputs[0] for m in nodes.values() if m.op != "Concat" or
               m.outputs[0] not in exits]
    leaving = [x for x in leaving if not x.uses or graph.is_output(x) or
               any(id(u) not in inside for u, _ in x.uses)]
    if exits:
        if len(exits) != 1 or leaving:
            return None
        out = exits[0]
    else:
        if len(leaving) != 1 or kinds.get(id(leaving[0])) != FULL:
            return None
        out = leaving[0]
    if any(id(a) not in kinds for m in nodes.values() if _interleave(m) is not None
           for a in _interleave(m)):
        return None
    return list(nodes.values()), folded, kinds, out


def _pair_repeat(x: Value) -> Value | None:
    """``t`` of shape [..., h, 1] when ``x`` repeats each entry of ``t``'s rows twice along its
    last axis (torch's ``repeat_interleave(t, 2, -1)``: broadcast to [..., h, 2], flattened),
    else None. GPT-J's cos/sin tables are such repeats; computed, not constant, when the
    positions are a symbolic range (``dynamic=True``). Under the evens-then-odds permutation
    such a table is ``t`` twice: a Concat of its halves, no gather."""
    if not x.type.rank:
        return None
    v = x  # up through views that keep the last axis (unit axes added or dropped)
    while v.producer is not None and v.producer.op in ("Reshape", "ExpandDims") and \
            v.producer.inputs[0].type.rank and v.producer.inputs[0].shape[-1] == x.shape[-1]:
        if v.producer.inputs[0].producer is not None and \
                v.producer.inputs[0].producer.op == "BroadcastTo":
            break
        v = v.producer.inputs[0]
    p = v.producer
    b = p.inputs[0].producer if p is not None and p.op == "Reshape" else None
    if b is None or b.op != "BroadcastTo":
        return None
    y, wide = b.inputs[0], tuple(b.outputs[0].shape)
    h = wide[-2] if len(wide) >= 2 else None
    if y.type.rank != len(wide) or y.shape[-1] != 1 or wide[-1] != 2 or \
            tuple(y.shape[:-1]) != wide[:-1] or not isinstance(h, int) or \
            tuple(v.shape) != (*wide[:-2], 2 * h):
        return None
    return y


def _scalar_mul(u: Node, v: Value) -> bool:
    """A product by one constant number (the attention's scale, which an ONNX export applies
    to Q and to Kᵀ): the same for every feature, so a permutation passes through it."""
    if u.op != "Mul" or len(u.inputs) != 2:
        return False
    other = u.inputs[1] if u.inputs[0] is v else u.inputs[0]
    arr = const_array(other)
    return arr is not None and arr.size == 1 and u.outputs[0].type == v.type


def _to_attention(graph: Graph, v: Value, d: int) -> tuple[Node, int] | None:
    """(FusedAttention or the product Q·Kᵀ, operand index) that ``v`` reaches through views
    keeping its last axis (the head's features) as it is, and products by one number, with
    no other use on the way; None otherwise. Kᵀ may be explicit: a transpose putting the
    features second-last, then the product's second operand read as it is."""
    swapped = False  # the features now the second-last axis (an explicit Kᵀ)
    while True:
        if len(v.uses) != 1 or graph.is_output(v):
            return None
        u, i = v.uses[0]
        if u.op in ("MatMul", "BatchMatMul") and not u.attrs.get("transpose_a"):
            if swapped:  # (Kᵀ [.., d, s]: summed over its rows)
                return (u, 1) if i == 1 and not u.attrs.get("transpose_b") else None
            if i == 0 or u.attrs.get("transpose_b"):
                return (u, i) if i in (0, 1) else None  # (Q·Kᵀ: a sum over the features)
            return None
        if u.op == "FusedAttention" and not swapped:
            return (u, i) if i in (0, 1) else None
        if _scalar_mul(u, v):
            v = u.outputs[0]
            continue
        out, r = u.outputs[0], v.type.rank
        if u.op == "Transpose" and not swapped and r >= 2 and \
                u.attrs["perm"][-2] % r == r - 1:  # (the features to the rows of Kᵀ)
            swapped, v = True, out
            continue
        if swapped or len(u.outputs) != 1 or out.shape[-1] != d or tuple(v.shape[-1:]) != (d,):
            return None
        if u.op == "Transpose" and u.attrs["perm"][-1] % v.type.rank != v.type.rank - 1:
            return None
        if u.op not in VIEW_OPS | {"Transpose", "BroadcastTo"} and not (
                u.op == "Concat" and len(u.inputs) == 1):
            return None
        v = out


def _live_uses(graph: Graph, v: Value) -> list[Node]:
    """The nodes reading ``v`` whose results are read or returned (a dead use is dce's)."""
    return [u for u, _ in v.uses if any(x.uses or graph.is_output(x) for x in u.outputs)]


def find(graph: Graph) -> dict[int, list[Rotary]]:
    """Interleaved rotaries reaching the Q or K of an attention (a FusedAttention, or the
    product Q·Kᵀ), by attention node id."""
    found: dict[int, list[Rotary]] = {}
    for node in graph.nodes:
        pair = _pair_slice(node)
        if pair != 0:
            continue
        root = node.inputs[0]
        n = root.shape[-1]
        p = root.producer
        cols = _columns(p) if p is not None else None
        view = None  # the heads moved ([B, N, S, D]) before the rotated features are sliced
        if cols is not None:
            if cols[0] != 0:
                continue
            head = p.inputs[0]
            t = head.producer
            if t is not None and t.op == "Transpose" and \
                    t.attrs["perm"][-1] % head.type.rank == head.type.rank - 1:
                view, head = head, t.inputs[0]
        elif p is not None and p.op == "Transpose" and \
                p.attrs["perm"][-1] == root.type.rank - 1:
            head = p.inputs[0]  # rotated with the heads' axis moved ([B, N, S, D]), features last
        else:
            head = root
        proj, columns = _projection(head), None
        if proj is None:  # each head's features cut from a fused product (CodeGen's QKV)
            columns = _source_columns(graph, head)
            proj = None if columns is None else (columns.product, columns.bias)
        if proj is not None and _returned(graph, head, proj[0].outputs[0]) or \
                graph.is_output(root):
            continue  # (a graph output shows the projection's features in their places)
        if proj is None or any(any(id(r.root) == id(root) for r in rs)
                               for rs in found.values()):
            continue
        # the head's other uses: only its features past the rotated ones (those of the moved
        # heads when the slices read them, the Transpose then being the head's one use)
        if view is not None:
            if _live_uses(graph, head) != [view.producer] or graph.is_output(view):
                continue
            others = [u for u in _live_uses(graph, view) if u is not p]
        else:
            others = [] if head is root else [  # (every use of the root: the region's)
                u for u in _live_uses(graph, head) if u is not p]
        if any(_columns(u) is None or _columns(u)[0] < n for u in others):
            continue
        got = _region(graph, root)
        if got is None:
            continue
        nodes, _, kinds, exit_ = got
        attn = _to_attention(graph, exit_, head.shape[-1])
        if attn is None:
            continue
        order = {id(m): k for k, m in enumerate(graph.nodes)}
        nodes.sort(key=lambda m: order[id(m)])
        r = Rotary(root, n, head, proj[0], proj[1], kinds, nodes, exit_, columns)
        found.setdefault(id(attn[0]), []).append(r)
    return found


def _perm(n: int) -> np.ndarray:
    """New feature j of the rotated part is old feature perm[j]: evens, then odds."""
    return np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)])


def _permute_rows(arr: np.ndarray, heads: int, d: int, n: int, axis: int) -> np.ndarray:
    idx = np.arange(heads * d).reshape(heads, d)
    idx[:, :n] = idx[:, :n][:, _perm(n)]
    return np.take(arr, idx.reshape(-1), axis=axis)


def _const(graph: Graph, like: Node, arr: np.ndarray) -> Value:
    return graph.add_node("Constant", [], {"value": np.ascontiguousarray(arr)},
                          name=graph.fresh_name(f"{like.name}/pairs_c"),
                          origin=like.origin).outputs[0]


def rewrite(graph: Graph, r: Rotary, tables: dict[int, Value]) -> None:
    """Permute the projection's rows and rebuild the rotary in split-half form; ``tables``
    keeps the permuted repeated tables, which every rotary of the graph shares."""
    heads, d, n = r.head.shape[-2], r.head.shape[-1], r.n
    mm = r.product

    def permuted(arr: np.ndarray, axis: int) -> np.ndarray:
        if r.columns is not None:  # (every group of the product's columns: one head's)
            return _permute_columns(arr, r.columns, n, axis)
        return _permute_rows(arr, heads, d, n, axis)

    # (read again: Q and K cut from one product permute its disjoint columns in turn)
    w = permuted(const_array(mm.inputs[1]), 0 if mm.attrs.get("transpose_b") else 1)
    graph.replace_input(mm, 1, _const(graph, mm, w))
    if r.bias is not None:
        k = next(i for i, x in enumerate(r.bias.inputs) if const_array(x) is not None)
        b = permuted(const_array(r.bias.inputs[k]), 0)
        graph.replace_input(r.bias, k, _const(graph, r.bias, b))
    perm = _perm(n)
    new: dict[int, Value] = {}

    def get(x: Value, at: Node) -> Value:
        if id(x) in new:
            return new[id(x)]
        arr = const_array(x)
        full = id(x) not in r.kinds and r.kinds.get(id(at.outputs[0])) == FULL
        if full and arr is not None and arr.ndim and arr.shape[-1] == n:
            return _const(graph, at, np.take(arr, perm, axis=-1))
        t = _pair_repeat(x) if full and arr is None and x.shape[-1] == n else None
        if t is not None and id(x) in tables:
            return tables[id(x)]
        if t is not None:  # the repeated table permuted: its half twice
            half = graph.add_node("Reshape", [t], {"shape": list(x.shape[:-1]) + [n // 2]},
                                  name=graph.fresh_name(f"{at.name}/pairs_t"),
                                  origin=at.origin).outputs[0]
            tables[id(x)] = graph.add_node("Concat", [half, half], {"axis": x.type.rank - 1},
                                           name=graph.fresh_name(f"{at.name}/pairs_t"),
                                           origin=at.origin).outputs[0]
            return tables[id(x)]
        return x

    for m in r.nodes:
        name = graph.fresh_name(f"{m.name}/pairs")
        pair = _pair_slice(m)
        if pair is not None:
            half = n // 2
            v = graph.add_node("StridedSlice", [get(m.inputs[0], m)],
                               {"begin": [pair * half], "end": [pair * half + half],
                                "strides": [1], "axes": [_last(m)]},
                               name=name, origin=m.origin).outputs[0]
        elif m.op == "Reshape" and _interleave(m) is not None:
            a, b = _interleave(m)
            v = graph.add_node("Concat", [get(a, m), get(b, m)],
                               {"axis": m.outputs[0].type.rank - 1},
                               name=name, origin=m.origin).outputs[0]
        else:
            v = graph.add_node(m.op, [get(x, m) for x in m.inputs], dict(m.attrs), name=name,
                               origin=m.origin).outputs[0]
        new[id(m.outputs[0])] = v
    graph.replace_all_uses(r.exit, new[id(r.exit)])


def rotary_pairs(graph, ctx) -> PassResult:
    """Rewrite interleaved rotary (x[..., ::2], x[..., 1::2], stacked back) on Q and K →
    split-half rotary on Q and K with their features permuted alike (evens, then odds) in
    the frozen projection weights, when both reach one attention (a FusedAttention or
    Q·Kᵀ) and nothing else; and pairs read only by their two slices (written back as halves)
    → the halves of that value, its features permuted in the frozen product making it."""
    notes, done = [], set()
    tables: dict[int, Value] = {}  # repeated cos/sin tables, permuted (read where FULL)
    for rs in find(graph).values():
        qk = {_to_attention(graph, r.exit, r.head.shape[-1])[1] for r in rs}
        if len(rs) != 2 or qk != {0, 1} or len({(r.n, r.head.shape[-1]) for r in rs}) != 1:
            continue  # both Q and K alike, or neither
        if not ctx.should_apply(f"rotary pairs {rs[0].exit.name}, {rs[1].exit.name}",
                                [r.product for r in rs]):
            continue
        for r in rs:
            rewrite(graph, r, tables)
            done.add(id(r.root))
        notes.append(f"{rs[0].product.name}, {rs[1].product.name}: interleaved rotary of "
                     f"{rs[0].n} features as halves")
    for root, cols, slices in pairs_apart(graph, done):
        if not ctx.should_apply(f"rotary pairs {root.name}", [cols.product]):
            continue
        rewrite_apart(graph, root, cols, slices)
        notes.append(f"{cols.product.name}: pairs of {root.shape[-1]} features read as halves")
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'attention')} with split-half rotary")


# ---------------------------------------------------------------- pairs read apart
@dataclass
class Columns:
    """Where the features of the pairs' source sit in the product's output: feature j of the
    source is column ``off + j + g * period`` of the product's last axis, for every group g."""

    product: Node
    bias: Node | None
    off: int
    period: int


def _along(v: Value, child: Value, at: tuple[int, int]) -> bool:
    """Whether every use of ``v`` other than the one making ``child`` reads columns of the last
    axis outside ``[at[0], at[1])`` (a step-1 StridedSlice; a Split's other parts are its own
    outputs)."""
    for u, _ in v.uses:
        if any(o is child for o in u.outputs) or not any(x.uses for x in u.outputs):
            continue
        cols = _columns(u)
        if cols is None or not (cols[1] <= at[0] or cols[0] >= at[1]):
            return False
    return True


def _source_columns(graph: Graph, root: Value) -> Columns | None:
    """The product columns of ``root``'s features, walking up through column slices, Splits of
    the last axis, Reshapes that split the last axis into groups and Transposes keeping it;
    None when another reader could see the permutation or no frozen product makes them."""
    n = root.shape[-1]
    v, off, period = root, 0, n
    while True:
        p = v.producer
        if p is None or graph.is_output(v):
            return None
        if p.op in ("MatMul", "BatchMatMul", "Add"):
            break
        x = p.inputs[0]
        if not x.type.rank or not isinstance(x.shape[-1], int):
            return None
        w = x.shape[-1]
        if p.op == "StridedSlice":
            cols = _columns(p)
            if cols is None or period != v.shape[-1]:
                return None  # (a slice of a value already split into groups)
            off += cols[0]
            period = w
        elif p.op == "Split" and p.attrs["axis"] % x.type.rank == x.type.rank - 1:
            if period != v.shape[-1]:
                return None
            off += sum(p.attrs["sizes"][:p.outputs.index(v)])
            period = w
        elif p.op in ("Reshape", "ExpandDims"):  # rows kept, or each split into groups
            d = v.shape[-1]
            if w != d and (w % d or v.type.rank < 2 or v.shape[-2] != w // d):
                return None
        elif p.op != "Transpose" or p.attrs["perm"][-1] % x.type.rank != x.type.rank - 1:
            return None  # (a Transpose keeping the last axis keeps the rows)
        others = any(u is not p and any(y.uses for y in u.outputs) for u, _ in x.uses)
        if off + n > period or others and (period != w or not _along(x, v, (off, off + n))):
            return None
        v = x
    bias = None
    if p.op == "Add":
        c = [y for y in p.inputs if const_array(y) is not None]
        rest = [y for y in p.inputs if const_array(y) is None]
        if len(c) != 1 or len(rest) != 1 or c[0].type.rank != 1 or len(rest[0].uses) != 1:
            return None
        bias, p = p, rest[0].producer
        if p is None:
            return None
    weight = const_array(p.inputs[1]) if p.op in ("MatMul", "BatchMatMul") else None
    if weight is None or weight.ndim != 2 or p.attrs.get("transpose_a") or \
            len(p.outputs[0].uses) != 1 or p.outputs[0].shape[-1] % period:
        return None
    return Columns(p, bias, off, period)


def _interleaved_after(s: Node, depth: int = 8) -> bool:
    """Whether the pairs from slice ``s`` are stacked back (GPT-J's interleave) within a few
    elementwise steps: those are rewritten by ``find``/``rewrite``, or left as they are."""
    frontier, seen = [s], 0
    while frontier and seen < depth * 4:
        m = frontier.pop()
        seen += 1
        for u, _ in m.outputs[0].uses:
            if _stacked(u) is not None:
                return True
            if ops.get(u.op).kind == OpKind.ELEMWISE and len(u.outputs) == 1:
                frontier.append(u)
    return False


def pairs_apart(graph: Graph, done: set[int]) -> list[tuple[Value, Columns, list[Node]]]:
    """(source, its product columns, its two pair slices) for every value read only by its
    even and odd pair slices, the pairs not stacked back; sources in ``done`` are skipped."""
    found = []
    for root in {id(n.inputs[0]): n.inputs[0] for n in graph.nodes
                 if _pair_slice(n) is not None}.values():
        if id(root) in done or not isinstance(root.shape[-1], int):
            continue
        slices = [u for u, _ in root.uses if any(x.uses for x in u.outputs)]
        if len(slices) != 2 or {_pair_slice(u) for u in slices} != {0, 1} or \
                any(_interleaved_after(u) for u in slices):
            continue
        cols = _source_columns(graph, root)
        if cols is not None:
            found.append((root, cols, slices))
    return found


def _permute_columns(arr: np.ndarray, c: Columns, n: int, axis: int) -> np.ndarray:
    idx = np.arange(arr.shape[axis])
    groups = arr.shape[axis] // c.period
    for g in range(groups):
        at = g * c.period + c.off
        idx[at:at + n] = idx[at:at + n][_perm(n)]
    return np.take(arr, idx, axis=axis)


def rewrite_apart(graph: Graph, root: Value, c: Columns, slices: list[Node]) -> None:
    """Permute the product's columns of ``root``'s features; its pair slices become halves."""
    n, mm = root.shape[-1], c.product
    axis = 0 if mm.attrs.get("transpose_b") else 1
    graph.replace_input(mm, 1, _const(graph, mm, _permute_columns(
        const_array(mm.inputs[1]), c, n, axis)))
    if c.bias is not None:
        k = next(i for i, x in enumerate(c.bias.inputs) if const_array(x) is not None)
        graph.replace_input(c.bias, k, _const(graph, c.bias, _permute_columns(
            const_array(c.bias.inputs[k]), c, n, 0)))
    for s in slices:
        half = n // 2 * _pair_slice(s)
        v = graph.add_node("StridedSlice", [root], {"begin": [half], "end": [half + n // 2],
                                                    "strides": [1], "axes": [_last(s)]},
                           name=graph.fresh_name(f"{s.name}/pairs"), origin=s.origin)
        graph.replace_all_uses(s.outputs[0], v.outputs[0])
