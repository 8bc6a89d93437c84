"""slice: a slice fuses into its elementwise consumers."""

from __future__ import annotations

from graphkernel.fusion import INJECTIVE
from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, pattern


@pattern("slice", order=80, direction="bwd", mode="width")
def slice_(model, a):
    """A Slice/StridedSlice node fuses into its ELEMWISE consumers over INJECTIVE edges."""
    if a.ops != 1 or a.nodes[0].op not in ("Slice", "StridedSlice"):
        return None
    cons, external = model.consumers(a)
    if not cons:
        return None
    conds = [(not model.is_output(a), f"{a.name} is a graph output"),
             (not external, f"{a.name} has a consumer outside the fusable region")]
    for c in cons:
        conds.append((model.kind(c) <= OpKind.BROADCAST,
                      f"kind mismatch: consumer {c.name} is {model.kind(c).name}"))
        conds.append((model.relation(a, c) == INJECTIVE,
                      f"edge relation: {a.name} -> {c.name} is BROADCAST"))
    return fuse_if(model, "slice", cons + [a], conds)
