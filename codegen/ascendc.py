"""Render a scheduled kernel as Ascend C: ``<name>.cpp`` (the kernel), ``<name>_tiling.h``
(the tiling struct) and ``<name>_tiling.cpp`` (the host function computing the tiling from
the actual input shapes), plus a manifest entry describing it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from graphkernel import symbolic
from graphkernel.codegen import barriers, resident
from graphkernel.codegen.buffers import BufferPlan, plan
from graphkernel.codegen.lower import C_TYPE, Lowered, lower
from graphkernel.codegen.schedule import (
    COL,
    FULL,
    PARTIAL,
    ROW,
    Schedule,
    Unsupported,
    comment_text,
)
from graphkernel.codegen.targets import Target
from graphkernel.codegen.tiling import align_elems
from graphkernel.ir import Dim

TEMPLATES = Path(__file__).resolve().parent / "templates"


@functools.cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@dataclass
class Rendered:
    schedule: Schedule  # or a MatmulSchedule (a cube kernel: no lowering)
    lowered: Lowered | None
    files: dict[str, str]         # file name -> text
    manifest: dict[str, Any]
    plan: BufferPlan              # the kernel's UB buffers
    variant: Rendered | None = None  # the rows-in-chunks variant (tiling key 1), if any

    @property
    def name(self) -> str:
        return self.schedule.name


def shape_refs(s: Schedule) -> dict[str, str]:
    """Each symbol -> the C expression of it from the host's ``shapes`` array: every input's
    dims, then every output's (the framework knows both before a launch). A symbol is a dim
    of its own, or a dim's quotient by its other factors once those are known
    (``197*s0`` gives s0; ``s0*s1`` gives s1 once s0 is known)."""
    dims: list[tuple[int, tuple[str, ...], str]] = []
    off = 0
    for io in [*s.inputs, *s.outputs]:
        for a, d in enumerate(io.shape):
            if isinstance(d, str):
                coef, syms = symbolic.parse_dim(d)
                dims.append((coef, syms, f"(uint64_t)shapes[{off + a}]"))
        off += len(io.shape)
    # a product of symbols is also read whole where an input or output has it as a dim
    refs: dict[str, str] = {}
    for coef, syms, ref in dims:
        if coef == 1 and len(syms) > 1:
            refs.setdefault(symbolic.make_dim(1, syms), ref)
    progress = True
    while progress:
        progress = False
        for coef, syms, ref in dims:
            free = [x for x in syms if _c_symbol(x, refs) is None]
            if len(free) != 1 or syms.count(free[0]) != 1:
                continue
            known = [_c_symbol(x, refs) for x in syms if x != free[0]]
            divisor = " * ".join([f"{coef}ull", *known]) if coef != 1 or known else None
            refs[free[0]] = f"({ref} / ({divisor}))" if divisor else ref
            progress = True
    return refs


def shape_doc(s: Schedule) -> str:
    """What the ``shapes`` array holds, for the tiling function's comment."""
    return ", ".join([f"input {io.index}: {symbolic.format_shape(io.shape)}" for io in s.inputs]
                     + [f"output {io.index}: {symbolic.format_shape(io.shape)}"
                        for io in s.outputs])


def c_dim(d: Dim, refs: dict[str, str]) -> str:
    coef, syms = symbolic.parse_dim(d)
    whole = symbolic.make_dim(1, syms)
    if len(syms) > 1 and isinstance(whole, str) and whole in refs:
        return f"{coef}ull * {refs[whole]}"
    parts = [f"{coef}ull"]
    for sym in syms:
        ref = _c_symbol(sym, refs)
        if ref is None:
            raise Unsupported(f"symbol {symbolic.pretty(sym)} is not a whole dim of any input "
                              "nor computed from one (the host tiling reads extents from the "
                              "input shapes)")
        parts.append(ref)
    return " * ".join(parts)


def _c_symbol(sym: str, refs: dict[str, str]) -> str | None:
    """The C expression of a symbol: an input dim that is it, or one computed from an input
    dim of the same base. ``floor((x + a)/d)`` follows from ``y = floor((x + a2)/d2)`` when
    d2 divides d and a - a2: it is ``floor((y + (a - a2)/d2) / (d/d2))`` (symbolic.py);
    the plain base is ``(x, 0, 1)``."""
    if sym in refs:
        return refs[sym]
    base, add, div = symbolic.derived(sym) or (sym, 0, 1)
    for other, ref in refs.items():
        obase, oadd, odiv = symbolic.derived(other) or (other, 0, 1)
        if obase != base or div % odiv or (add - oadd) % odiv:
            continue
        # sizes are never negative here: C's truncating division is the floor
        return (f"(uint64_t)(((int64_t){ref} + ({(add - oadd) // odiv}ll)) / "
                f"{div // odiv}ll)")
    return None


def render(s: Schedule, node_comment: str | None = None) -> Rendered:
    """The kernel's files; a schedule with a run-time variant also carries the variant's
    files (its class is included by the kernel, its tiling function called by the kernel's)."""
    var = render(s.variant, node_comment) if s.variant is not None else None
    low = lower(s)
    bplan = plan(s, low)
    ub = bplan.budget()
    refs = shape_refs(s)
    align = align_elems(s)
    comment = comment_text(node_comment or s.node)
    partial = {io.index: [(c_dim(d, refs), c_dim(st, refs))
                          for d, st in zip(io.outer, io.strides, strict=True)]
               for io in s.inputs if io.kind == PARTIAL}
    pitch = {io.index: _pitch(io, refs) for io in s.inputs if io.kind == PARTIAL}
    tpitch = {io.index: _table_pitch(io, s, refs) for io in s.inputs if io.table}
    scatter = {io.index: [(c_dim(d, refs), c_dim(st, refs))  # outputs stored through a map
                          for d, st in zip(io.outer, io.strides, strict=True)]
               for io in s.outputs if io.outer}
    opitch = {io.index: _pitch(io, refs) for io in s.outputs if io.outer}
    gather = {io.index: (c_dim(io.block_rows, refs), [c_dim(r, refs) for _, r in io.gather])
              for io in s.inputs if io.gather}
    tg = s.target
    names = [b.local for b in bplan.scratch] + tile_tensors(s)
    ctx = {
        "s": s, "low": low, "plan": bplan, "ub": ub,
        "compute_lines": barriers.place(low.prologue + low.body + low.epilogue, names),
        "finish_lines": barriers.place(low.final + low.final_epilogue, names),
        "align": align, "node_comment": comment,
        **target_facts(tg),
        "M": c_dim(s.M, refs), "L": c_dim(s.L, refs), "batch": c_dim(s.batch, refs),
        "M_doc": (symbolic.canon(s.M) if _eq1(s.batch) else
                  f"{symbolic.canon(s.batch)} blocks of {symbolic.canon(s.M)}"),
        "L_doc": symbolic.canon(s.L),
        "sizes_in": [c_dim(io.value.type.numel, refs) for io in s.inputs],
        "sizes_out": [c_dim(io.value.type.numel, refs) for io in s.outputs],
        "partial": partial, "pitch": pitch, "scatter": scatter, "opitch": opitch,
        "tpitch": tpitch, "tiles_per_core": resident.TILES_PER_CORE,
        "gather": gather,
        "concat": {io.index: [(c_dim(b, refs), c_dim(p, refs)) for _, b, p in io.pieces]
                   for io in s.outputs},
        "late": {io.index for io in s.outputs  # stored once a reduction completes
                 if io.kind == ROW or (s.row_chunks and io.kind == COL)},
        "ct": C_TYPE[s.compute], "variant": var.name if var else None,
        "ctype": {io.index: C_TYPE[io.dtype] for io in s.inputs},
        "otype": {io.index: C_TYPE[io.dtype] for io in s.outputs},
        "shape_doc": shape_doc(s),
    }
    env = _env()
    files = {
        f"{s.name}.cpp": env.get_template("kernel.cpp.j2").render(ctx),
        f"{s.name}_tiling.h": env.get_template("tiling.h.j2").render(ctx),
        f"{s.name}_tiling.cpp": env.get_template("tiling.cpp.j2").render(ctx),
        **(var.files if var else {}),
    }
    manifest = {
        "name": s.name, "node": s.node, "kind": "vector",
        "inputs": [io_entry(io) for io in s.inputs],
        "outputs": [io_entry(io) for io in s.outputs],
        "loop_space": {"rows": symbolic.canon(s.M), "row_length": symbolic.canon(s.L),
                       "blocks": symbolic.canon(s.batch),
                       "whole_rows": s.whole_rows and not s.row_chunks,
                       "whole_columns": s.col_reduce, "row_chunks": s.row_chunks},
        "tiling_fields": ["M", "L", "rt", "ct", "ctp", "nColTiles", "units", "blockDim", "key",
                          "nBatch"],
        "tiling_keys": {"0": "whole rows per tile",
                        **({"1": f"rows walked in chunks ({var.name})"} if var else {})},
        "ub_bytes": {"per_tile_element": ub.tile, "per_column": ub.col, "per_row": ub.row,
                     "fixed": ub.fixed},
        "buffers": bplan.describe(),
        "block_dim": ("min(cores, units); units are blocks of the resident tables' rows, or "
                      "chunks of blocks (codegen/resident.py)" if s.table_rows else
                      "min(cores, M * nColTiles); each core a contiguous run of units "
                      "(computed by the tiling function)"),
        "tiling_function": f"{s.name}_tiling",
        "sources": sorted(files),
        "notes": list(s.notes),
    }
    return Rendered(s, low, files, manifest, bplan, var)


def tile_tensors(s: Schedule) -> list[str]:
    """The LocalTensor names Compute takes from the queues: input and output tiles."""
    names = [f"xi{io.index}" for io in s.inputs if io.kind in (FULL, PARTIAL, COL)]
    for io in s.outputs:
        names += ([f"yc{io.index}_{k}" for k in range(len(io.pieces))] if io.pieces else
                  [f"yo{io.index}"])
    return names


def target_facts(tg: Target) -> dict[str, int]:
    """The target's facts the templates write into the code as numbers (constants)."""
    return {"blk": tg.block_bytes, "rep": tg.repeat_bytes, "bpr": tg.blocks_per_repeat,
            "mr": tg.max_repeats, "brcb_reps": _brcb_repeats(tg)}


def _brcb_repeats(tg: Target) -> int:
    """Repeats per Brcb instruction: at most max_repeats, and few enough that the next
    instruction's first row still starts a UB block for a 16-bit compute type (Brcb spreads
    one element per block, blocks_per_repeat elements per repeat)."""
    rows_per_block = tg.block_elems(2)
    k = math.lcm(tg.blocks_per_repeat, rows_per_block) // tg.blocks_per_repeat
    return tg.max_repeats // k * k


def _eq1(d: Dim) -> bool:
    return symbolic.canon(d) == symbolic.canon(1)


def _pitch(io, refs: dict[str, str]) -> str:
    """The C expression of a PARTIAL input's row pitch when its rows are evenly spaced in GM
    (every outer stride = pitch x the outer dims inside it), else "0"."""
    if not io.strides or any(symbolic.canon(st) == 0 for st in io.strides):
        return "0"
    p = io.strides[-1]
    for j in range(len(io.outer)):
        want = symbolic.mul(p, symbolic.numel(io.outer[j + 1:]))
        if symbolic.canon(io.strides[j]) != symbolic.canon(want) and io.outer[j] != 1:
            return "0"
    return c_dim(p, refs)


def _table_pitch(io, s: Schedule, refs: dict[str, str]) -> str:
    """The C expression of a resident table's row pitch in GM (a table of one row: its
    width, so the copy's stride is 0)."""
    pitch = resident.table_map(io).pitch
    if symbolic.canon(pitch) == 0:
        pitch = io.columns[1] if io.columns else s.L
    return c_dim(pitch, refs)


def io_entry(io) -> dict[str, Any]:
    """A kernel input or output as the manifest lists it."""
    return {"name": io.value.name, "dtype": str(io.dtype), "shape": list(io.shape),
            "layout": io.kind}
