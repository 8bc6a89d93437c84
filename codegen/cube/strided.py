"""Strided operands and results of a cube kernel: views of a product's operands and result that
move batch or row axes only, taken into the product's addressing.

A transpose (with the reshapes around it) of a product's operand or result that keeps the
matrix's contiguous axis in place moves no element within a row: it is addressing. The Matmul
API reads each operand and writes C as row-major matrices with row pitches of its own choosing
(``SetOrgShape(orgM, orgN, orgKa, orgKb, orgKc)``: the original shapes "used only for the
offsets of the data movement", A ``[orgM, orgKa]`` (stored transposed: ``[orgKa, orgM]``), B
``[orgKb, orgN]`` (``[orgN, orgKb]``), C rows of ``orgKc``), and the kernel places every batch
element's matrices at offsets of its own (``SetTensorA(gm[off])``). So a view chain between a
kernel input and an operand (or between the product and a kernel output) is folded when it
maps the operand to ``offset(batch) + row * pitch + col`` with ``col`` contiguous; the
matrix's other axis may be either (the operand is then read with its transpose flag).

A layout here is a list of dims, each a tuple of atoms ``(extent, element stride)``, outer
first (an axis merged by a reshape from axes that are not adjacent in memory keeps the atoms
it was made of; an axis of extent 1 has none). The batch axes of A, B and C are then split
where any of the three needs (``refine``), each piece with its own stride per operand: the
kernel's batch loop walks the pieces (at most ``MAX_BATCH_AXES``). Static extents only.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphkernel import ops
from graphkernel.ir import Node, Value

Atom = tuple[int, int]       # (extent > 1, element stride)
Dim = tuple[Atom, ...]       # outer atom first; () for an axis of extent 1
Layout = list[Dim]


def contiguous(shape) -> Layout:
    """The layout of a row-major tensor of ``shape``."""
    out: Layout = []
    stride = 1
    for d in reversed([int(x) for x in shape]):
        out.append(((d, stride),) if d > 1 else ())
        stride *= d
    return out[::-1]


def simplify(d: Dim) -> Dim:
    """Adjacent atoms merged where the outer one's stride is the inner one's span."""
    out: list[Atom] = []
    for s, st in d:
        if out and out[-1][1] == s * st:
            out[-1] = (out[-1][0] * s, st)
        else:
            out.append((s, st))
    return tuple(out)


def reshape(layout: Layout, shape) -> Layout | None:
    """``layout`` viewed as ``shape`` (the same elements in row-major order): atoms are taken
    in order into each new axis, an atom split where an axis ends inside it (when the
    extents divide); None when they do not."""
    queue = [a for d in layout for a in d]
    out: Layout = []
    for d in (int(x) for x in shape):
        need, cur = d, []
        while need > 1:
            if not queue:
                return None
            s, st = queue[0]
            if need % s == 0:
                cur.append((s, st))
                need //= s
                queue.pop(0)
            elif s % need == 0:
                cur.append((need, st * (s // need)))
                queue[0] = (s // need, st)
                need = 1
            else:
                return None
        out.append(simplify(tuple(cur)))
    return None if queue else out


def forward(layout: Layout, n: Node) -> Layout | None:
    """The layout of ``n``'s result given its input's (a view or a transpose), or None."""
    if n.op == "Transpose":
        return [layout[p] for p in n.attrs["perm"]]
    if n.op in ops.RESHAPE_OPS:
        return reshape(layout, n.outputs[0].type.shape)
    if n.op == "BroadcastTo":  # (right-aligned: an axis of extent 1 read at stride 0)
        out = [int(x) for x in n.outputs[0].type.shape]
        lead = len(out) - len(layout)
        res: Layout = []
        for k, d in enumerate(out):
            src = layout[k - lead] if k >= lead else ()
            res.append(src if src or d == 1 else ((d, 0),))
        return res
    return None


SLICES = ("Slice", "StridedSlice")


def sliced(layout: Layout, n: Node) -> tuple[Layout, int] | None:
    """The layout of a slice's result given its input's, and the element offset of its
    first element (static bounds, positive steps: every kept axis one atom)."""
    shape = [int(d) for d in n.inputs[0].type.shape]
    cuts = [slice(None)] * len(shape)
    if n.op == "Slice":
        for k, (b, sz) in enumerate(zip(n.attrs["begin"], n.attrs["size"], strict=True)):
            cuts[k] = slice(b, None if sz == -1 else b + sz)
    else:
        a = n.attrs
        steps = a.get("strides") or [1] * len(a["begin"])
        axes = a.get("axes") if a.get("axes") is not None else list(range(len(a["begin"])))
        for b, e, st, ax in zip(a["begin"], a["end"], steps, axes, strict=True):
            cuts[ax % len(shape)] = slice(b, e, st)
    out: Layout = []
    offset = 0
    for d, sl, dim in zip(layout, cuts, shape, strict=True):
        start, _, step = sl.indices(dim)
        keep = len(range(*sl.indices(dim)))
        if keep == dim:
            out.append(d)
            continue
        if step < 1 or len(d) > 1:
            return None
        st = d[0][1] if d else 0
        offset += start * st
        out.append(((keep, st * step),) if keep > 1 else ())
    return out, offset


def backward(layout: Layout, n: Node) -> Layout | None:
    """The layout of ``n``'s input given its result's (a view or a transpose; the result
    written, so nothing is read twice: no broadcast), or None."""
    if n.op == "Transpose":
        res: Layout = [()] * len(layout)
        for k, p in enumerate(n.attrs["perm"]):
            res[p] = layout[k]
        return res
    if n.op in ops.RESHAPE_OPS:
        return reshape(layout, n.inputs[0].type.shape)
    return None


def _view(n: Node, operand: bool) -> bool:
    """A node the product's addressing takes: a view or a transpose, and for an operand (read
    only) a broadcast or a slice."""
    return n.op == "Transpose" or n.op in ops.RESHAPE_OPS or (
        operand and (n.op == "BroadcastTo" or n.op in SLICES))


def operand_chain(v: Value, inside) -> tuple[Value, list[Node]] | None:
    """The value from outside (``inside(node)``: a node of the kernel) an operand ``v`` reads
    and the views between them (in order), when every node on the way is a view, a transpose
    or a broadcast read by the next alone."""
    chain: list[Node] = []
    while v.producer is not None and inside(v.producer):
        p = v.producer
        if not _view(p, True) or len(v.users) != 1:
            return None
        chain.append(p)
        v = p.inputs[0]
    return v, chain[::-1]


def result_chain(v: Value, inside, leaves) -> tuple[Value, list[Node]] | None:
    """The value the product's result ``v`` reaches through views inside the kernel and the
    views on the way (in order), when each value on it is read by the next view alone and only
    the last leaves the kernel (``leaves(value)``)."""
    chain: list[Node] = []
    while not leaves(v):
        users = v.users
        if len(users) != 1 or not inside(users[0]) or not _view(users[0], False):
            return None
        chain.append(users[0])
        v = users[0].outputs[0]
    if any(inside(u) for u in v.users):
        return None
    return v, chain


def operand_layout(src: Value, chain: list[Node]) -> tuple[Layout, int] | None:
    """The operand's layout in ``src`` and the offset of its first element."""
    if not all(isinstance(d, int) for d in src.type.shape):
        return None
    lay: Layout | None = contiguous(src.type.shape)
    offset = 0
    for n in chain:
        if not all(isinstance(d, int) for d in (*n.inputs[0].type.shape,
                                                 *n.outputs[0].type.shape)):
            return None
        if n.op in SLICES:
            got = sliced(lay, n)
            if got is None:
                return None
            lay, off = got
            offset += off
        else:
            lay = forward(lay, n)
        if lay is None:
            return None
    return lay, offset


def result_layout(dst: Value, chain: list[Node]) -> Layout | None:
    if not all(isinstance(d, int) for d in dst.type.shape):
        return None
    lay: Layout | None = contiguous(dst.type.shape)
    for n in reversed(chain):
        if not all(isinstance(d, int) for d in n.inputs[0].type.shape):
            return None
        lay = backward(lay, n)
        if lay is None:
            return None
    return lay


def single(d: Dim) -> tuple[int, int] | None:
    """A matrix axis as (extent, stride): one atom, or extent 1 (stride 0)."""
    if not d:
        return 1, 0
    return d[0] if len(d) == 1 else None


@dataclass(frozen=True)
class Matrix:
    """How a product reads one operand (or writes C): transposed or not, its row pitch, and
    its batch dims' atoms aligned to the product's batch axes."""

    trans: bool
    pitch: int
    batch: list[Dim]


def matrix(layout: Layout, rows: int, cols: int, trans_flag: bool, out_batch) -> Matrix | str:
    """``layout`` of an operand stored ``[..., rows, cols]`` as the product reads it
    (``trans_flag``: the product's own transpose flag for it) -> a Matrix, or why not."""
    r, c = single(layout[-2]), single(layout[-1])
    if r is None or c is None:
        return "a matrix axis of the operand is made of axes apart in memory"
    (rn, rs), (cn, cs) = r, c
    if cn == 1 or cs == 1:  # columns contiguous: stored as the product reads it
        pitch, trans = (rs if rn > 1 else max(cols, 1)), trans_flag
        if rn > 1 and pitch < cols:
            return f"rows overlap (pitch {pitch} < {cols} columns)"
    elif rn == 1 or rs == 1:  # rows contiguous: stored transposed
        pitch, trans = cs, not trans_flag
        if pitch < rows:
            return f"columns overlap (pitch {pitch} < {rows} rows)"
    else:
        return "neither matrix axis of the operand is contiguous in memory"
    own = layout[:-2]
    lead = len(out_batch) - len(own)
    if lead < 0:
        return "more batch axes than the product's"
    batch: list[Dim] = []
    for k, d in enumerate(out_batch):
        src = own[k - lead] if k >= lead else ()
        batch.append(src if src or int(d) == 1 else ((int(d), 0),))
    return Matrix(trans, pitch, batch)


def refine(dims: list[list[Dim]], out_batch) -> list[tuple[int, list[int]]] | None:
    """The batch axes split so that every operand's atoms fall on whole pieces: a list of
    (extent, [stride per operand]), outer first; None when the atoms do not nest."""
    pieces: list[tuple[int, list[int]]] = []
    for k, total in enumerate(int(d) for d in out_batch):
        # the cut points of each operand, as spans of the axis's inner part
        cuts = {1, total}
        for ds in dims:
            span = total
            for s, _ in ds[k]:
                span //= s
                cuts.add(span)
        order = sorted(cuts, reverse=True)
        if any(a % b for a, b in zip(order, order[1:], strict=False)):
            return None
        for a, b in zip(order, order[1:], strict=False):
            ext = a // b
            strides = []
            for ds in dims:
                strides.append(_stride_at(ds[k], total, b))
            pieces.append((ext, strides))
    return pieces


def _stride_at(d: Dim, total: int, inner: int) -> int:
    """The stride of the piece of an axis whose inner span is ``inner`` (elements of the
    axis inside one step of the piece), given the axis's atoms."""
    span = total
    for s, st in d:
        span //= s
        if span <= inner:  # the piece lies within this atom
            return st * (inner // span)
    return 0


@dataclass(frozen=True)
class Plan:
    """A product read and written through its views: the values outside it reads (A, B) and
    writes (C), the views taken, the product's extents, its operands' transpose flags as
    stored, the batch pieces' extents and strides (A, B, C) and the row pitches
    (orgM, orgN, orgKa, orgKb, orgKc)."""

    src_a: Value
    src_b: Value
    dst: Value
    views: tuple[Node, ...]
    M: int
    N: int
    K: int
    trans_a: bool
    trans_b: bool
    pieces: tuple[tuple[int, tuple[int, int, int]], ...]
    pitches: tuple[int, int, int, int, int]
    offsets: tuple[int, int] = (0, 0)  # A's and B's first element in their inputs


def split_matrix(la: Layout, lb: Layout, lc: Layout, nbatch: int, M: int, N: int,
                 ta: bool, tb: bool):
    """When C's rows or columns are written as pieces apart in memory (a projection's
    ``[B·S, H·D]`` seen as ``[B, S, H, D]`` with its heads moved before the positions), the
    product as one product per piece: element ``(i, j)`` of C is the dot product of A's row
    ``i`` with B's column ``j``, so C's pieces of rows are batch axes over A's rows (B read at
    stride 0), its pieces of columns batch axes over B's columns (A read at stride 0), and
    the innermost piece of each the product's new M and N (the columns' contiguous).
    Returns (A, B and C layouts with the pieces as their innermost batch axes, the pieces'
    extents, the new M and N), None when C's rows and columns are each one axis (nothing to
    split), or why they cannot be split."""
    rows, cols = lc[-2], lc[-1]
    if len(rows) < 2 and len(cols) < 2:
        return None
    if len(cols) > 1 and cols[-1][1] != 1:
        return "the result is written through views moving its last axis"
    am = single(la[-1] if ta else la[-2])
    bn = single(lb[-2] if tb else lb[-1])
    if am is None or am[0] != M:
        return "A's rows are made of axes apart in memory"
    if bn is None or bn[0] != N:
        return "B's columns are made of axes apart in memory"

    def pad(lay: Layout) -> Layout:  # batch dims aligned right to the product's
        return [()] * (nbatch - (len(lay) - 2)) + lay[:-2]

    def pieces(dim: Dim, whole: int, stride: int) -> tuple[list[Dim], Dim, int]:
        span, out = whole, []
        for e, _ in dim[:-1]:
            span //= e
            out.append(((e, stride * span),))
        inner = dim[-1][0] if dim else 1
        return out, (((inner, stride),) if inner > 1 else ()), inner

    a_rows, a_inner, m = pieces(rows, M, am[1])
    b_cols, b_inner, n = pieces(cols, N, bn[1])
    nr, nc = len(a_rows), len(b_cols)
    la2 = pad(la) + a_rows + [()] * nc + ([la[-2], a_inner] if ta else [a_inner, la[-1]])
    lb2 = pad(lb) + [()] * nr + b_cols + ([b_inner, lb[-1]] if tb else [lb[-2], b_inner])
    lc2 = pad(lc) + [(x,) for x in rows[:-1]] + [(x,) for x in cols[:-1]] + \
        [rows[-1:], cols[-1:]]
    extra = tuple(e for e, _ in (*rows[:-1], *cols[:-1]))
    return la2, lb2, lc2, extra, m, n


def plan(mm: Node, inside, leaves, max_axes: int) -> Plan | str:
    """How product ``mm`` reads its operands and writes its result through the views inside
    its kernel (``inside(node)``; ``leaves(value)``: read outside it), or why it cannot."""
    got_a, got_b = operand_chain(mm.inputs[0], inside), operand_chain(mm.inputs[1], inside)
    got_c = result_chain(mm.outputs[0], inside, leaves)
    if got_a is None or got_b is None:
        return "an operand is computed inside the kernel (views and transposes only fold)"
    if got_c is None:
        return "the result is read inside the kernel by more than views"
    (src_a, chain_a), (src_b, chain_b), (dst, chain_c) = got_a, got_b, got_c
    out = mm.outputs[0].type.shape
    if not all(isinstance(d, int) for d in (*out, *mm.inputs[0].type.shape)):
        return "symbolic extents"
    M, N = int(out[-2]), int(out[-1])
    ta0, tb0 = bool(mm.attrs.get("transpose_a")), bool(mm.attrs.get("transpose_b"))
    sa = mm.inputs[0].type.shape
    K = int(sa[-2] if ta0 else sa[-1])
    batch = tuple(int(d) for d in out[:-2])
    ga, gb = operand_layout(src_a, chain_a), operand_layout(src_b, chain_b)
    lc = result_layout(dst, chain_c)
    if ga is None or gb is None or lc is None:
        return "a reshape on the way is no view of the strided value (symbolic or not nested)"
    (la, oa), (lb, ob) = ga, gb
    pieces = split_matrix(la, lb, lc, len(batch), M, N, ta0, tb0)
    if isinstance(pieces, str):
        return pieces
    if pieces is not None:  # C's rows or columns written apart: a product per piece
        la, lb, lc, extra, M, N = pieces
        batch = (*batch, *extra)
    ma = matrix(la, *((K, M) if ta0 else (M, K)), ta0, batch)
    mb = matrix(lb, *((N, K) if tb0 else (K, N)), tb0, batch)
    mc = matrix(lc, M, N, False, batch)
    for what, m in (("A", ma), ("B", mb), ("C", mc)):
        if isinstance(m, str):
            return f"{what}: {m}"
    if mc.trans:
        return "the result is written through views moving its last axis"
    pieces = refine([ma.batch, mb.batch, mc.batch], batch)
    if pieces is None:
        return "the batch axes of the operands and the result do not nest"
    if len(pieces) > max_axes:
        return f"{len(pieces)} strided batch axes (at most {max_axes})"
    ta, tb = ma.trans, mb.trans
    pitches = (ma.pitch if ta else M, mb.pitch if not tb else N, ma.pitch if not ta else K,
               mb.pitch if tb else K, mc.pitch)
    return Plan(src_a, src_b, dst, (*chain_a, *chain_b, *chain_c), M, N, K, ta, tb,
                tuple((e, (st[0], st[1], st[2])) for e, st in pieces), pitches, (oa, ob))


@dataclass(frozen=True)
class Operand:
    """One operand read through its views, each batch axis one stride (no refinement: the
    kernel's batch axes stay the product's, as a MIX epilogue indexes them)."""

    src: Value
    views: tuple[Node, ...]
    trans: bool
    pitch: int
    strides: tuple[int, ...]
    offset: int


def operand(mm: Node, i: int, inside, max_axes: int) -> Operand | str:
    """How product ``mm`` reads operand ``i`` through the views inside its kernel, with one
    stride per batch axis of the product, or why it cannot."""
    got = operand_chain(mm.inputs[i], inside)
    if got is None:
        return "the operand is computed inside the kernel (views and transposes only fold)"
    src, chain = got
    out = mm.outputs[0].type.shape
    if not chain or not all(isinstance(d, int) for d in (*out, *mm.inputs[0].type.shape)):
        return "symbolic extents"
    batch = tuple(int(d) for d in out[:-2])
    if len(batch) > max_axes:
        return f"{len(batch)} batch axes (at most {max_axes})"
    M, N = int(out[-2]), int(out[-1])
    ta0, tb0 = bool(mm.attrs.get("transpose_a")), bool(mm.attrs.get("transpose_b"))
    sa = mm.inputs[0].type.shape
    K = int(sa[-2] if ta0 else sa[-1])
    lay = operand_layout(src, chain)
    if lay is None:
        return "a reshape on the way is no view of the strided value (symbolic or not nested)"
    layout, offset = lay
    if i == 0:
        m = matrix(layout, *((K, M) if ta0 else (M, K)), ta0, batch)
    else:
        m = matrix(layout, *((N, K) if tb0 else (K, N)), tb0, batch)
    if isinstance(m, str):
        return m
    strides = []
    for d in m.batch:
        if len(d) > 1:
            return "a batch axis of the operand is made of axes apart in memory"
        strides.append(d[0][1] if d else 0)
    return Operand(src, tuple(chain), m.trans, m.pitch, tuple(strides), offset)
