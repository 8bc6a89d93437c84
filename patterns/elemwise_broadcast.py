"""elemwise_broadcast_{fwd,bwd}_{depth,width}: fuse elementwise and broadcast areas."""

from __future__ import annotations

import re

from graphkernel import ops, symbolic
from graphkernel.fusion import INJECTIVE
from graphkernel.ops import PRODUCT_OPS, RESHAPE_OPS, OpKind
from graphkernel.patterns.base import (
    fuse_if,
    fuse_qualifying,
    need,
    pattern,
    pull_in_conditions,
)
from graphkernel.patterns.reduce import (
    reduce_signatures,
    repeats_whole_rows,
    scan_prologue_area,
)

EB = (OpKind.ELEMWISE, OpKind.BROADCAST)
PASSTHROUGH = RESHAPE_OPS | {"BroadcastTo"}  # ops that move a value without computing it


def _computed(v, a) -> bool:
    """Whether ``v`` (an output of area ``a``) is computed in ``a``, not a view or broadcast
    of a value loaded from outside it."""
    inside = {id(n) for n in a.nodes}
    n = v.producer
    while n is not None and id(n) in inside and n.op in PASSTHROUGH:
        n = n.inputs[0].producer
    return n is not None and id(n) in inside and n.op != "Constant"


def _middle_broadcast(v, c) -> bool:
    """Whether ``c`` broadcasts ``v`` over an axis that lies between axes it varies along
    (seen where an elementwise op of ``c`` reads ``v``, through ``c``'s reshapes): ``[B, 1, N]``
    into ``[B, D, N]``. Broadcast only over trailing axes (one value per row), only over
    leading ones (per column) or everywhere (a scalar) is not."""
    inside = {id(n) for n in c.nodes}
    front = [v]
    while front:
        x = front.pop()
        for u in x.users:
            if id(u) not in inside:
                continue
            if u.op in RESHAPE_OPS:
                front.extend(u.outputs)
                continue
            if not ops.exists(u.op) or ops.get(u.op).kind != OpKind.ELEMWISE:
                continue  # (a BroadcastTo stores or views it: placed through its map)
            out = tuple(u.outputs[0].shape)
            shape = (1,) * (len(out) - len(x.shape)) + tuple(x.shape)
            marks = "".join("b" if s == 1 else "v" for s, o in zip(shape, out) if o != 1)
            if re.search("vb+v", marks):
                return True
    return False


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


def _broadcast_off_rows(model, a, c):
    """A value broadcast into a node of ``a`` (read with fewer elements than the node
    computes; not a scalar) whose shape is not the one the reductions of ``c`` reduce, or
    None. Pushed into ``c``, such a read would have to follow ``c``'s rows through a reshape
    (a group norm's statistics, one per group of channels, before a global pool's rows of
    one channel): the vector generator lays a reduction's operands out along its own rows."""
    shapes = {tuple(sig[0]) for sig in reduce_signatures(c)}
    for n in a.nodes:
        out = n.outputs[0] if n.outputs else None
        if out is None or tuple(out.shape) in shapes:
            continue
        for v in n.inputs:
            if symbolic.canon(v.type.numel) not in (symbolic.canon(out.type.numel),
                                                     symbolic.canon(1)):
                return v
    return None


def _product_read(model, a):
    """A matrix product's result (through views) that area ``a`` computes on, or None."""
    for _, v, _ in model.producers(a):
        p = v.producer
        while p is not None and ops.get(p.op).kind == OpKind.RESHAPE and p.inputs:
            p = p.inputs[0].producer
        if p is not None and p.op in PRODUCT_OPS:
            return p
    return None


def _stored_by_one(model, a, consumers) -> bool:
    """Whether graph-output area ``a`` may go into its consumers (both bwd patterns make
    them and ``a`` one area), which then store it as well: ``a`` is elementwise work on the
    consumers' own shape (a residual sum that leaves a graph after a break, normalised
    there), so the one kernel computes it once and writes it once, as its separate launch
    did, and reads its operands instead of it."""
    ids = {id(c) for c in consumers}
    return model.kind(a) == OpKind.ELEMWISE and all(
        id(model.area_of(u)) in ids for _, u in model.outputs_of(a)) and all(
        model.size(c) == model.size(a) and model.relation(a, c) == INJECTIVE
        and (tuple(v.shape) == tuple(u.outputs[0].shape) or _reduced_whole(v, u))
        for c in consumers for v, u in model.outputs_of(a) if model.area_of(u) is c)


def _reduced_whole(v, u) -> bool:
    """Whether op ``u`` is a reduction of ``v`` itself (not a view of it): it reads each
    element of ``v`` once, in ``v``'s shape, so its kernel's loop space is ``v``'s (the
    residual sum a training forward returns for the backward, read by its norm's mean)."""
    return ops.get(u.op).kind == OpKind.REDUCE and u.op not in ("Scan", "ElemAny") and \
        len(u.inputs) == 1 and u.inputs[0] is v


def _row_values_stored(model, a, consumers) -> bool:
    """Whether graph-output area ``a`` may go into its single consumer, which then stores it
    as well: ``a`` is elementwise work whose every value is one per row of the consumer's
    loop space (its shape with a last axis of 1: a norm's mean or reciprocal deviation,
    which a training graph's forward returns for the backward). The consumer's kernel
    computes each such value once per row of its tile, as the area's own launch did, and
    stores it as a column; the values are the same ops on the same operands, so the stored
    ones are exact. (Values spread along other axes would be stored from a broadcast and are
    left to ``_stored_by_one``'s rule.)"""
    if model.kind(a) != OpKind.ELEMWISE or len(consumers) != 1:
        return False
    shape = tuple(consumers[0].dominant.outputs[0].shape)
    if len(shape) < 2 or symbolic.eq(shape[-1], 1):
        return False
    return all(len(v.shape) == len(shape) and symbolic.eq(v.shape[-1], 1)
               and all(map(symbolic.eq, v.shape[:-1], shape[:-1]))
               for n in a.nodes if n.op != "Constant" for v in n.outputs)


def _inside_only(model, a) -> bool:
    """Whether every op reading area ``a`` is in the region (its other reader a graph
    output)."""
    return all(model.area_of(u) is not None for _, u in model.outputs_of(a))


def _computing(a, broadcasts: bool = True) -> int:
    """The ops of area ``a`` that compute: views (Reshape, ExpandDims, Squeeze) move no data
    and run no instruction, so they do not count toward broadcast_fuse_depth (a
    convolution's result squeezed before its activation is as short a chain as without).
    With ``broadcasts`` False, broadcasts do not count either (a scan's prologue broadcast to
    the scan's shape costs its kernel no instruction for them)."""
    return sum(1 for n in a.nodes if n.op not in RESHAPE_OPS
               and (broadcasts or ops.get(n.op).kind is not OpKind.BROADCAST))


def _bwd_conditions(model, a, consumers, external):
    depth = model.cfg.broadcast_fuse_depth
    conds = [
        need(lambda: not model.is_output(a) or _stored_by_one(model, a, consumers)
             or _row_values_stored(model, a, consumers),
             lambda: f"{a.name} is a graph output"),
        need(lambda: not external or (model.is_output(a) and _inside_only(model, a)
                                      and (_stored_by_one(model, a, consumers)
                                           or _row_values_stored(model, a, consumers))),
             lambda: f"{a.name} has a consumer outside the fusable region"),
        need(lambda: _computing(a) <= depth or (
            _computing(a, broadcasts=False) <= depth
            and all(scan_prologue_area(c, a) for c in consumers)),
             lambda: f"size limit: {_computing(a)} ops > broadcast_fuse_depth={depth}"),
    ]
    computed = [v for n in a.nodes for v in n.outputs if _computed(v, a)]
    for c in consumers:
        conds.append(need(lambda c=c: not any(_middle_broadcast(v, c) for v in computed),
                          lambda c=c: f"{c.name} reads a value computed in {a.name} broadcast "
                                      "over a middle axis (the code generator places a "
                                      "computed value smaller than the loop space only as one "
                                      "per row, per column or a scalar)"))
        conds.append(need(lambda c=c: model.kind(c) <= OpKind.REDUCE,
                          lambda c=c: f"kind mismatch: consumer {c.name} is "
                                      f"{model.kind(c).name} (needs <= REDUCE)"))
        # work on a product's result in the product's own shape (a squeeze-and-excitation
        # gate's bias and sigmoid) is the product's epilogue (matmul_depth, later): pushed
        # into a consumer that broadcasts it (the gate scaling its input), the vector
        # generator could not place it, and the product would stay a launch alone
        conds.append(need(lambda c=c: model.size(c) == model.size(a) or
                          _product_read(model, a) is None,
                          lambda c=c: f"operands of different shapes: {a.name} computes on "
                          f"the product {_product_read(model, a).name} in its shape, which "
                          f"{c.name} broadcasts (the product's epilogue)"))
        conds.append(need(lambda c=c: model.kind(c) != OpKind.REDUCE or (
            (model.kind(a) == OpKind.ELEMWISE or repeats_whole_rows(c, a) or
             scan_prologue_area(c, a)) and model.relation(a, c) == INJECTIVE),
            lambda c=c: f"kind mismatch: a REDUCE consumer ({c.name}) takes only an "
                        "ELEMWISE area (or one broadcasting whole rows of what it reduces) "
                        "over an INJECTIVE edge"))
        conds.append(need(lambda c=c: model.kind(c) != OpKind.REDUCE or
                          _broadcast_off_rows(model, a, c) is None or
                          scan_prologue_area(c, a),
                          lambda c=c: f"operands of different shapes: {a.name} reads "
                          f"{_broadcast_off_rows(model, a, c).name} broadcast in another shape "
                          f"than the rows {c.name} reduces"))
    return conds


@pattern("elemwise_broadcast_bwd_depth", order=60, direction="bwd", mode="depth",
         refuses=("GK202", "GK206", "GK207", "GK209", "GK210", "GK302"))
def bwd_depth(model, a):
    """An ELEMWISE/BROADCAST area, not a graph output (unless elementwise work of its
    consumer's shape read only in the region, elementwise or reduced whole, which the
    consumer then stores too: a residual sum leaving a graph; or elementwise work on one
    value per row of its consumer, which the consumer stores as a column: a norm's
    statistics a training forward returns), of at most broadcast_fuse_depth ops (views,
    which compute nothing, not counted), pushes itself into its single consumer (a
    REDUCE consumer only over an INJECTIVE edge, for an ELEMWISE area or one broadcasting
    only whole rows of what is reduced; work on a matrix product's result not into a
    consumer of views alone: it is the product's epilogue)."""
    if model.kind(a) not in EB:
        return None
    cons, external = model.consumers(a)
    if len(cons) != 1:
        return None
    c = cons[0]
    conds = [*_bwd_conditions(model, a, cons, external),
             need(lambda: _product_read(model, a) is None or
                  any(ops.get(n.op).kind != OpKind.RESHAPE for n in c.nodes),
                  lambda: f"consumer {c.name} views the product "
                          f"{_product_read(model, a).name} after its epilogue {a.name} "
                          "(pushed into a view of other rows, the epilogue would leave the "
                          "product's tile)")]
    return fuse_if(model, "elemwise_broadcast_bwd_depth", [c, a], conds)


@pattern("elemwise_broadcast_bwd_width", order=70, direction="bwd", mode="width",
         refuses=("GK202", "GK205", "GK206", "GK207", "GK208", "GK209", "GK302"))
def bwd_width(model, a):
    """The same into all of its consumers or none; the consumers need equal compute sizes
    and, where they reduce, the same reduced shape and axes."""
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
    # consumers reducing different shapes or axes (a group norm's variance and a global pool
    # of its result) would be one kernel holding rows of two lengths: the generator splits it
    # again, and the pieces no longer pull in what they would have taken one by one
    sigs = lambda: set().union(*(reduce_signatures(c) for c in cons))  # noqa: E731
    conds.append(need(lambda: len(sigs()) <= 1,
                      lambda: "the reductions differ in shape or axes among the consumers"))
    return fuse_if(model, "elemwise_broadcast_bwd_width", cons + [a], conds)
