"""A vendor CPU-model harness for every generated kernel.

CANN ships a CPU model of the AI core (tikicpulib): a kernel compiled with
``ASCENDC_CPU_DEBUG`` runs on x86 through its launch macro (``ICPU_RUN_KF``) on buffers from
its ``GmAlloc``, with the API's own checks switched on. ``graphkernel compile -o DIR`` writes,
beside each kernel, a driver for it (``kernels/cpu/<kernel>_cpu.cpp``, from
``templates/cpu_driver.cpp.j2``) and the data it runs on (``kernels/cpu/<kernel>/``): seeded
random inputs of the kernel's shapes (symbolic dims at ``DIMS``) and the numpy interpreter's
outputs of the kernel's subgraph for them, computed in fp32 and rounded once to each
output's type, as the kernel does. The generated CMake builds the drivers against
tikicpulib (``-DGK_CPU_MODEL=ON``) and ``ctest`` runs them; so anyone with the CANN toolkit
and no NPU runs graphkernel's kernels under Huawei's own model. The drivers also run in
graphkernel's simulator (it provides the same launch surface), which is how they are tested
here without CANN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.codegen.kernel_ir import comment_text
from graphkernel.codegen.render import Rendered
from graphkernel.codegen.render import env as _env
from graphkernel.codegen.targets import Target
from graphkernel.errors import GraphKernelError
from graphkernel.ir import DType, Graph

FOLDER = "cpu"              # under kernels/
DIMS = 4                    # each symbolic dim of the data, as `graphkernel run` takes them
DATA_LIMIT = 64 << 20       # bytes of inputs and expected outputs written per kernel at most
# comparison of a float output (rtol, atol): accuracy.md's per-dtype tolerances; for fp32 the
# order of a fused kernel's reductions and the model's transcendental functions differ from
# numpy's by more than torch's default, so 1e-5
TOLERANCE = {DType.float32: (1e-5, 1e-5), DType.float16: (1e-3, 1e-5),
             DType.bfloat16: (1.6e-2, 1e-5)}
ELEM = {DType.float32: "F32", DType.float16: "F16", DType.bfloat16: "BF16", DType.int8: "I8",
        DType.uint8: "U8", DType.int16: "I16", DType.int32: "I32", DType.int64: "I64",
        DType.bool: "BOOL"}
MODE = {"vector": "AIV_MODE", "cube": "AIC_MODE", "mix": "MIX_MODE"}  # tikicpulib's KernelMode


@dataclass
class Harness:
    """One kernel's driver and data (file name under kernels/cpu -> contents)."""

    kernel: str
    files: dict[str, str | bytes]
    note: str = ""  # why there is no data, if there is none


def kind_of(r: Rendered) -> str:
    return r.manifest.get("kind", "vector")


def _buffers(arrays: list[np.ndarray], dtypes: list[DType], stem: str, outputs: bool
             ) -> list[dict[str, Any]]:
    out = []
    for i, (a, dt) in enumerate(zip(arrays, dtypes, strict=True)):
        rtol, atol = TOLERANCE.get(dt, (0.0, 0.0)) if outputs else (0.0, 0.0)
        out.append({"file": f"{stem}{i}.bin", "elem": ELEM[dt], "count": a.size,
                    "bytes": a.nbytes, "rtol": repr(rtol), "atol": repr(atol),
                    "doc": f"{dt} {list(a.shape)}"})
    return out


def build(r: Rendered, graph: Graph, target: Target, seed: int = 0,
          dims: Mapping[str, int] | None = None) -> Harness:
    """The driver and data of kernel ``r`` (its first instance's node in ``graph``)."""
    from graphkernel.interpreter import Interpreter, random_inputs

    s = r.schedule
    node = graph.node(s.node)
    sub = node.subgraph
    kind = kind_of(r)
    ins = [io.dtype for io in s.inputs]
    outs = [io.dtype for io in s.outputs]
    name = s.name
    if any(dt not in ELEM for dt in ins + outs) or kind not in MODE:
        return Harness(name, {}, f"no driver: a {kind} kernel with an element type outside "
                                 f"{sorted(str(d) for d in ELEM)}")
    env = {**{k: DIMS for k in _symbols(sub)}, **(dims or {})}
    placeholders = _placeholders(sub, ins, outs, env)
    if placeholders is not None:  # (too large to write: its data is never made)
        arrays, expected = placeholders
    else:
        feeds = random_inputs(sub, seed=seed, dims=env)
        arrays = [np.ascontiguousarray(feeds[v.name]).astype(dt.np, copy=False)
                  for v, dt in zip(sub.inputs, ins, strict=True)]
        # fp32 inside, rounded once to each output's type: what the kernel computes
        got = Interpreter(sub, compute_dtype=DType.float32).run(feeds)
        expected = [np.ascontiguousarray(np.asarray(a).astype(dt.np)) for a, dt in
                    zip(got, outs, strict=True)]
    total = sum(a.nbytes for a in arrays + expected)
    shapes = [str(int(d)) for a in arrays + expected for d in a.shape]
    cube = kind != "vector"
    ctx = {
        "name": name, "node_comment": comment_text(s.node), "mode": MODE[kind],
        "nargs": len(ins) + len(outs) + 2,
        "inputs": _buffers(arrays, ins, "input", False),
        "outputs": _buffers(expected, outs, "expected", True),
        "shapes": shapes or ["0"],
        "cores": target.aic_cores if cube else target.aiv_cores,
        "cores_doc": ("the target's AI Cube cores: one block per AIC" if cube else
                      "the target's AI Vector cores"),
        "ub": target.ub_bytes, "target": target.name,
    }
    files: dict[str, str | bytes] = {
        f"{name}_cpu.cpp": _env().get_template("cpu_driver.cpp.j2").render(ctx)}
    if total > DATA_LIMIT:
        return Harness(name, files, f"no data: {total} bytes of inputs and outputs exceed "
                                    f"{DATA_LIMIT} (give smaller static shapes)")
    for b, a in zip(ctx["inputs"] + ctx["outputs"], arrays + expected, strict=True):
        files[f"{name}/{b['file']}"] = a.tobytes()
    return Harness(name, files)


def _placeholders(sub: Graph, ins: list[DType], outs: list[DType], env: Mapping[str, int]
                  ) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """When the kernel's inputs and outputs at ``env`` hold more than ``DATA_LIMIT`` bytes
    (no data is written for it), arrays of their shapes that hold no memory (a zero-stride
    view of one element), so that the driver is written without the data ever being made;
    else None. A model's legal sizes (up to 2^40 elements) would otherwise be allocated and
    run here, only to be dropped."""
    try:
        shapes = [v.type.concrete(env) for v in (*sub.inputs, *sub.outputs)]
    except (GraphKernelError, KeyError, ValueError, TypeError):  # (unbound: made as before)
        return None
    dts = [*ins, *outs]
    if sum(math.prod(sh) * dt.np.itemsize for sh, dt in zip(shapes, dts, strict=True)) \
            <= DATA_LIMIT:
        return None
    made = [np.broadcast_to(np.zeros((), dt.np), sh) for sh, dt in zip(shapes, dts, strict=True)]
    return made[:len(ins)], made[len(ins):]


def _symbols(g: Graph) -> set[str]:
    from graphkernel import symbolic

    return {x for v in g.inputs for d in v.type.shape for x in symbolic.symbols(d)}
