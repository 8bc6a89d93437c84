"""Property tests: broadcasting and reduction shape inference agree with numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from graphkernel import Graph, TensorType, symbolic
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.slow  # property tests

settings.register_profile("ci", max_examples=60, deadline=None)
settings.load_profile("ci")


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4))
def test_broadcast_inference_matches_numpy(shapes):
    a, b = shapes.input_shapes
    g = Graph()
    x = g.add_input("x", TensorType(a, "float32"))
    y = g.add_input("y", TensorType(b, "float32"))
    out = g.add_node("Add", [x, y]).output
    assert out.type.shape == shapes.result_shape
    g.set_outputs([out])
    res = Interpreter(g).run({"x": np.ones(a, np.float32), "y": np.ones(b, np.float32)})[0]
    assert res.shape == shapes.result_shape


@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4), data=st.data(),
       keep=st.booleans())
def test_reduce_inference_matches_numpy(shape, data, keep):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank,
                              unique_by=lambda a: a % rank))
    g = Graph()
    x = g.add_input("x", TensorType(shape, "float32"))
    out = g.add_node("ReduceSum", [x], {"axis": axes, "keep_dims": keep}).output
    g.set_outputs([out])
    arr = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = arr.sum(axis=tuple(axes) if axes else None, keepdims=keep)
    assert out.type.shape == want.shape
    np.testing.assert_allclose(Interpreter(g).run({"x": arr})[0], want, rtol=1e-6)


@given(st.lists(st.sampled_from([1, 2, 3, "a", "b", "2*a"]), max_size=4),
       st.lists(st.sampled_from([1, 2, 3, "a", "b", "2*a"]), max_size=4))
def test_symbolic_broadcast_agrees_with_concrete(a, b):
    env = {"a": 3, "b": 5}
    try:
        sym = symbolic.broadcast_shapes(a, b)
    except Exception:
        return
    ca = [symbolic.evaluate(d, env) for d in a]
    cb = [symbolic.evaluate(d, env) for d in b]
    try:
        conc = np.broadcast_shapes(tuple(ca), tuple(cb))
    except ValueError:
        return  # the symbolic result assumed the symbol equals the other dim
    assert tuple(symbolic.evaluate(d, env) for d in sym) == conc


@given(st.lists(st.sampled_from([1, 2, 4, "s", "t"]), min_size=1, max_size=4))
def test_reshape_flatten_and_back(dims):
    g = Graph()
    x = g.add_input("x", TensorType(tuple(dims), "float32"))
    flat = g.add_node("Reshape", [x], {"shape": [-1]}).output
    assert flat.type.shape == (symbolic.numel(dims),)
    back = g.add_node("Reshape", [flat], {"shape": list(dims)}).output
    assert back.type.shape == x.type.shape


def test_symbolic_arithmetic():
    assert symbolic.mul("s", 4) == "4*s"
    assert symbolic.div("4*s*t", "2*t") == "2*s"
    assert symbolic.div("s", "t") is None
    assert symbolic.add("s", "s") == "2*s"
    assert symbolic.canon("t*2*s") == "2*s*t"
    env: dict[str, int] = {}
    assert symbolic.bind("2*s", 6, env) and env == {"s": 3}
    assert not symbolic.bind("2*s", 7, {})
