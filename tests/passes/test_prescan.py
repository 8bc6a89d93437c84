"""Passes that look for one kind of op first ask whether the graph holds any (one cheap walk
over the op names) and only then walk it in earnest: a graph without one is left as the full
walk leaves it, reported as the full walk reports it, and a graph with one is still walked."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel.passes.conv_bn_fold as conv_bn_fold_mod
import graphkernel.passes.scan as scan_mod
import graphkernel.passes.small_ints as small_ints_mod
from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, ops_of


def _ints(dtype: str) -> Graph:
    """Bounded integer arithmetic (a mask's running count), in ``dtype``."""
    g = Graph()
    ids = g.add_input("ids", TensorType((2, 16), dtype))
    mask = g.add_node("NotEqual", [ids, g.const(np.array(1, dtype=dtype))]).output
    m = g.add_node("Cast", [mask], {"dtype": dtype}).output
    run = g.add_node("CumSum", [m], {"axis": 1}).output
    g.set_outputs([g.add_node("Add", [run, g.const(np.array(1, dtype=dtype))]).output])
    return g


def _floats(op: str = "Add") -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType((4, 8), "float32"))
    y = g.add_node(op, [x, g.const(np.float32(2.0))]).output
    g.set_outputs([g.add_node("Exp", [y]).output])
    return g


def _refuse(*_a, **_k):
    raise AssertionError("walked a graph that holds nothing to look for")


def test_small_ints_without_int64_arithmetic_computes_no_ranges(monkeypatch):
    full = apply_pass("small_ints", _ints("int32"))[1]  # (int32: no region qualifies)
    monkeypatch.setattr(small_ints_mod, "value_range", _refuse)
    h, res = apply_pass("small_ints", _ints("int32"))
    assert (res.modified, res.rewrites, res.summary) == (full.modified, 0, full.summary)
    assert ops_of(h) == ["NotEqual", "Cast", "CumSum", "Add"]
    with pytest.raises(AssertionError, match="walked"):  # int64: walked as before
        apply_pass("small_ints", _ints("int64"))


def test_small_ints_still_rewrites_int64_arithmetic():
    h, res = apply_pass("small_ints", _ints("int64"))
    # (and the ids' NotEqual with the pad id in float32: 2 rewrites)
    assert res.summary.startswith("1 integer region") and "CumSum" in ops_of(h)


def test_scan_without_strided_slices_or_cumsum_looks_for_no_leaves(monkeypatch):
    full = apply_pass("scan", _floats())[1]
    monkeypatch.setattr(scan_mod, "_leaves", _refuse)
    h, res = apply_pass("scan", _floats())
    assert (res.modified, res.rewrites, res.summary) == (full.modified, 0, full.summary)
    assert ops_of(h) == ["Add", "Exp"]
    g = Graph()  # a CumSum of floats: still found (and made a Scan)
    x = g.add_input("x", TensorType((4, 8), "float32"))
    g.set_outputs([g.add_node("CumSum", [x], {"axis": 1}).output])
    monkeypatch.undo()
    h, res = apply_pass("scan", g)
    assert res.rewrites == 1 and ops_of(h) == ["Scan"]


def test_conv_bn_fold_without_a_convolution_tries_no_fold(monkeypatch):
    monkeypatch.setattr(conv_bn_fold_mod, "_fold", _refuse)
    h, res = apply_pass("conv_bn_fold", _floats("Mul"))
    assert (res.modified, res.rewrites) == (False, 0) and ops_of(h) == ["Mul", "Exp"]
    g = Graph()  # with one: every Mul/Add is tried
    x = g.add_input("x", TensorType((1, 3, 8, 8), "float32"))
    w = g.const(np.ones((4, 3, 3, 3), np.float32))
    c = g.add_node("Conv2D", [x, w]).output
    g.set_outputs([g.add_node("Mul", [c, g.const(np.float32(2.0))]).output])
    with pytest.raises(AssertionError, match="walked"):
        apply_pass("conv_bn_fold", g)
