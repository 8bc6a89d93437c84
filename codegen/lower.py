"""Lower a Schedule's steps to Ascend C vector calls over one tile, allocating UB buffers.

Inside a kernel every float value is held in UB in the schedule's compute type ``CT``: fp32
(fp16/bf16 are cast on load and on store), or fp16 for a kernel whose body is all fp16 (not
promoted: opt_level 1 or enable_low_precision). Scalar operands are written ``CT(...)``.
A tile holds ``rows`` rows of ``cols`` columns; a FULL buffer has a row pitch of ``t_.ctp``
elements (a whole number of UB blocks), so ``X[i * t_.ctp]`` is row i. Buffers are reused once their
value is dead (a linear scan over the steps), so the UB budget counts peak live buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphkernel.codegen.instructions import (
    BITS,
    INSTRUCTIONS,
    REDUCE_OPS,
    Instruction,
    unary_line,
)
from graphkernel.codegen.schedule import (
    COL,
    FULL,
    PARTIAL,
    PIECE,
    ROW,
    SCALAR,
    Schedule,
    Unsupported,
    comment_text,
)
from graphkernel.ir import DType, Node, Value

C_TYPE = {DType.float32: "float", DType.float16: "half", DType.bfloat16: "bfloat16_t",
          DType.bool: "uint8_t", BITS: "int32_t"}


def flt(x: float) -> str:
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return f"{x!r}f" if "e" in repr(x) or "." in repr(x) else f"{x!r}.0f"


@dataclass
class Ref:
    kind: str
    expr: str          # a LocalTensor<float> name, or a float expression for SCALAR
    const: float | None = None
    store: str = ""    # where it lives: a scratch pool ("wf", "wc", "wr", "wm": bit masks),
    #                    "xi" a tile loaded from GM, "sv" a scalar computed in the tile loop

    def row(self, i: str = "i") -> str:
        return f"{self.expr}[{i} * t_.ctp]" if self.kind == FULL else self.expr

    def count(self) -> str:
        return {FULL: "n", ROW: "t_.ctp", COL: "rows"}[self.kind]


# the scratch pool of each kind of buffer a step may need (a mask is a bit mask of a tile)
POOLS = {FULL: "wf", COL: "wc", ROW: "wr", "mask": "wm"}


def sync(src: str, dst: str) -> str:
    """The destination pipe waits for the source pipe's work so far (an event pair)."""
    return f"Sync<HardEvent::{src}_{dst}>();"


@dataclass
class Lowered:
    body: list[str]
    prologue: list[str]            # casts of low-precision inputs into fp32 buffers
    epilogue: list[str]            # copies/casts into the output queue tensors
    pools: dict[str, int]          # peak buffers per pool: wf (tile), wc (column), wr (row)
    scalar_tmp: bool               # a high-level op needs the ``ht`` scratch
    half_tmp: bool = False         # a rounding Cast needs the ``hh`` 16-bit scratch
    direct: dict[int, int] = field(default_factory=dict)  # output index written in place
    final: list[str] = field(default_factory=list)     # after all rows of a column tile
    final_epilogue: list[str] = field(default_factory=list)  # stores of the row outputs
    accumulators: list[tuple[str, str]] = field(default_factory=list)  # (buffer, identity)
    row_blocks: bool = False       # the whole-row forms (Brcb, the row-reduce gather) need btb
    col_copies: bool = False       # a Concat of columns copies pieces with ColsCopy


class Lowerer:
    def __init__(self, s: Schedule):
        self.s = s
        self.refs: dict[int, Ref] = {}
        self.free: dict[str, list[str]] = {"wf": [], "wc": [], "wr": [], "wm": []}
        self.count: dict[str, int] = {"wf": 0, "wc": 0, "wr": 0, "wm": 0}
        self.tile_body: list[str] = []
        self.body = self.tile_body
        self.prologue: list[str] = []
        self.epilogue: list[str] = []
        self.scalar_tmp = False
        self.half_tmp = False
        self.nscalar = 0
        self.final: list[str] = []
        self.final_epilogue: list[str] = []
        self.accumulators: list[tuple[str, str]] = []
        self.row_blocks = False
        self.col_copies = False

    # ------------------------------------------------------------- buffers
    def alloc(self, kind: str) -> str:
        pool = POOLS[kind]
        if self.free[pool]:
            return self.free[pool].pop()
        name = f"{pool}{self.count[pool]}"
        self.count[pool] += 1
        return name

    def held(self, kind: str, name: str) -> Ref:
        """A Ref to a buffer ``alloc(kind)`` gave (a mask is a FULL value)."""
        return Ref(FULL if kind == "mask" else kind, name, store=POOLS[kind])

    def scratch(self, kind: str) -> Ref:
        return self.held(kind, self.alloc(kind))

    def release(self, ref: Ref) -> None:
        if ref.store in self.free and ref.expr not in self.free[ref.store]:
            self.free[ref.store].append(ref.expr)

    def ref(self, v: Value) -> Ref:
        return self.refs[id(self.s.storage(v))]

    # ------------------------------------------------------------- entry
    def run(self) -> Lowered:
        s = self.s
        for io in s.inputs:
            v = s.storage(io.local)
            if id(v) in self.refs or io.kind == PIECE:  # a piece: in its Concat's tile
                continue
            lowp = io.dtype != s.compute
            if io.columns and any(io.columns[0] * size % s.target.ub_align_bytes
                                  for size in (io.dtype.itemsize, s.compute.itemsize)):
                raise Unsupported(f"input {io.value.name} read at column {io.columns[0]}, "
                                  f"which does not start on a {s.target.ub_align_bytes}-byte "
                                  "UB block")
            if io.dtype == BITS:  # raw words, used in place
                if io.kind not in (FULL, PARTIAL):
                    raise Unsupported(f"int32 input {io.value.name} broadcast ({io.kind})")
                self.refs[id(v)] = Ref(FULL, f"xi{io.index}", store="xi")
            elif io.kind in (FULL, PARTIAL):
                if lowp:
                    buf = self.alloc(FULL)
                    self.prologue.append(f"Cast({buf}, xi{io.index}, RoundMode::CAST_NONE, n);")
                    self.refs[id(v)] = self.held(FULL, buf)
                else:
                    self.refs[id(v)] = Ref(FULL, f"xi{io.index}", store="xi")
            elif io.kind == COL:
                if lowp:
                    buf = self.alloc(COL)
                    self.prologue.append(
                        f"Cast({buf}, xi{io.index}, RoundMode::CAST_NONE, rows);")
                    self.refs[id(v)] = self.held(COL, buf)
                else:
                    self.refs[id(v)] = Ref(COL, f"xi{io.index}", store="xi")
            elif io.kind == ROW:
                self.refs[id(v)] = Ref(ROW, f"ri{io.index}")
            else:
                self.refs[id(v)] = Ref(SCALAR, f"s{io.index}")
        for vid, c in s.scalars.items():
            self.refs[vid] = Ref(SCALAR, flt(c), c)
        direct = self._direct_outputs()
        last = self._last_uses()
        for k, n in enumerate(s.steps):
            out = n.outputs[0]
            if id(s.storage(out)) != id(out):
                continue  # an alias (BroadcastTo of a full tile)
            operands = [self.ref(v) for v in n.inputs]
            kind = s.layout(out)
            # operands dead after this step: their buffers may become dst (in place), never a
            # scratch of the step itself (that would overwrite an operand before it is read)
            dead = self._dead(n, k, last)
            rule = INSTRUCTIONS.get(n.op)  # (none for a Concat of columns: never in place)
            inplace_ok = rule is not None and rule.in_place
            if inplace_ok:
                for r in dead:
                    self.release(r)
            if kind == SCALAR:
                dst = Ref(SCALAR, f"sv{self.nscalar}", store="sv")
                self.nscalar += 1
            elif rule is not None and rule.form == "reduce" and (s.col_reduce or s.row_chunks):
                dst = Ref(ROW if s.col_reduce else COL, f"ac{len(self.accumulators)}")
                self.accumulators.append((dst.expr, rule.identity))
            elif rule is not None and rule.makes_mask:
                dst = self.scratch("mask")
            elif id(out) in direct:
                dst = Ref(kind, f"yo{direct[id(out)]}")
            else:
                dst = self.scratch(kind)
            self.refs[id(out)] = dst
            for r in dead:
                if r.store in self.free and r.expr in self.free[r.store]:
                    self.free[r.store].remove(r.expr)
            self.body = self.final if id(n) in s.final else self.tile_body
            if id(n) in s.final and any(r.store == "sv" for r in operands):
                raise Unsupported("a scalar computed in the tile loop used after it")
            self.body.append(f"// {n.op} {comment_text(n.name)}")
            self._emit(n, dst, operands)
            for r in dead:
                if r.expr != dst.expr:
                    self.release(r)
        for io in s.outputs:
            self._store(io, direct)
        return Lowered(self.tile_body, self.prologue, self.epilogue, dict(self.count),
                       self.scalar_tmp, self.half_tmp, {v: j for v, j in direct.items()},
                       self.final, self.final_epilogue, self.accumulators, self.row_blocks,
                       self.col_copies)

    def _direct_outputs(self) -> dict[int, int]:
        """Outputs whose producing step can write straight into the output queue tensor."""
        s, out = self.s, {}
        produced = {id(n.outputs[0]) for n in s.steps if id(n) not in s.final
                    and not (n.op in REDUCE_OPS and (s.col_reduce or s.row_chunks
                                                     # a product: the scalar unit writes it
                                                     or INSTRUCTIONS[n.op].api is None))}
        for io in s.outputs:
            v = s.storage(io.value)
            if (io.dtype in (s.compute, BITS) and id(v) in produced and id(v) not in out
                    and s.layout(v) == io.kind and id(v) not in self.refs):
                out[id(v)] = io.index
        return out

    def _last_uses(self) -> dict[int, int]:
        s, last = self.s, {}
        for k, n in enumerate(s.steps):
            for v in n.inputs:
                last[id(s.storage(v))] = k
        for io in s.outputs:
            for v in [x for x, _, _ in io.pieces] or [io.value]:
                last[id(s.storage(v))] = len(s.steps)
        return last

    def _dead(self, n: Node, k: int, last: dict[int, int]) -> list[Ref]:
        """Refs of the operands whose last use is step k (each once)."""
        out: dict[str, Ref] = {}
        for v in n.inputs:
            o = self.s.storage(v)
            if last.get(id(o)) == k and id(o) in self.refs:
                out.setdefault(self.refs[id(o)].expr, self.refs[id(o)])
        return list(out.values())

    def _store(self, io, direct) -> None:
        if io.pieces:  # a Concat: each operand into its own queue tensor, stored to its block
            for p, (x, _, _) in enumerate(io.pieces):
                src = self._as(self.refs[id(self.s.storage(x))], FULL)
                dst = f"yc{io.index}_{p}"
                self.epilogue.append(f"Muls({dst}, {src}, CT(1.0f), n);"
                                     if io.dtype == self.s.compute else
                                     f"Cast({dst}, {src}, RoundMode::CAST_RINT, n);")
            return
        v = self.s.storage(io.value)
        if direct.get(id(v)) == io.index:
            return
        src = self.refs[id(v)]
        count = {FULL: "n", COL: "rows", ROW: "t_.ctp"}[io.kind]
        if src.kind != io.kind:
            raise Unsupported(f"output {io.value.name}: a {src.kind} value stored as {io.kind}")
        late = io.kind == ROW or (self.s.row_chunks and io.kind == COL)
        out = self.final_epilogue if late else self.epilogue
        if io.dtype == BITS:  # x | x copies the words
            w = f"yo{io.index}.ReinterpretCast<int16_t>()"
            x = f"{src.expr}.ReinterpretCast<int16_t>()"
            out.append(f"Or({w}, {x}, {x}, 2 * n);")
        elif io.dtype == DType.bool and src.store == "wm":  # a mask: 1.0 where set
            t = self.alloc(FULL)
            out += [f"Duplicate({t}, CT(1.0f), n);",
                    f"Select({t}, {src.expr}, {t}, CT(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);",
                    f"Cast(yo{io.index}, {t}, RoundMode::CAST_NONE, n);"]
        elif io.dtype == DType.bool:  # 0/1 in fp32
            out.append(f"Cast(yo{io.index}, {src.expr}, RoundMode::CAST_NONE, {count});")
        elif io.dtype == self.s.compute:
            out.append(f"Muls(yo{io.index}, {src.expr}, CT(1.0f), {count});")
        else:
            out.append(f"Cast(yo{io.index}, {src.expr}, RoundMode::CAST_RINT, {count});")

    # ------------------------------------------------------------- ops
    def _emit(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """One step: its instruction table entry, lowered by the rule of its form."""
        if n.op == "Concat":
            self._column_concat(n, dst, a)
            return
        rule = INSTRUCTIONS.get(n.op)
        if rule is None:
            raise Unsupported(f"{n.op} not supported by codegen")
        if dst.kind == SCALAR:
            if rule.scalar is None:
                raise Unsupported(f"{n.op} of scalars")
            expr = rule.scalar.format(*(r.expr for r in a), t=C_TYPE[n.outputs[0].dtype])
            self.body.append(f"float {dst.expr} = {expr};")
            return
        getattr(self, f"_{rule.form}")(rule, n, dst, a)  # barriers: codegen/barriers.py

    def _column_concat(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """A Concat along the last axis of column values: each piece's columns copied to its
        own columns of every row of dst (one masked copy per row strip). Both ends of a copy
        must start on a UB block."""
        s = self.s
        base = s.cols.get(id(n.outputs[0]), (0, 0, 0))[0]
        size = s.compute.itemsize
        blk = s.target.ub_align_bytes
        at = base
        for x, r in zip(n.inputs, a, strict=True):
            off, width, _ = s.cols[id(x)]
            if (off * size) % blk or (at * size) % blk:
                raise Unsupported(f"Concat of slices of the last axis: a piece at column "
                                  f"{off if (off * size) % blk else at} does not start on a "
                                  f"{blk}-byte UB block", node=n)
            self.body.append(f"ColsCopy({dst.expr}[{at}], {self._as(r, FULL)}[{off}], rows, "
                             f"{width});")
            at += width
        self.col_copies = True

    # ------------------------------------------------------------- the forms
    def _reduce(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        b, x = self.body, a[0]
        if dst.kind == ROW:  # over the rows: accumulate this tile's rows
            b.append(f"for (uint32_t i = 0; i < rows; ++i) "
                     f"{rule.accumulate}({dst.expr}, {dst.expr}, {x.row()}, cols);")
        elif self.s.row_chunks:  # this chunk of the row, into the total:
            # one scalar combination per chunk, between syncs with the vector unit
            if rule.api is not None:
                b.append(f"{rule.api}(red, {x.row('0')}, rw, cols);")
            b += self._to_scalar(x)
            if rule.api is None:
                b.append(self._product(x.row('0'), "red", "0"))
            b.append("{")
            b.append(f"    float l = {dst.expr}.GetValue(0), r = red.GetValue(0);")
            b.append(f"    {dst.expr}.SetValue(0, CT({rule.fold}));")
            b.append("}")
            b.append(sync("S", "V"))
        elif rule.api is None:  # a product: no instruction; the scalar unit multiplies along
            # each row, synced once before and once after
            b += self._to_scalar(x)
            b.append("for (uint32_t i = 0; i < rows; ++i) "
                     + self._product(x.row(), dst.expr, "i"))
            b.append(sync("S", "V"))
        else:  # whole rows to one value each, on the vector unit
            self.row_blocks = True
            b.append(f"RowReduce<{rule.row_op}>({dst.expr}, {x.expr}, rows, cols);")

    def _round(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        self.body.append(f"{rule.api}({dst.expr}, {self._as(a[0], dst.kind)}, "
                         f"RoundMode::{rule.mode}, {dst.count()});")

    def _cast(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        self.half_tmp = True
        t, k = C_TYPE[n.outputs[0].dtype], dst.count()
        src = self._as(a[0], dst.kind)
        self.body += [f"Cast(hh.ReinterpretCast<{t}>(), {src}, RoundMode::CAST_RINT, {k});",
                      f"Cast({dst.expr}, hh.ReinterpretCast<{t}>(), RoundMode::CAST_NONE, {k});"]

    def _compare(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        x, tx = self._full(a[0])
        y, ty = self._full(a[1])
        self.body.append(f"Compare({dst.expr}, {x}, {y}, CMPMODE::{rule.mode}, n);")
        self._release_tmp(tx + ty)

    def _logical(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        """bools as fp32 0/1: and = product, or = max, not = 1 - x. Over dst's own elements
        (a column of per-row bools, such as an ``any`` over each row, stays a column)."""
        if all(r.kind == dst.kind and r.store != "wm" for r in a):
            xs, tmps = tuple(r.expr for r in a), ()
        elif dst.kind == FULL:
            xs, tmps = zip(*(self._numeric(r) for r in a), strict=True)
        else:
            raise Unsupported(f"{n.op} into a {dst.kind} of operands of kinds "
                              f"{', '.join(r.kind for r in a)}", node=n)
        k = dst.count()
        if rule.api is None:  # LogicalNot
            self.body += [f"Muls({dst.expr}, {xs[0]}, CT(-1.0f), {k});",
                          f"Adds({dst.expr}, {dst.expr}, CT(1.0f), {k});"]
        else:
            self.body.append(f"{rule.api}({dst.expr}, {xs[0]}, {xs[1]}, {k});")
        self._release_tmp([t for ts in tmps for t in ts])

    def _bitwise(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        if n.outputs[0].dtype != BITS:  # on bools: the logical form
            self._logical(INSTRUCTIONS[{"And": "LogicalAnd", "Or": "LogicalOr"}[rule.api]],
                          n, dst, a)
        else:
            self._words(rule.api, dst, a)

    def _classify(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        b = self.body
        x, tx = self._full(a[0])
        if n.op == "IsNan":  # NaN is the one value unequal to itself
            b.append(f"Compare({dst.expr}, {x}, {x}, CMPMODE::{rule.mode}, n);")
            self._release_tmp(tx)
            return
        tr, ur = self.scratch(FULL), self.scratch(FULL)
        t, u = tr.expr, ur.expr
        if n.op == "IsInf":
            b += [f"Abs({t}, {x}, n);", f"Duplicate({u}, CT(INFINITY), n);"]
        else:  # finite: x - x is 0 (NaN for NaN and +-inf)
            b += [f"Sub({t}, {x}, {x}, n);", f"Duplicate({u}, CT(0.0f), n);"]
        b.append(f"Compare({dst.expr}, {t}, {u}, CMPMODE::{rule.mode}, n);")
        self._release_tmp(tx + [tr, ur])

    def _select(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        b = self.body
        cond, held = a[0].expr, []
        if a[0].store != "wm":  # a bool held as 0/1: its mask is "!= 0"
            c, tc = self._full(a[0])
            m, z = self.scratch("mask"), self.scratch(FULL)
            cond = m.expr
            b += [f"Duplicate({z.expr}, CT(0.0f), n);",
                  f"Compare({cond}, {c}, {z.expr}, CMPMODE::NE, n);"]
            held = tc + [z, m]
        x, tx = self._full(a[1])
        if a[2].kind == SCALAR:
            b.append(f"Select({dst.expr}, {cond}, {x}, CT({a[2].expr}), "
                     "SELMODE::VSEL_TENSOR_SCALAR_MODE, n);")
            self._release_tmp(tx + held)
        else:
            y, ty = self._full(a[2])
            b.append(f"Select({dst.expr}, {cond}, {x}, {y}, "
                     "SELMODE::VSEL_TENSOR_TENSOR_MODE, n);")
            self._release_tmp(tx + ty + held)

    def _sign(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        """1 where x > 0, -1 where x < 0, else x itself (0, -0, NaN)."""
        x, tx = self._full(a[0])
        mr, tr = self.scratch("mask"), self.scratch(FULL)
        m, t = mr.expr, tr.expr
        self.body += [
            f"Duplicate({t}, CT(0.0f), n);", f"Compare({m}, {x}, {t}, CMPMODE::LT, n);",
            f"Duplicate({t}, CT(-1.0f), n);",
            f"Select({dst.expr}, {m}, {t}, {x}, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);",
            f"Duplicate({t}, CT(0.0f), n);", f"Compare({m}, {x}, {t}, CMPMODE::GT, n);",
            f"Duplicate({t}, CT(1.0f), n);",
            f"Select({dst.expr}, {m}, {t}, {dst.expr}, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);"]
        self._release_tmp(tx + [mr, tr])

    def _words(self, api: str, dst: Ref, a: list[Ref]) -> None:
        """int32 words as twice as many int16 (And/Or take 16-bit integers; bits are bits)."""
        words, tmps = [], []
        for r in a:
            if r.kind == SCALAR and r.const is not None:
                t = self.scratch(FULL)
                self.body.append(f"Duplicate({t.expr}.ReinterpretCast<int32_t>(), "
                                 f"(int32_t){int(r.const)}, n);")
                tmps.append(t)
                r = t
            if r.kind != FULL:
                raise Unsupported(f"a {r.kind} int32 operand (integers are not broadcast)")
            words.append(f"{r.expr}.ReinterpretCast<int16_t>()")
        self.body.append(f"{api}({dst.expr}.ReinterpretCast<int16_t>(), {words[0]}, {words[1]}, "
                         "2 * n);")
        self._release_tmp(tmps)

    @staticmethod
    def _product(row: str, dst: str, at: str) -> str:
        """The product of a row's cols elements, by the scalar unit, into dst[at]."""
        return (f"{{ float p = 1.0f; for (uint32_t j = 0; j < cols; ++j) p *= (float)"
                f"{row}.GetValue(j); {dst}.SetValue({at}, CT(p)); }}")

    @staticmethod
    def _to_scalar(src: Ref) -> list[str]:
        """Syncs before the scalar unit reads UB: the vector unit's results, and a loaded tile
        (the queue hands it to the vector unit only)."""
        return [sync("V", "S")] + ([sync("MTE2", "S")] if src.store == "xi" else [])

    def _numeric(self, x: Ref) -> tuple[str, list[Ref]]:
        """A bool operand as a whole tile of fp32 0/1 (a mask is expanded by Select)."""
        if x.store != "wm":
            return self._full(x)
        r = self.scratch(FULL)
        t = r.expr
        self.body += [f"Duplicate({t}, CT(1.0f), n);",
                      f"Select({t}, {x.expr}, {t}, CT(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);"]
        return t, [r]

    def _full(self, x: Ref) -> tuple[str, list[Ref]]:
        """x as a whole tile (materialised into a scratch tile unless it is one)."""
        if x.kind == FULL:
            return x.expr, []
        t = self.scratch(FULL)
        self._spread(t, x)
        return t.expr, [t]

    def _release_tmp(self, refs: list[Ref]) -> None:
        for r in refs:
            self.release(r)

    def _unary(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        self.scalar_tmp |= rule.api is not None and rule.scratch == "ht"
        self.body.append(unary_line(rule, dst.expr, self._as(a[0], dst.kind), dst.count()))

    def _as(self, x: Ref, kind: str) -> str:
        if x.kind != kind:
            raise Unsupported(f"a {x.kind} operand where a {kind} one is needed")
        return x.expr

    def _broadcast(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        self._spread(dst, a[0])

    def _spread(self, dst: Ref, x: Ref) -> None:
        """x (a scalar, a row or a column) over every element of dst."""
        b = self.body
        if x.kind == SCALAR:
            b.append(f"Duplicate({dst.expr}, CT({x.expr}), {dst.count()});")
        elif x.kind == ROW and dst.kind == FULL:
            b.append("for (uint32_t i = 0; i < rows; ++i) "
                     f"Muls({dst.row()}, {x.expr}, CT(1.0f), cols);")
        elif x.kind == COL and dst.kind == FULL:  # Brcb, then a strided copy
            self.row_blocks = True
            b.append(f"ColCopy({dst.expr}, {x.expr}, rows);")
        else:
            raise Unsupported(f"BroadcastTo from {x.kind} to {dst.kind}")

    def _pow(self, rule: Instruction, n: Node, dst: Ref, a: list[Ref]) -> None:
        x, e = a
        if e.const is None:  # the high-level Power, on whole tiles
            xs, tx = self._full(x)
            es, te = self._full(e)
            self.scalar_tmp = True
            self.body.append(f"Power({dst.expr}, {xs}, {es}, ht, n);")
            self._release_tmp(tx + te)
            return
        if x.kind == SCALAR:
            raise Unsupported("Pow of a scalar")
        c, d, n, b = e.const, dst.expr, dst.count(), self.body
        src = self._as(x, dst.kind)
        if c == 0.5:
            b.append(f"Sqrt({d}, {src}, {n});")
        elif c == -0.5:
            b.append(f"Rsqrt({d}, {src}, {n});")
        elif c == int(c) and 1 <= abs(c) <= 8:
            b.append(f"Muls({d}, {src}, CT(1.0f), {n});")
            for _ in range(int(abs(c)) - 1):
                b.append(f"Mul({d}, {d}, {src}, {n});")
            if c < 0:
                b.append(f"Reciprocal({d}, {d}, {n});")
        elif c != int(c):
            b += [f"Ln({d}, {src}, {n});", f"Muls({d}, {d}, CT({flt(c)}), {n});",
                  f"Exp({d}, {d}, {n});"]
        else:  # 0, or an integer beyond a few products: Power with a scalar exponent
            self.scalar_tmp = True
            b.append(f"Power({d}, {src}, CT({flt(c)}), ht, {n});")

    def _scalar_form(self, rule: Instruction, x: str, s: Ref | str, x_first: bool, n: str,
                     dst: str) -> list[str] | None:
        sv = s.expr if isinstance(s, Ref) else s
        const = s.const if isinstance(s, Ref) else None
        op = rule.op
        if rule.scalar_api is not None:  # commutative: one tensor-with-scalar call
            return [f"{rule.scalar_api}({dst}, {x}, CT({sv}), {n});"]
        if op == "Sub":
            return ([f"Adds({dst}, {x}, CT(-({sv})), {n});"] if x_first else
                    [f"Muls({dst}, {x}, CT(-1.0f), {n});", f"Adds({dst}, {dst}, CT({sv}), {n});"])
        if op == "Div" and const is not None:
            m, _ = math.frexp(const) if const else (0, 0)
            if x_first and const != 0 and abs(m) == 0.5:
                return [f"Muls({dst}, {x}, CT({flt(1.0 / const)}), {n});"]
            if not x_first and const == 1.0:
                return [f"Reciprocal({dst}, {x}, {n});"]
        return None

    def _binary(self, rule: Instruction, n: Node, dst: Ref, ab: list[Ref]) -> None:
        (a, b), op, api, body = ab, rule.op, rule.api, self.body
        kinds = (a.kind, b.kind)
        if a.kind == b.kind == dst.kind:
            body.append(f"{api}({dst.expr}, {a.expr}, {b.expr}, {dst.count()});")
            return
        if SCALAR in kinds and dst.kind in kinds:
            x, s, x_first = (a, b, True) if b.kind == SCALAR else (b, a, False)
            form = self._scalar_form(rule, x.expr, s, x_first, dst.count(), dst.expr)
            if form is None:
                tmp = {FULL: "tf", ROW: "tr0", COL: "tc0"}[dst.kind]
                if tmp == "tf":  # a row of the scalar, then row by row
                    body.append(f"Duplicate(tr0, CT({s.expr}), t_.ctp);")
                    args = (x.row(), "tr0") if x_first else ("tr0", x.row())
                    body.append(f"for (uint32_t i = 0; i < rows; ++i) "
                                f"{api}({dst.row()}, {args[0]}, {args[1]}, cols);")
                    return
                body.append(f"Duplicate({tmp}, CT({s.expr}), {dst.count()});")
                args = (x.expr, tmp) if x_first else (tmp, x.expr)
                body.append(f"{api}({dst.expr}, {args[0]}, {args[1]}, {dst.count()});")
            else:
                body += form
            return
        if dst.kind != FULL:
            raise Unsupported(f"{op} of {a.kind} and {b.kind} values")
        if COL in kinds and FULL in kinds and rule.row_op:  # each row against its value:
            # the column spread by Brcb, then strided whole-tile instructions
            self.row_blocks = True
            x, c = (a, b) if b.kind == COL else (b, a)
            body.append(f"ColOp<{rule.row_op}, {'false' if x is a else 'true'}>({dst.expr}, "
                        f"{x.expr}, {c.expr}, rows);")
            return
        if COL in kinds and ROW in kinds:  # the column across the rows, then row by row
            self.row_blocks = True
            c, r = (a, b) if a.kind == COL else (b, a)
            body.append(f"ColCopy({dst.expr}, {c.expr}, rows);")
            args = (dst.row(), r.expr) if a is c else (r.expr, dst.row())
            body.append(f"for (uint32_t i = 0; i < rows; ++i) "
                        f"{api}({dst.row()}, {args[0]}, {args[1]}, cols);")
            return
        if COL in kinds:
            raise Unsupported(f"{op} of {a.kind} and {b.kind} values")
        # row by row: FULL with ROW
        args = [r.row() for r in (a, b)]
        body.append(f"for (uint32_t i = 0; i < rows; ++i) {api}({dst.row()}, {args[0]}, "
                    f"{args[1]}, cols);")


def lower(s: Schedule) -> Lowered:
    """The schedule lowered (once: the codegen pass checks it, rendering reuses it)."""
    if s.lowered is None:
        s.lowered = Lowerer(s).run()
    return s.lowered
