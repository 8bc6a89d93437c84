"""SuperKernel: one launch for a scope of kernels, barriers exactly at data dependencies, the
same outputs as separate launches (cores run as threads with a real barrier)."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import targets
from graphkernel.codegen.backend import SimBackend, render_all, render_supers, schedules
from graphkernel.codegen.sim.execute import SimLibrary
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
FLAGS = "--opt_level=2 --enable_super_kernel --composite_op_limit_size=2"


def two_chains() -> Graph:
    """Chain A (x*0.5 -> exp -> |.| -> sqrt) and chain B (x+1 -> tanh -> sigmoid -> neg),
    cut into small kernels by the op limit: some kernels depend on the one before, some not."""
    g = Graph("sk")
    x = g.add_input("x", TensorType((64, 96), "float32"))

    def n(op, ins, name):
        return g.add_node(op, ins, name=name).output

    c = lambda v: g.const(np.float32(v))  # noqa: E731
    a1 = n("Exp", [n("Mul", [x, c(0.5)], "a1m")], "a1")
    b1 = n("Tanh", [n("Add", [x, c(1.0)], "b1a")], "b1")
    a2 = n("Sqrt", [n("Abs", [a1], "a2a")], "a2")
    b2 = n("Neg", [n("Sigmoid", [b1], "b2s")], "b2")
    g.set_outputs([a2, b2])
    return g


@pytest.fixture(scope="module")
def compiled():
    res = graphkernel.compile(two_chains(), f"{FLAGS} --enable_single_node_fusion", env={})
    rendered = render_all(schedules(res))
    supers = render_supers(res, rendered)
    return res, supers, SimLibrary(rendered, supers)


def test_scope_becomes_one_launch_with_barriers_only_at_dependencies(compiled):
    res, supers, _ = compiled
    (group,) = res.analyses.super_kernels
    kernels = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert group.members == kernels and len(kernels) >= 5
    written_since: set[int] = set()
    for k, barrier in zip(kernels, group.barriers, strict=True):
        reads_fresh = any(id(v) in written_since for v in k.inputs)
        assert barrier == reads_fresh, (k.name, barrier)
        if barrier:
            written_since = set()
        written_since |= {id(v) for v in k.outputs}
    assert not all(group.barriers[1:]), "an independent neighbour got a barrier"
    assert any(group.barriers), "a dependency got no barrier"
    (sr,) = supers
    assert sr.source.count("SyncAll()") == sum(group.barriers)
    # each later kernel's TPipe takes the UB again once every pipe of the previous is done
    assert sr.source.count("PipeBarrier<PIPE_ALL>()") == len(kernels) - 1
    summary = res.report.extra["super_kernel_summary"]
    assert summary["launches_after"] == 1 and summary["launches_before"] == len(kernels)
    spec = targets.load("ascend910b")
    assert summary["modeled_us_saved"] == pytest.approx((len(kernels) - 1) *
                                                         spec.launch_overhead_us)


def test_superkernel_outputs_equal_separate_launches(compiled):
    res, supers, lib = compiled
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)}
    separate: dict[str, np.ndarray] = {}
    backend = SimBackend.for_result(res, library=lib)

    def capture(node, args, out_shapes):
        outs = backend(node, args, out_shapes)
        separate.update({v.name: o for v, o in zip(node.outputs, outs, strict=True)})
        return outs

    Interpreter(res.graph, kernel_runner=capture).run(feeds)
    (sr,) = supers
    arrays, block, counts = lib.run_super(
        sr.name, {id(res.graph.inputs[0]): feeds["x"]}, targets.load("ascend910b"))
    assert block == max(st.block_dim for st in backend.stats.values())
    for k in sr.group.members:
        for v in k.outputs:
            np.testing.assert_array_equal(arrays[id(v)], separate[v.name])
    assert counts.gm_read and counts.gm_written
    assert counts.syncs >= (len(sr.group.members) - 1) * block  # a barrier per core and seam


def test_the_seam_barrier_is_what_orders_the_reused_unified_buffer(compiled):
    """Each sub-kernel's TPipe takes the UB from its start; without the PIPE_ALL seam the
    next kernel's first copy in would overwrite bytes the previous kernel's pipes may still
    be using, and the simulator says so."""
    from graphkernel.codegen.sim.execute import SuperRendered
    from graphkernel.codegen.sim.runner import SimulatorError

    res, supers, _ = compiled
    (sr,) = supers
    name = sr.name + "_noseam"
    cut = SuperRendered(name, sr.group, sr.members, sr.source.replace(
        "    PipeBarrier<PIPE_ALL>();\n", "").replace(sr.name, name))
    lib = SimLibrary(sr.members, [cut])
    x = np.ones((64, 96), np.float32)
    with pytest.raises(SimulatorError, match=r"overwrites UB byte \d+ that PIPE_\w+ (reads|wrote)"):
        lib.run_super(name, {id(res.graph.inputs[0]): x}, targets.load("ascend910b"))


def test_scope_patterns_select_kernels_and_dynamic_shapes_do_not_qualify():
    g = two_chains()
    res = graphkernel.compile(g, f"{FLAGS} --super_kernel_scope=a1*,a2*", env={})
    (group,) = res.analyses.super_kernels
    assert all(any(o.startswith(("a1", "a2")) for o in k.origin) for k in group.members)
    dyn = Graph("dyn")
    x = dyn.add_input("x", TensorType(("b", 96), "float32"))
    h = dyn.add_node("Exp", [dyn.add_node("Mul", [x, dyn.const(np.float32(2))]).output]).output
    dyn.set_outputs([dyn.add_node("Sqrt", [dyn.add_node("Abs", [h]).output]).output])
    assert graphkernel.compile(dyn, FLAGS, env={}).analyses.super_kernels == []


def test_compile_writes_the_superkernel_source(tmp_path):
    from graphkernel.cli import main
    from graphkernel.frontends.json_format import save_graph

    save_graph(two_chains(), tmp_path / "g.json")
    assert main(["compile", str(tmp_path / "g.json"), "--flags", FLAGS, "-o",
                 str(tmp_path / "out")]) == 0
    import json

    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    (sk,) = manifest["super_kernels"]
    text = (tmp_path / "out" / "kernels" / f"{sk['name']}.cpp").read_text()
    assert "SyncAll" in text and "#define GK_NO_ENTRY" in text
    assert all((tmp_path / "out" / "kernels" / f"{k}.cpp").exists() for k in sk["kernels"])
