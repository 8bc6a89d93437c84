"""Kernels whose views, concats and compact values have symbolic extents (``dynamic=True``):
one generated kernel serves every size, its offsets computed by the host tiling from the
actual shapes, checked in the simulator at several sizes against the op-by-op run."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.sim.execute import SimLibrary

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def _feeds(g: Graph, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.type.concrete(dims)).astype(np.float32)
            for v in g.inputs}


def _half_select() -> Graph:
    """The halves of a value stacked along a leading axis of 2 over a symbolic batch
    (torch's interleave of a scan's two halves, viewed back as ``(2, B, ...)``): the second
    half starts ``B * 8`` elements in, an offset along a symbolic stride."""
    g = Graph("half_select")
    x = g.add_input("x", TensorType((2, "b", 8), "float32"))
    y = g.add_input("y", TensorType(("b", 8), "float32"))
    hi = g.add_node("StridedSlice", [x], {"begin": [1], "end": [2], "axes": [0]}).output
    lo = g.add_node("StridedSlice", [x], {"begin": [0], "end": [1], "axes": [0]}).output
    hi = g.add_node("Reshape", [hi], {"shape": ["b", 8]}).output
    lo = g.add_node("Reshape", [lo], {"shape": ["b", 8]}).output
    e = g.add_node("Mul", [g.add_node("Exp", [hi]).output, y]).output
    g.set_outputs([g.add_node("Add", [e, lo]).output])
    return g


def _join_slice(axis: int, begin: int) -> Graph:
    """``cat(x[begin:begin+1], y)`` along ``axis`` (a scan's halves joined back: the first
    step of one kept, the rest computed), with a symbolic extent before or after the axis:
    the slice is read from its input's buffer at an offset the host computes, a run of rows
    per block, straight into the Concat's tile."""
    lead = ("b",) if axis == 1 else ()
    tail = (8, 16) if axis == 1 else ("b", 8, 16)
    g = Graph(f"join_slice_{axis}_{begin}")
    x = g.add_input("x", TensorType((*lead, 6, *tail[1:]) if axis == 1 else (6, *tail),
                                    "float32"))
    y = g.add_input("y", TensorType((*lead, 3, *tail[1:]) if axis == 1 else (3, *tail),
                                    "float32"))
    s = g.add_node("StridedSlice", [x], {"begin": [begin], "end": [begin + 1],
                                         "axes": [axis]}).output
    g.set_outputs([g.add_node("Concat", [s, y], {"axis": axis}).output])
    return g


CASES = {
    "half-select": (_half_select, [{"b": 1}, {"b": 3}, {"b": 70}]),
    "join-slice-lead-0": (lambda: _join_slice(0, 0), [{"b": 1}, {"b": 5}, {"b": 40}]),
    "join-slice-lead-2": (lambda: _join_slice(0, 2), [{"b": 1}, {"b": 5}, {"b": 40}]),
    "join-slice-blocks-3": (lambda: _join_slice(1, 3), [{"b": 1}, {"b": 5}, {"b": 40}]),
}


@pytest.fixture(scope="module")
def compiled():
    out, rendered = {}, []
    from graphkernel.codegen.backend import render_all, schedules

    for name, (build, dims) in CASES.items():
        g = build()
        res = graphkernel.compile(g, "--opt_level=2", env={})
        out[name] = (g, res, dims)
        rendered += render_all(schedules(res))
    return out, SimLibrary(rendered)


@pytest.mark.parametrize("name", list(CASES))
def test_one_kernel_serves_every_size(name, compiled):
    cases, library = compiled
    g, res, dims = cases[name]
    assert not res.report.extra.get("fallbacks"), res.report.extra["fallbacks"]
    assert sum(n.op == "GraphKernel" for n in res.graph.nodes) == 1
    assert all(n.op == "GraphKernel" for n in res.graph.nodes)
    kernels = set()
    for d in dims:
        feeds = _feeds(g, d)
        got, backend = run_sim(res, feeds, library=library)
        assert not backend.unscheduled
        j = Evaluator(g, feeds).judge(got)
        assert not j.bad, f"{name} {d}: {j.reason}"
        kernels |= {st.name for st in backend.stats.values()}
    assert len(kernels) == 1, kernels


def test_a_symbolic_slice_start_is_a_tiling_value(compiled):
    """The second half's first element is computed by the host from the batch it is given
    (no number in the kernel), once per launch."""
    from graphkernel.codegen.backend import render_all, schedules

    cases, _ = compiled
    _, res, _ = cases["half-select"]
    (r,) = render_all(schedules(res))
    bases = [io.base for io in r.schedule.inputs if io.kind == "partial"]
    assert any(not isinstance(b, int) for b in bases), bases
    tiling = next(t for f, t in r.files.items() if f.endswith("_tiling.cpp"))
    assert any("t.pb" in ln and "shapes[" in ln for ln in tiling.splitlines()), tiling


def test_a_multiple_of_a_product_of_symbols_is_read_whole():
    """A routed MoE layer's rows are ``2*s*t`` (tokens times the two experts each picks):
    no dim of the kernel gives ``s`` or ``t`` alone, but every size the kernel needs is a
    multiple of their product, which the host reads as that dim divided by 2."""
    from graphkernel.codegen.backend import SimBackend
    from graphkernel.interpreter import Interpreter

    g = Graph("routed")
    w = g.add_input("w", TensorType(("2*s*t",), "float32"))
    x = g.add_input("x", TensorType(("2*s*t", 64), "float32"))
    e = g.add_node("ExpandDims", [w], {"axis": [1]}).output
    g.set_outputs([g.add_node("Mul", [g.add_node("Exp", [x]).output, e]).output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra["fallbacks"]
    assert [n.op for n in res.graph.nodes] == ["GraphKernel"]
    for s, t in ((1, 1), (3, 5), (7, 11)):
        dims = {"s": s, "t": t}
        feeds = _feeds(g, dims, seed=s)
        backend = SimBackend.for_result(res, (), None)
        got = Interpreter(res.graph, kernel_runner=backend, symbols=dims).run(feeds)
        want = Interpreter(g, symbols=dims).run(feeds)
        assert len(backend.stats) == 1
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_symbolic_views_compile_against_the_real_headers(compiled):
    """The kernels and host tilings of these cases type-check against the real Ascend C
    headers (skipped without them)."""
    from graphkernel.codegen.backend import render_all, schedules
    from tests.codegen.test_realcheck import assert_all_compile, headers

    if headers() is None:
        pytest.skip("no Ascend C headers (GRAPHKERNEL_ASCEND_HEADERS)")
    cases, _ = compiled
    assert_all_compile([r for _, res, _ in cases.values() for r in render_all(schedules(res))])
