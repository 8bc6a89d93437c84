"""Generated kernels of a compiled graph: written out as a kernel project, or run in the CPU
simulator as the interpreter's ``backend="sim"``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphkernel import progress
from graphkernel.codegen import cost, extern, harness, targets
from graphkernel.codegen.cube.conv import ConvSchedule, render_conv
from graphkernel.codegen.cube.group import GroupSchedule, render_group
from graphkernel.codegen.cube.render import render_matmul
from graphkernel.codegen.cube.schedule import MatmulSchedule
from graphkernel.codegen.trisolve import TriSolveSchedule, render_trisolve
from graphkernel.codegen.vector.render import Rendered, io_entry, render
from graphkernel.codegen.vector.schedule import Schedule
from graphkernel.codegen.window import WindowSchedule, render_window
from graphkernel.ir import Graph, Node
from graphkernel.outputs import Folder
from graphkernel.pipeline import collector_paused

# Test hook: (kernel name, files) -> files, applied after rendering (a deliberate miscompile).
CORRUPT: list[Callable[[str, dict[str, str]], dict[str, str]]] = []


def schedules(result: Any) -> dict[str, Schedule]:
    """The codegen pass's schedules of the kernels still in ``result.graph``."""
    scheds = result.analyses.codegen
    names = {n.name for n in result.graph.nodes if n.op == "GraphKernel"}
    return {k: s for k, s in scheds.items() if k in names}


def shared_kernels(result: Any) -> dict[str, str]:
    """Kernels of ``result.graph`` that run another kernel's code (an equal body): kernel ->
    the kernel whose code it runs (the codegen pass's ``codegen_shared``)."""
    scheds = schedules(result)
    return {k: o for k, o in result.analyses.codegen_shared.items()
            if k in scheds and o in scheds}


def render_all(scheds: Mapping[str, Schedule], shared: Mapping[str, str] | None = None,
               replaced: Mapping[str, Mapping[str, str]] | None = None) -> list[Rendered]:
    """Every schedule rendered, but for the kernels in ``shared`` (they run another's code;
    each is rendered too while a CORRUPT hook is installed, so that one instance can be
    miscompiled on its own). ``replaced``: kernel -> files that replace generated ones (the
    user's, checked by graphkernel.replacements)."""
    out = []
    skip = set(shared or ()) if not CORRUPT else set()
    todo = [name for name in sorted(scheds) if name not in skip]
    with progress.task("generating kernels", len(todo)) as shown:
        for name in todo:
            shown.describe(name)
            s = scheds[name]  # a cube or MIX kernel is rendered on the Matmul API
            r = render_matmul(s) if isinstance(s, MatmulSchedule) else \
                render_group(s) if isinstance(s, GroupSchedule) else \
                render_window(s) if isinstance(s, WindowSchedule) else \
                render_trisolve(s) if isinstance(s, TriSolveSchedule) else \
                render_conv(s) if isinstance(s, ConvSchedule) else render(s)
            for hook in CORRUPT:
                r.files = hook(r.name, dict(r.files))
            if replaced and r.name in replaced:
                r.files = {**r.files, **replaced[r.name]}
            out.append(r)
            shown.advance()
    return out


def render_supers(result: Any, rendered: Sequence[Rendered]) -> list[Any]:
    """The compiled graph's SuperKernels, rendered over its rendered kernels."""
    from graphkernel.codegen.sim.execute import SuperRendered
    from graphkernel.codegen.superkernel import render as render_super
    from graphkernel.codegen.superkernel import symbol

    by_node = {r.schedule.node: r for r in rendered}
    out = []
    for g in result.analyses.super_kernels:
        subs = [by_node[k.name] for k in g.members]
        out.append(SuperRendered(symbol(g, subs), g, subs, render_super(g, subs)))
    return out


@dataclass
class KernelStats:
    name: str
    node: str
    launches: int = 0
    block_dim: int = 0
    gm_read: int = 0
    gm_written: int = 0
    ideal: int = 0
    scalar: int = 0      # scalar GetValue/SetValue (UB or GM), all cores of all launches
    syncs: int = 0       # SetFlag/WaitFlag pairs and PipeBarrier<PIPE_ALL>
    vector: int = 0      # vector instructions issued
    pipe_us: float = 0.0  # the cost model's time for the scalar accesses and syncs
    ub_peak: int = 0     # the most UB one core reserved (within the buffer plan's bound)
    input_reads: list[int] = field(default_factory=list)  # GM bytes read of each input
    tiling: dict[str, int] = field(default_factory=dict)


class SimBackend:
    """Runs a compiled graph's GraphKernel nodes through their generated code."""

    def __init__(self, graph: Graph, scheds: Mapping[str, Schedule], target: str = "ascend910b",
                 interpret: Sequence[str] = (), library: Any = None,
                 shared: Mapping[str, str] | None = None,
                 replaced: Mapping[str, Mapping[str, str]] | None = None):
        from graphkernel.codegen.sim.execute import SimLibrary

        self.graph = graph
        self.spec = targets.load(target)
        self.interpret = set(interpret)  # kernels run by the interpreter instead (bisection)
        # every kernel is built (one library whatever `interpret` is, so bisection's runs
        # share it); a library built for many graphs at once may be passed in. A kernel in
        # `shared` runs the code of the kernel it maps to (an equal body): built once.
        rendered = render_all(scheds, shared, replaced)
        self.lib = library or SimLibrary(rendered)
        by_node = {r.schedule.node: r for r in rendered}
        by_node.update({k: by_node[o] for k, o in (shared or {}).items() if k not in by_node})
        self.rendered = {k: r for k, r in by_node.items() if k not in self.interpret}
        self.stats: dict[str, KernelStats] = {}
        self.unscheduled: list[str] = []

    @classmethod
    def for_result(cls, result: Any, interpret: Sequence[str] = (), library: Any = None
                   ) -> SimBackend:
        return cls(result.graph, schedules(result), result.config.target, interpret, library,
                   shared_kernels(result), getattr(result, "replacements", None))

    def __call__(self, node: Node, args: list[np.ndarray],
                 out_shapes: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
        r = self.rendered.get(node.name)
        if r is None:
            from graphkernel.interpreter import Interpreter

            if node.name not in self.interpret:
                self.unscheduled.append(node.name)
            sub = node.subgraph
            return Interpreter(sub).run({v.name: a for v, a in zip(sub.inputs, args,
                                                                   strict=True)})
        launch = self.lib.run(r.name, args, self.spec, out_shapes)
        st = self.stats.setdefault(node.name, KernelStats(r.name, node.name))
        st.launches += 1
        st.block_dim = launch.block_dim
        st.gm_read += launch.gm_read
        st.gm_written += launch.gm_written
        c = launch.counts
        st.scalar += c.scalar
        st.syncs += c.syncs
        st.vector += c.vector
        st.ub_peak = max(st.ub_peak, c.ub_peak)
        reads = c.reads[:len(args)] or (0,) * len(args)
        st.input_reads = [a + b for a, b in zip(st.input_reads or [0] * len(args), reads,
                                                 strict=True)]
        st.pipe_us += cost.pipe_us(c.scalar, c.syncs, launch.block_dim, self.spec)
        st.ideal += sum(np.asarray(a).size * io.dtype.itemsize
                        for a, io in zip(args, r.schedule.inputs, strict=True))
        st.ideal += sum(o.nbytes for o in launch.outputs)
        st.tiling = launch.tiling
        return launch.outputs


def run_sim(result: Any, feeds: Any, interpret: Sequence[str] = (), library: Any = None
            ) -> tuple[list[np.ndarray], SimBackend]:
    """Run a compiled graph with its kernels in the simulator; ops outside kernels (extern
    operators included: an extern kernel is checked against its reference) run through
    their numpy reference."""
    from graphkernel.interpreter import Interpreter

    backend = SimBackend.for_result(result, interpret, library)
    launches = sum(1 for n in result.graph.nodes if n.op == "GraphKernel")
    with progress.task("running kernels in the simulator", launches) as shown:
        def run_kernel(node: Node, args: list[np.ndarray],
                       out_shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
            shown.describe(node.name)
            out = backend(node, args, out_shapes)
            shown.advance()
            return out

        return Interpreter(result.graph, kernel_runner=run_kernel).run(feeds), backend




def cmake_lists(spec: targets.Target, kernels: Sequence[str], supers: Sequence[str]) -> str:
    """The kernel project's CMakeLists.txt (``templates/CMakeLists.txt.j2``): the device build
    for the target's parts (SOC_VERSION) and the CPU-model build of the drivers."""
    from graphkernel.codegen.realcheck import RECIPES
    from graphkernel.codegen.render import env

    recipe = RECIPES.get(spec.npu_arch)
    return env().get_template("CMakeLists.txt.j2").render(
        target=spec, kernels=kernels, supers=supers,
        cpu_model=recipe.cpu_model if recipe else spec.soc_versions[0])


def _value_entry(name: str, v: Any) -> dict[str, Any]:
    return {"name": name, "dtype": str(v.dtype), "shape": list(v.shape),
            "producer": v.producer.name if v.producer is not None else None}


def _binding(graph: Graph, node: str) -> dict[str, Any]:
    """The compiled graph's values a kernel reads and writes, in argument order (a graph
    input or output appears under its name in the model), and the user's nodes it holds."""
    n = graph.node(node)
    return {"reads": [v.name for v in n.inputs], "writes": [v.name for v in n.outputs],
            "origin": list(n.origin)}


def write_project(result: Any, out_dir: str | Path, also: Sequence[str | Path] = ()
                  ) -> list[Path]:
    """``out_dir/kernels/<name>.cpp, _tiling.h, _tiling.cpp``, each kernel's CPU-model driver
    and data (``kernels/cpu/``, codegen/harness.py), ``CMakeLists.txt`` and, last,
    ``manifest.json`` for every distinct generated kernel (kernels of equal bodies share one;
    the manifest maps every kernel instance to its code). The manifest's ``files`` lists
    everything of this run in ``out_dir`` (these files and ``also``, the others written
    there), so the next run into the folder can remove what it does not write again
    (graphkernel.outdir)."""
    with collector_paused():
        return _write_project(result, out_dir, also)


def _write_project(result: Any, out_dir: str | Path, also: Sequence[str | Path]) -> list[Path]:
    from graphkernel.outdir import FORMAT, MANIFEST, file_entries

    out = Folder(out_dir)  # every file name is checked safe and inside out_dir
    scheds = schedules(result)
    shared = shared_kernels(result)
    rendered = render_all(scheds, shared, getattr(result, "replacements", None))
    written = []
    for r in rendered:
        for fname, text in sorted(r.files.items()):
            written.append(out.write_text(f"kernels/{fname}", text))
    supers = render_supers(result, rendered)
    for sr in supers:
        head = "#define GK_NO_ENTRY\n" + "".join(
            f'#include "{r.name}.cpp"\n' for r in sr.members) + "#undef GK_NO_ENTRY\n"
        written.append(out.write_text(f"kernels/{sr.name}.cpp", head + sr.source))
    spec = targets.load(result.config.target)
    harnesses = [harness.build(r, result.graph, spec) for r in rendered]
    for h in harnesses:  # each kernel's CPU-model driver and data (codegen/harness.py)
        for fname, data in sorted(h.files.items()):
            rel = f"kernels/{harness.FOLDER}/{fname}"
            written.append(out.write_text(rel, data) if isinstance(data, str)
                           else out.write_bytes(rel, data))
    written.append(out.write_text("kernels/CMakeLists.txt", cmake_lists(
        spec, [r.name for r in rendered], [sr.name for sr in supers])))
    graph = result.graph
    code = {r.schedule.node: r.name for r in rendered}
    runs: dict[str, list[str]] = {r.name: [] for r in rendered}
    instances = []
    for node in sorted(scheds):
        s = scheds[node]
        symbol = code[node if node in code else shared[node]]
        runs[symbol].append(node)
        instances.append({"node": node, "kernel": symbol,
                          "inputs": [io_entry(io) for io in s.inputs],
                          "outputs": [io_entry(io) for io in s.outputs],
                          "notes": list(s.notes)} | _binding(graph, node))
    manifest = {
        "format": FORMAT,
        "target": result.config.target,
        "graph": graph.name,
        # the graph's own inputs and outputs, under the model's names
        "inputs": [_value_entry(v.name, v) for v in graph.inputs],
        "outputs": [_value_entry(name, v) for name, v in graph.named_outputs()],
        # each distinct kernel as its first instance's, and the instances that run it
        "kernels": [r.manifest | _binding(graph, r.schedule.node) | {"instances": runs[r.name]}
                    for r in rendered],
        "instances": instances,
        "super_kernels": [{"name": sr.name, "kernels": [r.name for r in sr.members],
                           "barrier_before": [r.name for r, b in zip(
                               sr.members, sr.group.barriers, strict=True) if b],
                           "tiling": "each sub-kernel's tiling struct in order, 8-byte aligned",
                           "block_dim": "max of the sub-kernels' blockDim"}
                          for sr in supers],
        # vendor operators the graph calls as they are (codegen/extern.py): not generated
        "externs": [extern.call(n) | _binding(graph, n.name) for n in graph.nodes
                    if extern.is_extern(n)],
        "fallbacks": result.report.extra.get("fallbacks", []),
        # the CPU-model drivers (kernels/CMakeLists.txt, -DGK_CPU_MODEL=ON)
        "cpu_model": [{"kernel": h.kernel, "driver": f"kernels/{harness.FOLDER}/{h.kernel}_cpu.cpp"
                       if h.files else None, "note": h.note} for h in harnesses],
        **file_entries(out.root, [*also, *written, out.path(MANIFEST)]),
    }
    written.append(out.write_json(MANIFEST, manifest))
    return written
