"""Extended fusions (AutoFuse's): concat, transpose and row lookups (opt_level 2), gather
(3)."""

from __future__ import annotations

import math

from graphkernel import symbolic
from graphkernel.ops import PRODUCT_OPS, VIEW_OPS, OpKind
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


@pattern("concat", order=110, direction="fwd", mode="width", level=2,
         refuses=("GK209",))
def concat(model, a):
    """A Concat with elementwise/broadcast/slice producers, or an elementwise consumer (the
    Concat may also leave the kernel: its tile is stored as well as consumed). Producers are
    pulled in only where the code generator takes the result: operands of one shape (stored
    operand by operand), or one op every operand ends with (run once after the Concat).
    Rotary-like row work takes the column slices it alone reads, and a norm over the same
    last axis (the Q/K norms before rotary embedding)."""
    if not _single(a, "Concat"):
        return _column_slices(model, a)
    node = a.nodes[0]
    columns = _columns(node, model.cfg)
    prods = [p for p in model.producer_areas(a) if model.only_consumer_is(p, a) and (
        model.kind(p) <= OpKind.SLICE or (columns and _row_work(p, model.cfg)))]
    cons, _ = model.consumers(a)
    # a Concat of column pieces is an ordinary tile to the code generator: its elementwise
    # consumer joins with the pieces (no other pattern takes a producer of kind CONCAT)
    tail = cons if prods and len(cons) == 1 and model.kind(cons[0]) <= OpKind.BROADCAST and \
        columns else []
    if prods:
        got = fuse_if(model, "concat", [a] + prods + tail, [need(
            lambda: _generated(node, prods, model.cfg),
            lambda: f"{a.name}: operands of different shapes not computed by the same "
                    "elementwise ops, or one value read through two views (the code generator "
                    "loads each input once; a Concat of kernel inputs piece by piece, after "
                    "moving the ops every operand shares past it)")])
        if got is not None:
            return got
    if len(cons) == 1 and model.kind(cons[0]) <= OpKind.BROADCAST:
        return fuse_if(model, "concat", [cons[0], a], [])
    return None


def _column_slices(model, a):
    """An area of rotary-like row work takes the slices of the last axis only it reads (the
    rotated part of a partial rotary embedding, sliced again into halves), and the row
    normalization it reads (_row_norm: the Q/K norms before rotary embedding)."""
    from graphkernel.codegen.vector.views import column_slice

    if not _row_work(a, model.cfg):
        return None
    prods = [p for p in model.producer_areas(a) if model.only_consumer_is(p, a)
             and (all(column_slice(n) is not None for n in p.nodes) or _row_norm(model, p, a))]
    return fuse_if(model, "concat", [a] + prods, []) if prods else None


# float32 rows a norm + rotary kernel keeps in UB per row of the loop space, with margin (the
# generated plans of LayerNorm/RMSNorm + full or partial rotary take 15 to 17)
ROW_BUFFERS = 24


def _row_norm(model, p, a) -> bool:
    """Whether producer ``p`` of row work ``a`` reduces only along the last axis that ``a``
    cuts into columns (a LayerNorm/RMSNorm over the head dimension before rotary embedding):
    the code generator's rows are then the reduced rows, each held whole in one tile, and
    the row work's slices are columns of those rows. Every value ``p`` hands to ``a`` is
    full-size with that last axis (the normalized rows, not their statistics). The kernel
    holds whole rows (columns are offsets into them): a row must leave room in the UB for
    ROW_BUFFERS float32 rows, else the norm stays a kernel of its own, whose rows can be
    reduced chunk by chunk."""
    from graphkernel import ops, symbolic
    from graphkernel.codegen import targets
    from graphkernel.patterns.reduce import reduce_signatures

    if model.kind(p) != OpKind.REDUCE or any(
            n.op in ("Scan", "ElemAny") for n in p.nodes):
        return False
    sigs = reduce_signatures(p)
    rows = {shape[-1] for shape, axes in sigs}
    if not sigs or any(axes != (len(shape) - 1,) for shape, axes in sigs) or len(rows) != 1:
        return False
    (row,) = rows
    (shape, _), *_ = sigs
    full = symbolic.numel(shape)
    if not isinstance(row, int) or row < 2 or row * 4 * ROW_BUFFERS > targets.load(
            model.cfg.target).ub_bytes or any(
            ops.get(n.op).kind == OpKind.REDUCE and not symbolic.eq(n.inputs[0].type.numel, full)
            for n in p.nodes):
        return False
    # the values handed over, and the views of them in ``a``, keep that last axis whole
    todo = [v for q, v, _ in model.producers(a) if q is p]
    while todo:
        v = todo.pop()
        if not v.shape or not symbolic.eq(v.shape[-1], row) or not symbolic.eq(
                v.type.numel, full):
            return False
        todo += [u.outputs[0] for u in v.users if u.op in VIEW_OPS and model.area(u) is a]
    return True


def _columns(node, cfg) -> bool:
    """A Concat of column pieces the code generator copies into one tile (pieces on a UB
    block by masked vector copies, the others by the scalar unit)."""
    from graphkernel.codegen.vector.schedule import elementwise
    from graphkernel.codegen.vector.views import column_concat

    return column_concat(node, elementwise)


def _generated(node, prods, cfg) -> bool:
    """Whether the code generator takes ``node`` (a Concat) with ``prods`` pulled in."""
    from graphkernel.codegen.vector.schedule import elementwise
    from graphkernel.codegen.vector.views import sinks_to_inputs

    if _columns(node, cfg):
        return True  # pieces of rows copied to their columns (a value read through slices)
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




@pattern("lookup", order=113, direction="fwd", mode="width", level=2,
         refuses=("GK209",))
def lookup(model, a):
    """A Gather of whole rows of a table by integer indices (an embedding lookup) joins a
    kernel that consumes its rows: elementwise work (a position table added, a scale) or a
    reduction along the rows (LayerNorm, RMSNorm). The kernel loads each row of the table
    by its index (the scalar unit reads the index); a row of the kernel's loop space is a
    row of the table. Other readers of the rows (a decoder's first residual) read them
    from the kernel, which stores them too."""
    from graphkernel import ops
    from graphkernel.fusion import row_lookup

    if not _single(a, "Gather") or not row_lookup(a.nodes[0]):
        return None
    row = a.nodes[0].inputs[0].shape[-1]
    for c in model.consumers(a)[0]:
        if model.kind(c) > OpKind.REDUCE and any(  # (other lookups it took are loads too)
                ops.get(n.op).kind > OpKind.REDUCE and not row_lookup(n) for n in c.nodes):
            continue
        got = fuse_if(model, "lookup", [c, a], [need(
            lambda c=c: _rows_reduced(c, row),
            lambda c=c: f"{c.name} reduces other than rows of {row} (each row of a kernel "
                        "reading a lookup is one row of the table)")])
        if got is not None:
            return got
    return None


@pattern("split_store", order=114, direction="fwd", mode="width", level=2)
def split_store(model, a):
    """A Split of an axis before the last joins the vector kernel that computes its operand:
    that kernel stores each part's rows where the part lives (a fused QKV projection's
    rotated Q and K and its V, written for the attention operator), instead of a launch
    that copies the parts."""
    if not _single(a, "Split"):
        return None
    prods = model.producer_areas(a)
    if len(prods) != 1 or model.kind(prods[0]) > OpKind.CONCAT or any(
            n.op in PRODUCT_OPS for n in prods[0].nodes) or all(
            n.op in VIEW_OPS for n in prods[0].nodes):
        return None  # (a value the kernel computes: parts of an input are views of it)
    return fuse_if(model, "split_store", [prods[0], a], [])


def _rows_reduced(a, row) -> bool:
    """Whether every reduction of ``a`` is along the last axis only, of length ``row`` (or
    ``a`` does not reduce)."""
    from graphkernel import symbolic
    from graphkernel.patterns.reduce import reduce_signatures

    return all(axes == (len(shape) - 1,) and symbolic.eq(shape[-1], row)
               for shape, axes in reduce_signatures(a))


def _private_sources(a) -> bool:
    """Every value an area of views reads from outside is read by nothing else: in a kernel
    with its consumer it is one strided load (the head split before rotary embedding)."""
    mine = {id(n) for n in a.nodes}
    return all(len(x.uses) == 1 for n in a.nodes for x in n.inputs
               if x.producer is None or id(x.producer) not in mine)


@pattern("transpose", order=112, direction="fwd", mode="width", level=2,
         refuses=("GK209",))
def transpose(model, a):
    """A Transpose fused with its elementwise neighbours (its producers, else a consumer)
    when the last axis stays last (the code generator moves rows of a transposed value:
    strided loads and stores), or when the whole value is transposed in UB by one Gather
    (its kernel then runs as one tile on one core). A producer doing rotary's row work
    (slices of the last axis and a Concat of them) takes a Transpose keeping the last axis
    too: it stores its tile as it is and, row by row, transposed (a key cache returned in
    [B, N, S, D] beside the [B, S, N, D] value the attention reads)."""
    moved = [n for n in a.nodes if n.op not in VIEW_OPS]
    if len(moved) != 1 or moved[0].op != "Transpose" or (
            a.ops > 1 and not _private_sources(a)):
        return None
    rows, why = keeps_rows(moved[0]), _in_ub_refusal(moved[0])
    # rows of the transposed value moved by strided copies, or the whole value gathered in UB
    moved_whole = [need(lambda: rows or not why,
                        lambda: f"{a.name} moves the last axis and cannot be transposed in "
                                f"UB: {why}")]
    perm = list(moved[0].attrs["perm"])
    keeps_last = [need(lambda: perm[-1] == len(perm) - 1 or (not rows and not why),
                       lambda: f"{a.name} moves the last axis " + (
                           f"and cannot be transposed in UB: {why}" if why else
                           "past axes of extent 1 (a strided load of its rows would be rows "
                           "of another length than the kernel's)"))]
    prods = [p for p in model.producer_areas(a)
             if (model.kind(p) <= OpKind.BROADCAST or _scans(p)
                 or _row_reductions(p, moved[0].inputs[0].shape[-1])
                 or perm[-1] == len(perm) - 1 and _row_work(p, model.cfg))
             and (model.only_consumer_is(p, a) or perm[-1] == len(perm) - 1)]
    if prods:  # the producers' kernel stores the transposed value (a scan's: rows only, its
        # kernel runs over blocks of rows, never one tile)
        return fuse_if(model, "transpose", [a] + prods, keeps_last if any(
            _scans(p) for p in prods) else moved_whole)
    cons, external = model.consumers(a)
    if len(cons) == 1 and not external and (model.kind(cons[0]) <= OpKind.BROADCAST
                                            or _row_work(cons[0], model.cfg)
                                            or _row_reductions(cons[0], None if _gathered(
                                                moved[0]) else moved[0].outputs[0].shape[-1])
                                            and _reduced_whole(cons[0], moved[0].outputs[0])):
        return fuse_if(model, "transpose", [cons[0], a], keeps_last)  # (gathered whole)
    return None


def keeps_rows(t) -> bool:
    """Whether Transpose ``t`` keeps the rows of its input whole: the last axis of extent
    other than 1 stays the last such axis (axes of extent 1 move no data)."""
    shape, perm = tuple(t.inputs[0].shape), list(t.attrs["perm"])
    real = [k for k in range(len(shape)) if not symbolic.eq(shape[k], 1)]
    moved = [k for k in perm if not symbolic.eq(shape[k], 1)]
    return not real or moved[-1] == real[-1]


def _in_ub_refusal(t) -> str:
    """Why the code generator cannot transpose the value of Transpose ``t`` in UB (a Gather
    of the whole value as one tile); "" when it can."""
    import numpy as np

    from graphkernel.codegen.vector.schedule import gather_transpose_refusal

    shape, perm = tuple(t.inputs[0].shape), list(t.attrs["perm"])
    if not all(isinstance(d, int) for d in shape):
        return "symbolic extents"
    out = [shape[p] for p in perm]
    ostrides = [int(np.prod(out[k + 1:], dtype=np.int64)) for k in range(len(out))]
    strides = [0] * len(shape)
    for k, p in enumerate(perm):
        strides[p] = ostrides[k]
    return gather_transpose_refusal(shape, tuple(strides), t.outputs[0].dtype)


def _row_reductions(a, row) -> bool:
    """An area that reduces, each reduction along the last axis only, of length ``row`` (the
    transposed value's rows; None: any), none a scan and no matrix product among its ops
    (LayerNorm, RMSNorm, softmax over rows; a MIX epilogue takes no transpose): each row is
    reduced within itself, so the whole value as one tile (the in-UB transpose) or rows
    stored or loaded strided (a transpose keeping the last axis) serve it as they serve
    elementwise work."""
    from graphkernel import ops
    from graphkernel.patterns.reduce import reduce_signatures

    reductions = [n for n in a.nodes if ops.get(n.op).kind == OpKind.REDUCE]
    if not reductions or any(n.op == "Scan" for n in reductions) or any(
            n.op in PRODUCT_OPS for n in a.nodes):  # (no transpose in a MIX epilogue)
        return False
    if row is None:
        return all(axes == (len(shape) - 1,) for shape, axes in reduce_signatures(a))
    return _rows_reduced(a, row)


def _reduced_whole(a, v) -> bool:
    """Whether every reduction of area ``a`` reduces values as many as ``v`` has: ``v`` is
    not read broadcast there (a relative-position bias of ``[heads, N, N]`` added to the
    scores of every window before their softmax), which a transposed input the kernel gathers
    in UB cannot be (the code generator refuses it, and the kernel would run op by op)."""
    from graphkernel import ops

    def numel(shape) -> int | None:
        return math.prod(shape) if all(isinstance(d, int) for d in shape) else None

    want = tuple(v.shape)
    for n in a.nodes:
        if ops.get(n.op).kind != OpKind.REDUCE:
            continue
        got = tuple(n.inputs[0].shape)
        if got != want and (numel(got) is None or numel(got) != numel(want)):
            return False
    return True


def _gathered(t) -> bool:
    """Whether the kernel reading Transpose ``t`` of its input gathers the whole value in UB
    (the last axis moves, or the rows are read merged: a window merge, a patch merge; the
    code generator's own test) rather than loading rows strided: its tile is then the
    transposed value as it is, and a reduction may take rows of any length of it (Swin's
    patch merge: rows of 4 C after a transpose of rows of C)."""
    from graphkernel.codegen.vector.schedule import reshaped_read

    return not _in_ub_refusal(t) and (not keeps_rows(t) or reshaped_read(t.outputs[0]))


def _scans(a) -> bool:
    """An area whose reductions are all scans: its results are full-size, stored as any
    elementwise result is (through the transpose's map)."""
    from graphkernel import ops

    red = [n for n in a.nodes if ops.get(n.op).kind == OpKind.REDUCE]
    return bool(red) and all(n.op == "Scan" for n in red)


def _row_work(a, cfg) -> bool:
    """An area of elementwise work, slices of the last axis and Concats of them (rotary
    embedding): the code generator reads a transposed input of it as a strided load."""
    from graphkernel import ops
    from graphkernel.codegen.vector.views import column_slice

    return any(n.op == "Concat" for n in a.nodes) and all(
        ops.get(n.op).kind <= OpKind.BROADCAST or column_slice(n) is not None
        or (n.op == "Concat" and _columns(n, cfg)) for n in a.nodes)
