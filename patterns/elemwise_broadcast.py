"""elemwise_broadcast_{fwd,bwd}_{depth,width}: fuse elementwise and broadcast areas."""

from __future__ import annotations

from graphkernel.fusion import INJECTIVE
from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, pattern

EB = (OpKind.ELEMWISE, OpKind.BROADCAST)


def _fwd_conditions(model, a, p):
    return [
        (model.kind(p) <= OpKind.BROADCAST,
         f"kind mismatch: producer {p.name} is {model.kind(p).name} (needs <= BROADCAST)"),
        (model.only_consumer_is(p, a), f"producer {p.name} has other consumers"),
        (model.relation(p, a) == INJECTIVE,
         f"edge relation: {p.name} -> {a.name} is BROADCAST (needs INJECTIVE)"),
        (model.size(p) == model.size(a),
         f"compute size mismatch: {model.size(p)} vs {model.size(a)}"),
    ]


@pattern("elemwise_broadcast_fwd_depth", order=20, direction="fwd", mode="depth")
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


@pattern("elemwise_broadcast_fwd_width", order=30, direction="fwd", mode="width")
def fwd_width(model, a):
    """The same for all qualifying producers at once (with the cycle check)."""
    if model.kind(a) not in EB:
        return None
    good = []
    for p in model.producer_areas(a):
        failed = [why for ok, why in _fwd_conditions(model, a, p) if not ok]
        if failed:
            model.reject("elemwise_broadcast_fwd_width", [a, p], failed[0])
        else:
            good.append(p)
    if not good:
        return None
    return fuse_if(model, "elemwise_broadcast_fwd_width", [a] + good, [])


def _bwd_conditions(model, a, consumers, external):
    conds = [
        (not model.is_output(a), f"{a.name} is a graph output"),
        (not external, f"{a.name} has a consumer outside the fusable region"),
        (a.ops <= model.cfg.broadcast_fuse_depth,
         f"size limit: {a.ops} ops > broadcast_fuse_depth={model.cfg.broadcast_fuse_depth}"),
    ]
    for c in consumers:
        kc = model.kind(c)
        conds.append((kc <= OpKind.REDUCE,
                      f"kind mismatch: consumer {c.name} is {kc.name} (needs <= REDUCE)"))
        if kc == OpKind.REDUCE:
            conds.append((model.kind(a) == OpKind.ELEMWISE and
                          model.relation(a, c) == INJECTIVE,
                          f"kind mismatch: a REDUCE consumer ({c.name}) takes only an "
                          "ELEMWISE area over an INJECTIVE edge"))
    return conds


@pattern("elemwise_broadcast_bwd_depth", order=60, direction="bwd", mode="depth")
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


@pattern("elemwise_broadcast_bwd_width", order=70, direction="bwd", mode="width")
def bwd_width(model, a):
    """The same into all of its consumers or none; the consumers need equal compute sizes."""
    if model.kind(a) not in EB:
        return None
    cons, external = model.consumers(a)
    if len(cons) < 2:
        return None
    sizes = {model.size(c) for c in cons}
    conds = _bwd_conditions(model, a, cons, external)
    conds.append((len(sizes) == 1,
                  f"compute size mismatch among consumers: {sorted(map(str, sizes))}"))
    return fuse_if(model, "elemwise_broadcast_bwd_width", cons + [a], conds)
