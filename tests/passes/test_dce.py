import numpy as np

from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results


def test_removes_dead_nodes_but_keeps_assign():
    g = Graph()
    x = g.add_input("x", TensorType((3,), "float32"), mutable=True)
    live = g.add_node("Exp", [x], name="live").output
    dead = g.add_node("Neg", [g.add_node("Abs", [x], name="dead1").output], name="dead2").output
    assert dead.uses == []
    g.add_node("Assign", [x, live], name="upd")
    g.set_outputs([live])
    h, res = apply_pass("dce", g)
    assert res.rewrites == 2
    assert [n.name for n in h.nodes] == ["live", "upd"]
    assert_same_results(g, h)


def test_nothing_to_do():
    g = Graph()
    x = g.add_input("x", TensorType((3,), "float32"))
    g.set_outputs([g.add_node("Exp", [x]).output])
    h, res = apply_pass("dce", g)
    assert not res.modified and len(h) == 1
    np.testing.assert_equal(len(g), 1)
