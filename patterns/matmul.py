"""matmul_depth: epilogue fusion of a matmul with the work on its result."""

from __future__ import annotations

from functools import lru_cache

from graphkernel import ops, symbolic
from graphkernel.codegen import targets
from graphkernel.codegen.cube.epilogue import (
    EPILOGUE_FORMS,
    ROW_REDUCTIONS,
    keeps_rows,
    reduces_along,
    splits_rows,
)
from graphkernel.codegen.cube.schedule import whole_rows_refusal
from graphkernel.codegen.cube.tiling import row_limit
from graphkernel.codegen.instructions import INSTRUCTIONS
from graphkernel.ops import OpKind
from graphkernel.patterns.base import first_failure, fuse_if, need, pattern
from graphkernel.symbolic import eq

MATMULS = ("MatMul", "BatchMatMul")
EPILOGUE_KINDS = (OpKind.RESHAPE, OpKind.ELEMWISE, OpKind.BROADCAST)


def _epilogue_area(a) -> bool:
    """One MatMul/BatchMatMul, and besides it only elementwise work, views and reductions
    along N (the epilogue fused so far) or Transposes (of its operands, folded into
    isTrans)."""
    mms = [n for n in a.nodes if n.op in MATMULS]
    return len(mms) == 1 and all(
        n.op in MATMULS or n.op == "Transpose" or n.op in ROW_REDUCTIONS
        or ops.get(n.op).kind in EPILOGUE_KINDS for n in a.nodes)


@pattern("matmul_depth", order=100, direction="bwd", mode="depth",
         refuses=("GK202", "GK209", "GK210", "GK211"))
def matmul_depth(model, a):
    """A matmul area (a MatMul or BatchMatMul, alone or with the epilogue fused so far) fuses
    with its consumer areas when every one is elementwise or broadcast: the bias, scale,
    mask, activation, residual add or cast run on each tile of the product in one MIX
    kernel. A consumer that reduces along the product's last axis N and broadcasts back
    (LayerNorm, RMSNorm, softmax: ReduceSum/ReduceMax/ReduceMin of that axis only) joins too
    when a base tile can hold whole rows of N: N static and within L0B/L0C, and the code
    generator's own epilogue, buffer plan and tiler fit the rows in UB; then the consumers
    it cannot take (the next product reading the residual sum) stay outside and read the
    values they need, which the kernel writes as further outputs (when joining every one it
    can take would close a cycle, the reductions join first and each other consumer only if
    it closes none). Such a region is taken
    whole, with the bias and residual the vector patterns (which run first) put into it:
    the product's epilogue wins over the normalisation's vector kernel explicitly, not by
    pattern order. A consumer holding an op the epilogue builder has no instruction form
    for (Log1p, a comparison's Select) stays outside: joined, it would have the code
    generator take the kernel apart again. The codegen may still decline what later passes
    change (the kernel is
    then split into a cube kernel and a vector one, with the reason). Applied again to the
    merged area, it takes the epilogue's next consumer."""
    if not _epilogue_area(a):
        return None
    cons, _ = model.consumers(a)
    if not cons:
        return None
    mm = next(n for n in a.nodes if n.op in MATMULS)
    last = mm.outputs[0].type.shape[-1]
    why = {id(c): first_failure(_epilogue_conditions(model, c, last, mm)) for c in cons}
    rows = [c for c in cons if why[id(c)] is None and _reduces(c)]
    if rows and (no := _generator_refuses(model, a, [c for c in cons if why[id(c)] is None],
                                          mm)):
        model.reject("matmul_depth", [a, *rows], no)
        return None
    if rows:
        # a row reduction joins; what the epilogue cannot take reads the kernel's outputs
        for c in cons:
            if why[id(c)] is not None:
                model.reject("matmul_depth", [a, c], f"left outside: {why[id(c)]}")
        cons = [c for c in cons if why[id(c)] is None]
        if model.creates_cycle([a, *cons]):  # greedily, the reductions first
            kept: list = []
            for c in rows + [c for c in cons if c not in rows]:
                if model.creates_cycle([a, *kept, c]):
                    model.reject("matmul_depth", [a, c], "left outside: joined with the "
                                 "others it would close a cycle")
                else:
                    kept.append(c)
            if not kept:
                return None
            cons = kept
    return fuse_if(model, "matmul_depth", [a, *cons],
                   [cond for c in cons for cond in _epilogue_conditions(model, c, last, mm)])


def _generator_refuses(model, a, cons, mm) -> str | None:
    """Why the code generator cannot run ``a`` with ``cons`` as one MIX kernel holding whole
    rows (its own epilogue builder, buffer plan and tiler decide), or None."""
    members = sorted([n for x in (a, *cons) for n in x.nodes], key=lambda n: model.index[id(n)])
    ids = {id(n) for n in members}
    leaving = [v for n in members for v in n.outputs
               if id(v) in model.outputs or any(id(u) not in ids for u in v.users)]
    why = whole_rows_refusal(mm, members, leaving, _target(model.cfg.target))
    return None if why is None else f"the code generator cannot hold the rows: {why}"


def _reduces(c) -> bool:
    return any(n.op in ROW_REDUCTIONS for n in c.nodes)


@lru_cache(maxsize=8)
def _target(name: str) -> targets.Target:
    return targets.load(name)


def _epilogue_conditions(model, c, last, mm) -> list:
    """A consumer area the epilogue may take: elementwise or broadcast work, its views
    keeping the product's last axis (the epilogue runs on tiles of the product's rows), or
    also reductions along that axis (with views of the reduced values) when whole rows of it
    fit a base tile. A view that splits N into trailing axes after M (a convolution's
    [N, M, H*W] product seen as [N, M, H, W]) keeps the rows too."""
    views = [n for n in c.nodes if ops.get(n.op).kind == OpKind.RESHAPE]
    rows = mm.outputs[0].type.shape[-2]  # M (a view may split N after it: [.., M, H, W])
    reds = [n for n in c.nodes if n.op in ROW_REDUCTIONS]
    formed = need(lambda: all(_epilogue_op(n) for n in c.nodes),
                  lambda: f"consumer {c.name} holds "
                          f"{next(n.op for n in c.nodes if not _epilogue_op(n))}, which a "
                          "matmul epilogue does not run (elementwise instruction forms only)")
    if not reds:
        return [
            need(lambda: model.kind(c) <= OpKind.BROADCAST,
                 lambda: f"kind mismatch: consumer {c.name} is {model.kind(c).name}"),
            need(lambda: all(ops.get(n.op).kind in EPILOGUE_KINDS for n in c.nodes),
                 lambda: f"consumer {c.name} holds more than elementwise work"),
            need(lambda: all(keeps_rows(tuple(v.outputs[0].type.shape), rows, last)
                             or _stored_heads(model, c, v, last) for v in views),
                 lambda: f"consumer {c.name} views the product with another last axis"),
            need(lambda: _wider(c, mm) is None,
                 lambda: f"consumer {c.name} holds {_wider(c, mm).op}, which broadcasts the "
                         "product over more values than its tile (a squeeze-and-excitation "
                         "gate scaling its input)"),
            formed,
        ]
    spec = _target(model.cfg.target)
    whole = symbolic.numel(mm.outputs[0].type.shape)
    size = mm.inputs[1].dtype.itemsize
    limit = row_limit(mm.inputs[0].dtype.itemsize, size, spec)
    return [
        need(lambda: all(n.op in ROW_REDUCTIONS or ops.get(n.op).kind in EPILOGUE_KINDS
                         for n in c.nodes),
             lambda: f"consumer {c.name} holds more than elementwise work and reductions "
                     "along N"),
        need(lambda: all(reduces_along(n, last) for n in reds),
             lambda: f"consumer {c.name} reduces other axes than the product's last "
                     f"({symbolic.canon(last)})"),
        need(lambda: all(v.outputs[0].type.shape[-1:] in ((last,), (1,)) or
                         _stored_view(model, c, v, last) for v in views),
             lambda: f"consumer {c.name} views the product with another last axis"),
        need(lambda: all(eq(symbolic.numel(v.type.shape), whole) for v in _leaving(model, c)),
             lambda: f"consumer {c.name} writes reduced values (only rows of the product "
                     "leave a MIX kernel: a reduction along N is broadcast back)"),
        need(lambda: symbolic.is_static(last) and int(last) <= limit,
             lambda: f"consumer {c.name} reduces rows of N = {symbolic.canon(last)}: a base "
                     f"tile holds whole rows of at most {limit} ({size}-byte operands, "
                     f"target {spec.name})"),
        formed,
    ]



def _wider(c, mm):
    """A node of consumer area ``c`` computing more values than the product ``mm`` (static
    sizes), or None: an epilogue runs on the product's tiles, so it cannot broadcast the
    product out (a gate of [N, C] times an input of [N, C, H, W])."""
    whole = symbolic.numel(mm.outputs[0].type.shape)
    if not symbolic.is_static(whole):
        return None
    for n in c.nodes:
        for v in n.outputs:
            size = symbolic.numel(v.type.shape)
            if symbolic.is_static(size) and int(size) > int(whole):
                return n
    return None


def _epilogue_op(n) -> bool:
    """Whether the MIX epilogue builder runs ``n`` (``cube/epilogue.py``): views,
    broadcasts, reductions along N and the elementwise ops of the instruction table in an
    epilogue form; anything else would make the code generator split the kernel again."""
    if n.op == "Constant" or n.op in ROW_REDUCTIONS or n.op in ops.VIEW_OPS or \
            ops.get(n.op).kind in (OpKind.RESHAPE, OpKind.BROADCAST):
        return True
    rule = INSTRUCTIONS.get(n.op)
    return rule is not None and rule.form in EPILOGUE_FORMS


def _stored_view(model, c, v, last) -> bool:
    """Whether view ``v`` in epilogue ``c`` only names a result the kernel stores, whole
    rows of N split into trailing axes (a norm over a projection's heads times head size
    seen as [.., heads, head size]): nothing in the kernel reads it, the rows are written
    as computed, the view is the layout of the stored value."""
    out = v.outputs[0]
    return splits_rows(tuple(out.type.shape), last) and \
        all(model.area(u) is not c for u in out.users) and \
        v.inputs[0].type.shape[-1:] == (last,)


def _stored_heads(model, c, v, last) -> bool:
    """A view splitting the product's rows into heads that only names what an elementwise
    epilogue stores (``_stored_view``: DBRX's clipped Q, K and V pieces seen as heads), when
    the transposes reading the heads join their readers' kernels (the ``transpose`` pattern
    runs): without it the product's own kernel writes the heads transposed
    (``product_views``), which a view in its epilogue would prevent."""
    from graphkernel.fusion import _pattern_on

    return _pattern_on("transpose", model.cfg) and _stored_view(model, c, v, last)


def _leaving(model, c) -> list:
    """The values of area ``c`` read outside it (or graph outputs)."""
    return [v for n in c.nodes for v in n.outputs
            if id(v) in model.outputs or any(model.area(u) is not c for u in v.users)]


def _views_only(a) -> bool:
    """An area of views and transposes (and, read as an operand, broadcasts and slices)
    alone."""
    return all(_addressing(n) for n in a.nodes)


def _addressing(n) -> bool:
    return n.op in ("Transpose", "BroadcastTo", "Slice", "StridedSlice") or \
        n.op in ops.RESHAPE_OPS


def _strided_refusal(model, areas, mm) -> str | None:
    """Why product ``mm`` cannot read its operands and write its result through the views of
    ``areas`` taken into its kernel (``codegen/cube/strided.py``), or None."""
    from graphkernel.codegen.cube.schedule import MAX_BATCH_AXES
    from graphkernel.codegen.cube.strided import plan

    ids = {id(n) for a in areas for n in a.nodes}

    def leaves(v) -> bool:
        return id(v) in model.outputs or any(id(u) not in ids for u in v.users)

    p = plan(mm, lambda n: id(n) in ids, leaves, MAX_BATCH_AXES)
    if isinstance(p, str):
        return p
    taken = {id(mm), *(id(n) for n in p.views)}
    if any(id(n) not in taken for n in (n for a in areas for n in a.nodes)):
        return "the kernel would hold more than the product and its views"
    return None


def _operand_refusal(model, areas, mm) -> str | None:
    """Why a MIX kernel's product cannot read the operands the views of ``areas`` make
    (one stride per batch axis: the epilogue indexes the product's batch), or None."""
    from graphkernel.codegen.cube.schedule import MAX_BATCH_AXES
    from graphkernel.codegen.cube.strided import operand

    ids = {id(n) for a in areas for n in a.nodes}
    taken = set()
    for i in (0, 1):
        v = mm.inputs[i]
        if v.producer is None or id(v.producer) not in ids:
            continue
        got = operand(mm, i, lambda n: id(n) in ids, MAX_BATCH_AXES)
        if isinstance(got, str):
            return got
        taken.update(id(n) for n in got.views)
    if not any(id(n) in taken for n in areas[1].nodes):
        return "no operand of the product is read through these views"
    return None


@pattern("product_views", order=108, direction="fwd", mode="depth", level=2,
         refuses=("GK202", "GK212"))
def product_views(model, a):
    """A product with no epilogue (a cube kernel) takes in the views around it that move only
    batch or row axes of an operand or of its result (a transpose of the heads and the
    positions of a chunked scan's products, keeping each matrix row whole, with the reshapes
    merging or splitting batch axes), and transposes swapping a matrix's two axes: the cube
    unit reads each operand and writes C at row pitches and batch offsets of their own
    (``SetOrgShape``, the offsets of ``SetTensorA``/``SetTensorB``/``IterateAll``), so such
    a view costs no launch and no round trip of its own. A view area read by the product
    alone, or (a product without an epilogue) reading the product's result alone, joins with
    the view areas beyond it when the code generator's own plan of the addressing holds
    (``codegen/cube/strided.py``; a MIX kernel's operands with one stride per batch axis);
    reshapes alone are free views already and stay out."""
    mms = [n for n in a.nodes if n.op in MATMULS]
    if len(mms) != 1:
        return None
    mm = mms[0]
    mix = not all(n is mm or _addressing(n) for n in a.nodes)
    if mix and not _epilogue_area(a):
        return None
    cands = [_up(model, p) for p in model.producer_areas(a)
             if _views_only(p) and model.only_consumer_is(p, a)]
    if not mix:
        cands += [_down(model, c, a) for c in model.consumers(a)[0]
                  if _views_only(c) and _reads_only(model, c, a)]
    for chain in cands:
        if all(n.op in ops.RESHAPE_OPS for c in chain for n in c.nodes):
            continue  # reshapes alone are views outside any kernel already: nothing to take
        why = _operand_refusal(model, [a, *chain], mm) if mix else \
            _strided_refusal(model, [a, *chain], mm)
        if why is None:
            return fuse_if(model, "product_views", [a, *chain], [])
        model.reject("product_views", [a, *chain], f"the product cannot address it: {why}")
    return None


def _reads_only(model, c, a) -> bool:
    """Whether area ``c`` reads nothing but area ``a``'s values (from inside the region)."""
    return all(model.area(x.producer) is a for n in c.nodes for x in n.inputs
               if x.producer is not None and model.area(x.producer) is not c)


def _up(model, p) -> list:
    """Views-only producer area ``p`` and the views-only areas above it, each read by the
    one below alone (a transpose behind a reshape)."""
    chain = [p]
    while True:
        ups = [q for q in model.producer_areas(chain[-1])
               if _views_only(q) and model.only_consumer_is(q, chain[-1])]
        if len(ups) != 1:
            return chain
        chain.append(ups[0])


def _down(model, c, a) -> list:
    """Views-only consumer area ``c`` of ``a`` and the views-only areas below it, each
    reading the one above alone."""
    chain = [c]
    while True:
        cons, external = model.consumers(chain[-1])
        if external or len(cons) != 1 or not _views_only(cons[0]) or \
                not _reads_only(model, cons[0], chain[-1]):
            return chain
        chain.append(cons[0])
