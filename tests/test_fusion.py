"""Fusion as users expect on real model shapes; cluster lists; explain; traffic; fuzzer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.cli import main
from graphkernel.codegen.cube.schedule import whole_rows_refusal
from graphkernel.frontends import load_model
from graphkernel.fusion import form_regions
from graphkernel.interpreter import Interpreter, random_inputs
from tests.fuzz.generator import check


def compiled(g: Graph, flags: str = "--opt_level=2"):
    """Fusion decisions as the split stage makes them (codegen fallbacks are tested apart)."""
    res = graphkernel.compile(g, f"{flags} --disable_pass=codegen", env={})
    feeds = random_inputs(g, 0, {"b": 3})
    for a, b in zip(Interpreter(g, "float64").run(feeds),
                    Interpreter(res.graph, "float64").run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-7, atol=1e-9)
    return res


def launches(res) -> list[str]:
    return [n.op for n in res.graph.nodes if n.op not in ("Constant", "Reshape")]


def block(op: str, dtype="float32", **attrs) -> Graph:
    g = Graph(op)
    x = g.add_input("x", TensorType(("b", 16, 64), dtype))
    c = g.const(np.linspace(0.5, 1.5, 64).astype(dtype))
    ins = {"LayerNorm": [x, c, c], "RMSNorm": [x, c], "Softmax": [x]}[op]
    g.set_outputs([g.add_node(op, ins, attrs, name="op").outputs[0]])
    return g


@pytest.mark.parametrize("op", ["LayerNorm", "RMSNorm", "Softmax"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_normalizations_fuse_into_one_kernel(op, dtype):
    res = compiled(block(op, dtype))
    assert launches(res) == ["GraphKernel"], res.graph


def test_residual_add_and_layernorm_fuse_into_one():
    res = compiled(load_model("examples/layernorm_residual.json"))
    assert launches(res) == ["GraphKernel"]
    k = next(n for n in res.graph.nodes if n.op == "GraphKernel")
    assert "residual_add" in k.origin and "ln_sum" in k.origin


def test_bias_gelu_after_matmul():
    g = load_model("examples/mlp_gelu.json")
    with_mm = compiled(g)
    assert launches(with_mm) == ["GraphKernel"]   # matmul epilogue
    without = compiled(g, "--opt_level=2 --disable_fusion_pattern=matmul_depth")
    assert launches(without) == ["MatMul", "GraphKernel"]


def test_kernels_are_named_pattern_first_op_counter_and_keep_origins():
    res = compiled(block("Softmax"))
    k = next(n for n in res.graph.nodes if n.op == "GraphKernel")
    # the pattern that formed it (what --disable_fusion_pattern takes), its first op
    assert k.attrs["pattern"].startswith("reduce_bwd+")
    assert re.fullmatch(r"reduce_bwd_reducemax_\d+", k.name)
    assert k.origin == ("op",)
    # a kernel that starts with a view is named after its first computing op
    g = Graph("v")
    x = g.add_input("x", TensorType((4, 64), "float32"))
    r = g.add_node("Reshape", [x], {"shape": [256]}).output
    g.set_outputs([g.add_node("Exp", [g.add_node("Neg", [r]).output]).output])
    k = next(n for n in compiled(g).graph.nodes if n.op == "GraphKernel")
    assert re.fullmatch(r"[a-z_]+_neg_\d+", k.name), k.name


def test_regions_are_convex():
    g = Graph()
    x = g.add_input("x", TensorType((4, 8), "float32"))
    a = g.add_node("Exp", [x], name="a").output
    y = g.add_node("CumSum", [a], {"axis": 1}, name="y").output   # not fusable
    c = g.add_node("Add", [a, y], name="c").output
    g.set_outputs([c])
    fusable = {id(g.node("a")), id(g.node("c"))}
    regions = form_regions(g, fusable)
    assert sorted(sorted(n.name for n in r) for r in regions) == [["a"], ["c"]]


def _reads_twice_then_excluded_reduce() -> Graph:
    """Fuzz seed 236's shape: ``a`` is read twice by one node (Sub(a, a)) and also feeds an
    excluded ReduceSum whose result comes back through a fusable Div."""
    g = Graph()
    x = g.add_input("x", TensorType((1, 8), "float32"))
    a = g.add_node("Neg", [x], name="a").output
    s = g.add_node("Sub", [a, a], name="s").output
    t = g.add_node("ReduceSum", [a], {"axis": [1], "keep_dims": True}, name="t").output
    d = g.add_node("Div", [t, g.const(np.float32(8.0))], name="d").output
    g.set_outputs([g.add_node("Sub", [d, s], name="out").output])
    return g


def test_regions_stay_convex_when_a_node_reads_one_value_twice():
    g = _reads_twice_then_excluded_reduce()
    fusable = {id(g.node(n)) for n in ("a", "s", "d", "out")}
    regions = sorted(sorted(n.name for n in r) for r in form_regions(g, fusable))
    # a -> t (outside) -> d: a and d must not share a region
    assert regions == [["a", "s"], ["d", "out"]]
    res = compiled(g, "--opt_level=2 --disable_cluster_ops=ReduceSum")
    res.graph.validate()
    assert "ReduceSum" in launches(res)


def test_split_refuses_a_merge_that_would_make_the_graph_cyclic():
    from graphkernel.flags import resolve
    from graphkernel.fusion import SplitModel

    class Ctx:
        def should_apply(self, what, nodes) -> bool:
            return True

    g = _reads_twice_then_excluded_reduce()
    # a region that is not convex: the check must not rely on the regions being convex
    region = [g.node(n) for n in ("a", "s", "d", "out")]
    attempts: list = []
    model = SplitModel(g, region, resolve("--opt_level=2", env={}), Ctx(), attempts)
    assert not model.try_fuse("p", [model.area(g.node("a")), model.area(g.node("d"))])
    assert attempts[-1].verdict == "rejected"
    assert attempts[-1].reason.startswith("cycle: a path between these areas leaves them")
    assert model.try_fuse("p", [model.area(g.node("a")), model.area(g.node("s"))])


def test_split_refuses_a_merge_whose_path_runs_through_an_area_fused_before():
    """Two nodes with no path between them fused into one area (one kernel, reading all its
    inputs before writing any output) carry a path from one's inputs to the other's
    outputs: fusing ``a`` (read by ``b1``) with ``c`` (reading ``b2``) after ``b1`` and
    ``b2`` share an area makes the kernels feed each other."""
    from graphkernel.flags import resolve
    from graphkernel.fusion import SplitModel

    class Ctx:
        def should_apply(self, what, nodes) -> bool:
            return True

    g = Graph("through_an_area")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    a = g.add_node("Abs", [x], name="a").output
    b1 = g.add_node("Neg", [a], name="b1").output
    b2 = g.add_node("Exp", [x], name="b2").output
    c = g.add_node("Add", [b2, a], name="c").output
    g.set_outputs([b1, c])
    region = [g.node(n) for n in ("a", "b1", "b2", "c")]
    attempts: list = []
    model = SplitModel(g, region, resolve("--opt_level=2", env={}), Ctx(), attempts)
    assert model.try_fuse("p", [model.area(g.node("b1")), model.area(g.node("b2"))])
    assert not model.try_fuse("p", [model.area(g.node("a")), model.area(g.node("c"))])
    assert attempts[-1].reason.startswith("cycle: a path between these areas leaves them")
    # with the area's other node alone, no path comes back: the merge is taken
    model = SplitModel(g, region, resolve("--opt_level=2", env={}), Ctx(), attempts)
    assert model.try_fuse("p", [model.area(g.node("a")), model.area(g.node("c"))])


def test_cluster_lists_skip_lists_and_dtypes(tmp_path):
    g = load_model("examples/layernorm_residual.json")
    res = compiled(g, "--opt_level=2 --disable_cluster_ops=Rsqrt")
    assert "Rsqrt" in launches(res)
    info = res.analyses.cluster
    assert info.reasons["ln_rstd"] == "op Rsqrt not in the cluster list"
    ini = tmp_path / "skip.ini"
    ini.write_text("[ByNodeName]\nresidual_add\n")
    res = compiled(g, f"--opt_level=2 --skip_node_names_cfg={ini}")
    assert res.analyses.cluster.reasons["residual_add"].startswith("node in skip list")
    g64 = Graph()
    x = g64.add_input("x", TensorType((4,), "float64"))
    g64.set_outputs([g64.add_node("Neg", [g64.add_node("Exp", [x]).output]).output])
    res = compiled(g64)
    assert "dtype float64 not supported" in next(iter(res.analyses.cluster.reasons.values()))


def test_single_node_fusion():
    g = Graph()
    x = g.add_input("x", TensorType((4, 8), "float32"))
    g.set_outputs([g.add_node("Exp", [x]).output])
    assert launches(compiled(g)) == ["Exp"]
    assert launches(compiled(g, "--enable_single_node_fusion")) == ["GraphKernel"]


def test_each_fusion_is_a_bisect_application():
    g = block("Softmax")
    full = compiled(g)
    n_fused = full.report.extra["fusion_decisions"]["fused"]
    assert n_fused >= 3
    lines: list[str] = []
    graphkernel.compile(g, "--print_bisect", env={}, log=lines.append)
    first = next(ln for ln in lines if " split on " in ln)
    n = int(first.split("(")[1].split(")")[0])
    lines = []
    res = graphkernel.compile(g, f"--print_bisect --bisect_limit={n - 1}", env={},
                              log=lines.append)
    split = [ln for ln in lines if " split on " in ln]
    assert split and all(ln.startswith("BISECT: NOT running") for ln in split)
    assert "GraphKernel" not in launches(res)  # every fusion decision was refused


def test_traffic_report_keys(tmp_path):
    res = compiled(load_model("examples/attention_softmax.json"))
    ex = res.report.to_dict()
    for key in ("gm_bytes_unfused", "gm_bytes_fused", "gm_bytes_ideal", "kernels_unfused",
                "kernels_fused", "kernels"):
        assert key in ex
    # the scores product, scale, mask and softmax: one MIX kernel, as the ideal counts
    assert ex["kernels_unfused"] == 8 and ex["kernels_fused"] == ex["kernels_ideal"] == 1
    assert ex["gm_bytes_fused"] < ex["gm_bytes_unfused"]
    assert ex["gm_bytes_fused"] <= 1.10 * ex["gm_bytes_ideal"]
    k = ex["kernels"][0]
    assert {"name", "bytes_read", "bytes_written", "ops", "pattern"} <= set(k)


def _product_then(n: int, dtype: str, tail: str) -> Graph:
    """x·w + r, then a LayerNorm (``tail="norm"``) or a bare sum of the rows (``"sum"``)."""
    g = Graph("pn")
    x = g.add_input("x", TensorType((32, 16), dtype))
    y = g.add_node("MatMul", [x, g.add_input("w", TensorType((16, n), dtype))]).output
    s = g.add_node("Add", [y, g.add_input("r", TensorType((32, n), dtype))]).output
    if tail == "norm":
        gb = [g.add_input(k, TensorType((n,), dtype)) for k in ("gamma", "beta")]
        out = g.add_node("LayerNorm", [s, *gb], {"begin_norm_axis": -1,
                                                 "begin_params_axis": -1}).outputs[0]
    else:
        out = g.add_node("ReduceSum", [s], {"axis": [-1]}).output
    g.set_outputs([out])
    return g


@pytest.mark.parametrize("n, dtype, tail, ideal", [
    (64, "float32", "norm", 1),    # the norm is the product's epilogue: one MIX kernel
    (600, "float32", "norm", 2),   # no base tile holds fp32 rows of 600: two kernels
    (512, "float16", "norm", 1),   # fp16 rows of 512 fit
    (768, "float16", "norm", 2),   # ... of 768 (GPT-2 small) fit L0B but not the UB
    (64, "float32", "sum", 2),     # a sum not broadcast back writes a column: no epilogue
])
def test_the_ideal_joins_a_product_and_a_row_reduction_the_generator_takes(n, dtype, tail,
                                                                           ideal):
    ex = graphkernel.compile(_product_then(n, dtype, tail), "", env={}).report.extra
    assert ex["kernels_ideal"] == ideal
    assert ex["kernels_fused"] == ideal and ex["gm_bytes_fused"] >= ex["gm_bytes_ideal"]
    assert not ex["fallbacks"]  # the fusion asked the generator: nothing to undo


def test_the_ideal_asks_the_tiler_once_per_layer_structure(monkeypatch):
    """Equal layers get the verdict of the first: two layers whose rows fit and two whose rows
    do not count as each alone does, with one tiler question per structure."""
    from graphkernel.codegen import traffic

    asked = []
    monkeypatch.setattr(traffic, "whole_rows_refusal", lambda mm, *a: asked.append(mm.name)
                        or whole_rows_refusal(mm, *a))
    g = Graph("layers")
    outs = []
    for i, n in enumerate((64, 600, 64, 600)):
        x = g.add_input(f"x{i}", TensorType((32, 16), "float32"))
        w = g.add_input(f"w{i}", TensorType((16, n), "float32"))
        y = g.add_node("MatMul", [x, w], name=f"mm{i}").output
        s = g.add_node("Add", [y, g.add_input(f"r{i}", TensorType((32, n), "float32"))]).output
        gb = [g.add_input(f"{k}{i}", TensorType((n,), "float32")) for k in ("gamma", "beta")]
        outs.append(g.add_node("LayerNorm", [s, *gb], {"begin_norm_axis": -1,
                                                       "begin_params_axis": -1}).outputs[0])
    g.set_outputs(outs)
    ex = graphkernel.compile(g, "", env={}).report.extra
    assert ex["kernels_ideal"] == 1 + 2 + 1 + 2
    assert asked == ["mm0", "mm1"]


def test_explain_cli_names_documented_reasons(capsys):
    assert main(["explain", "examples/attention_softmax.json", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    reasons = " | ".join(r["reason"] for r in d["candidates"])
    assert "kind mismatch" in reasons and "has other consumers" in reasons
    assert any(r["verdict"] == "fused" for r in d["candidates"])
    assert [c["score"] for c in d["candidates"]] == sorted((c["score"] for c in d["candidates"]),
                                                           reverse=True)
    assert main(["explain", "examples/attention_softmax.json", "--node", "sm_max"]) == 0
    out = capsys.readouterr().out
    # the softmax joined the scores product's epilogue (its kernel names every pattern)
    kernel = re.search(r"_batchmatmul_\d+ +\[([\w+]+)\]", out)
    assert kernel and {"matmul_depth", "reduce_bwd"} <= set(kernel.group(1).split("+")), out
    assert main(["explain", "examples/attention_softmax.json", "--node", "nope"]) == 2


def test_cluster_dump(tmp_path):
    graphkernel.compile(load_model("examples/attention_softmax.json"),
                        f"--dump_as_text --debug_dir={tmp_path}", env={})
    text = (tmp_path / "graph_kernel_cluster.txt").read_text()
    kernel = re.search(r"_batchmatmul_\d+ +pattern=([\w+]+)", text)
    assert kernel and {"matmul_depth", "reduce_bwd"} <= set(kernel.group(1).split("+")), text
    assert "sm_max (ReduceMax)" in text


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(6))
def test_fuzzer_seed_set(chunk):
    """300 random graphs, 50 per chunk: validate, acyclic, limits, same outputs."""
    failures = [f"seed {s}: {p}" for s in range(chunk * 50, chunk * 50 + 50)
                if (p := check(s)) is not None]
    assert not failures, "\n".join(failures)
