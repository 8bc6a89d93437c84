"""Parts of each head of a product's columns (passes/interleaved_columns.py) read as column
blocks, and a kernel whose slice no row split reads split around that slice (the vector
schedule names the slice): launch counts through the pipeline, the refusal, the simulator's
numbers."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.traffic import launches
from graphkernel.codegen.vector.schedule import plan
from graphkernel.kernels import build_kernel
from tests.codegen.cases import sim_ok


def _gates() -> Graph:
    """A Linear's [16, 8] output seen as [1, 16, 2 heads, 4], each head cut into b (columns
    0:2) and a (2:4): beta = sigmoid(b) and g = c * exp(a + bias) per value head, the form of
    a gated delta rule's gates."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.add_input("x", TensorType((16, 32), "float32"))
    w = g.const(rng.standard_normal((8, 32)).astype(np.float32))
    h = g.add_node("MatMul", [x, w], {"transpose_a": False, "transpose_b": True}).output
    r = g.add_node("Reshape", [h], {"shape": [1, 16, 2, 4]}).output
    b, a = (g.add_node("StridedSlice", [r], {"begin": [s], "end": [s + 2], "strides": [1],
                                             "axes": [3]}).output for s in (0, 2))
    b = g.add_node("Reshape", [b], {"shape": [1, 16, 4]}).output
    a = g.add_node("Reshape", [a], {"shape": [1, 16, 4]}).output
    a = g.add_node("Add", [a, g.const(rng.standard_normal(4).astype(np.float32))]).output
    a = g.add_node("Exp", [a]).output
    a = g.add_node("Mul", [a, g.const(rng.standard_normal(4).astype(np.float32))]).output
    g.set_outputs([g.add_node("Sigmoid", [b]).output, a])
    return g


def _z_gate() -> Graph:
    """Columns 128:192 of rows of 192 (a projection's last part), split into heads of 16 with
    the rows merged (``[128, 16]``: no single strided view of the input), then silu."""
    g = Graph()
    x = g.add_input("x", TensorType((32, 192), "float32"))
    z = g.add_node("StridedSlice", [x], {"begin": [128], "end": [192], "strides": [1],
                                         "axes": [1]}).output
    z = g.add_node("Reshape", [z], {"shape": [2, 16, 2, 32]}).output
    z = g.add_node("Reshape", [z], {"shape": [128, 16]}).output
    g.set_outputs([g.add_node("Mul", [z, g.add_node("Sigmoid", [z]).output]).output])
    return g


def test_gates_of_each_head_run_in_a_cube_and_two_vector_kernels():
    """Before: the sliced heads and the bias broadcast over them had no common row split,
    and the gates ran op by op (ten launches). The weight's rows reordered, each gate is one
    kernel on a column block of the product; the simulator's numbers match."""
    g = _gates()
    res = graphkernel.compile(g, "", env={})
    kinds = [e["kind"] for e in launches(res.graph)]
    assert len(kinds) <= 3 and kinds.count("vector") <= 2, launches(res.graph)
    assert not res.report.extra["fallbacks"]
    ic = next(p for p in res.report.passes if p.name == "interleaved_columns")
    assert any("parts of each of 2 heads" in note for note in ic.notes), ic.notes
    sim_ok(res, g)


def test_the_refusal_names_the_slice_no_row_split_reads():
    g = _z_gate()
    kernel = g.copy()
    with pytest.raises(Unsupported, match="no row split") as e:
        plan(build_kernel(kernel, list(kernel.nodes), "k", "test"))
    assert e.value.node is not None and e.value.node.op == "StridedSlice"


def test_a_kernel_is_split_around_the_slice_it_cannot_read():
    """Before: unfused, one launch per op (six). Now: the slice copied on its own, the silu
    one kernel reading the copy whole; the simulator's numbers match."""
    g = _z_gate()
    res = graphkernel.compile(g, "", env={})
    got = launches(res.graph)
    assert len(got) == 2, got
    assert [e["op"] for e in got].count("StridedSlice") == 1
    fb = res.report.extra["fallbacks"]
    assert fb and fb[0]["action"].startswith("split around StridedSlice"), fb
    sim_ok(res, g)


def test_the_kernels_compile_against_the_real_headers():
    """The gates' and the z gate's kernels type-check against the real API with their host
    tiling (skipped without the headers)."""
    from types import SimpleNamespace

    from tests.codegen.test_realcheck import assert_all_compile, headers, rendered_cases

    if headers() is None:
        pytest.skip("no Ascend C headers (GRAPHKERNEL_ASCEND_HEADERS)")
    cases = [SimpleNamespace(graph=f(), flags="") for f in (_gates, _z_gate)]
    assert_all_compile(rendered_cases(cases))
