"""Syncs and vector barriers, placed from the instructions' reads and writes.

The vector unit may overlap consecutive instructions: when two of them touch the same UB
buffer (a read after a write, a write after a read or a write), a ``PipeBarrier<PIPE_V>()``
must separate them (ascendc.md, "Pipes and synchronisation inside a core"; the simulator
checks it). ``place`` walks a kernel's instructions (``codegen/kernel_ir.py``) in program
order, tracks the buffers written and read since the last barrier, and puts one barrier
before the first instruction that depends on them. A per-row call whose every iteration
writes the same buffer (a running sum over the tile's rows) gets a barrier inside its loop.
The sequence ends ordered, so the next tile (or the steps after a reduction) starts clean.

The scalar unit is another pipe: before scalar code that reads or writes UB, the vector
unit's work so far must be done (``Sync`` V_S), and a tile it reads that was loaded from GM
must have arrived (MTE2_S); after it, the vector unit waits for it (S_V), and when no vector
instruction follows before the tile is stored, the store waits for it too (S_MTE3).
``syncs`` places those around each run of such scalar code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from graphkernel.codegen.kernel_ir import Barrier, Call, Instr, ScalarCode, Sync


def syncs(instrs: Sequence[Instr], loaded: Iterable[str]) -> list[Instr]:
    """``instrs`` with the syncs between the vector and scalar units around each run of
    scalar code that touches UB (``loaded``: the tensors of tiles loaded from GM)."""
    tiles = frozenset(loaded)
    out: list[Instr] = []
    k = 0
    while k < len(instrs):
        i = instrs[k]
        if not (isinstance(i, ScalarCode) and i.touches_ub):
            out.append(i)
            k += 1
            continue
        run = []
        while k < len(instrs) and isinstance(instrs[k], ScalarCode) and instrs[k].touches_ub:
            run.append(instrs[k])
            k += 1
        out.append(Sync("V", "S"))
        if any(r.reads & tiles for r in run):
            out.append(Sync("MTE2", "S"))
        out += run
        out.append(Sync("S", "V"))
        if not any(isinstance(j, Call) for j in instrs[k:]) and any(r.writes for r in run):
            out.append(Sync("S", "MTE3"))  # what it wrote is stored next, no vector op between
    return out


def place(instrs: Sequence[Instr]) -> list[Instr]:
    """``instrs`` with the vector barriers they need (any barrier already among them is
    dropped and placed again by the one rule)."""
    out: list[Instr] = []
    written: set[str] = set()
    read: set[str] = set()
    for i in instrs:
        if isinstance(i, Barrier):
            continue
        if not isinstance(i, Call):
            out.append(i)
            continue
        w, r = i.writes, i.reads
        if (r & written) or (w & (written | read)):
            out.append(Barrier())
            written.clear()
            read.clear()
        if i.repeats_dst:  # each iteration after the previous one
            out.append(replace(i, ordered=True))
            continue
        written |= w
        read |= r
        out.append(i)
    if written or read:
        out.append(Barrier())
    return out
