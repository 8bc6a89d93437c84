"""A vector kernel's lowering: its schedule's steps over one tile of the loop space, by the
lowering engine (``codegen/lower.py``), into kernel IR with every UB buffer the kernel takes.

A tile holds ``rows`` rows of ``cols`` columns; a FULL buffer has a row pitch of ``t_.ctp``
elements (a whole number of UB blocks), so ``X[i * t_.ctp]`` is row i. What a vector kernel
adds to the engine: its inputs' tiles (low-precision ones cast into the compute type first),
outputs written straight into their queue's tile when a step can, stores, reductions over the
rows or in chunks of a row (running totals), a product along the row by the scalar unit, and
the steps that run once a reduction accumulated across tiles is complete (``finish``).
"""

from __future__ import annotations

import numpy as np

from graphkernel.codegen.barriers import place
from graphkernel.codegen.instructions import (
    BITS,
    INSTRUCTIONS,
    REDUCE_OPS,
    SCAN_RULES,
    Instruction,
)
from graphkernel.codegen.kernel_ir import (
    COL,
    FULL,
    PARTIAL,
    PIECE,
    ROW,
    ROW_FORMS,
    SCALAR,
    Buffer,
    Call,
    Instr,
    KernelIR,
    Kind,
    Linear,
    Operand,
    ScalarCode,
    arg_text,
    text,
)
from graphkernel.codegen.lower import C_TYPE, MASK, Lowerer, Ref, Space, flt, op
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.vector.schedule import Schedule, read_as_floats
from graphkernel.codegen.vector.tiling import align_elems
from graphkernel.ir import DType, Node

CT = "CT"  # the kernel's alias of its compute type
POOLS = {FULL: "wf", COL: "wc", ROW: "wr", MASK: "wm"}


def _tile(ctype: str) -> str:
    return f"t.rt * t.ctp * sizeof({ctype})"


def space(s: Schedule) -> Space:
    """The loop space of a vector kernel's tile."""
    blk, cs = s.target.block_bytes, s.compute.itemsize

    def pool(kind: str, k: int) -> Buffer:
        name = POOLS[kind]
        if kind == FULL:
            return Buffer(f"b{name}{k}", "a tile of an intermediate value", Kind.TILE, CT,
                          Linear(tile=cs), _tile(CT), tensor=f"{name}{k}")
        if kind == COL:
            return Buffer(f"b{name}{k}", "a value per row of the tile", Kind.COLUMN, CT,
                          Linear(row=cs, fixed=blk), f"AlignB(t.rt * sizeof({CT}))",
                          tensor=f"{name}{k}", in_finish=True)
        if kind == ROW:
            return Buffer(f"b{name}{k}", "a row of an intermediate value", Kind.ROW, CT,
                          Linear(col=cs), f"t.ctp * sizeof({CT})", tensor=f"{name}{k}",
                          in_finish=True)
        # rt * ctp / 8 bytes of bit mask; counted as a byte per element
        return Buffer(f"b{name}{k}", "a comparison's bit mask", Kind.MASK, "uint8_t",
                      Linear(tile=1), "t.rt * t.ctp / 8", tensor=f"{name}{k}")

    return Space(pitch="t_.ctp", counts={FULL: "n", ROW: "t_.ctp", COL: "rows"},
                 row_count="cols", pools=POOLS, compute=s.compute, pool_buffer=pool)


class VectorLowerer(Lowerer):
    def __init__(self, s: Schedule):
        last = _last_uses(s)
        super().__init__(space(s), s.steps, s.storage, s.layout, last)
        self.s = s
        self.tile_body = self.body
        self.prologue: list[Instr] = []
        self.epilogue: list[Instr] = []
        self.final: list[Instr] = []
        self.final_epilogue: list[Instr] = []
        self.second: list[Instr] = []  # a tile of the second pass (Schedule.second)
        self.second_epilogue: list[Instr] = []
        self.input_prologue: dict[int, list[Instr]] = {}  # id(loaded value) -> its casts
        self.accumulators: list[tuple[str, str]] = []
        self.loops: list[list[str]] = []  # the kernel's ScanLoopN helpers (C++ lines)
        self.direct: dict[int, int] = {}
        self.final_scalars: set[str] = set()  # scalars the final steps compute

    def run(self) -> KernelIR:
        s = self.s
        for io in s.inputs:
            before = len(self.prologue)
            self._input(io)
            local = io.local if io.local is not None else io.value
            self.input_prologue[id(s.storage(local))] = self.prologue[before:]
        for vid, c in s.scalars.items():
            self.refs[vid] = Ref(SCALAR, flt(c), c)
        self.direct = self._direct_outputs()
        for k, n in enumerate(s.steps):
            if id(s.storage(n.outputs[0])) != id(n.outputs[0]):
                continue  # an alias (BroadcastTo of a full tile)
            self.step(k, n, self._dst)
        for io in s.outputs:
            self._store(io)
        again = [i for vid in s.second_reads() for i in self.input_prologue.get(vid, [])]
        return KernelIR(self._buffers(), self.prologue + self.tile_body + self.epilogue,
                        self.final + self.final_epilogue, self.accumulators,
                        compute_type=C_TYPE[s.compute], loops=self.loops,
                        second=again + self.second + self.second_epilogue if s.second else [])

    # ------------------------------------------------------------- inputs and outputs
    def _input(self, io) -> None:
        s = self.s
        v = s.storage(io.local)
        if id(v) in self.refs or io.kind == PIECE:  # a piece: in its Concat's tile
            return
        lowp = io.dtype != s.compute
        if io.columns and any(io.columns[0] * size % s.target.ub_align_bytes
                              for size in (io.dtype.itemsize, s.compute.itemsize)):
            raise Unsupported(f"input {io.value.name} read at column {io.columns[0]}, which "
                              f"does not start on a {s.target.ub_align_bytes}-byte UB block",
                              about=(io.value,))
        loaded = f"xi{io.index}"
        if io.dtype == BITS:
            # int32 read as floats (an index from ArgMax/TopK compared with a row of
            # expert ids): converted on loading, a tile or one value per row (as int64)
            floats = read_as_floats(io.local)
            if io.kind not in (FULL, PARTIAL) and not (io.kind == COL and floats):
                raise Unsupported(f"int32 input {io.value.name} broadcast ({io.kind})",
                                  about=(io.value,))
            if floats:
                kind = COL if io.kind == COL else FULL
                buf = self.alloc(kind)
                self.call("Cast", buf, op(loaded), "RoundMode::CAST_NONE",
                          count=self.space.counts[kind], to=self.prologue)
                self.refs[id(v)] = self.held(kind, buf)
            else:  # raw words, used in place
                self.refs[id(v)] = Ref(FULL, loaded, store="xi")
        elif io.dtype == DType.int64 and io.kind not in (FULL, PARTIAL, COL):
            raise Unsupported(f"int64 input {io.value.name} broadcast ({io.kind})",
                              about=(io.value,))
        elif io.transpose is not None:  # loaded as it lies, gathered into the steps' order
            if lowp:
                raise Unsupported(f"input {io.value.name}: a transpose gathered in UB of "
                                  f"{io.dtype} data in a {s.compute} kernel", about=(io.value,))
            buf = self.alloc(FULL)
            self._table(io, to_gm=False)
            self.call("Gather", buf, op(loaded), op(f"gti{io.index}"), "(uint32_t)0",
                      count="rows * t_.ctp", to=self.prologue)
            self.refs[id(v)] = self.held(FULL, buf)
        elif io.kind in (FULL, PARTIAL, COL):
            kind = COL if io.kind == COL else FULL
            if lowp:
                buf = self.alloc(kind)
                self._widen(buf, loaded, io.dtype, self.space.counts[kind])
                self.refs[id(v)] = self.held(kind, buf)
            else:
                self.refs[id(v)] = Ref(kind, loaded, store="xi")
        elif io.kind == ROW:
            self.refs[id(v)] = Ref(ROW, f"ri{io.index}")
        else:
            self.refs[id(v)] = Ref(SCALAR, f"s{io.index}")

    def _direct_outputs(self) -> dict[int, int]:
        """Outputs whose producing step can write straight into the output queue tensor."""
        s, out = self.s, {}
        produced = {id(n.outputs[0]) for n in s.steps if id(n) not in s.final
                    and not (n.op in REDUCE_OPS and (
                        ((s.col_reduce or s.row_chunks) and id(n) not in s.row_reduces)
                        or INSTRUCTIONS[n.op].api is None))}  # a product: the scalar unit
        #                                                       writes it
        for io in s.outputs:
            v = s.storage(io.value)
            if io.transpose is None and (
                    io.dtype in (s.compute, BITS) and (io.dtype == BITS) == (v.dtype == BITS)
                    and id(v) in produced and id(v) not in out
                    and s.layout(v) == io.kind and id(v) not in self.refs):
                out[id(v)] = io.index
        return out

    def _store(self, io) -> None:
        s, direct = self.s, self.direct
        if io.pieces:  # a Concat: each operand into its own queue tensor, stored to its block
            for p, (x, _, _) in enumerate(io.pieces):
                src = op(self.same(self.refs[id(s.storage(x))], FULL))
                dst = f"yc{io.index}_{p}"
                if io.dtype == s.compute:
                    self.call("Muls", dst, src, "CT(1.0f)", count="n", to=self.epilogue)
                else:
                    self.call("Cast", dst, src, "RoundMode::CAST_RINT", count="n",
                              to=self.epilogue)
            return
        v = s.storage(io.value)
        if direct.get(id(v)) == io.index:
            return
        src = self.refs[id(v)]
        if io.transpose is not None:
            self._gather_store(io, src)
            return
        count = self.space.counts[io.kind]
        if src.kind != io.kind:
            raise Unsupported(f"output {io.value.name}: a {src.kind} value stored as {io.kind}",
                              about=(io.value,))
        late = io.kind == ROW or (s.row_chunks and io.kind == COL)
        to = self.final_epilogue if late else self.second_epilogue if \
            io.index in s.second_outputs() else self.epilogue
        y = f"yo{io.index}"
        if io.dtype in (BITS, DType.int64) and v.dtype != io.dtype:  # floats truncated
            self.call("Cast", y, op(src.expr), "RoundMode::CAST_TRUNC", count=count, to=to)
        elif io.dtype == BITS:  # x | x copies the words
            x = op(src.expr, view="int16_t")
            self.call("Or", op(y, view="int16_t"), x, x, count="2 * n", to=to)
        elif io.dtype == DType.bool and src.store == POOLS[MASK]:  # a mask: 1.0 where set
            t = self.alloc(FULL)
            self.call("Duplicate", t, "CT(1.0f)", count="n", to=to)
            self.call("Select", t, op(src.expr), op(t), "CT(0.0f)",
                      "SELMODE::VSEL_TENSOR_SCALAR_MODE", count="n", to=to)
            self._narrow_bool(y, t, "n", to)
        elif io.dtype == DType.bool:  # 0/1 in the compute type
            self._narrow_bool(y, src.expr, count, to)
        elif io.dtype == s.compute:
            self.call("Muls", y, op(src.expr), "CT(1.0f)", count=count, to=to)
        else:
            self.call("Cast", y, op(src.expr), "RoundMode::CAST_RINT", count=count, to=to)

    def _gather_store(self, io, src: Ref) -> None:
        """An output transposed in UB (the whole value is the kernel's one tile): a table of
        byte offsets, built by the scalar unit, places each element of the tile at its
        place in the output's tile (row pitch ``t_.ctp``, as every stored tile), and one
        Gather moves them into the output's queue tensor."""
        s = self.s
        if src.kind != FULL or io.dtype != s.compute:
            raise Unsupported(f"output {io.value.name}: a transpose of a {src.kind} value "
                              f"of {io.dtype}", about=(io.value,))
        self._table(io, to_gm=True)
        self.call("Gather", f"yo{io.index}", op(src.expr), op(f"gto{io.index}"), "(uint32_t)0",
                  count="rows * t_.ctp", to=self.epilogue)

    def _table(self, io, to_gm: bool) -> None:
        """The scalar unit's loop filling the table (``gto<index>`` of an output,
        ``gti<index>`` of an input) of an in-UB transpose.
        Element i of the steps' value (of the map's shape) sits at place i of the tile; its
        place in GM is p = sum(i_j * strides[j]). A place q of a tile (row q / L, column
        q % L) is at q / L * t_.ctp + q % L in UB. An output's table gives each output
        place the byte offset of its element in the value's tile; an input's gives each
        place of the value's tile the byte offset of its element in the loaded tile."""
        s = self.s
        shape, strides = io.transpose
        n, L = int(np.prod(shape, dtype=np.int64)), int(s.L)
        tab = f"gt{'o' if to_gm else 'i'}{io.index}"
        walk = [f"p += r % {d}u * {st}u; r /= {d}u;"
                for d, st in zip(reversed(shape), reversed(strides), strict=True)]
        here, there = f"i / {L}u * t_.ctp + i % {L}u", f"p / {L}u * t_.ctp + p % {L}u"
        at, off = (there, here) if to_gm else (here, there)
        lines = ["{  // the in-UB transpose's table: a place of the tile -> the byte offset "
                 "it reads"]
        if L % align_elems(s):  # padded rows: the pad places read element 0
            lines.append(f"    for (uint32_t q = 0; q < rows * t_.ctp; ++q) {tab}.SetValue(q, 0u);")
        lines += [f"    for (uint32_t i = 0; i < {n}u; ++i) {{",
                  "        uint32_t r = i, p = 0;",
                  *(f"        {w}" for w in walk),
                  f"        {tab}.SetValue({at}, ({off}) * (uint32_t)sizeof(CT));",
                  "    }", "}"]
        code = ScalarCode(tuple(lines), frozenset(), frozenset([tab]))
        (self.body if to_gm else self.prologue).append(code)

    def _widen(self, dst: str, loaded: str, dtype: DType, count: str) -> None:
        """A loaded tile of ``dtype`` into the compute type. The vector unit casts bytes
        (bool) to half only, so bools for a fp32 kernel go through the 16-bit scratch."""
        if dtype == DType.bool and self.s.compute != DType.float16:
            self.uses_hh.add("bool")
            self.call("Cast", "hh", op(loaded), "RoundMode::CAST_NONE", count=count,
                      to=self.prologue)
            loaded = "hh"
        # (int64 -> float32 rounds: the vector unit's cast of it takes a rounding mode only)
        mode = "CAST_RINT" if dtype == DType.int64 else "CAST_NONE"
        self.call("Cast", dst, op(loaded), f"RoundMode::{mode}", count=count,
                  to=self.prologue)

    def _narrow_bool(self, y: str, src: str, count: str, to: list[Instr]) -> None:
        """0/1 in the compute type stored as bytes. The vector unit casts to bytes from half
        only, so a fp32 kernel's bools go through the 16-bit scratch (0 and 1 are exact)."""
        if self.s.compute != DType.float16:
            self.uses_hh.add("bool")
            self.call("Cast", "hh", op(src), "RoundMode::CAST_NONE", count=count, to=to)
            src = "hh"
        self.call("Cast", y, op(src), "RoundMode::CAST_NONE", count=count, to=to)

    # ------------------------------------------------------------- the steps
    def _dst(self, n: Node, rule: Instruction | None, kind: str) -> Ref:
        s, out = self.s, n.outputs[0]
        if kind == SCALAR:
            dst = self.scalar_dst()
            if id(n) in s.final:  # (computed and used once the reductions are complete)
                self.final_scalars.add(dst.expr)
            return dst
        if rule is not None and rule.form == "reduce" and (s.col_reduce or s.row_chunks) \
                and id(n) not in s.row_reduces:  # (a row within the tile: as any kernel's)
            dst = Ref(ROW if s.col_reduce else COL, f"ac{len(self.accumulators)}")
            self.accumulators.append((dst.expr, rule.identity))
            return dst
        if rule is not None and rule.makes_mask:
            return self.scratch(MASK)
        if id(out) in self.direct:
            return Ref(kind, f"yo{self.direct[id(out)]}")
        return self.scratch(kind)

    def enter(self, n: Node, operands: list[Ref]) -> None:
        final = id(n) in self.s.final
        self.body = self.final if final else self.second if id(n) in self.s.second else \
            self.tile_body
        if final and any(r.store == "sv" and r.expr not in self.final_scalars
                         for r in operands):
            raise Unsupported("a scalar computed in the tile loop used after it")

    def emit(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        if id(n) in self.s.late_reduces:
            self._late_reduce(n, dst, a[0])
            return
        super().emit(n, dst, a)

    def _late_reduce(self, n: Node, dst: Ref, x: Ref) -> None:
        """A final step reducing the column tile's reduced row (the whole row: ``cols``
        elements; the padding up to ``t_.ctp`` is left out) to one value, read by the scalar
        unit as the scalar ``dst`` of the steps after it (the syncs between the vector and
        the scalar unit: codegen/barriers.py)."""
        rule = INSTRUCTIONS[n.op]
        if x.kind != ROW or dst.kind != SCALAR:
            raise Unsupported(f"{n.op} of a {x.kind} value to a {dst.kind} one", node=n)
        if rule.api is not None:
            self.call(rule.api, "red", op(x.expr), op("rw", work=True), count="cols")
        else:  # a product: the scalar unit multiplies along the row
            self.scalar_code([_product(op(x.expr), "red", "0")], [x.expr], ["red"])
        self.scalar_code([f"float {dst.expr} = (float)red.GetValue(0);"], ["red"], [])

    def reduce_mode(self, rule: Instruction, dst: Ref, x: Ref) -> bool:
        if dst.kind == ROW:  # over the rows: accumulate this tile's rows
            self.call(rule.accumulate, dst.expr, op(dst.expr), self.row(x), count="cols",
                      each_row=True)
            return True
        if self.s.row_chunks:  # this chunk of the row, into the total: one scalar
            # combination per chunk (the syncs with the vector unit: codegen/barriers.py)
            if rule.api is not None:
                self.call(rule.api, "red", self.row(x, "0"), op("rw", work=True), count="cols")
            else:
                self.scalar_code([_product(self.row(x, "0"), "red", "0")], [x.expr], ["red"])
            self.scalar_code(["{", f"    float l = {dst.expr}.GetValue(0), r = red.GetValue(0);",
                              f"    {dst.expr}.SetValue(0, CT({rule.fold}));", "}"],
                             [dst.expr, "red"], [dst.expr])
            return True
        if rule.api is None:  # a product: no instruction; the scalar unit multiplies along
            # each row
            self.scalar_code(["for (uint32_t i = 0; i < rows; ++i) "
                              + _product(self.row(x), dst.expr, "i")], [x.expr], [dst.expr])
            return True
        return False

    def scan(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """A Scan down the tile's rows (the scanned axis): row i of dst is the running value
        combined with row i of the operands; the running value is a row of the kernel,
        started at the rule's identity for each column tile of each block and left at the
        tile's last row for the next tile (a ``ScanRows``/``ScanLinear`` of the template)."""
        if not self.s.col_reduce:
            raise Unsupported(f"{n.op} in a kernel whose rows are not the scanned axis",
                              node=n)
        if n.attrs["combine"] == "loop":
            self.loop(n, dst, a)
            return
        code, identity = SCAN_RULES[n.attrs["combine"]]
        acc = f"ac{len(self.accumulators)}"
        self.accumulators.append((acc, identity))
        srcs = [op(self.same(r, FULL)) for r in a]
        if code is None:  # h[i] = a[i] * h[i-1] + b[i]
            self.call("ScanLinear", op(dst.expr), *srcs, op(acc, work=True), "rows", "cols")
        else:
            self.call("ScanRows", op(dst.expr), *srcs, op(acc, work=True), "rows", "cols",
                      template=f"<{code}>")

    def loop(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """A Scan running a step body down the tile's rows (``combine="loop"``): a helper of
        the kernel (``ScanLoopN``) that, at the scanned axis's first tile, runs the first
        step's own work (``first``) or takes the states from the first row of their
        operands, then for each row runs the body's ops on rows
        (the states and each op's result a row of the kernel, the operands' row i), writes
        the output's row i and copies the new states; barriers as ``place`` puts them
        between the row ops, and one closing each step, so every step sees the one before."""
        at = n.attrs
        k, nin = len(at["states"]), len(a)
        temps = max(len(at["body"]), len(at["first"]))  # (the first step's rows are reused)
        names = [f"ac{len(self.accumulators) + j}" for j in range(k + temps)]
        self.accumulators += [(x, "0.0f") for x in names]
        rows: list[bool] = []  # operand j is a whole tile (row i read), else one row
        for r in a:
            if r.kind not in (FULL, ROW):
                raise Unsupported(f"a {r.kind} operand of a loop", node=n)
            rows.append(r.kind == FULL)

        def slot(x: int) -> Operand:
            if x < k:
                return op(f"w{x}")
            if x < k + nin:
                j = x - k
                return op(f"x{j}", "o" if rows[j] else "")
            return op(f"w{x - nin}")

        def step(ops_: list[str], args_: list[list[int]], keep: list[int], row: int
                 ) -> list[Instr]:
            body: list[Instr] = []
            for j, (name, args) in enumerate(zip(ops_, args_, strict=True)):
                d, srcs = op(f"w{k + j}"), [slot(x) for x in args]
                if name == "Neg":
                    body.append(Call("Muls", d, (srcs[0], "CT(-1.0f)"), "cols"))
                else:
                    body.append(Call(INSTRUCTIONS[name].api, d, tuple(srcs), "cols"))
            body.append(Call("Muls", op("y", "o"), (slot(row), "CT(1.0f)"), "cols"))
            for j, x in enumerate(keep):
                if x < k:
                    raise Unsupported("a loop state that takes a state's old value", node=n)
                body.append(Call("Muls", op(f"w{j}"), (slot(x), "CT(1.0f)"), "cols"))
            return body

        name = f"ScanLoop{len(self.loops)}"
        params = ", ".join(["const LocalTensor<CT>& y",
                            *(f"const LocalTensor<CT>& x{j}" for j in range(nin)),
                            *(f"const LocalTensor<CT>& w{j}" for j in range(len(names))),
                            "uint32_t rows", "uint32_t cols"])
        lines = [f"__aicore__ inline void {name}({params}) {{"]
        if at["first"]:  # the first position's own work leaves the states
            lines += ["    uint32_t i0 = 0;", "    if (r0_ == 0) {  // the first step's own work",
                      "        const uint32_t o = 0;",
                      *("        " + x for x in text(place(step(
                          at["first"], at["first_args"], at["first_states"],
                          at["first_out"])))), "        i0 = 1;", "    }"]
        else:
            start = [Call("Muls", op(f"w{j}"), (op(f"x{j}"), "CT(1.0f)"), "cols")
                     for j in range(k)]
            lines += ["    const uint32_t i0 = 0;",
                      "    if (r0_ == 0) {  // the first tile: the states from their operands",
                      *("        " + x for x in text(place(start))), "    }"]
        lines += ["    for (uint32_t i = i0; i < rows; ++i) {",
                  "        const uint32_t o = i * t_.ctp;",
                  *("        " + x for x in text(place(step(
                      at["body"], at["args"], at["states"], at["out"])))), "    }", "}"]
        self.loops.append(lines)
        srcs = [op(self.same(r, r.kind)) for r in a]
        self.call(name, op(dst.expr), *srcs, *(op(x, work=True) for x in names), "rows",
                  "cols")

    def concat(self, n: Node, dst: Ref, a: list[Ref]) -> None:
        """A Concat along the last axis of column values: each piece's columns copied to its
        own columns of every row of dst (one masked copy per row strip when both ends start
        on a UB block). A piece that starts off a block (a narrow head's rotary halves: 2 of
        16 columns) moves lanes, which no vector instruction does at an unaligned address:
        the scalar unit copies it element by element (correct, slow; wide heads keep the
        vector copy)."""
        s = self.s
        at = s.cols.get(id(n.outputs[0]), (0, 0, 0))[0]
        size, blk = s.compute.itemsize, s.target.ub_align_bytes
        for x, r in zip(n.inputs, a, strict=True):
            off, width, _ = s.cols[id(x)]
            src = self.same(r, FULL)
            if (off * size) % blk or (at * size) % blk:
                self.scalar_code([f"for (uint32_t i = 0; i < rows; ++i) for (uint32_t j = 0; "
                                  f"j < {width}; ++j) {dst.expr}.SetValue(i * t_.ctp + {at} + "
                                  f"j, {src}.GetValue(i * t_.ctp + {off} + j));"],
                                 [src, dst.expr], [dst.expr])
            else:
                self.call("ColsCopy", op(dst.expr, str(at)), op(src, str(off)), "rows",
                          str(width))
            at += width

    # ------------------------------------------------------------- the buffers
    def _buffers(self) -> list[Buffer]:
        """Every UB buffer of the kernel, in ``InitBuffer`` order: the inputs', the outputs',
        the pools', the scratch rows and column, a reduction's, the row blocks of the
        whole-row forms, the API work spaces, the running reductions."""
        s = self.s
        blk, cs = s.target.block_bytes, s.compute.itemsize
        out: list[Buffer] = []
        depth = 1 if s.single_tile else 2  # (one tile: nothing to overlap its copies with)

        def tile(name, role, kind, depth, ctype, size, tensor="", finish=False):
            out.append(Buffer(name, role, kind, ctype, Linear(tile=size), _tile(ctype), depth,
                              tensor, finish))

        def column(name, role, kind, depth, ctype, size, tensor="", finish=False):
            # rt values rounded up to a block: a block of slack per slot
            out.append(Buffer(name, role, kind, ctype, Linear(row=size, fixed=blk),
                              f"AlignB(t.rt * sizeof({ctype}))", depth, tensor, finish))

        def rowvec(name, role, kind, depth, ctype, size, tensor="", finish=False):
            out.append(Buffer(name, role, kind, ctype, Linear(col=size),
                              f"t.ctp * sizeof({ctype})", depth, tensor, finish))

        def block(name, role, kind, depth, ctype, tensor="", finish=False):
            out.append(Buffer(name, role, kind, ctype, Linear(fixed=blk), str(blk), depth,
                              tensor, finish))

        for io in s.inputs:
            t, i, size = C_TYPE[io.dtype], io.index, io.dtype.itemsize
            if io.table:  # loaded once per core: one slot, rt + R rows (vector/resident.py)
                r = io.table
                out.append(Buffer(f"qt{i}", f"input {i}, a table of {r} rows (resident)",
                                  Kind.TABLE, t, Linear(tile=size, col=r * size),
                                  f"(t.rt + {r}) * t.ctp * sizeof({t})", 1, f"xi{i}"))
            elif io.kind in (FULL, PARTIAL):
                tile(f"qi{i}", f"input {i} tiles", Kind.QUEUE_IN, depth, t, size, f"xi{i}")
                if io.transpose is not None:
                    tile(f"bgti{i}", f"input {i}'s in-UB transpose table (byte offsets)",
                         Kind.TILE, 1, "uint32_t", 4, f"gti{i}")
            elif io.kind == COL:
                column(f"qi{i}", f"input {i} (a value per row)", Kind.QUEUE_IN, depth, t, size,
                       f"xi{i}")
            elif io.kind == ROW:
                rowvec(f"bri{i}", f"input {i} (a row broadcast over the rows)", Kind.ROW, 1, CT,
                       cs, f"ri{i}", True)
                if io.dtype != s.compute:
                    rowvec(f"bsi{i}", f"input {i}'s row as stored, before its cast", Kind.ROW,
                           1, t, size)
                if io.dtype == DType.bool and s.compute != DType.float16:
                    # bytes cast to half only: the row passes through half to the compute type
                    rowvec(f"bhi{i}", f"input {i}'s row in half, between its bytes and the "
                           "compute type", Kind.ROW, 1, "half", 2)
        for io in s.outputs:
            t, i, size = C_TYPE[io.dtype], io.index, io.dtype.itemsize
            if io.pieces:
                for k in range(len(io.pieces)):
                    tile(f"qc{i}_{k}", f"output {i}, Concat operand {k}", Kind.QUEUE_OUT, depth,
                         t, size, f"yc{i}_{k}")
            elif io.kind == FULL:
                tile(f"qo{i}", f"output {i} tiles", Kind.QUEUE_OUT, depth, t, size, f"yo{i}")
                if io.transpose is not None:
                    tile(f"bgto{i}", f"output {i}'s in-UB transpose table (byte offsets)",
                         Kind.TILE, 1, "uint32_t", 4, f"gto{i}")
            elif io.kind == ROW:
                rowvec(f"qo{i}", f"output {i} (a row)", Kind.QUEUE_OUT, depth, t, size, f"yo{i}")
            elif s.row_chunks:
                block(f"qo{i}", f"output {i} (one value per row, a row at a time)",
                      Kind.QUEUE_OUT, depth, t, f"yo{i}")
            else:
                column(f"qo{i}", f"output {i} (a value per row)", Kind.QUEUE_OUT, depth, t, size,
                       f"yo{i}")
        out += self.pool_buffers()
        rowvec("btr0", "row scratch", Kind.ROW, 1, CT, cs, "tr0", True)
        rowvec("btr1", "row scratch", Kind.ROW, 1, CT, cs, "tr1", True)
        column("btc0", "column scratch", Kind.COLUMN, 1, CT, cs, "tc0", True)
        if s.reduce or s.late_reduces:
            block("bred", "a reduction's result", Kind.BLOCK, 1, CT, "red", bool(s.late_reduces))
        if s.reduce or s.whole_row_tiles:
            rowvec("brw", "a reduction's work row", Kind.ROW, 1, CT, cs, "rw",
                   bool(s.late_reduces))
        if any(c.api in ROW_FORMS for c in self._calls()):
            tg = s.target
            bpr = tg.blocks_per_repeat
            # a block per row, in whole Brcb repeats: at most rt blocks + a repeat
            out.append(Buffer("btb", "a block per row (Brcb spreads, row-reduce gathers)",
                              Kind.BLOCKS, CT, Linear(row=blk, fixed=tg.repeat_bytes),
                              f"(t.rt + {bpr - 1}) / {bpr} * {tg.repeat_bytes}"))
        if self.uses_ht:  # sized for floats, handed to the high-level ops as raw bytes
            out.append(Buffer("bht", "the high-level ops' temporary space", Kind.SCRATCH,
                              "uint8_t", Linear(tile=4), "t.rt * t.ctp * sizeof(float)",
                              tensor="ht", in_finish=True))
        if self.uses_hh:
            role = {"round": "a rounding cast's 16-bit temporary", "bool": "bools' 16-bit way "
                    "between bytes and the compute type"}
            tile("bhh", "; ".join(role[k] for k in sorted(self.uses_hh, reverse=True)),
                 Kind.SCRATCH, 1, "half", 2, "hh", True)
        if self.uses_hf:
            tile("bhf", "a fp16 rounding's fp32 temporary", Kind.SCRATCH, 1, "float", 4, "hf",
                 True)
        for acc, _ in self.accumulators:
            if s.row_chunks:
                block(f"b{acc}", "a running reduction", Kind.BLOCK, 1, CT, acc, True)
            else:
                rowvec(f"b{acc}", "running reductions of a column tile", Kind.ROW, 1, CT, cs,
                       acc, True)
        return out

    def _calls(self) -> list[Call]:
        return [i for i in (*self.prologue, *self.tile_body, *self.epilogue, *self.final,
                            *self.final_epilogue, *self.second, *self.second_epilogue)
                if isinstance(i, Call)]


def _last_uses(s: Schedule) -> dict[int, int]:
    last = {}
    for k, n in enumerate(s.steps):
        for v in n.inputs:
            last[id(s.storage(v))] = k
    for io in s.outputs:
        for v in [x for x, _, _ in io.pieces] or [io.value]:
            last[id(s.storage(v))] = len(s.steps)
    return last


def _product(row, dst: str, at: str) -> str:
    """The product of a row's cols elements, by the scalar unit, into dst[at]."""
    return (f"{{ float p = 1.0f; for (uint32_t j = 0; j < cols; ++j) p *= (float)"
            f"{arg_text(row)}.GetValue(j); {dst}.SetValue({at}, CT(p)); }}")


def lower(s: Schedule) -> KernelIR:
    """The kernel IR of the vector kernel ``s``."""
    return VectorLowerer(s).run()
