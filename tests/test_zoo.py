"""The model zoo (examples/models, exported from Hugging Face architectures) compiles at every
opt_level and matches eager PyTorch; torch.compile with the graphkernel backend works on every
zoo model."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import graphkernel
from graphkernel.fileio import load_npz
from graphkernel.frontends import load_model
from graphkernel.interpreter import Interpreter
from tests.training import step

pytestmark = pytest.mark.e2e  # torch.compile of whole models

ZOO = Path(__file__).resolve().parent.parent / "examples" / "models"
NAMES = sorted(p.stem for p in ZOO.glob("*.json"))


def test_zoo_is_complete():
    assert {"gpt2", "bert", "llama", "qwen2", "t5_encoder", "vit", "whisper_encoder"} <= \
        set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_compiles_at_every_level_and_matches_eager(name):
    g = load_model(ZOO / f"{name}.json")
    feeds = load_npz(ZOO / f"{name}_inputs.npz")
    expected = next(iter(load_npz(ZOO / f"{name}_expected.npz").values()))
    kernels = []
    for level in range(4):
        res = graphkernel.compile(g, f"--opt_level={level}", env={})
        res.graph.validate()
        got = Interpreter(res.graph).run(feeds)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5, err_msg=f"level {level}")
        # from level 2, each of the two layers' attention is one fused attention launch
        fused = [n for n in res.graph.nodes if n.op == "FusedAttention"]
        assert len(fused) == (2 if level >= 2 else 0), (level, res.analyses.attention)
        kernels.append(res.report.extra["kernels_fused"])
    assert kernels[2] < kernels[0]  # fusion reduced the launches


def _builders(attn: str = "sdpa"):
    """The zoo as users build it: the library's default attention (sdpa), or eager."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(ZOO.parent))
    from export_models import builders

    return builders(attn)


def _compiled_matches_eager(name: str, build, inputs) -> dict:
    """torch.compile of a zoo model with the graphkernel backend against eager; the backend's
    stats."""
    import torch

    import graphkernel.torch as gt

    torch._dynamo.reset()
    gt.reset_stats()
    model, args = build(), inputs()
    with torch.no_grad():
        want = model(*args)
        got = torch.compile(model, backend="graphkernel")(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5, msg=name)
    return gt.stats()


@pytest.fixture(scope="module")
def compiled_stats():
    """``compiled_stats(name)``: the backend's stats of a zoo model (library defaults) whose
    torch.compile matched eager, compiled once per module: the tests below read the same
    compile of LLaMA, Falcon and BLOOM that the whole-zoo test makes. A model that did not
    match is not remembered (the next test reading it compiles it again and fails too)."""
    zoo: dict = {}
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            if not zoo:
                zoo.update(_builders())
            build, inputs = zoo[name]
            done[name] = _compiled_matches_eager(name, build, inputs)
        return done[name]

    return get


def test_torch_compile_on_every_zoo_model_matches_eager_without_opaque_ops(compiled_stats):
    warnings.simplefilter("ignore")
    zoo = _builders()
    assert {"mistral", "gemma", "falcon", "bloom", "albert", "electra", "deit", "convnext",
            "wav2vec2"} <= set(zoo)
    for name in zoo:
        s = compiled_stats(name)
        assert s["graphs"] == 1 and s["fallbacks"] == {}, (name, s["fallbacks"])
        assert s["launches"]["opaque"] == 0, name
        if name in ("gpt2", "bert", "llama", "qwen2", "t5_encoder", "vit", "whisper_encoder",
                    "mistral", "falcon", "bloom"):  # one extern attention per layer, none refused
            assert s["launches"]["extern"] == 2, (name, s["launches"])


@pytest.mark.parametrize("name,attn", [("gpt2", "sdpa"), ("bert", "sdpa"), ("llama", "sdpa"),
                                       ("bert", "eager"), ("llama", "eager")])
def test_training_step_gradients_match_eager(name, attn):
    """One training step in train mode (dropout on: both sides seeded alike, the compiled
    step after the compiling one) matches eager's output and every gradient; LLaMA's sdpa
    attention is one fused launch per layer each way."""
    import copy

    import torch

    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    build, inputs = _builders(attn)[name]
    torch._dynamo.reset()
    model, args = build().train(), inputs()
    twin = copy.deepcopy(model)

    want_out, want = step(model, model, args)
    compiled = torch.compile(twin, backend="graphkernel")
    gt.reset_stats()
    step(twin, compiled, args)
    compiling = gt.stats()  # the step that compiled: its forward and backward graphs
    gt.reset_stats()
    got_out, got = step(twin, compiled, args)
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=2e-5)
    assert [k for k in want if (want[k] is None) != (got[k] is None)] == []
    for k, g in want.items():
        if g is not None:
            torch.testing.assert_close(got[k], g, rtol=1e-3, atol=1e-5, msg=f"{name} {k}")
    s = gt.stats()
    assert s["graphs"] == 0  # the compiled graphs ran; nothing compiled again
    if name == "llama" and attn == "sdpa":
        per_graph = compiling["per_graph"]
        assert [(g["role"], g["launches"]["extern"]) for g in per_graph] == [
            ("forward", 2), ("backward", 2)]
        assert compiling["fallbacks"] == {}


def test_llama_rotary_embedding_runs_in_bsnd_in_one_kernel_per_tensor(compiled_stats):
    """LLaMA's q and k: the rotary embedding ``x*cos + cat(-x2, x1)*sin`` is one generated
    kernel each, computed on the projection seen as [B, S, N, D] (the attention operator reads
    BSND: no head-split Transpose is left); torch.compile through them matches eager."""
    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    build, inputs = _builders()["llama"]
    s = compiled_stats("llama")
    assert [g["codegen_fallbacks"] for g in s["per_graph"]] == [0]
    exported = gt.export_graph(build(), inputs(), name="llama")
    res = graphkernel.compile(exported, "--opt_level=2", env={})  # (compiles a copy)
    assert not res.report.extra["fallbacks"]
    rotary = [sorted({m.op for m in n.subgraph.nodes}) for n in res.graph.nodes
              if n.op == "GraphKernel" and any(m.op == "Concat" for m in n.subgraph.nodes)]
    layers = sum(n.op in ("Softmax", "FusedAttention")  # (sdpa: imported as one op)
                 for n in exported.nodes)
    assert len(rotary) == 2 * layers, rotary  # q and k of every layer
    for ops in rotary:
        assert {"StridedSlice", "Neg", "Concat", "Mul", "Add"} <= set(ops)
        assert "Transpose" not in ops
    assert {n.attrs["layout"] for n in res.graph.nodes if n.op == "FusedAttention"} == {"BSND"}


# Launches measured with torch.compile (benchmarks/vs_inductor.py), 2 layers each. Falcon:
# the embedding, the first LayerNorm and, per layer, one kernel rotating Q's and K's heads of
# the fused QKV projection and one Split of it into Q/K/V -> 2 + 2·2 = 6 vector kernels;
# BLOOM: the embedding, two LayerNorms and one Split per layer -> 3 + 2 = 5. Totals add the
# products and one fused attention per layer. Inductor's (fused, total) launches are (11, 23)
# and (13, 25).
LAUNCH_BOUNDS = {"falcon": (6, 16), "bloom": (5, 15)}


@pytest.mark.parametrize("name", sorted(LAUNCH_BOUNDS))
def test_falcon_and_bloom_launches_do_not_regress(name, compiled_stats):
    warnings.simplefilter("ignore")
    s = compiled_stats(name)
    vector, total = LAUNCH_BOUNDS[name]
    assert s["launches"]["vector"] <= vector, s["launches"]
    assert sum(s["launches"].values()) <= total, s["launches"]
    assert s["launches"]["extern"] == 2, s["launches"]  # the attention of each layer
