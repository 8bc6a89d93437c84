"""Loading a graph file: a node equal to one checked before (same op, attributes as the file
gives them, input types) is built from that node's checks; the graph is the one the full
checks build, and anything that differs, or is wrong, still goes through every check."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.errors import FormatError
from graphkernel.frontends import json_format
from graphkernel.frontends.json_format import graph_from_dict, load_graph, save_graph
from tests.security.conftest import graph_doc, write_json


def layers(n: int = 4) -> Graph:
    """``n`` equal layers (transpose, softmax along an axis, add a constant), with one layer
    of another permutation and one of other types in between."""
    g = Graph("layers")
    x = g.add_input("x", TensorType((2, 3, 8), "float32"))
    for i in range(n):
        perm = [0, 2, 1] if i != 2 else [1, 0, 2]
        x = g.add_node("Transpose", [x], {"perm": perm}).output
        x = g.add_node("Softmax", [x], {"axis": -1}).output
        x = g.add_node("Transpose", [x], {"perm": perm}).output
        c = g.const(np.full((2, 3, 8), i, np.float32))
        x = g.add_node("Add", [x, c]).output
    x = g.add_node("Cast", [x], {"dtype": "float16"}).output
    g.set_outputs([g.add_node("Softmax", [x], {"axis": -1}).output])
    return g


def shape_of(g: Graph) -> list:
    """Everything the IR holds of a graph but array contents: node order, names, ops,
    attributes, origins, types, every use in order, the outputs."""
    out = []
    for n in g.nodes:
        attrs = {k: (v.shape, str(v.dtype)) if isinstance(v, np.ndarray) else v
                 for k, v in n.attrs.items()}
        out.append((n.name, n.op, attrs, n.origin, [v.name for v in n.inputs],
                    [(v.name, v.type, [(u.name, i) for u, i in v.uses]) for v in n.outputs]))
    return out + [[v.name for v in g.outputs], [(v.name, v.type) for v in g.inputs]]


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch):
    monkeypatch.setattr(json_format, "_NODES", {})


def test_a_file_of_repeated_layers_loads_as_the_full_checks_build_it(tmp_path, monkeypatch):
    g = layers()
    path = tmp_path / "g.json"
    save_graph(g, path)
    fast = load_graph(path)
    assert json_format._NODES  # (the repeated nodes were built from the first ones' checks)
    monkeypatch.setattr(json_format, "_repeated_node", lambda *a: None)
    monkeypatch.setattr(json_format, "_new_constant", lambda *a: False)
    slow = load_graph(path)
    assert shape_of(fast) == shape_of(slow)
    assert sorted(map(repr, shape_of(fast))) == sorted(map(repr, shape_of(g)))  # (constants
    # come first in a file)
    fast.validate()


def test_other_attributes_or_input_types_are_checked_and_inferred_anew(tmp_path):
    g = load_graph(write_json(tmp_path / "g.json", {
        "format": "graphkernel/1", "name": "g",
        "inputs": [{"name": "x", "shape": [2, 3, 8], "dtype": "float32"},
                   {"name": "h", "shape": [2, 3, 8], "dtype": "float16"}],
        "nodes": [{"name": "a", "op": "Transpose", "inputs": ["x"], "outputs": ["ya"],
                   "attrs": {"perm": [0, 2, 1]}},
                  {"name": "b", "op": "Transpose", "inputs": ["x"], "outputs": ["yb"],
                   "attrs": {"perm": [1, 0, 2]}},
                  {"name": "c", "op": "Transpose", "inputs": ["h"], "outputs": ["yc"],
                   "attrs": {"perm": [0, 2, 1]}},
                  {"name": "d", "op": "Transpose", "inputs": ["x"], "outputs": ["yd"],
                   "attrs": {"perm": [0, 2, 1]}}],
        "outputs": ["ya", "yb", "yc", "yd"]}))
    types = {v.name: v.type for v in g.outputs}
    assert types["ya"] == types["yd"] == TensorType((2, 8, 3), "float32")
    assert types["yb"] == TensorType((3, 2, 8), "float32")
    assert types["yc"] == TensorType((2, 8, 3), "float16")
    a, d = g.node("a"), g.node("d")
    assert a.attrs["perm"] == d.attrs["perm"] and a.attrs["perm"] is not d.attrs["perm"]
    d.attrs["perm"].reverse()  # (no two nodes share a list)
    assert a.attrs["perm"] == [0, 2, 1]


def _two_exps(second: dict) -> dict:
    first = {"name": "n1", "op": "Exp", "inputs": ["x"],
             "outputs": [{"name": "y1", "shape": [4], "dtype": "float32"}]}
    return graph_doc(nodes=[first, {"op": "Exp", "inputs": ["x"]} | second],
                     outputs=["y1"])


@pytest.mark.parametrize("second, message", [
    ({"name": "n2", "outputs": ["y1"]}, "value 'y1' is defined twice"),
    ({"name": "n1", "outputs": ["y2"]}, "a node named 'n1' already exists"),
    ({"name": "n2", "outputs": [{"name": "y2", "shape": [5], "dtype": "float32"}]},
     r"declared type float32\[5\] differs from the inferred float32\[4\]"),
    ({"name": "n2", "outputs": ["y2", "y3"]}, "Exp has 1 outputs, the file lists 2"),
])
def test_a_repeated_node_that_is_wrong_gets_the_same_error(second, message):
    with pytest.raises(FormatError, match=message):
        graph_from_dict(_two_exps(second))


def test_a_repeated_node_declared_with_an_alias_dtype_is_accepted():
    g = graph_from_dict(_two_exps({"name": "n2", "outputs": [
        {"name": "y2", "shape": [4], "dtype": "fp32"}]}))
    assert g.value("y2").type == TensorType((4,), "float32")


def test_constants_whose_names_are_taken_are_built_as_the_full_checks_build_them():
    """A constant named as a graph input: its value gets a fresh name (as ``add_node``
    gives it); two constants of one name: the error that says so."""
    c = {"name": "x", "shape": [4], "dtype": "float32", "data": [1.0, 2.0, 3.0, 4.0]}
    g = graph_from_dict(graph_doc(constants=[c]))
    assert g.node("x").op == "Constant" and g.node("x").output.name == "x_1"
    assert g.value("x") is g.inputs[0]
    with pytest.raises(FormatError, match=r"constants\[1\] \('k'\): .*'k' already exists"):
        graph_from_dict(graph_doc(constants=[c | {"name": "k"}, c | {"name": "k"}]))

