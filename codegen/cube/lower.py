"""A MIX kernel's lowering: its epilogue's steps over the product's base tile, by the lowering
engine (``codegen/lower.py``), into kernel IR with every UB buffer the kernel takes.

The loop space is a base tile of ``baseM`` rows of ``baseN`` columns (row pitch ``bN``),
everything fp32. The product's tile is ``c``; an input is read as the fp32 tile ``x<i>``, the
row ``r<i>`` or the scalar ``s<i>`` (the kernel's template loads them); each output is stored
from the tile holding it (``KernelIR.stores``, rendered after the epilogue's instructions).
The engine's choices here: a result never takes a dead operand's buffer (it is allocated
before they return to their pools), and a tile meets a scalar without a tensor-with-scalar
call by the scalar spread into the result.
"""

from __future__ import annotations

from graphkernel.codegen.cube.epilogue import Epilogue
from graphkernel.codegen.instructions import Instruction
from graphkernel.codegen.kernel_ir import (
    COL,
    FULL,
    SCALAR,
    Buffer,
    KernelIR,
    Kind,
    Linear,
)
from graphkernel.codegen.lower import C_TYPE, Lowerer, Ref, Space, flt, op
from graphkernel.codegen.targets import Target
from graphkernel.ir import DType, Node

POOLS = {FULL: "w", COL: "wc"}


def _pool(kind: str, k: int) -> Buffer:
    if kind == FULL:
        return Buffer(f"bw{k}", "a tile of an intermediate value", Kind.TILE, "float",
                      Linear(tile=4), "n * sizeof(float)", tensor=f"w{k}")
    # baseM fp32 values: a multiple of 16, whole blocks
    return Buffer(f"bwc{k}", "a value per row of the tile", Kind.COLUMN, "float",
                  Linear(row=4), "bM * sizeof(float)", tensor=f"wc{k}")


SPACE = Space(pitch="bN", counts={FULL: "n", COL: "rows"}, row_count="bN", pools=POOLS,
              owner="R.", in_place=False, scalar_forms=False, comments=False, pool_buffer=_pool)


def lower(e: Epilogue, target: Target) -> KernelIR:
    """The kernel IR of a MIX kernel's epilogue on ``target``."""
    last: dict[int, int] = {}
    for k, n in enumerate(e.steps):
        for v in n.inputs:
            last[id(e.storage(v))] = k
    for o in e.outputs:
        last[id(e.storage(o.value))] = len(e.steps)
    lo = Lowerer(SPACE, e.steps, e.storage, e.layout, last)
    lo.refs[id(e.product)] = Ref(FULL, "c")
    for vid, rec in e.bound.items():
        lo.refs[vid] = Ref(e.layouts[vid], rec.tensor)
    for vid, c in e.scalars.items():
        lo.refs[vid] = Ref(SCALAR, flt(c), c)

    def dst(n: Node, rule: Instruction | None, kind: str) -> Ref:
        return lo.scalar_dst() if kind == SCALAR else lo.scratch(kind)

    for k, n in enumerate(e.steps):
        lo.step(k, n, dst)
    stores = {}
    for o in e.outputs:  # into the output queue's tile: fp32 as it is, else rounded
        y, src = f"y{o.index}", op(lo.ref(o.value).expr)
        if o.dtype == DType.float32:
            lo.call("Muls", y, src, "CT(1.0f)", count="n", to=stores.setdefault(o.index, []))
        else:
            lo.call("Cast", y, src, "RoundMode::CAST_RINT", count="n",
                    to=stores.setdefault(o.index, []))
    return KernelIR(_buffers(e, lo, target), lo.body, stores=stores,
                    pools={p: lo.count[p] for p in POOLS.values()})


def _buffers(e: Epilogue, lo: Lowerer, target: Target) -> list[Buffer]:
    """The kernel's UB buffers for a base tile of ``rt = baseM`` rows of ``ctp = baseN``
    columns: the C tile, the pool, the scratches, the loaded tiles and rows (one slot each)
    and their fp32 copies, the stored tiles, and for a reduction along N the columns, a block
    per row (``btb``) and a reduction's work row (``brw``)."""
    out: list[Buffer] = []

    def buf(name, role, kind, ctype, size, row=False, tensor=""):
        lin = Linear(col=size) if row else Linear(tile=size)
        out.append(Buffer(name, role, kind, ctype, lin, f"{'bN' if row else 'n'} * "
                          f"sizeof({ctype})", tensor=tensor))

    buf("bc", "the product's base tile (fp32, from GetTensorC)", Kind.TILE, "float", 4,
        tensor="c")
    out += [_pool(FULL, k) for k in range(lo.count[POOLS[FULL]])]
    if lo.uses_ht:
        buf("bht", "the high-level ops' temporary space", Kind.SCRATCH, "uint8_t", 4,
            tensor="ht")
    if lo.uses_hh:
        buf("bhh", "a rounding cast's 16-bit temporary", Kind.SCRATCH, "uint8_t", 2,
            tensor="hh")
    for i in e.inputs:
        if i.layout == "scalar":
            continue
        row, ct = i.layout == "row", C_TYPE[i.dtype]
        fp32 = ct == "float"
        if i.layout == "col":  # M values: bM of them per tile, whole blocks (bM % 16 == 0)
            out.append(Buffer(f"qi{i.index}", f"input {i.index} (col)", Kind.QUEUE_IN, ct,
                              Linear(row=i.dtype.itemsize), f"bM * sizeof({ct})",
                              tensor=i.tensor if fp32 else ""))
            if not fp32:
                out.append(Buffer(f"bx{i.index}", f"input {i.index} in fp32", Kind.COLUMN,
                                  "float", Linear(row=4), "bM * sizeof(float)",
                                  tensor=i.tensor))
            continue
        buf(f"qi{i.index}", f"input {i.index} ({i.layout})", Kind.QUEUE_IN, ct,
            i.dtype.itemsize, row, i.tensor if fp32 else "")
        if not fp32:
            buf(f"bx{i.index}", f"input {i.index} in fp32", Kind.ROW if row else Kind.TILE,
                "float", 4, row, i.tensor)
    for o in e.outputs:
        buf(f"qo{o.index}", f"output {o.index} tiles", Kind.QUEUE_OUT, C_TYPE[o.dtype],
            o.dtype.itemsize, tensor=f"y{o.index}")
    out += [_pool(COL, k) for k in range(lo.count[POOLS[COL]])]
    if e.per_row:
        block, repeat = target.block_bytes, target.repeat_bytes
        per = repeat // block  # Brcb's blocks per repeat: whole repeats of row blocks
        out.append(Buffer("btb", "a block per row (Brcb spreads, row-reduce gathers)",
                          Kind.BLOCKS, "float", Linear(row=block, fixed=repeat),
                          f"(bM + {per - 1}) / {per} * {repeat}"))
    if e.rows:
        buf("brw", "a reduction's work row", Kind.ROW, "float", 4, row=True)
    return out
