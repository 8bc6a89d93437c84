"""Two kernels in one loop space reading parts of one value (Q's and K's rotary embedding),
joined by sibling_fusion: the joined kernel runs in the simulator, its outputs
those of the graph."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel.codegen.backend import run_sim
from graphkernel.interpreter import Interpreter, random_inputs
from tests.test_postfusion import rotated_pair

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def test_the_joined_rotations_run_as_one_kernel_in_the_simulator():
    g = rotated_pair()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks")
    launches = [n for n in res.graph.nodes if n.op != "Constant"]
    assert [n.op for n in launches] == ["GraphKernel", "GraphKernel"]  # the parts; Q and K
    assert launches[1].attrs["pattern"].startswith("parallel(")
    feeds = random_inputs(g, 1)
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    for a, b in zip(got, Interpreter(g).run(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_slice_joined_to_its_siblings_kernel_runs_in_the_simulator():
    from tests.test_postfusion import fused_projection_parts

    g = fused_projection_parts()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks")
    assert "StridedSlice" not in [n.op for n in res.graph.nodes]
    feeds = random_inputs(g, 2)
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    for a, b in zip(got, Interpreter(g).run(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
