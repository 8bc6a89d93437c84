"""Attention with sinks → plain attention whose output is scaled per row by the sink's share.

GPT-OSS (and other decoders with attention sinks) joins one learned logit per head to every
row of scores before the softmax and drops its column after it::

    C = cat(S, sink)            S: the scores [.., S1, S2]; sink [.., S1, 1]
    P = softmax(C - max(C))[..., :S2]
    O = P · V

The softmax's denominator gains ``exp(sink - m)``: with ``m = max(S)``,
``e = exp(S - m)`` and ``z = sum(e)``, ``P = e / (z + exp(sink - m))``, that is
``softmax(S) * w`` with ``w = z / (z + exp(sink - m))`` one number per row, so
``O = (softmax(S) · V) * w``. The scores' softmax times V is what the fused attention
operator computes, and ``m`` and ``z`` are its softmax statistics (``attention`` reads them
from the operator when they are all the rest of the graph needs); ``w`` and the product are
a small vector epilogue. Shift invariance makes the model's own ``- max(C)`` vanish; a row
whose every key is masked out gets zeros (``z`` is 0) as the original gives (its weight all on
the sink). Left alone when the probabilities are read by anything but the product with V
(a training forward keeping them for the backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import VIEW_OPS
from graphkernel.passes.attention import reduces_last_axis, softmax_input
from graphkernel.registry import PassResult, counted


@dataclass
class Sinks:
    """One attention with sinks: the product P·V, the scores S and the sink column."""

    pv: Node
    scores: Value
    sink: Value


def _single(v: Value) -> bool:
    return len(v.uses) == 1


def _row_of(r: Value, c: Value) -> bool:
    """Whether ``r`` is one value per row of ``c`` (its max along the last axis: a ReduceMax
    keeping the axis, or a TopK of 1 along it)."""
    p = r.producer
    if p is None or p.inputs[0] is not c or not r.shape or r.shape[-1] != 1:
        return False
    if p.op == "ReduceMax":
        return reduces_last_axis(p)
    return p.op == "TopK" and p.attrs["k"] == 1 and p.attrs["largest"] and \
        p.attrs["axis"] % c.type.rank == c.type.rank - 1 and r is p.outputs[0]


def match(graph: Graph, pv: Node) -> Sinks | None:
    """The sink form ending at the product ``pv`` (P·V), else None."""
    if pv.op != "BatchMatMul" or pv.attrs["transpose_a"] or pv.attrs["transpose_b"] or \
            graph.is_output(pv.outputs[0]):
        return None
    p = pv.inputs[0]
    while p.producer is not None and p.producer.op in VIEW_OPS and _single(p):
        p = p.producer.inputs[0]
    cut = p.producer
    if cut is None or cut.op != "StridedSlice" or not _single(p) or graph.is_output(p):
        return None
    probs = cut.inputs[0]
    a, rank = cut.attrs, probs.type.rank
    if len(a["begin"]) != 1 or (a["strides"] or [1])[0] != 1 or a["begin"][0] != 0 or \
            (a["axes"][0] if a["axes"] is not None else 0) % rank != rank - 1 or \
            not _single(probs) or graph.is_output(probs):
        return None
    seen: list[Node] = []
    c = softmax_input(probs, seen)
    if c is None or any(n.op == "Cast" for n in seen):
        return None  # (a softmax in another precision: not taken)
    inside = {id(n) for n in seen} | {id(cut)}
    if any(graph.is_output(v) or any(id(u) not in inside for u in v.users)
           for n in seen for v in n.outputs):
        return None  # the softmax's parts are read elsewhere
    sub = c.producer
    if sub is not None and sub.op == "Sub" and all(id(u) in inside for u in c.users) and \
            _row_of(sub.inputs[1], sub.inputs[0]):
        c = sub.inputs[0]  # the model's own max subtracted: the softmax does it again
    cat = c.producer
    if cat is None or cat.op != "Concat" or len(cat.inputs) != 2 or \
            cat.attrs["axis"] % rank != rank - 1:
        return None
    scores, sink = cat.inputs
    n = scores.shape[-1]
    width = probs.shape[-1]
    if sink.shape[-1] != 1 or not isinstance(n, int) or not isinstance(width, int) or \
            slice(0, a["end"][0]).indices(width)[1] != n or scores.dtype != sink.dtype or \
            not scores.dtype.is_float:
        return None
    return Sinks(pv, scores, sink)


def rewrite(graph: Graph, m: Sinks) -> Value:
    """Build ``(softmax(S) · V) * z / (z + exp(sink - max(S)))`` in place of P·V."""
    pv, last = m.pv, m.scores.type.rank - 1
    base = pv.name

    def add(op: str, ins: list[Value], attrs: dict | None = None) -> Value:
        return graph.add_node(op, ins, attrs or {}, name=graph.fresh_name(f"{base}/sinks_{op}"),
                              origin=pv.origin).outputs[0]

    row = {"axis": [last], "keep_dims": True}
    top = add("ReduceMax", [m.scores], row)
    e = add("Exp", [add("Sub", [m.scores, top])])
    z = add("ReduceSum", [e], row)
    p = add("Div", [e, z])
    if tuple(p.shape) != tuple(pv.inputs[0].shape):
        p = add("Reshape", [p], {"shape": list(pv.inputs[0].shape)})
    o = add("BatchMatMul", [p, pv.inputs[1]], dict(pv.attrs))
    graph.replace_all_uses(pv.outputs[0], o)
    w = add("Div", [z, add("Add", [z, add("Exp", [add("Sub", [m.sink, top])])])])
    if list(w.shape) != [*o.shape[:-1], 1]:
        w = add("Reshape", [w], {"shape": [*o.shape[:-1], 1]})
    v = o  # the share is taken where the output's views and head merge end (the fused
    # attention writes its output through them), moved alike
    while len(v.uses) == 1 and not graph.is_output(v):
        u = v.uses[0][0]
        out = u.outputs[0]
        if u.op in VIEW_OPS and out.type.rank and out.shape[-1] == v.shape[-1]:
            w = add("Reshape", [w], {"shape": [*out.shape[:-1], 1]})
        elif u.op == "Transpose" and u.attrs["perm"][-1] % v.type.rank == v.type.rank - 1:
            w = add("Transpose", [w], {"perm": list(u.attrs["perm"])})
        else:
            break
        v = out
    uses = list(v.uses)
    out = add("Mul", [v, w])
    for user, i in uses:
        graph.replace_input(user, i, out)
    return out


def attention_sinks(graph, ctx) -> PassResult:
    """Rewrite softmax(cat(S, sink) - max)[..., :-1] · V → (softmax(S) · V) * w with
    w = z / (z + exp(sink - m)) from the scores' row max m and sum z, when nothing else reads
    the probabilities; the attention pass then takes softmax(S) · V (and m, z) as one fused
    attention."""
    notes = []
    for pv in [n for n in graph.nodes if n.op == "BatchMatMul"]:
        m = match(graph, pv)
        if m is None or not ctx.should_apply(f"attention sinks {pv.name}", [pv]):
            continue
        rewrite(graph, m)
        notes.append(f"{pv.name}: sinks as the output's per-row share")
    if notes:
        graph.remove_dead()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'attention')} with sinks as an epilogue")
