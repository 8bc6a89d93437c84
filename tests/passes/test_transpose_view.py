"""A transpose that moves only axes of size 1 is a view (a Reshape); others stay."""

import numpy as np

from graphkernel import Graph, TensorType
from graphkernel.interpreter import Interpreter, random_inputs, run_graph
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def test_moving_only_axes_of_size_1_is_a_reshape_and_others_stay_transposes():
    g = Graph()
    step = g.add_input("step", TensorType((2, 1, 4, 16), "float32"))  # one position, 4 heads
    heads = g.add_node("Transpose", [step], {"perm": [0, 2, 1, 3]}, name="heads").output
    many = g.add_input("many", TensorType((2, 3, 4, 16), "float32"))
    moved = g.add_node("Transpose", [many], {"perm": [0, 2, 1, 3]}, name="moved").output
    g.set_outputs([g.add_node("Exp", [heads]).output, moved])
    h, res = apply_pass("transpose_view", g)
    assert res.rewrites == 1 and sorted(ops_of(h)) == ["Exp", "Reshape", "Transpose"]
    view = h.outputs[0].producer.inputs[0].producer
    assert view.op == "Reshape" and view.attrs["shape"] == [2, 4, 1, 16]
    assert h.outputs[1].producer.op == "Transpose"
    assert_same_results(g, h)


def test_a_symbolic_axis_is_not_taken_for_one_but_may_be_passed_by_one():
    """A symbolic length may be 1 or not: moved across heads it stays a Transpose; an axis
    of size 1 moved across it is a view whatever its value."""
    g = Graph()
    x = g.add_input("x", TensorType((2, "s", 4, 16), "float32"))
    y = g.add_input("y", TensorType((2, "s", 1, 16), "float32"))
    g.set_outputs([g.add_node("Transpose", [v], {"perm": [0, 2, 1, 3]}).output for v in (x, y)])
    h, res = apply_pass("transpose_view", g)
    assert res.rewrites == 1 and [v.producer.op for v in h.outputs] == ["Transpose", "Reshape"]
    feeds = random_inputs(g, seed=0, dims={"s": 3})
    for a, b in zip(Interpreter(g, symbols={"s": 3}).run(feeds),
                    Interpreter(h, symbols={"s": 3}).run(feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_decoding_step_runs_its_head_moves_as_views():
    """Through the pipeline: one position's K moved behind its heads and appended to a cache,
    attention over the cache, the output moved back: only views around the attention."""
    import graphkernel

    g = Graph()
    k = g.add_input("k", TensorType((2, 1, 2, 16), "float32"))
    cache = g.add_input("cache", TensorType((2, 2, 5, 16), "float32"))
    kt = g.add_node("Transpose", [k], {"perm": [0, 2, 1, 3]}).output
    grown = g.add_node("Concat", [cache, kt], {"axis": 2}).output
    g.set_outputs([g.add_node("Mul", [grown, g.const(np.float32(2))]).output])
    res = graphkernel.compile(g, "--opt_level=2 --disable_pass=codegen", env={})
    assert "Transpose" not in {m.op for n in res.graph.nodes for m in (
        n.subgraph.nodes if n.op == "GraphKernel" else [n])}
    feeds = random_inputs(g, 0)
    np.testing.assert_array_equal(run_graph(res.graph, feeds)[0], run_graph(g, feeds)[0])
