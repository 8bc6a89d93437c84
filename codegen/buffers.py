"""The buffer plan: every Unified Buffer allocation of a vector kernel, computed once.

A kernel's buffers follow from its schedule (how each input and output sits in UB) and its
lowering (scratch pools, the scratch the high-level ops need, accumulators). The plan lists
them in ``InitBuffer`` order, each with its role, element type, queue or scratch position,
depth and size, so that

- the tiling's UB budget is the plan's sum (``BufferPlan.budget``),
- the kernel template declares, initialises and gets every buffer by looping over the plan,
- the simulator checks a launch's UB use against the plan's bound for the tile it ran
  (``codegen/sim/execute.py``): a template that allocates a buffer the plan does not know
  fails there, not on a device.

Adding a kind of buffer means adding it here. Sizes are linear in the tile: ``rt`` rows of
``ctp`` columns (``ctp`` rounded up so every row starts on a UB block).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphkernel.codegen.lower import C_TYPE, Lowered
from graphkernel.codegen.vector.schedule import COL, FULL, PARTIAL, ROW, Schedule


@dataclass(frozen=True)
class Linear:
    """Bytes as ``tile*rt*ctp + col*ctp + row*rt + fixed`` (an upper bound when the buffer's
    real size is rounded up to a block: ``fixed`` then holds a block of slack)."""

    tile: int = 0
    col: int = 0
    row: int = 0
    fixed: int = 0

    def __add__(self, o: Linear) -> Linear:
        return Linear(self.tile + o.tile, self.col + o.col, self.row + o.row,
                      self.fixed + o.fixed)

    def __mul__(self, k: int) -> Linear:
        return Linear(self.tile * k, self.col * k, self.row * k, self.fixed * k)

    def bytes(self, rt: int, ctp: int) -> int:
        return self.tile * rt * ctp + self.col * ctp + self.row * rt + self.fixed


# what a buffer holds, by the shape of one slot (TABLE: a resident table, rt + R rows)
TILE, COLUMN, ROWVEC, BLOCK, TABLE = "tile", "column", "row", "block", "table"


@dataclass(frozen=True)
class Buffer:
    """One ``InitBuffer``: a queue of ``depth`` slots (VECIN/VECOUT) or a scratch ``TBuf``."""

    name: str        # the kernel class member: qi0, qo1, bwf0, btb, ...
    role: str        # what it holds, for comments, the manifest and error messages
    position: str    # "VECIN" / "VECOUT" (a TQue) or "VECCALC" (a TBuf)
    depth: int       # slots: 2 for the double-buffered queues, 1 for scratch
    ctype: str       # the C element type of a slot
    shape: str       # TILE (rt x ctp), COLUMN (rt, block-aligned), ROWVEC (ctp), BLOCK, TABLE
    size: Linear     # bytes of one slot (the budget's bound)
    init: str        # the C expression of one slot's bytes in Init (reads the tiling t)
    local: str = ""  # the LocalTensor name Compute takes from a scratch buffer ("" = none)
    in_finish: bool = False  # Finish (after a reduction completes) uses it too

    @property
    def is_queue(self) -> bool:
        return self.position != "VECCALC"

    @property
    def bound(self) -> Linear:
        return self.size * self.depth


@dataclass(frozen=True)
class BufferPlan:
    buffers: tuple[Buffer, ...]
    slack: Linear  # bytes counted beyond the buffers (see ``plan``)
    compute: str   # the C type the kernel's ``CT`` stands for

    def budget(self) -> Linear:
        total = self.slack
        for b in self.buffers:
            total = total + b.bound
        return total

    @property
    def scratch(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.local)

    def describe(self) -> list[dict]:
        """The manifest's view: each buffer's role, position, depth and bytes per slot."""
        return [{"name": b.name, "role": b.role, "position": b.position, "depth": b.depth,
                 "type": self.compute if b.ctype == "CT" else b.ctype,
                 "bytes": b.init.replace("(CT)", f"({self.compute})")} for b in self.buffers]


def plan(s: Schedule, low: Lowered) -> BufferPlan:
    """The buffers of the kernel ``s`` lowered as ``low``, in ``InitBuffer`` order."""
    blk = s.target.block_bytes
    ct, cs = "CT", s.compute.itemsize  # the kernel's alias of the compute type
    out: list[Buffer] = []

    def tile(name: str, role: str, pos: str, depth: int, ctype: str, size: int,
             local: str = "", finish: bool = False) -> None:
        out.append(Buffer(name, role, pos, depth, ctype, TILE, Linear(tile=size),
                          f"t.rt * t.ctp * sizeof({ctype})", local, finish))

    def column(name: str, role: str, pos: str, depth: int, ctype: str, size: int,
               local: str = "", finish: bool = False) -> None:
        # rt values rounded up to a block: a block of slack per slot
        out.append(Buffer(name, role, pos, depth, ctype, COLUMN, Linear(row=size, fixed=blk),
                          f"AlignB(t.rt * sizeof({ctype}))", local, finish))

    def rowvec(name: str, role: str, pos: str, depth: int, ctype: str, size: int,
               local: str = "", finish: bool = False) -> None:
        out.append(Buffer(name, role, pos, depth, ctype, ROWVEC, Linear(col=size),
                          f"t.ctp * sizeof({ctype})", local, finish))

    def block(name: str, role: str, pos: str, depth: int, ctype: str, local: str = "",
              finish: bool = False) -> None:
        out.append(Buffer(name, role, pos, depth, ctype, BLOCK, Linear(fixed=blk), str(blk),
                          local, finish))

    for io in s.inputs:
        t, i = C_TYPE[io.dtype], io.index
        if io.table:  # loaded once per core: one slot, rt + R rows (codegen/vector/resident.py)
            r, size = io.table, io.dtype.itemsize
            out.append(Buffer(f"qt{i}", f"input {i}, a table of {r} rows (resident)", "VECIN",
                              1, t, TABLE, Linear(tile=size, col=r * size),
                              f"(t.rt + {r}) * t.ctp * sizeof({t})"))
        elif io.kind in (FULL, PARTIAL):
            tile(f"qi{i}", f"input {i} tiles", "VECIN", 2, t, io.dtype.itemsize)
        elif io.kind == COL:
            column(f"qi{i}", f"input {i} (a value per row)", "VECIN", 2, t, io.dtype.itemsize)
        elif io.kind == ROW:
            rowvec(f"bri{i}", f"input {i} (a row broadcast over the rows)", "VECCALC", 1, ct,
                   cs, f"ri{i}", True)
            if io.dtype != s.compute:
                rowvec(f"bsi{i}", f"input {i}'s row as stored, before its cast", "VECCALC", 1,
                       t, io.dtype.itemsize)
    for io in s.outputs:
        t, i, size = C_TYPE[io.dtype], io.index, io.dtype.itemsize
        if io.pieces:
            for k in range(len(io.pieces)):
                tile(f"qc{i}_{k}", f"output {i}, Concat operand {k}", "VECOUT", 2, t, size)
        elif io.kind == FULL:
            tile(f"qo{i}", f"output {i} tiles", "VECOUT", 2, t, size)
        elif io.kind == ROW:
            rowvec(f"qo{i}", f"output {i} (a row)", "VECOUT", 2, t, size)
        elif s.row_chunks:
            block(f"qo{i}", f"output {i} (one value per row, a row at a time)", "VECOUT", 2, t)
        else:
            column(f"qo{i}", f"output {i} (a value per row)", "VECOUT", 2, t, size)
    for k in range(low.pools["wf"]):
        tile(f"bwf{k}", "a tile of an intermediate value", "VECCALC", 1, ct, cs, f"wf{k}")
    for k in range(low.pools["wc"]):
        column(f"bwc{k}", "a value per row of the tile", "VECCALC", 1, ct, cs, f"wc{k}", True)
    for k in range(low.pools["wr"]):
        rowvec(f"bwr{k}", "a row of an intermediate value", "VECCALC", 1, ct, cs, f"wr{k}",
               True)
    for k in range(low.pools["wm"]):
        # rt * ctp / 8 bytes of bit mask; counted as a byte per element
        out.append(Buffer(f"bwm{k}", "a comparison's bit mask", "VECCALC", 1, "uint8_t", TILE,
                          Linear(tile=1), "t.rt * t.ctp / 8", f"wm{k}"))
    rowvec("btr0", "row scratch", "VECCALC", 1, ct, cs, "tr0", True)
    rowvec("btr1", "row scratch", "VECCALC", 1, ct, cs, "tr1", True)
    column("btc0", "column scratch", "VECCALC", 1, ct, cs, "tc0", True)
    if s.reduce:
        block("bred", "a reduction's result", "VECCALC", 1, ct, "red")
        rowvec("brw", "a reduction's work row", "VECCALC", 1, ct, cs, "rw")
    if low.row_blocks:
        tg = s.target
        bpr = tg.blocks_per_repeat
        # a block per row, in whole Brcb repeats: at most rt blocks + a repeat
        out.append(Buffer("btb", "a block per row (Brcb spreads, row-reduce gathers)",
                          "VECCALC", 1, ct, COLUMN, Linear(row=blk, fixed=tg.repeat_bytes),
                          f"(t.rt + {bpr - 1}) / {bpr} * {tg.repeat_bytes}"))
    if low.scalar_tmp:  # sized for floats, handed to the high-level ops as raw bytes
        out.append(Buffer("bht", "the high-level ops' temporary space", "VECCALC", 1,
                          "uint8_t", TILE, Linear(tile=4), "t.rt * t.ctp * sizeof(float)",
                          "ht", True))
    if low.half_tmp:
        tile("bhh", "a rounding cast's 16-bit temporary", "VECCALC", 1, "half", 2, "hh", True)
    for acc, _ in low.accumulators:
        if s.row_chunks:
            block(f"b{acc}", "a running reduction", "VECCALC", 1, ct, acc, True)
        else:
            rowvec(f"b{acc}", "running reductions of a column tile", "VECCALC", 1, ct, cs, acc,
                   True)
    # One block of slack beside the buffers: the budget is solved at run time and a
    # rounding the linear form does not see must not overflow the UB.
    return BufferPlan(tuple(out), Linear(fixed=blk), C_TYPE[s.compute])

