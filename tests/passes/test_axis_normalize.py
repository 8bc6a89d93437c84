from graphkernel import Graph, TensorType
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
