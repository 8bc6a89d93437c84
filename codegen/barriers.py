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
must have arrived (MTE2_S); after it, the vector unit waits for it (S_V). ``syncs`` places
those around each run of such scalar code.
"""

from __future__ import annotations

import re
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


# The rule over C++ lines, for the MIX epilogue's text until it is lowered to kernel IR.
BARRIER = "PipeBarrier<PIPE_V>();"
# work buffers an API call writes wherever they appear among its arguments
WORK = frozenset({"rw", "ht"})
# the kernel class's own helpers and the buffers they use inside (codegen/templates)
HELPERS = {"RowReduce": frozenset({"tb", "rw"}), "ColOp": frozenset({"tb"}),
           "ColCopy": frozenset({"tb"}), "ColsCopy": frozenset()}
# calls that are not vector instructions
NOT_VECTOR = frozenset({"Sync", "PipeBarrier"})

_LOOP = re.compile(r"for \(([^()]*)\) (.*)$")
# (a helper may be called on an object: a MIX kernel's ``R.RowReduce<...>(...)``)
_CALL = re.compile(r"(\w+\.)?(\w+)(?:<[^()]*>)?\((.*)\);$")
_NAME = re.compile(r"[A-Za-z_]\w*")


def split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments (commas inside (), [] and <> belong to them)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [a for a in out if a]


def _buffer(arg: str, buffers: frozenset[str]) -> str | None:
    m = _NAME.match(arg)
    return m.group(0) if m and m.group(0) in buffers else None


def access(line: str, buffers: frozenset[str]
           ) -> tuple[set[str], set[str], bool] | None:
    """(written, read, loop writes the same buffer every iteration) of a vector instruction
    line, or None for any other line (scalar code, syncs, comments, braces)."""
    text = line.strip()
    loop = _LOOP.match(text)
    body = loop.group(2) if loop else text
    call = _CALL.match(body)
    if call is None or call.group(2) in NOT_VECTOR or (call.group(1)
                                                       and call.group(2) not in HELPERS):
        return None  # (a method of a tensor, SetValue/GetValue, is the scalar unit's)
    name, args = call.group(2), split_args(call.group(3))
    bufs = [_buffer(a, buffers) for a in args]
    written = {b for b in bufs[:1] if b} | {b for b in bufs if b in WORK}
    written |= HELPERS.get(name, frozenset())
    read = {b for b in bufs[1:] if b}
    # a loop over rows writes disjoint rows when its destination is indexed by the row
    same_each_time = bool(loop) and (
        not re.search(r"\bi\b", args[0] if args else "") or bool(written & WORK))
    return written, read, same_each_time


def place_text(lines: Iterable[str], buffers: Iterable[str]) -> list[str]:
    """``lines`` with the vector barriers they need (any barrier already among them is
    dropped and placed again by the one rule)."""
    names = frozenset(buffers) | frozenset({"tb"}) | WORK
    out: list[str] = []
    written: set[str] = set()
    read: set[str] = set()
    for line in lines:
        if line.strip() == BARRIER:
            continue
        acc = access(line, names)
        if acc is None:
            out.append(line)
            continue
        w, r, same_each_time = acc
        if (r & written) or (w & (written | read)):
            out.append(BARRIER)
            written.clear()
            read.clear()
        if same_each_time:  # each iteration after the previous one
            head, call = _LOOP.match(line.strip()).groups()
            out.append(f"for ({head}) {{ {call} {BARRIER} }}")
            continue
        written |= w
        read |= r
        out.append(line)
    if written or read:
        out.append(BARRIER)
    return out

