"""The lowering: a kernel's steps become kernel IR (``codegen/kernel_ir.py``), one engine for
vector kernels and the vector epilogue of MIX kernels.

Both run elementwise ops, reductions of each row and broadcasts over a tile of a loop space:
a vector kernel's tile of ``rows`` rows of the loop space (row pitch ``t_.ctp``), a MIX
kernel's base tile of the product (row pitch ``bN``). A ``Space`` says what differs: names
and counts, the pools of scratch buffers and their sizes, and a few choices of its own
(whether a dead operand's buffer may take the result, how a tile meets a scalar). The engine
binds every value of the kernel to a ``Ref`` (a buffer of a pool, a loaded tile, a scalar
expression), allocates scratch by a linear scan over the steps (a buffer returns to its pool
after its value's last use, so the UB budget counts peak live buffers) and lowers each step by
the rule of its instruction's form (``RULES``: one function per form of
``codegen/instructions.py``, checked complete when this module loads).

Inside a kernel every float value is held in UB in the compute type ``CT``: fp32 (fp16/bf16
are cast on load and on store), or fp16 for a vector kernel whose body is all fp16. Scalar
operands are written ``CT(...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from graphkernel.codegen.instructions import BITS, FORMS, INSTRUCTIONS, Instruction
from graphkernel.codegen.kernel_ir import (
    COL,
    FULL,
    HELPERS,
    ROW,
    SCALAR,
    Buffer,
    Call,
    Comment,
    Instr,
    Operand,
    ScalarCode,
    comment_text,
)
from graphkernel.codegen.refusal import Unsupported
from graphkernel.ir import DType, Node, Value

C_TYPE = {DType.float32: "float", DType.float16: "half", DType.bfloat16: "bfloat16_t",
          DType.bool: "uint8_t", BITS: "int32_t", DType.int64: "int64_t"}
MASK = "mask"  # the pool of bit masks (a comparison's result: whole tiles)


def flt(x: float) -> str:
    """A float constant as C++."""
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return f"{x!r}f" if "e" in repr(x) or "." in repr(x) else f"{x!r}.0f"


@dataclass
class Ref:
    """Where a value lives: ``expr`` a LocalTensor (a buffer's tensor), or for SCALAR a float
    expression; ``store`` the pool it was taken from (``Space.pools``), "xi" a tile loaded
    from GM, "sv" a scalar computed in the tile loop, "" anything else."""

    kind: str
    expr: str
    const: float | None = None
    store: str = ""


@dataclass(frozen=True)
class Space:
    """The loop space a lowering runs over, and its choices."""

    pitch: str                  # elements between consecutive rows of a tile
    counts: dict[str, str]      # the element count of a call over a value of each layout
    row_count: str              # elements of one row's call (the per-row forms)
    pools: dict[str, str]       # scratch pools: layout (or MASK) -> tensor name prefix
    owner: str = ""             # the object owning the kernel's helpers ("R." in MIX kernels)
    in_place: bool = True       # a dead operand's buffer may take the step's result
    scalar_forms: bool = True   # a tile with a scalar and no tensor-with-scalar call: exact
    #   scalar forms, else the scalar in a scratch row or column (False: the scalar spread
    #   into the result, then the tensor-with-tensor call)
    comments: bool = True       # a comment before each step naming its node
    compute: DType = DType.float32  # the type of every float value in UB (``CT``)
    pool_buffer: Callable[[str, int], Buffer] | None = field(default=None, compare=False)

    def helper(self, name: str) -> str:
        """A name of the kernel's helpers (``OP_ADD``, ``RowReduce``) as the code spells it."""
        return f"{self.owner}{name}"


def op(t: str, at: str = "", view: str = "", by_row: bool = False, work: bool = False
       ) -> Operand:
    return Operand(t, at, view, by_row, work)


class Lowerer:
    """Lowers ``steps`` (in order) over ``space``. ``storage(v)``: the value whose buffer
    ``v`` shares (views alias their source); ``layout(v)``: its layout; ``last``: id(storage
    value) -> index of the last step reading it (``len(steps)`` for what outlives them)."""

    def __init__(self, space: Space, steps: list[Node], storage: Callable[[Value], Value],
                 layout: Callable[[Value], str], last: dict[int, int]):
        self.space = space
        self.steps = steps
        self.storage = storage
        self.layout = layout
        self.last = last
        self.refs: dict[int, Ref] = {}
        self.free: dict[str, list[str]] = {p: [] for p in space.pools.values()}
        self.count: dict[str, int] = {p: 0 for p in space.pools.values()}
        self.body: list[Instr] = []
        self.nscalar = 0
        self.uses_ht = False   # the math library's work space (``ht``)
        self.uses_hh: set[str] = set()  # the 16-bit scratch ``hh``: what for
        self.uses_hf = False   # a rounding's fp32 scratch in a fp16 kernel (``hf``)

    # ------------------------------------------------------------- buffers
    def alloc(self, kind: str) -> str:
        pool = self.space.pools[kind]
        if self.free[pool]:
            return self.free[pool].pop()
        name = f"{pool}{self.count[pool]}"
        self.count[pool] += 1
        return name

    def held(self, kind: str, name: str) -> Ref:
        """A Ref to a buffer ``alloc(kind)`` gave (a mask is a FULL value)."""
        return Ref(FULL if kind == MASK else kind, name, store=self.space.pools[kind])

    def scratch(self, kind: str) -> Ref:
        return self.held(kind, self.alloc(kind))

    def release(self, ref: Ref) -> None:
        if ref.store in self.free and ref.expr not in self.free[ref.store]:
            self.free[ref.store].append(ref.expr)

    def ref(self, v: Value) -> Ref:
        return self.refs[id(self.storage(v))]

    def pool_buffers(self) -> list[Buffer]:
        """The pools' buffers, pool by pool, as many as were live at once."""
        make = self.space.pool_buffer
        return [make(kind, k) for kind, pool in self.space.pools.items()
                for k in range(self.count[pool])]

    # ------------------------------------------------------------- the steps
    def dead(self, n: Node, k: int) -> list[Ref]:
        """Refs of the operands whose last use is step k (each once)."""
        out: dict[str, Ref] = {}
        for v in n.inputs:
            o = self.storage(v)
            if self.last.get(id(o)) == k and id(o) in self.refs:
                out.setdefault(self.refs[id(o)].expr, self.refs[id(o)])
        return list(out.values())

    def step(self, k: int, n: Node, dst_of: Callable[[Node, Instruction | None, str], Ref]
             ) -> None:
        """Lower step ``k``: its result's buffer from ``dst_of(node, rule, layout)`` (taken
        after the dead operands' buffers return to their pools when the rule allows the
        result in place), then the rule of its form."""
        out = n.outputs[0]
        operands = [self.ref(v) for v in n.inputs]
        kind = self.layout(out)
        # operands dead after this step: their buffers may become dst (in place), never a
        # scratch of the step itself (that would overwrite an operand before it is read)
        dead = self.dead(n, k)
        rule = INSTRUCTIONS.get(n.op)  # (none for a Concat of columns: never in place)
        inplace_ok = self.space.in_place and rule is not None and rule.in_place
        if inplace_ok:
            for r in dead:
                self.release(r)
        dst = dst_of(n, rule, kind)
        self.refs[id(out)] = dst
        for r in dead:
            if r.store in self.free and r.expr in self.free[r.store]:
                self.free[r.store].remove(r.expr)
        self.enter(n, operands)
        if self.space.comments:
            self.body.append(Comment(f"{n.op} {comment_text(n.name)}"))
        self.emit(n, dst, operands)
        for r in dead:
            if r.expr != dst.expr:
                self.release(r)

    def enter(self, n: Node, operands: list[Ref]) -> None:
        """Before step ``n``'s instructions (a vector kernel picks the list they go to)."""

    def reduce_mode(self, rule: Instruction, dst: Ref, x: Ref) -> bool:
        """A reduction other than of whole rows into a column (over the rows, in chunks of a
        row, a product): lowered here and True, or False. A vector kernel's."""
        return False

    def scan(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """A Scan down the rows (a vector kernel's, over the rows)."""
        raise Unsupported(f"{n.op} outside a kernel over the rows", node=n)

    def concat(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """A Concat of column values (a vector kernel's)."""
        raise Unsupported(f"{n.op} of column values", node=n)

    def emit(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """One step: its instruction table entry, lowered by the rule of its form."""
        if n.op == "Concat":
            self.concat(n, dst, a)
            return
        rule = INSTRUCTIONS.get(n.op)
        if rule is None:
            raise Unsupported(f"{n.op} not supported by codegen")
        if dst.kind == SCALAR:
            if rule.scalar is None:
                raise Unsupported(f"{n.op} of scalars")
            expr = rule.scalar.format(*(r.expr for r in a), t=C_TYPE[n.outputs[0].dtype])
            self.body.append(ScalarCode((f"float {dst.expr} = {expr};",)))
            return
        # A bit mask is read as a mask only by Select's condition; every other operand is a
        # value, so a mask there (a comparison reduced, selected, compared, combined) is
        # first expanded to 0/1 in the compute type
        a, held = list(a), []
        for i in range(1 if rule.form == "select" else 0, len(a)):
            if self.is_mask(a[i]):
                a[i] = self.numeric(a[i])
                held.append(a[i])
        RULES[rule.form](self, rule, n, dst, a)
        self.release_all(held)

    def scalar_dst(self) -> Ref:
        dst = Ref(SCALAR, f"sv{self.nscalar}", store="sv")
        self.nscalar += 1
        return dst

    # ------------------------------------------------------------- helpers of the rules
    def call(self, api: str, dst: Operand | str, *args: Operand | str, count: str | None = None,
             each_row: bool = False, template: str = "", to: list[Instr] | None = None
             ) -> None:
        """Append ``api(dst, args..., count)`` to ``to`` (by default the current body)."""
        d = dst if isinstance(dst, Operand) else op(dst)
        helper = api in HELPERS
        (self.body if to is None else to).append(
            Call(api, d, tuple(args), count, each_row, template, HELPERS.get(api, frozenset()),
                 self.space.owner if helper else ""))

    def count_of(self, r: Ref) -> str:
        return self.space.counts[r.kind]

    def row(self, r: Ref, i: str = "i") -> Operand:
        """Row ``i`` of a tile (a row or a column is itself)."""
        if r.kind == FULL:
            return op(r.expr, f"{i} * {self.space.pitch}", by_row=i == "i")
        return op(r.expr)

    def imm(self, r: Ref) -> str:
        """A scalar operand as a value of the compute type."""
        return f"CT({r.expr})"

    def full(self, x: Ref) -> tuple[str, list[Ref]]:
        """x as a whole tile (materialised into a scratch tile unless it is one)."""
        if x.kind == FULL:
            return x.expr, []
        t = self.scratch(FULL)
        self.spread(t, x)
        return t.expr, [t]

    def is_mask(self, x: Ref) -> bool:
        """x is a comparison's bit mask (a bit per element of the tile)."""
        return MASK in self.space.pools and x.store == self.space.pools[MASK]

    def numeric(self, mask: Ref) -> Ref:
        """A bit mask as a scratch tile of 0/1 in the compute type (Select of 1 where set)."""
        r = self.scratch(FULL)
        self.call("Duplicate", r.expr, "CT(1.0f)", count="n")
        self.call("Select", r.expr, op(mask.expr), op(r.expr), "CT(0.0f)",
                  "SELMODE::VSEL_TENSOR_SCALAR_MODE", count="n")
        return r

    def release_all(self, refs: Iterable[Ref]) -> None:
        for r in refs:
            self.release(r)

    @staticmethod
    def same(x: Ref, kind: str) -> str:
        if x.kind != kind:
            raise Unsupported(f"a {x.kind} operand where a {kind} one is needed")
        return x.expr

    def spread(self, dst: Ref, x: Ref) -> None:
        """x (a scalar, a row or a column) over every element of dst."""
        if x.kind == SCALAR:
            self.call("Duplicate", dst.expr, self.imm(x), count=self.count_of(dst))
        elif x.kind == ROW and dst.kind == FULL:
            self.call("Muls", self.row(dst), op(x.expr), "CT(1.0f)",
                      count=self.space.row_count, each_row=True)
        elif x.kind == COL and dst.kind == FULL:  # Brcb, then a strided copy
            self.call("ColCopy", dst.expr, op(x.expr), "rows")
        else:
            raise Unsupported(f"BroadcastTo from {x.kind} to {dst.kind}")

    def scalar_code(self, lines: list[str], reads: Iterable[str], writes: Iterable[str]) -> None:
        self.body.append(ScalarCode(tuple(lines), frozenset(reads), frozenset(writes)))


# ----------------------------------------------------------------- the rules, by form
def _unary(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    src = op(lo.same(a[0], dst.kind))
    cnt = lo.count_of(dst)
    if rule.api is None:  # Neg: a multiply by -1
        lo.call("Muls", dst.expr, src, "CT(-1.0f)", count=cnt)
    elif rule.scratch == "ht":  # the math library's ops take the ``ht`` work space
        lo.uses_ht = True
        lo.call(rule.api, dst.expr, src, op("ht", work=True), count=cnt)
    else:
        lo.call(rule.api, dst.expr, src, count=cnt)


def _scalar_form(lo: Lowerer, rule: Instruction, x: Ref, s: Ref, x_first: bool, dst: Ref
                 ) -> bool:
    """A tensor with a scalar as one exact tensor-with-scalar form; False when none."""
    cnt, sv, const = lo.count_of(dst), s.expr, s.const
    if rule.scalar_api is not None:  # commutative: one tensor-with-scalar call
        lo.call(rule.scalar_api, dst.expr, op(x.expr), lo.imm(s), count=cnt)
        return True
    if rule.op == "Sub" and x_first:  # x - s = x + (-s), exact
        lo.call("Adds", dst.expr, op(x.expr), f"CT(-({sv}))", count=cnt)
        return True
    if not lo.space.scalar_forms:
        return False
    if rule.op == "Sub":
        lo.call("Muls", dst.expr, op(x.expr), "CT(-1.0f)", count=cnt)
        lo.call("Adds", dst.expr, op(dst.expr), lo.imm(s), count=cnt)
        return True
    if rule.op == "Div" and const is not None:
        m, _ = math.frexp(const) if const else (0, 0)
        if x_first and const != 0 and abs(m) == 0.5:
            lo.call("Muls", dst.expr, op(x.expr), f"CT({flt(1.0 / const)})", count=cnt)
            return True
        if not x_first and const == 1.0:
            lo.call("Reciprocal", dst.expr, op(x.expr), count=cnt)
            return True
    return False


def _binary(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, ab: list[Ref]) -> None:
    (a, b), api = ab, rule.api
    kinds = (a.kind, b.kind)
    cnt = lo.count_of(dst)
    if a.kind == b.kind == dst.kind:
        lo.call(api, dst.expr, op(a.expr), op(b.expr), count=cnt)
        return
    if SCALAR in kinds and dst.kind in kinds:
        x, s, x_first = (a, b, True) if b.kind == SCALAR else (b, a, False)
        if _scalar_form(lo, rule, x, s, x_first, dst):
            return
        if not lo.space.scalar_forms:  # the scalar spread into dst, then tensor with tensor
            lo.call("Duplicate", dst.expr, lo.imm(s), count=cnt)
            args = (op(dst.expr), op(x.expr)) if not x_first else (op(x.expr), op(dst.expr))
            lo.call(api, dst.expr, *args, count=cnt)
            return
        tmp = {FULL: "tf", ROW: "tr0", COL: "tc0"}[dst.kind]
        if tmp == "tf":  # a row of the scalar, then row by row
            lo.call("Duplicate", "tr0", lo.imm(s), count=lo.space.counts[ROW])
            args = (lo.row(x), op("tr0")) if x_first else (op("tr0"), lo.row(x))
            lo.call(api, lo.row(dst), *args, count=lo.space.row_count, each_row=True)
            return
        lo.call("Duplicate", tmp, lo.imm(s), count=cnt)
        args = (op(x.expr), op(tmp)) if x_first else (op(tmp), op(x.expr))
        lo.call(api, dst.expr, *args, count=cnt)
        return
    if dst.kind != FULL:
        raise Unsupported(f"{rule.op} of {a.kind} and {b.kind} values")
    if COL in kinds and FULL in kinds and rule.row_op:  # each row against its value:
        # the column spread by Brcb, then strided whole-tile instructions
        x, c = (a, b) if b.kind == COL else (b, a)
        first = "false" if x is a else "true"
        lo.call("ColOp", dst.expr, op(x.expr), op(c.expr), "rows",
                template=f"<{lo.space.helper(rule.row_op)}, {first}>")
        return
    if COL in kinds and ROW in kinds:  # the column across the rows, then row by row
        c, r = (a, b) if a.kind == COL else (b, a)
        lo.call("ColCopy", dst.expr, op(c.expr), "rows")
        args = (lo.row(dst), op(r.expr)) if a is c else (op(r.expr), lo.row(dst))
        lo.call(api, lo.row(dst), *args, count=lo.space.row_count, each_row=True)
        return
    if COL in kinds:
        raise Unsupported(f"{rule.op} of {a.kind} and {b.kind} values")
    # row by row: FULL with ROW
    lo.call(api, lo.row(dst), lo.row(a), lo.row(b), count=lo.space.row_count, each_row=True)


def _pow(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    x, e = a
    if e.const is None:  # the high-level Power, on whole tiles
        xs, tx = lo.full(x)
        es, te = lo.full(e)
        lo.uses_ht = True
        lo.call("Power", dst.expr, op(xs), op(es), op("ht", work=True), count="n")
        lo.release_all(tx + te)
        return
    if x.kind == SCALAR:
        raise Unsupported("Pow of a scalar")
    c, d, cnt = e.const, dst.expr, lo.count_of(dst)
    src = op(lo.same(x, dst.kind))
    if c == 0.5:
        lo.call("Sqrt", d, src, count=cnt)
    elif c == -0.5:
        lo.call("Rsqrt", d, src, count=cnt)
    elif c == int(c) and 1 <= abs(c) <= 8:
        lo.call("Muls", d, src, "CT(1.0f)", count=cnt)
        for _ in range(int(abs(c)) - 1):
            lo.call("Mul", d, op(d), src, count=cnt)
        if c < 0:
            lo.call("Reciprocal", d, op(d), count=cnt)
    elif c != int(c):
        lo.call("Ln", d, src, count=cnt)
        lo.call("Muls", d, op(d), f"CT({flt(c)})", count=cnt)
        lo.call("Exp", d, op(d), count=cnt)
    else:  # 0, or an integer beyond a few products: Power with a scalar exponent
        lo.uses_ht = True
        lo.call("Power", d, src, f"CT({flt(c)})", op("ht", work=True), count=cnt)


def _reduce(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    """Whole rows to one value each (other modes: ``Lowerer.reduce_mode``)."""
    if lo.reduce_mode(rule, dst, a[0]):
        return
    lo.call("RowReduce", dst.expr, op(a[0].expr), "rows", "cols",
            template=f"<{lo.space.helper(rule.row_op)}>")


def _round(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    """A Cast of the compute type to itself with the rounding mode. The vector unit rounds
    float to float, but has no half -> half Cast: a fp16 kernel rounds in the fp32 scratch
    ``hf`` and casts back, exactly (an integral value rounded from a half is a half)."""
    src, k, mode = op(lo.same(a[0], dst.kind)), lo.count_of(dst), f"RoundMode::{rule.mode}"
    if lo.space.compute == DType.float16:
        lo.uses_hf = True
        lo.call(rule.api, "hf", src, "RoundMode::CAST_NONE", count=k)
        lo.call(rule.api, "hf", op("hf"), mode, count=k)
        lo.call(rule.api, dst.expr, op("hf"), "RoundMode::CAST_NONE", count=k)
        return
    lo.call(rule.api, dst.expr, src, mode, count=k)


def _cast(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    """To fp16/bf16 and back, through the 16-bit scratch ``hh``: the rounding asked for."""
    lo.uses_hh.add("round")
    t, k = C_TYPE[n.outputs[0].dtype], lo.count_of(dst)
    src = op(lo.same(a[0], dst.kind))
    lo.call("Cast", op("hh", view=t), src, "RoundMode::CAST_RINT", count=k)
    lo.call("Cast", dst.expr, op("hh", view=t), "RoundMode::CAST_NONE", count=k)


def _compare(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    x, tx = lo.full(a[0])
    y, ty = lo.full(a[1])
    lo.call("Compare", dst.expr, op(x), op(y), f"CMPMODE::{rule.mode}", count="n")
    lo.release_all(tx + ty)


def _logical(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    """bools as fp32 0/1: and = product, or = max, not = 1 - x. Over dst's own elements
    (a column of per-row bools, such as an ``any`` over each row, stays a column)."""
    if all(r.kind == dst.kind for r in a):  # (masks arrive as 0/1 tiles: ``Lowerer.emit``)
        xs, tmps = tuple(r.expr for r in a), ()
    elif dst.kind == FULL:
        xs, tmps = zip(*(lo.full(r) for r in a), strict=True)
    else:
        raise Unsupported(f"{n.op} into a {dst.kind} of operands of kinds "
                          f"{', '.join(r.kind for r in a)}", node=n)
    k = lo.count_of(dst)
    if rule.api is None:  # LogicalNot
        lo.call("Muls", dst.expr, op(xs[0]), "CT(-1.0f)", count=k)
        lo.call("Adds", dst.expr, op(dst.expr), "CT(1.0f)", count=k)
    else:
        lo.call(rule.api, dst.expr, op(xs[0]), op(xs[1]), count=k)
    lo.release_all(t for ts in tmps for t in ts)


def _bitwise(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    if n.outputs[0].dtype != BITS:  # on bools: the logical form
        _logical(lo, INSTRUCTIONS[{"And": "LogicalAnd", "Or": "LogicalOr"}[rule.api]], n, dst,
                 a)
        return
    # int32 words as twice as many int16 (And/Or take 16-bit integers; bits are bits)
    words, tmps = [], []
    for r in a:
        if r.kind == SCALAR and r.const is not None:
            t = lo.scratch(FULL)
            lo.call("Duplicate", op(t.expr, view="int32_t"), f"(int32_t){int(r.const)}",
                    count="n")
            tmps.append(t)
            r = t
        if r.kind != FULL:
            raise Unsupported(f"a {r.kind} int32 operand (integers are not broadcast)")
        words.append(op(r.expr, view="int16_t"))
    lo.call(rule.api, op(dst.expr, view="int16_t"), *words, count="2 * n")
    lo.release_all(tmps)


def _classify(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    x, tx = lo.full(a[0])
    if n.op == "IsNan":  # NaN is the one value unequal to itself
        lo.call("Compare", dst.expr, op(x), op(x), f"CMPMODE::{rule.mode}", count="n")
        lo.release_all(tx)
        return
    tr, ur = lo.scratch(FULL), lo.scratch(FULL)
    t, u = tr.expr, ur.expr
    if n.op == "IsInf":
        lo.call("Abs", t, op(x), count="n")
        lo.call("Duplicate", u, "CT(INFINITY)", count="n")
    else:  # finite: x - x is 0 (NaN for NaN and +-inf)
        lo.call("Sub", t, op(x), op(x), count="n")
        lo.call("Duplicate", u, "CT(0.0f)", count="n")
    lo.call("Compare", dst.expr, op(t), op(u), f"CMPMODE::{rule.mode}", count="n")
    lo.release_all(tx + [tr, ur])


def _select(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    cond, held = a[0].expr, []
    if not lo.is_mask(a[0]):  # a bool held as 0/1: its mask is "!= 0"
        c, tc = lo.full(a[0])
        m, z = lo.scratch(MASK), lo.scratch(FULL)
        cond = m.expr
        lo.call("Duplicate", z.expr, "CT(0.0f)", count="n")
        lo.call("Compare", cond, op(c), op(z.expr), "CMPMODE::NE", count="n")
        held = tc + [z, m]
    x, tx = lo.full(a[1])
    if a[2].kind == SCALAR:
        lo.call("Select", dst.expr, op(cond), op(x), lo.imm(a[2]),
                "SELMODE::VSEL_TENSOR_SCALAR_MODE", count="n")
        lo.release_all(tx + held)
    else:
        y, ty = lo.full(a[2])
        lo.call("Select", dst.expr, op(cond), op(x), op(y), "SELMODE::VSEL_TENSOR_TENSOR_MODE",
                count="n")
        lo.release_all(tx + ty + held)


def _sign(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    """1 where x > 0, -1 where x < 0, else x itself (0, -0, NaN)."""
    x, tx = lo.full(a[0])
    mr, tr = lo.scratch(MASK), lo.scratch(FULL)
    m, t, d = mr.expr, tr.expr, dst.expr
    tt = "SELMODE::VSEL_TENSOR_TENSOR_MODE"
    lo.call("Duplicate", t, "CT(0.0f)", count="n")
    lo.call("Compare", m, op(x), op(t), "CMPMODE::LT", count="n")
    lo.call("Duplicate", t, "CT(-1.0f)", count="n")
    lo.call("Select", d, op(m), op(t), op(x), tt, count="n")
    lo.call("Duplicate", t, "CT(0.0f)", count="n")
    lo.call("Compare", m, op(x), op(t), "CMPMODE::GT", count="n")
    lo.call("Duplicate", t, "CT(1.0f)", count="n")
    lo.call("Select", d, op(m), op(t), op(d), tt, count="n")
    lo.release_all(tx + [mr, tr])


def _broadcast(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    lo.spread(dst, a[0])


def _scan(lo: Lowerer, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
    lo.scan(n, dst, a)


RULES: dict[str, Callable[[Lowerer, Instruction, Node, Ref, list[Ref]], None]] = {
    "unary": _unary, "binary": _binary, "reduce": _reduce, "broadcast": _broadcast,
    "round": _round, "cast": _cast, "pow": _pow, "compare": _compare, "classify": _classify,
    "logical": _logical, "bitwise": _bitwise, "select": _select, "sign": _sign,
    "scan": _scan,
}
if set(RULES) != set(FORMS):  # every form of the instruction table has its rule
    raise ImportError(f"lowering rules {sorted(RULES)} do not match the forms {sorted(FORMS)}")
