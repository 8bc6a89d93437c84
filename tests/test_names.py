"""Names users look for: graph inputs and outputs keep theirs through every pass, the compiled
JSON, the ONNX export and the manifest; kernels are named pattern_firstop_n; the report maps
each kernel to the user's nodes."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.cli import main
from graphkernel.frontends import load_model
from graphkernel.frontends.json_format import load_graph, save_graph
from graphkernel.interpreter import random_inputs, run_graph

NOENV: dict[str, str] = {}


def softmax_logits() -> Graph:
    """Two outputs computed by fused chains: ``logits`` and ``probs``."""
    g = Graph("head")
    x = g.add_input("hidden", TensorType(("b", 64), "float32"))
    s = g.add_node("Mul", [x, g.const(0.5)], name="scale").output
    logits = g.add_node("Add", [s, g.const(1.0)], name="bias", output_names=["logits"]).output
    m = g.add_node("ReduceMax", [logits], {"axis": [-1], "keep_dims": True}).output
    e = g.add_node("Exp", [g.add_node("Sub", [logits, m]).output]).output
    d = g.add_node("ReduceSum", [e], {"axis": [-1], "keep_dims": True}).output
    probs = g.add_node("Div", [e, d], name="norm", output_names=["probs"]).output
    g.set_outputs([logits, probs])
    return g


def test_replace_all_uses_keeps_an_outputs_name():
    g = Graph()
    x = g.add_input("x", TensorType((4,), "float32"))
    y = g.add_node("Exp", [x], output_names=["y"]).output
    z = g.add_node("Neg", [x]).output
    g.set_outputs([y])
    g.replace_all_uses(y, z)
    assert g.outputs[0] is z and z.name == "y" and g.output_names == ["y"]
    g.remove_dead()
    g.validate()


def test_an_output_that_becomes_an_alias_keeps_its_name_in_files(tmp_path):
    g = Graph("alias")
    x = g.add_input("x", TensorType((4,), "float32"))
    a = g.add_node("Mul", [x, g.const(1.0)], output_names=["same"]).output  # x * 1 -> x
    b = g.add_node("Exp", [x], output_names=["e1"]).output
    c = g.add_node("Exp", [x], output_names=["e2"]).output  # CSE merges it into e1
    g.set_outputs([a, b, c])
    res = graphkernel.compile(g, "--opt_level=2 --disable_pass=codegen", env=NOENV)
    h = res.graph
    assert h.output_names == ["same", "e1", "e2"]
    assert h.outputs[0] is h.inputs[0] and h.outputs[1] is h.outputs[2]  # aliases now
    save_graph(h, tmp_path / "c.json")
    back = load_graph(tmp_path / "c.json")
    assert [v.name for v in back.outputs] == ["same", "e1", "e2"]
    feeds = random_inputs(g, 0)
    for want, got in zip(run_graph(g, feeds), run_graph(back, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    onnx = pytest.importorskip("onnx")
    from graphkernel.frontends.onnx_export import export_onnx

    model = onnx.load(export_onnx(h, tmp_path / "c.onnx"))
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["same", "e1", "e2"]
    assert [i.name for i in model.graph.input] == ["x"]


@pytest.mark.parametrize("level", [1, 2, 3])
def test_compiled_json_onnx_and_manifest_keep_input_and_output_names(tmp_path, level, capsys):
    g = softmax_logits()
    src = tmp_path / "head.json"
    save_graph(g, src)
    out = tmp_path / "out"
    assert main(["compile", str(src), "--flags", f"--opt_level={level}", "-o", str(out),
                 "--export-onnx", str(tmp_path / "fused.onnx")]) == 0
    compiled = load_graph(out / "head.compiled.json")
    assert [v.name for v in compiled.inputs] == ["hidden"]
    assert [v.name for v in compiled.outputs] == ["logits", "probs"]
    assert any(n.op == "GraphKernel" for n in compiled.nodes)  # the outputs come from kernels
    manifest = json.loads((out / "manifest.json").read_text())
    assert [v["name"] for v in manifest["inputs"]] == ["hidden"]
    assert [v["name"] for v in manifest["outputs"]] == ["logits", "probs"]
    written = {w for k in manifest["instances"] for w in k["writes"]}
    read = {r for k in manifest["instances"] for r in k["reads"]}
    assert {"logits", "probs"} <= written and "hidden" in read
    onnx = pytest.importorskip("onnx")
    model = onnx.load(tmp_path / "fused.onnx")
    assert [o.name for o in model.graph.output] == ["logits", "probs"]
    assert [i.name for i in model.graph.input] == ["hidden"]


def test_report_maps_each_kernel_to_the_onnx_models_node_names():
    onnx = pytest.importorskip("onnx")
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        "light_squeezenet.onnx")
    model = onnx.load(path)
    onnx_nodes = {n.name or f"{n.op_type.lower()}_{i}" for i, n in enumerate(model.graph.node)}
    res = graphkernel.compile(load_model(path), "--opt_level=3", env=NOENV)
    kernels = res.report.extra["kernels"]
    assert len(kernels) > 2
    for k in kernels:
        assert re.fullmatch(r"[a-z_]+_[a-z0-9]+_\d+", k["name"]), k["name"]
        assert k["name"].startswith(re.split(r"[+/(|]", k["pattern"])[0] + "_")
        assert k["origin"] and set(k["origin"]) <= onnx_nodes, k
    assert [v.name for v in res.graph.outputs] == [o.name for o in model.graph.output]
    inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    assert {v.name for v in res.graph.inputs} == inputs
