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

from graphkernel.codegen.schedule import (
    BINARY_OPS,
    BITS,
    BITWISE_OPS,
    CLASSIFY_OPS,
    COL,
    COMPARE_OPS,
    FULL,
    LOGICAL_OPS,
    PARTIAL,
    REDUCE_OPS,
    ROUND_OPS,
    ROW,
    SCALAR,
    TMP_UNARY_OPS,
    UNARY_OPS,
    Schedule,
    Unsupported,
    comment_text,
)
from graphkernel.ir import DType, Node, Value

SCALAR_FN = {"Exp": "std::exp({})", "Log": "std::log({})", "Abs": "std::fabs({})",
             "Sqrt": "std::sqrt({})", "Rsqrt": "(1.0f / std::sqrt({}))",
             "Reciprocal": "(1.0f / {})", "Relu": "std::fmax({}, 0.0f)", "Neg": "(-{})",
             "Erf": "std::erf({})", "Erfc": "std::erfc({})", "Tanh": "std::tanh({})",
             "Sin": "std::sin({})", "Cos": "std::cos({})", "Tan": "std::tan({})",
             "Asin": "std::asin({})", "Acos": "std::acos({})", "Atan": "std::atan({})",
             "Sigmoid": "(1.0f / (1.0f + std::exp(-{})))"}
SCALAR_BIN = {"Add": "({} + {})", "Sub": "({} - {})", "Mul": "({} * {})", "Div": "({} / {})",
              "Maximum": "std::fmax({}, {})", "Minimum": "std::fmin({}, {})",
              "Pow": "std::pow({}, {})"}
COMMUTATIVE_SCALAR = {"Add": "Adds", "Mul": "Muls", "Maximum": "Maxs", "Minimum": "Mins"}
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

    def row(self, i: str = "i") -> str:
        return f"{self.expr}[{i} * t_.ctp]" if self.kind == FULL else self.expr

    def count(self) -> str:
        return {FULL: "n", ROW: "t_.ctp", COL: "rows"}[self.kind]


COL_REDUCE = {"ReduceSum": ("Add", "0.0f"), "ReduceMax": ("Max", "-INFINITY"),
              "ReduceMin": ("Min", "INFINITY"), "ReduceProd": ("Mul", "1.0f")}
# the kernel template's op codes for its whole-row forms (ColOp, RowReduce)
ROW_OP = {"Add": "OP_ADD", "Sub": "OP_SUB", "Mul": "OP_MUL", "Div": "OP_DIV",
          "Maximum": "OP_MAX", "Minimum": "OP_MIN", "ReduceSum": "OP_ADD",
          "ReduceMax": "OP_MAX", "ReduceMin": "OP_MIN"}


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

    # ------------------------------------------------------------- buffers
    def alloc(self, kind: str) -> str:
        pool = {FULL: "wf", COL: "wc", ROW: "wr", "mask": "wm"}[kind]
        if self.free[pool]:
            return self.free[pool].pop()
        name = f"{pool}{self.count[pool]}"
        self.count[pool] += 1
        return name

    def release(self, ref: Ref) -> None:
        pool = ref.expr[:2]
        if pool in self.free and ref.expr not in self.free[pool]:
            self.free[pool].append(ref.expr)

    def ref(self, v: Value) -> Ref:
        return self.refs[id(self.s.storage(v))]

    # ------------------------------------------------------------- entry
    def run(self) -> Lowered:
        s = self.s
        for io in s.inputs:
            v = s.storage(io.local)
            if id(v) in self.refs:
                continue
            lowp = io.dtype != s.compute
            if io.dtype == BITS:  # raw words, used in place
                if io.kind not in (FULL, PARTIAL):
                    raise Unsupported(f"int32 input {io.value.name} broadcast ({io.kind})")
                self.refs[id(v)] = Ref(FULL, f"xi{io.index}")
            elif io.kind in (FULL, PARTIAL):
                if lowp:
                    buf = self.alloc(FULL)
                    self.prologue.append(f"Cast({buf}, xi{io.index}, RoundMode::CAST_NONE, n);")
                    self.refs[id(v)] = Ref(FULL, buf)
                else:
                    self.refs[id(v)] = Ref(FULL, f"xi{io.index}")
            elif io.kind == COL:
                if lowp:
                    buf = self.alloc(COL)
                    self.prologue.append(
                        f"Cast({buf}, xi{io.index}, RoundMode::CAST_NONE, rows);")
                    self.refs[id(v)] = Ref(COL, buf)
                else:
                    self.refs[id(v)] = Ref(COL, f"xi{io.index}")
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
            inplace_ok = n.op not in ("Pow", "Sign")  # they read x after writing dst
            if inplace_ok:
                for r in dead:
                    self.release(r)
            if kind == SCALAR:
                dst = Ref(SCALAR, f"sv{self.nscalar}")
                self.nscalar += 1
            elif n.op in REDUCE_OPS and (s.col_reduce or s.row_chunks):
                dst = Ref(ROW if s.col_reduce else COL, f"ac{len(self.accumulators)}")
                self.accumulators.append((dst.expr, COL_REDUCE[n.op][1]))
            elif n.op in COMPARE_OPS or n.op in CLASSIFY_OPS:
                dst = Ref(FULL, self.alloc("mask"))
            elif id(out) in direct:
                dst = Ref(kind, f"yo{direct[id(out)]}")
            else:
                dst = Ref(kind, self.alloc(kind))
            self.refs[id(out)] = dst
            for r in dead:
                if r.expr[:2] in self.free and r.expr in self.free[r.expr[:2]]:
                    self.free[r.expr[:2]].remove(r.expr)
            self.body = self.final if id(n) in s.final else self.tile_body
            if id(n) in s.final and any(r.expr.startswith("sv") for r in operands):
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
                       self.final, self.final_epilogue, self.accumulators, self.row_blocks)

    def _direct_outputs(self) -> dict[int, int]:
        """Outputs whose producing step can write straight into the output queue tensor."""
        s, out = self.s, {}
        produced = {id(n.outputs[0]) for n in s.steps if id(n) not in s.final
                    and not (n.op in REDUCE_OPS and (s.col_reduce or s.row_chunks))
                    and n.op != "ReduceProd"}  # the scalar unit writes it, not the vector's
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
        elif io.dtype == DType.bool and src.expr.startswith("wm"):  # a mask: 1.0 where set
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
        op, b = n.op, self.body
        if dst.kind == SCALAR:
            if op in SCALAR_FN:
                expr = SCALAR_FN[op].format(a[0].expr)
            elif op in SCALAR_BIN:
                expr = SCALAR_BIN[op].format(a[0].expr, a[1].expr)
            elif op == "BroadcastTo":
                expr = a[0].expr
            elif op in ("Floor", "Ceil", "Trunc"):
                expr = f"std::{op.lower()}({a[0].expr})"
            elif op == "Round":
                expr = f"std::nearbyint({a[0].expr})"
            elif op == "Cast":
                expr = f"(float)({C_TYPE[n.outputs[0].dtype]})({a[0].expr})"
            else:
                raise Unsupported(f"{op} of scalars")
            b.append(f"float {dst.expr} = {expr};")
            return
        if op in REDUCE_OPS and dst.kind == ROW:  # over the rows: accumulate this tile's rows
            b.append(f"for (uint32_t i = 0; i < rows; ++i) "
                     f"{COL_REDUCE[op][0]}({dst.expr}, {dst.expr}, {a[0].row()}, cols);")
        elif op in REDUCE_OPS and self.s.row_chunks:  # this chunk of the row, into the total:
            # one scalar combination per chunk, between syncs with the vector unit
            if REDUCE_OPS[op] is not None:
                b.append(f"{REDUCE_OPS[op]}(red, {a[0].row('0')}, rw, cols);")
            b += self._to_scalar(a[0])
            if REDUCE_OPS[op] is None:
                b.append(self._product(a[0].row('0'), "red", "0"))
            b.append("{")
            b.append(f"    float l = {dst.expr}.GetValue(0), r = red.GetValue(0);")
            comb = {"ReduceSum": "l + r", "ReduceMax": "(std::isnan(l) || l > r) ? l : r",
                    "ReduceMin": "(std::isnan(l) || l < r) ? l : r", "ReduceProd": "l * r"}[op]
            b.append(f"    {dst.expr}.SetValue(0, CT({comb}));")
            b.append("}")
            b.append(sync("S", "V"))
        elif op in REDUCE_OPS and REDUCE_OPS[op] is None:  # a product: no instruction; the
            # scalar unit multiplies along each row, synced once before and once after
            b += self._to_scalar(a[0])
            b.append("for (uint32_t i = 0; i < rows; ++i) "
                     + self._product(a[0].row(), dst.expr, "i"))
            b.append(sync("S", "V"))
        elif op in REDUCE_OPS:  # whole rows to one value each, on the vector unit
            self.row_blocks = True
            b.append(f"RowReduce<{ROW_OP[op]}>({dst.expr}, {a[0].expr}, rows, cols);")
        elif op == "BroadcastTo":
            self._broadcast(dst, a[0])
        elif op in UNARY_OPS or op in TMP_UNARY_OPS:
            self._unary(op, dst, a[0])
        elif op in ROUND_OPS:
            b.append(f"Cast({dst.expr}, {self._as(a[0], dst.kind)}, RoundMode::{ROUND_OPS[op]}, "
                     f"{dst.count()});")
        elif op == "Cast":  # to fp16/bf16 and back: the rounding the graph asks for
            self.half_tmp = True
            t = C_TYPE[n.outputs[0].dtype]
            src = self._as(a[0], dst.kind)
            b.append(f"Cast(hh.ReinterpretCast<{t}>(), {src}, RoundMode::CAST_RINT, "
                     f"{dst.count()});")
            b.append(f"Cast({dst.expr}, hh.ReinterpretCast<{t}>(), RoundMode::CAST_NONE, "
                     f"{dst.count()});")
        elif op == "Pow":
            self._pow(dst, a[0], a[1])
        elif op in COMPARE_OPS:
            x, tx = self._full(a[0])
            y, ty = self._full(a[1])
            b.append(f"Compare({dst.expr}, {x}, {y}, CMPMODE::{COMPARE_OPS[op]}, n);")
            self._release_tmp(tx + ty)
        elif op in BITWISE_OPS and n.outputs[0].dtype == BITS:
            self._bitwise(BITWISE_OPS[op], dst, a)
        elif op in LOGICAL_OPS or op in BITWISE_OPS:  # bools as fp32 0/1: and = product, or
            #                                            = max, not = 1 - x
            xs, tmps = zip(*(self._numeric(r) for r in a), strict=True)
            if op == "LogicalNot":
                b += [f"Muls({dst.expr}, {xs[0]}, CT(-1.0f), n);",
                      f"Adds({dst.expr}, {dst.expr}, CT(1.0f), n);"]
            else:
                api = "Mul" if op in ("LogicalAnd", "BitwiseAnd") else "Max"
                b.append(f"{api}({dst.expr}, {xs[0]}, {xs[1]}, n);")
            self._release_tmp([t for ts in tmps for t in ts])
        elif op in CLASSIFY_OPS:
            x, tx = self._full(a[0])
            if op == "IsNan":  # NaN is the one value unequal to itself
                b.append(f"Compare({dst.expr}, {x}, {x}, CMPMODE::NE, n);")
                self._release_tmp(tx)
                return
            t, u = self.alloc(FULL), self.alloc(FULL)
            if op == "IsInf":
                b += [f"Abs({t}, {x}, n);", f"Duplicate({u}, CT(INFINITY), n);"]
            else:  # finite: x - x is 0 (NaN for NaN and +-inf)
                b += [f"Sub({t}, {x}, {x}, n);", f"Duplicate({u}, CT(0.0f), n);"]
            b.append(f"Compare({dst.expr}, {t}, {u}, CMPMODE::EQ, n);")
            self._release_tmp(tx + [Ref(FULL, t), Ref(FULL, u)])
        elif op == "Select":
            cond, held = a[0].expr, []
            if not cond.startswith("wm"):  # a bool held as 0/1: its mask is "!= 0"
                c, tc = self._full(a[0])
                cond, z = self.alloc("mask"), self.alloc(FULL)
                b += [f"Duplicate({z}, CT(0.0f), n);",
                      f"Compare({cond}, {c}, {z}, CMPMODE::NE, n);"]
                held = tc + [Ref(FULL, z), Ref(FULL, cond)]
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
        elif op == "Sign":  # 1 where x > 0, -1 where x < 0, else x itself (0, -0, NaN)
            x, tx = self._full(a[0])
            m, t = self.alloc("mask"), self.alloc(FULL)
            b += [f"Duplicate({t}, CT(0.0f), n);", f"Compare({m}, {x}, {t}, CMPMODE::LT, n);",
                  f"Duplicate({t}, CT(-1.0f), n);",
                  f"Select({dst.expr}, {m}, {t}, {x}, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);",
                  f"Duplicate({t}, CT(0.0f), n);", f"Compare({m}, {x}, {t}, CMPMODE::GT, n);",
                  f"Duplicate({t}, CT(1.0f), n);",
                  f"Select({dst.expr}, {m}, {t}, {dst.expr}, "
                  "SELMODE::VSEL_TENSOR_TENSOR_MODE, n);"]
            self._release_tmp(tx + [Ref(FULL, m), Ref(FULL, t)])
        elif op in BINARY_OPS:
            self._binary(op, dst, a[0], a[1])
        else:
            raise Unsupported(f"{op} not supported by codegen")
        b.append("PipeBarrier<PIPE_V>();")

    def _bitwise(self, api: str, dst: Ref, a: list[Ref]) -> None:
        """int32 words as twice as many int16 (And/Or take 16-bit integers; bits are bits)."""
        words, tmps = [], []
        for r in a:
            if r.kind == SCALAR and r.const is not None:
                t = Ref(FULL, self.alloc(FULL))
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
        return [sync("V", "S")] + ([sync("MTE2", "S")] if src.expr.startswith("xi") else [])

    def _numeric(self, x: Ref) -> tuple[str, list[Ref]]:
        """A bool operand as a whole tile of fp32 0/1 (a mask is expanded by Select)."""
        if not x.expr.startswith("wm"):
            return self._full(x)
        t = self.alloc(FULL)
        self.body += [f"Duplicate({t}, CT(1.0f), n);",
                      f"Select({t}, {x.expr}, {t}, CT(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);"]
        return t, [Ref(FULL, t)]

    def _full(self, x: Ref) -> tuple[str, list[Ref]]:
        """x as a whole tile (materialised into a scratch tile unless it is one)."""
        if x.kind == FULL:
            return x.expr, []
        t = Ref(FULL, self.alloc(FULL))
        self._broadcast(t, x)
        return t.expr, [t]

    def _release_tmp(self, refs: list[Ref]) -> None:
        for r in refs:
            self.release(r)

    def _unary(self, op: str, dst: Ref, x: Ref) -> None:
        src = self._as(x, dst.kind)
        if op == "Neg":
            self.body.append(f"Muls({dst.expr}, {src}, CT(-1.0f), {dst.count()});")
        elif op in TMP_UNARY_OPS:
            self.scalar_tmp = True
            self.body.append(f"{TMP_UNARY_OPS[op]}({dst.expr}, {src}, ht, {dst.count()});")
        else:
            self.body.append(f"{UNARY_OPS[op]}({dst.expr}, {src}, {dst.count()});")

    def _as(self, x: Ref, kind: str) -> str:
        if x.kind != kind:
            raise Unsupported(f"a {x.kind} operand where a {kind} one is needed")
        return x.expr

    def _broadcast(self, dst: Ref, x: Ref) -> None:
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

    def _pow(self, dst: Ref, x: Ref, e: Ref) -> None:
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

    def _scalar_form(self, op: str, x: str, s: Ref | str, x_first: bool, n: str,
                     dst: str) -> list[str] | None:
        sv = s.expr if isinstance(s, Ref) else s
        const = s.const if isinstance(s, Ref) else None
        if op in COMMUTATIVE_SCALAR:
            return [f"{COMMUTATIVE_SCALAR[op]}({dst}, {x}, CT({sv}), {n});"]
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

    def _binary(self, op: str, dst: Ref, a: Ref, b: Ref) -> None:
        api, body = BINARY_OPS[op], self.body
        kinds = (a.kind, b.kind)
        if a.kind == b.kind == dst.kind:
            body.append(f"{api}({dst.expr}, {a.expr}, {b.expr}, {dst.count()});")
            return
        if SCALAR in kinds and dst.kind in kinds:
            x, s, x_first = (a, b, True) if b.kind == SCALAR else (b, a, False)
            form = self._scalar_form(op, x.expr, s, x_first, dst.count(), dst.expr)
            if form is None:
                tmp = {FULL: "tf", ROW: "tr0", COL: "tc0"}[dst.kind]
                if tmp == "tf":  # a row of the scalar, then row by row
                    body += [f"Duplicate(tr0, CT({s.expr}), t_.ctp);", "PipeBarrier<PIPE_V>();"]
                    args = (x.row(), "tr0") if x_first else ("tr0", x.row())
                    body.append(f"for (uint32_t i = 0; i < rows; ++i) "
                                f"{api}({dst.row()}, {args[0]}, {args[1]}, cols);")
                    return
                body += [f"Duplicate({tmp}, CT({s.expr}), {dst.count()});",
                         "PipeBarrier<PIPE_V>();"]
                args = (x.expr, tmp) if x_first else (tmp, x.expr)
                body.append(f"{api}({dst.expr}, {args[0]}, {args[1]}, {dst.count()});")
            else:
                body += form
            return
        if dst.kind != FULL:
            raise Unsupported(f"{op} of {a.kind} and {b.kind} values")
        if COL in kinds and FULL in kinds and op in ROW_OP:  # each row against its value:
            # the column spread by Brcb, then strided whole-tile instructions
            self.row_blocks = True
            x, c = (a, b) if b.kind == COL else (b, a)
            body.append(f"ColOp<{ROW_OP[op]}, {'false' if x is a else 'true'}>({dst.expr}, "
                        f"{x.expr}, {c.expr}, rows);")
            return
        if COL in kinds and ROW in kinds:  # the column across the rows, then row by row
            self.row_blocks = True
            c, r = (a, b) if a.kind == COL else (b, a)
            body += [f"ColCopy({dst.expr}, {c.expr}, rows);", "PipeBarrier<PIPE_V>();"]
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
