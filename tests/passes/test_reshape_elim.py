from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def test_folds_chains_and_drops_identities():
    g = Graph()
    x = g.add_input("x", TensorType(("b", 4, 6), "float32"))
    a = g.add_node("Reshape", [x], {"shape": [-1, 24]}).output
    a = g.add_node("ExpandDims", [a], {"axis": [0]}).output
    a = g.add_node("Squeeze", [a], {"axis": [0]}).output
    a = g.add_node("Reshape", [a], {"shape": ["b", 24]}).output     # identity once folded
    b = g.add_node("Reshape", [a], {"shape": ["b", 6, 4]}).output   # chain -> one reshape
    y = g.add_node("Exp", [b]).output
    g.set_outputs([y, a])
    h, res = apply_pass("reshape_elim", g)
    h.remove_dead()
    assert res.modified and ops_of(h) == ["Reshape", "Reshape", "Exp"]
    assert h.outputs[0].producer.inputs[0].producer.inputs[0] is h.inputs[0]
    assert_same_results(g, h)


def test_identity_reshape_of_an_input():
    g = Graph()
    x = g.add_input("x", TensorType((2, 3), "float32"))
    g.set_outputs([g.add_node("Exp", [g.add_node("Reshape", [x], {"shape": [2, 3]}).output])
                   .output])
    h, _ = apply_pass("reshape_elim", g)
    assert ops_of(h) == ["Exp"]
