"""Fusion caps per target (inputs, ops, peak memory), the per-op precision blacklist, stable
refusal codes, hand-edited kernels (replace_kernel), kernel graphs and single-op kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.api import load_config
from graphkernel.cli import main
from graphkernel.errors import FlagError
from graphkernel.explain import explain
from graphkernel.interpreter import Interpreter, random_inputs
from graphkernel.refusals import BY_CODE, COMMON, REFUSALS, classify

NOENV: dict[str, str] = {}


def fused(g: Graph, flags: str = ""):
    res = graphkernel.compile(g, f"--disable_pass=codegen {flags}", env=NOENV)
    feeds = random_inputs(g, 0)
    for a, b in zip(Interpreter(g, "float64").run(feeds),
                    Interpreter(res.graph, "float64").run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)
    return res


def kernels(res):
    return [n for n in res.graph.nodes if n.op == "GraphKernel"]


def sum_of_inputs(n: int) -> Graph:
    """x0 + x1 + ... + x(n-1): one elementwise chain reading n inputs."""
    g = Graph(f"sum{n}")
    xs = [g.add_input(f"x{i}", TensorType((32, 64), "float32")) for i in range(n)]
    acc = xs[0]
    for i, x in enumerate(xs[1:]):
        acc = g.add_node("Add", [acc, x], name=f"add{i}").output
    g.set_outputs([acc])
    return g


# ----------------------------------------------------------------------- input cap
def test_a_kernel_reads_at_most_the_targets_input_cap():
    res = fused(sum_of_inputs(12))
    assert res.config.max_kernel_inputs == 8
    assert res.config.origin("max_kernel_inputs") == "default@ascend910b"
    ks = kernels(res)
    assert len(ks) >= 2 and all(len(k.inputs) <= 8 for k in ks)
    refused = [r for r in explain(res)["candidates"] if r["code"] == "GK303"]
    assert refused and "inputs > max_kernel_inputs=8 (target ascend910b)" in refused[0]["reason"]
    assert res.report.extra["refusals"]["GK303"] >= 1
    # without the cap the chain is one kernel of 12 inputs
    one = fused(sum_of_inputs(12), "--max_kernel_inputs=0")
    assert [len(k.inputs) for k in kernels(one)] == [12]


def test_parallel_fusion_keeps_to_the_input_cap():
    g = Graph("par")
    x = g.add_input("x", TensorType((32, 64), "float32"))
    outs = []
    for j in range(2):  # two independent kernels sharing x, with 5 more inputs each
        acc = g.add_node("Exp", [x], name=f"e{j}").output
        for i in range(5):
            y = g.add_input(f"y{j}_{i}", TensorType((32, 64), "float32"))
            acc = g.add_node("Mul", [acc, y], name=f"m{j}_{i}").output
        outs.append(acc)
    g.set_outputs(outs)
    capped = fused(g, "--opt_level=3")
    free = fused(g, "--opt_level=3 --max_kernel_inputs=0")
    assert len(kernels(free)) == 1 and len(kernels(free)[0].inputs) == 11
    assert len(kernels(capped)) == 2 and all(len(k.inputs) <= 8 for k in kernels(capped))


# -------------------------------------------------------------------------- op cap
def test_the_op_cap_defaults_to_the_targets_64():
    g = Graph("long")
    v = g.add_input("x", TensorType((16, 64), "float32"))
    for i in range(80):
        v = g.add_node("Exp" if i % 2 else "Neg", [v], name=f"n{i}").output
    g.set_outputs([v])
    res = fused(g)
    assert res.config.composite_op_limit_size == 64
    assert max(len(k.subgraph.nodes) for k in kernels(res)) <= 64
    assert any(r["code"] == "GK301" for r in explain(res)["candidates"])
    assert len(kernels(fused(g, "--composite_op_limit_size=200"))) == 1


# ------------------------------------------------------------------ peak memory
def peak_graph() -> Graph:
    """t (big) is sliced early; the slice's consumer comes after big unrelated work, so fusing
    the slice into it keeps t alive across that work's peak."""
    g = Graph("peak")
    x = g.add_input("x", TensorType((64, 1024), "float32"))
    y = g.add_input("y", TensorType((64, 1024), "float32"))
    t = g.add_node("Neg", [x], name="t").output
    s = g.add_node("Slice", [t], {"begin": [0, 0], "size": [64, 1]}, name="s").output
    w1 = g.add_node("Tanh", [y], name="w1").output
    w2 = g.add_node("Tanh", [w1], name="w2").output
    w3 = g.add_node("ReduceSum", [w2], {"axis": [-1], "keep_dims": True}, name="w3").output
    g.set_outputs([g.add_node("Add", [s, w3], name="c").output])
    return g


def test_the_peak_memory_guard_refuses_a_fusion_that_raises_the_peak():
    keep_apart = "--disable_cluster_ops=Tanh,ReduceSum"  # the work in between is not fused
    assert len(kernels(fused(peak_graph(), keep_apart))) == 1  # the guard is off by default
    keep_apart += " --peak_memory_growth=10"
    guarded = fused(peak_graph(), keep_apart)
    assert not kernels(guarded)
    why = [r for r in explain(guarded)["candidates"] if r["code"] == "GK304"]
    assert why and why[0]["pattern"] == "slice"
    reason = why[0]["reason"]
    assert "keeps 262,144 B alive" in reason and "(50%) > peak_memory_growth=10%" in reason
    assert len(kernels(fused(peak_graph(), keep_apart + " --peak_memory_growth=-1"))) == 1
    assert len(kernels(fused(peak_graph(), keep_apart + " --peak_memory_growth=60"))) == 1


def test_the_guard_leaves_fusions_that_do_not_extend_a_life_alone():
    from graphkernel.frontends import load_model

    res = fused(load_model("examples/layernorm_residual.json"), "--peak_memory_growth=0")
    assert len(kernels(res)) == 1
    assert "GK304" not in res.report.extra.get("refusals", {})


# --------------------------------------------------------------------- recompute
def broadcast_into_two_reductions() -> Graph:
    g = Graph("rc")
    x = g.add_input("x", TensorType((64, 256), "float32"))
    b = g.add_input("b", TensorType((256,), "float32"))
    e = g.add_node("Exp", [g.add_node("BroadcastTo", [b], {"shape": [64, 256]},
                                      name="bcast").output], name="e").output
    s1 = g.add_node("ReduceSum", [g.add_node("Mul", [x, e], name="m1").output], {"axis": [1]},
                    name="s1").output
    s2 = g.add_node("ReduceMax", [g.add_node("Add", [x, e], name="a2").output], {"axis": [0]},
                    name="s2").output
    g.set_outputs([s1, s2])
    return g


def test_recomputation_threshold_limits_the_consumers_recomputed_into():
    g = broadcast_into_two_reductions()
    assert len(kernels(fused(g))) == 2  # the broadcast is recomputed in both consumers
    for flags in ("--recompute_max_consumers=1", "--recomputation_threshold=1"):
        res = fused(g, flags)
        assert len(kernels(res)) == 3, flags
        rec = next(p for p in res.report.passes if p.name == "recompute")
        assert rec.rewrites == 0
    assert len(kernels(fused(g, "--recomputation_threshold=2"))) == 2


# ------------------------------------------------------------------ refusal codes
def test_every_reason_graphkernel_gives_on_the_zoo_has_a_code(capsys):
    for model in ("examples/models/bert.json", "examples/models/llama.json",
                  "examples/layernorm_residual.json", "examples/attention_softmax.json"):
        res = graphkernel.compile(model, env=NOENV)
        d = explain(res)
        reasons = [r["reason"] for r in d["candidates"] if r["verdict"] != "fused"]
        reasons += list(d["not_fusable"].values()) + [p["reason"] for p in d["patterns_off"]]
        assert reasons
        other = [r for r in reasons if classify(r).code == "GK999"]
        assert other == [], other
        assert sum(d["refusals"].values()) == len(reasons) + len(d["fallbacks"])
        assert res.report.extra["refusals"] == d["refusals"]
    assert main(["explain", "examples/models/bert.json", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(r["code"] in BY_CODE for r in d["candidates"] if r["verdict"] != "fused")
    assert set(d["not_fusable_codes"]) == set(d["not_fusable"])


def test_each_pattern_declares_the_refusals_its_rules_give():
    from graphkernel.patterns.base import all_patterns

    declared = {p.name: set(p.refuses) | set(COMMON) for p in all_patterns()}
    seen: dict[str, set[str]] = {}
    for model in ("examples/models/bert.json", "examples/models/llama.json",
                  "examples/models/vit.json", "examples/layernorm_residual.json"):
        for r in explain(graphkernel.compile(model, env=NOENV))["candidates"]:
            if r["verdict"] != "fused":
                seen.setdefault(r["pattern"], set()).add(r["code"])
    assert seen
    for pattern, codes in seen.items():
        assert codes <= declared[pattern], (pattern, codes - declared[pattern])


def test_codes_are_unique_and_documented(capsys):
    codes = [r.code for r in REFUSALS]
    assert len(codes) == len(set(codes))
    assert main(["patterns", "--codes", "--markdown"]) == 0
    table = capsys.readouterr().out
    for code in BY_CODE:
        assert f"| `{code}` |" in table


# ------------------------------------------------------------ precision blacklist
def fp16_chain() -> Graph:
    g = Graph("bl")
    x = g.add_input("x", TensorType((64, 256), "float16"))
    a = g.add_node("Mul", [x, g.const(np.float16(1.7))], name="scale").output
    e = g.add_node("Exp", [a], name="exp").output
    y = g.add_node("Add", [e, g.const(np.float16(0.3))], name="shift").output
    g.set_outputs([g.add_node("Sqrt", [y], name="root").output])
    return g


def body_dtypes(res) -> dict[str, str]:
    (k,) = kernels(res)
    return {n.op: n.outputs[0].dtype.value for n in k.subgraph.nodes
            if n.op not in ("Constant", "Cast")}


def test_a_blacklisted_op_keeps_low_precision_inside_a_promoted_kernel():
    g = fp16_chain()
    promoted = graphkernel.compile(g, env=NOENV)
    listed = graphkernel.compile(g, "--precision_blacklist=Exp", env=NOENV)
    assert set(body_dtypes(promoted).values()) == {"float32"}
    assert body_dtypes(listed) == {"Mul": "float32", "Exp": "float16", "Add": "float32",
                                   "Sqrt": "float32"}
    feeds = random_inputs(g, 0)
    a = Interpreter(promoted.graph).run(feeds)[0].astype(np.float64)
    b = Interpreter(listed.graph).run(feeds)[0].astype(np.float64)
    assert not np.array_equal(a, b) and np.allclose(a, b, rtol=4e-3)  # Exp rounded to fp16
    every = graphkernel.compile(g, "--precision_blacklist=all", env=NOENV)
    assert set(body_dtypes(every).values()) == {"float16"}


def test_autofuse_blacklist_keeps_a_kernel_low_only_when_all_its_ops_are_listed():
    g = fp16_chain()
    some = graphkernel.compile(g, "--autofuse_enhance_precision_blacklist=Exp,Add", env=NOENV)
    assert set(body_dtypes(some).values()) == {"float32"}  # Mul and Sqrt are not listed
    whole = graphkernel.compile(
        g, "--autofuse_enhance_precision_blacklist=Mul,Exp,Add,Sqrt", env=NOENV)
    assert set(body_dtypes(whole).values()) == {"float16"}
    rec = next(p for p in whole.report.passes if p.name == "promote_precision")
    assert "kept in low precision" in rec.notes[0]


def test_reductions_cannot_be_blacklisted():
    with pytest.raises(FlagError, match="ReduceSum always computes in fp32"):
        load_config("--precision_blacklist=ReduceSum", env=NOENV)


@pytest.mark.sim
def test_a_blacklisted_kernel_runs_in_the_simulator_as_its_body_says():
    from graphkernel.codegen.backend import run_sim
    from graphkernel.verify import compare

    g = fp16_chain()
    res = graphkernel.compile(g, "--precision_blacklist=Exp", env=NOENV)
    feeds = random_inputs(g, 0)
    sim, _ = run_sim(res, feeds)
    ref = Interpreter(res.graph).run(feeds)[0]
    promoted = Interpreter(graphkernel.compile(g, env=NOENV).graph).run(feeds)[0]
    assert compare(sim[0], ref, "float16").passed
    assert not np.array_equal(sim[0], promoted)  # the generated code computes Exp in fp16


# ------------------------------------------------------------------ replace_kernel
@pytest.fixture
def generated(tmp_path):
    """The layernorm example compiled into tmp/out, its kernel source and an edit folder."""
    assert main(["compile", "examples/layernorm_residual.json", "-o", str(tmp_path / "out"),
                 "-q"]) == 0
    (src,) = [p for p in (tmp_path / "out" / "kernels").glob("*.cpp")
              if not p.name.endswith("_tiling.cpp")]
    edit = tmp_path / "edit"
    edit.mkdir()
    return src, edit


def _compile_with(edit, out) -> int:
    return main(["compile", "examples/layernorm_residual.json", "-o", str(out), "-q",
                 "--flags", f"--replace_kernel={edit}"])


@pytest.mark.sim
def test_replace_kernel_uses_a_checked_edit(generated, tmp_path, capsys):
    src, edit = generated
    text = src.read_text() + "// hand-tuned\n"
    (edit / src.name).write_text(text)
    capsys.readouterr()
    assert _compile_with(edit, tmp_path / "out2") == 0
    out = capsys.readouterr().out
    assert f"uses {src.name} from {edit}" in out
    assert "// hand-tuned" in (tmp_path / "out2" / "kernels" / src.name).read_text()


@pytest.mark.sim
@pytest.mark.parametrize("edit_kind,message", [
    ("wrong", "differs from the kernel's reference"),
    ("broken", "the simulator cannot build or run it"),
])
def test_replace_kernel_refuses_an_edit_the_simulator_rejects(generated, tmp_path, capsys,
                                                              edit_kind, message):
    src, edit = generated
    text = src.read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("Add(") and ", n);" in ln)
    bad = line.replace("Add(", "Sub(", 1) if edit_kind == "wrong" else line.replace(";", "", 1)
    (edit / src.name).write_text(text.replace(line, bad, 1))
    capsys.readouterr()
    assert _compile_with(edit, tmp_path / "out3") == 2
    err = capsys.readouterr().err
    assert message in err and src.name in err and "Traceback" not in err
    assert not (tmp_path / "out3").exists()  # nothing written


def test_replace_kernel_reports_a_file_that_matches_nothing(generated, tmp_path, capsys):
    _, edit = generated
    (edit / "gk_stale_0123abcd.cpp").write_text("// for code that is gone\n")
    capsys.readouterr()
    assert _compile_with(edit, tmp_path / "out4") == 0
    assert "gk_stale_0123abcd.cpp matches no generated file and is not used" in \
        capsys.readouterr().err


def test_replace_kernel_needs_a_folder(tmp_path, capsys):
    assert _compile_with(tmp_path / "missing", tmp_path / "o") == 2
    assert "no such folder" in capsys.readouterr().err


# ------------------------------------------------- kernel graphs, single-op kernels
def test_subgraph_recover_writes_each_kernel_as_a_runnable_graph(tmp_path, capsys):
    res = graphkernel.compile("examples/layernorm_residual.json",
                              f"--subgraph_recover=true --debug_dir={tmp_path}", env=NOENV)
    (path,) = (tmp_path / "kernel_graphs").glob("*.json")
    assert path in res.dumps
    assert main(["run", str(path)]) == 0
    assert "ran elemwise_broadcast_fwd_depth_add_1" in capsys.readouterr().out


def test_disable_lifting_keeps_single_op_kernels():
    g = Graph("lone")
    x = g.add_input("x", TensorType((32, 64), "float32"))
    g.set_outputs([g.add_node("Exp", [x], name="e").output])
    assert not kernels(fused(g))
    assert len(kernels(fused(g, "--disable_lifting=true"))) == 1


def peak_layers(n: int = 4, busy: tuple[int, ...] = (1, 2)) -> Graph:
    """``n`` equal layers like ``peak_graph``; a big value made before the first busy layer and
    read after the last keeps the memory higher across the busy ones (outside every region, so
    the layers' regions stay equal)."""
    g = Graph("peak_layers")
    big = TensorType((64, 1024), "float32")
    z = None
    outs = []
    for i in range(n):
        if i == busy[0]:
            z = g.add_node("Tanh", [g.add_input("zin", big)], name="z").output
        x, y = g.add_input(f"x{i}", big), g.add_input(f"y{i}", big)
        t = g.add_node("Neg", [x], name=f"t{i}").output
        s = g.add_node("Slice", [t], {"begin": [0, 0], "size": [64, 1]}, name=f"s{i}").output
        w = g.add_node("Tanh", [g.add_node("Tanh", [y], name=f"w1_{i}").output], name=f"w2_{i}")
        w3 = g.add_node("ReduceSum", [w.output], {"axis": [-1], "keep_dims": True},
                        name=f"w3_{i}").output
        outs.append(g.add_node("Add", [s, w3], name=f"c{i}").output)
        if i == busy[-1]:
            outs.append(g.add_node("ReduceSum", [z], {"axis": [-1]}, name="z_end").output)
    g.set_outputs(outs)
    return g


def test_replayed_regions_get_the_guards_verdicts_of_their_own_place():
    """Equal layers share decisions only where the guard decides alike: the busy layers'
    fusion is refused, the others' made, as deciding each afresh gives."""
    from tests.test_split_replay import decisions

    flags = ("--disable_pass=codegen --disable_cluster_ops=Tanh,ReduceSum "
             "--peak_memory_growth=10")
    replayed = graphkernel.compile(peak_layers(), flags, env=NOENV)
    fresh = graphkernel.compile(peak_layers(), f"{flags} --bisect_limit=1000000", env=NOENV)
    assert decisions(replayed)[:2] == decisions(fresh)[:2]
    fused_in = sorted(n.name for k in kernels(replayed) for n in k.subgraph.nodes
                      if n.op == "Add")
    assert fused_in == ["c0", "c3"]  # layers 1 and 2 lie under the big value: refused there
    refused = [a for a in replayed.analyses.fusion_attempts if a.code == "GK304"]
    assert {a.nodes[0] for a in refused} == {"c1", "c2"}
