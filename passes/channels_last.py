"""Rewrite T(conv(T(x))) -> conv_nhwc(x) when a convolution in NHWC leaves fewer Transposes.

ConvNeXt runs its depthwise convolution in NCHW and permutes to NHWC for LayerNorm and the
MLP and back; wav2vec2's 1-D convolutions (a Conv2D of height 1 between ExpandDims and
Squeeze) sit between transposes of [batch, time, channels] data. Each permute is a launch.

Convolutions that feed one another directly form a group, tried together on a copy of the
graph: each becomes T_nchw(conv_nhwc(T_nhwc(x))); the new input transposes move up (through
ExpandDims, and through elementwise ops only they read: T(f(a, b)) = f(T(a), T(b)), a
constant operand transposed at once) and the output transposes move down (through Squeeze,
StridedSlice and elementwise ops whose other operands are transposed alike or constants)
until they meet their inverse and cancel. So in a stack of convolutions each followed by a
norm over the channels between permutes and an activation (data2vec-audio's positional
convolutions: conv, transpose, LayerNorm, transpose, GELU), a convolution's input permute
climbs through the activation before it to the permute that ended the norm before, and
every norm reduces the last axis of NHWC data instead of a middle axis of NCHW data.
The group switches to NHWC when the graph then holds fewer live Transposes; the choice
and its reason are recorded for every convolution next to a permute
(``analyses.layouts``, shown by explain). Exact: a transpose only moves data, and the
convolution sums the same products.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from graphkernel.analyses import LayoutChoice
from graphkernel.ir import Graph, Node, Value
from graphkernel.opdefs.nn import NCHW_TO_NHWC, NHWC_TO_NCHW
from graphkernel.ops import RESHAPE_OPS, OpKind, get, normalize_axes
from graphkernel.passes.rewrite import add_like, const_array, replace_with
from graphkernel.registry import PassResult

UP, DOWN = "up", "down"  # where a transpose moves: towards the producers, or the users
SEARCH = 64  # ops looked at around a convolution for a permute (views, slices, elementwise)


def _perm(n: Node) -> tuple[int, ...]:
    return tuple(n.attrs["perm"])


def _transpose(g: Graph, like: Node, v: Value, perm) -> Value:
    """``v`` transposed by ``perm`` (``v`` itself for the identity)."""
    perm = [int(p) for p in perm]
    if perm == list(range(len(perm))):
        return v
    return add_like(g, like, "Transpose", [v], {"perm": perm})


def _compose(inner: Node, outer_perm) -> list[int]:
    """The perm of T(T(x, inner), outer) as one transpose of x."""
    return [_perm(inner)[p] for p in outer_perm]


def _elementwise(n: Node) -> bool:
    """An elementwise op a transpose passes through: one result, no parameter written, no
    attribute naming a layout (BiasAdd's data_format picks its channel axis)."""
    if n.op == "Constant" or len(n.outputs) != 1:
        return False
    d = get(n.op)
    return d.kind == OpKind.ELEMWISE and not d.writes and "data_format" not in n.attrs


# ------------------------------------------------------------------ moves
def _sink_through(g: Graph, t: Node, user: Node) -> Value | None:
    """``user`` (reading ``t``) computed on t's input, transposed after it; None when ``user``
    is not an op a transpose passes through."""
    p, src = _perm(t), t.inputs[0]
    if user.op == "Transpose":
        return _transpose(g, user, src, _compose(t, _perm(user)))
    if user.op == "Squeeze" and user.attrs["axis"] is not None:
        gone = {p[a] for a in normalize_axes(user.attrs["axis"], len(p))}
        kept = [j for j in range(len(p)) if p[j] not in gone]
        inner = add_like(g, user, "Squeeze", [src], {"axis": sorted(gone)})
        return _transpose(g, user, inner,
                          [p[j] - sum(b < p[j] for b in gone) for j in kept])
    if user.op == "StridedSlice" and user.attrs["axes"] is not None:
        axes = [p[a] for a in normalize_axes(user.attrs["axes"], len(p))]
        inner = add_like(g, user, "StridedSlice", [src], dict(user.attrs) | {"axes": axes})
        return _transpose(g, user, inner, p)
    if not _elementwise(user):
        return None
    inv = list(np.argsort(p))
    operands = []
    for v in user.inputs:
        pv = v.producer
        if pv is not None and pv.op == "Transpose" and _perm(pv) == p:
            operands.append(pv.inputs[0])
            continue
        c = const_array(v)
        if c is None or c.ndim > len(p):
            return None
        if c.size == 1:
            operands.append(v)  # a scalar broadcasts the same in any layout
            continue
        full = c.reshape((1,) * (len(p) - c.ndim) + c.shape)
        operands.append(g.const(np.ascontiguousarray(full.transpose(inv)),
                                name=g.fresh_name(f"{pv.name}_nhwc"), origin=pv.origin))
    inner = add_like(g, user, user.op, operands, dict(user.attrs))
    return _transpose(g, user, inner, p)


def _hoist_through(g: Graph, t: Node) -> Value | None:
    """``t`` moved above its producer (a Transpose it folds with, or an ExpandDims or an
    elementwise op only ``t`` reads); None when it cannot move."""
    prod = t.inputs[0].producer
    if prod is None:
        return None
    if prod.op == "Transpose":
        return _transpose(g, t, prod.inputs[0], _compose(prod, _perm(t)))
    if len(t.inputs[0].uses) != 1:
        return None  # (another reader needs the value as it is)
    if _elementwise(prod) and not g.is_output(t.inputs[0]):
        return _hoist_above_elementwise(g, t, prod)
    if prod.op != "ExpandDims":
        return None
    q = _perm(t)
    added = set(normalize_axes(prod.attrs["axis"], len(q)))
    new_axes = [j for j in range(len(q)) if q[j] in added]
    inner_perm = [q[j] - sum(a < q[j] for a in added) for j in range(len(q)) if q[j] not in added]
    moved = _transpose(g, t, prod.inputs[0], inner_perm)
    return add_like(g, prod, "ExpandDims", [moved], {"axis": new_axes})


def _hoist_above_elementwise(g: Graph, t: Node, prod: Node) -> Value | None:
    """T(f(a, b, ...)) -> f(T(a), T(b), ...) for an elementwise ``f`` only ``t`` reads: each
    operand of the result's rank is transposed (a constant at once, reshaped to that rank
    first; a scalar stays as it is); None when an operand of lower rank is computed (its
    broadcast would need a reshape first). Exact: an elementwise op reads each element at
    the same index in every operand, so permuting all of them permutes its result."""
    p = _perm(t)
    if any(const_array(v) is None and len(v.type.shape) != len(p) for v in prod.inputs) or \
            any(c is not None and c.ndim > len(p) for c in map(const_array, prod.inputs)):
        return None
    operands = []
    for v in prod.inputs:
        c = const_array(v)
        if c is not None:
            if c.size == 1:
                operands.append(v)
                continue
            full = c.reshape((1,) * (len(p) - c.ndim) + c.shape)
            operands.append(g.const(np.ascontiguousarray(full.transpose(p)),
                                    name=g.fresh_name(f"{v.producer.name}_t"),
                                    origin=v.producer.origin))
            continue
        operands.append(_transpose(g, t, v, p))
    return add_like(g, prod, prod.op, operands, dict(prod.attrs))


def _settle(g: Graph, work: deque[tuple[Node, str]]) -> None:
    """Move every transpose of ``work`` in its direction until it cancels or is stuck."""
    while work:
        t, way = work.popleft()
        if t.graph is None:
            continue
        if way == UP:
            prod = t.inputs[0].producer
            new = _hoist_through(g, t)
            if new is not None:
                replace_with(g, t, new)
                if prod.op != "Transpose" and prod.op != "ExpandDims":
                    for v in new.producer.inputs:  # the transposes now on its operands
                        _queue(work, v.producer, UP)
                else:
                    _queue(work, new.producer, UP)
                if prod.op == "Transpose" and prod.outputs[0].uses:
                    work.append((prod, DOWN))  # folded with one reader; the others may follow
                _drop_dead(g, prod)
            continue
        for user, _ in list(dict.fromkeys(t.outputs[0].uses)):
            if user.graph is None or t.graph is None:
                continue
            new = _sink_through(g, t, user)
            if new is None:
                continue
            replace_with(g, user, new)
            _queue(work, new.producer, DOWN)
        if t.graph is not None and not t.outputs[0].uses \
                and not g.is_output(t.outputs[0]):
            src = t.inputs[0].producer
            g.erase_node(t)
            _drop_dead(g, src)


def _queue(work: deque, node: Node | None, way: str) -> None:
    """Queue the transpose that produced a moved op's value (walking down an ExpandDims)."""
    while node is not None and node.op == "ExpandDims":
        node = node.inputs[0].producer
    if node is not None and node.op == "Transpose":
        work.append((node, way))


def _drop_dead(g: Graph, node: Node | None) -> None:
    """Erase ``node`` and the producers it alone kept alive, once nothing reads it."""
    while node is not None and node.graph is not None and node.op != "Constant" \
            and not get(node.op).writes and not any(v.uses for v in node.outputs) \
            and not any(g.is_output(v) for v in node.outputs):
        ins = [v.producer for v in node.inputs]
        g.erase_node(node)
        node = ins[0] if len(ins) == 1 else None


def _switch(g: Graph, names: list[str]) -> None:
    """Run the convolutions ``names`` in NHWC, then settle the transposes that adds."""
    work: deque[tuple[Node, str]] = deque()
    for name in names:
        conv = g.node(name)
        x, rest = conv.inputs[0], list(conv.inputs[1:])
        t_in = _transpose(g, conv, x, NCHW_TO_NHWC)
        nhwc = add_like(g, conv, "Conv2D", [t_in, *rest], dict(conv.attrs) | {"data_format":
                                                                               "NHWC"})
        t_out = _transpose(g, conv, nhwc, NHWC_TO_NCHW)
        replace_with(g, conv, t_out)
        work.append((t_in.producer, UP))
        work.append((t_out.producer, DOWN))
    _settle(g, work)
    for n in list(g.nodes):  # what the moves left unread
        if n.graph is not None and n.op == "Transpose":
            _drop_dead(g, n)


def _live_transposes(g: Graph) -> int:
    outs = {id(v) for v in g.outputs}
    return sum(1 for n in g.nodes if n.op == "Transpose"
               and (n.outputs[0].uses or id(n.outputs[0]) in outs))


# ---------------------------------------------------------------- choices
def _near_permute(conv: Node) -> str | None:
    """The first Transpose found around ``conv``: up its input through views, down its
    output through the ops a transpose passes through; None when there is none."""
    v = conv.inputs[0]
    while v.producer is not None and v.producer.op in RESHAPE_OPS:
        v = v.producer.inputs[0]
    if v.producer is not None and v.producer.op == "Transpose":
        return v.producer.name
    seen, todo = 0, deque([conv.outputs[0]])
    while todo and seen < SEARCH:
        for user, _ in todo.popleft().uses:
            seen += 1
            if user.op == "Transpose":
                return user.name
            if user.op in ("Squeeze", "StridedSlice") or _elementwise(user):
                todo.append(user.outputs[0])
    return None


def _groups(convs: list[Node]) -> list[list[Node]]:
    """Convolutions joined by one reading another's result directly, in graph order."""
    group = {id(c): [c] for c in convs}
    for c in convs:
        src = c.inputs[0].producer
        if src is not None and id(src) in group and group[id(src)] is not group[id(c)]:
            merged = group[id(src)] + group[id(c)]
            for m in merged:
                group[id(m)] = merged
    out, seen = [], set()
    for c in convs:
        if id(group[id(c)][0]) not in seen:
            seen.add(id(group[id(c)][0]))
            out.append(group[id(c)])
    return out


def _reason(names: list[str], name: str, text: str) -> str:
    others = [n for n in names if n != name]
    return text + (f" (switched together with {', '.join(others)})" if others else "")


def _drop_dead_views(graph: Graph) -> int:
    """Erase unread convolutions and views: arith_simplify's rule 17 leaves the ones it
    replaced to dce, and a dead reader of a view would keep a transpose from moving up."""
    outs, dead = {id(v) for v in graph.outputs}, 0
    for n in reversed(graph.nodes):
        if (n.op == "Conv2D" or n.op in RESHAPE_OPS) and not any(v.uses or id(v) in outs
                                                              for v in n.outputs):
            graph.erase_node(n)
            dead += 1
    return dead


def channels_last(graph, ctx) -> PassResult:
    """Rewrite T(conv(T(x))) -> conv_nhwc(x) when a convolution in NHWC leaves fewer
    Transposes (the permutes around ConvNeXt's and wav2vec2's convolutions)."""
    if not any(n.op == "Conv2D" and n.attrs["data_format"] == "NCHW" for n in graph.nodes):
        return PassResult(False, 0)
    dead = _drop_dead_views(graph)
    convs = [n for n in graph.nodes if n.op == "Conv2D" and n.attrs["data_format"] == "NCHW"]
    choices: list[LayoutChoice] = []
    switched = groups = 0
    for group in _groups(convs):
        names = [c.name for c in group]
        near = {c.name: _near_permute(c) for c in group}
        if not any(near.values()):
            continue  # nothing to remove: not worth a word in explain
        trial = graph.copy()
        before = _live_transposes(trial)
        _switch(trial, names)
        after = _live_transposes(trial)
        if after >= before:
            why = f"NHWC would leave {after} Transposes in the graph, NCHW leaves {before}"
            choices.extend(LayoutChoice(n, "NCHW", _reason(names, n, why)) for n in names)
            continue
        if not ctx.should_apply(f"NHWC for {', '.join(names)}", group):
            choices.extend(LayoutChoice(n, "NCHW", "bisect refused the rewrite") for n in names)
            continue
        _switch(graph, names)
        switched += len(names)
        groups += 1
        why = f"{before} -> {after} Transposes in the graph; next to "
        choices.extend(LayoutChoice(n, "NHWC", _reason(names, n, why + (near[n] or "none")))
                       for n in names)
    ctx.analyses.layouts.extend(choices)
    notes = [f"{c.conv}: {c.layout}: {c.reason}" for c in choices]
    return PassResult(switched > 0 or dead > 0, groups, notes,
                      f"{switched} convolution(s) to NHWC" if switched else "")
