"""The graph file format: exact round trips, side data, and errors with JSON paths."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.errors import FormatError
from graphkernel.frontends import load_model
from graphkernel.frontends.json_format import load_graph, save_graph
from graphkernel.interpreter import random_inputs, run_graph


def rich_graph() -> Graph:
    g = Graph("rich")
    x = g.add_input("x", TensorType(("b", 100), "bfloat16"))
    p = g.add_input("p", TensorType((4,), "float32"), mutable=True)
    big = g.const(np.arange(100).astype(ml_dtypes.bfloat16), name="big")
    special = g.const(np.array([np.nan, np.inf, -np.inf, 1.5], np.float32), name="special")
    y = g.add_node("Add", [x, big], name="add").output
    y = g.add_node("ReduceMax", [y], {"axis": [-1], "keep_dims": True}, name="rmax",
                   origin=["user_a", "user_b"]).output
    y = g.add_node("Cast", [y], {"dtype": "float32"}).output
    parts = g.add_node("Split", [x], {"axis": 1, "sizes": [60, 40]}, name="split").outputs
    upd = g.add_node("Add", [p, special]).output
    g.add_node("Assign", [p, upd], name="assign")
    sub = Graph("fused")
    s_in = sub.add_input("i0", TensorType(("b", 40), "bfloat16"))
    sub.set_outputs([sub.add_node("Exp", [s_in]).output])
    k = g.add_node("GraphKernel", [parts[1]], {"subgraph": sub, "pattern": "elemwise"},
                   name="fused_exp_1")
    g.set_outputs([y, parts[0], k.output])
    g.validate()
    return g


@pytest.mark.parametrize("ext", ["json", "yaml"])
def test_round_trip_is_exact(tmp_path, ext):
    g = rich_graph()
    p1 = tmp_path / f"g.{ext}"
    written = save_graph(g, p1)
    assert (tmp_path / "g.npz").exists() and len(written) == 2
    h = load_graph(p1)
    assert str(h) == str(g)
    text = p1.read_text()
    save_graph(h, p1)
    assert p1.read_text() == text
    feeds = random_inputs(g, 3)
    for a, b in zip(run_graph(g, feeds), run_graph(h, feeds), strict=True):
        np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
    assert h.inputs[1].mutable


@pytest.mark.parametrize("ext", ["json", "yaml"])
def test_non_finite_float_attributes_read_back_as_floats(tmp_path, ext):
    """A clamp bounded only below (torch's ``clamp(min=...)`` as exported: ``max=inf``) is
    written with its bound as the string ``"inf"``; reading the file gives the float back."""
    g = Graph("clamps")
    x = g.add_input("x", TensorType((4,), "float32"))
    y = g.add_node("ClampScalar", [x], {"min": -math.inf, "max": math.inf}).output
    y = g.add_node("ClampScalar", [y], {"min": 0.0, "max": math.inf}).output
    g.set_outputs([y])
    g.validate()
    save_graph(g, tmp_path / f"g.{ext}")
    h = load_graph(tmp_path / f"g.{ext}")
    assert [n.attrs["max"] for n in h.nodes if n.op == "ClampScalar"] == [math.inf, math.inf]
    assert [n.attrs["min"] for n in h.nodes if n.op == "ClampScalar"] == [-math.inf, 0.0]
    feeds = {"x": np.array([-2.0, -0.5, 0.5, 3e38], np.float32)}
    np.testing.assert_array_equal(run_graph(h, feeds)[0], run_graph(g, feeds)[0])


def test_examples_load_and_run():
    for name in ("mlp_gelu", "layernorm_residual", "attention_softmax"):
        g = load_model(f"examples/{name}.json")
        g.validate()
        out = run_graph(g, random_inputs(g, 0, {"batch": 2}))
        assert all(np.all(np.isfinite(o.astype(np.float32))) for o in out)


def write(tmp_path, doc, name="m.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc) if name.endswith(".json") else doc)
    return p


def base_doc():
    return {"format": "graphkernel/1", "name": "t",
            "inputs": [{"name": "x", "shape": [2], "dtype": "float32"}],
            "nodes": [{"name": "e", "op": "Exp", "inputs": ["x"], "outputs": ["e"]}],
            "outputs": ["e"]}


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("format"), "missing 'format'"),
    (lambda d: d.update(format="graphkernel/9"), "unsupported format 'graphkernel/9'"),
    (lambda d: d["nodes"][0].update(op="Exq"), r"nodes\[0\] \('e'\)\.op: unknown op 'Exq'; "
                                               r"did you mean 'Exp'"),
    (lambda d: d["nodes"][0].update(inputs=["y"]), r"nodes\[0\] \('e'\)\.inputs\[0\]: 'y' is "
                                                   r"dangling"),
    (lambda d: d["nodes"][0].pop("outputs"), r"nodes\[0\]\.outputs: Field required"),
    (lambda d: d["inputs"][0].update(dtype="float33"), r"inputs\[0\]\.dtype: unknown dtype"),
    (lambda d: d["inputs"][0].update(shape=[2, -1]),
         r"inputs\[0\]\.shape\[1\]: dim -1 is outside 0\.\.2147483647"),
    (lambda d: d.update(outputs=["nope"]), r"outputs\[0\]: unknown value 'nope'"),
    (lambda d: d["nodes"][0].update(attrs={"axis": 1}), r"op Exp takes no attributes, got 'axis'"),
    (lambda d: d["nodes"][0].update(op="ReduceSum", attrs={"keepdim": True}),
     r"attribute 'keepdim': unknown attribute; did you mean 'keep_dims'"),
    (lambda d: d.update(extra=1), r"extra: unknown field"),
    (lambda d: d["nodes"][0].update(outputs=[{"name": "e", "shape": [3], "dtype": "float32"}]),
     r"outputs\[0\]: declared type float32\[3\] differs from the inferred float32\[2\]"),
])
def test_malformed_files_name_the_field(tmp_path, mutate, message):
    doc = base_doc()
    mutate(doc)
    with pytest.raises(FormatError, match=message):
        load_graph(write(tmp_path, doc))


def test_cycle_in_file_is_named(tmp_path):
    doc = base_doc()
    doc["nodes"] = [{"name": "a", "op": "Exp", "inputs": ["b"], "outputs": ["a"]},
                    {"name": "b", "op": "Neg", "inputs": ["a"], "outputs": ["b"]}]
    doc["outputs"] = ["b"]
    with pytest.raises(FormatError, match="cycle: a -> b -> a"):
        load_graph(write(tmp_path, doc))


def test_nodes_in_any_order_are_sorted(tmp_path):
    doc = base_doc()
    doc["nodes"].insert(0, {"name": "n", "op": "Neg", "inputs": ["e"], "outputs": ["n"]})
    doc["outputs"] = ["n"]
    g = load_graph(write(tmp_path, doc))
    assert [n.name for n in g.nodes] == ["e", "n"]


def test_invalid_json_and_yaml_report_position(tmp_path):
    with pytest.raises(FormatError, match=r"m\.json:1:\d+: invalid JSON"):
        load_graph(write(tmp_path, "{", "m.json") if False else _raw(tmp_path, "m.json", "{"))
    with pytest.raises(FormatError, match=r"m\.yaml:2:\d+: invalid YAML"):
        load_graph(_raw(tmp_path, "m.yaml", "a: [1\nb: ]"))
    with pytest.raises(FormatError, match="no such file"):
        load_graph(tmp_path / "missing.json")


def _raw(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_failed_save_leaves_no_partial_file(tmp_path):
    g = Graph("cb")
    x = g.add_input("x", TensorType((2,), "float32"))
    n = g.add_node("Opaque", [x], {"impl": "python", "fn": lambda xs: xs,
                                   "out_types": [x.type]})
    g.set_outputs([n.output])
    with pytest.raises(FormatError, match="in-memory Python callable"):
        save_graph(g, tmp_path / "cb.json")
    assert list(tmp_path.iterdir()) == []


def test_scalar_constants_are_written_as_any_constant_is():
    """A one-element constant takes a shortcut when written; the text is what the general
    path writes: nan and infinities as strings, -0.0 kept, bfloat16 through float64."""
    from graphkernel.frontends import json_format as jf
    from graphkernel.ir import DType

    def general(arr):
        flat = arr.astype(np.float64) if arr.dtype == DType.bfloat16.np else arr
        return [jf._encode_scalar(x) for x in flat.reshape(-1).tolist()]

    for dt in (np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.bool_,
               DType.bfloat16.np):
        for v in (0.5, -0.0, float("nan"), float("inf"), -float("inf"), 3, True):
            for shape in ((), (1,), (1, 1)):
                with np.errstate(invalid="ignore"):
                    arr = np.full(shape, v, dtype=dt)
                got = jf._const_data(arr)
                assert repr(got) == repr(general(arr)), (dt, v, shape)
                assert [type(x) for x in got] == [type(x) for x in general(arr)]
