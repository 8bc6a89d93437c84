"""Data-movement ops: inference (incl. symbolic dims, negative axes) and references."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.errors import ShapeError
from tests.conftest import assert_close, run_op


def infer(op, shapes, attrs, dtype="float32"):
    g = Graph()
    ins = [g.add_input(f"i{k}", TensorType(tuple(s), dtype)) for k, s in enumerate(shapes)]
    return [v.type.shape for v in g.add_node(op, ins, attrs).outputs]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_broadcast_to(dtype, rng):
    x = (rng.standard_normal((3, 1)) > 0).astype(dtype)
    got = run_op("BroadcastTo", [x], {"shape": [2, 3, 5]})
    assert_close(got, np.broadcast_to(x, (2, 3, 5)))
    assert infer("BroadcastTo", [("s0", 1)], {"shape": [-1, 8]}) == [("s0", 8)]
    with pytest.raises(ShapeError, match="cannot broadcast"):
        infer("BroadcastTo", [(3, 2)], {"shape": [3, 4]})


def test_reshape_with_minus_one_and_symbols(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    assert_close(run_op("Reshape", [x], {"shape": [-1, 4]}), x.reshape(6, 4))
    assert infer("Reshape", [("b", 3, 4)], {"shape": [-1, 12]}) == [("b", 12)]
    assert infer("Reshape", [("b", "s", 8)], {"shape": [-1, 8]}) == [("b*s", 8)]
    assert infer("Reshape", [("b*s", 8)], {"shape": ["b", "s", 2, 4]}) == [("b", "s", 2, 4)]
    with pytest.raises(ShapeError, match="cannot reshape"):
        infer("Reshape", [(2, 3)], {"shape": [4, 2]})
    with pytest.raises(ShapeError, match="more than one -1"):
        infer("Reshape", [(2, 3)], {"shape": [-1, -1]})


def test_reshape_symbolic_runs_on_several_sizes(rng):
    from graphkernel.interpreter import Interpreter

    g = Graph()
    x = g.add_input("x", TensorType(("b", 3, 4), "float32"))
    g.set_outputs([g.add_node("Reshape", [x], {"shape": [-1, 2]}).output])
    for b in (1, 2, 5):
        a = rng.standard_normal((b, 3, 4)).astype(np.float32)
        assert_close(Interpreter(g).run({"x": a})[0], a.reshape(-1, 2))


def test_expand_dims_and_squeeze(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    assert run_op("ExpandDims", [x], {"axis": [0, -1]}).shape == (1, 3, 4, 1)
    assert run_op("ExpandDims", [x], {"axis": [1]}).shape == (3, 1, 4)
    y = x.reshape(1, 3, 1, 4)
    assert run_op("Squeeze", [y], {"axis": [-2]}).shape == (1, 3, 4)
    assert run_op("Squeeze", [y], {"axis": None}).shape == (3, 4)
    with pytest.raises(ShapeError, match="must be 1"):
        infer("Squeeze", [(2, 3)], {"axis": [0]})
    with pytest.raises(ShapeError, match="out of range"):
        infer("ExpandDims", [(2, 3)], {"axis": [5]})


def test_transpose(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float16)
    assert_close(run_op("Transpose", [x], {"perm": [2, 0, 1]}), x.transpose(2, 0, 1))
    assert infer("Transpose", [("b", 3)], {"perm": [1, 0]}) == [(3, "b")]
    with pytest.raises(ShapeError, match="not a permutation"):
        infer("Transpose", [(2, 3)], {"perm": [0, 0]})


def test_slice(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    assert_close(run_op("Slice", [x], {"begin": [1, 2], "size": [2, -1]}), x[1:3, 2:])
    assert infer("Slice", [("b", 6)], {"begin": [0, 1], "size": [-1, 3]}) == [("b", 3)]
    with pytest.raises(ShapeError, match="outside"):
        infer("Slice", [(4, 6)], {"begin": [3, 0], "size": [2, 1]})


@pytest.mark.parametrize("begin,end,stride", [(1, 5, 2), (-1, -100, -1), (0, 99, 3),
                                               (5, 1, -2), (-3, 100, 1)])
def test_strided_slice_matches_python_slicing(begin, end, stride, rng):
    x = rng.standard_normal((3, 7)).astype(np.float32)
    got = run_op("StridedSlice", [x], {"begin": [begin], "end": [end], "strides": [stride],
                                       "axes": [-1]})
    assert_close(got, x[:, begin:end:stride])


@pytest.mark.parametrize("begin", [0, 2, -2])
def test_strided_slice_ending_at_zero_of_a_symbolic_axis_is_empty(begin, rng):
    """x[b:0] takes nothing whatever the length: a stop of 0 is not "to the end"."""
    attrs = {"begin": [begin], "end": [0], "strides": [1], "axes": [0]}
    assert infer("StridedSlice", [("s", 3)], attrs) == [(0, 3)]
    x = rng.standard_normal((5, 3)).astype(np.float32)
    assert run_op("StridedSlice", [x], attrs).shape == (0, 3)


def test_concat_and_split(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    assert_close(run_op("Concat", [a, b], {"axis": -1}), np.concatenate([a, b], -1))
    assert infer("Concat", [("s", 2), ("s", 2)], {"axis": 0}) == [("2*s", 2)]
    x = rng.standard_normal((2, 8)).astype(np.float32)
    parts = run_op("Split", [x], {"axis": 1, "sizes": [3, 5]})
    assert_close(parts[0], x[:, :3])
    assert_close(parts[1], x[:, 3:])
    with pytest.raises(ShapeError, match="sum to"):
        infer("Split", [(2, 8)], {"axis": 1, "sizes": [3, 3]})


def test_gather_with_negative_indices(rng):
    p = rng.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([[0, -1], [2, 4]], np.int64)
    assert_close(run_op("Gather", [p, idx], {"axis": 0}), p[[[0, 4], [2, 4]]])
    assert run_op("Gather", [p, np.array([2], np.int32)], {"axis": 1}).shape == (5, 1)


def test_one_hot():
    idx = np.array([0, 2, -1], np.int64)
    got = run_op("OneHot", [idx], {"depth": 3, "on_value": 5, "off_value": -1, "axis": 0,
                                   "dtype": "int32"})
    want = np.array([[5, -1, -1], [-1, -1, -1], [-1, 5, 5]], np.int32)
    assert_close(got, want)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(exclusive, reverse):
    torch = pytest.importorskip("torch")
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    got = run_op("CumSum", [x], {"axis": 1, "exclusive": exclusive, "reverse": reverse})
    t = torch.from_numpy(x)
    if reverse:
        t = t.flip(1)
    want = t.cumsum(1)
    if exclusive:
        want = want - t
    if reverse:
        want = want.flip(1)
    assert_close(got, want.numpy())
