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


def test_axes_of_one_are_squeezed_out_of_an_einsum_permute():
    """torch's einsum("bind,bjnd->bnij") views its operands with an axis of 1 and permutes
    five axes: the permute of the other four between views, reading the value before the
    view that added the axis; two such permutes back to back then fold to nothing."""
    g = Graph()
    k = g.add_input("k", TensorType((2, 16, 4, 8), "float32"))
    five = g.add_node("ExpandDims", [k], {"axis": [4]}).output
    kt = g.add_node("Transpose", [five], {"perm": [0, 2, 3, 1, 4]}).output  # [B,N,D,S,1]
    back = g.add_node("Transpose", [kt], {"perm": [0, 3, 1, 2, 4]}).output  # [B,S,N,D,1]
    g.set_outputs([g.add_node("Reshape", [kt], {"shape": [8, 8, 16]}).output,
                   g.add_node("Exp", [back]).output])
    h, res = apply_pass("transpose_elim", g)
    h.remove_dead()
    (t,) = [n for n in h.nodes if n.op == "Transpose"]
    assert t.attrs["perm"] == [0, 2, 3, 1] and t.inputs[0] is h.inputs[0]
    assert h.outputs[1].producer.op == "Exp"
    assert_same_results(g, h)


def test_a_transpose_moving_only_axes_of_one_is_a_view_above_four_axes_only():
    """[2, 4, 16, 1, 16] -> [2, 4, 16, 16, 1] (an einsum's scores) is a view here; a one-head
    split [B, S, 1, D] -> [B, 1, S, D] stays a Transpose for the attention pass."""
    g = Graph()
    s = g.add_input("s", TensorType((2, 4, 16, 1, 16), "float32"))
    h1 = g.add_input("h", TensorType((2, 16, 1, 8), "float32"))
    a = g.add_node("Transpose", [s], {"perm": [0, 1, 2, 4, 3]}).output
    b = g.add_node("Transpose", [h1], {"perm": [0, 2, 1, 3]}).output
    g.set_outputs([g.add_node("Exp", [a]).output, g.add_node("Exp", [b]).output])
    h, res = apply_pass("transpose_elim", g)
    h.remove_dead()
    (t,) = [n for n in h.nodes if n.op == "Transpose"]
    assert t.inputs[0] is h.inputs[1]
    assert_same_results(g, h)
