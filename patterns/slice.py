"""slice: a slice fuses into its elementwise and reduction consumers."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.fusion import INJECTIVE, Area
from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, need, pattern

SLICES = ("Slice", "StridedSlice")


def _computes(model, c: Area) -> OpKind:
    """The kind of what ``c`` computes, its slices aside: an area that already took in a
    slice of the same operand (a gate/up projection's other half, a key's part of a fused
    key/value product) is still elementwise or reducing work that loads its parts."""
    if model.kind(c) != OpKind.SLICE:
        return model.kind(c)
    return max((ops.get(n.op).kind for n in c.nodes if n.op not in SLICES),
               default=OpKind.RESHAPE)


@pattern("slice", order=80, direction="bwd", mode="width",
         refuses=("GK202", "GK204", "GK206", "GK207"))
def slice_(model, a):
    """A Slice/StridedSlice node fuses into its consumers of kind <= REDUCE over INJECTIVE
    edges: the kernel loads the slice's elements in place (a strided load), whatever it then
    computes from them -- a norm of one part of a projection reads its columns of the rows.
    A consumer that already loads other slices (``silu(gate) * up`` of one gate/up product)
    takes this one too: the kernel loads each part as its own strided view of the operand."""
    if a.ops != 1 or a.nodes[0].op not in SLICES:
        return None
    cons, external = model.consumers(a)
    if not cons:
        return None
    conds = [need(lambda: not model.is_output(a), lambda: f"{a.name} is a graph output"),
             need(lambda: not external,
                  lambda: f"{a.name} has a consumer outside the fusable region")]
    for c in cons:
        conds.append(need(lambda c=c: _computes(model, c) <= OpKind.REDUCE,
                          lambda c=c: f"kind mismatch: consumer {c.name} is {model.kind(c).name}"))
        conds.append(need(lambda c=c: model.relation(a, c) == INJECTIVE,
                          lambda c=c: f"edge relation: {a.name} -> {c.name} is BROADCAST"))
    return fuse_if(model, "slice", cons + [a], conds)
