"""Forward-substitution kernels: a batch of unit-lower-triangular systems (``TriSolve``,
``graphkernel/opdefs/trisolve.py``), one matrix at a time per vector core.

A core takes whole matrices round robin (``blockDim`` = min(vector cores, matrices)). For
each, the system (``L``: n rows of n; the ``rows`` form has only A) and the right-hand sides
(n rows of m, in place: they become the solution) are loaded by one ``DataCopyPad`` each,
every row at the start of a 32-byte block (pitch ``NP``/``MP`` elements). Then the rows in
sequence: row i's coefficients ``L[i, k]`` (k < i) are read by the scalar unit (``GetValue``:
a ``MTE2_S`` sync after the load; the vector unit never writes them — in the ``rows`` form
row i is read before its own update), and row i's sum ``acc = sum_k L[i, k] * Y[k]`` is a
``Muls`` of row k into a scratch row and an ``Add`` into the accumulator for k = 0, 1, ...,
then ``Sub`` (solve: ``Y[i] = X[i] - acc``) or ``Add`` (rows: ``A[i, :i] + acc``, over the
first i columns only) writes row i. A ``PipeBarrier<PIPE_V>`` orders each instruction after
the one whose result it reads (row i after rows k < i). The solution is stored by one
``DataCopyPad`` after a ``V_MTE3`` sync; the next matrix's load waits for that store
(``MTE3_MTE2``), for the vector unit's reads (``V_MTE2``) and the scalar unit's
(``S_MTE2``). Float32 only; static shapes; the matrix and its right-hand sides must fit the
UB together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphkernel.codegen.buffers import BufferPlan
from graphkernel.codegen.kernel_ir import Buffer, Kind, Linear, comment_text
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.render import Rendered, ValueIO, env, io_entry
from graphkernel.codegen.targets import Target
from graphkernel.codegen.vector.schedule import kernel_symbol
from graphkernel.ir import DType, Node

MAX_ROWS = 4095  # a DataCopyPad's block count: one block per row


def is_trisolve_kernel(kernel: Node) -> bool:
    """Whether ``kernel`` holds a TriSolve: a forward-substitution kernel (this module)."""
    return kernel.op == "GraphKernel" and any(n.op == "TriSolve" for n in kernel.subgraph.nodes)


@dataclass
class TriSolveSchedule:
    """What a forward-substitution kernel computes: ``batch`` systems of ``n`` rows, ``m``
    right-hand-side columns (the ``rows`` form: m = n), the UB row pitches."""

    name: str
    node: str
    inputs: list[ValueIO]     # kind: L, X (solve) or A (rows); the outputs Y
    outputs: list[ValueIO]
    target: Target
    form: str                  # "solve" or "rows"
    batch: int
    n: int
    m: int                     # the columns a row's instructions cover (all right-hand sides)
    NP: int                    # a row of L in UB (elements: whole 32-byte blocks)
    MP: int                    # a row of the right-hand sides in UB (each starts on a block)
    l_input: int               # the kernel input holding L (solve) or A (rows)
    rhs: list[tuple[int, int, int]]  # per right-hand side: (kernel input, columns, offset)
    out_rhs: list[int]         # per kernel output: its right-hand side
    notes: list[str] = field(default_factory=list)
    kernel_kind: str = "vector"
    variant: None = None


def plan_trisolve(kernel: Node, target: Target) -> TriSolveSchedule:
    """The kernel's schedule, or Unsupported with the reason."""
    sub = kernel.subgraph
    body = [n for n in sub.nodes if n.op != "Constant"]
    if len(body) != 1 or body[0].op != "TriSolve":
        other = next(n for n in body if n.op != "TriSolve")
        raise Unsupported("a forward-substitution kernel holds its TriSolve alone (no work "
                          f"before or after it is generated with it: {other.op})", node=other)
    ts = body[0]
    form = ts.attrs["form"]
    if any(v.dtype != DType.float32 for v in (*ts.inputs, *ts.outputs)):
        raise Unsupported(f"TriSolve of {ts.inputs[0].dtype.value}: forward-substitution "
                          "kernels are generated for float32", node=ts)
    if not all(isinstance(d, int) for v in (*ts.inputs, *ts.outputs) for d in v.shape):
        raise Unsupported(f"TriSolve of a symbolic shape {list(ts.inputs[-1].shape)}", node=ts)
    if any(v not in sub.inputs for v in ts.inputs):
        raise Unsupported("TriSolve of a value computed in the kernel", node=ts)
    L = ts.inputs[0]
    n = L.shape[-1]
    batch = 1
    for d in L.shape[:-2]:
        batch *= d
    if n > MAX_ROWS:
        raise Unsupported(f"TriSolve of {n} rows: one DataCopyPad block per row, at most "
                          f"{MAX_ROWS}", node=ts)
    if any(v not in ts.outputs for v in sub.outputs):
        raise Unsupported("a forward-substitution kernel's outputs are its TriSolve's",
                          node=ts)
    li = sub.inputs.index(L)
    sides = ts.inputs[1:] if form == "solve" else [L]
    rhs, at = [], 0
    for x in sides:
        rhs.append((sub.inputs.index(x), x.shape[-1], at))
        at += _pitch(x.shape[-1], target)
    NP, MP = _pitch(n, target), at
    m = rhs[-1][2] + rhs[-1][1]
    ins = [ValueIO(i, v, "A" if form == "rows" else ("L" if i == li else "X"))
           for i, v in enumerate(sub.inputs)]
    s = TriSolveSchedule(kernel_symbol(kernel), kernel.name, ins,
                         [ValueIO(i, v, "Y") for i, v in enumerate(sub.outputs)], target,
                         form, batch, n, m, NP, MP, li, rhs,
                         [ts.outputs.index(v) for v in sub.outputs])
    need = _plan(s).budget().bytes(1, MP)
    if need > target.ub_bytes:
        raise Unsupported(f"TriSolve of {n} rows and {m} columns: the system and its "
                          f"right-hand sides need {need} bytes of UB, the target has "
                          f"{target.ub_bytes} (a system in bands of rows is not generated)",
                          node=ts)
    s.notes.append(f"{batch} systems of {n} rows, one per core at a time; {n * (n - 1) // 2} "
                   "coefficients read by the scalar unit per system, two vector instructions "
                   "(Muls, Add) per coefficient")
    return s


def _pitch(cols: int, target: Target) -> int:
    """Elements of a row of ``cols`` in UB: whole 32-byte blocks."""
    blk = target.block_bytes // 4
    return -(-cols // blk) * blk


def fits(n: int, widths: list[int], target: Target) -> bool:
    """Whether a system of ``n`` rows with right-hand sides of ``widths`` columns fits one
    kernel's UB (the buffer plan's bytes)."""
    NP, MP = _pitch(n, target), sum(_pitch(w, target) for w in widths)
    return (n * NP + n * MP + 2 * MP) * 4 + target.block_bytes <= target.ub_bytes


def _plan(s: TriSolveSchedule) -> BufferPlan:
    """The kernel's UB buffers (fixed sizes: one system's rows)."""
    blk = s.target.block_bytes
    bufs = []
    if s.form == "solve":
        size = s.n * s.NP * 4
        bufs.append(Buffer("bl", "the system's rows", Kind.TILE, "float", Linear(fixed=size),
                           str(size), tensor="l"))
    size = s.n * s.MP * 4
    bufs.append(Buffer("by", "the right-hand sides' rows, solved in place", Kind.TILE, "float",
                       Linear(fixed=size), str(size), tensor="y"))
    row = s.MP * 4
    bufs += [Buffer("ba", "a row's sum over the rows before it", Kind.ROW, "float",
                    Linear(fixed=row), str(row), tensor="acc"),
             Buffer("bt", "one term of that sum", Kind.ROW, "float", Linear(fixed=row),
                    str(row), tensor="tmp")]
    return BufferPlan(tuple(bufs), Linear(fixed=blk), "float")


def render_trisolve(s: TriSolveSchedule) -> Rendered:
    """The kernel's files (``<name>.cpp``, ``<name>_tiling.h``, ``<name>_tiling.cpp``) and its
    manifest entry."""
    bplan = _plan(s)
    ctx: dict[str, Any] = {"s": s, "plan": bplan, "node_comment": comment_text(s.node),
                           "sizes": {io.index: io.value.type.numel for io in s.inputs},
                           "osizes": {io.index: io.value.type.numel for io in s.outputs}}
    jenv = env()
    files = {f"{s.name}.cpp": jenv.get_template("trisolve.cpp.j2").render(ctx),
             f"{s.name}_tiling.h": jenv.get_template("trisolve_tiling.h.j2").render(ctx),
             f"{s.name}_tiling.cpp": jenv.get_template("trisolve_tiling.cpp.j2").render(ctx)}
    manifest = {
        "name": s.name, "node": s.node, "kind": s.kernel_kind,
        "inputs": [io_entry(io) for io in s.inputs],
        "outputs": [io_entry(io) for io in s.outputs],
        "trisolve": {"form": s.form, "systems": s.batch, "rows": s.n, "columns": s.m},
        "tiling_fields": ["M", "L", "rt", "ct", "ctp", "nColTiles", "units", "blockDim",
                          "key", "nBatch"],
        "block_dim": "min(vector cores, systems)",
        "tiling_function": f"{s.name}_tiling",
        "sources": sorted(files),
        "notes": list(s.notes),
        "buffers": bplan.describe(),
    }
    return Rendered(s, None, files, manifest, bplan)
