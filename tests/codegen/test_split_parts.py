"""A Split of a computed value along an axis before the last, stored by the kernel that
computes the value: each part's rows go straight to the part's buffer (a fused QKV
projection's rotated Q and K and its V, written where the attention operator reads them),
instead of a launch that copies the parts."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import backend as codegen_backend
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.interpreter import Interpreter
from graphkernel.refusals import classify

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def _grouped_qkv(seq="s", axis=3, sizes=(2, 1, 1)) -> Graph:
    """A grouped projection [B, S, groups, heads + 2, D]: every head scaled and shifted
    alike (the stand-in for the rotation), then cut along the heads into Q, K and V."""
    g = Graph("qkv")
    heads = sum(sizes)
    shape = [2, seq, 2, heads, 16] if axis == 3 else [2, seq, 2, 4, heads]
    x = g.add_input("x", TensorType(tuple(shape), "float32"))
    c = g.add_input("c", TensorType((shape[-1],), "float32"))
    y = g.add_node("Add", [g.add_node("Mul", [x, c]).output, g.const(np.float32(0.5))]).output
    parts = g.add_node("Split", [y], {"axis": axis, "sizes": list(sizes)}, name="qkv").outputs
    g.set_outputs(list(parts))
    return g


def _feeds(seq: int, shape_of_x) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    x = rng.standard_normal(shape_of_x).astype(np.float32)
    return {"x": x, "c": rng.standard_normal(x.shape[-1]).astype(np.float32)}


def test_the_parts_of_a_split_are_stored_by_the_kernel_that_computes_them():
    g = _grouped_qkv()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    for seq in (1, 7, 40):  # one kernel for every length; tiles cut parts' runs of rows
        feeds = _feeds(seq, (2, seq, 2, 4, 16))
        got, backend = run_sim(res, feeds)
        assert not backend.unscheduled, backend.unscheduled
        want = Interpreter(g).run(feeds)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        (st,) = backend.stats.values()
        assert max(st.input_reads) == feeds["x"].nbytes  # the value computed once


def test_a_split_of_the_last_axis_stays_apart():
    """Parts of the last axis are columns of every row: no kernel stores them as rows; the
    Split stays an op of its own, with the reason."""
    res = graphkernel.compile(_grouped_qkv(axis=4), "--opt_level=2", env={})
    assert "Split" in [n.op for n in res.graph.nodes]
    whys = [w for w in res.analyses.cluster.reasons.values() if "Split of the last" in w]
    assert whys and {classify(w).code for w in whys} == {"GK117"}


def test_a_kernel_storing_another_parts_rows_fails_in_the_simulator():
    """The rows of the other parts are skipped; a kernel that stores them too writes past
    the end of its part, which the simulator reports as an out-of-bounds GM access."""
    g = _grouped_qkv()
    feeds = _feeds(5, (2, 5, 2, 4, 16))

    def unskipped(name, files):
        out = {f: t.replace("if (q < first || q >= first + own) {", "if (false) {")
               for f, t in files.items()}
        assert out != files
        return out

    codegen_backend.CORRUPT.append(unskipped)
    try:
        with pytest.raises(SimulatorError, match="out of bounds"):
            run_sim(graphkernel.compile(g, "--opt_level=2", env={}), feeds)
    finally:
        codegen_backend.CORRUPT.remove(unskipped)


def test_a_split_of_a_product_stays_out_of_the_kernels():
    """A Split of a product's result (a state-space layer's input projection cut into x and
    its gate) is no value a vector kernel computes: the Split is not a cluster op there, so
    the regions of the work after it are those without it (GK117)."""
    g = Graph("in_proj")
    x = g.add_input("x", TensorType((32, 16), "float32"))
    w = g.add_input("w", TensorType((64, 32), "float32"))
    y = g.add_node("MatMul", [w, x]).output  # [64, 16]
    a, b = g.add_node("Split", [y], {"axis": 0, "sizes": [32, 32]}).outputs
    g.set_outputs([g.add_node("Mul", [g.add_node("Sigmoid", [b]).output, a]).output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    whys = [w for w in res.analyses.cluster.reasons.values() if "Split of a value" in w]
    assert whys and {classify(w).code for w in whys} == {"GK117"}
