"""The vector epilogue of a MIX kernel: elementwise work on each base tile of a product.

A MIX kernel's body is a matrix product (codegen/cube/schedule.py) and elementwise ops on
its result. The kernel iterates the product's base tiles into UB (``Iterate`` /
``GetTensorC``, fp32: the product is not rounded before the epilogue), runs the epilogue on
the tile and writes each output tile once. Everything in UB is fp32 (accuracy.md: rounding
only at the kernel's boundary); fp16/bf16 inputs are cast on load, outputs on store.

Values on a tile (``baseM × baseN``, row pitch ``baseN``):

- ``tile``: the product, an input of the product's extent (a residual, a mask; its leading
  axes may broadcast: stride 0), or a computed value;
- ``row``: an input of ``N`` elements (a bias row), applied row by row;
- ``scalar``: a constant or a one-element input;
- ``col``: a value per row of the tile (``baseM`` fp32), computed by a reduction along N, or
  an input of ``M`` elements per batch element (a convolution's per-channel bias or scale
  when the product is ``W[M, C] @ x[C, H*W]``), loaded at the tile's first row.

A view may split the product's last axis (``[.., M, H*W]`` seen as ``[.., M, H, W]``: a
convolution's output): the tile is the same memory, and an operand of the split shape is a
tile when it has the whole shape, a column when it varies along M alone (``[1, M, 1, 1]``),
a scalar when it has one element; anything else is refused.

A reduction along N (ReduceSum/ReduceMax/ReduceMin of the product's last axis: LayerNorm,
RMSNorm, softmax) needs each row whole in the tile: such an epilogue sets ``rows`` and the
schedule tiles with ``singleCoreN = N`` and ``baseN >= N`` (codegen/cube/tiling.py), so a
base tile holds ``rows`` complete rows. The reductions and the per-row operations are the
whole-row forms the vector kernels use (``RowReduce``, ``ColOp``, ``ColCopy`` of
templates/row_forms.j2, called on the kernel's ``R`` object).

This module schedules the epilogue: it gives every value its layout on the tile (an input's
record says how it is loaded: its batch strides), aliases views and free casts to the value
they show, and refuses what the epilogue cannot run. The lowering engine
(``codegen/cube/lower.py``, ``codegen/lower.py``) turns the steps into the kernel IR, each
op by the rule of its form in the vector instruction table (codegen/instructions.py):
``unary`` rules over the tile, ``binary`` rules tile∘tile, tile∘row (one call per row) and
tile∘scalar (the scalar form where it is exact, else the scalar spread by ``Duplicate``), a
``Pow`` by a small constant exponent as products, a ``Cast`` to fp32 as an alias and to
fp16/bf16 as the rounding it asks for. Views that keep the last axis are aliases. Anything
else is refused (the kernel is then split into a cube kernel and a vector one).
"""


from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from graphkernel import symbolic
from graphkernel.codegen.instructions import INSTRUCTIONS, REDUCE_OPS, TABLE
from graphkernel.codegen.kernel_ir import COL, FULL, ROW, SCALAR
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.vector.schedule import follow
from graphkernel.ir import Dim, DType, Node, Value
from graphkernel.opdefs.reduce import reduce_axes
from graphkernel.ops import VIEW_OPS
from graphkernel.symbolic import eq

# how an input sits on the tile (the kernel's template and notes use these words)
TILE, ROW_IN, SCALAR_IN, COL_IN = "tile", "row", "scalar", "col"
LAYOUT = {TILE: FULL, ROW_IN: ROW, SCALAR_IN: SCALAR, COL_IN: COL}  # as a layout of the loop
#                                                                     space
FLOAT_TYPES = (DType.float16, DType.bfloat16, DType.float32)
EPILOGUE_FORMS = ("unary", "binary", "pow", "cast")  # elementwise forms a MIX epilogue runs


@dataclass
class EpilogueInput:
    index: int                   # the kernel input
    layout: str                  # tile, row or scalar
    dtype: DType
    strides: tuple[Dim, ...] = ()  # tile, row, col: element stride per output batch axis
    #                                (0: broadcast)

    @property
    def tensor(self) -> str:
        """The name the epilogue reads it by: an fp32 tile ``x``, a row ``r``, a scalar ``s``,
        a column ``k``."""
        return f"{_LETTER[self.layout]}{self.index}"


_LETTER = {TILE: "x", ROW_IN: "r", SCALAR_IN: "s", COL_IN: "k"}


@dataclass
class EpilogueOutput:
    index: int
    dtype: DType
    value: Value                 # the value the output stores (a tile of the product)


@dataclass
class Epilogue:
    """A MIX kernel's vector work, scheduled on the product's base tiles: its inputs (in the
    order first read), outputs, the computing steps in order (views and free casts are
    aliases: ``root``), every value's layout, the constants read as scalars."""

    product: Value
    inputs: list[EpilogueInput]
    outputs: list[EpilogueOutput]
    steps: list[Node]
    layouts: dict[int, str]        # id(value, its storage) -> FULL, ROW, COL or SCALAR
    root: dict[int, Value]         # id(view or free cast) -> the value it shows
    scalars: dict[int, float]      # id(constant) -> its value
    bound: dict[int, EpilogueInput] = field(default_factory=dict)  # id(input value) -> record
    ops: list[str] = field(default_factory=list)
    batch: tuple[Dim, ...] = ()  # the batch axes the inputs' strides run over: the
    #                              product's, or a view's that splits or merges them
    rows: bool = False           # reduces along N: a base tile must hold whole rows

    def storage(self, v: Value) -> Value:
        return follow(self.root, v)

    @property
    def per_row(self) -> bool:
        """The epilogue meets values per row (reduced or loaded): it takes the whole-row
        forms (ColOp on the kernel's ``R`` object)."""
        return self.rows or any(i.layout == COL_IN for i in self.inputs)

    def layout(self, v: Value) -> str:
        return self.layouts[id(self.storage(v))]


# the reductions of the whole-row form (RowReduce): those of the instruction table with one
ROW_REDUCTIONS = frozenset(i.op for i in TABLE if i.form == "reduce" and i.row_op is not None)


def reduces_along(n: Node, last: Dim) -> bool:
    """``n`` is a reduction the epilogue runs: a sum, maximum or minimum of the last axis
    alone of a value whose last axis is ``last`` (the product's N)."""
    shape = tuple(n.inputs[0].type.shape) if n.inputs else ()
    return (n.op in ROW_REDUCTIONS and bool(shape) and eq(shape[-1], last)
            and reduce_axes(len(shape), n.attrs.get("axis")) == [len(shape) - 1])


def split_at(shape: tuple[Dim, ...], M: Dim, N: Dim) -> int | None:
    """Where the product's last axis starts in ``shape`` when ``shape`` is the product's
    ``[.., M, N]`` with N split into trailing axes (``[.., M, H, W]``, H*W = N; the unsplit
    form gives ``len(shape) - 1``), else None. The shortest such suffix."""
    for k in range(len(shape) - 1, 0, -1):
        if eq(symbolic.numel(shape[k:]), N) and eq(shape[k - 1], M):
            return k
    return None


def keeps_rows(shape: tuple[Dim, ...], M: Dim, N: Dim) -> bool:
    """A view the epilogue runs on: its last axis is the product's N, or it is the product's
    ``[.., M, N]`` with N split into trailing axes."""
    return bool(shape) and (eq(shape[-1], N) or split_at(shape, M, N) is not None)


def splits_rows(shape: tuple[Dim, ...], N: Dim) -> bool:
    """Whether trailing axes of ``shape`` multiply to N (each row of the product split into
    them: [.., heads, head size] of a projection's heads times head size)."""
    for k in range(len(shape) - 1, -1, -1):
        if eq(symbolic.numel(shape[k:]), N):
            return True
    return False


def batch_strides(shape: tuple[Dim, ...], out_batch: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Element strides of an operand per output batch dim (0 where broadcast)."""
    own = shape[:-2]
    inner: Dim = symbolic.numel(shape[-2:])
    strides: list[Dim] = []
    for k in range(len(out_batch)):
        j = len(own) - len(out_batch) + k
        if j < 0 or symbolic.canon(own[j]) == symbolic.canon(1):
            strides.append(0)
        else:
            strides.append(symbolic.mul(inner, symbolic.numel(own[j + 1:])))
    return tuple(strides)


def _natural_strides(batch: tuple[Dim, ...], M: Dim, N: Dim) -> tuple[Dim, ...]:
    out: list[Dim] = []
    inner = symbolic.mul(M, N)
    for k in range(len(batch)):
        out.append(symbolic.mul(inner, symbolic.numel(batch[k + 1:])))
    return tuple(out)


class _Scheduler:
    def __init__(self, product: Value, batch, M, N, ins: list[Value], outs: list[Value],
                 steps: list[Node]):
        self.product, self.batch, self.M, self.N = product, batch, M, N
        self.numel = symbolic.numel(product.type.shape)
        self.ins, self.outs, self.steps = ins, outs, steps
        self.kind: dict[int, str] = {id(product): FULL}  # id(value) -> its layout
        self.root: dict[int, Value] = {}
        self.scalars: dict[int, float] = {}
        self.computing: list[Node] = []
        self.ebatch: tuple[Dim, ...] = tuple(batch)  # see Epilogue.batch
        self.regrouped: Node | None = None  # a view regrouping them after an input was read
        self.shapes: dict[int, tuple[Dim, ...]] = {}  # a column's shape (per-row checks)
        self.inputs: list[EpilogueInput] = []
        self.bound: dict[int, EpilogueInput] = {}
        self.keep = {id(v) for v in outs}
        self.col_inputs: set[int] = set()  # id(input value) read as a column

    # ---------------------------------------------------------- values
    def input_kind(self, v: Value, user: Node) -> str:
        i = self.ins.index(v)
        shape = tuple(v.type.shape)
        if v.dtype not in FLOAT_TYPES:
            raise Unsupported(f"{user.op} reads {v.dtype.value} input {v.name} in a matmul "
                              "epilogue (float inputs only)", node=user, about=(v,))
        if eq(symbolic.numel(shape), 1):
            return self._bind(v, EpilogueInput(i, SCALAR_IN, v.dtype))
        if self.regrouped is not None:
            raise Unsupported(f"{self.regrouped.op} regroups the batch axes after an input is "
                              "read and before another in a matmul epilogue",
                              node=self.regrouped)
        if shape and eq(shape[-1], self.N) and (len(shape) == 1 or eq(shape[-2], 1)) \
                and self._broadcasts(shape[:-2]):  # a row, per batch element or shared
            return self._bind(v, EpilogueInput(i, ROW_IN, v.dtype,
                                               batch_strides(shape, self.ebatch)))
        out = tuple(user.outputs[0].type.shape)
        col = self._column(shape, out)
        if col is None and shape == out:  # a Cast of it: checked where it meets the tile
            col = self._column(shape, self._frame(shape))
        if col is not None:
            self.col_inputs.add(id(v))
            return self._bind(v, EpilogueInput(i, COL_IN, v.dtype, col))
        if eq(symbolic.numel(shape), self.numel) and (
                (shape and eq(shape[-1], self.N))
                or shape == tuple(user.outputs[0].type.shape)):
            strides = _natural_strides(self.ebatch, self.M, self.N)  # the product's layout
        elif len(shape) >= 2 and eq(shape[-1], self.N) and eq(shape[-2], self.M) \
                and self._broadcasts(shape[:-2]):
            strides = batch_strides(shape, self.ebatch)
        else:
            raise Unsupported(f"{user.op} reads {v.name} of shape "
                              f"{symbolic.format_shape(shape)} in a matmul epilogue (a tile of "
                              "the product, a row of N, a column of M, or a scalar)", node=user,
                              about=(v,))
        return self._bind(v, EpilogueInput(i, TILE, v.dtype, strides))

    def _frame(self, shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
        """The tile's shape an operand of ``shape`` [.., M, 1, .., 1] would be a column of:
        its trailing ones as N's axes, its leading axes as the product's batch."""
        t = len(shape) - len(tuple(itertools.takewhile(lambda d: eq(d, 1), shape[::-1])))
        if t == 0 or t == len(shape):
            return ()
        return (*self.ebatch, self.M, *((1,) * (len(shape) - t - 1)), self.N)

    def _column(self, shape: tuple[Dim, ...], out: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
        """The batch strides of an operand of ``shape`` read by an op of shape ``out`` when it
        holds one value per row of the product (M values, per batch element or shared: a
        per-channel bias or scale), else None."""
        k = split_at(out, self.M, self.N)
        if k is None or eq(self.M, 1) or len(shape) > len(out):
            return None
        own = (1,) * (len(out) - len(shape)) + shape
        if not (eq(own[k - 1], self.M) and all(eq(d, 1) for d in own[k:])):
            return None
        lead, ob = own[:k - 1], out[:k - 1]
        if len(ob) != len(self.ebatch) or any(not eq(a, b) for a, b in
                                              zip(ob, self.ebatch, strict=True)):
            return None  # the op's batch axes are not the ones the inputs are read over
        if any(not (eq(d, 1) or eq(d, e)) for d, e in zip(lead, ob, strict=True)):
            return None
        return tuple(0 if eq(d, 1) else symbolic.mul(self.M, symbolic.numel(lead[j + 1:]))
                     for j, d in enumerate(lead))

    def _bind(self, v: Value, rec: EpilogueInput) -> str:
        self.inputs.append(rec)
        self.bound.setdefault(id(v), rec)
        return LAYOUT[rec.layout]

    def kind_of(self, v: Value, user: Node) -> str:
        if id(v) in self.kind:
            return self.kind[id(v)]
        p = v.producer
        if p is not None and p.op == "Constant":
            self.scalars[id(v)] = float(p.attrs["value"].reshape(-1)[0])
            k = SCALAR
        elif v in self.ins:
            k = self.input_kind(v, user)
        else:
            raise Unsupported(f"{user.op} reads {v.name}, not computed on the tile", node=user,
                              about=(v,))
        self.kind[id(v)] = k
        return k

    def alias(self, out: Value, src: Value) -> None:
        """``out`` shares the buffer of ``src`` (a view, a cast that rounds nothing)."""
        self.root[id(out)] = follow(self.root, src)
        self.kind[id(out)] = self.kind[id(src)]

    def compute(self, n: Node, kind: str) -> None:
        self.kind[id(n.outputs[0])] = kind
        self.computing.append(n)

    def _broadcasts(self, lead: tuple[Dim, ...]) -> bool:
        """Leading axes that broadcast into the product's batch axes."""
        b = self.ebatch
        return len(lead) <= len(b) and all(
            eq(d, 1) or eq(d, e) for d, e in zip(lead, b[len(b) - len(lead):], strict=True))

    # ------------------------------------------------------------- ops
    def step(self, n: Node) -> None:
        out = n.outputs[0]
        if n.op in VIEW_OPS:
            src = self.kind_of(n.inputs[0], n)
            shape = tuple(out.type.shape)
            if src == COL:  # a view of a value per row: the same column
                self.shapes[id(out)] = shape
                self.alias(out, n.inputs[0])
                return
            if src == FULL and not keeps_rows(shape, self.M, self.N) and (
                    any(u in self.steps for u in out.users) or id(out) not in self.keep
                    or not splits_rows(shape, self.N)):
                # (a view only stored, splitting each row into trailing axes, names the
                # stored tile's layout: rows are written as computed)
                raise Unsupported(f"{n.op} changes the last axis of the product in a matmul "
                                  "epilogue", node=n)
            if (src == FULL and len(shape) >= 2 and eq(shape[-1], self.N)
                    and eq(shape[-2], self.M)
                    and shape[:-2] != self.ebatch):  # batch axes split or merged
                if self.inputs:  # read over ebatch: no input may be read in this grouping
                    self.regrouped = self.regrouped or n  # (a value only stored is fine)
                else:
                    self.ebatch = shape[:-2]
            self.alias(out, n.inputs[0])
            return
        rule = INSTRUCTIONS.get(n.op)
        a = [self.kind_of(v, n) for v in n.inputs]
        if n.op in REDUCE_OPS:
            self._reduce(n, rule, a[0])
            return
        if n.op == "BroadcastTo" and a[0] == COL:  # a value per row across the row
            self._per_row(n, n.inputs[0], tuple(out.type.shape))
            self.compute(n, FULL)
            return
        if rule is None or rule.form not in EPILOGUE_FORMS:
            raise Unsupported(f"{n.op} in a matmul epilogue (elementwise ops of the "
                              "instruction table and reductions along N only)", node=n)
        if all(k == SCALAR for k in a):
            if rule.scalar is None:
                raise Unsupported(f"{n.op} of scalars in a matmul epilogue", node=n)
            self.compute(n, SCALAR)
            return
        if n.op == "Cast":
            self._cast(n, a[0])
            return
        if ROW in a and FULL not in a:
            raise Unsupported(f"{n.op} of a row alone in a matmul epilogue", node=n)
        kind = FULL if FULL in a or ROW in a else COL
        if kind == COL:
            self.shapes[id(out)] = tuple(out.type.shape)
        for v, k in zip(n.inputs, a, strict=True):
            if k == COL and kind == FULL:
                self._per_row(n, v, tuple(out.type.shape))
        if rule.form == "binary":
            self._binary(rule, n, a, kind)
        elif rule.form == "pow":
            self._pow(n, a)
        self.compute(n, kind)

    def _reduce(self, n: Node, rule, x: str) -> None:
        """A reduction of the tile's rows (the product's last axis only) to a column."""
        shape = tuple(n.inputs[0].type.shape)
        if x != FULL or not reduces_along(n, self.N):
            axes = reduce_axes(len(shape), n.attrs.get("axis"))
            what = "a product" if rule.api is None else \
                f"axes {axes} of {symbolic.format_shape(shape)}"
            raise Unsupported(f"{n.op} over {what} in a matmul epilogue (a sum, maximum or "
                              f"minimum along N = {symbolic.canon(self.N)} only)", node=n)
        out = n.outputs[0]
        self.compute(n, COL)
        self.shapes[id(out)] = tuple(out.type.shape)

    def _per_row(self, n: Node, v: Value, shape: tuple) -> None:
        """Column ``v`` meets the tile of ``shape``: it must hold one value per row of it (the
        shape with a last axis of 1), or numpy would broadcast it otherwise."""
        if id(follow(self.root, v)) in self.col_inputs:  # an input of M values
            if self._column(tuple(v.type.shape), shape) is None:
                raise Unsupported(f"{n.op} broadcasts {v.name} of shape "
                                  f"{symbolic.format_shape(tuple(v.type.shape))} over "
                                  f"{symbolic.format_shape(shape)} in a matmul epilogue (one "
                                  "value per row of M only)", node=n, about=(v,))
            return
        cs = self.shapes.get(id(v))
        if cs is None or len(cs) != len(shape) or not eq(cs[-1], 1) or any(
                not eq(a, b) for a, b in zip(cs[:-1], shape[:-1], strict=True)):
            raise Unsupported(f"{n.op} broadcasts a reduced value of shape "
                              f"{symbolic.format_shape(cs or ())} over "
                              f"{symbolic.format_shape(shape)} in a matmul epilogue (one value "
                              "per row only)", node=n)

    def _binary(self, rule, n: Node, a: list[str], kind: str) -> None:
        """What a binary op's operands may be on a tile."""
        x, y = a
        if x == y:
            return
        if COL in a and kind == FULL:  # each row against its value
            if ROW in a or rule.row_op is None:
                raise Unsupported(f"{n.op} of {_word(x)} and {_word(y)} values in a matmul "
                                  "epilogue", node=n)
        elif ROW in a and SCALAR in a:
            raise Unsupported(f"{n.op} of a row and a scalar in a matmul epilogue", node=n)

    def _pow(self, n: Node, a: list[str]) -> None:
        """A power by a constant the epilogue writes as a root or a few products."""
        c = self.scalars.get(id(follow(self.root, n.inputs[1])))
        if a[0] not in (FULL, COL) or c is None:
            raise Unsupported("Pow with a tensor exponent in a matmul epilogue", node=n)
        if not (c == 0.5 or (c == int(c) and 1 <= c <= 4)):
            raise Unsupported(f"Pow by {c} in a matmul epilogue", node=n)

    def _cast(self, n: Node, x: str) -> None:
        out = n.outputs[0]
        if out.dtype not in FLOAT_TYPES:
            raise Unsupported(f"Cast to {out.dtype.value} in a matmul epilogue", node=n)
        only_stored = not out.users and id(out) in self.keep
        if x == COL:
            self.shapes[id(out)] = tuple(out.type.shape)
        if out.dtype == DType.float32 or only_stored or x not in (FULL, COL):
            self.alias(out, n.inputs[0])  # fp32 in UB already; a stored value rounds on store
            return
        self.compute(n, x)  # the rounding the graph asks for, through a 16-bit scratch


def _word(layout: str) -> str:
    """A layout as the epilogue's messages name it."""
    return {FULL: TILE}.get(layout, layout)


def schedule(product: Value, batch, M, N, ins: list[Value], outs: list[Value],
             steps: list[Node]) -> Epilogue:
    """The epilogue of the ``steps`` (in order) on the product's tiles; ``ins`` the kernel's
    inputs (by index), ``outs`` its outputs; Unsupported for what it cannot run."""
    b = _Scheduler(product, batch, M, N, ins, outs, steps)
    for n in steps:
        b.step(n)
    outputs = []
    for j, v in enumerate(outs):
        k = b.kind.get(id(v))
        if k != FULL:
            raise Unsupported(f"output {v.name} of a matmul kernel is not a tile of the "
                              "product", node=v.producer, about=(v,))
        if v.dtype not in FLOAT_TYPES or not eq(symbolic.numel(v.type.shape), b.numel):
            raise Unsupported(f"output {v.name} of a matmul kernel: {v.dtype.value} "
                              f"{symbolic.format_shape(v.type.shape)}", node=v.producer, about=(v,))
        outputs.append(EpilogueOutput(j, v.dtype, v))
    seen: set[int] = set()
    uniq = [i for i in b.inputs if not (i.index in seen or seen.add(i.index))]
    layouts = {vid: k for vid, k in b.kind.items() if vid not in b.root}
    return Epilogue(product, uniq, outputs, b.computing, layouts, b.root, b.scalars, b.bound,
                    [n.op for n in steps], b.ebatch,
                    any(n.op in REDUCE_OPS for n in b.computing))
