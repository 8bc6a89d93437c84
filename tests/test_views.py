"""netron export (ONNX with kernels as functions) and the HTML report in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import graphkernel
from graphkernel.cli import main
from graphkernel.frontends import load_model

pytestmark = pytest.mark.e2e  # reports drawn and opened in Chromium

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


def _chromium(path, tmp_path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and every console message it logged."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    if chrome is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    r = subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update",
                        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                        "--enable-logging=stderr", "--v=0",
                        "--dump-dom", f"file://{path}"], capture_output=True, text=True,
                       timeout=120)
    return r.stdout, [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]


def _selfcheck(dom: str) -> dict[str, int]:
    tag = re.search(r'<p id="selfcheck"[^>]*>', dom)
    assert tag, "the page's check script did not run"
    return {k: int(v) for k, v in re.findall(r'data-(\w+)="(\d+)"', tag.group(0))}


@pytest.mark.parametrize("drawer", ["dot", "builtin"])
def test_html_report_in_headless_chromium(tmp_path, capsys, monkeypatch, drawer):
    from graphkernel import html_report

    if drawer == "dot" and shutil.which("dot") is None:
        pytest.skip("graphviz is not installed (.ci/run installs it)")
    if drawer == "builtin":
        monkeypatch.setattr(html_report, "dot_program", lambda: None)
    page = tmp_path / "r.html"
    assert main(["compile", "examples/models/llama.json", "--html", str(page)]) == 0
    err = capsys.readouterr().err
    assert ("graphviz (dot) is not installed" in err) == (drawer == "builtin")
    kernels = [n.name for n in compiled().graph.nodes if n.op == "GraphKernel"]
    dom, console = _chromium(page, tmp_path)
    assert console == []  # no errors, no messages at all
    check = _selfcheck(dom)
    assert check == {"kernels": len(kernels), "drawn": len(kernels),
                     "charted": len(kernels), "errors": 0, "overflow": 0}
    assert f'<span id="kernel-count">{compiled().report.extra["kernels_fused"]}</span>' in dom
    picture = dom[dom.index('id="picture"'):dom.index('<h2>Kernels</h2>')]
    assert "<svg" in picture and "graph output" in picture
    for k in kernels:  # in the table, the chart and (as the class of its nodes) the picture
        assert dom.count(f"{k}") >= 2, k
    assert ("Drawn by graphviz dot" in dom) == (drawer == "dot")


def test_html_report_too_large_to_draw_says_why(tmp_path, capsys, monkeypatch):
    from graphkernel import html_report

    monkeypatch.setattr(html_report, "MAX_DRAWN", 5)
    page = tmp_path / "r.html"
    assert main(["compile", "examples/attention_softmax.json", "--html", str(page)]) == 0
    assert "more than 5: shown as a list" in capsys.readouterr().err
    dom, console = _chromium(page, tmp_path)
    assert console == [] and "more than 5: shown as a list" in dom
    check = _selfcheck(dom)
    # one kernel: the scores product with its scale, mask and softmax (a MIX kernel)
    assert check["kernels"] == check["drawn"] == check["charted"] == 1


def test_builtin_layout_keeps_edges_downward_and_nodes_apart():
    from graphkernel.html_report import drawn_graph, layout

    nodes, edges = drawn_graph(compiled().graph)
    grid = layout(nodes, edges)
    assert len(set(grid.values())) == len(nodes)  # one cell per node
    assert all(grid[a][1] < grid[b][1] for a, b in edges)  # every edge points down a row
