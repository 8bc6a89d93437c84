"""reshape and isolate_reshape: attach pure reshapes to a neighbouring kernel."""

from __future__ import annotations

from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, pattern


def _lone_reshape(model, a) -> bool:
    from graphkernel import ops

    return a.ops == 1 and ops.get(a.nodes[0].op).kind == OpKind.RESHAPE


@pattern("reshape", order=10, direction="fwd", mode="depth")
def reshape(model, a):
    """A reshape area (one reshape with at most one consumer) joins its single neighbour of
    kind <= BROADCAST, producer or consumer, whichever has the lower kind."""
    if not _lone_reshape(model, a):
        return None
    users = a.nodes[0].outputs[0].users
    if len(users) > 1:
        return None
    cand = [p for p in model.producer_areas(a)] + model.consumers(a)[0]
    cand = [c for c in cand if model.kind(c) <= OpKind.BROADCAST and not _lone_reshape(model, c)]
    if not cand:
        return None
    best = min(cand, key=lambda c: model.kind(c))  # producers come first: they win ties
    return fuse_if(model, "reshape", [best, a], [])


@pattern("isolate_reshape", order=200, direction="bwd", mode="depth")
def isolate_reshape(model, a):
    """A lone reshape left over joins the first fused consumer, or else the first fused
    producer."""
    if not _lone_reshape(model, a):
        return None
    # a consumer reading the view beside other areas would store it as an output: a view of
    # one of its own inputs, no value it computes (the reshape stays a view outside)
    readers = {id(model.area(u)) for u in a.nodes[0].outputs[0].users}
    fused_consumers = [c for c in model.consumers(a)[0] if c.ops > 1 and
                       (readers == {id(c)} or not _reads_outside(model, a))]
    fused_producers = [p for p in model.producer_areas(a) if p.ops > 1]
    for c in fused_consumers + fused_producers:
        if model.kind(c) < OpKind.SLICE:
            return fuse_if(model, "isolate_reshape", [c, a], [])
    return None


def _reads_outside(model, a) -> bool:
    """Whether lone reshape ``a`` reads a value from outside the region's areas or from an
    area of views alone (no kernel computes it)."""
    from graphkernel import ops

    v = a.nodes[0].inputs[0]
    p = None if v.producer is None else model.area(v.producer)
    return p is None or all(ops.get(n.op).kind == OpKind.RESHAPE for n in p.nodes)
