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
- ``col``: a value per row of the tile (``baseM`` fp32), computed by a reduction along N.

A reduction along N (ReduceSum/ReduceMax/ReduceMin of the product's last axis: LayerNorm,
RMSNorm, softmax) needs each row whole in the tile: such an epilogue sets ``rows`` and the
schedule tiles with ``singleCoreN = N`` and ``baseN >= N`` (codegen/cube/tiling.py), so a
base tile holds ``rows`` complete rows. The reductions and the per-row operations are the
whole-row forms the vector kernels use (``RowReduce``, ``ColOp``, ``ColCopy`` of
templates/row_forms.j2, called on the kernel's ``R`` object).

Each op is one call of the vector instruction table (codegen/instructions.py): ``unary``
rules over the tile, ``binary`` rules tile∘tile, tile∘row (one call per row) and tile∘scalar
(the scalar form where it is exact, else the scalar spread by ``Duplicate``), a ``Pow`` by a
small constant exponent as products, a ``Cast`` to fp32 as an alias and to fp16/bf16 as the
rounding it asks for. Views that keep the last axis are aliases. Anything else is refused
(the kernel is then split into a cube kernel and a vector one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel import symbolic
from graphkernel.codegen import barriers
from graphkernel.codegen.buffers import Buffer, BufferPlan, Linear
from graphkernel.codegen.instructions import INSTRUCTIONS, REDUCE_OPS, unary_line
from graphkernel.codegen.kernel_ir import Kind
from graphkernel.codegen.lower import C_TYPE, flt
from graphkernel.codegen.refusal import Unsupported
from graphkernel.ir import Dim, DType, Node, Value
from graphkernel.opdefs.reduce import reduce_axes
from graphkernel.ops import VIEW_OPS
from graphkernel.symbolic import eq

TILE, ROW, SCALAR, COL = "tile", "row", "scalar", "col"
COUNT = {TILE: "n", COL: "rows"}  # the element count of a value's calls
FLOAT_TYPES = (DType.float16, DType.bfloat16, DType.float32)


@dataclass
class EpilogueInput:
    index: int                   # the kernel input
    layout: str                  # tile, row or scalar
    dtype: DType
    strides: tuple[Dim, ...] = ()  # tile, row: element stride per output batch axis (0:
    #                                broadcast)


@dataclass
class EpilogueOutput:
    index: int
    dtype: DType
    expr: str                    # the fp32 tile holding it


@dataclass
class Epilogue:
    inputs: list[EpilogueInput]
    outputs: list[EpilogueOutput]
    body: list[str]              # C++ statements per tile (after the loads)
    tiles: int                   # fp32 scratch tiles (the pool)
    ht: bool = False             # the math library's scratch tile
    hh: bool = False             # the 16-bit scratch of a rounding Cast
    ops: list[str] = field(default_factory=list)
    batch: tuple[Dim, ...] = ()  # the batch axes the inputs' strides run over: the
    #                              product's, or a view's that splits or merges them
    cols: int = 0                # fp32 scratch columns (a value per row of the tile)
    rows: bool = False           # reduces along N: a base tile must hold whole rows

    def plan(self, itype: dict[int, str], otype: dict[int, str], block: int,
             repeat: int = 256) -> BufferPlan:
        """The kernel's UB buffers (codegen/buffers.py's records) for a base tile of ``rt =
        baseM`` rows of ``ctp = baseN`` columns: the C tile, the pool, the scratches, the
        loaded tiles and rows (one slot each) and their fp32 copies, the stored tiles, and
        for a reduction along N the columns, a block per row (``btb``) and a reduction's work
        row (``brw``); a block of slack. The tiling's UB bound and the simulator's check both
        read it."""
        out: list[Buffer] = []

        def buf(name, role, pos, ctype, size, row=False, local=""):
            lin = Linear(col=size) if row else Linear(tile=size)
            init = f"{'bN' if row else 'n'} * sizeof({ctype})"
            kind = {"VECIN": Kind.QUEUE_IN, "VECOUT": Kind.QUEUE_OUT}.get(
                pos, Kind.ROW if row else Kind.TILE)
            out.append(Buffer(name, role, kind, ctype, lin, init, 1, local))

        buf("bc", "the product's base tile (fp32, from GetTensorC)", "VECCALC", "float", 4,
            local="c")
        for k in range(self.tiles):
            buf(f"bw{k}", "a tile of an intermediate value", "VECCALC", "float", 4, local=f"w{k}")
        if self.ht:
            buf("bht", "the high-level ops' temporary space", "VECCALC", "uint8_t", 4,
                local="ht")
        if self.hh:
            buf("bhh", "a rounding cast's 16-bit temporary", "VECCALC", "uint8_t", 2,
                local="hh")
        for i in self.inputs:
            if i.layout == SCALAR:
                continue
            row, ct = i.layout == ROW, itype[i.index]
            buf(f"qi{i.index}", f"input {i.index} ({i.layout})", "VECIN", ct, i.dtype.itemsize,
                row)
            if ct != "float":
                buf(f"bx{i.index}", f"input {i.index} in fp32", "VECCALC", "float", 4, row)
        for o in self.outputs:
            buf(f"qo{o.index}", f"output {o.index} tiles", "VECOUT", otype[o.index],
                o.dtype.itemsize)
        for k in range(self.cols):  # baseM fp32 values: a multiple of 16, whole blocks
            out.append(Buffer(f"bwc{k}", "a value per row of the tile", Kind.COLUMN, "float",
                              Linear(row=4), "bM * sizeof(float)", 1, f"wc{k}"))
        if self.rows:
            per = repeat // block  # Brcb's blocks per repeat: whole repeats of row blocks
            out.append(Buffer("btb", "a block per row (Brcb spreads, row-reduce gathers)",
                              Kind.BLOCKS, "float", Linear(row=block, fixed=repeat),
                              f"(bM + {per - 1}) / {per} * {repeat}"))
            buf("brw", "a reduction's work row", "VECCALC", "float", 4, row=True)
        return BufferPlan(tuple(out), Linear(fixed=block), "float")


@dataclass
class _Ref:
    kind: str
    expr: str
    const: float | None = None


ROW_REDUCTIONS = ("ReduceSum", "ReduceMax", "ReduceMin")  # the whole-row forms (RowReduce)


def reduces_along(n: Node, last: Dim) -> bool:
    """``n`` is a reduction the epilogue runs: a sum, maximum or minimum of the last axis
    alone of a value whose last axis is ``last`` (the product's N)."""
    shape = tuple(n.inputs[0].type.shape) if n.inputs else ()
    return (n.op in ROW_REDUCTIONS and bool(shape) and eq(shape[-1], last)
            and reduce_axes(len(shape), n.attrs.get("axis")) == [len(shape) - 1])


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



class _Builder:
    def __init__(self, product: Value, batch, M, N, ins: list[Value], outs: list[Value],
                 steps: list[Node]):
        self.product, self.batch, self.M, self.N = product, batch, M, N
        self.numel = symbolic.numel(product.type.shape)
        self.ins, self.outs, self.steps = ins, outs, steps
        self.refs: dict[int, _Ref] = {id(product): _Ref(TILE, "c")}
        self.ebatch: tuple[Dim, ...] = tuple(batch)  # see Epilogue.batch
        self.regrouped: Node | None = None  # a view regrouping them after an input was read
        self.body: list[str] = []
        self.free: list[str] = []
        self.free_cols: list[str] = []
        self.tiles = 0
        self.cols = 0
        self.shapes: dict[int, tuple[Dim, ...]] = {}  # a column's shape (per-row checks)
        self.ht = self.hh = False
        self.inputs: list[EpilogueInput] = []
        self.last_use: dict[int, int] = {}
        for k, n in enumerate(steps):
            for v in n.inputs:
                self.last_use[id(v)] = k
        self.keep = {id(v) for v in outs}

    # ---------------------------------------------------------- values
    def input_ref(self, v: Value, user: Node) -> _Ref:
        i = self.ins.index(v)
        shape = tuple(v.type.shape)
        if v.dtype not in FLOAT_TYPES:
            raise Unsupported(f"{user.op} reads {v.dtype.value} input {v.name} in a matmul "
                              "epilogue (float inputs only)", node=user)
        if eq(symbolic.numel(shape), 1):
            self.inputs.append(EpilogueInput(i, SCALAR, v.dtype))
            return _Ref(SCALAR, f"s{i}")
        if self.regrouped is not None:
            raise Unsupported(f"{self.regrouped.op} regroups the batch axes after an input is "
                              "read and before another in a matmul epilogue",
                              node=self.regrouped)
        if shape and eq(shape[-1], self.N) and (len(shape) == 1 or eq(shape[-2], 1)) \
                and self._broadcasts(shape[:-2]):  # a row, per batch element or shared
            self.inputs.append(EpilogueInput(i, ROW, v.dtype, batch_strides(shape, self.ebatch)))
            return _Ref(ROW, f"r{i}")
        if shape and eq(shape[-1], self.N) and eq(symbolic.numel(shape), self.numel):
            strides = _natural_strides(self.ebatch, self.M, self.N)  # the product's layout
        elif len(shape) >= 2 and eq(shape[-1], self.N) and eq(shape[-2], self.M) \
                and self._broadcasts(shape[:-2]):
            strides = batch_strides(shape, self.ebatch)
        else:
            raise Unsupported(f"{user.op} reads {v.name} of shape "
                              f"{symbolic.format_shape(shape)} in a matmul epilogue (a tile of "
                              "the product, a row of N, or a scalar)", node=user)
        self.inputs.append(EpilogueInput(i, TILE, v.dtype, strides))
        return _Ref(TILE, f"x{i}")

    def ref(self, v: Value, user: Node) -> _Ref:
        if id(v) in self.refs:
            return self.refs[id(v)]
        p = v.producer
        if p is not None and p.op == "Constant":
            c = float(p.attrs["value"].reshape(-1)[0])
            r = _Ref(SCALAR, f"CT({flt(c)})", c)
        elif v in self.ins:
            r = self.input_ref(v, user)
        else:
            raise Unsupported(f"{user.op} reads {v.name}, not computed on the tile", node=user)
        self.refs[id(v)] = r
        return r

    def alloc(self, kind: str = TILE) -> str:
        if kind == COL:
            if self.free_cols:
                return self.free_cols.pop()
            self.cols += 1
            return f"wc{self.cols - 1}"
        if self.free:
            return self.free.pop()
        self.tiles += 1
        return f"w{self.tiles - 1}"

    def release(self, k: int, n: Node) -> None:
        """Return to their pools the tiles and columns whose last reader is step ``k``."""
        for v in n.inputs:
            r = self.refs.get(id(v))
            pool = {TILE: self.free, COL: self.free_cols}.get(r.kind) if r else None
            if (pool is not None and r.expr.startswith("w")
                    and self.last_use.get(id(v)) == k and id(v) not in self.keep
                    and r.expr not in pool and not self._aliased(r.expr, k)):
                pool.append(r.expr)

    def _aliased(self, expr: str, k: int) -> bool:
        """Another value read after step ``k`` (or kept) shares the tile ``expr``."""
        for vid, r in self.refs.items():
            if r.expr == expr and (self.last_use.get(vid, -1) > k or vid in self.keep):
                return True
        return False

    def _broadcasts(self, lead: tuple[Dim, ...]) -> bool:
        """Leading axes that broadcast into the product's batch axes."""
        b = self.ebatch
        return len(lead) <= len(b) and all(
            eq(d, 1) or eq(d, e) for d, e in zip(lead, b[len(b) - len(lead):], strict=True))

    # ------------------------------------------------------------- ops
    def step(self, k: int, n: Node) -> None:
        out = n.outputs[0]
        if n.op in VIEW_OPS:
            src = self.ref(n.inputs[0], n)
            shape = tuple(out.type.shape)
            if src.kind == COL:  # a view of a value per row: the same column
                self.shapes[id(out)] = shape
                self.refs[id(out)] = src
                return
            if src.kind == TILE and not (shape and eq(shape[-1], self.N)):
                raise Unsupported(f"{n.op} changes the last axis of the product in a matmul "
                                  "epilogue", node=n)
            if (src.kind == TILE and len(shape) >= 2 and eq(shape[-2], self.M)
                    and shape[:-2] != self.ebatch):  # batch axes split or merged
                if self.inputs:  # read over ebatch: no input may be read in this grouping
                    self.regrouped = self.regrouped or n  # (a value only stored is fine)
                else:
                    self.ebatch = shape[:-2]
            self.refs[id(out)] = src
            return
        rule = INSTRUCTIONS.get(n.op)
        a = [self.ref(v, n) for v in n.inputs]
        if n.op in REDUCE_OPS:
            self._reduce(k, n, rule, a[0])
            return
        if n.op == "BroadcastTo" and a[0].kind == COL:  # a value per row across the row
            self._per_row(n, n.inputs[0], tuple(out.type.shape))
            dst = self.alloc()
            self.body.append(f"R.ColCopy({dst}, {a[0].expr}, rows);")
            self.refs[id(out)] = _Ref(TILE, dst)
            self.release(k, n)
            return
        if rule is None or rule.form not in ("unary", "binary", "pow", "cast"):
            raise Unsupported(f"{n.op} in a matmul epilogue (elementwise ops of the "
                              "instruction table and reductions along N only)", node=n)
        if all(r.kind == SCALAR for r in a):
            if rule.scalar is None:
                raise Unsupported(f"{n.op} of scalars in a matmul epilogue", node=n)
            t = C_TYPE.get(out.dtype, "float")
            expr = rule.scalar.format(*(r.expr for r in a), t=t)
            self.refs[id(out)] = _Ref(SCALAR, f"CT({expr})")
            return
        if n.op == "Cast":
            self._cast(k, n, a[0])
            return
        if any(r.kind == ROW for r in a) and not any(r.kind == TILE for r in a):
            raise Unsupported(f"{n.op} of a row alone in a matmul epilogue", node=n)
        kind = TILE if any(r.kind in (TILE, ROW) for r in a) else COL
        if kind == COL:
            self.shapes[id(out)] = tuple(out.type.shape)
        for v, r in zip(n.inputs, a, strict=True):
            if r.kind == COL and kind == TILE:
                self._per_row(n, v, tuple(out.type.shape))
        dst = self.alloc(kind)
        getattr(self, f"_{rule.form}")(rule, n, _Ref(kind, dst), a)
        self.refs[id(out)] = _Ref(kind, dst)
        self.release(k, n)

    def _reduce(self, k: int, n: Node, rule, x: _Ref) -> None:
        """A reduction of the tile's rows (the product's last axis only) to a column."""
        shape = tuple(n.inputs[0].type.shape)
        if x.kind != TILE or not reduces_along(n, self.N):
            axes = reduce_axes(len(shape), n.attrs.get("axis"))
            what = "a product" if rule.api is None else \
                f"axes {axes} of {symbolic.format_shape(shape)}"
            raise Unsupported(f"{n.op} over {what} in a matmul epilogue (a sum, maximum or "
                              f"minimum along N = {symbolic.canon(self.N)} only)", node=n)
        dst = self.alloc(COL)
        self.body.append(f"R.RowReduce<R.{rule.row_op}>({dst}, {x.expr}, rows, cols);")
        out = n.outputs[0]
        self.refs[id(out)] = _Ref(COL, dst)
        self.shapes[id(out)] = tuple(out.type.shape)
        self.release(k, n)

    def _per_row(self, n: Node, v: Value, shape: tuple) -> None:
        """Column ``v`` meets the tile of ``shape``: it must hold one value per row of it (the
        shape with a last axis of 1), or numpy would broadcast it otherwise."""
        cs = self.shapes.get(id(v))
        if cs is None or len(cs) != len(shape) or not eq(cs[-1], 1) or any(
                not eq(a, b) for a, b in zip(cs[:-1], shape[:-1], strict=True)):
            raise Unsupported(f"{n.op} broadcasts a reduced value of shape "
                              f"{symbolic.format_shape(cs or ())} over "
                              f"{symbolic.format_shape(shape)} in a matmul epilogue (one value "
                              "per row only)", node=n)

    def _unary(self, rule, n, dst: _Ref, a) -> None:
        (x,) = a
        self.ht |= rule.api is not None and rule.scratch == "ht"
        self.body.append(unary_line(rule, dst.expr, x.expr, COUNT[dst.kind]))

    def _binary(self, rule, n, dst: _Ref, a) -> None:
        x, y = a
        b, d, cnt = self.body, dst.expr, COUNT[dst.kind]
        if x.kind == y.kind:  # tile with tile, column with column
            b.append(f"{rule.api}({d}, {x.expr}, {y.expr}, {cnt});")
        elif COL in (x.kind, y.kind) and dst.kind == TILE:  # each row against its value
            if ROW in (x.kind, y.kind) or rule.row_op is None:
                raise Unsupported(f"{n.op} of {x.kind} and {y.kind} values in a matmul "
                                  "epilogue", node=n)
            tile, col = (x, y) if y.kind == COL else (y, x)
            first = "true" if col is x else "false"
            b.append(f"R.ColOp<R.{rule.row_op}, {first}>({d}, {tile.expr}, {col.expr}, rows);")
        elif ROW in (x.kind, y.kind):
            tx = x.expr + "[i * bN]" if x.kind == TILE else x.expr
            ty = y.expr + "[i * bN]" if y.kind == TILE else y.expr
            if SCALAR in (x.kind, y.kind):
                raise Unsupported(f"{n.op} of a row and a scalar in a matmul epilogue", node=n)
            b.append(f"for (uint32_t i = 0; i < rows; ++i) {rule.api}({d}[i * bN], {tx}, "
                     f"{ty}, bN);")
        else:  # a tile (or a column) and a scalar
            v, s = (x, y) if y.kind == SCALAR else (y, x)
            if rule.scalar_api is not None:
                b.append(f"{rule.scalar_api}({d}, {v.expr}, {s.expr}, {cnt});")
            elif n.op == "Sub" and v is x:  # x - s = x + (-s), exact
                b.append(f"Adds({d}, {x.expr}, CT(-({s.expr})), {cnt});")
            else:  # the scalar spread over the value, then the two-operand form
                b.append(f"Duplicate({d}, {s.expr}, {cnt});")
                args = (d, v.expr) if v is y else (v.expr, d)
                b.append(f"{rule.api}({d}, {args[0]}, {args[1]}, {cnt});")

    def _pow(self, rule, n, dst: _Ref, a) -> None:
        x, e = a
        if x.kind not in (TILE, COL) or e.const is None:
            raise Unsupported("Pow with a tensor exponent in a matmul epilogue", node=n)
        c, d, cnt = e.const, dst.expr, COUNT[dst.kind]
        if c == 0.5:
            self.body.append(f"Sqrt({d}, {x.expr}, {cnt});")
        elif c == int(c) and 1 <= c <= 4:
            self.body.append(f"Muls({d}, {x.expr}, CT(1.0f), {cnt});")
            for _ in range(int(c) - 1):
                self.body.append(f"Mul({d}, {d}, {x.expr}, {cnt});")
        else:
            raise Unsupported(f"Pow by {c} in a matmul epilogue", node=n)

    def _cast(self, k: int, n: Node, x: _Ref) -> None:
        out = n.outputs[0]
        if out.dtype not in FLOAT_TYPES:
            raise Unsupported(f"Cast to {out.dtype.value} in a matmul epilogue", node=n)
        only_stored = not out.users and id(out) in self.keep
        if x.kind == COL:
            self.shapes[id(out)] = tuple(out.type.shape)
        if out.dtype == DType.float32 or only_stored or x.kind not in (TILE, COL):
            self.refs[id(out)] = x  # fp32 in UB already; a stored value rounds on store
            return
        dst = self.alloc(x.kind)  # the rounding the graph asks for, through a 16-bit scratch
        self.hh = True
        t, cnt = C_TYPE[out.dtype], COUNT[x.kind]
        self.body += [f"Cast(hh.ReinterpretCast<{t}>(), {x.expr}, RoundMode::CAST_RINT, {cnt});",
                      f"Cast({dst}, hh.ReinterpretCast<{t}>(), RoundMode::CAST_NONE, {cnt});"]
        self.refs[id(out)] = _Ref(x.kind, dst)
        self.release(k, n)


def build(product: Value, batch, M, N, ins: list[Value], outs: list[Value],
          steps: list[Node]) -> Epilogue:
    """The epilogue of the ``steps`` (in order) on the product's tiles; ``ins`` the kernel's
    inputs (by index), ``outs`` its outputs."""
    b = _Builder(product, batch, M, N, ins, outs, steps)
    for k, n in enumerate(steps):
        b.step(k, n)
    outputs = []
    for j, v in enumerate(outs):
        r = b.refs.get(id(v))
        if r is None or r.kind != TILE:
            raise Unsupported(f"output {v.name} of a matmul kernel is not a tile of the "
                              "product", node=v.producer)
        if v.dtype not in FLOAT_TYPES or not eq(symbolic.numel(v.type.shape), b.numel):
            raise Unsupported(f"output {v.name} of a matmul kernel: {v.dtype.value} "
                              f"{symbolic.format_shape(v.type.shape)}", node=v.producer)
        outputs.append(EpilogueOutput(j, v.dtype, r.expr))
    seen: set[int] = set()
    uniq = [i for i in b.inputs if not (i.index in seen or seen.add(i.index))]
    # the vector barriers, placed by the rule every vector kernel uses (codegen/barriers.py)
    names = ["c", "hh", *(f"w{k}" for k in range(b.tiles)),
             *(f"wc{k}" for k in range(b.cols)),
             *(f"{'x' if i.layout == TILE else 'r'}{i.index}" for i in uniq
               if i.layout != SCALAR)]
    body = barriers.place_text(b.body, names)
    return Epilogue(uniq, outputs, body, b.tiles, b.ht, b.hh, [n.op for n in steps],
                    b.ebatch, b.cols, b.cols > 0)
