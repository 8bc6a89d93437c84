"""A transpose that moves the last axis of a value its kernel computes: the kernel holds the
whole value as one tile, a table of byte offsets (built by the scalar unit) places each
element, and one count-form ``Gather`` rearranges the tile in UB before it is stored. The
transpose is then no launch of its own. Checked in the simulator (numbers, and a kernel
with a broken table refused), and against the limit of one Gather (a value too large stays a
transpose kernel of its own)."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import backend as codegen_backend
from graphkernel.codegen.backend import render_all, run_sim, schedules
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.codegen.traffic import launches
from graphkernel.explain import explain
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
RNG = np.random.default_rng(5)


def _scaled_then_moved(shape=(2, 16, 8), split=(2, 2, 8, 8), perm=(0, 3, 1, 2)) -> Graph:
    """Mamba2's ``A * dt`` viewed as chunks, then moved to heads-first for the cumulative
    sums: a product with a per-head vector, a reshape, a transpose of the last axis."""
    g = Graph("moved")
    x = g.add_input("x", TensorType(shape, "float32"))
    w = g.const(RNG.standard_normal(shape[-1:]).astype(np.float32))
    y = g.add_node("Mul", [x, w]).output
    y = g.add_node("Reshape", [y], {"shape": list(split)}).output
    g.set_outputs([g.add_node("Transpose", [y], {"perm": list(perm)}).output])
    return g


def _exp_swapped(shape=(3, 5, 6)) -> Graph:
    """exp(x) with its last two axes swapped: rows of 6 (not a whole UB block of floats)."""
    g = Graph("swapped")
    x = g.add_input("x", TensorType(shape, "float32"))
    e = g.add_node("Exp", [x]).output
    g.set_outputs([g.add_node("Transpose", [e], {"perm": [0, 2, 1]}).output])
    return g


def _exp_moved_before_a_unit_axis(shape=(2, 4, 8, 8, 1)) -> Graph:
    """exp(x) of [.., 8, 8, 1] with the two axes of 8 swapped: the value's last axis has
    extent 1, the rows of 8 before it move (Mamba2's decay times the chunk states). The
    pattern takes it (it moves the last axis of extent other than 1)."""
    g = Graph("unit")
    x = g.add_input("x", TensorType(shape, "float32"))
    e = g.add_node("Exp", [x]).output
    g.set_outputs([g.add_node("Transpose", [e], {"perm": [0, 1, 3, 2, 4]}).output])
    return g


def _moved_input_times(shape=(3, 6, 5)) -> Graph:
    """exp of a kernel input moved to [.., 5, 6], times another input: the transpose joins
    its consumer, which loads the input as it lies and gathers it in UB."""
    g = Graph("moved_in")
    x = g.add_input("x", TensorType(shape, "float32"))
    y = g.add_input("y", TensorType((shape[0], shape[2], shape[1]), "float32"))
    t = g.add_node("Transpose", [x], {"perm": [0, 2, 1]}).output
    g.set_outputs([g.add_node("Mul", [g.add_node("Exp", [t]).output, y]).output])
    return g


def test_a_moved_input_is_gathered_by_the_kernel_that_reads_it():
    """One launch (not a transpose kernel and the product's), its input's Gather in the
    code, and the simulator's numbers match."""
    g = _moved_input_times()
    res = graphkernel.compile(g, "", env={})
    feeds = {"x": RNG.standard_normal((3, 6, 5)).astype(np.float32),
             "y": RNG.standard_normal((3, 5, 6)).astype(np.float32)}
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=1e-6, atol=1e-6)
    assert len(launches(res.graph)) == 1
    (r,) = render_all(schedules(res))
    assert r.schedule.single_tile and "Gather(wf" in r.files[f"{r.name}.cpp"]
    assert [io.transpose is not None for io in r.schedule.inputs] == [True, False]


def _check(g: Graph, shape) -> tuple:
    res = graphkernel.compile(g, "", env={})
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=1e-6, atol=1e-6)
    return res, feeds


@pytest.mark.parametrize("make,shape", [(_scaled_then_moved, (2, 16, 8)),
                                        (_exp_swapped, (3, 5, 6)),
                                        (_exp_moved_before_a_unit_axis, (2, 4, 8, 8, 1))])
def test_a_moved_last_axis_is_transposed_in_the_kernel_that_computes_it(make, shape):
    """One launch (not the product's kernel and a transpose kernel), a Gather in its code,
    and the simulator's numbers match the reference."""
    res, _ = _check(make(), shape)
    assert len(launches(res.graph)) == 1
    (r,) = render_all(schedules(res))
    if make is not _exp_moved_before_a_unit_axis:  # (its rows of one element are stored
        # strided, each to its place: no element crosses a row of the loop space)
        assert r.schedule.single_tile and "Gather(yo0" in r.files[f"{r.name}.cpp"]


def test_a_value_beyond_one_gather_stays_a_transpose_kernel():
    """A value of 64 x 512 floats is more than one Gather moves (255 repeats of 64): the
    transpose is not fused, and the two kernels still match."""
    g = _scaled_then_moved((2, 64, 256), (2, 64, 256), (0, 2, 1))
    res = graphkernel.compile(g, "", env={})
    assert len(launches(res.graph)) == 2
    why = [c["reason"] for c in explain(res)["candidates"] if c["pattern"] == "transpose"]
    assert any("cannot be transposed in UB" in w and "255 repeats" in w for w in why), why


def test_a_broken_table_is_refused_by_the_simulator():
    """The table's offsets are bytes, whole elements of the source: offsets off by two
    bytes make the simulator refuse the kernel at the Gather."""
    g = _exp_swapped()
    feeds = {"x": RNG.standard_normal((3, 5, 6)).astype(np.float32)}

    def misaligned(name, files):
        out = {f: t.replace("(uint32_t)sizeof(CT));", "(uint32_t)sizeof(CT) + 2u);")
               for f, t in files.items()}
        assert out != files
        return out

    codegen_backend.CORRUPT.append(misaligned)
    try:
        with pytest.raises(SimulatorError, match="Gather offset"):
            run_sim(graphkernel.compile(g, "", env={}), feeds)
    finally:
        codegen_backend.CORRUPT.remove(misaligned)


def test_the_table_needs_its_scalar_to_vector_sync():
    """The scalar unit writes the table, the vector unit's Gather reads it: without the
    S_V event pair between them the simulator's pipe model refuses the kernel."""
    g = _exp_swapped()
    feeds = {"x": RNG.standard_normal((3, 5, 6)).astype(np.float32)}

    def unsynced(name, files):
        out = {f: t.replace("Sync<HardEvent::S_V>();", "") for f, t in files.items()}
        assert out != files
        return out

    codegen_backend.CORRUPT.append(unsynced)
    try:
        with pytest.raises(SimulatorError, match="PIPE_V reads UB byte .* that PIPE_S wrote"):
            run_sim(graphkernel.compile(g, "", env={}), feeds)
    finally:
        codegen_backend.CORRUPT.remove(unsynced)


def test_a_tile_beyond_the_ub_splits_off_the_transpose_only():
    """Six inputs of 96 x 96 summed, then transposed: one Gather would move the value, but
    the one tile of every input does not fit the UB. The kernel is split around the
    transpose (named in the refusal): the sum stays one kernel, the transpose one more --
    the ops are not left one launch each."""
    g = Graph("wide")
    xs = [g.add_input(f"x{k}", TensorType((96, 96), "float32")) for k in range(6)]
    y = xs[0]
    for x in xs[1:]:
        y = g.add_node("Add", [y, x]).output
    g.set_outputs([g.add_node("Transpose", [y], {"perm": [1, 0]}).output])
    res = graphkernel.compile(g, "", env={})
    assert len(launches(res.graph)) == 2
    (fb,) = explain(res)["fallbacks"]
    assert "in one tile" in fb["reason"] and "bytes of UB" in fb["reason"]
