"""The kernel IR: what the lowering makes of a schedule, and what every later step reads.

A lowered kernel is a list of buffers and lists of instructions, as records:

- ``Buffer``: one ``InitBuffer`` of the Unified Buffer — its kind (``Kind``: a queue of
  loaded or stored tiles, a resident table, scratch tiles, columns, rows, blocks, bit masks,
  an API's work space), element type, bytes of a slot as a form linear in the tile
  (``Linear``), depth, and the LocalTensor the instructions name it by. The buffer plan
  (``codegen/buffers.py``) is these records in order; the tiling's budget is their sum.
- ``Call``: one vector instruction — the API, its destination, its sources (buffers, as
  ``Operand``, and C++ values), its element count, and whether it runs once per row of the
  tile; what it reads and writes follows from those fields.
- ``ScalarCode``: statements of the scalar unit, with the buffers they read and write;
  ``Sync`` (an event pair between two pipes), ``Barrier`` (``PipeBarrier<PIPE_V>``) and
  ``Comment``.

Syncs and barriers are placed from the instructions' reads and writes
(``codegen/barriers.py``); ``text`` renders instructions through one table from instruction
form to Ascend C (``TEXT``). No step reads C++ text back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

# How a value of the loop space sits in UB (a tile holds rows of the loop space): the whole
# tile, one row broadcast over the rows, one value per row, one value; PARTIAL: an input
# broadcast over some outer axes, loaded into a full tile; PIECE: an input loaded only as a
# piece of a Concat's tile
FULL, ROW, COL, SCALAR, PARTIAL, PIECE = "full", "row", "col", "scalar", "partial", "piece"


class Kind(Enum):
    """What a buffer holds."""

    QUEUE_IN = "queue in"    # tiles loaded from GM (VECIN)
    QUEUE_OUT = "queue out"  # tiles stored to GM (VECOUT)
    TABLE = "table"          # a resident table: loaded once per core, held (VECIN)
    TILE = "tile"            # scratch: a tile of values
    COLUMN = "column"        # scratch: a value per row of the tile
    ROW = "row"              # scratch: one row
    BLOCK = "block"          # one UB block
    BLOCKS = "blocks"        # a UB block per row of the tile
    MASK = "mask"            # a comparison's bit mask of a tile
    SCRATCH = "scratch"      # an API's temporary space (the math library, a rounding cast)

    @property
    def position(self) -> str:
        """The TPosition of its ``InitBuffer``: a queue's, or VECCALC for a scratch TBuf."""
        return {Kind.QUEUE_IN: "VECIN", Kind.TABLE: "VECIN",
                Kind.QUEUE_OUT: "VECOUT"}.get(self, "VECCALC")


@dataclass(frozen=True)
class Linear:
    """Bytes as ``tile*rt*ctp + col*ctp + row*rt + fixed`` for a tile of ``rt`` rows of
    ``ctp`` columns (an upper bound when the buffer's real size is rounded up to a block:
    ``fixed`` then holds a block of slack)."""

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


@dataclass(frozen=True)
class Buffer:
    """One ``InitBuffer``: a queue of ``depth`` slots or a scratch ``TBuf``."""

    name: str        # the kernel's member: qi0, qo1, bwf0, btb, ...
    role: str        # what it holds, for comments, the manifest and error messages
    kind: Kind
    ctype: str       # the C element type of a slot
    size: Linear     # bytes of one slot (the budget's bound)
    init: str        # the C expression of one slot's bytes in Init (reads the tiling)
    depth: int = 1   # slots: 2 for a double-buffered queue
    tensor: str = ""  # the LocalTensor the instructions name it by ("" none)
    in_finish: bool = False  # the steps after a completed reduction use it too

    @property
    def position(self) -> str:
        return self.kind.position

    @property
    def is_queue(self) -> bool:
        return self.position != "VECCALC"

    @property
    def local(self) -> str:
        """The LocalTensor a scratch buffer is taken as (``Get``); "" for a queue (its tiles
        are taken from the queue) and for buffers the instructions do not name."""
        return "" if self.is_queue else self.tensor

    @property
    def bound(self) -> Linear:
        return self.size * self.depth


@dataclass(frozen=True)
class Operand:
    """A buffer an instruction names: its LocalTensor, from element ``at`` (an expression;
    "" the start), seen as ``view`` elements (a ``ReinterpretCast``; "" as it is).
    ``by_row``: ``at`` follows the row of a per-row call; ``work``: the API's work space,
    written as well as read."""

    tensor: str
    at: str = ""
    view: str = ""
    by_row: bool = False
    work: bool = False


Arg = Operand | str  # a buffer, or a C++ value (a scalar, a mode, an extent)


@dataclass(frozen=True)
class Call:
    """One vector instruction: ``api<template>(dst, args..., count)``; ``each_row``: issued
    once per row of the tile (``for (uint32_t i = 0; i < rows; ++i)``). ``uses``: buffers
    the kernel's own helper writes inside the call besides ``dst`` (its row-block scratch).
    ``ordered``: a per-row call whose iterations must each wait for the one before (a
    barrier inside the loop; set by the barrier placement)."""

    api: str
    dst: Operand
    args: tuple[Arg, ...] = ()
    count: str | None = None
    each_row: bool = False
    template: str = ""
    uses: frozenset[str] = frozenset()
    owner: str = ""   # the object owning a helper of the kernel ("R." in a MIX kernel)
    ordered: bool = False
    pipe = "V"        # the vector unit

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({self.dst.tensor} | {a.tensor for a in self.args
                                              if isinstance(a, Operand) and a.work}
                         | self.uses)

    @property
    def reads(self) -> frozenset[str]:
        return frozenset(a.tensor for a in self.args if isinstance(a, Operand))

    @property
    def repeats_dst(self) -> bool:
        """A per-row call whose every iteration writes the same elements (a running
        reduction over the rows, or an API's work space)."""
        return self.each_row and (not self.dst.by_row or any(
            isinstance(a, Operand) and a.work for a in self.args))


@dataclass(frozen=True)
class ScalarCode:
    """Statements of the scalar unit, and the buffers they read and write (GetValue,
    SetValue); none for arithmetic on scalars alone."""

    lines: tuple[str, ...]
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    pipe = "S"  # the scalar unit

    @property
    def touches_ub(self) -> bool:
        return bool(self.reads or self.writes)


@dataclass(frozen=True)
class Sync:
    """The ``dst`` pipe waits for the ``src`` pipe's work so far (an event pair)."""

    src: str
    dst: str


@dataclass(frozen=True)
class Barrier:
    """``PipeBarrier<PIPE_V>``: vector instructions after it see those before it done."""


@dataclass(frozen=True)
class Comment:
    text: str


Instr = Call | ScalarCode | Sync | Barrier | Comment


@dataclass
class KernelIR:
    """A lowered kernel: its buffers in ``InitBuffer`` order, the instructions of a tile
    (``compute``: the loaded tiles' casts, the steps, the stores) and of the end of a
    reduction accumulated across tiles (``finish``), the running reductions to start
    (tensor, identity), per output of a MIX epilogue its store (``stores``), the compute
    type's C name and how many buffers each scratch pool took."""

    buffers: list[Buffer]
    compute: list[Instr]
    finish: list[Instr] = field(default_factory=list)
    accumulators: list[tuple[str, str]] = field(default_factory=list)
    stores: dict[int, list[Instr]] = field(default_factory=dict)
    compute_type: str = "float"
    pools: dict[str, int] = field(default_factory=dict)  # scratch pool -> buffers it took
    loops: list[list[str]] = field(default_factory=list)  # ScanLoopN helpers (C++ lines)
    # a vector kernel over the rows: the instructions of a tile of its second pass (after
    # ``finish``: the inputs' casts again, the steps that broadcast reduced values back, the
    # stores)
    second: list[Instr] = field(default_factory=list)

    @property
    def calls(self) -> list[Call]:
        return [i for i in (*self.compute, *self.finish, *self.second) if isinstance(i, Call)]

    def uses(self, *helpers: str) -> bool:
        """Whether any instruction calls one of the kernel's helpers (templates define them
        only when used)."""
        return any(c.api in helpers for c in self.calls)


# ----------------------------------------------------------------- the render table
BARRIER = "PipeBarrier<PIPE_V>();"
ROW_LOOP = "for (uint32_t i = 0; i < rows; ++i)"


def arg_text(a: Arg) -> str:
    """An argument as C++."""
    if not isinstance(a, Operand):
        return a
    base = f"{a.tensor}.ReinterpretCast<{a.view}>()" if a.view else a.tensor
    return f"{base}[{a.at}]" if a.at else base


def _call(c: Call) -> list[str]:
    args = [arg_text(c.dst), *map(arg_text, c.args), *([c.count] if c.count is not None else [])]
    text = f"{c.owner}{c.api}{c.template}({', '.join(args)});"
    if c.ordered:
        return [f"{ROW_LOOP} {{ {text} {BARRIER} }}"]
    return [f"{ROW_LOOP} {text}" if c.each_row else text]


# the kernel's own helpers (templates/row_forms.j2, kernel.cpp.j2) and what they write
# inside besides their destination: the row blocks ``tb`` and a reduction's work row ``rw``
HELPERS: dict[str, frozenset[str]] = {
    "RowReduce": frozenset({"tb", "rw"}), "ColOp": frozenset({"tb"}),
    "ColCopy": frozenset({"tb"}), "ColsCopy": frozenset(), "ScanRows": frozenset(),
    "ScanLinear": frozenset()}
ROW_FORMS = ("RowReduce", "ColOp", "ColCopy")  # the whole-row forms (btb, row_forms.j2)

# instruction form -> its Ascend C text
TEXT: dict[type, Callable[..., list[str]]] = {
    Call: _call,
    ScalarCode: lambda s: list(s.lines),
    Sync: lambda s: [f"Sync<HardEvent::{s.src}_{s.dst}>();"],
    Barrier: lambda b: [BARRIER],
    Comment: lambda c: [f"// {c.text}"],
}


def comment_text(text: str) -> str:
    """Text safe inside a C++ comment: names shown as they are, minus anything else."""
    return re.sub(r"[^A-Za-z0-9_.:\-\[\], ]", "_", text)[:100]


def text(instrs: Iterable[Instr]) -> list[str]:
    """The lines of Ascend C of ``instrs``, one form at a time through ``TEXT``."""
    out: list[str] = []
    for i in instrs:
        out += TEXT[type(i)](i)
    return out
