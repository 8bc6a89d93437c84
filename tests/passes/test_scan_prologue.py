"""scan_prologue: elementwise work a Scan reads broadcast (a selective scan's softplus of its
step size, which no product epilogue runs) is computed on the broadcast value in the scan's
shape, so the scan's kernel runs it; work a product's epilogue runs, or a broadcast read by
anything but the scan's work, stays."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

B, D, L, N = 2, 8, 6, 4


def _selective(softplus: bool = True, extra_reader: bool = False) -> Graph:
    """dt = softplus(W·xᵀ + bias) [B, D, L] (or only the bias added), broadcast over the
    state: Scan(exp(A·dt), dt·u) along L over [B, D, L, N]."""
    g = Graph("selective")
    rng = np.random.default_rng(0)
    x = g.add_input("x", TensorType((B, L, 3), "float32"))
    u = g.add_input("u", TensorType((B, D, L, N), "float32"))
    w = g.const(rng.standard_normal((D, 3)).astype(np.float32))
    bias = g.const(rng.standard_normal((D, 1)).astype(np.float32))
    a = g.const(-np.exp(rng.standard_normal((1, D, 1, N))).astype(np.float32))
    p = g.add_node("BatchMatMul", [w, x], {"transpose_a": False, "transpose_b": True}).output
    t = g.add_node("Add", [p, bias]).output
    if softplus:
        sp = g.add_node("Log1p", [g.add_node("Exp", [t]).output]).output
        big = g.add_node("Greater", [t, g.const(np.array(20.0, np.float32))]).output
        t = g.add_node("Select", [big, t, sp]).output
    dt = g.add_node("ExpandDims", [t], {"axis": [3]}).output
    decay = g.add_node("Exp", [g.add_node("Mul", [a, dt]).output]).output
    h = g.add_node("Scan", [decay, g.add_node("Mul", [dt, u]).output],
                   {"axis": 2, "combine": "linear"}).output
    outs = [g.add_node("ReduceSum", [h], {"axis": [3], "keep_dims": False}).output]
    if extra_reader:
        outs.append(dt)
    g.set_outputs(outs)
    return g


def test_the_softplus_a_scan_reads_broadcast_is_computed_in_the_scans_shape():
    g = _selective()
    h, res = apply_pass("scan_prologue", g)
    assert res.rewrites == 1
    (sel,) = [n for n in h.nodes if n.op == "Select"]
    assert tuple(sel.outputs[0].shape) == (B, D, L, N)
    assert "BroadcastTo" in ops_of(h)
    assert_same_results(g, h, exact=False, rtol=1e-6)


def test_epilogue_work_or_a_broadcast_read_elsewhere_stays():
    """A bias alone is the product's epilogue; a step size that is also an output would be
    stored at the scan's shape."""
    for g in (_selective(softplus=False), _selective(extra_reader=True)):
        h, res = apply_pass("scan_prologue", g)
        assert res.rewrites == 0 and ops_of(h) == ops_of(g)


@pytest.mark.sim
@pytest.mark.slow
def test_the_scan_kernel_runs_its_prologue_in_the_simulator():
    """Through the pipeline: the product, then one vector kernel holding the softplus and
    the scan (two launches, three without the pass); the kernels match the reference in the
    simulator."""
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.traffic import launches

    g = _selective()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=scan_prologue", env={})
    assert len(launches(res.graph)) == len(launches(off.graph)) - 1
    assert not res.report.extra["fallbacks"]
    feeds = random_inputs(g, 0)
    sim, backend = run_sim(res, feeds)
    assert not backend.unscheduled
    np.testing.assert_allclose(sim[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_bias_that_is_an_input_keeps_the_work_apart():
    """A training graph's bias is an input, not a constant: spread along the state it would
    be a value no kernel places; the work stays as it was."""
    g = _selective()
    bias = next(n for n in g.nodes if n.op == "Add").inputs[1]
    arr = bias.producer.attrs["value"]
    b = g.add_input("bias", TensorType(arr.shape, "float32"))
    g.replace_all_uses(bias, b)
    h, res = apply_pass("scan_prologue", g)
    assert res.rewrites == 0 and ops_of(h) == ops_of(g)


def _gated(extra_reader: bool = False) -> Graph:
    """A gated linear recurrence (RG-LRU): a = exp(gate * softplus(param)), the softplus of a
    per-channel parameter [W] broadcast by the Mul itself (no ExpandDims), then
    Scan(a, x) along L over [B, L, W]."""
    W = 16
    g = Graph("gated")
    gate = g.add_input("gate", TensorType((B, L, W), "float32"))
    x = g.add_input("x", TensorType((B, L, W), "float32"))
    p = g.add_input("param", TensorType((W,), "float32"))
    sp = g.add_node("Log1p", [g.add_node("Exp", [p]).output]).output
    big = g.add_node("Greater", [p, g.const(np.array(20.0, np.float32))]).output
    sp = g.add_node("Select", [big, p, sp]).output
    a = g.add_node("Exp", [g.add_node("Mul", [gate, sp]).output]).output
    outs = [g.add_node("Scan", [a, x], {"axis": 1, "combine": "linear"}).output]
    if extra_reader:
        outs.append(sp)
    g.set_outputs(outs)
    return g


def test_a_softplus_broadcast_by_the_op_reading_it_is_computed_in_the_scans_shape():
    g = _gated()
    h, res = apply_pass("scan_prologue", g)
    assert res.rewrites == 1
    for op in ("Select", "Greater", "Log1p"):
        (n,) = [n for n in h.nodes if n.op == op]
        assert tuple(n.outputs[0].shape) == (B, L, 16), op
    assert_same_results(g, h)  # elementwise work commutes with the broadcast: exact


def test_a_smaller_value_read_elsewhere_stays():
    g = _gated(extra_reader=True)
    h, res = apply_pass("scan_prologue", g)
    assert res.rewrites == 0 and ops_of(h) == ops_of(g)


@pytest.mark.sim
@pytest.mark.slow
def test_the_gated_scan_kernel_runs_the_softplus_in_the_simulator():
    """Through the pipeline: the softplus of [W] launched op by op beside the scan's kernel
    without the pass (a comparison of values smaller than the loop space), in it with."""
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.traffic import launches

    g = _gated()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=scan_prologue", env={})
    assert len(launches(res.graph)) == 1 < len(launches(off.graph))
    assert not res.report.extra["fallbacks"]
    feeds = random_inputs(g, 0)
    sim, backend = run_sim(res, feeds)
    assert not backend.unscheduled
    np.testing.assert_allclose(sim[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-5)
