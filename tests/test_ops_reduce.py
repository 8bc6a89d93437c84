"""Reductions against torch, with keep_dims, negative axes, size-0 and size-1 dims."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel.errors import ShapeError
from tests.conftest import assert_close, run_op

torch = pytest.importorskip("torch")

CASES = [((3, 4, 5), [-1]), ((3, 4, 5), [0, 2]), ((3, 4, 5), None), ((1, 7), [0]),
         ((2, 0, 3), [1]), ((6,), [0])]


@pytest.mark.parametrize("op,fn", [("ReduceSum", torch.sum), ("ReduceProd", None),
                                   ("ReduceMax", torch.amax), ("ReduceMin", torch.amin)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("keep", [False, True])
def test_reduce(op, fn, dtype, keep, rng):
    for shape, axis in CASES:
        if 0 in shape and op in ("ReduceMax", "ReduceMin"):
            continue  # torch refuses max/min of nothing; covered separately below
        x = rng.uniform(-2, 2, shape).astype(dtype)
        got = run_op(op, [x], {"axis": axis, "keep_dims": keep})
        t = torch.from_numpy(x.astype(np.float64) if dtype != np.int32 else x)
        dims = tuple(range(x.ndim)) if not axis else tuple(a % x.ndim for a in axis)
        if op == "ReduceProd":
            want = t
            for d in sorted(dims, reverse=True):
                want = want.prod(d, keepdim=keep)
        else:
            want = fn(t, dim=dims, keepdim=keep)
        assert_close(got, want.numpy().astype(got.dtype))


def test_reduce_max_of_empty_axis_is_the_identity():
    got = run_op("ReduceMax", [np.zeros((2, 0), np.float32)], {"axis": [1]})
    assert got.shape == (2,) and np.all(got == -np.inf)


def test_fp16_sum_accumulates_in_fp32():
    x = np.full(4096, 1.0, np.float16)  # fp16 accumulation would stall at 2048
    assert float(run_op("ReduceSum", [x], {"axis": [0]})) == 4096.0


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_float32_sums_over_outer_axes_of_a_transposed_view_are_rounded_once(op, rng):
    """A batch norm's statistics: a sum over N, H and W of a transposed view (a
    convolution's output), thousands of values of one sign. Summed one by one in float32
    (numpy's order over non-contiguous axes) the result is off by many ulps; accumulated in
    float64 and rounded once it is within one ulp of the exact value, whatever the layout."""
    x = (rng.standard_normal((2, 32, 32, 16)) + 1.25).astype(np.float32).transpose(0, 3, 1, 2)
    got = run_op(op, [x], {"axis": [0, 2, 3], "keep_dims": False})
    exact = x.astype(np.float64).sum(axis=(0, 2, 3))
    if op == "ReduceMean":
        exact /= 2 * 32 * 32
    ulps = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32))
    assert got.dtype == np.float32 and float(ulps.max()) <= 1.0


@pytest.mark.parametrize("op,fn", [("ArgMax", torch.argmax), ("ArgMin", torch.argmin)])
def test_arg_reductions(op, fn, rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    got = run_op(op, [x], {"axis": -1, "keep_dims": True})
    assert got.dtype == np.int64
    assert_close(got, fn(torch.from_numpy(x), dim=-1, keepdim=True).numpy())
    ties = np.array([[1, 3, 3, 0]], np.float32)
    last = run_op(op, [ties if op == "ArgMax" else -ties], {"axis": 1, "select_last_index": True})
    assert last.tolist() == [2]


def test_elem_any():
    assert run_op("ElemAny", [np.zeros((3, 3), np.float32)]).tolist() == [0.0]
    x = np.zeros((3, 3), np.float32)
    x[1, 2] = np.inf
    assert run_op("ElemAny", [x]).tolist() == [1.0]


def test_reduce_axis_out_of_range():
    with pytest.raises(ShapeError, match="out of range"):
        run_op("ReduceSum", [np.ones((2, 3), np.float32)], {"axis": [2]})
    with pytest.raises(ShapeError, match="repeat"):
        run_op("ReduceSum", [np.ones((2, 3), np.float32)], {"axis": [1, -1]})
