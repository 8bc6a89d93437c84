"""The fused attention as an extern launch: its kind, traffic, modeled time, the vendor call
in report.json and manifest.json, and the simulator checking it against its reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import graphkernel
from graphkernel.bisect import verify
from graphkernel.cli import main
from graphkernel.codegen import cost, targets
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.traffic import launches
from graphkernel.frontends import load_model
from graphkernel.fusion import SYMBOL_SIZE
from graphkernel.interpreter import Interpreter, random_inputs

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "attention.json")
B, S, H, N, D = SYMBOL_SIZE, 32, 64, 4, 16  # the example's dims (batch symbolic)


@pytest.fixture(scope="module")
def compiled():
    return graphkernel.compile(load_model(EXAMPLE), "--opt_level=2", env={})


def test_one_extern_launch_reading_its_operands_once(compiled):
    (entry,) = launches(compiled.graph)
    assert entry["kind"] == "extern" and entry["op"] == "FusedAttention"
    # q, k, v fp16 [batch, 32, 64] and the bool [32, 32] mask read once; the output once
    assert entry["bytes_read"] == 3 * B * S * H * 2 + S * S
    assert entry["bytes_written"] == B * S * H * 2
    assert compiled.report.extra["kernels_fused"] == 1
    assert compiled.report.extra["kernels_ideal"] == 1


def test_modeled_time_is_its_products_on_the_cube_and_softmax_on_the_vector(compiled):
    spec = targets.load("ascend910b")
    (fa,) = [n for n in compiled.graph.nodes if n.op == "FusedAttention"]
    scores = B * N * S * S
    cube_s = 2 * (2.0 * scores * D) / (spec.cube_tflops * 1e12)
    vector_s = 5 * np.ceil(scores * 4 / spec.repeat_bytes) / (
        spec.repeats_per_cycle * spec.aiv_cores * spec.clock_ghz * 1e9)
    gm = (3 * B * S * H * 2 + S * S + B * S * H * 2) / (spec.hbm_gbps * 1e9)
    want = max(cube_s, vector_s, gm) * 1e6 + spec.launch_overhead_us
    assert cost.launch_us(fa, spec, 3 * B * S * H * 2 + S * S + B * S * H * 2) == \
        pytest.approx(want)
    assert set(compiled.report.extra["modeled_us_by_kind"]) == {"extern"}


def test_report_and_manifest_name_the_vendor_call(tmp_path):
    assert main(["compile", EXAMPLE, "-o", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (r,) = report["externs"]
    (m,) = manifest["externs"]
    for e in (r, m):
        assert e["kind"] == "extern"
        assert e["operator"] == "torch_npu.npu_fusion_attention"
        assert e["aclnn"] == "aclnnFlashAttentionScore"
        assert e["arguments"] | {"scale": round(e["arguments"]["scale"], 6)} == {
            "head_num": 4, "input_layout": "BSH", "scale": 0.25, "keep_prob": 1.0,
            "pre_tockens": 2147483647, "next_tockens": 2147483647, "sparse_mode": 0,
            "kv_head_num": 4}
        assert [(o["role"], o["value"]) for o in e["operands"]] == [
            ("query", "q"), ("key", "k"), ("value", "v"), ("atten_mask", "masked")]
    assert m["reads"] == ["q", "k", "v", "masked"]
    assert manifest["kernels"] == [] and not list((tmp_path / "kernels").glob("*.cpp"))


def test_simulator_runs_it_through_its_reference(compiled):
    g = load_model(EXAMPLE)
    feeds = random_inputs(g, dims={"batch": 2})
    feeds["masked"] = np.triu(np.ones((32, 32), bool), 1)
    sim, _ = run_sim(compiled, feeds)
    ref = Interpreter(compiled.graph).run(feeds)
    np.testing.assert_array_equal(sim[0], ref[0])
    assert verify(g, "--opt_level=2", feeds, backend="sim", env={}).bad is False


def test_gpt2_layers_are_one_extern_each_next_to_generated_kernels():
    zoo = Path(EXAMPLE).parent / "models"
    res = graphkernel.compile(load_model(zoo / "gpt2.json"), "--opt_level=2", env={})
    kinds = [e["kind"] for e in launches(res.graph)]
    assert kinds.count("extern") == 2
    softmax = [n.name for n in res.graph.nodes if n.op == "GraphKernel"
               and {"ReduceMax", "Exp"} <= {m.op for m in n.subgraph.nodes}]
    assert softmax == []
    off = graphkernel.compile(load_model(zoo / "gpt2.json"),
                              "--opt_level=2 --disable_pass=attention", env={})
    assert "extern" not in [e["kind"] for e in launches(off.graph)]
    # per layer, 3 launches became 1 (unfused: the two products and the softmax; the heads'
    # transposes are the products' addressing, and the projection's cube kernel writes its
    # output split into heads: codegen/cube/strided.py)
    assert len(launches(off.graph)) - len(kinds) >= 2 * 2


def test_the_causal_mode_is_sparse_mode_2_with_the_operators_own_mask():
    from graphkernel import Graph, TensorType
    from graphkernel.codegen import extern

    g = Graph("causal")
    q, k, v = (g.add_input(n, TensorType((2, "s", 4, 16), "float32")) for n in "qkv")
    fa = g.add_node("FusedAttention", [q, k, v], {"layout": "BSND", "head_num": 4,
                                                  "scale": 0.25, "causal": True})
    g.set_outputs([fa.output])
    c = extern.call(fa)
    assert c["arguments"]["sparse_mode"] == 2
    assert c["arguments"]["atten_mask"] == "compressed causal [2048, 2048]"
    assert [o["role"] for o in c["operands"]] == ["query", "key", "value"]
    fa.attrs["window"] = 4  # a band: keys i - 3 .. i
    assert extern.call(fa)["arguments"] | {"scale": 0.25} == c["arguments"] | {
        "sparse_mode": 4, "pre_tockens": 3, "next_tockens": 0}
    feeds = random_inputs(g, dims={"s": 5})
    sim, _ = run_sim(graphkernel.compile(g, "--opt_level=2", env={}), feeds)
    np.testing.assert_allclose(sim[0], Interpreter(g, symbols={"s": 5}).run(feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_the_gradient_is_one_extern_call_reading_the_forwards_statistics():
    """FusedAttentionGrad is the vendor's FlashAttentionScoreGrad: one extern launch whose
    call names dy, attention_in and the softmax statistics, priced as five products; the
    forward with ``stats`` names its softmax_max and softmax_sum results."""
    from graphkernel import Graph, TensorType
    from graphkernel.codegen import extern

    g = Graph("grad")
    bsnd = TensorType((2, 8, 4, 16), "float16")
    q, k, v, dy = (g.add_input(n, bsnd) for n in ("q", "k", "v", "dy"))
    attrs = {"layout": "BSND", "head_num": 4, "scale": 0.25, "causal": True}
    fwd = g.add_node("FusedAttention", [q, k, v], attrs | {"stats": True})
    out, smax, ssum = fwd.outputs
    grad = g.add_node("FusedAttentionGrad", [q, k, v, dy, out, smax, ssum], attrs)
    g.set_outputs(list(grad.outputs))
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert [e["kind"] for e in launches(res.graph)] == ["extern", "extern"]
    c = extern.call(grad)
    assert c["operator"] == "torch_npu.npu_fusion_attention_grad"
    assert c["aclnn"] == "aclnnFlashAttentionScoreGrad"
    assert [o["role"] for o in c["operands"]] == [
        "query", "key", "value", "dy", "attention_in", "softmax_max", "softmax_sum"]
    assert [o["role"] for o in c["results"]] == ["dq", "dk", "dv"]
    assert c["arguments"]["scale_value"] == 0.25 and c["arguments"]["sparse_mode"] == 2
    assert [o["role"] for o in extern.call(fwd)["results"]] == [
        "attention_out", "softmax_max", "softmax_sum"]
    assert extern.cube_flops(grad) == pytest.approx(2.5 * extern.cube_flops(fwd))
    feeds = random_inputs(g)
    sim, _ = run_sim(res, feeds)
    for got, want in zip(sim, Interpreter(g).run(feeds), strict=True):
        np.testing.assert_array_equal(got, want)
