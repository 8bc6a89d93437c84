"""Stacked norms over the same rows (a vision encoder's pre-layernorm, then its first
layer's norm) in one kernel: the kernel holds each row whole for both reductions and stores
the first norm's result too (the residual reads it). The `reduce_chain` pattern; generated
and run in the simulator against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.traffic import launches
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)

R = np.random.default_rng(11)


def _project(g: Graph, v, w, name: str):
    """rows [..., d] times w [d, d], in the rows' shape (a linear layer's MatMul on 2-D)."""
    shape = list(v.type.shape)
    flat = g.add_node("Reshape", [v], {"shape": [-1, shape[-1]]}).output
    y = g.add_node("MatMul", [flat, w], name=name).output
    return g.add_node("Reshape", [y], {"shape": shape}).output


def _stacked(rows=(2, 17, 64), second_axis=None, product_first=False) -> Graph:
    """x + pos -> LayerNorm -> LayerNorm -> a projection; the first norm's result is the
    residual, added to the projection's."""
    g = Graph("stacked")
    d = rows[-1]
    x = g.add_input("x", TensorType(rows, "float32"))
    if product_first:  # the first norm reads a product: that norm is the product's epilogue
        w0 = g.const(R.standard_normal((d, d)).astype(np.float32) / 8)
        h = _project(g, x, w0, "proj0")
    else:
        h = g.add_node("Add", [x, g.const(R.standard_normal(rows[1:]).astype(np.float32))],
                       name="pos").output

    def norm(v, name, begin=-1):
        begin %= v.type.rank
        shape = list(v.type.shape[begin:])
        w = g.const(R.uniform(0.5, 1.5, shape).astype(np.float32))
        b = g.const((R.standard_normal(shape) / 4).astype(np.float32))
        return g.add_node("LayerNorm", [v, w, b], {"begin_norm_axis": begin,
                                                   "begin_params_axis": begin,
                                                   "epsilon": 1e-5}, name=name).outputs[0]

    first = norm(h, "pre")
    second = norm(first, "ln1", -1 if second_axis is None else second_axis)
    w = g.const(R.standard_normal((d, d)).astype(np.float32) / 8)
    y = _project(g, second, w, "proj")
    g.set_outputs([g.add_node("Add", [y, first], name="residual").output])
    return g


def _vector_kernels(res):
    return [e for e in launches(res.graph) if e["kind"] == "vector"]


def test_stacked_norms_are_one_kernel():
    g = _stacked()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    (k,) = _vector_kernels(res)
    assert k["op_list"].count("ReduceSum") == 4  # two means, two variances
    feeds = {"x": R.standard_normal((2, 17, 64)).astype(np.float32)}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("why", ["other axes", "a product's epilogue", "off at opt_level 1"])
def test_norms_that_do_not_stack(why):
    g = _stacked(second_axis=1) if why == "other axes" else _stacked(
        product_first=why == "a product's epilogue")
    res = graphkernel.compile(g, "--opt_level=1" if why == "off at opt_level 1"
                              else "--opt_level=2", env={})
    chained = [k for k in res.graph.nodes if k.op == "GraphKernel"
               and "reduce_chain" in k.attrs["pattern"]]
    assert not chained
    if why == "other axes":  # each norm reduces its own axis: two kernels
        assert len(_vector_kernels(res)) == 2
