"""elemwise_broadcast_{fwd,bwd}_{depth,width}: fuse elementwise and broadcast areas."""

from __future__ import annotations

import re

from graphkernel import ops
from graphkernel.fusion import INJECTIVE
from graphkernel.ops import RESHAPE_OPS, OpKind
from graphkernel.patterns.base import (
    fuse_if,
    fuse_qualifying,
    need,
    pattern,
    pull_in_conditions,
)

EB = (OpKind.ELEMWISE, OpKind.BROADCAST)
PASSTHROUGH = RESHAPE_OPS | {"BroadcastTo"}  # ops that move a value without computing it


def _computed(v, a) -> bool:
    """Whether ``v`` (an output of area ``a``) is computed in ``a``, not a view or broadcast
    of a value loaded from outside it."""
    inside = {id(n) for n in a.nodes}
    n = v.producer
    while n is not None and id(n) in inside and n.op in PASSTHROUGH:
        n = n.inputs[0].producer
    return n is not None and id(n) in inside and n.op != "Constant"


def _middle_broadcast(v, c) -> bool:
    """Whether ``c`` broadcasts ``v`` over an axis that lies between axes it varies along
    (seen where an elementwise op of ``c`` reads ``v``, through ``c``'s reshapes): ``[B, 1, N]``
    into ``[B, D, N]``. Broadcast only over trailing axes (one value per row), only over
    leading ones (per column) or everywhere (a scalar) is not."""
    inside = {id(n) for n in c.nodes}
    front = [v]
    while front:
        x = front.pop()
        for u in x.users:
            if id(u) not in inside:
                continue
            if u.op in RESHAPE_OPS:
                front.extend(u.outputs)
                continue
            if not ops.exists(u.op) or ops.get(u.op).kind != OpKind.ELEMWISE:
                continue  # (a BroadcastTo stores or views it: placed through its map)
            out = tuple(u.outputs[0].shape)
            shape = (1,) * (len(out) - len(x.shape)) + tuple(x.shape)
            marks = "".join("b" if s == 1 else "v" for s, o in zip(shape, out) if o != 1)
            if re.search("vb+v", marks):
                return True
    return False


def _fwd_conditions(model, a, p):
    return [
        *pull_in_conditions(model, a, p, OpKind.BROADCAST, "needs <= BROADCAST"),
        need(lambda: model.size(p) == model.size(a),
             lambda: f"compute size mismatch: {model.size(p)} vs {model.size(a)}"),
    ]


@pattern("elemwise_broadcast_fwd_depth", order=20, direction="fwd", mode="depth",
         refuses=("GK202", "GK203", "GK204", "GK205"))
def fwd_depth(model, a):
    """An ELEMWISE/BROADCAST area with one producer area pulls it in when the producer is
    <= BROADCAST, has this area as its only consumer, over an INJECTIVE edge, with the same
    compute size."""
    if model.kind(a) not in EB:
        return None
    prods = model.producer_areas(a)
    if len(prods) != 1:
        return None
    return fuse_if(model, "elemwise_broadcast_fwd_depth", [a, prods[0]],
                   _fwd_conditions(model, a, prods[0]))


@pattern("elemwise_broadcast_fwd_width", order=30, direction="fwd", mode="width",
         refuses=("GK202", "GK203", "GK204", "GK205"))
def fwd_width(model, a):
    """The same for all qualifying producers at once (with the cycle check)."""
    if model.kind(a) not in EB:
        return None
    return fuse_qualifying(model, "elemwise_broadcast_fwd_width", a, model.producer_areas(a),
                           lambda p: _fwd_conditions(model, a, p))


def _bwd_conditions(model, a, consumers, external):
    depth = model.cfg.broadcast_fuse_depth
    conds = [
        need(lambda: not model.is_output(a), lambda: f"{a.name} is a graph output"),
        need(lambda: not external,
             lambda: f"{a.name} has a consumer outside the fusable region"),
        need(lambda: a.ops <= depth,
             lambda: f"size limit: {a.ops} ops > broadcast_fuse_depth={depth}"),
    ]
    computed = [v for n in a.nodes for v in n.outputs if _computed(v, a)]
    for c in consumers:
        conds.append(need(lambda c=c: not any(_middle_broadcast(v, c) for v in computed),
                          lambda c=c: f"{c.name} reads a value computed in {a.name} broadcast "
                                      "over a middle axis (the code generator places a "
                                      "computed value smaller than the loop space only as one "
                                      "per row, per column or a scalar)"))
        conds.append(need(lambda c=c: model.kind(c) <= OpKind.REDUCE,
                          lambda c=c: f"kind mismatch: consumer {c.name} is "
                                      f"{model.kind(c).name} (needs <= REDUCE)"))
        conds.append(need(lambda c=c: model.kind(c) != OpKind.REDUCE or (
            model.kind(a) == OpKind.ELEMWISE and model.relation(a, c) == INJECTIVE),
            lambda c=c: f"kind mismatch: a REDUCE consumer ({c.name}) takes only an "
                        "ELEMWISE area over an INJECTIVE edge"))
    return conds


@pattern("elemwise_broadcast_bwd_depth", order=60, direction="bwd", mode="depth",
         refuses=("GK202", "GK206", "GK207", "GK302"))
def bwd_depth(model, a):
    """An ELEMWISE/BROADCAST area, not a graph output, of at most broadcast_fuse_depth ops,
    pushes itself into its single consumer (a REDUCE consumer only for an ELEMWISE area over
    an INJECTIVE edge)."""
    if model.kind(a) not in EB:
        return None
    cons, external = model.consumers(a)
    if len(cons) != 1:
        return None
    return fuse_if(model, "elemwise_broadcast_bwd_depth", [cons[0], a],
                   _bwd_conditions(model, a, cons, external))


@pattern("elemwise_broadcast_bwd_width", order=70, direction="bwd", mode="width",
         refuses=("GK202", "GK205", "GK206", "GK207", "GK302"))
def bwd_width(model, a):
    """The same into all of its consumers or none; the consumers need equal compute sizes."""
    if model.kind(a) not in EB:
        return None
    cons, external = model.consumers(a)
    if len(cons) < 2:
        return None
    conds = _bwd_conditions(model, a, cons, external)
    sizes = lambda: {model.size(c) for c in cons}  # noqa: E731
    conds.append(need(lambda: len(sizes()) == 1,
                      lambda: f"compute size mismatch among consumers: "
                              f"{sorted(map(str, sizes()))}"))
    return fuse_if(model, "elemwise_broadcast_bwd_width", cons + [a], conds)
