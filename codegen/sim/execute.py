"""Run generated kernels in the CPU simulator: one shared library for a batch of kernels, the
generated host tiling function called with the actual shapes, every block launched."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.codegen.sim.runner import Counts, SimulatorError, build, launch
from graphkernel.codegen.targets import Target
from graphkernel.codegen.vector.render import Rendered
from graphkernel.ir import DType

_NP = {DType.float32: np.dtype(np.float32), DType.float16: np.dtype(np.float16),
       DType.bool: np.dtype(np.bool_)}


# TCubeTiling's fields in the simulator's order (codegen/sim/matmul_sim.h)
CUBE_FIELDS = ("usedCoreNum", "M", "N", "Ka", "Kb", "singleCoreM", "singleCoreN",
               "singleCoreK", "baseM", "baseN", "baseK", "depthA1", "depthB1", "stepM", "stepN",
               "stepKa", "stepKb", "isBias", "iterateOrder", "transLength")


def _is_cube(r: Rendered) -> bool:
    return getattr(r.schedule, "kernel_kind", "vector") != "vector"


def _np_dtype(dt: DType) -> np.dtype:
    return _NP.get(dt) or dt.np


def sim_source(r: Rendered) -> str:
    """The kernel's files as one translation unit, plus the simulator's launch glue."""
    s = r.schedule
    nargs = len(s.inputs) + len(s.outputs) + 2
    args = ", ".join(f"a[{i}]" for i in range(nargs))
    parts = []
    v = s.variant
    if v is not None:  # its class (no entry) and tiling function, before the kernel's
        parts = [r.files[f"{v.name}_tiling.h"], r.files[f"{v.name}_tiling.cpp"],
                 "#define GK_NO_ENTRY", f'#line 1 "{v.name}.cpp"', r.files[f"{v.name}.cpp"],
                 "#undef GK_NO_ENTRY"]
    return "\n".join([
        *parts, r.files[f"{s.name}_tiling.h"], r.files[f"{s.name}_tiling.cpp"],
        f'#line 1 "{s.name}.cpp"', r.files[f"{s.name}.cpp"],
        f"static void gk_sim_call_{s.name}(uint8_t** a) {{ {s.name}({args}); }}",
        f"GK_SIM_LAUNCHER({s.name}, {nargs})",
    ])


@dataclass
class Launch:
    outputs: list[np.ndarray]
    block_dim: int
    counts: Counts
    tiling: dict[str, int]

    @property
    def gm_read(self) -> int:
        return self.counts.gm_read

    @property
    def gm_written(self) -> int:
        return self.counts.gm_written


@dataclass
class SuperRendered:
    """A rendered SuperKernel: its group, its sub-kernels (rendered) and its source."""

    name: str
    group: Any
    members: list[Rendered]
    source: str


def super_sim_source(sr: SuperRendered) -> str:
    from graphkernel.codegen.superkernel import buffers

    nargs = len(buffers(sr.group)[0]) + 2
    args = ", ".join(f"a[{i}]" for i in range(nargs))
    return "\n".join([
        sr.source,
        f"static void gk_sim_call_{sr.name}(uint8_t** a) {{ {sr.name}({args}); }}",
        f"GK_SIM_LAUNCHER_SYNC({sr.name}, {nargs})",
    ])


def check_plan(r: Rendered, fields: dict[str, int], counts: Counts) -> None:
    """The UB the launch reserved stays within the buffer plan's bound for the tile the host
    tiling chose: the budget the tiling solved is the budget the kernel used."""
    if not fields or not counts.ub_peak:
        return
    if _is_cube(r):  # a base tile: baseM rows of baseN columns
        chosen, rt, ctp = r, fields["baseM"], fields["baseN"]
    else:
        chosen = r.variant if fields["key"] == 1 and r.variant is not None else r
        rt, ctp = fields["rt"], fields["ctp"]
    bound = chosen.plan.budget().bytes(rt, ctp)
    if counts.ub_peak > bound:
        raise SimulatorError(
            f"{chosen.name}: InitBuffer reserved {counts.ub_peak} bytes of UB, the buffer plan "
            f"allows {bound} for a tile of {rt} rows x {ctp} columns "
            f"(a buffer the plan does not count: {[b.name for b in chosen.plan.buffers]})")


def check_group_plan(lib: SimLibrary, r: Rendered, shapes: Sequence[Sequence[int]],
                     spec: Target, counts: Counts) -> None:
    """A product group's launch reserved no more UB than the largest of its products' buffer
    plans allows for the tile that product's host tiling chose (the products' TPipes take the
    UB one after another)."""
    if not counts.ub_peak:
        return
    n_in = len(r.schedule.inputs)
    bounds = []
    for m, sub in zip(r.schedule.members, r.members, strict=True):
        mine = [shapes[i if w == "in" else n_in + i] for w, i in m.inputs] + [
            shapes[n_in + o] for o in m.outputs]
        _, block, f = lib.tiling(sub.name, mine, spec, cube=True)
        if block:
            bounds.append((sub.plan.budget().bytes(f["baseM"], f["baseN"]), sub.name))
    bound = max(bounds, default=(0, r.name))
    if counts.ub_peak > bound[0]:
        raise SimulatorError(
            f"{r.name}: InitBuffer reserved {counts.ub_peak} bytes of UB, the largest of its "
            f"products' buffer plans ({bound[1]}) allows {bound[0]}")


class SimLibrary:
    """Kernels (and SuperKernels over them) compiled together: one g++ run, cached by
    content."""

    def __init__(self, kernels: Sequence[Rendered], supers: Sequence[SuperRendered] = ()):
        self.kernels = {r.name: r for r in kernels}  # equal names are equal kernels
        for sr in supers:
            for r in sr.members:
                self.kernels.setdefault(r.name, r)
        self.supers = {sr.name: sr for sr in supers}
        self.workspace: dict[str, int] = {}  # kernel -> the user workspace its tiling asked
        srcs = [sim_source(r) for r in self.kernels.values()]
        srcs += [super_sim_source(sr) for sr in self.supers.values()]
        self.lib = build(srcs) if srcs else None

    def tiling(self, name: str, shapes: Sequence[Sequence[int]], spec: Target,
               cube: bool | None = None) -> tuple[bytes, int, dict[str, int]]:
        """The host tiling function's struct, blockDim and fields for ``shapes`` (``cube``:
        the kernel is a cube one, for a product group's product, which is no kernel of the
        library's own)."""
        lib = self.lib
        if cube is None:
            cube = name in self.kernels and _is_cube(self.kernels[name])
        cores = spec.aic_cores if cube else spec.aiv_cores  # a cube kernel: one per AIC
        size = getattr(lib, f"{name}_tiling_size")
        size.restype = ctypes.c_uint32
        n = size()
        flat = [int(d) for shape in shapes for d in shape] or [0]
        arr = (ctypes.c_int64 * len(flat))(*flat)
        out = (ctypes.c_uint8 * n)()
        block = ctypes.c_uint32()
        ws = ctypes.c_uint64()
        fn = getattr(lib, f"{name}_tiling")
        fn.restype = ctypes.c_int32
        rc = fn(arr, ctypes.c_uint32(cores), ctypes.c_uint64(spec.ub_bytes), out,
                ctypes.byref(block), ctypes.byref(ws))
        if rc != 0:
            raise SimulatorError(f"{name}: the tiling function found no tile that fits the "
                                 f"Unified Buffer for shapes {[list(s) for s in shapes]}")
        self.workspace[name] = int(ws.value)  # bytes the kernel's own work needs
        raw = bytes(out)
        if cube:  # the TCubeTiling at the struct's start
            return raw, int(block.value), dict(zip(CUBE_FIELDS, np.frombuffer(
                raw[:4 * len(CUBE_FIELDS)], dtype=np.int32).tolist(), strict=True))
        head = np.frombuffer(raw[:64], dtype=np.uint64) if n >= 64 else None
        fields = {}
        if head is not None:
            M, L = int(head[0]), int(head[1])
            rt, ct, ctp, ncol = np.frombuffer(raw[16:32], dtype=np.uint32).tolist()
            fields = {"M": M, "L": L, "rt": rt, "ct": ct, "ctp": ctp, "nColTiles": ncol,
                      "units": int(head[4]), "blockDim": int(head[5]), "key": int(head[6]),
                      "nBatch": int(head[7])}
        return raw, int(block.value), fields

    def run_super(self, name: str, external: dict[int, np.ndarray], spec: Target
                  ) -> tuple[dict[int, np.ndarray], int, Counts]:
        """Launch a SuperKernel once. ``external`` maps id(value) of each external input
        buffer to its array; returns (id(value) -> array for every buffer, blockDim, what the
        launch did)."""
        from graphkernel.codegen.superkernel import buffers

        sr = self.supers[name]
        bufs, arg_index = buffers(sr.group)
        arrays: dict[int, np.ndarray] = {}
        for v in bufs:
            if id(v) in external:
                a = np.asarray(external[id(v)]).astype(_np_dtype(v.dtype), copy=False)
                arrays[id(v)] = a if a.flags.c_contiguous else a.copy()
            else:
                arrays[id(v)] = np.zeros(tuple(int(d) for d in v.shape), _np_dtype(v.dtype))
        tiling, block = bytearray(), 0
        for r, idx in zip(sr.members, arg_index, strict=True):
            shapes = [arrays[id(bufs[i])].shape for i in idx]  # inputs, then outputs
            raw, b, _ = self.tiling(r.name, shapes, spec)
            tiling += raw + bytes(-len(raw) % 8)
            block = max(block, b)
        ordered = [arrays[id(v)] for v in bufs]
        if block == 0:
            return arrays, 0, Counts(0, 0, 0, 0, 0, 0)
        counts = launch(self.lib, name, [*ordered, np.zeros(32, np.uint8),
                                         np.frombuffer(bytes(tiling), np.uint8).copy()],
                        block, spec.ub_bytes)
        return arrays, block, counts

    def run(self, name: str, inputs: Sequence[np.ndarray], spec: Target,
            out_shapes: Sequence[Sequence[int]] | None = None) -> Launch:
        """Launch a kernel. ``out_shapes``: its outputs' shapes, as the framework knows them
        (needed when a symbol is no whole dim of an input: ``2*s0`` out of ``s0*s1``); by
        default evaluated from the inputs' shapes."""
        r = self.kernels[name]
        s = r.schedule
        if len(inputs) != len(s.inputs):
            raise SimulatorError(f"{name}: {len(inputs)} inputs given, {len(s.inputs)} expected")
        ins = []
        for io, a in zip(s.inputs, inputs, strict=True):
            arr = np.asarray(a).astype(_np_dtype(io.dtype), copy=False)
            ins.append(arr if arr.flags.c_contiguous else arr.copy())  # keeps 0-d as 0-d
        if out_shapes is None:
            from graphkernel import symbolic

            env: dict[str, int] = {}
            for io, a in zip(s.inputs, ins, strict=True):
                for d, actual in zip(io.shape, a.shape, strict=True):
                    symbolic.bind(d, actual, env)
            out_shapes = [tuple(symbolic.evaluate(d, env) for d in io.shape)
                          for io in s.outputs]
        outs = [np.zeros(tuple(shape), _np_dtype(io.dtype))
                for shape, io in zip(out_shapes, s.outputs, strict=True)]
        raw, block, fields = self.tiling(name, [*(a.shape for a in ins),
                                                *(o.shape for o in outs)], spec)
        if block == 0:
            return Launch(outs, 0, Counts(0, 0, 0, 0, 0, 0), fields)
        tiling = np.frombuffer(raw, dtype=np.uint8).copy()
        workspace = np.zeros(max(32, self.workspace.get(name, 0)), np.uint8)
        counts = launch(self.lib, name, [*ins, *outs, workspace, tiling], block, spec.ub_bytes)
        if r.members is not None:  # a product group: each product's plan for its own tile
            shapes = [*(a.shape for a in ins), *(o.shape for o in outs)]
            check_group_plan(self, r, shapes, spec, counts)
        else:
            check_plan(r, fields, counts)
        # the tiling bytes the kernel unpacks are an argument, not data traffic
        return Launch(outs, block, counts, fields)
