"""Render a scheduled vector kernel as Ascend C: ``<name>.cpp`` (the kernel), ``<name>_tiling.h``
(the tiling struct) and ``<name>_tiling.cpp`` (the host function computing the tiling from
the actual input shapes), plus a manifest entry describing it."""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.codegen import barriers
from graphkernel.codegen.buffers import plan
from graphkernel.codegen.kernel_ir import ROW_FORMS, Instr, Kind, comment_text, text
from graphkernel.codegen.lower import C_TYPE
from graphkernel.codegen.render import (
    Rendered,
    c_dim,
    env,
    io_entry,
    shape_doc,
    shape_refs,
    target_facts,
)
from graphkernel.codegen.vector import resident
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.schedule import COL, PARTIAL, ROW, Schedule
from graphkernel.codegen.vector.tiling import align_elems
from graphkernel.ir import Dim


def render(s: Schedule, node_comment: str | None = None) -> Rendered:
    """The kernel's files; a schedule with a run-time variant also carries the variant's
    files (its class is included by the kernel, its tiling function called by the kernel's)."""
    var = render(s.variant, node_comment) if s.variant is not None else None
    ir = lower(s)
    bplan = plan(ir, s.target.block_bytes)
    ub = bplan.budget()
    loaded = [b.tensor for b in ir.buffers if b.kind in (Kind.QUEUE_IN, Kind.TABLE)]
    refs = shape_refs(s)
    align = align_elems(s)
    comment = comment_text(node_comment or s.node)
    partial = {io.index: [(c_dim(d, refs), c_dim(st, refs))
                          for d, st in zip(io.outer, io.strides, strict=True)]
               for io in s.inputs if io.kind == PARTIAL}
    pitch = {io.index: _pitch(io, refs) for io in s.inputs if io.kind == PARTIAL}
    # a slice's start: a number, or along a symbolic stride computed by the host from the shapes
    pbase = {io.index: c_dim(io.base, refs) for io in s.inputs if io.kind == PARTIAL}
    # a ROW or COL input read from a slice's start (one block of its buffer): the offset
    at = {io.index: c_dim(io.base, refs) for io in s.inputs
          if io.kind in (ROW, COL) and not symbolic.eq(io.base, 0)}
    tpitch = {io.index: _table_pitch(io, s, refs) for io in s.inputs if io.table}
    scatter = {io.index: [(c_dim(d, refs), c_dim(st, refs))  # outputs stored through a map
                          for d, st in zip(io.outer, io.strides, strict=True)]
               for io in s.outputs if io.outer}
    opitch = {io.index: _pitch(io, refs) for io in s.outputs if io.outer}
    gather = {io.index: (c_dim(io.block_rows, refs), [c_dim(r, refs) for _, r in io.gather])
              for io in s.inputs if io.gather}
    # pieces sliced from their inputs: (offset, rows per block in the input) per operand
    gather_at = {io.index: [(c_dim(at[0], refs), c_dim(at[1], refs)) if at is not None else
                            ("0ull", c_dim(r, refs))
                            for at, (_, r) in zip(io.gather_at, io.gather, strict=True)]
                 for io in s.inputs if io.gather_at}
    lookup = {io.index: c_dim(io.lookup_rows, refs) for io in s.inputs if io.lookup >= 0}
    parts = {io.index: [c_dim(d, refs) for d in io.part] for io in s.outputs if io.part}
    tg = s.target
    ctx = {
        "s": s, "ir": ir, "plan": bplan, "ub": ub,
        "row_blocks": ir.uses(*ROW_FORMS), "col_copies": ir.uses("ColsCopy"),
        "scans": ir.uses("ScanRows", "ScanLinear"),
        "compute_lines": _lines(ir.compute, loaded),
        "finish_lines": _lines(ir.finish, loaded),
        "second_lines": _lines(ir.second, loaded),
        "second_in": s.second_inputs() if s.second else set(),
        "second_out": s.second_outputs() if s.second else set(),
        "align": align, "node_comment": comment,
        **target_facts(tg),
        "M": c_dim(s.M, refs), "L": c_dim(s.L, refs), "batch": c_dim(s.batch, refs),
        "M_doc": (symbolic.canon(s.M) if _eq1(s.batch) else
                  f"{symbolic.canon(s.batch)} blocks of {symbolic.canon(s.M)}"),
        "L_doc": symbolic.canon(s.L),
        "sizes_in": [c_dim(io.value.type.numel, refs) for io in s.inputs],
        "sizes_out": [c_dim(io.value.type.numel, refs) for io in s.outputs],
        "partial": partial, "pitch": pitch, "scatter": scatter, "opitch": opitch,
        "pbase": pbase, "at": at,
        "tpitch": tpitch, "tiles_per_core": resident.TILES_PER_CORE,
        "gather": gather, "gather_at": gather_at, "lookup": lookup, "parts": parts,
        "concat": {io.index: [(c_dim(b, refs), c_dim(p, refs)) for _, b, p in io.pieces]
                   for io in s.outputs},
        "late": {io.index for io in s.outputs  # stored once a reduction completes
                 if io.kind == ROW or (s.row_chunks and io.kind == COL)},
        "ct": C_TYPE[s.compute], "variant": var.name if var else None,
        "ctype": {io.index: C_TYPE[io.dtype] for io in s.inputs},
        "otype": {io.index: C_TYPE[io.dtype] for io in s.outputs},
        "shape_doc": shape_doc(s),
    }
    jenv = env()
    files = {
        f"{s.name}.cpp": jenv.get_template("kernel.cpp.j2").render(ctx),
        f"{s.name}_tiling.h": jenv.get_template("tiling.h.j2").render(ctx),
        f"{s.name}_tiling.cpp": jenv.get_template("tiling.cpp.j2").render(ctx),
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
                      "chunks of blocks (codegen/vector/resident.py)" if s.table_rows else
                      "min(cores, M * nColTiles); each core a contiguous run of units "
                      "(computed by the tiling function)"),
        "tiling_function": f"{s.name}_tiling",
        "sources": sorted(files),
        "notes": list(s.notes),
    }
    return Rendered(s, ir, files, manifest, bplan, var)


def _lines(instrs: list[Instr], loaded: list[str]) -> list[str]:
    """The instructions as Ascend C, with the syncs and vector barriers they need."""
    return text(barriers.place(barriers.syncs(instrs, loaded)))


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


