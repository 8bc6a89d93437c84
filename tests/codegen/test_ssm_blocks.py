"""Blocks of state-space layers as the torch frontend imports them, compiled through the
code generator and run in the simulator: how many launches, and the numbers."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.traffic import launches

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
RNG = np.random.default_rng(11)


def _normed_readout(b=2, length=6, d=5, n=8):
    """FalconMamba's readout: ``C`` [B, L, N] RMS-normalised over N, then ``(h * C).sum(-1)``
    with the states ``h`` [B*L, D, N]: the normalised ``C`` is broadcast over D, the axis
    between the ones it varies along."""
    g = Graph("readout")
    c = g.add_input("c", TensorType((b, length, n), "float32"))
    h = g.add_input("h", TensorType((b * length, d, n), "float32"))
    sq = g.add_node("ReduceSum", [g.add_node("Mul", [c, c]).output],
                    {"axis": [2], "keep_dims": True}).output
    mean = g.add_node("Div", [sq, g.const(np.array(n, np.float32))]).output
    r = g.add_node("Rsqrt", [g.add_node("Add", [mean, g.const(np.array(1e-6, np.float32))])
                             .output]).output
    cn = g.add_node("Mul", [c, r]).output
    cv = g.add_node("Reshape", [cn], {"shape": [b * length, 1, n]}).output
    y = g.add_node("ReduceSum", [g.add_node("Mul", [h, cv]).output], {"axis": [2]}).output
    g.set_outputs([y])
    return g


def test_a_normalised_readout_is_a_norm_kernel_and_a_product_sum_kernel():
    """Two launches (the RMS norm of C; the product with the states and its sum), no
    fallback -- not the norm's ops one launch each -- and the simulator's numbers match."""
    g = _normed_readout()
    res = graphkernel.compile(g, "", env={})
    assert len(launches(res.graph)) == 2
    assert not res.report.extra["fallbacks"]
    feeds = {"c": RNG.standard_normal((2, 6, 8)).astype(np.float32),
             "h": RNG.standard_normal((12, 5, 8)).astype(np.float32)}
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    judged = Evaluator(g, feeds).judge(got)
    assert not judged.bad, judged.reason


def _rms(g: Graph, x):
    n = x.shape[-1]
    sq = g.add_node("ReduceSum", [g.add_node("Mul", [x, x]).output],
                    {"axis": [-1], "keep_dims": True}).output
    mean = g.add_node("Div", [sq, g.const(np.array(n, np.float32))]).output
    eps = g.const(np.array(1e-6, np.float32))
    r = g.add_node("Rsqrt", [g.add_node("Add", [mean, eps]).output]).output
    return g.add_node("Mul", [x, r]).output


def _normed_parts(sizes=(4, 16, 16)):
    """FalconMamba's ``x_proj`` output cut into ``dt``, ``B`` and ``C`` along its last axis,
    each RMS-normalised."""
    g = Graph("parts")
    p = g.add_input("p", TensorType((2, 6, sum(sizes)), "float32"))
    parts = g.add_node("Split", [p], {"axis": 2, "sizes": list(sizes)}).outputs
    g.set_outputs([_rms(g, v) for v in parts])
    return g


def test_normalised_parts_of_a_projection_read_it_in_place():
    """No Split launch: each norm's kernel loads its columns of the projection's rows (one
    launch per norm), and the simulator's numbers match."""
    g = _normed_parts()
    res = graphkernel.compile(g, "", env={})
    assert [e["op"] for e in launches(res.graph)] == ["GraphKernel"] * 3
    assert not res.report.extra["fallbacks"]
    feeds = {"p": RNG.standard_normal((2, 6, 36)).astype(np.float32)}
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    judged = Evaluator(g, feeds).judge(got)
    assert not judged.bad, judged.reason
