"""The interpreter: op-by-op rounding, high-precision mode, write-back, Opaque, errors."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.errors import ExecutionError, OpError
from graphkernel.interpreter import Interpreter, random_inputs, run_graph
from graphkernel.opdefs.misc import register_opaque_impl


def test_compute_dtype_float64_keeps_precision():
    g = Graph("acc")
    x = g.add_input("x", TensorType((3,), "float16"))
    big = g.add_node("Add", [x, g.const(np.float16(2048.0))]).output
    back = g.add_node("Sub", [big, g.const(np.float16(2048.0))]).output
    g.set_outputs([back])
    arr = np.array([0.3, 1.0, 1.5], np.float16)
    low = run_graph(g, [arr])[0]
    high = run_graph(g, [arr], compute_dtype="float64")[0]
    assert low.dtype == np.float16 and high.dtype == np.float64
    # fp16 spacing at 2048 is 2: op-by-op rounding loses the fraction, float64 keeps it
    assert low.tolist() == [0.0, 0.0, 2.0]
    np.testing.assert_allclose(high, arr.astype(np.float64))


def test_symbolic_inputs_bind_and_check_consistency():
    g = Graph()
    a = g.add_input("a", TensorType(("n", 4), "float32"))
    b = g.add_input("b", TensorType(("n", 4), "float32"))
    g.set_outputs([g.add_node("Add", [a, b]).output])
    out = run_graph(g, {"a": np.ones((3, 4), np.float32), "b": np.ones((3, 4), np.float32)})
    assert out[0].shape == (3, 4)
    with pytest.raises(ExecutionError, match="input 'b': expected float32\\[n,4\\], got shape"):
        run_graph(g, {"a": np.ones((3, 4), np.float32), "b": np.ones((2, 4), np.float32)})


def test_missing_unknown_and_mistyped_inputs():
    g = Graph()
    a = g.add_input("a", TensorType((2,), "float32"))
    g.set_outputs([g.add_node("Exp", [a]).output])
    with pytest.raises(ExecutionError, match="missing input"):
        run_graph(g, {})
    with pytest.raises(ExecutionError, match="unknown input"):
        run_graph(g, {"a": np.ones(2, np.float32), "zz": np.ones(2)})
    with pytest.raises(ExecutionError, match="expected dtype float32, got int64"):
        run_graph(g, {"a": np.ones(2, np.int64)})


def test_assign_writes_back_into_mutable_inputs():
    g = Graph("sgd")
    w = g.add_input("w", TensorType((3,), "float32"), mutable=True)
    grad = g.add_input("grad", TensorType((3,), "float32"))
    step = g.add_node("Mul", [grad, g.const(np.float32(0.1))]).output
    new = g.add_node("Sub", [w, step]).output
    g.add_node("Assign", [w, new], name="update")
    g.set_outputs([new])
    g.remove_dead()
    assert g.has_node("update")  # Assign has a side effect and survives DCE
    feeds = {"w": np.array([1, 2, 3], np.float32), "grad": np.array([1, 1, 1], np.float32)}
    it = Interpreter(g)
    it.run(feeds, write_back=True)
    np.testing.assert_allclose(it.state["w"], [0.9, 1.9, 2.9], rtol=1e-6)
    np.testing.assert_allclose(feeds["w"], [0.9, 1.9, 2.9], rtol=1e-6)


def test_opaque_node_runs_its_registered_executor():
    register_opaque_impl("test_double", lambda spec: lambda xs: [xs[0] * spec["k"]])
    g = Graph()
    x = g.add_input("x", TensorType((2,), "float32"))
    n = g.add_node("Opaque", [x], {"impl": "test_double", "spec": {"k": 3},
                                   "out_types": [{"shape": [2], "dtype": "float32"}]})
    g.set_outputs([n.output])
    assert run_graph(g, [np.array([1, 2], np.float32)])[0].tolist() == [3, 6]
    g2 = Graph()
    x2 = g2.add_input("x", TensorType((2,), "float32"))
    with pytest.raises(OpError, match="node 'mystery' .* unknown Opaque impl 'nope' "
                                      r"\(accepted: aten, onnx, test_double\)"):
        g2.add_node("Opaque", [x2], {"impl": "nope", "out_types": [x2.type]}, name="mystery")


def test_random_inputs_are_seeded_and_typed():
    g = Graph()
    g.add_input("x", TensorType(("b", 3), "bfloat16"))
    g.add_input("m", TensorType(("b",), "bool"))
    a, b = random_inputs(g, 7, {"b": 5}), random_inputs(g, 7, {"b": 5})
    assert a["x"].shape == (5, 3) and str(a["x"].dtype) == "bfloat16"
    assert a["m"].dtype == np.bool_
    assert np.array_equal(a["x"].astype(np.float32), b["x"].astype(np.float32))
