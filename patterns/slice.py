"""slice: a slice fuses into its elementwise and reduction consumers."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.fusion import INJECTIVE, Area
from graphkernel.ops import RESHAPE_OPS, OpKind
from graphkernel.patterns.base import fuse_if, need, pattern

SLICES = ("Slice", "StridedSlice")


def _computes(model, c: Area) -> OpKind:
    """The kind of what ``c`` computes, its slices aside: an area that already took in a
    slice of the same operand (a gate/up projection's other half, a key's part of a fused
    key/value product) is still elementwise or reducing work that loads its parts. Slices
    with a step (an interleaved gate/up product's even and odd columns) count so only when
    the area computes elementwise work alone: the pairs of an interleaved rotary, put back
    together by a Concat or a reshape, are not parts of a row."""
    if model.kind(c) != OpKind.SLICE:
        return model.kind(c)
    rest = max((ops.get(n.op).kind for n in c.nodes if n.op not in SLICES),
               default=OpKind.RESHAPE)
    stepped = any(n.op in SLICES and any(st != 1 for st in n.attrs.get("strides") or [1])
                  for n in c.nodes)
    if stepped and (any(n.op in RESHAPE_OPS for n in c.nodes) or rest > OpKind.BROADCAST):
        return model.kind(c)
    return rest


@pattern("slice", order=80, direction="bwd", mode="width",
         refuses=("GK202", "GK204", "GK206", "GK207"))
def slice_(model, a):
    """A Slice/StridedSlice node fuses into its consumers of kind <= REDUCE over INJECTIVE
    edges: the kernel loads the slice's elements in place (a strided load), whatever it then
    computes from them -- a norm of one part of a projection reads its columns of the rows.
    A consumer that already loads other slices (``silu(gate) * up`` of one gate/up product)
    takes this one too: the kernel loads each part as its own strided view of the operand."""
    return _into_consumers(model, a, "slice", (OpKind.REDUCE,))


def _into_consumers(model, a: Area, name: str, kinds: tuple[OpKind, ...]) -> Area | None:
    """Fuse the slice area ``a`` into its consumers when what each computes is <= REDUCE (or
    one of ``kinds`` above that)."""
    body = [n for n in a.nodes if n.op not in RESHAPE_OPS]
    if len(body) != 1 or body[0].op not in SLICES:  # (a slice, perhaps with its views)
        return None
    cons, external = model.consumers(a)
    if not cons:
        return None
    conds = [need(lambda: not model.is_output(a), lambda: f"{a.name} is a graph output"),
             need(lambda: not external,
                  lambda: f"{a.name} has a consumer outside the fusable region")]
    for c in cons:
        conds.append(need(lambda c=c: _computes(model, c) <= OpKind.REDUCE or
                          _computes(model, c) in kinds,
                          lambda c=c: f"kind mismatch: consumer {c.name} is {model.kind(c).name}"))
        conds.append(need(lambda c=c: model.relation(a, c) == INJECTIVE,
                          lambda c=c: f"edge relation: {a.name} -> {c.name} is BROADCAST"))
    return fuse_if(model, name, cons + [a], conds)


@pattern("slice_late", order=116, direction="bwd", mode="width", level=2,
         refuses=("GK202", "GK204", "GK206", "GK207"))
def slice_late(model, a):
    """The ``slice`` pattern once more after the extended patterns, into consumers that now
    are one area (a slice, through a head view, read by a rotary embedding's product and by
    the halves its Concat swaps: the halves' Concat joined them into one area since), or a
    Concat's area: the kernel loads the slice's elements in place."""
    return _into_consumers(model, a, "slice_late", (OpKind.REDUCE, OpKind.CONCAT))
