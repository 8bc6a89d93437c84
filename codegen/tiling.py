"""Tiling: the UB budget of a scheduled kernel, as the host tiling function solves it.

A kernel's UB use is linear in its tile: ``A*rt*ctp + B*ctp + C*rt + D`` bytes for ``rt``
rows of ``ctp`` columns (``ctp`` rounded up so every row starts on a UB block), the constants
counted from its buffers: two per queue (double buffering) for each loaded or stored tile,
the peak number of live scratch tiles after buffer reuse, scratch rows and columns. The
generated ``<name>_tiling.cpp`` solves it at run time from the actual shapes (rows per tile,
or columns per tile when a row does not fit; the split over cores); ``fits`` answers the
compile-time question for static shapes. Block and repeat sizes come from the schedule's
target (``Schedule.target``).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphkernel import symbolic
from graphkernel.codegen.lower import Lowered
from graphkernel.codegen.schedule import COL, FULL, PARTIAL, ROW, Schedule


@dataclass
class UBBudget:
    """UB bytes for a tile of rt rows and ctp columns: A*rt*ctp + B*ctp + C*rt + D."""

    A: int
    B: int
    C: int
    D: int

    def bytes(self, rt: int, ctp: int) -> int:
        return self.A * rt * ctp + self.B * ctp + self.C * rt + self.D


def budget(s: Schedule, low: Lowered) -> UBBudget:
    A = B = C = 0
    cs = s.compute.itemsize  # one element of a compute buffer
    blk = s.target.block_bytes
    D = 2 * blk  # the reduce result block, and slack
    for io in s.inputs:
        size = io.dtype.itemsize
        if io.kind in (FULL, PARTIAL):
            A += 2 * size
        elif io.kind == COL:
            C += 2 * size
            D += 2 * blk
        elif io.kind == ROW:
            B += cs + (size if io.dtype != s.compute else 0)
    for io in s.outputs:
        if io.kind == FULL:  # a Concat: one double-buffered queue per operand
            A += 2 * io.dtype.itemsize * max(1, len(io.pieces))
        elif io.kind == COL:
            C += 2 * io.dtype.itemsize
            D += 2 * blk
    A += cs * low.pools["wf"] + (4 if low.scalar_tmp else 0) + (2 if low.half_tmp else 0)
    A += low.pools["wm"]  # bit masks: rt * ctp / 8 bytes each, counted as one byte/element
    C += cs * low.pools["wc"] + cs  # + the column scratch tc0
    D += blk * (low.pools["wc"] + 1)
    B += cs * low.pools["wr"] + 2 * cs + (cs if s.reduce else 0)  # + two scratch rows (+ reduce
    #                                                                  work)
    if s.row_chunks:  # one block each, and the row outputs' one-block queues (two deep)
        D += blk * len(low.accumulators) + sum(2 * blk for io in s.outputs if io.kind == COL)
        C -= sum(2 * io.dtype.itemsize for io in s.outputs if io.kind == COL)
    else:
        B += cs * len(low.accumulators)
    B += sum(2 * io.dtype.itemsize for io in s.outputs if io.kind == ROW)
    if low.row_blocks:  # btb: a block per row, in whole Brcb repeats (a block per row each)
        C += blk
        D += s.target.repeat_bytes
    return UBBudget(A, B, C, D)


def align_elems(s: Schedule) -> int:
    """Elements per row-pitch step: a UB block of the narrowest type loaded or stored, or
    whole repeats of the compute type when Compare is used."""
    if s.masks:
        return s.target.repeat_elems(s.compute.itemsize)
    return s.target.block_elems(min(io.dtype.itemsize for io in (*s.inputs, *s.outputs)))


def row_bytes(s: Schedule, low: Lowered) -> int | None:
    """UB bytes one whole row needs (rt = 1), for a static row length; None if symbolic."""
    if not symbolic.is_static(s.L):
        return None
    a = align_elems(s)
    return budget(s, low).bytes(1, -(-int(s.L) // a) * a)
