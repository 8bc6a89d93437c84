"""Accuracy metrics: tolerances per dtype, error locations, cosine, ratios, NaN/Inf."""

from __future__ import annotations

import numpy as np

from graphkernel.verify import compare, compare_outputs, tolerance


def test_tolerances_follow_torch_testing():
    assert tolerance("float16") == (1e-3, 1e-5)
    assert tolerance("bfloat16") == (1.6e-2, 1e-5)
    assert tolerance("float32") == (1.3e-6, 1e-5)
    assert tolerance("int32") == (0.0, 0.0)


def test_identical_outputs_match():
    x = np.linspace(-3, 3, 50, dtype=np.float32)
    m = compare(x, x, name="y")
    assert m.passed and m.cosine == 1.0 and m.max_abs_err == 0.0
    assert m.ratio_rel_lt_1e3 == 1.0 and m.cosine_pass and m.max_abs_pass


def test_mismatch_reports_location_and_metrics():
    e = np.ones((4, 5), np.float32)
    a = e.copy()
    a[2, 3] = 1.5
    m = compare(a, e, name="out")
    assert not m.passed and m.mismatched == 1
    assert m.max_abs_at == [2, 3] and np.isclose(m.max_abs_err, 0.5)
    assert np.isclose(m.max_rel_err, 0.5) and m.ratio_rel_lt_1e3 == 19 / 20
    rep = compare_outputs([a], [e], ["out"])
    assert rep.verdict().startswith("MISMATCH: output 'out': 1/20 elements") and "(2, 3)" in \
        rep.verdict()


def test_fp16_tolerance_is_looser_than_fp32():
    e = np.full(10, 1.0)
    a = e * (1 + 5e-4)
    assert compare(a.astype(np.float16), e.astype(np.float16), "float16").passed
    assert not compare(a.astype(np.float32), e.astype(np.float32), "float32").passed


def test_new_nan_is_always_a_mismatch_but_matching_nan_is_not():
    e = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare(e.copy(), e).passed
    a = np.array([np.nan, np.nan, np.inf], np.float32)
    m = compare(a, e)
    assert not m.passed and m.new_nan_inf == 1
    a2 = np.array([1.0, np.nan, -np.inf], np.float32)
    assert not compare(a2, e).passed


def test_integers_compare_exactly_and_shapes_must_agree():
    assert not compare(np.array([1, 2]), np.array([1, 3])).passed
    m = compare(np.zeros((2, 3)), np.zeros((3, 2)))
    assert not m.passed and "shape [2, 3] != expected [3, 2]" in m.shape_mismatch


def test_cosine_detects_direction_errors():
    e = np.array([1.0, 0.0, 0.0])
    assert compare(np.array([0.0, 1.0, 0.0]), e).cosine == 0.0
    assert compare(np.zeros(3), np.zeros(3)).cosine == 1.0
