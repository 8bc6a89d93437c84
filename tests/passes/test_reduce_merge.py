"""reduce_merge: a reduction of a reduction (a mean taken one axis at a time) is one."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.traffic import launches
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def op(g, name, *ins, **attrs):
    return g.add_node(name, list(ins), attrs).output


def scalar(g, v, dtype=np.float32):
    return g.const(np.asarray(v, dtype))


def mean_of_means(keep: bool = True, act: bool = False, shape=(2, 6, 4, 8)) -> Graph:
    """x.mean(2).mean(3) as the frontends expand it (a sum, a division by the count, twice);
    ``act``: a GELU of it multiplied back into x (FocalNet's global context)."""
    g = Graph("mm")
    x = g.add_input("x", TensorType(shape, "float32"))
    s = op(g, "ReduceSum", x, axis=[2], keep_dims=keep)
    s = op(g, "Div", s, scalar(g, shape[2]))
    s = op(g, "ReduceSum", s, axis=[3 if keep else 2], keep_dims=keep)
    s = op(g, "Div", s, scalar(g, shape[3]))
    g.set_outputs([op(g, "Mul", x, op(g, "GeLU", s)) if act else s])
    return g


def test_a_mean_of_means_is_one_sum_and_one_division():
    g = mean_of_means()
    h, res = apply_pass("reduce_merge", g)
    h.remove_dead()
    assert res.modified and ops_of(h) == ["ReduceSum", "Div"]
    red, div = (n for n in h.nodes if n.op != "Constant")
    assert red.attrs == {"axis": [2, 3], "keep_dims": True}
    assert float(div.inputs[1].producer.attrs["value"]) == 32.0  # 4 * 8, one rounding
    assert res.notes[0].endswith("one ReduceSum over axes [2, 3]")
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_axes_of_a_reduction_that_drops_them_are_mapped_to_the_input():
    """Without keep_dims the outer axis 2 is the input's axis 3."""
    g = mean_of_means(keep=False)
    h, res = apply_pass("reduce_merge", g)
    red = next(n for n in h.nodes if n.op == "ReduceSum")
    assert red.attrs == {"axis": [2, 3], "keep_dims": False}
    assert h.outputs[0].type.shape == (2, 6)
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)


def test_a_max_of_a_max_is_exact():
    g = Graph("t")
    x = g.add_input("x", TensorType((3, 5, 7), "float32"))
    g.set_outputs([op(g, "ReduceMax", op(g, "ReduceMax", x, axis=[0]), axis=[1])])
    h, res = apply_pass("reduce_merge", g)
    h.remove_dead()
    assert ops_of(h) == ["ReduceMax"] and h.nodes[-1].attrs["axis"] == [0, 2]
    assert_same_results(g, h, exact=True)


def test_what_is_not_merged():
    """The inner sum read elsewhere; a factor between two maxima (max(c*s) = c*max(s) only
    for c > 0); an integer division between two sums (it truncates each partial sum); one
    reduction keeping its axes and the other not; two different reductions."""
    def sums(between=None, dtype="float32", keep=(True, True), other=False, ops=("ReduceSum",
                                                                           "ReduceSum")):
        g = Graph("t")
        x = g.add_input("x", TensorType((2, 4, 6), dtype))
        s = op(g, ops[0], x, axis=[1], keep_dims=keep[0])
        inner = s
        if between is not None:
            s = op(g, between, s, scalar(g, 3, np.dtype(dtype)))
        out = op(g, ops[1], s, axis=[-1], keep_dims=keep[1])
        g.set_outputs([out, inner] if other else [out])
        return g

    for g in (sums(other=True), sums(between="Mul", ops=("ReduceMax", "ReduceMax")),
              sums(between="Div", dtype="int32"), sums(keep=(True, False)),
              sums(ops=("ReduceMax", "ReduceSum"))):
        h, res = apply_pass("reduce_merge", g)
        assert not res.modified and ops_of(h) == ops_of(g)


def test_bisect_can_refuse_the_merge():
    res = graphkernel.compile(mean_of_means(act=True),
                              "--opt_level=2 --bisect_pass=reduce_merge --bisect_limit=0",
                              env={})
    rec = next(p for p in res.report.passes if p.name == "reduce_merge")
    assert not rec.changed


def test_through_the_pipeline_the_global_context_is_one_kernel():
    """mean(2).mean(3), a GELU and the product with x: the merged sum reduces each
    channel's pixels as one row, and its value broadcast back over the row joins the same
    kernel. Apart, the two partial sums were two reduction kernels and the product a third."""
    g = mean_of_means(act=True)
    on = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=reduce_merge", env={})
    assert len(launches(on.graph)) == 1, launches(on.graph)
    assert len(launches(off.graph)) > 1
    for seed in (0, 1):
        feeds = random_inputs(g, seed)
        np.testing.assert_allclose(run_graph(on.graph, feeds)[0], run_graph(g, feeds)[0],
                                   rtol=1e-5, atol=1e-6)
