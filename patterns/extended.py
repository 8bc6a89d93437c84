"""Extended fusions (opt_level 3, AutoFuse's): concat, gather, transpose."""

from __future__ import annotations

from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, pattern


def _join_neighbours(model, a, name: str, producer_max: OpKind) -> object:
    prods = [p for p in model.producer_areas(a)
             if model.kind(p) <= producer_max and model.only_consumer_is(p, a)]
    if prods:
        return fuse_if(model, name, [a] + prods, [])
    cons, external = model.consumers(a)
    if len(cons) == 1 and not external and model.kind(cons[0]) <= OpKind.BROADCAST:
        return fuse_if(model, name, [cons[0], a], [])
    return None


def _single(a, op: str) -> bool:
    return a.ops == 1 and a.nodes[0].op == op


@pattern("concat", order=110, direction="fwd", mode="width", level=3)
def concat(model, a):
    """A Concat with elementwise/broadcast/slice producers, or an elementwise consumer."""
    return _join_neighbours(model, a, "concat", OpKind.SLICE) if _single(a, "Concat") else None


@pattern("gather", order=111, direction="fwd", mode="width", level=3)
def gather(model, a):
    """A Gather with elementwise/broadcast producers, or an elementwise consumer."""
    return _join_neighbours(model, a, "gather", OpKind.BROADCAST) if _single(a, "Gather") \
        else None


@pattern("transpose", order=112, direction="fwd", mode="width", level=3)
def transpose(model, a):
    """A Transpose fused with its elementwise neighbours."""
    return _join_neighbours(model, a, "transpose", OpKind.BROADCAST) \
        if _single(a, "Transpose") else None
