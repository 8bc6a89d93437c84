"""Tiling: the UB budget of a scheduled kernel, as the host tiling function solves it.

A kernel's UB use is linear in its tile: ``tile*rt*ctp + col*ctp + row*rt + fixed`` bytes
for ``rt`` rows of ``ctp`` columns (``ctp`` rounded up so every row starts on a UB block),
summed over the kernel's buffer plan (``codegen/buffers.py``: two slots per queue for double
buffering, the peak number of live scratch tiles after buffer reuse, scratch rows and
columns). The generated ``<name>_tiling.cpp`` solves it at run time from the actual shapes
(rows per tile, or columns per tile when a row does not fit; the split over cores). Block
and repeat sizes come from the schedule's target (``Schedule.target``).
"""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.codegen.buffers import Linear, plan
from graphkernel.codegen.kernel_ir import KernelIR
from graphkernel.codegen.vector.schedule import Schedule, align_elems

__all__ = ["align_elems", "budget", "row_bytes"]


def budget(s: Schedule, ir: KernelIR) -> Linear:
    """UB bytes of a tile of ``rt`` rows and ``ctp`` columns: the buffer plan's sum."""
    return plan(ir, s.target.block_bytes).budget()


def row_bytes(s: Schedule, ir: KernelIR) -> int | None:
    """UB bytes one whole row needs (rt = 1), for a static row length; None if symbolic."""
    if not symbolic.is_static(s.L):
        return None
    a = align_elems(s)
    return budget(s, ir).bytes(1, -(-int(s.L) // a) * a)
