"""The text form of graphs: attribute spellings and the remembered type texts."""

from __future__ import annotations

import numpy as np

from graphkernel import Graph, TensorType, textir
from graphkernel.ir import DType


def test_attribute_spellings():
    cases = [(True, "true"), (False, "false"), (3, "3"), (-0.0, "-0.0"), (2.5, "2.5"),
             ("same", "'same'"), ([1, [True, 2.0]], "[1, [true, 2.0]]"), ((1, 2), "(1, 2)"),
             (DType.float16, "float16"), (TensorType((2, "s0"), "int8"), "int8[2,s0]"),
             (np.asarray([1.5, -2.0], np.float16), "float16[2][1.5, -2.0]"),
             (np.zeros((3, 3), np.int32), "int32[3, 3]"), (len, "<callable>")]
    for value, text in cases:
        assert textir.format_attr(value) == text


def test_type_texts_remembered_and_forgotten(monkeypatch):
    """Each type prints as ``str`` does, the first time and later, also once the remembered
    texts were dropped (a full table)."""
    monkeypatch.setattr(textir, "_TYPE_TEXTS", {})
    monkeypatch.setattr(textir, "_TYPE_TEXTS_KEPT", 2)
    types = [TensorType((4, 8), "float32"), TensorType((4, 8), "float16"),
             TensorType(("b", 8), "float32"), TensorType((), "bool")]
    for _ in range(2):
        for t in types:
            assert textir.type_text(t) == str(t)
            assert textir.type_text(TensorType(t.shape, t.dtype)) == str(t)
    assert len(textir._TYPE_TEXTS) <= 2


def test_graph_text_shows_types_attributes_and_origins():
    g = Graph("g")
    x = g.add_input("x", TensorType(("b", 8), "float16"), mutable=True)
    s = g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": True}, name="s",
                   origin=["user_sum"])
    g.set_outputs([s.output])
    assert str(g) == ("graph g(%x: float16[b,8] mutable) {\n"
                      "  s: %s: float16[b,1] = ReduceSum(%x) {axis=[1], keep_dims=true}"
                      "  origin=[user_sum]\n"
                      "  return %s\n"
                      "}")
