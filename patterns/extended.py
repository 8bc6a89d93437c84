"""Extended fusions (AutoFuse's): concat and transpose (opt_level 2), gather (3)."""

from __future__ import annotations

from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, need, pattern


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


@pattern("concat", order=110, direction="fwd", mode="width", level=2)
def concat(model, a):
    """A Concat with elementwise/broadcast/slice producers, or an elementwise consumer (the
    Concat may also leave the kernel: its tile is stored as well as consumed). Producers are
    pulled in only where the code generator takes the result: operands of one shape (stored
    operand by operand), or one op every operand ends with (run once after the Concat)."""
    if not _single(a, "Concat"):
        return None
    node = a.nodes[0]
    prods = [p for p in model.producer_areas(a)
             if model.kind(p) <= OpKind.SLICE and model.only_consumer_is(p, a)]
    if prods:
        got = fuse_if(model, "concat", [a] + prods, [need(
            lambda: _generated(node, prods),
            lambda: f"{a.name}: operands of different shapes not computed by the same "
                    "elementwise ops, or one value read through two views (the code generator "
                    "loads each input once; a Concat of kernel inputs piece by piece, after "
                    "moving the ops every operand shares past it)")])
        if got is not None:
            return got
    cons, _ = model.consumers(a)
    if len(cons) == 1 and model.kind(cons[0]) <= OpKind.BROADCAST:
        return fuse_if(model, "concat", [cons[0], a], [])
    return None


def _generated(node, prods) -> bool:
    """Whether the code generator takes ``node`` (a Concat) with ``prods`` pulled in."""
    from graphkernel.codegen.schedule import elementwise
    from graphkernel.codegen.views import sinks_to_inputs

    mine = {id(n) for p in prods for n in p.nodes}
    views: dict[int, int] = {}  # an outside value -> the slices/transposes reading it
    for p in prods:
        for n in p.nodes:
            if n.op in ("Slice", "StridedSlice", "Transpose") and id(n.inputs[0].producer) \
                    not in mine:
                views[id(n.inputs[0])] = views.get(id(n.inputs[0]), 0) + 1
    if any(k > 1 for k in views.values()):
        return False  # a value read through two views (each input is loaded once)
    if all(tuple(x.shape) == tuple(node.inputs[0].shape) for x in node.inputs):
        return True
    return sinks_to_inputs(list(node.inputs), lambda m: id(m) in mine, elementwise)


@pattern("gather", order=111, direction="fwd", mode="width", level=3)
def gather(model, a):
    """A Gather with elementwise/broadcast producers, or an elementwise consumer."""
    return _join_neighbours(model, a, "gather", OpKind.BROADCAST) if _single(a, "Gather") \
        else None


@pattern("transpose", order=112, direction="fwd", mode="width", level=2)
def transpose(model, a):
    """A Transpose fused with its elementwise neighbours (its producers, else a consumer)
    when the last axis stays last: the code generator moves rows of a transposed value
    (strided loads and stores); it has no in-UB transpose."""
    if not _single(a, "Transpose"):
        return None
    perm = list(a.nodes[0].attrs["perm"])
    keeps_last = [need(lambda: perm[-1] == len(perm) - 1,
                       lambda: f"{a.name} moves the last axis (the code generator moves rows "
                               "of a transposed value; it has no in-UB transpose)")]
    prods = [p for p in model.producer_areas(a)
             if model.kind(p) <= OpKind.BROADCAST and model.only_consumer_is(p, a)]
    if prods:
        return fuse_if(model, "transpose", [a] + prods, keeps_last)
    cons, external = model.consumers(a)
    if len(cons) == 1 and not external and model.kind(cons[0]) <= OpKind.BROADCAST:
        return fuse_if(model, "transpose", [cons[0], a], keeps_last)
    return None
