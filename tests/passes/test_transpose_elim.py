from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def test_composes_and_cancels():
    g = Graph()
    x = g.add_input("x", TensorType((2, 3, 4), "float32"))
    a = g.add_node("Transpose", [x], {"perm": [1, 2, 0]}).output
    b = g.add_node("Transpose", [a], {"perm": [2, 0, 1]}).output    # cancels: identity
    c = g.add_node("Transpose", [a], {"perm": [0, 2, 1]}, name="c").output  # composes
    g.set_outputs([g.add_node("Exp", [b]).output, c])
    h, res = apply_pass("transpose_elim", g)
    h.remove_dead()
    assert res.rewrites == 2 and ops_of(h) == ["Exp", "Transpose"]
    composed = h.outputs[1].producer
    assert composed.inputs[0] is h.inputs[0] and composed.attrs["perm"] == [1, 0, 2]
    assert_same_results(g, h)
