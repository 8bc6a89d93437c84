import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.errors import ShapeError
from graphkernel.interpreter import run_graph
from tests.passes.conftest import apply_pass, assert_same_results


def test_axes_become_positive_sorted_and_explicit():
    g = Graph()
    x = g.add_input("x", TensorType((2, 1, 3, 4), "float32"))
    a = g.add_node("ReduceSum", [x], {"axis": [-1, 0], "keep_dims": True}, name="r").output
    b = g.add_node("Squeeze", [a], {"axis": None}, name="sq").output
    c = g.add_node("ExpandDims", [b], {"axis": [-1]}, name="ed").output
    d = g.add_node("ReduceMax", [c], {"axis": None}, name="all").output
    e = g.add_node("Concat", [x, x], {"axis": -2}, name="cat").output
    g.set_outputs([d, e])
    h, res = apply_pass("axis_normalize", g)
    assert res.rewrites == 5
    assert h.node("r").attrs["axis"] == [0, 3]
    assert h.node("sq").attrs["axis"] == [0, 1, 3]  # the size-1 dims of [1, 1, 3, 1]
    assert h.node("ed").attrs["axis"] == [1]
    assert h.node("all").attrs["axis"] == [0, 1]
    assert h.node("cat").attrs["axis"] == 2
    assert_same_results(g, h)
    _, again = apply_pass("axis_normalize", h)
    assert again.rewrites == 0  # idempotent


# A 0-d tensor's dims 0 and -1 name the tensor itself, as torch wraps a scalar's dim
# (``torch.sum(torch.tensor(2.), dim=0, keepdim=True)``): a reduction over them reduces
# nothing, and every pass keeps that meaning.
ZERO_D_CASES = [  # (op, attrs, expected from x)
    ("ReduceSum", {"axis": [0], "keep_dims": True}, lambda x: x),
    ("ReduceSum", {"axis": [-1], "keep_dims": False}, lambda x: x),
    ("ReduceMax", {"axis": [0], "keep_dims": False}, lambda x: x),
    ("ReduceMin", {"axis": [-1], "keep_dims": True}, lambda x: x),
    ("ReduceProd", {"axis": [0], "keep_dims": False}, lambda x: x),
    ("ReduceMean", {"axis": [0], "keep_dims": False}, lambda x: x),
    ("ReduceMean", {"axis": [-1], "keep_dims": True}, lambda x: x),
    ("ArgMax", {"axis": 0, "keep_dims": True}, lambda x: np.zeros((), np.int64)),
    ("ArgMin", {"axis": -1}, lambda x: np.zeros((), np.int64)),
    ("CumSum", {"axis": 0}, lambda x: x),
    ("Softmax", {"axis": -1}, lambda x: np.ones((), np.float32)),
    ("LogSoftmax", {"axis": 0}, lambda x: np.zeros((), np.float32)),
    ("Squeeze", {"axis": [0]}, lambda x: x),
]


@pytest.mark.parametrize("op,attrs,expected", ZERO_D_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in ZERO_D_CASES])
@pytest.mark.parametrize("flags", ["--opt_level=3", "--opt_level=3 --disable_pass=axis_normalize",
                                   "--opt_level=1"])
def test_zero_d_inputs_with_explicit_dims_pass_every_pass(op, attrs, expected, flags):
    g = Graph("scalar")
    x = g.add_input("x", TensorType((), "float32"))
    g.set_outputs(g.add_node(op, [x], attrs, name="r").outputs)
    feeds = {"x": np.array(2.5, np.float32)}
    want = expected(feeds["x"])
    ref = run_graph(g, feeds)[0]
    assert ref.shape == () and np.array_equal(ref, want), (ref, want)
    res = graphkernel.compile(g, flags=flags, env={})
    got = run_graph(res.graph, feeds)[0]
    assert got.shape == () and got.dtype == ref.dtype and np.array_equal(got, want), (got, want)


@pytest.mark.parametrize("axis", [[1], [-2]])
def test_zero_d_axes_other_than_0_and_minus_1_are_refused(axis):
    g = Graph()
    x = g.add_input("x", TensorType((), "float32"))
    with pytest.raises(ShapeError, match=r"out of range for rank 0 \(accepted: -1\.\.0\)"):
        g.add_node("ReduceSum", [x], {"axis": axis})
