"""Resident tables: an input broadcast over outer axes of the loop space stays in UB.

A PARTIAL input whose row map broadcasts over the leading outer axes, spans the next ones
and broadcasts over the rest (rotary embedding's cos and sin [S, D] under x [B, N, S, D], or
[1, S, 1, D] under x [B, S, N, D]; rows of D) is one table, the same for every block of the
loop space: R rows in GM, each serving ``repeat`` consecutive rows (the heads N in BSND, 1 in
BNSD), a block of ``R * repeat`` rows. Loaded with every tile, each row of the loop space reads
its table row from GM again. Held resident in UB instead (one slot of ``rt + block`` rows,
``buffers.TABLE``), a core reads the table rows its tiles use once, before its first tile:
one strided copy puts each at the first of its rows in the slot, and bitwise copies in UB
fill the ``repeat - 1`` rows after it (``PipeBarrier<PIPE_V>`` after each doubling run).
Every tile then reads its rows from the slot. The kernel places its tiles so that a core's
tiles share table rows (``kernel.cpp.j2``, ``tiling.cpp.j2``):

- when a core's share of rows is at least a block, tiles are whole blocks (``rt`` a multiple
  of the block) and the slot holds the table ``rt / block`` times over (repeated in UB, not
  read again);
- else tiles lie inside a block and units go chunk by chunk (unit u is chunk ``u / blocks``
  of block ``u % blocks``): a core's consecutive units read the same table rows. Tiles are
  kept small enough that a core runs a few of them (``TILES_PER_CORE``), so its rows come
  from few chunks, and a chunk is whole groups of the rows sharing a table row, or a part of
  one group, so it never straddles two table rows.

The traffic model is unchanged (it reads every input once); the simulator's count falls.
The buffer plan counts the slot: when the plan with one row per tile does not fit the UB, or
the table (as held, ``block`` rows) would take more than ``1 / UB_SHARE`` of it, the input
stays loaded with every tile. Only kernels whose tiles hold whole rows (a reduction, slices
of the last axis) with a static row length qualify; a kernel that may split rows keeps that
freedom. R and ``repeat`` must be static; the leading axes may be symbolic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from graphkernel import symbolic
from graphkernel.codegen.buffers import plan
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.schedule import PARTIAL, KernelIO, Schedule, io_notes
from graphkernel.codegen.vector.tiling import align_elems
from graphkernel.ir import Dim
from graphkernel.symbolic import eq

MAX_BLOCK_COUNT = 4095  # DataCopyPad's blockCount: the most table rows one copy loads
UB_SHARE = 4            # a table takes at most a quarter of the UB; the tiles keep the rest
TILES_PER_CORE = 8      # tiles inside a block: at most about this many per core (tiling.cpp.j2)



@dataclass(frozen=True)
class TableMap:
    """How a PARTIAL input's rows are a table: ``rows`` rows in GM, ``pitch`` elements apart
    from its ``base``; each serves ``repeat`` consecutive rows of the loop space (the outer
    axes after the table's, over which it is broadcast too)."""

    rows: int
    pitch: Dim
    repeat: int = 1

    @property
    def block(self) -> int:
        """Rows of the loop space one copy of the table serves (the table as held in UB)."""
        return self.rows * self.repeat


def table_map(io: KernelIO) -> TableMap | None:
    """The table an input is: its outer axes broadcast (leading), then span (the table's
    rows, evenly spaced in GM), then broadcast again (each row repeated for consecutive rows);
    None for any other map, a symbolic or repeated part, or more rows than one copy loads."""
    if io.kind != PARTIAL or io.gather or not io.outer:
        return None
    ext, st = io.outer, io.strides
    live = [i for i in range(len(ext)) if not eq(ext[i], 1)]
    bcast = [i for i in live if eq(st[i], 0)]
    spans = [i for i in live if not eq(st[i], 0)]
    if not bcast:
        return None
    first = spans[0] if spans else len(ext)
    last = spans[-1] if spans else len(ext) - 1
    if any(first < i < last for i in bcast):  # broadcast between spanning axes
        return None
    rows_d, repeat_d = symbolic.numel(ext[first:last + 1]), symbolic.numel(ext[last + 1:])
    if not (symbolic.is_static(rows_d) and symbolic.is_static(repeat_d)):
        return None
    rows, repeat = int(symbolic.canon(rows_d)), int(symbolic.canon(repeat_d))
    if rows > MAX_BLOCK_COUNT:
        return None
    if not spans:  # one row
        return TableMap(rows, io.columns[1] if io.columns else 0, repeat)
    pitch = st[last]
    for j in spans:  # evenly spaced rows: one strided copy loads any run of them
        if not eq(st[j], symbolic.mul(pitch, symbolic.numel(ext[j + 1:last + 1]))):
            return None
    return TableMap(rows, pitch, repeat)


def choose(s: Schedule) -> Schedule:
    """``s`` with its inputs that are tables of one row count resident, when the kernel's
    tiles hold whole rows and the buffer plan with them (a trial lowering's) fits the UB;
    else ``s`` itself."""
    if s.col_reduce or s.row_chunks or not s.whole_rows or s.variant is not None or \
            not symbolic.is_static(s.L):
        return s
    maps = {io.index: table_map(io) for io in s.inputs}
    rows = next((m.block for m in maps.values() if m is not None), None)
    if rows is None:
        return s
    inputs = [replace(io, table=rows, table_repeat=maps[io.index].repeat)
              if maps[io.index] and maps[io.index].block == rows else io for io in s.inputs]
    held = replace(s, inputs=inputs)
    a = align_elems(s)
    ctp = -(-int(symbolic.canon(s.L)) // a) * a
    ub = s.target.ub_bytes
    table_bytes = sum(rows * ctp * io.dtype.itemsize for io in inputs if io.table)
    if table_bytes * UB_SHARE > ub or \
            plan(lower(held), s.target.block_bytes).budget().bytes(1, ctp) > ub:
        return s
    return replace(held, notes=io_notes(inputs, s.reduce))
