"""netron export (ONNX with kernels as functions) and the HTML report in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import graphkernel
from graphkernel.cli import main
from graphkernel.frontends import load_model

onnx = pytest.importorskip("onnx")


def compiled(path="examples/models/llama.json"):
    return graphkernel.compile(load_model(path), env={})


def test_onnx_export_passes_the_checker_and_keeps_the_kernel_grouping(tmp_path):
    from graphkernel.frontends.onnx_export import KERNEL_DOMAIN, export_onnx

    res = compiled()
    path = export_onnx(res.graph, tmp_path / "fused.onnx")
    model = onnx.load(path)
    onnx.checker.check_model(model)
    funcs = {f.name: f for f in model.functions}
    kernels = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert len(funcs) == len(kernels) > 5
    for k in kernels:
        members = [m.name for m in k.subgraph.nodes if m.op != "Constant"]
        body = [n.name for n in funcs[k.name].node if n.op_type != "Constant"]
        assert body == members
    calls = [n for n in model.graph.node if n.domain == KERNEL_DOMAIN]
    assert sorted(n.op_type for n in calls) == sorted(funcs)


def _dom(path, tmp_path) -> str:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    if chrome is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    r = subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update",
                        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                        "--dump-dom", f"file://{path}"], capture_output=True, text=True,
                       timeout=120)
    return r.stdout


def test_html_report_in_headless_chromium(tmp_path, capsys):
    assert main(["compile", "examples/attention_softmax.json", "--html",
                 str(tmp_path / "r.html")]) == 0
    dom = _dom(tmp_path / "r.html", tmp_path)
    # BatchMatMul, its vector epilogue (codegen splits the cube op off), the softmax
    assert '<span id="kernel-count">3</span>' in dom
    if shutil.which("dot"):
        assert "<svg" in dom and "reduce_bwd_reducemax_" in dom
    assert "Passes" in dom and "split" in dom


def test_html_report_without_graphviz(tmp_path, monkeypatch):
    from graphkernel import html_report

    monkeypatch.setattr(html_report.shutil, "which", lambda name: None)
    page = html_report.render(compiled("examples/attention_softmax.json"))
    assert "graphviz is not installed" in page and "<svg" not in page
    assert "reduce_bwd_reducemax_" in page
