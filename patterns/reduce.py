"""reduce_fwd_{depth,width} and reduce_bwd: fuse reductions with their neighbours."""

from __future__ import annotations

import math

from graphkernel import ops, symbolic
from graphkernel.fusion import BROADCAST, edge_relation
from graphkernel.ir import DType
from graphkernel.opdefs.reduce import reduce_axes
from graphkernel.ops import VIEW_OPS, OpKind
from graphkernel.patterns.base import fuse_if, fuse_qualifying, need, pattern, pull_in_conditions


def _fwd_conditions(model, a, p, loads=False):
    if all(n.op == "Scan" for n in a.nodes if ops.get(n.op).kind == OpKind.REDUCE):
        # a scan keeps every element: it computes over its producers' whole space, as an
        # elementwise consumer would, so a broadcast producer costs it nothing extra
        return pull_in_conditions(model, a, p, OpKind.BROADCAST,
                                  "a scan pulls in only <= BROADCAST")
    if loads and model.kind(p) == OpKind.BROADCAST and _reads_broadcast_only(p, a):
        # its operands are broadcast where the kernel loads them (stride 0): nothing is
        # computed more than once, as in an elementwise producer
        return pull_in_conditions(model, a, p, OpKind.BROADCAST, "its broadcasts are loads")
    return pull_in_conditions(model, a, p, OpKind.ELEMWISE,
                              "a reduce pulls in only <= ELEMWISE; a broadcast producer is not "
                              "pulled into a reduce")


def repeats_whole_rows(a, p) -> bool:
    """Whether area ``p``, pushed into the REDUCE area ``a`` that consumes it
    (elemwise_broadcast_bwd), broadcasts only along axes that every reduction of ``a`` keeps:
    each of its operands spans the reduced axes whole, so every reduced row reads a whole
    row of it (an embedding plus a position table shared by the batch, then LayerNorm) and
    the reduction sums the values the graph sums. ``p`` computes in the reductions' one
    input shape (no reshape between them); a broadcast along a reduced axis (a per-row
    value spread over the row) is still refused."""
    sigs = reduce_signatures(a)
    if len(sigs) != 1 or any(n.op == "Scan" for n in a.nodes):
        return False
    ((shape, axes),) = sigs
    rank = len(shape)
    if not axes or tuple(axes) != tuple(range(rank - len(axes), rank)):
        return False  # rows: the reduced axes are the trailing ones
    for n in p.nodes:
        if n.op == "Constant":
            continue
        if ops.get(n.op).kind not in (OpKind.ELEMWISE, OpKind.BROADCAST) or any(
                len(v.shape) != rank or not all(map(symbolic.eq, v.shape, shape))
                for v in n.outputs):
            return False
        for x in n.inputs:
            xs = (1,) * (rank - len(x.shape)) + tuple(x.shape)
            if len(xs) != rank or (x.type.numel != 1 and not all(
                    symbolic.eq(xs[k], shape[k]) for k in axes)):
                return False
    return True


def scan_prologue_area(a, p) -> bool:
    """Whether area ``p``, pushed into the area ``a`` that consumes it (elemwise_broadcast_bwd),
    is work computed in the shape of ``a``'s scans (passes/scan_prologue.py): ``a`` reduces
    only by Scans of one shape and axis, ``p`` holds elementwise work, broadcasts and views,
    and every value of ``p`` that ``a`` reads has that whole shape. Each such value is then a
    full tile of the scan's loop space, read as the scan reads its own operands (no value of
    ``p`` is broadcast inside ``a``), and the scan combines exactly the values the graph
    computes."""
    sigs = reduce_signatures(a)
    if len(sigs) != 1 or any(ops.get(n.op).kind == OpKind.REDUCE and n.op != "Scan"
                             for n in a.nodes):
        return False
    ((shape, _),) = sigs
    if any(n.op != "Constant" and ops.get(n.op).kind not in
           (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.RESHAPE) for n in p.nodes):
        return False
    inside = {id(n) for n in a.nodes}
    read = [v for n in p.nodes for v in n.outputs if any(id(u) in inside for u in v.users)]
    return bool(read) and all(
        len(v.shape) == len(shape) and all(map(symbolic.eq, v.shape, shape)) for v in read)


def _reads_broadcast_only(p, a) -> bool:
    """Whether the broadcasts of area ``p`` are all of values it reads from outside itself
    whole rows at a time (broadcast over outer axes, not the last: a stride-0 load of each
    row), into a reduce area ``a`` of one reduction: no BroadcastTo, no value of its own
    broadcast, nothing computed twice."""
    if sum(ops.get(n.op).kind == OpKind.REDUCE for n in a.nodes) != 1:
        return False
    inside = {id(n) for n in p.nodes}
    for n in p.nodes:
        if ops.get(n.op).kind not in (OpKind.ELEMWISE, OpKind.RESHAPE):
            return False
        for v in n.inputs:
            if edge_relation(v, n) != BROADCAST:
                continue
            if v.producer is not None and id(v.producer) in inside:
                return False
            out = n.outputs[0].shape
            if v.type.rank == 0 or v.shape[-1] != out[-1]:
                return False
    return True


@pattern("reduce_fwd_depth", order=40, direction="fwd", mode="depth",
         refuses=("GK202", "GK203", "GK204", "GK302"))
def fwd_depth(model, a):
    """A REDUCE area with one producer area pulls it in when it is <= ELEMWISE, has this
    area as its only consumer and the edge is INJECTIVE, up to reduce_fuse_depth ops."""
    if model.kind(a) != OpKind.REDUCE:
        return None
    prods = model.producer_areas(a)
    if len(prods) != 1:
        return None
    return fuse_if(model, "reduce_fwd_depth", [a, prods[0]],
                   _fwd_conditions(model, a, prods[0], loads=True),
                   limit=model.cfg.reduce_fuse_depth)


@pattern("reduce_fwd_width", order=50, direction="fwd", mode="width",
         refuses=("GK202", "GK203", "GK204", "GK302"))
def fwd_width(model, a):
    """The same for all qualifying producers at once."""
    if model.kind(a) != OpKind.REDUCE:
        return None
    return fuse_qualifying(model, "reduce_fwd_width", a, model.producer_areas(a),
                           lambda p: _fwd_conditions(model, a, p),
                           limit=model.cfg.reduce_fuse_depth)


# float32 rows a kernel of two stacked norms keeps in UB per row of the loop space, with margin
CHAIN_ROW_BUFFERS = 24


@pattern("reduce_chain", order=77, direction="fwd", mode="depth", level=2,
         refuses=("GK202", "GK205", "GK208"))
def chain(model, a):
    """A row reduction pulls in the row reduction whose result it reads (stacked norms: a
    vision encoder's pre-layernorm, then its first layer's norm) when both reduce the same
    trailing axes of one shape over an INJECTIVE edge: the kernel holds each row whole for
    both, and the first one's result, read elsewhere too (the residual), is stored as well.
    Not a first reduction that reads a matrix product's result (that one is the product's
    epilogue), nor rows too long for whole rows in UB."""
    from graphkernel.codegen import targets

    if model.kind(a) != OpKind.REDUCE:
        return None
    prods = [p for p in model.producer_areas(a) if model.kind(p) == OpKind.REDUCE]
    if len(prods) != 1:
        return None
    p = prods[0]
    sigs = reduce_signatures(a) | reduce_signatures(p)
    if len(sigs) != 1 or any(n.op in ("Scan", "ElemAny") for n in (*a.nodes, *p.nodes)):
        return None
    ((shape, axes),) = sigs
    rank = len(shape)
    row = shape[-1] if shape else None
    if axes != (rank - 1,) or not isinstance(row, int) or _reads_product(p):
        return None
    ub = targets.load(model.cfg.target).ub_bytes
    return fuse_if(model, "reduce_chain", [a, p], [
        need(lambda: model.relation(p, a) != BROADCAST,
             lambda: f"edge relation: {p.name} -> {a.name} is BROADCAST (needs INJECTIVE)"),
        need(lambda: model.size(p) == model.size(a),
             lambda: f"compute size mismatch: {model.size(p)} vs {model.size(a)}"),
        need(lambda: row * 4 * CHAIN_ROW_BUFFERS <= ub,
             lambda: f"rows of {row} too long to hold whole for two norms"),
    ])


@pattern("scan_readout", order=78, direction="fwd", mode="depth", level=2,
         refuses=("GK202", "GK203", "GK209"))
def scan_readout(model, a):
    """A row reduction pulls in the scan whose running values it reduces (a selective scan's
    readout ``y[l, d] = sum_n h[l, d, n] * C[l, n]``) when it reduces, in the scan's shape,
    exactly the axes after the scanned one: the scan's kernel runs the scanned axis down the
    tile's rows, so each of its rows is one row of the reduction and the kernel reduces it
    in the tile (its epilogue), and the state history is never written to GM. The reduction's
    area holds only elementwise work, broadcasts and views besides its reductions; the scan's
    area is read by nothing else (another reader of the history would need it stored), and a
    whole row fits the UB with the scan's buffers (a column tile is then the whole row)."""
    from graphkernel.codegen import targets

    if model.kind(a) != OpKind.REDUCE or any(n.op in ("Scan", "ElemAny") for n in a.nodes):
        return None
    sig = reduce_signatures(a)
    prods = [p for p in model.producer_areas(a) if any(n.op == "Scan" for n in p.nodes)]
    if len(sig) != 1 or len(prods) != 1:
        return None
    p = prods[0]
    ((shape, axes),) = sig
    scans = reduce_signatures(p)
    ub = targets.load(model.cfg.target).ub_bytes
    row = math.prod(shape[axes[0]:]) if axes and all(
        isinstance(d, int) for d in shape[axes[0]:]) else None
    return fuse_if(model, "scan_readout", [a, p], [
        need(lambda: all(ops.get(n.op).kind == OpKind.REDUCE and n.op == "Scan" or
                         ops.get(n.op).kind < OpKind.REDUCE for n in p.nodes),
             lambda: f"kind mismatch: {p.name} reduces other than by scans"),
        need(lambda: all(n.op == "Constant" or ops.get(n.op).kind in
                         (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.RESHAPE, OpKind.REDUCE)
                         for n in a.nodes),
             lambda: f"kind mismatch: {a.name} holds other than elementwise work, broadcasts "
                     "and views beside its reductions"),
        need(lambda: model.only_consumer_is(p, a),
             lambda: f"producer {p.name} has other consumers (the scan's history would be "
                     "stored for them)"),
        need(lambda: len(scans) == 1 and _reads_scan_rows(shape, axes, next(iter(scans))),
             lambda: f"{a.name} reduces other than rows of the scan's tile (the axes after "
                     f"the scanned one of {list(next(iter(scans))[0])}, whole)"),
        need(lambda: row is not None and row * 4 * SCAN_ROW_BUFFERS <= ub,
             lambda: f"the code generator cannot hold the rows of {row} whole in UB beside "
                     "the scan's buffers (or a symbolic row: its size is not known to fit)"),
    ])


@pattern("scan_readout_epilogue", order=79, direction="bwd", mode="depth", level=2,
         refuses=("GK202", "GK205", "GK207"))
def scan_readout_epilogue(model, a):
    """A scan's kernel that reduces each row of its tile (``scan_readout``) takes in its single
    consumer area when that consumer is elementwise work (and views) on the reduced values,
    one value per row of the tile: the readout's skip term and gate (``(y + u * D) * z``).
    Every value it computes has the reduced values' element count, and every operand it
    reads from outside is a scalar constant or a value of exactly the shape of the op that
    reads it (one value per row of the tile, in the rows' order, loaded as a column): each
    element is the same function of the same operands. The reduced values are then never
    stored, only the consumer's results."""
    if model.kind(a) != OpKind.REDUCE or not _readout_area(a):
        return None
    found = _one_consumer(model, a)
    if found is None:
        return None
    c, external = found
    red = [n for n in a.nodes if ops.get(n.op).kind == OpKind.REDUCE and n.op != "Scan"]
    rows = red[0].outputs[0].type.numel
    return fuse_if(model, "scan_readout_epilogue", [a, c], [
        need(lambda: not external,
             lambda: f"{a.name} has a consumer outside the fusable region"),
        need(lambda: all(n.op == "Constant" or ops.get(n.op).kind == OpKind.ELEMWISE or
                         n.op in ("Reshape", "ExpandDims", "Squeeze") for n in c.nodes),
             lambda: f"kind mismatch: consumer {c.name} holds other than elementwise work and "
                     "views"),
        need(lambda: all(symbolic.eq(v.type.numel, rows) for n in c.nodes
                         if n.op != "Constant" for v in n.outputs),
             lambda: f"compute size mismatch: {c.name} computes other than one value per "
                     f"row ({rows})"),
        need(lambda: _per_row_operands(a, c),
             lambda: f"kind mismatch: consumer {c.name} reads a value from outside that is "
                     "not one per row in the rows' order (or a scalar)"),
    ])


def _readout_area(a) -> bool:
    """Whether area ``a`` holds Scans and reductions of rows of their tile (scan_readout's
    kernel)."""
    red = [n for n in a.nodes if ops.get(n.op).kind == OpKind.REDUCE]
    return any(n.op == "Scan" for n in red) and any(n.op != "Scan" for n in red)


def _per_row_operands(a, c) -> bool:
    """Whether every operand area ``c`` reads from outside ``a`` and ``c`` is a scalar or has
    the shape of the op reading it."""
    own = {id(n) for n in (*a.nodes, *c.nodes)}
    for n in c.nodes:
        for v in n.inputs:
            if v.producer is not None and id(v.producer) in own:
                continue
            if v.type.numel == 1:
                continue
            out = n.outputs[0].shape
            if len(v.shape) != len(out) or not all(map(symbolic.eq, v.shape, out)):
                return False
    return True


# float32 rows a scan's kernel with its readout keeps in UB per row of a tile, with margin
# (its queues, double-buffered, and the prologue's scratch tiles)
SCAN_ROW_BUFFERS = 48


def _reads_scan_rows(shape: tuple, axes: tuple, scan: tuple) -> bool:
    """Whether reductions of ``axes`` of ``shape`` reduce exactly the rows of a scan of
    ``scan`` (its shape, (its axis,)): the same shape, and the reduced axes are every axis
    after the scanned one."""
    sshape, (axis,) = scan
    rank = len(shape)
    return len(sshape) == rank and all(map(symbolic.eq, sshape, shape)) and \
        axis < rank - 1 and tuple(axes) == tuple(range(axis + 1, rank))


@pattern("reduce_rows", order=105, direction="fwd", mode="width", level=2,
         refuses=("GK202", "GK208", "GK209"))
def rows(model, a):
    """A row reduction pulls in the row reductions whose results it reads, and the row-wise
    work between them (elementwise work on values of its rows that spreads a reduction's
    per-row result over the row; a per-row bias or input read from outside stays before the
    kernel), read elsewhere too or not, when all of them reduce the last axis
    of one shape and compute only in its rows (each value a whole row or one value per row):
    the kernel holds each row whole for all of them and stores what other readers need. A
    router that picks its experts one by one (each pick a max and the expert holding it, the
    next pick's scores masked by it, each pick's weight a softmax read at it) is such a web of
    reductions over the experts, each read by several others. It runs after the products have
    taken their epilogues, and not for rows too long to hold whole in UB."""
    from graphkernel.codegen import targets

    sig = reduce_signatures(a)
    if model.kind(a) != OpKind.REDUCE or len(sig) != 1:
        return None
    ((shape, axes),) = sig
    prods = [p for p in model.producer_areas(a)
             if model.kind(p) in (OpKind.REDUCE, OpKind.BROADCAST)]
    if not prods:
        return None
    ub = targets.load(model.cfg.target).ub_bytes
    row = shape[-1] if shape else None

    def conditions(p):
        return [
            need(lambda: reduce_signatures(p) <= sig,
                 lambda: "the reductions differ in shape or axes"),
            *(need(lambda x=x: _row_area(x, shape, axes),
                   lambda x=x: f"kind mismatch: {x.name} computes other than values of its "
                   "rows (needs reductions of the last axis of one shape, elementwise work on "
                   "its rows)") for x in (a, p)),
            need(lambda: not _spreads_outside_rows(p, a, row),
                 lambda: f"kind mismatch: {p.name} broadcasts a per-row value read from "
                         "outside along the rows (it stays before the reductions' kernel)"),
            need(lambda: row * 4 * CHAIN_ROW_BUFFERS <= ub,
                 lambda: f"the code generator cannot hold the rows of {row} whole in UB for "
                         "every reduction"),
        ]

    return fuse_qualifying(model, "reduce_rows", a, prods, conditions)


def _spreads_outside_rows(p, a, row: int) -> bool:
    """Whether area ``p`` reads a value from outside ``p`` and ``a`` that holds one value per
    row (a last axis of one, more than one value) and spreads it along the rows, other than
    a row reduction's result: the per-row values the group may spread are those reductions
    compute (a per-row bias or input stays before the reductions' kernel)."""
    inside = {id(n) for n in (*p.nodes, *a.nodes)}
    for n in p.nodes:
        for v in n.inputs:
            q = v.producer
            if (q is None or id(q) not in inside) and v.type.rank and \
                    symbolic.eq(v.shape[-1], 1) and v.type.numel != 1 and row != 1 and \
                    (q is None or ops.get(q.op).kind != OpKind.REDUCE):
                return True
    return False


def _row_area(area, shape: tuple, axes: tuple) -> bool:
    """Whether ``area`` computes only values of the rows of ``shape`` (static last axis, the
    one ``axes`` reduces): every op elementwise, a broadcast or such a reduction (keeping the
    axis), every value a whole row or one value per row, every operand read whole rows, one
    value per row, a row shared by all rows (an iota over the experts) or a scalar."""
    rank = len(shape)
    if rank < 1 or axes != (rank - 1,) or not isinstance(shape[-1], int):
        return False

    def fits(s, whole_rows: bool) -> bool:
        s = tuple(s)
        if len(s) == rank and all(map(symbolic.eq, s[:-1], shape[:-1])):
            return symbolic.eq(s[-1], shape[-1]) or symbolic.eq(s[-1], 1)
        return not whole_rows and len(s) <= rank and \
            all(symbolic.eq(d, 1) for d in s[:-1]) and \
            (not s or symbolic.eq(s[-1], shape[-1]) or symbolic.eq(s[-1], 1))

    for n in area.nodes:
        if n.op == "Constant":
            continue
        kind = ops.get(n.op).kind
        if kind not in (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.REDUCE) or \
                n.op in ("Scan", "ElemAny") or \
                (kind == OpKind.REDUCE and not n.attrs.get("keep_dims")):
            return False
        if any(not fits(v.shape, True) for v in n.outputs) or \
                any(not fits(v.shape, False) for v in n.inputs):
            return False
    return True


def _reads_product(p) -> bool:
    """Whether area ``p`` reads a matrix product's result (seen through views)."""
    for n in p.nodes:
        for v in n.inputs:
            while v.producer is not None and v.producer.op in VIEW_OPS:
                v = v.producer.inputs[0]
            if v.producer is not None and v.producer.op in ops.PRODUCT_OPS:
                return True
    return False


def reduce_signatures(area) -> set[tuple]:
    """(input shape, reduced axes) of every reduction in the area."""
    out = set()
    for n in area.nodes:
        if ops.get(n.op).kind == OpKind.REDUCE and n.op != "ElemAny":
            x, axis = n.inputs[0].type, n.attrs.get("axis")
            if isinstance(axis, int):  # a Scan: along one axis, as a reduction over it
                out.add((x.shape, (axis % x.rank,)))
            else:
                out.add((x.shape, tuple(reduce_axes(x.rank, axis))))
    return out


def _one_consumer(model, a):
    """(the single consumer area, whether ``a`` has consumers outside the region) of a REDUCE
    area, or None."""
    if model.kind(a) != OpKind.REDUCE:
        return None
    cons, external = model.consumers(a)
    return (cons[0], external) if len(cons) == 1 else None


@pattern("reduce_bwd", order=75, direction="bwd", mode="depth",
         refuses=("GK202", "GK205", "GK207", "GK208"))
def bwd(model, a):
    """A REDUCE area pushes itself into its single consumer area when both have the same
    compute size and reduce the same axes of the same shape: the row-wise normalizations
    (LayerNorm, Softmax, RMSNorm), whose statistics are broadcast back over the rows they
    were reduced from. (A graphkernel addition to the split model.)"""
    found = _one_consumer(model, a)
    if found is None:
        return None
    c, external = found
    sigs = reduce_signatures(a) | reduce_signatures(c)
    return fuse_if(model, "reduce_bwd", [c, a], [
        need(lambda: not external,
             lambda: f"{a.name} has a consumer outside the fusable region"),
        need(lambda: model.kind(c) <= OpKind.REDUCE,
             lambda: f"kind mismatch: consumer {c.name} is {model.kind(c).name}"),
        need(lambda: model.size(c) == model.size(a),
             lambda: f"compute size mismatch: {model.size(a)} vs {model.size(c)}"),
        need(lambda: len(sigs) == 1, lambda: "the reductions differ in shape or axes"),
    ])


@pattern("reduce_output", order=76, direction="bwd", mode="depth",
         refuses=("GK202", "GK205", "GK207", "GK209"))
def output(model, a):
    """A REDUCE area takes in its single consumer area when that consumer is elementwise on
    the reduced values alone (its compute size is the reduction's result's, it broadcasts
    nothing into them): the division that makes a sum a mean (a global average pool), the
    scale or activation of a pooled value. The consumer reads nothing else but scalar
    constants (the vector kernels compute on a reduced value only with values of its own
    extent: a per-channel operand, or a batch norm's running statistics, would not be
    placed in the loop space); the reduced values are float32 (in one kernel a float16 sum
    would not be rounded, or overflow, where the graph says); its results go to products,
    other operators or the graph's outputs, not to vector work that would take the reduced
    values in (a batch norm's mean, subtracted from its input, is computed in the kernel that
    subtracts it). The kernel writes the consumer's result in place of the reduced values:
    one launch and one round trip of the reduced values fewer."""
    found = _one_consumer(model, a)
    if found is None:
        return None
    c, external = found
    read = [v for n in a.nodes for v in n.outputs if any(model.area(u) is c for u in v.users)]
    own = {id(n) for n in (*a.nodes, *c.nodes)}
    other = [v for n in c.nodes for v in n.inputs
             if not (v.producer is not None and (id(v.producer) in own or (
                 v.producer.op == "Constant" and v.type.numel == 1)))]
    vector_users = [x for x in model.consumers(c)[0] if model.kind(x) <= OpKind.BROADCAST]
    return fuse_if(model, "reduce_output", [a, c], [
        need(lambda: not external,
             lambda: f"{a.name} has a consumer outside the fusable region"),
        need(lambda: model.kind(c) <= OpKind.ELEMWISE,
             lambda: f"kind mismatch: consumer {c.name} is {model.kind(c).name} "
                     "(needs <= ELEMWISE)"),
        need(lambda: all(model.size(c) == v.type.numel for v in read),
             lambda: f"compute size mismatch: consumer {c.name} computes {model.size(c)} "
                     "values, not the reduced ones"),
        need(lambda: all(v.dtype == DType.float32 for v in read),
             lambda: f"consumer {c.name} reads reduced values of "
                     f"{next(v.dtype.value for v in read if v.dtype != DType.float32)} "
                     "(operands of different shapes: inside one kernel the sum would not be "
                     "rounded to it, a rounding or overflow the graph asks for)"),
        need(lambda: not vector_users,
             lambda: f"kind mismatch: consumer {c.name} is read by vector work "
                     f"({vector_users[0].name}), which takes the reduced values broadcast"),
        need(lambda: not other,  # (the vector kernels compute on reduced values alone)
             lambda: f"consumer {c.name} reads {other[0].name} beside the reduced values "
                     "(operands of different shapes: a reduced value is computed on with "
                     "scalar constants only)"),
    ])


# float32 rows of the reduced values a kernel over the rows keeps in UB per element of its
# row when a final step reduces them (accumulators, the steps' rows, the work row), with margin
REDUCED_ROW_BUFFERS = 16


def _column_signature(a):
    """(input shape, reduced axes) of the reductions of area ``a`` when they all reduce one
    run of leading or middle axes of one shape (a reduction over the rows: ``[B, R, L]`` to
    ``[B, 1, L]``), else None."""
    if any(n.op in ("Scan", "ElemAny") for n in a.nodes):
        return None
    sigs = reduce_signatures(a)
    if len(sigs) != 1:
        return None
    ((shape, axes),) = sigs
    if not axes or axes[-1] == len(shape) - 1 or \
            tuple(axes) != tuple(range(axes[0], axes[-1] + 1)):
        return None
    return shape, axes


def _spreads_over_reduced(v, shape: tuple, axes: tuple) -> bool:
    """Whether ``v`` is laid out as the reduced values: ``shape`` with the reduced axes 1
    (dims kept or 1, maybe fewer leading axes), so that it is one row of L per block of the
    loop space."""
    vs = tuple(v.shape)
    if len(vs) > len(shape):
        return False
    vs = (1,) * (len(shape) - len(vs)) + vs
    return all((symbolic.eq(d, 1) if k in axes else symbolic.eq(d, s) or symbolic.eq(d, 1))
               for k, (d, s) in enumerate(zip(vs, shape, strict=True)))


def _reduced_web(model, a, shape, axes):
    """The areas ``reduce_broadcast_back`` fuses with ``a``: (small, back, why). ``small``:
    the areas computing on the reduced values (of ``blocks * L`` elements, ``L`` the row
    kept), reducing them along their whole row included, reached from ``a`` through small
    areas; ``back``: the areas of the reduction's input size those values reach (the work
    broadcasting them back). ``why``: None, or why the web is not taken (GK-coded)."""
    row = symbolic.numel(shape[axes[-1] + 1:])
    blocks = symbolic.numel(shape[:axes[0]])
    reduced, full = symbolic.mul(blocks, row), symbolic.numel(shape)
    small, back, seen = [], [], {id(a)}
    todo = [a]
    while todo:
        x = todo.pop()
        cons, external = model.consumers(x)
        if external and x is not a:
            return small, back, f"{x.name} has a consumer outside the fusable region"
        for c in cons:
            if id(c) in seen:
                continue
            seen.add(id(c))
            if symbolic.eq(model.size(c), full) and model.kind(c) <= OpKind.BROADCAST:
                back.append(c)
                continue
            if model.kind(c) > OpKind.REDUCE or any(
                    n.op != "Constant" and not any(symbolic.eq(v.type.numel, k)
                                                   for k in (reduced, blocks, 1))
                    for n in c.nodes for v in n.outputs):  # (a row, a value per block)
                return small, back, (f"kind mismatch: {c.name} computes on {a.name}'s reduced "
                                     "values in another shape than theirs or the reduction's")
            small.append(c)
            todo.append(c)
    return small, back, None


def _scalar_constant(v) -> bool:
    """Whether ``v`` is one constant value, seen through views: a one-element Constant, or a
    Reshape of one that a transpose moved out of a norm left shared by its readers (read by
    the kernel as a scalar input: the same value at every element)."""
    while v.producer is not None and v.producer.op in VIEW_OPS and v.type.numel == 1:
        v = v.producer.inputs[0]
    return v.producer is not None and v.producer.op == "Constant" and v.type.numel == 1


def _web_refusal(model, a, small, back, shape, axes):
    """Why the web of ``a`` cannot be one kernel over the rows, or None."""
    row = symbolic.numel(shape[axes[-1] + 1:])
    blocks = symbolic.numel(shape[:axes[0]])
    own = {id(n) for x in (a, *small, *back) for n in x.nodes}
    inside_small = {id(n) for x in (a, *small) for n in x.nodes}
    for x in small:
        for n in x.nodes:
            for v in n.inputs:
                if v.producer is None or id(v.producer) not in own:
                    if not _scalar_constant(v):
                        return (f"operands of different shapes: {x.name} reads {v.name} beside "
                                "the reduced values (they are computed on with scalar "
                                "constants only)")
                elif id(v.producer) in inside_small and v.dtype != DType.float32 and \
                        model.area(v.producer) is not x:
                    return (f"operands of different shapes: {x.name} reads reduced values of "
                            f"{v.dtype.value} (inside one kernel they would not be rounded "
                            "to it)")
            if ops.get(n.op).kind == OpKind.REDUCE:
                xt = n.inputs[0].type
                cax = reduce_axes(xt.rank, n.attrs.get("axis"))
                if n.op in ("Scan", "ElemAny") or not cax or \
                        tuple(cax) != tuple(range(xt.rank - len(cax), xt.rank)) or \
                        not symbolic.eq(symbolic.numel(xt.shape[cax[0]:]), row) or \
                        not symbolic.eq(xt.numel, symbolic.mul(blocks, row)):
                    return (f"operands of different shapes: {x.name} reduces other than rows "
                            f"of {row} of the reduced values")
                if not isinstance(row, int):
                    return (f"the code generator cannot hold the rows of {row} reduced values "
                            "whole (symbolic: not known to fit the UB)")
                from graphkernel.codegen import targets

                ub = targets.load(model.cfg.target).ub_bytes
                if row * 4 * REDUCED_ROW_BUFFERS > ub:
                    return (f"the code generator cannot hold the rows of {row} reduced values "
                            f"whole in UB ({REDUCED_ROW_BUFFERS} rows of float32 over {ub} "
                            "bytes)")
    for c in back:
        spread = set(inside_small)
        for n in c.nodes:  # (topological order)
            if any(v.producer is not None and id(v.producer) in spread for v in n.inputs):
                spread.add(id(n))
            elif n.op != "Constant" and n.op not in VIEW_OPS:
                return (f"operands of different shapes: {c.name} computes {n.name} apart from "
                        "the reduced values (work of the first pass's shape the second pass "
                        "would need again)")
            for v in n.inputs:
                if v.producer is None or id(v.producer) not in inside_small:
                    continue
                if not _spreads_over_reduced(v, shape, axes) or v.type.numel == \
                        symbolic.numel(shape):
                    return (f"operands of different shapes: {c.name} reads {v.name} of "
                            f"{model.area(v.producer).name} other than as the reduced values "
                            "broadcast back over the reduced axes")
    return None


@pattern("reduce_broadcast_back", order=81, direction="bwd", mode="width", level=2,
         refuses=("GK202", "GK207", "GK209"))
def broadcast_back(model, a):
    """A REDUCE area over one run of leading or middle axes (``[B, R, L]`` to ``[B, 1, L]``:
    a global response norm's sums of squares over H, W of ``[N, H, W, C]``) fuses with the
    areas computing on its reduced values (elementwise work with scalar constants, and
    reductions of the reduced rows along their whole row: the norms' mean over C) and the
    areas of the reduction's input size that read them broadcast back over the reduced axes
    (``gamma * (x * Nx) + beta + x``), all or none: one kernel over the rows, which
    accumulates each column tile of a block in UB, runs the work on the reduced row once it
    is complete (a column tile then holds the whole row: L static and fitting the UB), then
    passes over the block's rows again, loading the inputs it reads anew, and computes the
    broadcast-back work. The reduced values are float32 and read by nothing outside (the
    areas reading them are all taken), and the work broadcasting them back reads no
    full-size value of the reduction's area (a tile of the first pass is gone by the
    second) and computes nothing apart from the reduced values (``tanh(s) + x * d``: ``x * d``
    stays in its own kernel, which may load a slice in place)."""
    if model.kind(a) != OpKind.REDUCE:
        return None
    sig = _column_signature(a)
    if sig is None:
        return None
    shape, axes = sig
    small, back, why = _reduced_web(model, a, shape, axes)
    if not back and why is None:
        return None  # (nothing broadcasts the reduced values back)
    areas = [a, *small, *back]
    return fuse_if(model, "reduce_broadcast_back", areas, [
        lambda: why,
        lambda: _web_refusal(model, a, small, back, shape, axes),
    ])


# float32 rows of one 32-byte block a kernel over the rows holds per row of a block when
# its tile holds every row of the block (its queues, double-buffered, the accumulators and
# the scratch tiles), with margin: the code generator checks its own buffer plan
# (``legalize._block_fits``) and splits the kernel into phase kernels when it does not fit
BLOCK_ROW_BUFFERS = 12


@pattern("reduce_columns", order=82, direction="fwd", mode="depth", level=2,
         refuses=("GK202", "GK209"))
def columns(model, a):
    """A reduction over one run of leading or middle axes (``[B, R, L]`` to ``[B, 1, L]``)
    pulls in the reduction of the same axes of the same shape whose result its work reads
    broadcast back (LayerNorm over the channels of ``[B, C, L]``: the variance sums the
    squares of ``x`` minus the mean over C; SqueezeBERT's norm once its permutes are gone),
    with the work between them, when both compute only values of the reduction's shape, of
    its reduced shape or scalars, and read from outside only values of the reduction's
    shape and scalar constants: one kernel whose row tile holds every row of a block for a
    column tile (``Schedule.block_tile``), each reduction complete within the tile. Only
    for a static R whose rows fit the UB at the narrowest column tile; otherwise each
    reduction keeps its own kernel over the rows (``reduce_broadcast_back``)."""
    from graphkernel.codegen import targets
    from graphkernel.codegen.vector.schedule import MAX_TILE_ROWS

    if model.kind(a) != OpKind.REDUCE:
        return None
    sig = _column_signature(a)
    if sig is None:
        return None
    prods = [p for p in model.producer_areas(a)
             if model.kind(p) == OpKind.REDUCE and _column_signature(p) == sig]
    if len(prods) != 1:
        return None
    p = prods[0]
    shape, axes = sig
    rows = symbolic.numel(shape[axes[0]:axes[-1] + 1])
    ub = targets.load(model.cfg.target)
    return fuse_if(model, "reduce_columns", [a, p], [
        *(need(lambda x=x: _column_area(x, shape, axes),
               lambda x=x: f"kind mismatch: {x.name} computes or reads other than values of "
                           f"the reduction's shape {list(shape)}, of its reduced shape and "
                           "scalars") for x in (a, p)),
        need(lambda: isinstance(rows, int) and rows <= MAX_TILE_ROWS and
             rows * ub.ub_align_bytes * BLOCK_ROW_BUFFERS <= ub.ub_bytes,
             lambda: f"the code generator cannot hold the rows of a block ({rows}) in one "
                     f"tile ({BLOCK_ROW_BUFFERS} rows of {ub.ub_align_bytes} bytes each over "
                     f"{ub.ub_bytes} bytes of UB)"),
    ])


def _column_area(area, shape: tuple, axes: tuple) -> bool:
    """Whether ``area`` computes only values of ``shape`` or of its reduced shape (the
    reduced axes 1) by elementwise work, broadcasts of the reduced values and float32
    reductions of ``axes`` keeping them, and reads from outside only values of ``shape``
    and one-element constants (seen through views)."""
    rank = len(shape)
    own = {id(n) for n in area.nodes}

    def whole(s) -> bool:
        return len(s) == rank and all(map(symbolic.eq, s, shape))

    def reduced(s) -> bool:
        return len(s) == rank and all(
            symbolic.eq(d, 1) if k in axes else symbolic.eq(d, e)
            for k, (d, e) in enumerate(zip(s, shape, strict=True)))

    for n in area.nodes:
        if n.op == "Constant":
            continue
        if n.op in VIEW_OPS and all(v.type.numel == 1 for v in (*n.inputs, *n.outputs)):
            continue  # (a view of a scalar: the mean's element count seen as [1, 1, 1])
        if n.op in VIEW_OPS and whole(n.inputs[0].shape) and not any(
                id(u) in own for v in n.outputs for u in v.users):
            continue  # (a view of a result, stored as it is: the next convolution's input)
        kind = ops.get(n.op).kind
        if kind not in (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.REDUCE) or \
                n.op in ("Scan", "ElemAny", "BroadcastTo"):
            return False
        if kind == OpKind.REDUCE and (not n.attrs.get("keep_dims") or
                                      tuple(reduce_axes(rank, n.attrs.get("axis"))) != axes or
                                      n.outputs[0].dtype != DType.float32):
            return False
        if any(not (whole(v.shape) or reduced(v.shape)) for v in n.outputs):
            return False
        for v in n.inputs:
            if v.producer is not None and id(v.producer) in own:
                continue
            if not (whole(v.shape) or _scalar_constant(v)):
                return False
    return True
