"""Rewrite a mixture of experts' sort-based token permutation → the vendor's routing ops.

A MoE layer that runs its experts as grouped products (transformers' ``grouped_mm`` experts,
and any program written the same way) routes N tokens to K experts each by sorting the
flattened expert ids [N*K] and permuting around the products:

    ids_s, perm = sort(ids.flatten())              # TopK of the whole axis, ascending
    x_s = x[perm // K]                             # each pair's token row, by expert
    offs = running count of ids_s per expert       # histc + cumsum, bincount + cumsum, ...
    y = experts(x_s, offs)                         # GroupedMatMul ... GroupedMatMul
    inv[perm] = arange(N*K)                        # the inverse permutation
    out = (y * w.flatten()[perm][:, None])[inv].view(N, K, H).sum(1)

Traced, that is about a dozen launches of index arithmetic, gathers and scatters. This pass
finds it by its data flow and rewrites it to the vendor's three routing operators
(graphkernel/opdefs/experts.py): ``MoeInitRouting`` (the sort and the rows by expert, and
where each pair went), ``MoeComputeExpertTokens`` (the groups' ends) and
``MoeFinalizeRouting`` (the rows back in token order, weighted and summed per token). The
order of the pairs within one expert does not matter to the result, and both sides sort
stably anyway. ``offs`` is accepted in whatever way the program counts it when, computed
from the sorted ids alone, it gives each expert's running count on random sorted ids (the
check scan.py makes for scans). The expert ids must come from a TopK over the experts, or
be a Concat of such ids (experts picked one by one: so that every id names one of the E
experts the products have), and every piece must have the shape the pattern gives it;
anything else is left as it is.

The router in front, a softmax over the experts and the TopK of its K largest (the picked
weights perhaps divided by their sum), becomes the vendor's gating operator
``MoeGatingTopKSoftmax`` (renorm 1 where the division is there) when every reader of the
ids casts them to int32 (as the routing operators read them): one launch in place of the
softmax, the TopK, the division and the cast. A TopK over the experts read for its ids
alone (its values unread, its ids cast to int32 and perhaps gathering the weights: DeepSeek's
ranking of biased scores) is the gating operator's ids (renorm 1: a TopK of the scores).

A router that picks its experts one by one (the max of the scores, then the max of the
scores with that expert set to -inf, ...: PhiMoE's sparsemixer) and concatenates the picks'
ids for the routing operators picks the top K of the scores: the ids become the gating
operator's (renorm 1: the K largest scores, the lower expert first on ties, as torch's max),
and each pick the vector ops of its data flow (its max a ReduceMax; its expert the lowest one
holding that max, or the first NaN; a one-hot mask over the experts, which masks the expert
out of the next pick's scores and turns the pick's gathers into masked sums), which fuse with
the router's own vector work. Assumed (not checked): no score is -inf where a pick must
choose among -inf scores (there torch's max may pick the expert already masked out, the
gating operator the next one).

A group-limited router (DeepSeek-V3's: the experts ranked by their sigmoid or softmax scores
plus a bias, only within the k_group best of G groups, each group scored by its best expert or
its best two's sum, the others masked to -inf through a Scatter of the best groups' ids
spread over their experts) is the vendor's ``MoeGatingTopK``: its ids the ranking's, and its
weights the program's when it divides the gathered picked scores by their sum plus eps
(perhaps then scaled). Ties rank the lower group and expert first, as the other gating
operator.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops
from graphkernel.interpreter import run_graph
from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.passes.attention import reduces_last_axis, softmax_input
from graphkernel.passes.rewrite import reads_node
from graphkernel.registry import PassResult, counted

TRIALS = 3  # random sorted id vectors the running count is checked on


def _const(v: Value) -> np.ndarray | None:
    p = v.producer
    return None if p is None or p.op != "Constant" else np.asarray(p.attrs["value"])


def _through_views(v: Value) -> Value:
    """``v`` before the Reshapes and same-shape BroadcastTos that only rename it."""
    while v.producer is not None and v.producer.op in ("Reshape", "BroadcastTo") and \
            tuple(v.producer.inputs[0].shape) == tuple(v.shape):
        v = v.producer.inputs[0]
    return v


def _users(v: Value) -> list[Node]:
    return list(dict.fromkeys(v.users))


def _past_views(v: Value) -> list[Node]:
    """The users of ``v`` past the Reshapes and same-shape BroadcastTos that rename it."""
    out = []
    for u in _users(v):
        if u.op in ("Reshape", "BroadcastTo") and tuple(u.output.shape) == tuple(v.shape):
            out += _past_views(u.output)
        else:
            out.append(u)
    return out


def _sort(n: Node) -> tuple[Value, int, int] | None:
    """(ids [N, K], N, K) when ``n`` is an ascending sort (a TopK of the whole axis) of
    expert ids [N, K] flattened, picked by a TopK over the experts."""
    if n.op != "TopK" or n.attrs["largest"] or n.inputs[0].type.rank != 1:
        return None
    flat = n.inputs[0]
    if not flat.dtype.is_int or n.attrs["k"] != flat.shape[0]:
        return None
    r = flat.producer
    if r is None or r.op != "Reshape" or r.inputs[0].type.rank != 2:
        return None
    ids = r.inputs[0]
    if _experts(ids) is None:
        return None
    nn, k = ids.shape
    return (ids, nn, k) if isinstance(nn, int) and isinstance(k, int) else None


def _experts(ids: Value) -> int | None:
    """E when every id of ``ids`` names one of E experts: the indices of a TopK over a last
    axis of E scores, or a Concat along the last axis of such ids (a router that picks its
    experts one by one: PhiMoE's sparsemixer, a TopK of one after masking the first)."""
    p = ids.producer
    if p is None or ids.type.rank < 1:
        return None
    if p.op == "TopK" and ids is p.outputs[1]:
        scores = p.inputs[0]
        e = scores.shape[-1]
        if p.attrs["axis"] % scores.type.rank != scores.type.rank - 1 or not isinstance(e, int):
            return None
        return e
    if p.op == "Concat" and p.attrs["axis"] % ids.type.rank == ids.type.rank - 1:
        got = {_experts(x) for x in p.inputs}
        return got.pop() if len(got) == 1 and None not in got else None
    return None


def _gather0(u: Node, index: Value) -> bool:
    return u.op == "Gather" and u.attrs.get("axis", 0) == 0 and u.inputs[1] is index


def _pieces(perm: Value, n: int, k: int) -> dict | None:
    """The permutation's uses: the rows by expert (``x[perm // K]``), the weights by expert
    (``w[perm]``) and the inverse permutation (``inv[perm] = arange``)."""
    s = n * k
    found: dict = {}
    for u in _users(perm):
        if u.op == "FloorDiv" and u.inputs[0] is perm and \
                (c := _const(u.inputs[1])) is not None and c.size == 1 and int(c) == k:
            gs = _users(u.output)
            if len(gs) != 1 or not _gather0(gs[0], u.output) or "rows" in found:
                return None
            x = gs[0].inputs[0]
            if x.type.rank != 2 or x.shape[0] != n:
                return None
            found["rows"] = (x, gs[0].output)
        elif _gather0(u, perm) and u.inputs[0].type.rank == 1 and "weights" not in found:
            found["weights"] = (u.inputs[0], u.output)
        elif u.op in ("Reshape", "BroadcastTo") and tuple(u.output.shape) == (s,):
            for sc in _past_views(u.output):
                if sc.op != "ScatterElements" or sc.attrs.get("axis", 0) != 0 or \
                        sc.attrs.get("reduction", "none") != "none" or \
                        _through_views(sc.inputs[1]) is not perm or "inv" in found:
                    return None
                upd = _const(sc.inputs[2])
                if upd is None or upd.shape != (s,) or not np.array_equal(upd, np.arange(s)):
                    return None
                found["inv"] = sc.output
        else:
            return None
    return found if len(found) == 3 else None


def _finish(inv: Value, wsorted: Value, n: int, k: int) -> tuple[Node, Value] | None:
    """(the per-token sum, the expert rows y) of ``(y * w_s[:, None])[inv].view(N, K,
    H).sum(1)``."""
    (g,) = _users(inv) if len(_users(inv)) == 1 else (None,)
    if g is None or not _gather0(g, inv):
        return None
    mul = g.inputs[0].producer
    if mul is None or mul.op != "Mul" or len(_users(mul.output)) != 1:
        return None
    pairs = [(a, b) for a, b in (mul.inputs, mul.inputs[::-1])
             if b.producer is not None and b.producer.op == "ExpandDims" and
             b.producer.inputs[0] is wsorted and tuple(b.shape) == (n * k, 1)]
    if not pairs:
        return None
    y = pairs[0][0]
    if y.type.rank != 2 or y.shape[0] != n * k:
        return None
    (r,) = _users(g.output) if len(_users(g.output)) == 1 else (None,)
    if r is None or r.op != "Reshape" or tuple(r.output.shape) != (n, k, y.shape[1]):
        return None
    (red,) = _users(r.output) if len(_users(r.output)) == 1 else (None,)
    if red is None or red.op != "ReduceSum" or red.attrs.get("keep_dims") or \
            [a % 3 for a in (red.attrs.get("axis") or [])] != [1]:
        return None
    return red, y


def _region(graph: Graph, start: Value) -> list[Node]:
    inside, region = {id(start)}, []
    for n in graph.nodes:
        if n.op in ("Constant", "Opaque") or not any(id(v) in inside for v in n.inputs):
            continue
        if all(id(v) in inside or _const(v) is not None for v in n.inputs):
            region.append(n)
            inside.update(id(v) for v in n.outputs)
    return region


def _is_running_count(graph: Graph, start: Value, offs: Value, experts: int,
                      seed: int = 0) -> bool:
    """Whether ``offs`` [E], computed from the sorted ids ``start`` alone, is each expert's
    running count (on random sorted ids, as many as the experts allow)."""
    region = _region(graph, start)
    if offs.producer is None or offs.producer not in region:
        return False
    sub = Graph("expert_tokens")
    vmap = {id(start): sub.add_input("ids", start.type)}
    for n in region:
        for v in n.inputs:
            if id(v) not in vmap:
                vmap[id(v)] = sub.clone_node(v.producer, vmap).outputs[0]
        sub.clone_node(n, vmap)
    sub.set_outputs([vmap[id(offs)]])
    rng = np.random.default_rng(seed)
    for t in range(TRIALS):
        ids = np.sort(rng.integers(0, experts if t else 1, start.shape[0]))
        want = np.searchsorted(ids, np.arange(experts), side="right")
        try:
            (got,) = run_graph(sub, [ids.astype(start.dtype.np)])
        except Exception:  # noqa: BLE001 - a region the interpreter cannot run proves nothing
            return False
        if not np.array_equal(np.asarray(got), want):
            return False
    return True


def _offs(graph: Graph, rows: Value, srt: Node) -> tuple[Value, int] | None:
    """(offs, E) of the grouped products reading the rows by expert, when it is the running
    count of the sorted ids."""
    gmm = [u for u in _users(rows) if u.op == "GroupedMatMul" and u.inputs[0] is rows]
    if not gmm or any(u.inputs[2] is not gmm[0].inputs[2] for u in gmm):
        return None
    offs = gmm[0].inputs[2]
    experts = offs.shape[0]
    ids = srt.inputs[0].producer.inputs[0]  # the router's ids [N, K]
    if not isinstance(experts, int) or _experts(ids) != experts or \
            not _is_running_count(graph, srt.outputs[0], offs, experts):
        return None
    return offs, experts


def _read_past(graph: Graph, srt: Node, replaced: frozenset[int]) -> bool:
    """Whether ``srt`` still feeds an output (or an in-place write) once the ``replaced``
    values (the routed rows, the running count, the per-token sum) are the operators': then
    its permutation is observed beside the operators' own, and the two must agree on ties."""
    written = [x for n in graph.nodes if ops.get(n.op).writes for x in n.inputs]
    return reads_node([*graph.outputs, *written], srt, replaced)

def _rewrite(graph: Graph, srt: Node, ids: Value, n: int, k: int, x: Value, rows: Value,
             w: Value, y: Value, red: Node, offs: Value, experts: int) -> None:
    """The three routing ops in place of the rows by expert, the running count and the
    per-token sum (what else the permutation fed is left dead)."""
    origin = tuple(dict.fromkeys((*srt.origin, *red.origin)))

    def add(op, ins, attrs=None, name="moe", outputs=1):
        node = graph.add_node(op, ins, attrs or {}, name=graph.fresh_name(
            f"{srt.name}/{name}"), origin=origin)
        return node.outputs if outputs > 1 else node.outputs[0]

    i32 = add("Cast", [ids], {"dtype": DType.int32}, "ids")
    pair_rows = (np.arange(k)[None, :] * n + np.arange(n)[:, None]).astype(np.int32)
    ex, where, ids_s = add("MoeInitRouting", [x, graph.const(pair_rows), i32],
                           name="init", outputs=3)
    tokens = add("MoeComputeExpertTokens", [ids_s], {"experts": experts}, "tokens")
    if tokens.dtype != offs.dtype:
        tokens = add("Cast", [tokens], {"dtype": offs.dtype}, "tokens")
    h = y.shape[1]
    scales = add("Reshape", [w], {"shape": [n, k]}, "scales")
    res = _residual(red.output, y)
    skip = graph.const(np.zeros((n, h), y.dtype.np)) if res is None else \
        add("Reshape", [res[1]], {"shape": [n, h]}, "skip")
    out = add("MoeFinalizeRouting", [y, skip, graph.const(
        np.zeros((experts, h), y.dtype.np)), scales, where, i32], name="finalize")
    graph.replace_all_uses(rows, ex)
    graph.replace_all_uses(offs, tokens)
    if res is None:
        graph.replace_all_uses(red.output, out)
    else:  # the residual added in the operator: the sum's Add goes
        total = res[0].output
        graph.replace_all_uses(total, add("Reshape", [out], {"shape": list(total.shape)},
                                          "residual"))


def _residual(total: Value, y: Value) -> tuple[Node, Value] | None:
    """(the Add, the other operand) when the per-token sum (through one Reshape) is only
    added to a value of its own shape and dtype: MoeFinalizeRouting's ``skip`` adds it. (Read
    by the Add alone, the sum cannot be what the other operand is computed from.)"""
    v = total
    users = _users(v)
    if len(users) == 1 and users[0].op == "Reshape":
        v = users[0].output
        users = _users(v)
    if len(users) != 1 or users[0].op != "Add":
        return None
    a = users[0]
    other = a.inputs[1] if a.inputs[0] is v else a.inputs[0]
    if other is v or tuple(other.shape) != tuple(v.shape) or other.dtype != y.dtype or \
            tuple(a.output.shape) != tuple(v.shape):
        return None
    return a, other


def _ties(topk: Node) -> str | None:
    """The gating operators' tie rule for ``topk``'s choice: its own ("first", the lower
    expert; "torch.topk", torch's choice: graphkernel/opdefs/indexing.py), or None for a
    sort's ("torch.sort"), which no gating operator takes."""
    ties = topk.attrs.get("ties", "first")
    return ties if ties in ("first", "torch.topk") else None


def _gating(topk: Node) -> tuple[Value, Node | None, list[Node]] | None:
    """(the logits, the Div renormalising the picked weights or None, the index Casts to
    int32) when ``topk`` picks the K largest of a softmax over the experts (the last axis),
    or the K largest logits that a softmax then reads alone (GPT-OSS's router: renorm 1,
    the Div the softmax's last), and every reader of its indices casts them to int32 (the
    vendor's routing operators' ids, which the gating operator returns as they are: nothing
    new to cast)."""
    a, v = topk.attrs, topk.inputs[0]
    rank = v.type.rank
    if not a["largest"] or rank not in (2, 3) or a["axis"] % rank != rank - 1 or \
            not v.dtype.is_float or not isinstance(v.shape[-1], int) or a["k"] > 1024 or \
            _ties(topk) is None:
        return None
    casts = _users(topk.outputs[1])
    if not casts or any(u.op != "Cast" or u.attrs["dtype"] is not DType.int32 for u in casts):
        return None
    vals = topk.outputs[0]
    if any(o is vals or o is topk.outputs[1] for o in topk.graph.outputs):
        return None  # the TopK's own results are kept: nothing saved
    logits = softmax_input(v, [])
    if logits is None:  # the K largest logits, then a softmax over them (renorm 1)
        after = _softmax_of(vals)
        if after is None or after.output.dtype != v.dtype or \
                tuple(after.output.shape) != tuple(vals.shape):
            return None
        return v, after, casts
    if logits.dtype != v.dtype or tuple(logits.shape) != tuple(v.shape):
        return None
    users = _users(vals)
    div = next((u for u in users if u.op == "Div" and u.inputs[0] is vals), None)
    total = div.inputs[1].producer if div is not None else None
    if total is None or total.op != "ReduceSum" or total.inputs[0] is not vals or \
            not reduces_last_axis(total) or set(users) != {div, total} or \
            _users(total.output) != [div] or tuple(div.output.shape) != tuple(vals.shape):
        div = None
    return logits, div, casts


def _softmax_of(vals: Value) -> Node | None:
    """The Div ending the (expanded) softmax over the last axis that alone reads ``vals``."""
    subs = [u for u in _users(vals) if u.op == "Sub" and u.inputs[0] is vals]
    exps = [u for u in _users(subs[0].output) if u.op == "Exp"] if len(subs) == 1 else []
    divs = [u for u in _users(exps[0].output) if u.op == "Div"] if len(exps) == 1 else []
    if len(divs) != 1:
        return None
    seen: list[Node] = []
    if softmax_input(divs[0].output, seen) is not vals or \
            not {id(u) for u in _users(vals)} <= {id(n) for n in seen}:
        return None
    inner = {id(n) for n in seen} - {id(divs[0])}
    if any(id(u) not in inner and u is not divs[0]
           for n in seen if id(n) in inner for u in _users(n.output)):
        return None  # a piece of the softmax read elsewhere
    return divs[0]


def _ranked(topk: Node) -> list[Node] | None:
    """The readers of the ids of ``topk`` when it ranks the experts' scores (the K largest
    along a static last axis of [N, E] or [B, N, E]) for their ids alone: its values unread,
    its ids cast to int32 (the routing operators' ids) and perhaps read by gathers along the
    last axis (the weights picked by them: DeepSeek's sigmoid scores, ranked after a bias
    and a group mask). The gating operator's ids are those (renorm 1 ranks by the scores
    themselves, the lower expert first on ties, as TopK) and int32 already: its weights go
    unread."""
    a, x = topk.attrs, topk.inputs[0]
    rank = x.type.rank
    vals, ids = topk.outputs
    if topk.op != "TopK" or not a["largest"] or rank not in (2, 3) or \
            a["axis"] % rank != rank - 1 or not x.dtype.is_float or \
            not isinstance(x.shape[-1], int) or not 0 < a["k"] <= min(x.shape[-1], 1024) or \
            vals.users or any(o is vals or o is ids for o in topk.graph.outputs) or \
            _ties(topk) is None:
        return None
    users = _users(ids)
    casts = [u for u in users if u.op == "Cast" and u.attrs["dtype"] is DType.int32]
    gathers = [u for u in users if u.op == "GatherElements" and u.inputs[1] is ids and
               u.inputs[0] is not ids and u.attrs["axis"] % rank == rank - 1]
    return users if casts and len(casts) + len(gathers) == len(users) else None


def _rewrite_ranked(graph: Graph, topk: Node, users: list[Node]) -> None:
    node = graph.add_node("MoeGatingTopKSoftmax", [topk.inputs[0]],
                          {"k": topk.attrs["k"], "renorm": 1, "ties": _ties(topk)},
                          name=graph.fresh_name(f"{topk.name}/gating"), origin=topk.origin)
    ids = node.outputs[1]
    for u in users:
        if u.op == "Cast":
            graph.replace_all_uses(u.outputs[0], ids)
        else:
            graph.replace_input(u, 1, ids)


def _rewrite_gating(graph: Graph, topk: Node, logits: Value, div: Node | None,
                    casts: list[Node]) -> None:
    node = graph.add_node("MoeGatingTopKSoftmax", [logits],
                          {"k": topk.attrs["k"], "renorm": int(div is not None),
                           "ties": _ties(topk)},
                          name=graph.fresh_name(f"{topk.name}/gating"),
                          origin=tuple(dict.fromkeys((*topk.origin, *(
                              div.origin if div is not None else ())))))
    y, ids = node.outputs
    graph.replace_all_uses(div.output if div is not None else topk.outputs[0], y)
    for c in casts:
        graph.replace_all_uses(c.output, ids)


def _pick(n: Node | None) -> Value | None:
    """The scores ``x`` [..., E] when ``n`` is a TopK of one over their last axis (a max and
    its index: torch's ``max(dim=-1)``), E static."""
    if n is None or n.op != "TopK" or n.attrs["k"] != 1 or not n.attrs["largest"] or \
            n.attrs.get("ties", "first") != "first":
        return None  # (the picks take the lowest expert holding the max: torch's max)
    x = n.inputs[0]
    rank = x.type.rank
    if rank < 1 or n.attrs["axis"] % rank != rank - 1 or not x.dtype.is_float or \
            not isinstance(x.shape[-1], int):
        return None
    return x


def _masked_out(x: Value, index: Value) -> bool:
    """Whether ``x`` is ``scatter(scores, -1, index, -inf)``: the scores with the expert
    ``index`` picked masked out (one index per row, the last axis)."""
    p = x.producer
    if p is None or p.op != "ScatterElements" or p.inputs[1] is not index or \
            p.attrs.get("reduction", "none") != "none" or \
            p.attrs["axis"] % x.type.rank != x.type.rank - 1:
        return False
    fill = _const(_through_broadcast(p.inputs[2]))
    return fill is not None and fill.size >= 1 and bool(np.all(np.isneginf(fill)))


def _through_broadcast(v: Value) -> Value:
    while v.producer is not None and v.producer.op in ("BroadcastTo", "Reshape"):
        v = v.producer.inputs[0]
    return v


def _picks(cat: Node) -> list[Node] | None:
    """The TopKs of one whose indices ``cat`` concatenates, when they pick experts one by
    one: the first the max of the scores, each next the max of the scores before it with
    the expert just picked set to -inf (a top-k by repeated selection: PhiMoE's
    sparsemixer), and every reader of the concatenated ids casts them to int32."""
    ids = cat.outputs[0]
    if cat.op != "Concat" or cat.attrs["axis"] % ids.type.rank != ids.type.rank - 1 or \
            len(cat.inputs) < 2 or not ids.type.is_static:
        return None
    tops = [v.producer for v in cat.inputs]
    if any(t is None or t.op != "TopK" or v is not t.outputs[1]
           for t, v in zip(tops, cat.inputs, strict=True)):
        return None
    x = _pick(tops[0])
    if x is None or x.type.rank not in (2, 3) or len(set(map(id, tops))) != len(tops) or \
            len(tops) > x.shape[-1]:
        return None
    for before, t in zip(tops, tops[1:], strict=False):
        if _pick(t) is None or not _masked_out(t.inputs[0], before.outputs[1]) or \
                t.inputs[0].producer.inputs[0] is not before.inputs[0]:
            return None
    users = _users(ids)
    if not users or any(u.op != "Cast" or u.attrs["dtype"] is not DType.int32 for u in users):
        return None
    if any(o is ids for o in cat.graph.outputs):
        return None
    return tops


def _rewrite_picks(graph: Graph, cat: Node, tops: list[Node]) -> None:
    """The concatenated ids as the gating operator's (renorm 1: the ids of a TopK of K, the
    lower expert first on ties, as each pick's max); each pick in floats, from the scores it
    saw: its max a ReduceMax, its expert the lowest one holding that max (or the first NaN,
    which torch's max returns), a one-hot mask over the experts that masks the expert out
    of the next pick's scores (the Scatter of -inf) and reads the pick's gathers (a masked
    sum). Every op is a vector op: the picks and what reads them fuse."""
    x = tops[0].inputs[0]
    k, experts = len(tops), x.shape[-1]
    rank = x.type.rank
    last = [rank - 1]
    origin = tuple(dict.fromkeys(o for t in tops for o in t.origin))

    def add(op, ins, attrs=None, name="pick", outputs=1):
        node = graph.add_node(op, ins, attrs or {}, name=graph.fresh_name(
            f"{tops[0].name}/{name}"), origin=origin)
        return node.outputs if outputs > 1 else node.outputs[0]

    def const(value, dtype) -> Value:
        return graph.const(np.asarray(value, dtype.np), name=graph.fresh_name(
            f"{tops[0].name}/const"), origin=origin)

    _, ids = add("MoeGatingTopKSoftmax", [x], {"k": k, "renorm": 1}, "gating", outputs=2)
    iota = const(np.arange(experts), x.dtype)
    none = const(experts, x.dtype)  # no expert: above every index
    scores = x
    for j, t in enumerate(tops):
        v, i = t.outputs
        top = add("ReduceMax", [scores], {"axis": last, "keep_dims": True}, f"max{j}")
        # the pick's readers get a ReduceMax of their own (the same value): the split model
        # joins a reduction to the vector work after it only when one area reads it
        graph.replace_all_uses(v, add("ReduceMax", [scores], {"axis": last, "keep_dims": True},
                                      f"max{j}"))
        holds = add("LogicalOr", [add("Equal", [scores, top], name=f"holds{j}"),
                                  add("IsNan", [scores], name=f"nan{j}")], name=f"holds{j}")
        first = add("ReduceMin", [add("Select", [holds, iota, none], name=f"at{j}")],
                    {"axis": last, "keep_dims": True}, f"at{j}")
        hot = add("Equal", [iota, first], name=f"hot{j}")
        index = None
        for u in _users(i):
            if u is cat:
                continue
            if j + 1 < k and u is tops[j + 1].inputs[0].producer:
                scores = add("Select", [hot, const(-np.inf, x.dtype), scores],
                             name=f"masked{j}")
                graph.replace_all_uses(u.outputs[0], scores)
            elif u.op == "GatherElements" and u.inputs[1] is i and u.inputs[0] is not i and \
                    u.attrs["axis"] % rank == rank - 1 and \
                    tuple(u.inputs[0].shape) == tuple(x.shape) and u.inputs[0].dtype.is_float:
                y = u.inputs[0]
                picked = add("ReduceSum", [add("Select", [hot, y, const(0, y.dtype)],
                                                name=f"gather{j}")],
                             {"axis": last, "keep_dims": True}, f"gather{j}")
                graph.replace_all_uses(u.outputs[0], picked)
            else:  # read as it is: the id, back in the index's type
                if index is None:
                    index = add("Cast", [add("StridedSlice", [ids], {
                        "begin": [j], "end": [j + 1], "axes": last}, f"index{j}")],
                        {"dtype": i.dtype}, f"index{j}")
                for slot, x_in in enumerate(u.inputs):
                    if x_in is i:
                        graph.replace_input(u, slot, index)
    for c in _users(cat.outputs[0]):
        graph.replace_all_uses(c.outputs[0], ids)


def _uniform(v: Value) -> float | None:
    """The one value every element of a constant ``v`` (seen through broadcasts) holds."""
    c = _const(_through_broadcast(v))
    if c is None or c.size == 0 or not np.all(c == c.reshape(-1)[0]):
        return None
    return float(c.reshape(-1)[0])


def _prod(v: Value, *op_names: str) -> Node | None:
    p = v.producer
    return p if p is not None and p.op in op_names else None


def _sigmoid_of(s: Value) -> Value | None:
    """x when ``s`` is the expanded sigmoid ``1 / (1 + exp(-x))``."""
    r = _prod(s, "Reciprocal")
    add = _prod(r.inputs[0], "Add") if r is not None else None
    if add is None:
        return None
    for e, one in (add.inputs, add.inputs[::-1]):
        c = _const(one)
        exp = _prod(e, "Exp")
        neg = _prod(exp.inputs[0], "Neg") if exp is not None else None
        if neg is not None and c is not None and c.size == 1 and float(c) == 1.0:
            return neg.inputs[0]
    return None


def _router_scores(sv: Value) -> tuple[Value, int, Value, Value | None] | None:
    """(logits x [N, E], norm_type, scores, bias [E] or None) when ``sv`` is sigmoid(x) or
    softmax(x) over the experts, perhaps plus a bias over the experts."""
    cands = [(sv, None)]
    add = _prod(sv, "Add")
    if add is not None:
        cands += [(a, b) for a, b in (add.inputs, add.inputs[::-1])]
    experts = sv.shape[-1]
    for s, b in cands:
        if b is not None:
            b = _through_views(b)
            while b.producer is not None and b.producer.op == "Reshape" and \
                    b.type.numel == experts:
                b = b.producer.inputs[0]
            if tuple(b.shape) != (experts,) or b.dtype != s.dtype or \
                    tuple(add.outputs[0].shape) != tuple(s.shape):
                continue
        x = _sigmoid_of(s)
        norm = 1
        if x is None:
            x, norm = softmax_input(s, []), 0
        if x is not None and x.type.rank == 2 and tuple(x.shape) == tuple(s.shape) and \
                x.dtype == s.dtype:
            return x, norm, s, b
    return None


def _spread(maskf: Value, n_groups: int) -> Value | None:
    """gm [N, G] when ``maskf`` [N, E] is each group's value spread over its E / G experts
    (``gm.unsqueeze(-1).expand(N, G, E // G).reshape(N, E)``)."""
    r = _prod(maskf, "Reshape")
    bc = _prod(r.inputs[0], "BroadcastTo") if r is not None else None
    if bc is None:
        return None
    n, experts = maskf.shape
    if tuple(bc.outputs[0].shape) != (n, n_groups, experts // n_groups):
        return None
    v = bc.inputs[0]
    if tuple(v.shape) != (n, n_groups, 1) or _prod(v, "ExpandDims", "Reshape") is None:
        return None
    gm = v.producer.inputs[0]
    return gm if tuple(gm.shape) == (n, n_groups) else None


def _group_scores(gs: Value, sv: Value) -> int | None:
    """The group_select_mode when ``gs`` [N, G] scores each group of ``sv`` [N, E] (viewed
    [N, G, E / G]) by its best expert (0) or the sum of its best two (1)."""
    red = _prod(gs, "ReduceSum", "ReduceMax")
    sq = _prod(gs, "Squeeze", "Reshape")
    best = _prod(sq.inputs[0], "TopK") if red is None and sq is not None else None
    if best is not None:  # the best expert's score: a TopK of one, its index unread
        v = best.inputs[0]
        if v.type.rank != 3 or best.attrs["k"] != 1 or not best.attrs["largest"] or \
                best.attrs["axis"] % 3 != 2 or best.outputs[1].users or \
                sq.inputs[0] is not best.outputs[0] or tuple(gs.shape) != tuple(v.shape[:2]):
            return None
        red = best
    elif red is None or red.attrs.get("keep_dims"):
        return None
    v = red.inputs[0]
    rank = v.type.rank
    if rank != 3 or (red is not best and
                     [a % rank for a in (red.attrs.get("axis") or [])] != [2]):
        return None
    mode = 0
    if red.op == "ReduceSum":
        top = _prod(v, "TopK")
        if top is None or v is not top.outputs[0] or top.attrs["k"] != 2 or \
                not top.attrs["largest"] or top.attrs["axis"] % 3 != 2 or \
                top.outputs[1].users or _users(v) != [red]:
            return None
        v, mode = top.inputs[0], 1
    r = _prod(v, "Reshape")
    if r is None or _through_views(r.inputs[0]) is not _through_views(sv):
        return None
    return mode


def _renorm(g: Value) -> tuple[Value, float, float] | None:
    """(the result, eps, scale) when the picked scores ``g`` are only divided by their sum
    plus eps, perhaps then scaled by a constant: ``g / (g.sum(-1, keepdim) + eps) * s``."""
    users = _users(g)
    div = next((u for u in users if u.op == "Div" and u.inputs[0] is g), None)
    add = _prod(div.inputs[1], "Add") if div is not None else None
    if add is None or len(_users(add.outputs[0])) != 1:
        return None
    for t, e in (add.inputs, add.inputs[::-1]):
        red = _prod(t, "ReduceSum")
        c = _const(e)
        if red is None or red.inputs[0] is not g or not reduces_last_axis(red) or \
                c is None or c.size != 1 or _users(red.outputs[0]) != [add] or \
                set(map(id, users)) != {id(div), id(red)}:
            continue
        out, scale = div.outputs[0], 1.0
        mul = _users(out)
        if len(mul) == 1 and mul[0].op == "Mul" and \
                (k := _const(mul[0].inputs[1] if mul[0].inputs[0] is out
                             else mul[0].inputs[0])) is not None and k.size == 1:
            out, scale = mul[0].outputs[0], float(k)
        if tuple(out.shape) != tuple(g.shape) or out.dtype != g.dtype:
            return None
        return out, float(c), scale
    return None


def _group_router(topk: Node) -> dict | None:
    """DeepSeek-V3's group-limited router behind ``topk`` (its ids cast to int32 for the
    routing operators, perhaps gathering the picked scores): the experts ranked by the scores
    plus a bias, only those of the k_group best groups (a Scatter of the best groups' ids
    spread over their experts, the others masked to -inf), and, when the picked scores are
    renormalised by their sum, the weights. What the vendor's MoeGatingTopK computes, when it
    takes the shapes."""
    users = _ranked(topk)
    m = topk.inputs[0]
    sel = _prod(m, "Select")
    if users is None or sel is None or m.type.rank != 2:
        return None
    fill = _const(_through_broadcast(sel.inputs[1]))
    if fill is None or fill.size < 1 or not np.all(np.isneginf(fill)) or \
            tuple(sel.inputs[2].shape) != tuple(m.shape):
        return None
    sv, cond = sel.inputs[2], sel.inputs[0]
    nt = _prod(cond, "LogicalNot")
    ne = _prod(nt.inputs[0], "NotEqual") if nt is not None else None
    if ne is None:
        return None
    zero = _const(ne.inputs[1])
    if zero is None or zero.size != 1 or float(zero) != 0.0:
        return None
    maskf = ne.inputs[0]
    found = _router_scores(sv)
    if found is None:
        return None
    x, norm, s, bias = found
    experts = m.shape[-1]
    for n_groups in sorted({d for d in range(1, experts + 1) if experts % d == 0}):
        gm = _spread(maskf, n_groups)
        if gm is not None:
            break
    else:
        return None
    sc = _prod(gm, "ScatterElements")
    if sc is None or sc.attrs.get("reduction", "none") != "none" or sc.attrs["axis"] % 2 != 1:
        return None
    off, on = _uniform(sc.inputs[0]), _uniform(sc.inputs[2])
    gt = _prod(sc.inputs[1], "TopK")
    if off != 0.0 or on is None or on == 0.0 or gt is None or \
            sc.inputs[1] is not gt.outputs[1] or not gt.attrs["largest"] or \
            gt.attrs["axis"] % 2 != 1 or gt.outputs[0].users or _users(gt.outputs[1]) != [sc]:
        return None
    mode = _group_scores(gt.inputs[0], sv)
    if mode is None:
        return None
    ties = _ties(topk)
    if ties is None or _ties(gt) != ties:
        return None  # (one rule for both choices: the operator's attribute)
    attrs = {"k": topk.attrs["k"], "k_group": gt.attrs["k"], "group_count": n_groups,
             "group_select_mode": mode, "norm_type": norm, "ties": ties}
    weights = None
    gathers = [u for u in users if u.op == "GatherElements"]
    if len(gathers) == 1 and _through_views(gathers[0].inputs[0]) is s:
        weights = _renorm(gathers[0].outputs[0])
    if weights is not None:
        attrs |= {"eps": weights[1], "routed_scaling_factor": weights[2]}
    from graphkernel.opdefs.experts import group_gating_refusal

    if group_gating_refusal(experts, attrs) is not None:
        return None
    return {"x": x, "bias": bias, "attrs": attrs, "users": users,
            "weights": weights[0] if weights is not None else None}


def _rewrite_group_router(graph: Graph, topk: Node, r: dict) -> None:
    x = r["x"]
    bias = r["bias"] if r["bias"] is not None else graph.const(
        np.zeros(x.shape[-1], x.dtype.np), name=graph.fresh_name(f"{topk.name}/bias"),
        origin=topk.origin)
    node = graph.add_node("MoeGatingTopK", [x, bias], r["attrs"],
                          name=graph.fresh_name(f"{topk.name}/gating"), origin=topk.origin)
    y, ids = node.outputs
    for u in r["users"]:
        if u.op == "Cast":
            graph.replace_all_uses(u.outputs[0], ids)
        else:
            graph.replace_input(u, 1, ids)
    if r["weights"] is not None:
        graph.replace_all_uses(r["weights"], y)


def moe_routing(graph, ctx) -> PassResult:
    """Rewrite a MoE layer's sort-based token permutation (sort of the expert ids, rows and
    weights gathered by expert, the running count, the inverse permutation and the weighted
    per-token sum) → MoeInitRouting, MoeComputeExpertTokens and MoeFinalizeRouting; its
    router's softmax and TopK → MoeGatingTopKSoftmax."""
    notes = []
    for srt in [n for n in graph.nodes if n.op == "TopK"]:
        if srt.graph is None or (m := _sort(srt)) is None:
            continue
        ids, n, k = m
        pieces = _pieces(srt.outputs[1], n, k)
        if pieces is None:
            continue
        (x, rows), (w, wsorted) = pieces["rows"], pieces["weights"]
        fin = _finish(pieces["inv"], wsorted, n, k)
        found = _offs(graph, rows, srt)
        if fin is None or found is None or w.dtype != fin[1].dtype or \
                x.dtype != fin[1].dtype or not w.type.is_static:
            continue
        (red, y), (offs, experts) = fin, found
        if srt.attrs.get("ties", "first") != "first" and \
                _read_past(graph, srt, frozenset({id(rows), id(offs), id(red.output)})):
            ctx.log(f"{ids.name}: not routed: the sort's permutation is read past the "
                                 "routing (a value kept for the backward): the operators "
                                 "order equal ids by token, torch's sort by its own rule")
            continue
        if not ctx.should_apply(f"MoE routing of {ids.name}", [srt, red]):
            continue
        _rewrite(graph, srt, ids, n, k, x, rows, w, y, red, offs, experts)
        notes.append(f"{ids.name}: {n} tokens x {k} experts of {experts} routed by the "
                     "vendor's init/tokens/finalize operators")
    if notes:  # what the permutation fed is dead: the router's TopK is read by the ids' Cast
        graph.remove_dead()
    gated = 0
    for topk in [n for n in graph.nodes if n.op == "TopK"]:
        if topk.graph is None or (m := _gating(topk)) is None or \
                not ctx.should_apply(f"MoE gating of {topk.name}", [topk]):
            continue
        _rewrite_gating(graph, topk, *m)
        gated += 1
        notes.append(f"{topk.name}: softmax and top-{topk.attrs['k']} of "
                     f"{m[0].shape[-1]} experts"
                     f"{' renormalised' if m[1] is not None else ''} as the vendor's gating "
                     "operator")
    for topk in [n for n in graph.nodes if n.op == "TopK"]:
        if topk.graph is None or (r := _group_router(topk)) is None or \
                not ctx.should_apply(f"MoE group router of {topk.name}", [topk]):
            continue
        _rewrite_group_router(graph, topk, r)
        gated += 1
        a = r["attrs"]
        notes.append(f"{topk.name}: top-{a['k']} of {topk.inputs[0].shape[-1]} experts in the "
                     f"best {a['k_group']} of {a['group_count']} groups as the vendor's "
                     "group-limited gating operator")
    for topk in [n for n in graph.nodes if n.op == "TopK"]:
        if topk.graph is None or (users := _ranked(topk)) is None or \
                not ctx.should_apply(f"MoE ranking of {topk.name}", [topk]):
            continue
        _rewrite_ranked(graph, topk, users)
        gated += 1
        notes.append(f"{topk.name}: top-{topk.attrs['k']} ids of {topk.inputs[0].shape[-1]} "
                     "experts as the vendor's gating operator's")
    if gated:
        graph.remove_dead()
    picked = 0
    for cat in [n for n in graph.nodes if n.op == "Concat"]:
        if cat.graph is None or (tops := _picks(cat)) is None or \
                not ctx.should_apply(f"MoE picks of {cat.name}", tops):
            continue
        _rewrite_picks(graph, cat, tops)
        picked += 1
        notes.append(f"{cat.name}: {len(tops)} experts picked one by one as the top "
                     f"{len(tops)} of the gating operator")
    if picked:
        graph.remove_dead()
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes) - gated, 'MoE routing')} and "
                      f"{counted(gated, 'gating')} as the vendor's operators")
