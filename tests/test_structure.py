"""Structural keys: equal keys exactly for equal values, whatever the names or the layout."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.structure import SMALL_ARRAY_BYTES, attr_key, attrs_key, body_signature


@pytest.mark.parametrize("n", [1, 3, SMALL_ARRAY_BYTES // 4, SMALL_ARRAY_BYTES // 4 + 1, 200])
def test_array_keys_follow_values_dtype_and_shape(n):
    """Small arrays (keyed by their bytes) and large ones (by a digest) alike."""
    a = np.arange(n, dtype=np.float32)
    assert attr_key(a) == attr_key(a.copy())
    assert hash(attr_key(a)) == hash(attr_key(a.copy()))
    b = a.copy()
    b[-1] = -1.0
    assert attr_key(b) != attr_key(a)
    assert attr_key(a.astype(np.float16)) != attr_key(a)
    assert attr_key(a.reshape(1, n)) != attr_key(a)
    if n % 2 == 0:  # another layout of the same values is the same value
        m = a.reshape(2, n // 2)
        assert attr_key(np.asfortranarray(m)) == attr_key(m)


def test_negative_zero_and_nan_payloads_are_other_values():
    assert attr_key(np.float32(-0.0) * np.ones(1, np.float32)) != attr_key(np.zeros(1, np.float32))
    nan = np.full(1, np.nan, np.float32)
    assert attr_key(nan) == attr_key(nan.copy())  # the same bits: the same constant


def test_attrs_key_ignores_insertion_order_not_values():
    assert attrs_key({"axis": [1], "keep_dims": True}) == attrs_key({"keep_dims": True,
                                                                     "axis": [1]})
    assert attrs_key({"axis": [1], "keep_dims": True}) != attrs_key({"axis": [1],
                                                                     "keep_dims": False})
    assert attrs_key({"axis": [1, 2]}) != attrs_key({"axis": [2, 1]})
    assert attrs_key({}) == ()


def body(scale, name: str = "x", dtype: str = "float32") -> Graph:
    g = Graph("k")
    x = g.add_input(name, TensorType((4, 8), dtype))
    h = g.add_node("Mul", [x, g.const(np.asarray(scale, dtype=dtype))]).output
    g.set_outputs([g.add_node("Tanh", [h]).output])
    return g


def test_body_signature_sees_scalar_constants_and_types():
    assert body_signature(body(0.5)) == body_signature(body(0.5, name="other"))
    assert body_signature(body(0.5)) != body_signature(body(0.25))
    assert body_signature(body(0.0)) != body_signature(body(-0.0))
    assert body_signature(body(0.5)) != body_signature(body(0.5, dtype="float16"))
