"""Render a cube kernel (codegen/cube/schedule.py) as Ascend C on the Matmul API:
``<name>.cpp``, ``<name>_tiling.h``, ``<name>_tiling.cpp`` (the host tiling, with the tiler of
``templates/cube_tiler.inc``) and a manifest entry."""

from __future__ import annotations

from typing import Any

from graphkernel import symbolic
from graphkernel.codegen import barriers
from graphkernel.codegen.buffers import NO_BUFFERS, plan
from graphkernel.codegen.cube.lower import POOLS, lower
from graphkernel.codegen.cube.schedule import MAX_BATCH_AXES, MatmulSchedule
from graphkernel.codegen.kernel_ir import COL, FULL, comment_text, text
from graphkernel.codegen.lower import C_TYPE
from graphkernel.codegen.render import (
    TEMPLATES,
    Rendered,
    c_dim,
    env,
    io_entry,
    shape_doc,
    shape_refs,
    target_facts,
)
from graphkernel.ir import DType

TILER = (TEMPLATES / "cube_tiler.inc").read_text()
DT_ENUM = {DType.float16: "DataType::DT_FLOAT16", DType.bfloat16: "DataType::DT_BF16",
           DType.float32: "DataType::DT_FLOAT"}


def render_matmul(s: MatmulSchedule, node_comment: str | None = None, member: bool = False,
                  in_mix: bool = False) -> Rendered:
    """The kernel's files and manifest entry (its buffer plan: none for a cube kernel).
    ``member``: the product is one of a product group's (codegen/cube/group.py): its entry is
    an inline device function the group's kernel calls, with no headers, kernel type or
    tiler of its own (the group's files have them once). ``in_mix``: that group is a MIX
    kernel, so a product without an epilogue is driven from the vector cores too and takes
    its blocks by vector core (docs/codegen.md, "Block indices")."""
    refs = shape_refs(s)
    cd = lambda d: c_dim(d, refs)  # noqa: E731
    batch = [(cd(d), cd(a), cd(b)) for d, a, b in zip(s.batch, s.a_strides, s.b_strides,
                                                      strict=True)]
    ins = s.inputs
    epi = s.epilogue
    epi_inputs = epi.inputs if epi is not None else []
    tile_inputs = [i for i in epi_inputs if i.layout in ("tile", "row", "col")]  # at batch
    #                                                                               strides
    ir = lower(epi, s.target) if epi is not None else None
    bplan = plan(ir, s.target.block_bytes) if ir is not None else NO_BUFFERS
    tensors = {b.tensor for b in bplan.buffers}
    ctx = {
        "epi": epi, "epi_inputs": epi_inputs, "tile_inputs": tile_inputs,
        "pool_tiles": ir.pools[POOLS[FULL]] if ir else 0,
        "pool_cols": ir.pools[POOLS[COL]] if ir else 0,
        "uses_ht": "ht" in tensors, "uses_hh": "hh" in tensors,
        "body_lines": text(barriers.place(ir.compute)) if ir else [],
        "store_lines": {j: text(st) for j, st in ir.stores.items()} if ir else {},
        "ebatch": [cd(d) for d in epi.batch] if epi is not None else [],
        "tile_strides": [(i.index, [cd(st) for st in i.strides]) for i in tile_inputs],
        "epi_sizes": [(i.index, cd(ins[i.index].value.type.numel)) for i in epi_inputs],
        "itype": {io.index: C_TYPE[io.dtype] for io in ins if io.dtype in C_TYPE},
        "otype": {io.index: C_TYPE[io.dtype] for io in s.outputs if io.dtype in C_TYPE},
        "c_size": s.c_bytes, "ub_elem": s.ub_per_elem(bplan),
        "ub_reserved": s.ub_reserved(bplan),
        **target_facts(s.target), "row_reduce": True,
        "s": s, "member": member, "in_mix": in_mix,
        "node_comment": comment_text(node_comment or s.node),
        "ctype": C_TYPE[s.dtype], "size": s.dtype.itemsize, "dt_enum": DT_ENUM[s.dtype],
        "M": cd(s.M), "N": cd(s.N), "K": cd(s.K), "batch": batch, "max_axes": MAX_BATCH_AXES,
        "na": cd(ins[s.a].value.type.numel), "nb": cd(ins[s.b].value.type.numel),
        "target": s.target, "tiler": TILER,
        "batch_doc": f"[{', '.join(map(str, map(symbolic.canon, s.batch)))}]" if s.batch
        else "",
        "doc": ", ".join(x for x in ("A stored transposed" if s.trans_a else "",
                                     "B stored transposed" if s.trans_b else "") if x)
        or "both operands row-major",
        "shape_doc": shape_doc(s),
    }
    jenv = env()
    files = {
        f"{s.name}.cpp": jenv.get_template("matmul_mix.cpp.j2" if epi is not None
                                          else "matmul.cpp.j2").render(ctx),
        f"{s.name}_tiling.h": jenv.get_template("matmul_tiling.h.j2").render(ctx),
        f"{s.name}_tiling.cpp": jenv.get_template("matmul_tiling.cpp.j2").render(ctx),
    }
    t = s.tiling
    manifest: dict[str, Any] = {
        "name": s.name, "node": s.node, "kind": s.kernel_kind,
        "inputs": [io_entry(io) for io in ins],
        "outputs": [io_entry(io) for io in s.outputs],
        "matmul": {"M": symbolic.canon(s.M), "N": symbolic.canon(s.N),
                   "K": symbolic.canon(s.K), "batch": [symbolic.canon(d) for d in s.batch],
                   "a": s.a, "b": s.b, "trans_a": s.trans_a, "trans_b": s.trans_b,
                   **({"org_shape": list(s.pitches), "c_strides": list(s.c_strides or ())}
                      if s.pitches else {})},
        "tiling_fields": ["cube (TCubeTiling)", "M", "N", "K", "coresM", "coresN", "nBatch",
                          "na", "nb", "nc", "nDims", "bd", "sa", "sb"] + (
                              ["sc", "orgM", "orgN", "orgKa", "orgKb", "orgKc"]
                              if s.pitches else []),
        "cube_tiling": t.fields() if t is not None else None,
        "block_dim": "the cube cores the tiling uses (usedCoreNum): min(cube cores, batch x "
                     "coresM x coresN)",
        "tiling_function": f"{s.name}_tiling",
        "sources": sorted(files),
        "notes": list(s.notes),
        "buffers": bplan.describe(),
    }
    return Rendered(s, ir, files, manifest, bplan)
