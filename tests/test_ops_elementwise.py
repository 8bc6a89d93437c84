"""Every unary and binary op: inference and reference against torch (float64) or numpy."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from graphkernel import ops
from graphkernel.errors import ShapeError
from graphkernel.opdefs.elementwise import BINARY, UNARY
from tests.conftest import assert_close, run_op

torch = pytest.importorskip("torch")
BF16 = np.dtype(ml_dtypes.bfloat16)

# An independent implementation of each op, evaluated in float64 (or exactly, for ints).
TORCH_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Expm1": torch.expm1,
    "Log": torch.log, "Log1p": torch.log1p, "Sqrt": torch.sqrt, "Rsqrt": torch.rsqrt,
    "Reciprocal": torch.reciprocal, "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan,
    "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan, "Tanh": torch.tanh,
    "Erf": torch.erf, "Erfc": torch.erfc, "Floor": torch.floor, "Ceil": torch.ceil,
    "Trunc": torch.trunc, "Round": torch.round, "Sign": torch.sign, "IsFinite": torch.isfinite,
    "IsNan": torch.isnan, "IsInf": torch.isinf, "LogicalNot": torch.logical_not,
    "Identity": lambda x: x,
}
TORCH_BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul,
    "Div": lambda a, b: torch.div(a, b, rounding_mode=None if a.is_floating_point() else "trunc"),
    "FloorDiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "FloorMod": torch.remainder, "Mod": torch.fmod, "Pow": torch.pow,
    "Maximum": torch.maximum, "Minimum": torch.minimum, "Atan2": torch.atan2,
    "Equal": torch.eq, "NotEqual": torch.ne, "Greater": torch.gt, "GreaterEqual": torch.ge,
    "Less": torch.lt, "LessEqual": torch.le, "LogicalAnd": torch.logical_and,
    "LogicalOr": torch.logical_or, "BitwiseAnd": torch.bitwise_and,
    "BitwiseOr": torch.bitwise_or,
}
SHAPES = [(3, 5), (2, 1, 4), (1,), (), (0, 3), (7, 33)]
# Inputs inside each op's domain, with edge values included.
DOMAIN = {"Log": (0.01, 5), "Sqrt": (0, 5), "Rsqrt": (0.05, 5), "Log1p": (-0.9, 5),
          "Asin": (-1, 1), "Acos": (-1, 1), "Reciprocal": (0.1, 5), "Tan": (-1.4, 1.4)}


def test_tables_cover_registered_ops():
    assert set(TORCH_UNARY) == set(UNARY)
    assert set(TORCH_BINARY) == set(BINARY)
    for name in list(UNARY) + list(BINARY):
        assert ops.get(name).kind == ops.OpKind.ELEMWISE


def _sample(rng, op, shape, dtype):
    lo, hi = DOMAIN.get(op, (-4, 4))
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0 if np.dtype(dtype).kind == "u" else -9, 10, shape).astype(dtype)
    x = rng.uniform(lo, hi, shape)
    if x.size > 3 and op in ("Floor", "Ceil", "Round", "Trunc"):
        x.reshape(-1)[:3] = [0.5, -1.5, 2.5]  # ties: Round is half-to-even
    return x.astype(dtype)


def _torch_ref(fn, *arrays):
    ts = [torch.from_numpy(np.asarray(a, np.float64) if a.dtype.kind == "f" or a.dtype == BF16
                           else a.copy()) for a in arrays]
    return fn(*ts).numpy()


def _unary_dtypes(op):
    cls = {"numeric": [np.float32, np.float16, BF16, np.int32],
           "float": [np.float32, np.float16, BF16, np.float64],
           "bool": [np.bool_], "any": [np.float32, np.int64, np.bool_]}
    return cls[UNARY[op][1]]


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, rng):
    for dtype in _unary_dtypes(op):
        for shape in SHAPES:
            x = _sample(rng, op, shape, dtype)
            got = run_op(op, [x])
            # the reference is computed from the (already rounded) input in float64,
            # then rounded to the output dtype once: what op-by-op execution must give
            want = _torch_ref(TORCH_UNARY[op], x)
            out_dt = got.dtype
            assert_close(got, np.asarray(want).astype(out_dt), out_dt)


def _binary_dtypes(op):
    cls = {"numeric": [np.float32, np.float16, BF16, np.int32, np.int64, np.uint8],
           "float": [np.float32, np.float16, np.float64], "bool": [np.bool_],
           "intbool": [np.int32, np.uint8, np.bool_], "any": [np.float32, np.int32, np.bool_]}
    return cls[BINARY[op][1]]


BROADCAST_PAIRS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (1, 3, 1)), ((), (5,)),
                   ((0, 4), (1, 4)), ((1,), (1,))]


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op, rng):
    for dtype in _binary_dtypes(op):
        for sa, sb in BROADCAST_PAIRS:
            a = _sample(rng, op, sa, dtype)
            b = _sample(rng, op, sb, dtype)
            if op in ("Div", "FloorDiv", "FloorMod", "Mod") and np.dtype(dtype).kind in "iu":
                b = np.where(b == 0, 3, b).astype(dtype)
            if op == "Pow":
                a = np.abs(a) if np.dtype(dtype).kind == "f" else a
                b = np.clip(b, 0, 3).astype(dtype)
            got = run_op(op, [a, b])
            want = _torch_ref(TORCH_BINARY[op], a, b)
            assert got.shape == np.broadcast_shapes(sa, sb)
            assert_close(got, np.asarray(want).astype(got.dtype), got.dtype)


def test_binary_rejects_mixed_dtypes():
    with pytest.raises(ShapeError, match="insert a Cast"):
        run_op("Add", [np.ones(3, np.float32), np.ones(3, np.float16)])


def test_binary_rejects_incompatible_shapes():
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        run_op("Mul", [np.ones((2, 3), np.float32), np.ones((4,), np.float32)])


def test_float_only_op_rejects_int():
    with pytest.raises(ShapeError, match="int32 is not accepted"):
        run_op("Exp", [np.ones(3, np.int32)])


def test_fp16_result_is_rounded_after_each_op():
    # exp(11) = 59874.1 rounds to 59872 in fp16; the interpreter must round, not keep fp32
    x = np.array([11.0], np.float16)
    got = run_op("Exp", [x])
    assert got.dtype == np.float16 and float(got[0]) == float(np.float16(math.exp(11.0)))


@pytest.mark.parametrize("dst", ["float16", "bfloat16", "int32", "bool", "float64", "uint8"])
def test_cast(dst, rng):
    x = np.array([-2.7, -0.5, 0.0, 0.4, 1.5, 3.9, 70000.0], np.float32)
    got = run_op("Cast", [x], {"dtype": dst})
    want_t = torch.from_numpy(x).to({"float16": torch.float16, "bfloat16": torch.bfloat16,
                                     "int32": torch.int32, "bool": torch.bool,
                                     "float64": torch.float64, "uint8": torch.uint8}[dst])
    if dst == "uint8":
        x = x[x >= 0][:-1]  # negative / out-of-range float -> uint8 is undefined behaviour
        got = run_op("Cast", [x], {"dtype": dst})
        want_t = torch.from_numpy(x).to(torch.uint8)
    want = want_t.float().numpy() if dst == "bfloat16" else want_t.numpy()
    assert_close(got.astype(np.float32) if dst == "bfloat16" else got, want)


def test_select_broadcasts_three_ways(rng):
    c = rng.integers(0, 2, (2, 1, 4)).astype(bool)
    a = rng.standard_normal((3, 1)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    got = run_op("Select", [c, a, b])
    assert_close(got, torch.where(torch.from_numpy(c), torch.from_numpy(a),
                                  torch.from_numpy(b)).numpy())
    assert ops.canonical("Where") == "Select"
