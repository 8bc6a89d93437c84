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


@given(st.integers(0, 10_000), st.lists(st.tuples(st.integers(-20, 20), st.integers(1, 6)),
                                        min_size=1, max_size=5))
def test_derived_symbols_compute_the_chain_they_name(x, chain):
    """A length through convolutions, pools and slices, floor((d + a) / k) step by step, is
    one derived symbol that evaluates to the same integer (symbolic.py)."""
    d: symbolic.Dim = "s0"
    want = x + 1000  # long enough that no step goes negative
    for a, k in chain:
        d = symbolic.floor_affine(d, a, k)
        want = (want + a) // k
    assert symbolic.evaluate(d, {"s0": x + 1000}) == want
    env: dict[str, int] = {}  # a derived symbol with a free base binds the base if it can
    assert symbolic.bind(symbolic.mul(3, d), 3 * want, env)
    assert symbolic.evaluate(d, env) == want


@given(st.integers(1, 2_000), st.integers(2, 16),
       st.lists(st.tuples(st.integers(-20, 20), st.integers(1, 6)), min_size=1, max_size=5))
def test_a_multiple_of_a_symbol_offset_and_divided_is_one_scaled_symbol(x, m, chain):
    """A length the guards hold to be a multiple of m (``m*q``) through convolutions and
    slices, floor((d + a) / k) step by step, is a dim that evaluates to the same integer,
    and binds q back from its value (symbolic.scaled)."""
    d: symbolic.Dim = f"{m}*q"
    want = m * (x + 1000)
    for a, k in chain:
        d = symbolic.floor_affine(d, a, k)
        want = (want + a) // k
    assert symbolic.evaluate(d, {"q": x + 1000}) == want
    env: dict[str, int] = {}
    if symbolic.bind(d, want, env):  # (a floor division binds under its own name)
        assert symbolic.evaluate(d, env) == want


def test_a_scaled_symbol_has_one_spelling():
    assert symbolic.floor_affine("8*q", 3) == "q__t8_p3_d1"
    assert symbolic.pretty("q__t8_p3_d1") == "8*q+3"
    assert symbolic.floor_affine("q__t8_p3_d1", -3) == "8*q"  # the convolution sliced back
    assert symbolic.floor_affine("8*q", 7, 8) == "q"  # floor((8q + 7)/8): the gcd cancels
    assert symbolic.floor_affine("q__t8_p3_d1", 0, 2) == "q__t4_p1_d1"
    assert symbolic.derived("q__t8_p3_d1") is None  # (not an offset of a plain base)
    env: dict[str, int] = {}
    assert symbolic.bind("q__t8_p3_d1", 27, env) and env == {"q": 3}
    assert not symbolic.bind("q__t8_p3_d1", 28, {})  # 25 is no multiple of 8
    with pytest.raises(symbolic.ShapeError):
        symbolic.floor_affine("2*q__t8_p3_d1", 1)


def test_a_padded_convolution_and_a_slice_from_the_end_give_the_length_back():
    g = Graph()
    x = g.add_input("x", TensorType((2, 4, 1, "L"), "float32"))
    w = g.const(np.ones((4, 2, 1, 4), np.float32))
    y = g.add_node("Conv2D", [x, w], {"pads": [0, 2, 0, 2], "group": 2}).output
    assert y.type.shape[3] == "L__p1_d1" and symbolic.pretty(y.type.shape[3]) == "L+1"
    z = g.add_node("StridedSlice", [y], {"begin": [0], "end": [-1], "axes": [3]}).output
    assert z.type.shape == (2, 4, 1, "L")
    s = g.add_node("Conv2D", [z, w],
                   {"strides": [1, 3], "group": 2}).output
    assert symbolic.pretty(s.type.shape[3]) == "(L-1)//3"
    with pytest.raises(symbolic.ShapeError):
        symbolic.floor_affine("L*T", 1)  # only one symbol (or a multiple of one) is offset


def test_a_kv_cache_grows_by_a_symbol_plus_one_and_its_last_rows_are_sliced():
    """Concat of a cache [2, 2, s, 16] and a new token [2, 2, 1, 16] is s + 1 positions
    (once more: s + 2); the last k rows of a symbolic axis are k rows."""
    g = Graph()
    cache = g.add_input("cache", TensorType((2, 2, "s", 16), "float32"))
    new = g.add_input("new", TensorType((2, 2, 1, 16), "float32"))
    grown = g.add_node("Concat", [cache, new], {"axis": 2}).output
    assert symbolic.pretty(grown.type.shape[2]) == "s+1"
    again = g.add_node("Concat", [new, grown], {"axis": 2}).output
    assert symbolic.pretty(again.type.shape[2]) == "s+2"
    last = g.add_node("StridedSlice", [again], {"begin": [-3], "end": [2**62],
                                                "axes": [2]}).output
    assert last.type.shape == (2, 2, 3, 16)
    g.set_outputs([again, last])
    from graphkernel.interpreter import run_graph

    rng = np.random.default_rng(0)
    feeds = {"cache": rng.standard_normal((2, 2, 5, 16)).astype(np.float32),
             "new": rng.standard_normal((2, 2, 1, 16)).astype(np.float32)}
    out = run_graph(g, feeds)
    want = np.concatenate([feeds["new"], feeds["cache"], feeds["new"]], axis=2)
    np.testing.assert_array_equal(out[0], want)
    np.testing.assert_array_equal(out[1], want[:, :, -3:])
    with pytest.raises(symbolic.ShapeError):
        symbolic.add("s", "t")  # unlike symbols
    assert symbolic.add(2, "s__m10_d5") == "s__p0_d5"  # floor((s - 10)/5) + 2
