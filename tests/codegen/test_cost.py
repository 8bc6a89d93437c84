"""Target specs and the cost model."""

from __future__ import annotations

import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.targets import available, load
from graphkernel.errors import ConfigError
from graphkernel.flags import target_names
from graphkernel.frontends import load_model


def test_target_specs_carry_the_documented_facts():
    assert set(available()) == set(target_names())
    # UB: 192 KiB less the 256 bytes the Ascend C devkit keeps for itself (the target files)
    facts = {"ascend910b": (48, 196_352), "ascend910b3": (40, 196_352),
             "ascend910_93": (48, 196_352)}
    for name, (cores, ub) in facts.items():
        spec = load(name)
        assert (spec.aiv_cores, spec.ub_bytes, spec.repeat_bytes) == (cores, ub, 256)
    assert load("ascend950").ub_bytes == 253_952
    with pytest.raises(ConfigError, match="unknown target 'ascend91'.*did you mean"):
        load("ascend91")


def test_cost_of_one_launch_by_hand():
    g = Graph()
    x = g.add_input("x", TensorType((1024,), "float32"))
    g.set_outputs([g.add_node("Exp", [x], name="e").output])
    ex = graphkernel.compile(g, "--enable_single_node_fusion", env={}).report.extra
    spec = load("ascend910b")
    memory_us = 8192 / (spec.hbm_gbps * 1e9) * 1e6            # 4 KiB in, 4 KiB out
    vector_us = 16 / (spec.aiv_cores * spec.clock_ghz * 1e9) * 1e6  # 16 repeats of 256 B
    want = max(memory_us, vector_us) + spec.launch_overhead_us
    assert ex["modeled_us_fused"] == pytest.approx(want, abs=1e-3)
    assert ex["kernels"][0]["modeled_us"] == pytest.approx(want, abs=1e-3)


def test_fusion_lowers_the_modeled_time_and_the_report_names_the_target():
    g = load_model("examples/layernorm_residual.json")
    b = graphkernel.compile(g, env={}).report.extra
    assert b["modeled_us_fused"] < b["modeled_us_unfused"] and b["target"] == "ascend910b"
    b3 = graphkernel.compile(g, "--target=ascend910b3", env={}).report.extra
    assert b3["target"] == "ascend910b3"
    assert b["cost_model"].startswith("A cost model")


def test_scalar_accesses_and_syncs_are_counted_and_costed():
    """A product along rows is walked by the scalar unit (rows x cols GetValue, a SetValue per
    row) between a V->S / MTE2->S sync and an S->V sync: the simulator counts them, the cost
    model prices them by the target's cycles; a sum along rows stays on the vector unit."""
    import numpy as np

    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.cost import pipe_us

    spec = load("ascend910b")
    assert pipe_us(1000, 10, 4, spec) == pytest.approx(
        (1000 * spec.scalar_cycles + 10 * spec.sync_cycles) / (4 * spec.clock_ghz * 1e3))
    stats = {}
    for op in ("ReduceProd", "ReduceSum"):
        g = Graph()
        x = g.add_input("x", TensorType((8, 16), "float32"))
        e = g.add_node("Exp", [x]).output
        g.set_outputs([g.add_node(op, [e], {"axis": [1], "keep_dims": True}).output])
        res = graphkernel.compile(g, env={})
        feeds = {"x": np.random.default_rng(0).uniform(-0.1, 0.1, (8, 16)).astype(np.float32)}
        _, backend = run_sim(res, feeds)
        (stats[op],) = backend.stats.values()
    prod, total = stats["ReduceProd"], stats["ReduceSum"]
    assert prod.scalar >= 8 * 16 + 8 and prod.syncs >= 2 and prod.pipe_us > 0
    assert total.scalar == 0 and total.pipe_us == 0


def test_the_cube_unit_prices_a_product_and_its_epilogue_is_one_kernel():
    """A compute-bound product costs its flops at the target's cube throughput (fp32 at half
    rate); with its bias it is one MIX launch, and the ideal counts it as one kernel."""
    spec = load("ascend910b")
    for dtype, rate in (("float16", 1), ("float32", 2)):
        g = Graph()
        a = g.add_input("a", TensorType((2048, 2048), dtype))
        b = g.add_input("b", TensorType((2048, 2048), dtype))
        y = g.add_node("MatMul", [a, b], name="mm").output
        g.set_outputs([g.add_node("Add", [y, g.add_input("bias", TensorType((2048,), dtype))],
                                  name="bias_add").output])
        ex = graphkernel.compile(g, "", env={}).report.extra
        (k,) = ex["kernels"]
        assert k["kind"] == "mix" and ex["kernels_ideal"] == 1 == ex["kernels_fused"]
        cube_us = 2 * 2048 ** 3 * rate / (spec.cube_tflops * 1e12) * 1e6
        assert k["modeled_us"] == pytest.approx(cube_us + spec.launch_overhead_us, abs=1e-3)
        assert ex["modeled_us_by_kind"] == {"mix": k["modeled_us"]}
        assert ex["codegen"]["kinds"] == {k["name"]: "mix"}


@pytest.mark.parametrize("model", ["examples/attention_softmax.json", "examples/mlp_gelu.json",
                                   "examples/layernorm_residual.json"])
def test_totals_are_the_summary_and_the_model_summed(model):
    """``totals`` (what the cluster pass reads) equals ``summary`` and ``model`` entry by
    entry, fused or not, with symbolic dims and a product among the launches."""
    from graphkernel.codegen import cost, traffic

    spec = load("ascend910b")
    g = load_model(model)
    fused = graphkernel.compile(g, "--opt_level=2", env={}).graph
    for graph in (g, fused):
        total, count, entries = traffic.summary(graph)
        assert cost.totals(graph, spec) == (total, count, cost.model(graph, spec, entries))
        assert count == len(entries) > 0


def test_totals_cost_each_launch_signature_once_and_sum_as_the_model():
    """Repeated layers: ``totals`` costs a single-op launch once per ``launch_key`` and still
    equals ``summary`` and ``model``; keys tell shapes, dtypes, ``transpose_a`` and a value
    read twice apart."""
    import numpy as np

    from graphkernel.codegen import cost, traffic

    spec = load("ascend910b")
    g = Graph("rep")
    x = g.add_input("x", TensorType((16, 16), "float32"))
    h = g.add_input("h", TensorType((8, 16), "float16"))
    w = g.const(np.ones((16, 16), np.float32))
    for i in range(3):
        x = g.add_node("Tanh", [g.add_node("MatMul", [x, w], name=f"mm{i}").output]).output
        h = g.add_node("Tanh", [h]).output
    sq = g.add_node("Mul", [x, x]).output
    pr = g.add_node("Mul", [x, g.add_node("Neg", [x]).output]).output
    ta = g.add_node("MatMul", [x, w], {"transpose_a": True}).output
    g.set_outputs([x, h, sq, pr, ta])
    total, count, entries = traffic.summary(g)
    assert cost.totals(g, spec) == (total, count, cost.model(g, spec, entries))
    key = {n.name: cost.launch_key(n) for n in g.nodes}
    assert key["mm0"] == key["mm1"] == key["mm2"] is not None
    tanhs = [key[n.name] for n in g.nodes if n.op == "Tanh"]
    assert len(set(tanhs)) == 2  # fp32 and fp16
    assert key[sq.producer.name] is None and key[pr.producer.name] is not None
    assert key[ta.producer.name] != key["mm0"]
