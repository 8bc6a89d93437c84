"""elemwise_broadcast_{fwd,bwd}_{depth,width}: fuse elementwise and broadcast areas."""

from __future__ import annotations

from graphkernel.fusion import INJECTIVE
from graphkernel.ops import OpKind
from graphkernel.patterns.base import (
    fuse_if,
    fuse_qualifying,
    need,
    pattern,
    pull_in_conditions,
)
from graphkernel.patterns.reduce import repeats_whole_rows

EB = (OpKind.ELEMWISE, OpKind.BROADCAST)


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
    for c in consumers:
        conds.append(need(lambda c=c: model.kind(c) <= OpKind.REDUCE,
                          lambda c=c: f"kind mismatch: consumer {c.name} is "
                                      f"{model.kind(c).name} (needs <= REDUCE)"))
        conds.append(need(lambda c=c: model.kind(c) != OpKind.REDUCE or (
            (model.kind(a) == OpKind.ELEMWISE or repeats_whole_rows(c, a))
            and model.relation(a, c) == INJECTIVE),
            lambda c=c: f"kind mismatch: a REDUCE consumer ({c.name}) takes only an "
                        "ELEMWISE area (or one broadcasting whole rows of what it reduces) "
                        "over an INJECTIVE edge"))
    return conds


@pattern("elemwise_broadcast_bwd_depth", order=60, direction="bwd", mode="depth",
         refuses=("GK202", "GK206", "GK207", "GK302"))
def bwd_depth(model, a):
    """An ELEMWISE/BROADCAST area, not a graph output, of at most broadcast_fuse_depth ops,
    pushes itself into its single consumer (a REDUCE consumer only over an INJECTIVE edge,
    for an ELEMWISE area or one broadcasting only whole rows of what is reduced)."""
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
