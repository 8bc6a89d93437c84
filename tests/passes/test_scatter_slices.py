"""A scatter whose indices repeat a 1-D index over the other axes (index_add / index_put of
whole slices, as the frontends write them) is one IndexPut at that index: the broadcast of
the integer indices is no launch; the results are the scatter's, duplicates included."""

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import run_graph
from graphkernel.torch import launch_counts
from tests.passes.conftest import apply_pass, ops_of


def slices(reduction: str = "add", axis: int = 0, broadcast_index: bool = True) -> Graph:
    """``x.index_add(axis, rows, y)`` as the torch frontend imports it: the 1-D rows viewed
    along ``axis`` and broadcast over the other axes, a ScatterElements; with
    ``broadcast_index`` False, per-element indices of the same shape (an input)."""
    g = Graph()
    shape = [6, 5] if axis == 0 else [3, 6, 4]
    n = 8
    upd_shape = list(shape)
    upd_shape[axis] = n
    x = g.add_input("x", TensorType(tuple(shape), "float32"))
    y = g.add_input("y", TensorType(tuple(upd_shape), "float32"))
    if broadcast_index:
        rows = g.add_input("rows", TensorType((n,), "int64"))
        view = [1] * len(shape)
        view[axis] = n
        r = g.add_node("Reshape", [rows], {"shape": view}).output
        idx = g.add_node("BroadcastTo", [r], {"shape": upd_shape}).output
    else:
        idx = g.add_input("idx", TensorType(tuple(upd_shape), "int64"))
    out = g.add_node("ScatterElements", [x, idx, y], {"axis": axis, "reduction": reduction})
    g.set_outputs([g.add_node("Mul", [out.output, g.const(np.float32(2))]).output])
    return g


def feeds(g: Graph, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    (sc,) = [n for n in g.nodes if n.op == "ScatterElements"]
    hi = sc.inputs[0].shape[sc.attrs["axis"]]
    out = {}
    for v in g.inputs:
        if v.dtype.value == "int64":  # duplicates on purpose
            out[v.name] = rng.integers(0, hi, v.type.shape).astype(np.int64)
        else:
            out[v.name] = rng.standard_normal(v.type.shape).astype(np.float32)
    return out


@pytest.mark.parametrize("reduction", ["add", "none"])
@pytest.mark.parametrize("axis", [0, 1])
def test_a_scatter_of_whole_slices_is_one_index_put(reduction, axis):
    g = slices(reduction, axis)
    h, res = apply_pass("scatter_slices", g)
    assert res.rewrites == 1
    h.remove_dead()
    ops = ops_of(h)
    assert "IndexPut" in ops and "ScatterElements" not in ops and "BroadcastTo" not in ops, ops
    (put,) = [n for n in h.nodes if n.op == "IndexPut"]
    assert put.inputs[1].type.shape == (8,) and put.attrs["reduction"] == reduction
    for seed in (0, 1):
        f = feeds(g, seed)
        np.testing.assert_array_equal(run_graph(h, f)[0], run_graph(g, f)[0])


def test_per_element_indices_are_left_as_they_are():
    g = slices(broadcast_index=False)
    _, res = apply_pass("scatter_slices", g)
    assert res.rewrites == 0


def test_an_index_broadcast_off_the_scattered_axis_is_left_as_it_is():
    """Indices constant along the scattered axis (broadcast over it, varying over another):
    not one index per slice."""
    g = Graph()
    x = g.add_input("x", TensorType((6, 5), "float32"))
    y = g.add_input("y", TensorType((6, 5), "float32"))
    cols = g.add_input("cols", TensorType((1, 5), "int64"))
    idx = g.add_node("BroadcastTo", [cols], {"shape": [6, 5]}).output
    out = g.add_node("ScatterElements", [x, idx, y], {"axis": 0, "reduction": "add"})
    g.set_outputs([out.output])
    _, res = apply_pass("scatter_slices", g)
    assert res.rewrites == 0


def test_through_the_pipeline_the_index_broadcast_is_no_launch():
    """The int64 broadcast of the indices ran alone (no vector kernel computes int64): 3
    launches (broadcast, scatter, the doubling) -> 2."""
    g = slices()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 2, launch_counts(res.graph)
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=scatter_slices", env={})
    assert sum(launch_counts(off.graph).values()) == 3, launch_counts(off.graph)
    f = feeds(g)
    np.testing.assert_allclose(run_graph(res.graph, f)[0], run_graph(g, f)[0], rtol=1e-6)
