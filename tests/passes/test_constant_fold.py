import numpy as np

from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def test_folds_constant_subgraphs_with_op_by_op_rounding():
    g = Graph()
    x = g.add_input("x", TensorType((3,), "float16"))
    c = g.const(np.array([1, 2, 3], np.float16), name="c")
    e = g.add_node("Exp", [c], name="e").output          # constant: folds (fp16 rounding)
    s = g.add_node("Mul", [e, g.const(np.float16(0.5))], name="s").output
    y = g.add_node("Add", [x, s], name="y").output
    g.set_outputs([y])
    h, res = apply_pass("constant_fold", g)
    assert res.rewrites == 2 and ops_of(h) == ["Add"]
    folded = h.node("y").inputs[1].producer
    assert folded.op == "Constant" and folded.origin == ("s",)
    assert folded.attrs["value"].dtype == np.float16
    assert_same_results(g, h)  # bit-identical: folding uses the interpreter's semantics


def test_does_not_materialize_large_broadcasts():
    g = Graph()
    x = g.add_input("x", TensorType((512, 512), "float32"))
    big = g.add_node("BroadcastTo", [g.const(np.float32(1.0))], {"shape": [512, 512]}).output
    g.set_outputs([g.add_node("Add", [x, big]).output])
    h, res = apply_pass("constant_fold", g)
    assert res.rewrites == 0 and "BroadcastTo" in ops_of(h)
