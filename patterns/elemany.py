"""elemany_addn: an ElemAny (any-element-true to a scalar) fuses its producers."""

from __future__ import annotations

from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, pattern


@pattern("elemany_addn", order=90, direction="fwd", mode="width")
def elemany_addn(model, a):
    """An ElemAny fuses its <= BROADCAST producers (each having it as only consumer)."""
    if not any(n.op == "ElemAny" for n in a.nodes):
        return None
    good = [p for p in model.producer_areas(a)
            if model.kind(p) <= OpKind.BROADCAST and model.only_consumer_is(p, a)]
    return fuse_if(model, "elemany_addn", [a] + good, []) if good else None
