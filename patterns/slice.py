"""slice: a slice fuses into its elementwise and reduction consumers."""

from __future__ import annotations

from graphkernel.fusion import INJECTIVE
from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, need, pattern


@pattern("slice", order=80, direction="bwd", mode="width",
         refuses=("GK202", "GK204", "GK206", "GK207"))
def slice_(model, a):
    """A Slice/StridedSlice node fuses into its consumers of kind <= REDUCE over INJECTIVE
    edges: the kernel loads the slice's elements in place (a strided load), whatever it then
    computes from them -- a norm of one part of a projection reads its columns of the rows."""
    if a.ops != 1 or a.nodes[0].op not in ("Slice", "StridedSlice"):
        return None
    cons, external = model.consumers(a)
    if not cons:
        return None
    conds = [need(lambda: not model.is_output(a), lambda: f"{a.name} is a graph output"),
             need(lambda: not external,
                  lambda: f"{a.name} has a consumer outside the fusable region")]
    for c in cons:
        conds.append(need(lambda c=c: model.kind(c) <= OpKind.REDUCE,
                          lambda c=c: f"kind mismatch: consumer {c.name} is {model.kind(c).name}"))
        conds.append(need(lambda c=c: model.relation(a, c) == INJECTIVE,
                          lambda c=c: f"edge relation: {a.name} -> {c.name} is BROADCAST"))
    return fuse_if(model, "slice", cons + [a], conds)
