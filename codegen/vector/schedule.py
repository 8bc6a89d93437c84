"""Schedule a GraphKernel for the vector unit: the loop space, every value's layout, the steps.

The loop space of a kernel is a matrix of ``M`` rows by ``L`` columns over its largest
tensors (``FULL`` values, all with the same element count, read and written contiguously).
``L`` is the product of the trailing axes that every broadcast and every reduction respects:
the reduced extent when the kernel reduces, else the longest trailing run over which no input
is partly broadcast (``M = 1, L = numel`` for a plain elementwise kernel). Every other value
is held in UB in one of the compact layouts of that matrix:

- ``ROW``     one row of ``L`` (broadcast over the rows; a bias),
- ``COL``     one value per row (a last-axis reduction, a per-channel scale),
- ``SCALAR``  one value (a scalar constant or a one-element input),
- ``PARTIAL`` an input broadcast over some outer axes only; loaded row by row into a full tile
  (or, a table broadcast over the leading axes and maybe the last ones, held resident:
  codegen/vector/resident.py).

Views (Reshape, ExpandDims, Squeeze, Identity) do not move data: a view's value shares its
source's storage. The schedule refuses, with a reason, anything outside this model (the
reason becomes the fallback message).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import numpy as np

from graphkernel import symbolic
from graphkernel.codegen import targets
from graphkernel.codegen.instructions import (
    BITS,
    BITWISE_OPS,
    FLOATS,
    INSTRUCTIONS,
    MASK_OPS,
    REDUCE_OPS,
    SCAN_OPS,
)
from graphkernel.codegen.kernel_ir import COL, FULL, PARTIAL, PIECE, ROW, SCALAR
from graphkernel.codegen.refusal import NeedsPhases, SplitBefore, Unsupported
from graphkernel.codegen.vector import views
from graphkernel.codegen.vector.decompose import decompose
from graphkernel.errors import ShapeError
from graphkernel.flags import DEFAULT_TARGET
from graphkernel.ir import Dim, DType, Node, Value
from graphkernel.ops import CUBE_OPS, VIEW_OPS
from graphkernel.symbolic import eq
from graphkernel.textir import format_graph, type_text

# between a stored broadcast and its output: views, and the cast rounding the stored value
STORE_VIEWS = VIEW_OPS | {"Cast"}


@dataclass
class KernelIO:
    """A kernel input or output: its GM buffer and how a tile of it sits in UB."""

    index: int
    value: Value          # the subgraph's input/output value
    kind: str
    dtype: DType
    shape: tuple[Dim, ...]
    outer: tuple[Dim, ...] = ()    # PARTIAL: the outer dims a row index decomposes over
    strides: tuple[Dim, ...] = ()  # PARTIAL: the input's element stride per outer dim (0: bcast)
    base: Dim = 0                  # PARTIAL: element offset of the first row (a slice's start;
    #                                symbolic along a symbolic stride: the host computes it)
    local: Value | None = None     # the value holding the loaded tile (an input or its slice)
    #                                an output with ``outer``: its rows are stored through the
    #                                map (outer, strides, base) of a view of a computed value
    # an output that is a Concat: each operand (a full tile) stored to its block of the output,
    # (operand, element offset of its first row, element distance between its rows in GM)
    pieces: tuple[tuple[Value, Dim, Dim], ...] = ()
    # an input whose tile is a Concat of kernel inputs (this one first): per operand, its
    # input index and its rows per block of ``block_rows`` rows of the Concat (rows of L)
    gather: tuple[tuple[int, Dim], ...] = ()
    block_rows: Dim = 1
    # per operand of ``gather``: None when the operand is its input entire, else (element
    # offset of its first row, rows of L per block in its input's buffer): a slice of its
    # input along the Concat's axis (a symbolic offset is computed by the host)
    gather_at: tuple[tuple[Dim, Dim] | None, ...] = ()
    # an output that is a broadcast of a value over new outer axes (grouped-query attention's
    # repeat of k/v heads): (extent, element stride) per such axis; the tile is stored once
    # per copy, at the copy's offset
    copies: tuple[tuple[int, int], ...] = ()
    # an input read by steps on columns of rows (Schedule.cols): (first column, width) of the
    # tile its rows are loaded to (a partial rotary embedding's cos and sin)
    columns: tuple[int, int] | None = None
    # PARTIAL, a table (broadcast over leading outer axes, and maybe over the axes after the
    # table's too): the rows of the loop space one copy of it serves (the same for every block
    # of that many rows), held resident in UB and loaded once per core (codegen/vector/resident.py);
    # 0: its rows are loaded with every tile
    table: int = 0
    table_repeat: int = 1  # a table: consecutive rows of the loop space each GM row serves
    # an embedding table ([rows, L]): row r of the tile is the table's row named by element r
    # of the index input numbered ``lookup`` (-1: not a lookup); ``lookup_rows``: its rows
    lookup: int = -1
    lookup_rows: Dim = 0
    # an output that is one part of a Split of a computed value along an axis before the
    # last: (rows of L per block of the value, the part's first row in a block, its rows per
    # block); the rows of each block in that range are stored, the others belong to others
    part: tuple[Dim, Dim, Dim] | None = None
    # an output that is a transpose of a computed value moving its last axis: (shape,
    # strides), element (i0, i1, ...) of the computed value (of that shape) lands at
    # sum(i_j * strides[j]) of the output; the whole value is one tile, rearranged in UB by a
    # Gather through a table of byte offsets before it is stored (``Schedule.single_tile``).
    # An input: its transpose (of that shape) read by the steps takes element (i0, i1, ...)
    # from sum(i_j * strides[j]) of the input, loaded as it lies and gathered in UB.
    transpose: tuple[tuple[int, ...], tuple[int, ...]] | None = None


@dataclass
class Schedule:
    node: str                      # the GraphKernel node's name
    name: str                      # a C identifier derived from it
    M: Dim
    L: Dim
    reduce: bool                   # some step reduces each row: a tile holds whole rows
    inputs: list[KernelIO]
    outputs: list[KernelIO]
    steps: list[Node]              # computing nodes in order (views and constants excluded)
    kind: dict[int, str] = field(default_factory=dict)     # id(value) -> layout
    root: dict[int, Value] = field(default_factory=dict)   # id(view value) -> storage owner
    scalars: dict[int, float] = field(default_factory=dict)  # id(value) -> constant
    notes: list[str] = field(default_factory=list)
    col_reduce: bool = False       # steps reduce over the rows: a core owns whole columns
    batch: Dim = 1                 # col_reduce over middle axes [B, M, L]: independent blocks
    #                                of M rows (row r of block b is row b*M + r of the space)
    # col_reduce with Scans: the steps that reduce each row of the tile within the tile (a
    # selective scan's readout, sum over the state of h * C), one value per row; a column
    # tile is then the whole row (``whole_row_tiles``)
    row_reduces: frozenset[int] = frozenset()
    # col_reduce: the final steps that reduce a reduced row (a value per block of one row of
    # L) along that row, to one value per block (SCALAR): a global response norm's mean
    # over the channels of the norms over H, W; a column tile is then the whole row
    late_reduces: frozenset[int] = frozenset()
    # col_reduce: id(step) of the second pass over the column tile's rows, once its
    # reductions and the final steps are done (the work that broadcasts a reduced value back
    # over the rows it was reduced from: x * Nx of a global response norm); the pass loads
    # the inputs it reads again, tile by tile, and stores its results
    second: frozenset[int] = frozenset()
    # col_reduce: a row tile holds every row of its block (``M`` rows of a column tile):
    # each reduction is complete within the tile, so the steps after it (a reduction of its
    # result broadcast back: LayerNorm over the channels of [B, C, L]) run in the same
    # tile, in order, with no final steps and no second pass (``block_tile``)
    block_tile: bool = False
    row_chunks: bool = False       # rows too long for UB: a core owns whole rows, reduces
    #                                them chunk by chunk, then runs the steps on the results
    final: set[int] = field(default_factory=set)  # id(step): runs once per column tile, after
    #                                               all rows (it depends on a column reduction)
    compute: DType = DType.float32  # the type of every float value in UB (CT in the code)
    variant: Schedule | None = field(default=None, repr=False)  # chosen at run time (tiling
    #   key 1) when this schedule's whole rows do not fit the UB: the row_chunks variant
    target: targets.Target = field(default_factory=lambda: targets.load(DEFAULT_TARGET),
                                   repr=False, compare=False)  # the facts the code obeys
    # id(value) -> (first column, width, row): a value that is a run of columns of each row
    # of the loop space (a slice of the last axis, ops on such slices, a Concat of them
    # narrower than the row). It sits in a full tile at that column offset (the slice shares
    # its source's tile); only those columns of each row are meaningful.
    cols: dict[int, tuple[int, Dim, Dim]] = field(default_factory=dict)
    # one core, one tile holding the whole loop space: an output is transposed in UB (its
    # elements move across rows, so no tile may hold a part of it)
    single_tile: bool = False

    @property
    def whole_row_tiles(self) -> bool:
        """A kernel over the rows whose column tile holds the whole row: some step reduces
        each row within the tile (a scan's readout), or a final step reduces the reduced
        row."""
        return self.col_reduce and bool(self.row_reduces or self.late_reduces)

    @property
    def whole_rows(self) -> bool:
        """Tiles hold whole rows: a step reduces each row, or reads columns of a row at an
        offset (a slice of the last axis)."""
        return self.reduce or bool(self.cols)

    def second_reads(self) -> list[int]:
        """id(storage) of every value the second pass's steps read, in order."""
        out: list[int] = []
        for n in self.steps:
            if id(n) in self.second:
                out += [id(self.storage(v)) for v in n.inputs
                        if id(self.storage(v)) not in out]
        return out

    def second_inputs(self) -> set[int]:
        """Indices of the inputs the second pass loads again."""
        read = set(self.second_reads())
        return {io.index for io in self.inputs
                if id(self.storage(io.local if io.local is not None else io.value)) in read}

    def second_outputs(self) -> set[int]:
        """Indices of the outputs the second pass stores."""
        made = {id(self.storage(n.outputs[0])) for n in self.steps if id(n) in self.second}
        return {io.index for io in self.outputs if id(self.storage(io.value)) in made}

    def layout(self, v: Value) -> str:
        return self.kind[id(self.storage(v))]

    @property
    def table_rows(self) -> int:
        """Rows of the resident tables (every one repeats over blocks of that many rows of
        the loop space); 0 when no input is resident."""
        return next((io.table for io in self.inputs if io.table), 0)

    @property
    def table_group(self) -> int:
        """Consecutive rows of the loop space that share a row of a resident table (the
        largest over the tables; 1 when none repeats its rows)."""
        return max((io.table_repeat for io in self.inputs if io.table), default=1)

    def storage(self, v: Value) -> Value:
        return follow(self.root, v)

    @property
    def masks(self) -> bool:
        """Compare/Select work on whole tiles whose element counts are multiples of 64."""
        return any(n.op in MASK_OPS for n in self.steps)

    @property
    def low_precision(self) -> bool:
        return any(io.dtype != DType.float32 for io in (*self.inputs, *self.outputs))


def follow(root: dict[int, Value], v: Value) -> Value:
    """The value whose UB storage ``v`` shares (through views and aliases), or ``v``."""
    while id(v) in root:
        v = root[id(v)]
    return v


_IDENT = re.compile(r"[^A-Za-z0-9_]")


def sanitize(name: str) -> str:
    """A C identifier from a user-derived name: nothing but [A-Za-z0-9_], never a keyword."""
    s = _IDENT.sub("_", name)
    return "gk_" + s[:96]


def kernel_symbol(kernel: Node) -> str:
    """The kernel's C name: its sanitized node name plus a hash of its body, so kernels of
    different graphs can share one library and equal bodies share one symbol."""
    sub = kernel.subgraph
    body = format_graph(sub) + "|" + ";".join([type_text(v.type)
                                               for v in (*sub.inputs, *sub.outputs)])
    return f"{sanitize(kernel.name)}_{hashlib.sha1(body.encode()).hexdigest()[:8]}"



def _trailing_split(shape: tuple[Dim, ...], L: Dim) -> int | None:
    """The axis k with prod(shape[k:]) == L (the outermost such), or None."""
    found = None
    for k in range(len(shape), -1, -1):
        if eq(symbolic.numel(shape[k:]), L):
            found = k
    return found


@dataclass(frozen=True)
class View:
    """Where a value's elements sit in a kernel input's GM buffer: element (i0, i1, ...) is at
    ``base + sum(i_j * strides[j])`` (a contiguous input, or a slice of one)."""

    base: Dim  # symbolic when a slice starts along an axis of symbolic stride
    strides: tuple[Dim, ...]

    @staticmethod
    def contiguous(shape: tuple[Dim, ...]) -> View:
        return View(0, tuple(symbolic.numel(shape[i + 1:]) for i in range(len(shape))))

    def is_contiguous(self, shape: tuple[Dim, ...]) -> bool:
        want = View.contiguous(shape).strides
        return eq(self.base, 0) and all(eq(a, b) or eq(d, 1)
                                      for a, b, d in zip(self.strides, want, shape, strict=True))


SLICE_VIEW_OPS = ("StridedSlice",)  # the views a kernel reads in place at an offset


def unit_axes_view(view: View, shape: tuple[Dim, ...], new: tuple[Dim, ...]) -> View | None:
    """``view`` of a value of ``shape`` as the view of its reshape to ``new`` when the reshape
    only adds or drops axes of one (a head axis of one inserted): the same elements at the
    same places. None for any other reshape."""
    real = [(d, st) for d, st in zip(shape, view.strides, strict=True) if not eq(d, 1)]
    if [d for d, _ in real] != [d for d in new if not eq(d, 1)]:
        return _split_view(view, real, new)
    it = iter(real)
    return View(view.base, tuple(0 if eq(d, 1) else next(it)[1] for d in new))


def _split_view(view: View, real: list[tuple[Dim, Dim]], new: tuple[Dim, ...]) -> View | None:
    """The view of a reshape (static extents) that splits axes of a strided view or merges
    axes lying one after another in GM (a slice of a projection's columns viewed as heads:
    ``[B, L, 128]`` of rows of 160 as ``[B, L, 8, 16]``): element places are unchanged, each
    new axis' stride the stride of the old axis it splits times the extent after it within
    that axis. None when an old axis is cut across (a merge of axes not laid end to end)."""
    dims = [d for d in new if not eq(d, 1)]
    if not all(isinstance(d, int) for d, _ in real) or not all(isinstance(d, int) for d in dims):
        return None
    strides: list[Dim] = []
    i = j = 0
    while i < len(real) and j < len(dims):
        # the smallest group of old axes i..i2 and new axes j..j2 of equal element counts
        i2, j2 = i + 1, j + 1
        a, b = real[i][0], dims[j]
        while a != b:
            if a < b and i2 < len(real):
                a *= real[i2][0]
                i2 += 1
            elif b < a and j2 < len(dims):
                b *= dims[j2]
                j2 += 1
            else:
                return None
        group = real[i:i2]
        for (_, s0), (d1, s1) in zip(group, group[1:], strict=False):
            if not isinstance(s0, int) or not isinstance(s1, int) or s0 != s1 * d1:
                return None  # merged axes not laid end to end
        inner = group[-1][1]
        for k in range(j, j2):
            strides.append(symbolic.mul(inner, math.prod(dims[k + 1:j2])))
        i, j = i2, j2
    if i != len(real) or j != len(dims):
        return None
    it = iter(strides)
    return View(view.base, tuple(0 if eq(d, 1) else next(it) for d in new))


def classify(vshape: tuple[Dim, ...], S: tuple[Dim, ...], L: Dim, view: View | None = None):
    """Layout of a value of shape ``vshape`` (at GM ``view``, if it is loaded from GM) used in
    an op whose output (a FULL value) has shape ``S``, under row length ``L``:
    (kind, outer dims, outer strides, base) or None."""
    if len(vshape) > len(S):
        return None
    k = _trailing_split(S, L)
    if k is None:
        return None
    pad = len(S) - len(vshape)
    v = (1,) * pad + tuple(vshape)
    view = view or View.contiguous(tuple(vshape))
    strides = (0,) * pad + tuple(view.strides)
    span = [eq(a, b) for a, b in zip(v, S, strict=True)]
    bcast = [eq(a, 1) for a in v]
    if not all(s or b for s, b in zip(span, bcast, strict=True)):
        return None
    inner = "span" if all(span[k:]) else "bcast" if all(bcast[k:]) else None
    outer = "span" if all(span[:k]) else "bcast" if all(bcast[:k]) else "partial"
    if inner is None:
        return None
    if inner == "span":  # a row must be contiguous in GM
        run: Dim = 1
        for i in range(len(S) - 1, k - 1, -1):
            if not eq(v[i], 1) and not eq(strides[i], run):
                return None
            run = symbolic.mul(run, v[i])
    contiguous = view.is_contiguous(tuple(vshape))
    if outer == "partial" or (outer == "span" and inner == "span" and not contiguous):
        if inner != "span":
            return None
        outer_strides = tuple(0 if bcast[i] and not span[i] else strides[i] for i in range(k))
        return PARTIAL, tuple(S[:k]), outer_strides, view.base
    layout = {("span", "span"): FULL, ("bcast", "span"): ROW, ("span", "bcast"): COL,
              ("bcast", "bcast"): SCALAR}[(outer, inner)]
    if not contiguous:
        # a ROW or COL read from one contiguous block of its input at an offset (a slice of
        # leading axes: one head's per-row values of a [heads, ...] tensor) is loaded as
        # it would be at offset 0, from its first element on (the tiling's ``pb``)
        if layout in (ROW, COL) and View(0, view.strides).is_contiguous(tuple(vshape)):
            return layout, (), (), view.base
        return None
    return layout, (), (), 0


def _size(d: Dim) -> int:
    """A dim's size for comparisons (symbols assumed large)."""
    c, syms = symbolic.parse_dim(d)
    return c * 4096 ** len(syms)


def slice_view(n: Node) -> View:
    """The GM view of a Slice/StridedSlice output over its (contiguous) input."""
    shape = tuple(n.inputs[0].shape)
    base_strides = View.contiguous(shape).strides
    starts, steps = [0] * len(shape), [1] * len(shape)
    if n.op == "Slice":
        starts = list(n.attrs["begin"])
    else:
        a = n.attrs
        axes = a["axes"] if a["axes"] is not None else list(range(len(a["begin"])))
        strides = a["strides"] or [1] * len(a["begin"])
        for b, e, st, ax in zip(a["begin"], a["end"], strides, axes, strict=True):
            ax %= len(shape)
            d = shape[ax]
            if not isinstance(d, int):
                if st != 1 or b != 0:
                    raise Unsupported(f"{n.op} of a symbolic axis", node=n)
                continue
            starts[ax], _, steps[ax] = slice(b, e, st).indices(d)
            if steps[ax] < 0:
                raise Unsupported(f"{n.op} with a negative step", node=n)
    base: Dim = 0  # a symbolic offset (a start along an axis of symbolic stride) is a
    for st, bs in zip(starts, base_strides, strict=True):  # host-computed tiling value
        if st:
            try:
                base = symbolic.add(base, symbolic.mul(st, bs))
            except ShapeError:
                raise Unsupported(f"{n.op} with offsets along strides that do not sum to one "
                                  f"symbolic term ({symbolic.pretty(base)} + {st} x "
                                  f"{symbolic.pretty(bs)})", node=n) from None
    return View(base, tuple(symbolic.mul(bs, sp) for bs, sp in zip(base_strides, steps,
                                                                     strict=True)))


def read_as_floats(x: Value) -> bool:
    """Whether a kernel's int32 or int64 input ``x`` is read only through Casts to float32
    (the load converts it: ``_Planner._widening_load``)."""
    return bool(x.users) and all(u.op == "Cast" and u.outputs[0].dtype == DType.float32
                                 for u in x.users)


class _Planner:
    def __init__(self, kernel: Node, row_chunks: bool = False, stored_broadcasts: bool = False,
                 target: targets.Target | None = None):
        self.kernel = kernel
        self.target = target if target is not None else targets.load(DEFAULT_TARGET)
        self.row_chunks = row_chunks
        # BroadcastTos that only reach outputs are stored once per copy (else materialised)
        self.stored_broadcasts = stored_broadcasts
        self.bstores: dict[int, Node] = {}  # id(BroadcastTo output) -> the node
        self.copies: dict[int, tuple[tuple[int, int], ...]] = {}  # id(output) -> its copies
        # composite ops rewritten into basic ones; origin maps nodes back for the fallback
        self.sub, self.origin = decompose(kernel.subgraph)
        # ops every operand of a Concat ends with run once after it (on one loaded tile)
        self.sub, moved = views.sink_concats(self.sub, elementwise)
        self.moved = {k: self.origin.get(id(n), n) for k, n in moved.items()}
        self.root: dict[int, Value] = {}
        self.scalars: dict[int, float] = {}
        self.views: dict[int, View] = {}       # id(value loaded from GM) -> its view
        self.loaded: dict[int, Value] = {}     # id(kernel input) -> the value loaded from it
        self.partial: dict[int, tuple] = {}
        self.concats: list[Node] = []
        self.gathers: list[Node] = []  # Concats of kernel inputs loaded into one tile
        # id(kernel input) -> (offset, elements per block) of its slice a loaded Concat reads
        self.gather_at: dict[int, tuple[Dim, Dim]] = {}
        self.gather_src: dict[int, Value] = {}  # id(operand of a loaded Concat) -> its input
        self.parts: dict[int, tuple[Node, int]] = {}  # id(Split output) -> (Split, its number)
        self.shown: dict[int, Node] = {}  # id(view of a computed value) -> the view node
        # id(kernel output) -> (shape, strides): where the elements of a computed value of that
        # shape land in the output's buffer (the output is a chain of views of it)
        self.store_maps: dict[int, tuple[tuple[Dim, ...], tuple[Dim, ...]]] = {}
        self.transposed: set[int] = set()  # id(output) whose map moves the last axis
        # id(kernel input) -> (shape, strides): a transpose of it moving the last axis, loaded
        # as it lies in GM and gathered in UB (element i of the shape from sum(i_j * s_j))
        self.gathered_in: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        # column values (Schedule.cols), the slices that start them and the Concats of them
        self.cols: dict[int, tuple[int, Dim, Dim]] = {}
        self.colslices: list[Node] = []
        self.colcats: list[Node] = []
        self.colinputs: dict[int, tuple[int, Dim, Dim]] = {}  # id(kernel input) -> its columns
        # row lookups (Gather of whole rows of a table input by an index input), and their
        # index inputs: read by the scalar unit, never loaded into UB
        self.lookups: list[Node] = [n for n in self.sub.nodes if _row_lookup(self.sub, n)]
        self.indices = {id(follow_views(n.inputs[1])) for n in self.lookups}

    def owner(self, v: Value) -> Value:
        return follow(self.root, v)

    def plan(self) -> Schedule:
        sub = self.sub
        for v in (*sub.inputs, *sub.outputs):  # bool: bytes in GM, 0/1 or a mask in UB
            if id(v) in self.indices:
                continue  # (an index: read by the scalar unit)
            if v.dtype == DType.int64 and any(v is x for x in sub.inputs) and read_as_floats(v):
                continue  # (int64 positions: converted to float32 on loading)
            if v.dtype == DType.int64 and v.producer is not None and \
                    self._truncating_store(v.producer):
                continue  # (int64 counts: converted from float32 on storing)
            if v.dtype not in FLOATS and v.dtype not in (DType.bool, BITS):
                raise Unsupported(f"{v.dtype} data (the generator handles float16/bfloat16/"
                                  "float32, bool, and int32 in bitwise ops)")
        self._check_bits()
        for v in sub.inputs:
            self.loaded[id(v)] = v
            if id(v) not in self.indices:
                self.views[id(v)] = View.contiguous(tuple(v.shape))
        steps = []
        concats: list[Node] = self.concats
        for n in sub.nodes:
            if n.op == "Constant":  # an integer keeps every bit (int32 exceeds fp32's 24)
                c = np.asarray(n.attrs["value"]).reshape(-1)[0]
                self.scalars[id(n.outputs[0])] = int(c) if n.outputs[0].dtype == BITS else float(c)
            elif n.op in VIEW_OPS or (n.op == "Cast" and self._cast_is_view(n)) or (
                    n.op == "Concat" and len(n.inputs) == 1):  # (a Concat of one: itself)
                self.root[id(n.outputs[0])] = self.owner(n.inputs[0])
                self._column_alias(n)
            elif self._column_view(n):
                self._colslice(n)  # a view of a tile's rows at a column offset
            elif n.op in ("Slice", "StridedSlice", "Transpose"):
                self._slice(n)  # a strided view of a kernel input
            elif n.op == "BroadcastTo" and self._stored_broadcast(n):
                self.root[id(n.outputs[0])] = self.owner(n.inputs[0])
                self.bstores[id(n.outputs[0])] = n
            elif n.op == "BroadcastTo":
                self._no_columns(n)
                steps.append(n)  # an alias, or materialised when its source is compact
            elif n.op == "Concat" and self._colcat(n):
                steps.append(n)  # column pieces copied into one tile
            elif n.op == "Concat" and self._gather(n):
                pass  # loaded piece by piece into one tile
            elif n.op == "Split":
                self._split(n)  # each part stored from the tile of the value it splits
            elif n.op == "Gather" and any(n is g for g in self.lookups):
                self._lookup(n)  # the table's rows loaded by index into one tile
            elif n.op == "Concat":  # stored operand by operand into the output's blocks
                self._no_columns(n)
                if any(tuple(x.shape) != tuple(n.inputs[0].shape) for x in n.inputs):
                    raise Unsupported("Concat of operands of different shapes", node=n)
                concats.append(n)
            elif n.op in CUBE_OPS:
                raise Unsupported(f"{n.op} is a cube op; the generator emits vector code",
                                  node=n)
            elif n.op in INSTRUCTIONS:  # (BroadcastTo is an entry too, taken above)
                self._column_step(n)
                steps.append(n)  # a Cast here rounds to fp16/bf16 and back (UB stays fp32)
            else:
                raise Unsupported(f"{n.op} not supported by codegen", node=n)
        self._place_stores(steps)
        self._place_broadcast_stores()
        for v in sub.outputs:
            if id(v) in self.cols:
                raise Unsupported(f"output {v.name} is a slice of the last axis of a computed "
                                  "value (stored only as part of a Concat spanning the row)",
                                  about=(v,))
        cat_outs = {id(n.outputs[0]) for n in concats}
        for n in steps:  # a Concat's blocks go straight to its output; nothing computes on them
            if any(id(self.owner(x)) in cat_outs for x in n.inputs):
                raise Unsupported(f"{n.op} reads the result of a Concat (a Concat is only "
                                  "stored)", node=n)
        sliced = {id(v) for v in sub.inputs if self.loaded[id(v)] is not v}
        sliced |= cat_outs
        copied = self._copied_values()
        N = max((v.type.numel for v in self._all_values()
                 if id(self.owner(v)) not in sliced and id(v) not in copied), key=_size)
        reduces = [n for n in steps if n.op in REDUCE_OPS]
        if concats and reduces:
            raise Unsupported("Concat in a kernel that reduces", node=concats[0])
        self.col_reduce = False
        self.batch: Dim = 1
        self.row_reduces: frozenset[int] = frozenset()
        late = self._late_reduces(steps, N)
        self.late_reduces = frozenset(id(n) for n in late)
        L = self._row_length(steps, [n for n in reduces if n not in late], N)
        self._check_late(late, L)
        if any(not eq(row, L) for _, _, row in self.cols.values()):
            raise Unsupported(f"a slice of the last axis in a kernel whose rows are {L} long "
                              "(columns are sliced from whole rows)", node=self.colslices[0])
        M = symbolic.div(N, L)
        if M is None:
            raise Unsupported(f"row length {L} does not divide the element count {N}")
        kind = self._layouts(steps, N, L)
        ins = [KernelIO(i, v, PIECE, v.dtype, tuple(v.shape)) if id(v) in self.indices
               else self._io(i, v, kind, True) for i, v in enumerate(sub.inputs)]
        self._gather_io(ins, L)
        self._lookup_io(ins, L)
        cat = {id(n.outputs[0]): n for n in concats}
        outs = [self._concat_io(i, v, cat[id(self.owner(v))], kind, N, L)  # (or its Cast)
                if id(self.owner(v)) in cat else self._io(i, v, kind, False, L)
                for i, v in enumerate(sub.outputs)]
        self._part_io(outs, L)
        for o in outs:
            allowed = ((FULL, ROW, COL) if self.row_reduces else (FULL, ROW)) if \
                self.col_reduce else (FULL, COL) if reduces else (FULL,)
            if o.kind not in allowed:
                raise Unsupported(f"output {o.value.name} is a broadcast ({o.kind}) value",
                                  about=(o.value,))
            total = symbolic.mul(N, int(np.prod([e for e, _ in o.copies])))
            if o.kind == FULL and not o.pieces and not o.part and not eq(o.value.type.numel,
                                                                          total):
                raise Unsupported(f"output {o.value.name} is smaller than the loop space "
                                  "(a source of a broadcast, stored as it is)", about=(o.value,))
        if self.row_chunks and (not reduces or self.col_reduce):
            raise Unsupported("a row too long for UB with no reduction of the row to chunk")
        second: set[int] = set()
        block_tile = False
        try:
            final = (self._final_steps(steps, kind, (ROW, SCALAR), second) if self.col_reduce
                     else self._final_steps(steps, kind, (COL, SCALAR)) if self.row_chunks
                     else set())
            if second:
                self._check_second(steps, kind, ins, outs, final, second)
        except NeedsPhases as e:
            if not self._block_tile(symbolic.div(M, self.batch) if self.batch != 1 else M,
                                    outs, e):
                raise
            block_tile, final, second = True, set(), set()
        steps = [n for n in steps if id(n) not in final and id(n) not in second] + \
            [n for n in steps if id(n) in final] + [n for n in steps if id(n) in second]
        for io in ins:  # int64 is converted as tiles and values per row are loaded only
            if io.dtype == DType.int64 and io.kind not in (FULL, PARTIAL, COL) and \
                    id(io.value) not in self.indices and read_as_floats(io.value):
                raise Unsupported(f"int64 input {io.value.name} broadcast ({io.kind})",
                                  node=io.value.users[0], about=(io.value,))
        if self.batch != 1:  # blocks of rows reduced separately
            M = symbolic.div(M, self.batch)
        sched = Schedule(self.kernel.name, kernel_symbol(self.kernel), M, L,
                         bool(reduces) and not self.col_reduce, ins, outs, steps, kind,
                         self.root, self.scalars, col_reduce=self.col_reduce, final=final,
                         row_chunks=self.row_chunks, compute=self._compute_type(),
                         batch=self.batch, cols=self.cols, row_reduces=self.row_reduces,
                         late_reduces=self.late_reduces, second=frozenset(second),
                         block_tile=block_tile)
        sched.notes = io_notes(ins, bool(reduces))
        if self.transposed or self.gathered_in:
            self._single_tile(sched)
        return sched

    def _block_tile(self, M: Dim, outs: list[KernelIO], why: NeedsPhases) -> bool:
        """Whether a kernel over the rows whose steps need the reduced values across the
        rows they were reduced from (``why``: a reduction of work that broadcasts another
        reduction back, LayerNorm over the channels) runs as block tiles: a row tile holds all
        ``M`` rows of its block for a column tile, so every reduction is complete within the
        tile and the steps run in order on tiles held in UB. Needs a static ``M`` of at most
        ``MAX_TILE_ROWS`` rows (their column tile of one 32-byte block must fit the UB:
        ``legalize._block_fits`` checks the buffer plan; the host tiling takes as many columns
        as fit), nothing but plain tiles stored, and no other form of kernel over the rows
        (scans, late reductions, slices, concats)."""
        if not self.col_reduce or self.row_reduces or self.late_reduces or self.cols or \
                self.concats or self.gathers or self.lookups or self.transposed or \
                self.gathered_in or self.parts or self.bstores:
            return False
        if not isinstance(M, int) or M > MAX_TILE_ROWS:
            return False
        return all(io.kind == FULL and not io.copies and not io.pieces and not io.part and
                   not io.outer and io.transpose is None for io in outs)

    def _single_tile(self, s: Schedule) -> None:
        """A kernel with an output transposed in UB runs as one tile on one core: the
        transposed elements cross rows, so the tile must hold the whole loop space."""
        t = next(iter(self.shown.values()), None)
        if t is None:
            t = next((n for n in self.sub.nodes if n.op == "Transpose"), None)
        if s.col_reduce or s.row_chunks or not eq(s.batch, 1):
            raise Unsupported("Transpose of a computed value that moves its last axis in a "
                              "kernel reducing over the rows (the in-UB transpose needs the "
                              "whole value in one tile of whole rows)", node=t)
        if not isinstance(s.M, int) or not isinstance(s.L, int) or s.M > MAX_TILE_ROWS:
            raise Unsupported(f"Transpose of a computed value that moves its last axis in a "
                              f"loop space of {s.M} rows (the in-UB transpose holds the whole "
                              f"value in one tile of at most {MAX_TILE_ROWS} rows)", node=t)
        if any(io.dtype != s.compute for io in (*s.inputs, *s.outputs) if io.transpose):
            raise Unsupported("Transpose of a computed value that moves its last axis, "
                              "stored in another type than the kernel computes in", node=t)
        a, per = align_elems(s), s.target.repeat_elems(s.compute.itemsize)
        if s.M * (-(-s.L // a) * a) // per > GATHER_REPEATS:
            raise Unsupported(f"Transpose of a computed value that moves its last axis: a tile "
                              f"of {s.M} rows of {s.L} is more than one in-UB gather moves "
                              f"({GATHER_REPEATS} repeats of {per})", node=t)
        s.single_tile = True

    def _final_steps(self, steps: list[Node], kind: dict[int, str], allowed: tuple[str, ...],
                     second: set[int] | None = None) -> set[int]:
        """Steps that depend on a reduction accumulated across tiles: they run once it is
        complete, on reduced values only (``allowed`` layouts); a FULL value depending on one
        needs a second pass: collected in ``second`` when given (a kernel over the rows,
        checked by ``_check_second``), else the kernel is split into phase kernels."""
        late: set[int] = set()
        final: set[int] = set()
        made: set[int] = set()  # id(value) the second pass computes
        for n in steps:
            after = any(id(self.owner(v)) in late for v in n.inputs)
            if id(n) in self.row_reduces and not after:
                continue  # each row within its tile: complete in the tile, nothing accumulated
            if after and n.op in REDUCE_OPS and id(n) not in self.late_reduces:
                if second and any(id(self.owner(v)) in made for v in n.inputs):
                    raise NeedsPhases(f"{n.op} {n.name} reduces the second pass's values (that "
                                      "needs a third pass)", node=n, about=(n,))
                raise Unsupported(f"{n.op} of a reduction accumulated across tiles", node=n)
            if after:
                out = self.owner(n.outputs[0])
                if kind.get(id(out)) not in allowed:
                    if second is None:
                        raise NeedsPhases(f"{n.op} {n.name} uses a reduction's result across "
                                          "the elements it reduces (that needs a second pass)",
                                          node=n, about=(n,))
                    second.add(id(n))
                    made.add(id(out))
                else:
                    final.add(id(n))
            if n.op in REDUCE_OPS or after:
                late.add(id(self.owner(n.outputs[0])))
        return final

    def _check_second(self, steps: list[Node], kind: dict[int, str], ins: list[KernelIO],
                      outs: list[KernelIO], final: set[int], second: set[int]) -> None:
        """The second pass over a column tile's rows reads only what it can have again: the
        kernel inputs, reloaded tile by tile (the plain loads: a tile or rows of it in the
        compute type or cast on loading, a broadcast row, a scalar), rows the kernel holds for
        the whole column tile (the reductions and the final steps' rows), constants and its
        own values; it stores plain tiles. A tile computed in the first pass is gone by then,
        a value per row belongs to one tile, and a scalar of the final steps is the scalar
        unit's, left in ``Finish``: any of these, or another form, splits the kernel into
        phase kernels as before."""
        first = next(n for n in steps if id(n) in second)

        def refuse(why: str):
            raise NeedsPhases(f"{first.op} {first.name} uses a reduction's result across the "
                              f"elements it reduces (a second pass over the rows: {why})",
                              node=first, about=(first,))

        if self.row_reduces or self.cols or self.concats or self.gathers or self.lookups or \
                self.transposed or self.gathered_in or self.parts or self.bstores:
            refuse("a kernel of another form (scans, column slices, concats, lookups, "
                   "transposes, split parts or broadcast stores)")
        inputs = {id(self.owner(io.local if io.local is not None else io.value)): io
                  for io in ins}
        produced = {id(self.owner(n.outputs[0])): n for n in steps}
        for n in steps:
            if id(n) not in second:
                continue
            if n.op in REDUCE_OPS or n.op in SCAN_OPS or n.op == "BroadcastTo":
                refuse(f"{n.op} in it")
            for v in n.inputs:
                o = self.owner(v)
                if id(o) in self.scalars:
                    continue
                io = inputs.get(id(o)) or next((i for i in ins if i.value is o), None)
                if io is not None:
                    if io.kind in (FULL, PARTIAL) and (io.table or io.transpose is not None or
                                                       io.dtype not in FLOATS):
                        refuse(f"input {io.value.name} is not a plain load")
                    if io.kind == COL:
                        refuse(f"input {io.value.name} is a value per row")
                    continue
                p = produced.get(id(o))
                if p is None or id(p) in second:
                    continue
                if kind.get(id(o)) != ROW:
                    refuse(f"it reads {v.name}, a {kind.get(id(o))} value of the "
                           f"{'final steps' if id(p) in final else 'first pass'}")
        for io in outs:
            o = self.owner(io.value)
            p = produced.get(id(o))
            if p is not None and id(p) in second and (
                    io.kind != FULL or io.copies or io.pieces or io.part or io.outer or
                    io.transpose is not None):
                refuse(f"output {io.value.name} is not a plain tile")

    def _column_view(self, n: Node) -> bool:
        """A slice of the last axis is a view at a column offset of its source's tile (rather
        than a strided load) when its source is computed in the kernel, is itself such a
        view, or is a kernel input read through more than this one view."""
        if views.column_slice(n) is None:
            return False
        v = n.inputs[0]
        while True:
            if id(v) in self.cols or len(v.uses) != 1:
                return True
            if v.producer is None or v.producer.op == "Constant":
                return False  # a kernel input read only through this slice: a strided load
            if id(v) not in self.root:  # (views and free casts share their source's tile)
                return True
            v = v.producer.inputs[0]

    def _colslice(self, n: Node) -> None:
        src, out = n.inputs[0], n.outputs[0]
        off, width = views.column_slice(n)
        base, row = 0, src.shape[-1]
        if id(src) in self.cols:  # a slice of a slice: offsets add up
            base, _, row = self.cols[id(src)]
        self.root[id(out)] = self.owner(src)
        self.cols[id(out)] = (base + off, width, row)
        self.colslices.append(n)

    def _column_alias(self, n: Node) -> None:
        """A view of a column value keeps its columns when it keeps the last axis."""
        x, out = n.inputs[0], n.outputs[0]
        if id(x) not in self.cols:
            return
        if not out.shape or not eq(out.shape[-1], x.shape[-1]):
            raise Unsupported(f"{n.op} of a slice of the last axis that regroups that axis",
                              node=n)
        self.cols[id(out)] = self.cols[id(x)]

    def _no_columns(self, n: Node) -> None:
        x = next((x for x in n.inputs if id(x) in self.cols), None)
        if x is not None:
            raise Unsupported(f"{n.op} reads {x.name}, a slice of the last axis (read by "
                              "elementwise ops and Concats along that axis only)", node=n,
                              about=(x,))

    def _column_step(self, n: Node) -> None:
        """An elementwise op on column values (with scalars) gives a column value at the same
        columns, computed over whole tiles (the other columns of its tile are not used)."""
        got = {self.cols[id(x)] for x in n.inputs if id(x) in self.cols}
        if not got:
            return
        rule = INSTRUCTIONS.get(n.op)
        if rule is None or rule.form not in SINKABLE_FORMS or len(n.outputs) != 1:
            self._no_columns(n)
        others = [x for x in n.inputs if id(x) not in self.cols
                  and not eq(x.type.numel, 1)]
        if len(got) > 1:
            raise Unsupported(f"{n.op} reads columns of rows at different offsets", node=n)
        col = got.pop()
        for x in others:  # a kernel input of the slice's width: loaded to those columns
            o = self.owner(x)
            if not any(o is v for v in self.sub.inputs) or self.loaded[id(o)] is not o or \
                    not eq(x.shape[-1], col[1]) or self.colinputs.get(id(o), col) != col:
                raise Unsupported(f"{n.op} reads a slice of the last axis with {x.name}, which "
                                  "is not a kernel input of the slice's width", node=n, about=(x,))
            self.colinputs[id(o)] = col
        self.cols[id(n.outputs[0])] = col

    def _colcat(self, n: Node) -> bool:
        """A Concat along the last axis of column values of one row: each piece is copied to
        its columns of one tile (rotary embedding's ``cat(-x2, x1)``). The result is a full
        value when it spans the row, else a column value at column 0."""
        out = n.outputs[0]
        if not any(id(x) in self.cols for x in n.inputs):
            return False
        if n.attrs["axis"] % len(out.shape) != len(out.shape) - 1:
            self._no_columns(n)
        rows = {symbolic.canon(self.cols[id(x)][2]) for x in n.inputs if id(x) in self.cols}
        if any(id(x) not in self.cols for x in n.inputs) or len(rows) != 1:
            raise Unsupported("Concat of a slice of the last axis with a value that is not one "
                              "(the pieces must be columns of rows of one length)", node=n)
        row = self.cols[id(n.inputs[0])][2]
        if not out.dtype.is_float:
            raise Unsupported(f"Concat of {out.dtype} data", node=n)
        if not eq(out.shape[-1], row):  # at the columns its pieces span (rotate-half of the
            # rotary features past a head's others), else at column 0
            spans = sorted((self.cols[id(x)][0], self.cols[id(x)][1]) for x in n.inputs)
            at = spans[0][0] if all(isinstance(w, int) for _, w in spans) and all(
                a + w == b for (a, w), (b, _) in zip(spans, spans[1:])) else 0
            self.cols[id(out)] = (at, out.shape[-1], row)
        self.colcats.append(n)
        return True

    def _slice(self, n: Node) -> None:
        self._no_columns(n)
        if n.op == "Transpose":  # placed where it is stored, or loaded strided (_place_stores)
            self.shown[id(n.outputs[0])] = n
            return
        self._strided(n)

    def _strided(self, n: Node) -> None:
        """A slice or transpose of a kernel input read by a step: a strided load."""
        src = self.owner(n.inputs[0])
        if id(src) in self.shown:
            raise Unsupported(f"{n.op} of a Transpose of a computed value", node=n)
        if not any(src is v for v in self.sub.inputs):
            raise Unsupported(f"{n.op} of a computed value (slices and transposes are generated "
                              "as strided loads of kernel inputs)", node=n)
        if self.loaded[id(src)] is not src or len(src.uses) != 1:
            raise Unsupported(f"{n.op}: input {src.name} is read through more than one view",
                              node=n, about=(src,))
        v = n.inputs[0]  # a reshape of a contiguous input is contiguous in its new shape
        while v is not src:
            if len(v.uses) != 1:
                raise Unsupported(f"{n.op}: input {src.name} is read through more than one "
                                  "view", node=n, about=(src,))
            v = v.producer.inputs[0]
        out = n.outputs[0]
        if n.op == "Transpose":
            strides = View.contiguous(tuple(n.inputs[0].shape)).strides
            strides = tuple(strides[p] for p in n.attrs["perm"])
            shape = tuple(out.shape)
            real = [k for k in range(len(shape)) if not eq(shape[k], 1)]
            if real and (not eq(strides[real[-1]], 1) or reshaped_read(out)):
                # rows cross, or are read merged (a window merge): gathered in UB
                why = gather_transpose_refusal(shape, strides, out.dtype)
                if why:
                    raise Unsupported("Transpose of a kernel input that moves its last axis: "
                                      f"{why}", node=n)
                self.gathered_in[id(src)] = (tuple(int(d) for d in shape),
                                             tuple(int(d) for d in strides))
                self.views[id(out)] = View.contiguous(shape)
            else:
                self.views[id(out)] = View(0, strides)
        else:
            self.views[id(out)] = slice_view(n)
        self.loaded[id(src)] = out
        del self.views[id(src)]

    def _gather(self, n: Node) -> bool:
        """A Concat of kernel inputs (each read only by it) of different shapes, or used inside
        the kernel: its tile is loaded piece by piece, each row from its operand's buffer."""
        srcs = [self.owner(x) for x in n.inputs]
        sliced = [self._sliced_operand(n, x, o) for x, o in zip(n.inputs, srcs, strict=True)]
        srcs = [o if c is None else c[0] for o, c in zip(srcs, sliced, strict=True)]
        if not all(c is not None or (any(o is v for v in self.sub.inputs)
                                     and self.loaded[id(o)] is o and _single_use_chain(x, o))
                   for x, o, c in zip(n.inputs, srcs, sliced, strict=True)):
            return False
        if len({id(o) for o in srcs}) != len(srcs) or not n.outputs[0].dtype.is_float or len(
                {o.dtype for o in srcs}) != 1:
            return False
        out = n.outputs[0]
        same = all(tuple(x.shape) == tuple(n.inputs[0].shape) for x in n.inputs)
        if same and not out.users:
            return False  # stored operand by operand (no tile of the whole Concat needed)
        for o, c in zip(srcs, sliced, strict=True):
            del self.views[id(self.loaded[id(o)])]
            self.loaded[id(o)] = out
            if c is not None:
                self.gather_at[id(o)] = c[1]
        for x, o in zip(n.inputs, srcs, strict=True):
            self.gather_src[id(x)] = o
        self.views[id(out)] = View.contiguous(tuple(out.shape))
        self.gathers.append(n)
        return True

    def _sliced_operand(self, n: Node, x: Value, o: Value
                        ) -> tuple[Value, tuple[Dim, Dim]] | None:
        """(input, (element offset, elements per block of the Concat's axis and those after
        it in the input's buffer)) for an operand of Concat ``n`` that is a slice of a kernel
        input along the Concat's axis only (step 1), read by nothing else: its rows lie in
        the input's buffer as a run per block, at the slice's start (the first step of a
        scan's halves joined back: ``cat(x[:1], y)``); None for anything else."""
        if x is not o or o.producer is None or o.producer.op not in ("Slice", "StridedSlice") \
                or len(o.uses) != 1 or id(o) not in self.views:
            return None
        src = next((v for v in self.sub.inputs if self.loaded[id(v)] is o), None)
        if src is None:
            return None
        a = n.attrs["axis"] % len(o.shape)
        view = self.views[id(o)]
        full = View.contiguous(tuple(src.shape))
        if len(src.shape) != len(o.shape) or not all(
                eq(st, fs) for st, fs in zip(view.strides, full.strides, strict=True)) or \
                not all(eq(d, e) for k, (d, e) in enumerate(zip(o.shape, src.shape, strict=True))
                        if k != a):
            return None
        return src, (view.base, symbolic.numel(tuple(src.shape)[a:]))

    def _gather_rows(self) -> set | None:
        """Row lengths under which every row of a loaded Concat comes from one operand."""
        out = None
        for n in self.gathers:
            shape = tuple(n.outputs[0].shape)
            a = n.attrs["axis"] % len(shape)
            ok = {symbolic.canon(symbolic.numel(shape[k:])) for k in range(a + 1, len(shape) + 1)}
            out = ok if out is None else out & ok
        return out

    def _gather_io(self, ins: list[KernelIO], L: Dim) -> None:
        """The first operand's input loads the Concat's tile; the others are its pieces."""
        index = {id(io.value): io for io in ins}
        for n in self.gathers:
            shape = tuple(n.outputs[0].shape)
            a = n.attrs["axis"] % len(shape)
            k = _trailing_split(shape, L)
            if k is None or k <= a:
                raise Unsupported(f"Concat along axis {a}: rows of {L} cross its operands",
                                  node=n)
            rows, at = [], []
            srcs = [self._gather_src(x) for x in n.inputs]
            for x, o in zip(n.inputs, srcs, strict=True):
                r = symbolic.div(symbolic.numel(tuple(x.shape)[a:]), L)
                if r is None:
                    raise Unsupported(f"Concat: rows of {L} do not divide an operand", node=n)
                rows.append((index[id(o)].index, r))
                got = self.gather_at.get(id(o))
                if got is not None:
                    pitch = symbolic.div(got[1], L)
                    if pitch is None:
                        raise Unsupported(f"Concat: rows of {L} do not divide the input an "
                                          "operand is sliced from", node=n)
                    got = (got[0], pitch)
                at.append(got)
            first = index[id(srcs[0])]
            if first.kind != FULL:  # its rows are read by row index of the loop space
                raise Unsupported(f"Concat loaded as a tile is a broadcast ({first.kind}) "
                                  "value of the loop space", node=n)
            first.gather, first.block_rows = tuple(rows), symbolic.div(
                symbolic.numel(shape[a:]), L)
            if any(g is not None for g in at):
                first.gather_at = tuple(at)
            for o in srcs[1:]:
                index[id(o)].kind = PIECE

    def _gather_src(self, x: Value) -> Value:
        """The kernel input a loaded Concat's operand ``x`` is read from."""
        return self.gather_src.get(id(x)) or self.owner(x)

    def _split(self, n: Node) -> None:
        """A Split of a computed value along an axis before the last whose parts only leave
        the kernel: each part shares the value's tile and is stored by rows (a fused QKV
        projection's rotated Q, K and V written where the attention operator reads them)."""
        src = self.owner(n.inputs[0])
        a = n.attrs["axis"] % len(n.inputs[0].shape)
        if any(src is v for v in self.sub.inputs) or a == len(n.inputs[0].shape) - 1:
            raise Unsupported("Split of a kernel input or of the last axis (parts are stored "
                              "by rows of a computed value)", node=n)
        outs = {id(v) for v in self.sub.outputs}
        for k, o in enumerate(n.outputs):
            if o.users or id(o) not in outs:
                raise Unsupported("a part of a Split read inside its kernel (the parts are "
                                  "only stored)", node=n)
            self.root[id(o)] = src
            self.parts[id(o)] = (n, k)

    def _part_rows(self) -> set | None:
        """Row lengths under which every row of a split value lies in one part."""
        out = None
        for n, _ in self.parts.values():
            shape = tuple(n.inputs[0].shape)
            a = n.attrs["axis"] % len(shape)
            ok = {symbolic.canon(symbolic.numel(shape[k:])) for k in range(a + 1, len(shape))}
            out = ok if out is None else out & ok
        return out

    def _part_io(self, outs: list[KernelIO], L: Dim) -> None:
        for io in outs:
            if id(io.value) not in self.parts:
                continue
            n, k = self.parts[id(io.value)]
            shape = tuple(n.inputs[0].shape)
            a = n.attrs["axis"] % len(shape)
            inner = symbolic.div(symbolic.numel(shape[a + 1:]), L)
            if inner is None or self.col_reduce or self.row_chunks or self.batch != 1:
                raise Unsupported(f"Split along axis {a}: rows of {L} cross its parts", node=n)
            first = sum(n.attrs["sizes"][:k])
            io.part = (symbolic.mul(shape[a], inner), symbolic.mul(first, inner),
                       symbolic.mul(n.attrs["sizes"][k], inner))

    def _lookup(self, n: Node) -> None:
        """A Gather of whole rows of a table input: the table is loaded as the Gather's
        value, row by row at the rows its index input names."""
        table, out = self.owner(n.inputs[0]), n.outputs[0]
        self.loaded[id(table)] = out
        del self.views[id(table)]
        self.views[id(out)] = View.contiguous(tuple(out.shape))

    def _lookup_io(self, ins: list[KernelIO], L: Dim) -> None:
        """The table's input loads the lookup's tile: a row of the loop space is a row of
        the table (rows of L = the table's row length), taken by the scalar unit's read of
        its index."""
        index = {id(io.value): io for io in ins}
        for n in self.lookups:
            table = index[id(self.owner(n.inputs[0]))]
            row = n.inputs[0].shape[-1]
            if self.col_reduce or self.row_chunks or not eq(L, row):
                raise Unsupported(f"Gather of table rows of {row} in a kernel whose rows are "
                                  f"{L} long{' reduced over the rows' if self.col_reduce else ''}"
                                  " (each row of a tile is one row of the table)", node=n)
            if table.kind != FULL:
                raise Unsupported(f"Gather of table rows read as a {table.kind} value",
                                  node=n)
            table.lookup = index[id(follow_views(n.inputs[1]))].index
            table.lookup_rows = n.inputs[0].shape[0]

    def _place_stores(self, steps: list[Node]) -> None:
        """Transposes of computed values that only reach kernel outputs: each such output is
        stored through the map of the view chain (the rows of the computed value go straight
        to their places in the output), and the transpose shares the computed value's tile."""
        if not self.shown:
            return
        for n in [*steps, *self.concats, *self.colslices]:
            for x in n.inputs:
                t = self.shown.get(id(self.owner(x)))
                if t is None:
                    continue
                if any(self.owner(t.inputs[0]) is v for v in self.sub.inputs):
                    del self.shown[id(t.outputs[0])]
                    self._strided(t)  # a transpose of an input read by a step
                    continue
                raise Unsupported(f"Transpose of a computed value read by {n.op} (a view "
                                  "of a computed value is generated where it is stored: "
                                  "a kernel output)", node=t)
        for v in self.sub.outputs:
            if id(self.owner(v)) in self.shown:
                self.store_maps[id(v)] = self._store_map(v)
        for vid, t in self.shown.items():
            self.root[vid] = self.owner(t.inputs[0])

    def _stored_broadcast(self, n: Node) -> bool:
        """A BroadcastTo over new outer axes whose result only reaches kernel outputs through
        views: stored once per copy from the tile of its source (a few copies: at most 8)."""
        if not self.stored_broadcasts:
            return False
        src, out = n.inputs[0], n.outputs[0]
        shape, pad = tuple(out.shape), len(out.shape) - len(src.shape)
        sshape = (1,) * pad + tuple(src.shape)
        new = [k for k in range(len(shape)) if eq(sshape[k], 1) and not eq(shape[k], 1)]
        if not new or any(not isinstance(shape[k], int) for k in new) or int(
                np.prod([shape[k] for k in new])) > 8 or new[-1] == len(shape) - 1:
            return False
        v, outs = out, {id(o) for o in self.sub.outputs}
        while len(v.uses) == 1 and v.uses[0][0].op in STORE_VIEWS:
            v = v.uses[0][0].outputs[0]
        return not v.uses and id(v) in outs

    def _place_broadcast_stores(self) -> None:
        for v in self.sub.outputs:
            x = v
            while x.producer is not None and id(x) not in self.bstores and (
                    x.producer.op in STORE_VIEWS):
                x = x.producer.inputs[0]
            if id(x) in self.bstores:
                self.store_maps[id(v)] = self._store_map(v)

    def _copied_values(self) -> set[int]:
        """The values a stored broadcast shows (larger than the loop space)."""
        out: set[int] = set()
        for vid, n in self.bstores.items():
            v = n.outputs[0]
            out.add(vid)
            while len(v.uses) == 1 and v.uses[0][0].op in STORE_VIEWS:
                v = v.uses[0][0].outputs[0]
                out.add(id(v))
        return out

    def _store_map(self, v: Value) -> tuple[tuple[Dim, ...], tuple[Dim, ...]]:
        """(shape, strides): the map of output ``v`` over a contiguous reshape of the computed
        value it shows (walked back through the views while the map stays affine). A stored
        broadcast on the way adds copies (``self.copies``)."""
        def is_view(n: Node) -> bool:
            return id(n.outputs[0]) in self.root or id(n.outputs[0]) in self.shown

        cur, strides = v, views.contiguous(tuple(v.shape))
        copies: list[tuple[int, int]] = []
        while cur.producer is not None and is_view(cur.producer):
            if id(cur) in self.bstores:  # new axes: copies; the source's axes keep strides
                src = cur.producer.inputs[0]
                pad = len(cur.shape) - len(src.shape)
                sshape = (1,) * pad + tuple(src.shape)
                new = [k for k in range(len(cur.shape))
                       if eq(sshape[k], 1) and not eq(cur.shape[k], 1)]
                if any(not isinstance(strides[k], int) for k in new):
                    raise Unsupported(f"output {v.name}: a broadcast copy at a symbolic offset",
                                      node=cur.producer, about=(v,))
                copies += [(int(cur.shape[k]), int(strides[k])) for k in new]
                strides = tuple(0 if k in new else strides[k] for k in range(pad, len(sshape)))
                cur = src
                continue
            got = views.step_back(cur.producer, strides)
            if got is None:
                break
            strides, cur = got, cur.producer.inputs[0]
        if copies:
            self.copies[id(v)] = tuple(copies)
        x = cur  # below the map: reshapes of the computed value only (it stays contiguous)
        while x.producer is not None and is_view(x.producer):
            if id(x) in self.bstores:
                raise Unsupported(f"output {v.name}: a broadcast whose copies have no affine "
                                  "map (a reshape merges a copied axis)", node=x.producer,
                                  about=(v,))
            if x.producer.op == "Transpose":
                raise Unsupported(f"output {v.name}: its chain of views of a computed value "
                                  "has no affine map (a reshape merges transposed axes)",
                                  node=x.producer, about=(v,))
            x = x.producer.inputs[0]
        shape = tuple(cur.shape)
        if shape and not eq(shape[-1], 1) and not eq(strides[-1], 1):
            t = next(iter(self.shown.values()), None)
            why = gather_transpose_refusal(shape, strides, v.dtype)
            if why:
                raise Unsupported("Transpose of a computed value that moves its last axis: "
                                  f"{why}", node=t)
            self.transposed.add(id(v))
        return shape, strides

    def _store_rows(self) -> set | None:
        """Row lengths under which every output stored through a map keeps its rows
        contiguous in GM (None: no such output). An output transposed in UB is stored
        whole from one tile: any row length serves it."""
        out = None
        for vid, (shape, strides) in self.store_maps.items():
            if vid in self.transposed:
                continue
            ok = {symbolic.canon(symbolic.numel(shape[k:])) for k in range(len(shape) + 1)
                  if classify(shape, shape, symbolic.numel(shape[k:]), View(0, strides))}
            out = ok if out is None else out & ok
        return out

    def _compute_type(self) -> DType:
        """fp16 when the body states fp16 for every float value (promote_precision did not
        widen it: opt_level 1, or enable_low_precision), else fp32. Rewritten composites and
        integer words keep fp32 (their forms and buffers assume 4-byte elements)."""
        dts = {v.dtype for v in self._all_values() if id(follow_views(v)) not in self.indices}
        floats = {d for d in dts if d.is_float}
        if floats == {DType.float16} and BITS not in dts and not self.origin:
            return DType.float16
        return DType.float32

    def _check_bits(self) -> None:
        """int32 values flow only between kernel inputs, constants, views, bitwise ops and
        kernel outputs (they are raw words in UB: no arithmetic, no broadcast)."""
        for n in self.sub.nodes:
            if any(n is g for g in self.lookups) or (n.op in VIEW_OPS and id(
                    follow_views(n.inputs[0])) in self.indices):
                continue  # an index read by the scalar unit
            ints = [v for v in (*n.inputs, *n.outputs) if v.dtype == BITS]
            rule = INSTRUCTIONS.get(n.op)
            if ints and n.op not in VIEW_OPS and n.op != "Constant" and (
                    rule is None or BITS not in rule.dtypes) and not self._truncating_store(n) \
                    and not self._widening_load(n):
                raise Unsupported(f"{n.op} of int32 data (integers are generated in "
                                  "BitwiseAnd/BitwiseOr only)", node=n)
            if n.op in BITWISE_OPS and n.outputs[0].dtype not in rule.dtypes:
                raise Unsupported(f"{n.op} of {n.outputs[0].dtype} data", node=n)

    def _all_values(self):
        yield from self.sub.inputs
        for n in self.sub.nodes:
            yield from n.outputs

    def _truncating_store(self, n: Node) -> bool:
        """A Cast of a float value to int32 (or of float32 to int64) whose result only leaves
        the kernel: the store converts it (a Cast toward zero, as torch's float -> int),
        so integer indices computed in floats (position ids from a running count) are
        written by the kernel that computes them."""
        out = n.outputs[0]
        return (n.op == "Cast" and n.inputs[0].dtype in FLOATS
                and (out.dtype == BITS or (out.dtype == DType.int64
                                           and n.inputs[0].dtype == DType.float32))
                and not out.users and any(o is out for o in self.sub.outputs))

    def _widening_load(self, n: Node) -> bool:
        """A Cast to float32 of an int32 or int64 kernel input that nothing else in the kernel
        reads: the load converts it (an index an ArgMax returned, the positions a KV-cache
        step's rotary angles are computed from). Likewise a Cast to a float type of a bool
        kernel input read only through such Casts (dropout's saved mask in the backward,
        ``grad * mask.to(float) * scale``): a bool input is loaded as 0/1 in the compute type
        (``_widen``), exact in every float type, so the Cast is that loaded value."""
        x = n.inputs[0]
        if n.op != "Cast" or not any(x is v for v in self.sub.inputs):
            return False
        if x.dtype == DType.bool:
            return all(u.op == "Cast" and u.outputs[0].dtype in FLOATS for u in x.users)
        return x.dtype in (BITS, DType.int64) and read_as_floats(x)

    def _cast_is_view(self, n: Node) -> bool:
        """A float cast is free inside a kernel (everything is fp32 in UB) when it widens, or
        when its result only leaves the kernel (the store rounds it, or truncates it to
        int32)."""
        src, dst = n.inputs[0].dtype, n.outputs[0].dtype
        if self._truncating_store(n) or self._widening_load(n):
            return True
        if src not in FLOATS or dst not in FLOATS:
            raise Unsupported(f"Cast {src} -> {dst} (integer casts are not generated)")
        if dst == DType.float32 or src == dst:
            return True
        out = n.outputs[0]
        return not out.users and any(o is out for o in self.sub.outputs)

    def _classify(self, v: Value, S, L):
        o = self.owner(v)
        view = self.views.get(id(o))
        if view is not None and not view.is_contiguous(tuple(o.shape)):
            if tuple(v.shape) != tuple(o.shape):
                view = unit_axes_view(view, tuple(o.shape), tuple(v.shape))
                if view is None:
                    return None  # a reshape of a strided slice: not one view any more
            return classify(tuple(v.shape), tuple(S), L, view)
        return classify(tuple(v.shape), tuple(S), L)

    def _concat_io(self, i: int, v: Value, n: Node, kind: dict[int, str], N: Dim, L: Dim
                   ) -> KernelIO:
        """A kernel output that is a Concat of full-size values of one shape: operand k goes to
        the k-th block of each of its leading rows (``pre`` rows of ``blk`` elements)."""
        if not v.dtype.is_float:
            raise Unsupported(f"Concat of {v.dtype} data", node=n)
        out = n.outputs[0]
        if v.users or sum(self.owner(o) is out for o in self.sub.outputs) != 1 or (
                v is not out and len(out.users) != 1):
            raise Unsupported("a Concat used inside its kernel", node=n)
        shape = tuple(n.inputs[0].shape)
        if any(tuple(x.shape) != shape or kind.get(id(self.owner(x))) not in (FULL, PARTIAL)
               or not eq(x.type.numel, N) for x in n.inputs):
            raise Unsupported("Concat of values that are not full tiles of one shape", node=n)
        a = n.attrs["axis"] % len(shape)
        pre, blk = symbolic.numel(shape[:a]), symbolic.numel(shape[a:])
        if eq(pre, 1):
            pitch = L  # one block per operand: its rows are consecutive
        elif eq(L, blk):
            pitch = symbolic.mul(blk, len(n.inputs))
        else:
            raise Unsupported(f"Concat along axis {a}: rows of {L} are not its blocks of {blk}",
                              node=n)
        pieces = tuple((x, symbolic.mul(blk, k), pitch) for k, x in enumerate(n.inputs))
        return KernelIO(i, v, FULL, v.dtype, tuple(v.shape), pieces=pieces)

    def _keep_map(self, o: Value, c: tuple) -> None:
        """Record where the rows of ``o`` (placed as ``c``, ``classify``'s answer) sit in its
        input: a PARTIAL map, or the offset of a ROW or COL block read at a slice's start."""
        if c[0] == PARTIAL or not eq(c[3], 0):
            self.partial[id(o)] = (c[1], c[2], c[3])

    def _compact_input(self, v: Value, N: Dim, L: Dim) -> str | None:
        """The layout (ROW, COL or SCALAR) of a kernel input that only compact steps use,
        found against a full-size value of the kernel it broadcasts to; None if none."""
        if not any(self.loaded[id(i)] is self.owner(v) for i in self.sub.inputs):
            return None
        for f in self._all_values():
            full = tuple(f.shape)
            if not eq(f.type.numel, N) or len(full) < len(v.shape) or not all(
                    d == 1 or eq(d, e) for d, e in zip(reversed(v.shape), reversed(full))):
                continue
            c = self._classify(v, full, L)
            if c is None or c[0] not in (ROW, COL, SCALAR):
                return None
            self._keep_map(self.owner(v), c)
            return c[0]
        return None

    def _row_input(self, n: Node, v: Value, N: Dim, L: Dim) -> str | None:
        """COL for a contiguous kernel input of one value per row of the loop space that
        elementwise step ``n`` reads at its own shape, in a kernel reducing each row of a
        scan's tile (the work on the readout, one value per row); else None. The reduced
        values are one per row in the rows' order, and elementwise work on operands of one
        shape (and views of it) keeps every value in that order: element i is row i's."""
        view = self.views.get(id(self.owner(v)))
        out = n.outputs[0].shape
        # (a block of the input at an offset, one head's values of a [heads, ...] input, is
        # read as it would be at offset 0, from its first element on)
        if not self.row_reduces or view is None or not View(0, view.strides).is_contiguous(
                tuple(self.owner(v).shape)) or not eq(v.type.numel, symbolic.div(N, L)) or \
                not any(self.loaded[id(i)] is self.owner(v) for i in self.sub.inputs) or \
                not elementwise(n) or len(out) != len(v.shape) or \
                not all(eq(a, b) for a, b in zip(out, v.shape)):
            return None
        self._keep_map(self.owner(v), (COL, (), (), view.base))
        return COL

    def kind_of(self, kind: dict[int, str], v: Value) -> str | None:
        return kind.get(id(self.owner(v)))

    def _needs_rows(self, v: Value, N: Dim) -> bool:
        """Whether a use of v constrains the row split (it is not a plain full tile)."""
        if id(v) in self.scalars or eq(v.type.numel, 1):
            return False
        view = self.views.get(id(self.owner(v)))
        return not eq(v.type.numel, N) or (view is not None and not view.is_contiguous(
            tuple(self.owner(v).shape)))

    def _row_length(self, steps: list[Node], reduces: list[Node], N: Dim) -> Dim:
        # a scan runs down the rows, as a reduction over them: its axis is the rows of
        # blocks [B, R, L] (L = 1 when it scans the last axis)
        scans = [n for n in steps if n.op in SCAN_OPS]
        # with a scan: reductions of each row (the trailing axes) are the scan's readout,
        # taken within the tile once the tile holds whole rows (checked below)
        along = [n for n in reduces if self._along_row(n)] if scans else []
        if reduces or scans:
            L, kinds, batches = None, set(), []
            for n in [n for n in reduces if n not in along] + scans:
                shape = n.inputs[0].shape
                axes = n.attrs.get("axis")
                axes = list(range(len(shape))) if axes is None or axes == [] else \
                    [axes % len(shape)] if n.op in SCAN_OPS else \
                    sorted(a % len(shape) for a in axes)
                if not eq(n.inputs[0].type.numel, N):
                    raise Unsupported(f"{n.op} of a value smaller than the kernel's loop space",
                                      node=n)
                if n.op not in SCAN_OPS and \
                        axes == list(range(len(shape) - len(axes), len(shape))):
                    r, k = symbolic.numel(shape[len(shape) - len(axes):]), "row"
                elif axes == list(range(axes[0], axes[-1] + 1)):  # leading or middle: [B, R, L]
                    r, k = symbolic.numel(shape[axes[-1] + 1:]), "column"
                    b = symbolic.numel(shape[:axes[0]])
                    if batches and not eq(batches[0], b):
                        raise Unsupported("reductions over different blocks of rows", node=n)
                    batches.append(b)
                    self.batch = b
                else:  # several runs: the last one first, the others in a later phase
                    raise NeedsPhases(f"{n.op} over axes {axes} of a rank-{len(shape)} tensor "
                                      "(one run of adjacent axes per pass)", node=n)
                if (L is not None and not eq(L, r)) or (kinds and k not in kinds):
                    raise SplitBefore(f"reductions of different shapes ({L} and {r} per "
                                      "row)", node=n)
                L = r
                kinds.add(k)
            if scans and kinds != {"column"}:
                raise Unsupported("a Scan and a reduction along the rows in one kernel",
                                  node=scans[0])
            self._row_reduces(along, scans, reduces, L, N)
            self.col_reduce = kinds == {"column"}
            self._check_uses(steps, N, L)
            return L
        candidates = None
        culprit = None  # a slice whose view alone no row split reads (split off on refusal)
        for n in steps:
            S = n.outputs[0].shape
            if not eq(n.outputs[0].type.numel, N):
                continue
            for v in n.inputs:
                if id(v) in self.cols or not self._needs_rows(v, N):
                    continue
                ok = {symbolic.canon(symbolic.numel(S[k:])) for k in range(len(S) + 1)
                      if self._classify(v, S, symbolic.numel(S[k:]))}
                p = self.owner(v).producer
                if culprit is None and p is not None and p.op in SLICE_VIEW_OPS and \
                        id(self.owner(v)) in self.views and (not ok or (
                            candidates is not None and not candidates & ok)):
                    culprit = p
                candidates = ok if candidates is None else candidates & ok
        stored = {id(n.outputs[0]) for n in self.concats}  # stored by blocks, not rows
        for v in self.sub.outputs:  # a strided view stored as it is (a transpose kernel)
            if id(self.owner(v)) not in stored and id(v) not in self.store_maps and \
                    id(v) not in self.parts and self._needs_rows(v, N):
                S = v.shape
                ok = {symbolic.canon(symbolic.numel(S[k:])) for k in range(len(S) + 1)
                      if self._classify(v, S, symbolic.numel(S[k:]))}
                candidates = ok if candidates is None else candidates & ok
        col_rows = {symbolic.canon(row) for _, _, row in self.cols.values()} or None
        lookup_rows = {symbolic.canon(n.outputs[0].shape[-1]) for n in self.lookups} or None
        for rows in (self._store_rows(), self._gather_rows(), col_rows, lookup_rows,
                     self._part_rows()):
            if rows is not None:  # rows contiguous in stored maps, rows of one Concat operand
                candidates = rows if candidates is None else candidates & rows
        for n in self.concats:  # rows of a Concat's blocks, unless there is one block
            shape = n.inputs[0].shape
            a = n.attrs["axis"] % len(shape)
            if not eq(symbolic.numel(shape[:a]), 1):
                blk = {symbolic.canon(symbolic.numel(shape[a:]))}
                candidates = blk if candidates is None else candidates & blk
        if candidates is None:
            return N
        if not candidates:
            # named: the kernel is split around the slice, which is then copied on its own
            # and the rest reads the copy whole (two launches, not one per op)
            raise Unsupported("no row split suits every broadcast and slice in the kernel",
                              node=culprit)
        return max(candidates, key=_size)

    def _late_reduces(self, steps: list[Node], N: Dim) -> list[Node]:
        """Reductions of values computed from another reduction's result, smaller than the
        loop space (a reduction of the reduced values; ``_check_late`` says whether the
        schedule takes them)."""
        after: set[int] = set()
        late = []
        for n in steps:
            if any(id(self.owner(v)) in after for v in n.inputs):
                if n.op in REDUCE_OPS and not eq(n.inputs[0].type.numel, N):
                    late.append(n)
                after.add(id(self.owner(n.outputs[0])))
            elif n.op in REDUCE_OPS:
                after.add(id(self.owner(n.outputs[0])))
        return late

    def _check_late(self, late: list[Node], L: Dim) -> None:
        """A reduction of reduced values is taken when the kernel reduces over the rows
        and it reduces, along the last axes, the reduced row of each block (a value of
        ``batch`` rows of L, exactly L elements per result): once every row of a column tile
        is accumulated, the final steps reduce the tile's row to one value (SCALAR); the
        column tile is then the whole row."""
        for n in late:
            shape = n.inputs[0].shape
            if not self.col_reduce or not self._along_row(n) or \
                    not eq(n.inputs[0].type.numel, symbolic.mul(self.batch, L)):
                raise Unsupported(f"{n.op} of a value smaller than the kernel's loop space",
                                  node=n)
            axes = sorted(a % len(shape) for a in n.attrs["axis"])
            if not eq(symbolic.numel(shape[axes[0]:]), L):
                raise Unsupported(f"{n.op} of a reduced row along other than its whole row "
                                  f"of {L}", node=n)
        self.late_reduces = frozenset(id(n) for n in late)

    @staticmethod
    def _along_row(n: Node) -> bool:
        """Whether reduction ``n`` reduces trailing axes of its operand (each row, for rows
        that long)."""
        shape, axes = n.inputs[0].shape, n.attrs.get("axis")
        if axes is None or axes == [] or not shape:
            return False
        axes = sorted(a % len(shape) for a in axes)
        return axes == list(range(len(shape) - len(axes), len(shape)))

    def _row_reduces(self, along: list[Node], scans: list[Node], reduces: list[Node], L: Dim,
                     N: Dim) -> None:
        """Reductions of each row in a kernel over the rows (a scan's): a row of the tile is
        one row of every value (the scanned axis runs down the rows), so reducing the
        trailing axes, exactly the row's L elements, needs only the tile's own rows when a
        column tile is the whole row. Each gives one value per row of the tile (a COL), stored
        by the tile as it goes; nothing is accumulated across tiles."""
        if not along:
            return
        others = [n for n in reduces if n not in along]
        for n in along:
            shape = n.inputs[0].shape
            axes = sorted(a % len(shape) for a in n.attrs["axis"])
            r = symbolic.numel(shape[axes[0]:])
            if not eq(n.inputs[0].type.numel, N):
                raise Unsupported(f"{n.op} of a value smaller than the kernel's loop space",
                                  node=n)
            if not eq(r, L):  # (the reduction apart, with the work after it)
                raise SplitBefore(f"{n.op} along rows of {r} in a scan's kernel whose rows are "
                                  f"{L} long (the reduced axes split across the tile's rows)",
                                  node=n)
            if others:
                raise Unsupported(f"{n.op} along the rows beside a reduction over them "
                                  "(each row's result would be accumulated over the rows)",
                                  node=n)
        self.row_reduces = frozenset(id(n) for n in along)

    def _check_uses(self, steps: list[Node], N: Dim, L: Dim) -> None:
        for n in steps:
            if (not eq(n.outputs[0].type.numel, N) and n.op not in REDUCE_OPS) or \
                    id(n) in self.late_reduces:  # (the reduced row: ``_check_late``)
                continue
            S = n.inputs[0].shape if n.op in REDUCE_OPS else n.outputs[0].shape
            for v in n.inputs:
                if id(v) in self.scalars or id(v) in self.cols:
                    continue  # (columns of rows: checked against L by the planner)
                if self._needs_rows(v, N) and self._classify(v, S, L) is None:
                    raise Unsupported(f"{n.op} reads {v.name} in a way that does not "
                                      f"follow rows of {L}", node=n, about=(v,))

    def _broadcast_edge(self, steps: list[Node], n: Node, N: Dim) -> Node | None:
        """The first step after ``n`` that reads what ``n`` computes (through views and the
        compact steps between) in a value of the full loop space: where compact work (values
        smaller than the loop space, such as one value per row) is spread over the loop
        space. A compact value the loop space cannot place is then computed in a kernel of
        its own loop space, split off before that step (``SplitBefore``: the steps it does
        not depend on). None when no step after ``n`` does so, or when those steps are not
        all elementwise work computing values of one size (full-size work among them, or a
        reduction: a loop space of their own would not hold them either)."""
        tainted = {id(self.owner(n.outputs[0]))}
        edge = None
        for m in steps[steps.index(n) + 1:]:
            if not any(id(self.owner(v)) in tainted for v in m.inputs):
                continue
            if eq(m.outputs[0].type.numel, N):
                edge = m
                break
            tainted.add(id(self.owner(m.outputs[0])))
        if edge is None:
            return None
        after = {id(self.owner(edge.outputs[0]))}
        first: list[Node] = []
        for m in steps[steps.index(edge) + 1:]:
            if any(id(self.owner(v)) in after for v in m.inputs):
                after.add(id(self.owner(m.outputs[0])))
        for m in steps:
            if m is not edge and id(self.owner(m.outputs[0])) not in after:
                first.append(m)
        sizes = {symbolic.canon(m.outputs[0].type.numel) for m in first
                 if not eq(m.outputs[0].type.numel, 1)}
        if len(sizes) != 1 or any(m.op in REDUCE_OPS for m in first):
            return None
        return edge

    def _layouts(self, steps: list[Node], N: Dim, L: Dim) -> dict[int, str]:
        kind: dict[int, str] = {}
        guessed: set[int] = set()  # rows/columns placed by shape alone, and what they compute
        views = self.views
        for vid, view in views.items():
            if vid in self.colinputs:
                continue  # placed by the steps on columns that read it
            v = next(x for x in self._all_values() if id(x) == vid)
            if eq(v.type.numel, N) and view.is_contiguous(tuple(v.shape)):
                kind[vid] = FULL
            elif eq(v.type.numel, 1):
                if not isinstance(view.base, int):  # (unreachable through a slice: one
                    #   element leaves no symbolic axis after the sliced one)
                    raise Unsupported(f"one element of {v.name} at a symbolic offset",
                                      about=(v,))
                kind[vid] = SCALAR
                self.partial[vid] = ((), (), view.base)  # one element, maybe sliced out
        for c in self.scalars:
            kind[c] = SCALAR
        for n in steps:
            out = n.outputs[0]
            if any(id(v) in self.cols for v in n.inputs):
                self._column_layouts(n, kind, N, L)
                continue
            S = n.inputs[0].shape if n.op in REDUCE_OPS else out.shape
            full_space = eq(symbolic.numel(S), N)
            for v in n.inputs:
                o = self.owner(v)
                if id(o) in kind:
                    if full_space and id(o) in guessed:
                        self._check_placed(n, v, kind[id(o)], S, L)
                    elif full_space and kind[id(o)] in (ROW, COL) and \
                            any(o is x for x in self.sub.inputs):
                        c = self._classify(v, S, L)  # (an outer difference: x[None] - x[:, None])
                        if c is not None and c[0] in (ROW, COL) and c[0] != kind[id(o)]:
                            raise Unsupported(f"input {o.name} is read both as a {kind[id(o)]} "
                                              f"and as a {c[0]} of the loop space (one load "
                                              "serves one of them)", node=n, about=(o,))
                    continue
                if not full_space:  # placed against a full-size value it broadcasts to
                    c = self._row_input(n, v, N, L) or self._compact_input(v, N, L)
                    if c is None:
                        why = f"cannot place {v.name} (used by {n.op} on a compact value) " \
                              "in the loop space"
                        edge = self._broadcast_edge(steps, n, N)
                        if edge is not None:
                            raise SplitBefore(f"{why}: the compact work ends where "
                                              f"{edge.op} spreads it over the loop space",
                                              node=edge, about=(v,))
                        if self.row_reduces:  # work on a scan's readout (a per-channel skip
                            # weight broadcast over the batch and the steps): the scan and its
                            # readout stay one kernel, this step and the work after it another
                            raise SplitBefore(f"{why}: the work on the readout from {n.op} on "
                                              "is a kernel of its own loop space", node=n,
                                              about=(v,))
                        raise Unsupported(why, node=n, about=(v,))
                    kind[id(o)] = c
                    if c in (ROW, COL):
                        guessed.add(id(o))
                    continue
                c = self._classify(v, S, L)
                if c is None:
                    raise Unsupported(f"{n.op} reads {v.name} in a way that does not "
                                      f"follow rows of {L}", node=n, about=(v,))
                kind[id(o)] = c[0]
                self._keep_map(o, c)
            srcs = [kind[id(self.owner(v))] for v in n.inputs]
            full_space = eq(out.type.numel, N)
            if id(n) in self.late_reduces:  # the reduced row of a block, to one value
                if srcs[0] != ROW:
                    raise Unsupported(f"{n.op} of a {srcs[0]} value", node=n)
                kind[id(out)] = SCALAR
            elif n.op in REDUCE_OPS:
                if srcs[0] not in (FULL, PARTIAL):
                    raise Unsupported(f"{n.op} of a {srcs[0]} value", node=n)
                kind[id(out)] = ROW if self.col_reduce and id(n) not in self.row_reduces \
                    else COL
            elif n.op == "BroadcastTo" and (srcs[0] in (FULL, PARTIAL) or not full_space):
                self.root[id(out)] = self.owner(n.inputs[0])
            elif n.op == "BroadcastTo":
                kind[id(out)] = FULL
            elif n.op in MASK_OPS:
                if not full_space:
                    raise Unsupported(f"{n.op} of values smaller than the loop space", node=n)
                kind[id(out)] = FULL
            else:
                kind[id(out)] = _join(srcs)
                if kind[id(out)] in (ROW, COL) and any(id(self.owner(v)) in guessed
                                                       for v in n.inputs):
                    guessed.add(id(out))
                if kind[id(out)] == FULL and not full_space:  # (a loaded broadcast's source)
                    raise Unsupported(f"{n.op} computes a value smaller than the loop space "
                                      "from a full-size one", node=n)
        for n in self.concats:  # operands read only to be stored (a slice of an input)
            for x in n.inputs:
                o = self.owner(x)
                if id(o) not in kind and eq(x.type.numel, N):
                    c = self._classify(x, tuple(x.shape), L)
                    if c is not None and c[0] in (FULL, PARTIAL):
                        kind[id(o)] = c[0]
                        self._keep_map(o, c)
        for v in self.sub.outputs:  # outputs that are loaded views, stored as they are
            o = self.owner(v)
            if id(o) not in kind and id(o) in self.views:
                c = self._classify(v, tuple(v.shape), L)
                if c is None:
                    raise Unsupported(f"output {v.name} does not follow rows of {L}", about=(v,))
                kind[id(o)] = c[0]
                self._keep_map(o, c)
        return kind

    def _column_layouts(self, n: Node, kind: dict[int, str], N: Dim, L: Dim) -> None:
        """A step on column values: their tiles are full tiles of the loop space (the source
        of a slice, loaded or computed); its result is one too (or a full value, for a
        Concat spanning the row)."""
        for v in n.inputs:
            o = self.owner(v)
            if id(o) in self.colinputs:  # rows of its own width, broadcast over outer axes
                self._column_input(n, v, o, kind)
                continue
            if id(o) in kind:
                continue
            c = self._classify(o, tuple(o.shape), L) if eq(o.type.numel, N) else None
            if c is None or c[0] not in (FULL, PARTIAL):
                raise Unsupported(f"cannot place {v.name} (a slice of the last axis of a value "
                                  "that is not a full tile) in the loop space", node=n, about=(v,))
            kind[id(o)] = c[0]
            self._keep_map(o, c)
        out = n.outputs[0]
        if id(out) not in self.cols and not eq(out.type.numel, N):
            raise Unsupported(f"{n.op} of slices of the last axis smaller than the loop space",
                              node=n)
        kind[id(out)] = FULL

    def _column_input(self, n: Node, v: Value, o: Value, kind: dict[int, str]) -> None:
        """A kernel input read with columns of rows: each row of the loop space loads the
        input's row it broadcasts to (a PARTIAL map over the outer axes), at the columns."""
        S = tuple(n.outputs[0].shape)
        vs = tuple(v.shape)
        # (the input is loaded as it is: a view of it here is a chain of reshapes, which a
        # contiguous input's memory follows in the view's shape -- BSND's [1, S, 1, r] table)
        if len(vs) > len(S) or not eq(v.type.numel, o.type.numel) or not eq(vs[-1], o.shape[-1]):
            raise Unsupported(f"{n.op} reads {v.name} through a view with a slice of the last "
                              "axis", node=n, about=(v,))
        vs = (1,) * (len(S) - len(vs)) + vs
        if any(not (eq(a, b) or eq(a, 1)) for a, b in zip(vs, S, strict=True)):
            raise Unsupported(f"{n.op}: {v.name} does not broadcast to a slice of the last "
                              "axis", node=n, about=(v,))
        strides = views.contiguous(vs)
        outer = tuple(0 if eq(a, 1) and not eq(b, 1) else st
                      for a, b, st in zip(vs[:-1], S[:-1], strides[:-1], strict=True))
        got = (S[:-1], outer, 0)
        if kind.get(id(o)) not in (None, PARTIAL) or self.partial.get(id(o), got) != got:
            raise Unsupported(f"{v.name} is read both as columns of rows and otherwise", node=n,
                              about=(v,))
        kind[id(o)] = PARTIAL
        self.partial[id(o)] = got

    def _check_placed(self, n: Node, v: Value, placed: str, S, L: Dim) -> None:
        """A row or column computed from kernel inputs placed by shape alone (against the
        first full-size value they broadcast to) is held in that layout; a use through a view
        that reads it the other way (ExpandDims(x, 1) broadcast along rows where x is held as
        a row) cannot be generated from that storage."""
        c = self._classify(v, S, L)
        if c is not None and {c[0], placed} == {ROW, COL}:
            raise Unsupported(f"{n.op} reads {v.name} as a {c[0]}, but it is held as a "
                              f"{placed}", node=n, about=(v,))

    def _io(self, i: int, v: Value, kind: dict[int, str], is_input: bool, L: Dim = 1
            ) -> KernelIO:
        local = self.loaded[id(v)] if is_input else v
        if is_input and id(v) in self.gathered_in:
            if kind.get(id(self.owner(local))) != FULL:
                raise Unsupported(f"input {v.name}: a transpose of it moving the last axis read "
                                  "broadcast (gathered in UB, it is a full tile)", about=(v,))
            return KernelIO(i, v, FULL, v.dtype, tuple(v.shape), local=local,
                            transpose=self.gathered_in[id(v)])
        if not is_input and id(v) in self.transposed:
            shape, strides = self.store_maps[id(v)]
            if self.kind_of(kind, v) != FULL or self.copies.get(id(v)):
                raise Unsupported(f"output {v.name}: a transpose of a value smaller than the "
                                  "loop space, or copied", about=(v,))
            return KernelIO(i, v, FULL, v.dtype, tuple(v.shape), local=self.owner(v),
                            transpose=(tuple(int(d) for d in shape),
                                       tuple(int(d) for d in strides)))
        if not is_input and id(v) in self.store_maps:
            shape, strides = self.store_maps[id(v)]
            c = classify(shape, shape, L, View(0, strides))
            if c is None:
                raise Unsupported(f"output {v.name} (a transpose of a computed value): rows of "
                                  f"{L} are not contiguous in it", about=(v,))
            if self.kind_of(kind, v) != FULL:
                raise Unsupported(f"output {v.name}: a transpose of a value smaller than the "
                                  "loop space", about=(v,))
            if c[0] == PARTIAL:
                return KernelIO(i, v, FULL, v.dtype, tuple(v.shape), c[1], c[2], c[3],
                                self.owner(v), copies=self.copies.get(id(v), ()))
        o = self.owner(local)
        k = kind.get(id(o))
        if k is None:
            raise Unsupported(f"value {v.name} is not used by any computing op", about=(v,))
        if not is_input and k == PARTIAL:
            k = FULL  # a loaded tile stored back (a broadcast or slice materialised)
        outer, strides, base = self.partial.get(id(o), ((), (), 0)) if is_input else ((), (), 0)
        copies = () if is_input else self.copies.get(id(v), ())
        col = self.colinputs.get(id(o)) if is_input else None
        if col is not None:
            return KernelIO(i, v, k, v.dtype, tuple(v.shape), outer, strides, base, o,
                            columns=(col[0], col[1]))
        if copies and k != FULL:
            raise Unsupported(f"output {v.name}: copies of a {k} value", about=(v,))
        return KernelIO(i, v, k, v.dtype, tuple(v.shape), outer, strides, base, o,
                        copies=copies)


def align_elems(s: Schedule) -> int:
    """Elements per row-pitch step: a UB block of the narrowest type loaded or stored, or
    whole repeats of the compute type when Compare is used."""
    if s.masks:
        return s.target.repeat_elems(s.compute.itemsize)
    return s.target.block_elems(min(io.dtype.itemsize for io in (*s.inputs, *s.outputs)))


MAX_TILE_ROWS = 4095  # a tile's rows: DataCopyPad's block count (a 12-bit field)
GATHER_REPEATS = 255  # full repeats of one count-form Gather (an 8-bit repeat count)


def reshaped_read(v: Value) -> bool:
    """Whether a transposed kernel input ``v`` that keeps its last axis is read in another
    shape (a Reshape merging its axes: Swin's window merge ``[B, h, w, wh, ww, C]`` read as
    ``[B, h, wh, w, ww, C]`` and then as ``[B, L, C]``, its patch merge as rows of 4 C). Its
    rows are then no strided view the steps can read (a reshape of a strided map is no
    affine map in general), so the kernel gathers the value in UB instead."""
    return any(u.op in VIEW_OPS and tuple(o.shape) != tuple(v.shape)
               for u in v.users for o in u.outputs)


def gather_transpose_refusal(shape: tuple[Dim, ...], strides: tuple[Dim, ...],
                             dtype: DType, repeat_bytes: int = 256) -> str:
    """Why a computed value of ``shape`` stored through ``strides`` (a map that moves its
    last axis) cannot be transposed in UB by one Gather; "" when it can. The whole value is
    one tile, gathered by one count-form instruction: static extents, a float type of 2 or
    4 bytes, at most 255 full repeats of elements (the tile's padded rows included)."""
    if not all(isinstance(d, int) for d in (*shape, *strides)):
        return "symbolic extents (the in-UB transpose's table is built for static shapes)"
    if dtype not in (DType.float32, DType.float16, DType.bfloat16):
        return f"{dtype} data (the in-UB transpose gathers float32, float16 and bfloat16)"
    per, n = repeat_bytes // dtype.itemsize, int(np.prod(shape, dtype=np.int64))
    if n // per > GATHER_REPEATS:  # (the tile's padded rows are counted by _single_tile)
        return f"{n} elements (one in-UB gather moves at most {GATHER_REPEATS} repeats of {per})"
    return ""


def io_notes(ins: list[KernelIO], reduces: bool) -> list[str]:
    """Why inputs are read more than once (shown with the kernel): broadcasts re-read per
    row or per column tile."""
    notes: list[str] = []
    for io in ins:
        if io.lookup >= 0:
            notes.append(f"input {io.index} ({io.value.name}) is a table whose rows are read "
                         f"by index (input {io.lookup}): a row once per index naming it, rows "
                         "no index names not at all")
            continue
        if io.kind == PARTIAL and io.local is not io.value and not any(
                eq(st, 0) for st in io.strides):
            continue  # a slice: strided rows, each read once
        if io.table and io.table_repeat > 1:
            notes.append(f"input {io.index} ({io.value.name}) is a table of "
                         f"{io.table // io.table_repeat} rows, each serving "
                         f"{io.table_repeat} consecutive rows, broadcast over the outer axes: "
                         "each core loads the rows it uses once, repeats them in UB and "
                         "keeps them there")
        elif io.table:
            notes.append(f"input {io.index} ({io.value.name}) is a table of {io.table} rows "
                         "broadcast over the leading axes: each core loads the rows it uses "
                         "once and keeps them in UB")
        elif io.kind == PARTIAL:
            notes.append(f"input {io.index} ({io.value.name}) is broadcast over outer axes: "
                         "its rows are re-read for every row that uses them")
        elif io.kind == ROW:
            notes.append(f"input {io.index} ({io.value.name}) is a broadcast row: each "
                         "core reads it once (once per column tile when rows are split)")
        elif io.kind == COL and not reduces:
            notes.append(f"input {io.index} ({io.value.name}) holds one value per row: "
                         "re-read for each column tile when rows are split")
    return notes


SINKABLE_FORMS = frozenset({"unary", "binary", "round", "pow", "sign"})


def elementwise(n: Node) -> bool:
    """An elementwise op on floats that may run after a Concat instead of on its pieces."""
    rule = INSTRUCTIONS.get(n.op)
    return (rule is not None and rule.form in SINKABLE_FORMS and n.op not in REDUCE_OPS
            and all(v.dtype.is_float for v in (*n.inputs, *n.outputs)))


def follow_views(v: Value) -> Value:
    """``v``'s source through a chain of views (itself when it is not a view)."""
    while v.producer is not None and v.producer.op in VIEW_OPS:
        v = v.producer.inputs[0]
    return v


def _row_lookup(sub, n: Node) -> bool:
    """A Gather along axis 0 of a 2-D float table that is a kernel input read only by it,
    by integer indices that are a kernel input (seen through views) read only by it: an
    embedding lookup, whose rows the kernel loads by index."""
    if n.op != "Gather" or len(n.inputs[0].shape) != 2 or n.attrs["axis"] % 2 != 0:
        return False
    table, idx = n.inputs[0], follow_views(n.inputs[1])
    inputs = {id(v) for v in sub.inputs}
    return (id(table) in inputs and len(table.uses) == 1 and table.dtype in FLOATS
            and id(idx) in inputs and idx.dtype in (DType.int32, DType.int64)
            and _single_use_chain(n.inputs[1], idx) and isinstance(table.shape[0], int))


def _single_use_chain(v: Value, src: Value) -> bool:
    """Whether ``v`` is ``src`` seen through views (widening casts, reshapes), each value on
    the way read once."""
    while True:
        if len(v.uses) != 1:
            return False
        if v is src:
            return True
        if v.producer is None:
            return False
        v = v.producer.inputs[0]


def _join(kinds: list[str]) -> str:
    ks = set(kinds) - {SCALAR}
    if not ks:
        return SCALAR
    if ks & {FULL, PARTIAL} or ks == {ROW, COL}:
        return FULL
    return ks.pop()


def plan(kernel: Node, row_chunks: bool = False, target: targets.Target | None = None
         ) -> Schedule:
    """The schedule of a GraphKernel node for ``target`` (the default target if None), or
    Unsupported with the reason. ``row_chunks``: the variant for rows too long for UB
    (trailing reductions accumulated chunk by chunk)."""
    planner = _Planner(kernel, row_chunks, target=target)
    try:
        s = planner.plan()
    except Unsupported as e:
        if e.node is not None:
            e.node = planner.moved.get(id(e.node)) or planner.origin.get(id(e.node), e.node)
        # a broadcast materialised in UB makes its source compact; stored once per copy
        # instead, the source is the loop space (grouped-query attention's k/v repeat)
        if not any(n.op == "BroadcastTo" for n in kernel.subgraph.nodes):
            raise
        planner = _Planner(kernel, row_chunks, stored_broadcasts=True, target=target)
        try:
            s = planner.plan()
        except Unsupported:
            raise e from None
        if not planner.bstores:
            raise
    if target is not None:
        s.target = target
    return s
