"""Schedule a cube kernel: one MatMul/BatchMatMul on the Matmul high-level API.

A cube kernel's body is one MatMul or BatchMatMul whose operands are kernel inputs, each
possibly through Transposes of its last two axes: a transpose is folded into the operand's
``isTrans`` (the operand is read transposed in place, never materialised). Batch axes
(BatchMatMul) broadcast as numpy does: each output batch element reads its A and B at
per-axis strides that are 0 where an operand's axis is 1 or missing (grouped-query
attention's shared K/V heads). The tiling (codegen/cube/tiling.py, and the same search in
the generated host function for the actual shapes) splits each batch element's ``M × N``
over the cube cores; a core takes blocks ``batch × coresM × coresN`` round robin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphkernel import symbolic
from graphkernel.codegen import targets
from graphkernel.codegen.buffers import NO_BUFFERS, BufferPlan, Linear, plan
from graphkernel.codegen.cube import epilogue, strided
from graphkernel.codegen.cube.epilogue import Epilogue, batch_strides
from graphkernel.codegen.cube.lower import lower
from graphkernel.codegen.cube.tiling import CubeTiling, NoTiling, tile
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.vector.schedule import FULL, KernelIO, kernel_symbol
from graphkernel.flags import DEFAULT_TARGET
from graphkernel.ir import Dim, DType, Node, Value
from graphkernel.ops import PRODUCT_OPS, swaps_last_two

CUBE_DTYPES = (DType.float16, DType.bfloat16, DType.float32)
MAX_BATCH_AXES = 8


@dataclass
class MatmulSchedule:
    """A cube kernel: which inputs are A and B, how they are read, the batch layout, and the
    tiling of the compile-time shapes (None when a dim is symbolic: the host function
    computes it from the actual shapes). Its inputs and outputs are its body's, each read or
    written whole (``inputs``, ``outputs``: made from the body when asked, so that the
    thousands of kernels of a large model sharing one schedule keep no copies of them)."""

    node: str
    name: str
    matmul: Node
    a: int                      # the input index of A
    b: int                      # ... of B
    trans_a: bool               # A is stored [..., K, M]
    trans_b: bool               # B is stored [..., N, K]
    M: Dim
    N: Dim
    K: Dim
    batch: tuple[Dim, ...]      # the output's batch dims
    a_strides: tuple[Dim, ...]  # A's element stride per output batch dim (0: broadcast)
    b_strides: tuple[Dim, ...]
    dtype: DType                # A, B and C
    tiling: CubeTiling | None   # for static shapes (None: decided at run time only)
    notes: list[str] = field(default_factory=list)
    target: targets.Target = field(default_factory=lambda: targets.load(DEFAULT_TARGET),
                                   repr=False, compare=False)
    epilogue: Epilogue | None = None  # a MIX kernel's vector work on each base tile
    # a product reading or writing through views that move batch or row axes only
    # (codegen/cube/strided.py): C's element stride per batch dim, and the row pitches
    # (orgM, orgN, orgKa, orgKb, orgKc) the kernel sets with SetOrgShape; None: the natural
    # ones (C batch-major, rows of K, N, M as the operands' shapes say)
    c_strides: tuple[int, ...] | None = None
    pitches: tuple[int, int, int, int, int] | None = None
    offsets: tuple[int, int] = (0, 0)  # (with pitches) A's and B's first elements
    kernel_kind: str = "cube"   # report.json / manifest.json: vector, cube, mix, extern
    variant: None = None        # no run-time variant
    reduce: bool = False        # (the vector schedule's question: never a reduction here)
    L: Dim = 1

    @property
    def inputs(self) -> list[KernelIO]:
        return [KernelIO(i, v, FULL, v.dtype, tuple(v.type.shape))
                for i, v in enumerate(self.matmul.graph.inputs)]

    @property
    def outputs(self) -> list[KernelIO]:
        return [KernelIO(j, v, FULL, v.dtype, tuple(v.type.shape))
                for j, v in enumerate(self.matmul.graph.outputs)]

    @property
    def c_bytes(self) -> int:
        """C's element size as the Matmul API delivers it: fp32 tiles into UB for a MIX
        kernel (the epilogue computes in fp32), the product's type to GM otherwise."""
        return 4 if self.epilogue is not None else self.dtype.itemsize

    def plan(self) -> BufferPlan:
        """The kernel's UB buffers: none for a cube kernel (C goes straight to GM), its
        epilogue's lowering's for a MIX kernel."""
        e = self.epilogue
        return NO_BUFFERS if e is None else plan(lower(e, self.target),
                                                 self.target.block_bytes)

    def ub_per_elem(self, p: BufferPlan) -> int:
        """UB bytes per element of a base tile under buffer plan ``p`` (the tiling's bound)."""
        return p.budget().tile if self.epilogue is not None else self.c_bytes

    @property
    def whole_rows(self) -> bool:
        """The epilogue reduces along N: one core and one base tile hold each row whole."""
        return self.epilogue is not None and self.epilogue.rows

    def ub_reserved(self, p: BufferPlan) -> int:
        """UB bytes besides, under buffer plan ``p``: rows at their widest base tile (256
        columns, or N rounded up to the fractal when a tile holds whole rows), columns at 256
        rows, and the slack."""
        return _reserved(p.budget(), self.N, self.whole_rows, self.target)


def _reserved(b: Linear, N: Dim, whole_rows: bool, spec: targets.Target) -> int:
    width = _up(int(N), spec.cube_fractal) if whole_rows else 256
    return b.col * width + b.row * 256 + b.fixed


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def whole_rows_refusal(mm: Node, members: list[Node], leaving: list[Value],
                       spec: targets.Target) -> str | None:
    """Why the epilogue of product ``mm`` made of ``members`` (in order; ``leaving``: the
    values read outside them) cannot hold whole rows in a base tile, or None when it can or
    needs no whole rows: the epilogue built as the generator builds it, its buffer plan and
    the tiling at the fewest rows (the fusion asks this before it joins a reduction)."""
    ids = {id(n) for n in members}
    seen = {id(mm)}
    for v in mm.inputs:  # transposes of an operand fold into isTrans (as in _operand)
        while v.producer is not None and id(v.producer) in ids:
            p = v.producer
            if not (p.op == "Transpose" and swaps_last_two(p) and len(v.users) == 1):
                return f"{mm.op} operand computed by {p.op} inside its kernel"
            seen.add(id(p))
            v = p.inputs[0]
    steps = [n for n in members if id(n) not in seen and n.op != "Constant"]
    ins: list[Value] = []
    for n in members:
        for v in n.inputs:
            p = v.producer
            if (p is None or id(p) not in ids) and v not in ins and not (
                    p is not None and p.op == "Constant" and p.attrs["value"].size == 1):
                ins.append(v)
    out = mm.outputs[0].type.shape
    M, N, K = out[-2], out[-1], mm.inputs[0].type.shape[-1]
    if mm.attrs.get("transpose_a"):
        K = mm.inputs[0].type.shape[-2]
    try:
        epi = epilogue.schedule(mm.outputs[0], tuple(out[:-2]), M, N, ins, leaving, steps)
    except Unsupported as e:
        return str(e)
    if not epi.rows or not symbolic.is_static(N) or not symbolic.is_static(K):
        return None
    b = plan(lower(epi, spec), spec.block_bytes).budget()
    dt = mm.outputs[0].dtype
    try:
        tile(spec.cube_fractal, int(N), int(K), dt.itemsize, dt.itemsize, 4, spec,
             ub_reserved=_reserved(b, N, True, spec), ub_per_elem=b.tile, whole_rows=True)
    except NoTiling as e:
        return str(e)
    return None


def is_matmul_kernel(kernel: Node) -> bool:
    """Whether the kernel's body holds a MatMul or BatchMatMul (planned by this module)."""
    return any(n.op in PRODUCT_OPS for n in kernel.subgraph.nodes)


def _operand(v: Value, trans: bool, mm: Node, seen: set[int]) -> tuple[Value, bool]:
    """The kernel input an operand reads and whether it is read transposed: Transposes of
    the last two axes fold into ``isTrans``; anything else is refused."""
    while v.producer is not None:
        p = v.producer
        if p.op == "Transpose" and swaps_last_two(p) and len(v.users) == 1:
            seen.add(id(p))
            v, trans = p.inputs[0], not trans
            continue
        raise Unsupported(f"{mm.op} operand computed by {p.op} inside its kernel (a cube "
                          "kernel reads its operands from GM, transposes of the last two "
                          "axes folded into isTrans)", node=mm)
    return v, trans


def _read(mm: Node, i: int, seen: set[int], wide: dict) -> tuple[Value, bool]:
    """The kernel input operand ``i`` of ``mm`` reads and whether it is read transposed:
    through transposes of the last two axes (``_operand``), else through views moving batch
    or row axes only, read at a row pitch and batch strides of their own (``wide[i]``)."""
    flag = bool(mm.attrs.get("transpose_b" if i else "transpose_a"))
    try:
        return _operand(mm.inputs[i], flag, mm, seen)
    except Unsupported:
        got = strided.operand(mm, i, lambda n: True, MAX_BATCH_AXES)
        if isinstance(got, str):
            raise
    wide[i] = got
    seen.update(id(n) for n in got.views)
    return got.src, got.trans


def _natural(batch, M, N) -> tuple:
    out, inner = [], symbolic.mul(M, N)
    for k in range(len(batch)):
        out.append(symbolic.mul(inner, symbolic.numel(batch[k + 1:])))
    return tuple(out)


def plan_matmul(kernel: Node, spec: targets.Target) -> MatmulSchedule:
    """The cube kernel of ``kernel``, or Unsupported naming what is outside the model. A
    product whose operands or result the kernel reaches through views moving batch or row
    axes only, which the plain form refuses, is planned with strided addressing
    (``codegen/cube/strided.py``) when that holds it."""
    try:
        return _plan_matmul(kernel, spec)
    except Unsupported as e:
        try:
            s = _plan_strided(kernel, spec)
        except Unsupported:
            s = None
        if s is None:
            raise e from None
        return s


def _plan_matmul(kernel: Node, spec: targets.Target) -> MatmulSchedule:
    body = kernel.subgraph
    mms = [n for n in body.nodes if n.op in PRODUCT_OPS]
    mm = mms[0]
    if len(mms) > 1:
        raise Unsupported(f"{len(mms)} matrix products in one kernel (a cube kernel runs one)",
                          node=mms[1])
    seen = {id(mm)}
    wide: dict[int, strided.Operand] = {}  # operands read through row-moving views
    src_a, ta = _read(mm, 0, seen, wide)
    src_b, tb = _read(mm, 1, seen, wide)
    steps = [n for n in body.nodes if id(n) not in seen and n.op != "Constant"]
    dt = mm.outputs[0].dtype
    if dt not in CUBE_DTYPES:
        raise Unsupported(f"{mm.op} of {dt.value}: the cube kernels take float16, bfloat16 "
                          "and float32 (int8 products are int32, the IR's MatMul keeps int8)",
                          node=mm)
    out = mm.outputs[0].type.shape
    M, N = out[-2], out[-1]
    sa, sb = src_a.type.shape, src_b.type.shape
    own = mm.inputs[0].type.shape  # (the operand as the product reads it)
    K = own[-2] if mm.attrs.get("transpose_a") else own[-1]
    batch = tuple(out[:-2])
    if len(batch) > MAX_BATCH_AXES:
        raise Unsupported(f"{mm.op} with {len(batch)} batch axes (at most {MAX_BATCH_AXES})",
                          node=mm)
    ins = list(body.inputs)
    outs = list(body.outputs)
    epi = None
    if steps:  # a MIX kernel: the epilogue on each base tile (codegen/cube/epilogue.py)
        epi = epilogue.schedule(mm.outputs[0], batch, M, N, ins, outs, steps)
        if len(epi.batch) > MAX_BATCH_AXES:
            raise Unsupported(f"{mm.op}'s epilogue over {len(epi.batch)} batch axes (at most "
                              f"{MAX_BATCH_AXES})", node=mm)
        if epi.rows and not symbolic.is_static(N):  # the row's UB must be known to fit
            raise Unsupported(f"{mm.op}'s epilogue reduces along a symbolic N = "
                              f"{symbolic.canon(N)} (a tile must hold whole rows)", node=mm)
    elif outs != [mm.outputs[0]]:
        raise Unsupported(f"{mm.op}: a cube kernel's one output is the product", node=mm)
    name = kernel_symbol(kernel)
    s = MatmulSchedule(
        node=kernel.name, name=name, matmul=mm,
        a=ins.index(src_a), b=ins.index(src_b), trans_a=ta, trans_b=tb, M=M, N=N, K=K,
        batch=batch, a_strides=batch_strides(sa, batch), b_strides=batch_strides(sb, batch),
        dtype=dt, tiling=None, target=spec, epilogue=epi,
        kernel_kind="mix" if epi is not None else "cube")
    if wide:  # (static shapes: strided.operand refuses symbolic ones)
        oa, ob = wide.get(0), wide.get(1)
        s.a_strides = oa.strides if oa else s.a_strides
        s.b_strides = ob.strides if ob else s.b_strides
        s.pitches = (oa.pitch if oa and ta else int(M), ob.pitch if ob and not tb else int(N),
                     oa.pitch if oa and not ta else int(K), ob.pitch if ob and tb else int(K),
                     int(N))
        s.offsets = (oa.offset if oa else 0, ob.offset if ob else 0)
        s.c_strides = tuple(int(x) for x in _natural(batch, M, N))
    p = s.plan()  # the tiling's UB bound: the epilogue's buffer plan
    if all(symbolic.is_static(d) for d in (*out, K)):
        nb = int(symbolic.numel(batch)) if batch else 1
        try:
            s.tiling = tile(int(M), int(N), int(K), dt.itemsize, dt.itemsize, s.c_bytes, spec,
                            batch=nb, ub_reserved=s.ub_reserved(p), ub_per_elem=s.ub_per_elem(p),
                            whole_rows=s.whole_rows)
        except NoTiling as e:
            raise Unsupported(str(e), node=mm) from None
    elif s.whole_rows and symbolic.is_static(K):  # M at run time: do the rows fit at all?
        try:
            tile(spec.cube_fractal, int(N), int(K), dt.itemsize, dt.itemsize, s.c_bytes, spec,
                 ub_reserved=s.ub_reserved(p), ub_per_elem=s.ub_per_elem(p), whole_rows=True)
        except NoTiling as e:
            raise Unsupported(str(e), node=mm) from None
    s.notes = notes(s)
    return s


def notes(s: MatmulSchedule) -> list[str]:
    """Why a cube kernel reads more than its inputs once (shown with the kernel)."""
    t = s.tiling
    if t is None:
        return ["a cube kernel: A is read once per core column of the split and B once per "
                "core row (the split is chosen at run time)"]
    out = []
    if t.coresN > 1 or t.coresM > 1:
        out.append(f"a cube kernel split {t.coresM} x {t.coresN} over the cube cores: A is "
                   f"read {t.coresN} times, B {t.coresM} times")
    if t.gm_bytes > t.split_bytes:
        out.append(f"operand panels that do not fit L1 are re-read per base tile "
                   f"({t.gm_bytes - t.split_bytes} bytes more)")
    if any(symbolic.canon(x) == symbolic.canon(0) for x in (*s.a_strides, *s.b_strides)):
        out.append("a broadcast batch operand is read once per output batch element")
    for i in s.epilogue.inputs if s.epilogue is not None else ():
        name = s.inputs[i.index].value.name
        if i.layout == "row":
            out.append(f"epilogue input {i.index} ({name}) is a row: read once per base tile")
        elif i.layout == "col":
            out.append(f"epilogue input {i.index} ({name}) is a column (a value per row of "
                       "M): read once per base tile")
        elif i.layout == "scalar":
            out.append(f"epilogue input {i.index} ({name}) is one value: read once per core")
        elif any(symbolic.canon(x) == symbolic.canon(0) for x in i.strides):
            out.append(f"epilogue input {i.index} ({name}) is broadcast over batch axes: read "
                       "once per output batch element")
    return out


def _plan_strided(kernel: Node, spec: targets.Target) -> MatmulSchedule | None:
    """A cube kernel (no epilogue) whose operands are views of kernel inputs and whose result
    is a view written as the kernel's output, every view moving batch or row axes only (or
    swapping a matrix's two axes): each operand read and C written at row pitches and
    per-batch offsets of their own (``codegen/cube/strided.py``). None when the body is not
    of that form; Unsupported when the tiling refuses it."""
    body = kernel.subgraph
    mms = [n for n in body.nodes if n.op in PRODUCT_OPS]
    if len(mms) != 1 or mms[0].outputs[0].dtype not in CUBE_DTYPES or len(body.outputs) != 1:
        return None
    mm, dt = mms[0], mms[0].outputs[0].dtype
    ins, outs = list(body.inputs), list(body.outputs)
    p = strided.plan(mm, lambda n: True, lambda v: any(v is o for o in outs), MAX_BATCH_AXES)
    if isinstance(p, str) or any(not any(v is x for x in ins) for v in (p.src_a, p.src_b)):
        return None
    taken = {id(n) for n in (mm, *p.views)}
    if any(id(n) not in taken for n in body.nodes if n.op != "Constant"):
        return None
    s = MatmulSchedule(
        node=kernel.name, name=kernel_symbol(kernel), matmul=mm,
        a=ins.index(p.src_a), b=ins.index(p.src_b), trans_a=p.trans_a, trans_b=p.trans_b,
        M=p.M, N=p.N, K=p.K, batch=tuple(e for e, _ in p.pieces),
        a_strides=tuple(st[0] for _, st in p.pieces), b_strides=tuple(st[1] for _, st in p.pieces),
        dtype=dt, tiling=None, target=spec, c_strides=tuple(st[2] for _, st in p.pieces),
        pitches=p.pitches, offsets=p.offsets)
    try:
        s.tiling = tile(p.M, p.N, p.K, dt.itemsize, dt.itemsize, s.c_bytes, spec,
                        batch=math.prod(s.batch), ub_reserved=s.ub_reserved(NO_BUFFERS),
                        ub_per_elem=s.c_bytes)
    except NoTiling as e:
        raise Unsupported(str(e), node=mm) from None
    s.notes = [*notes(s), "operands and result read and written through views moving batch "
               "and row axes only: row pitches (SetOrgShape) and per-batch offsets"]
    return s
