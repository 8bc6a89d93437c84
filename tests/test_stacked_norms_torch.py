"""A vision encoder as the library builds it (CLIP's vision tower from its config) through
torch.compile: its pre-layernorm and its first layer's norm read the same rows, one kernel
computes both (and stores the first one's result, the residual)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]


def _norm_kernels(graph) -> list:
    """Vector kernels holding at least one LayerNorm's two reductions."""
    from graphkernel.codegen.traffic import launches

    return [e for e in launches(graph) if e["kind"] == "vector"
            and e.get("op_list", []).count("ReduceSum") >= 2]


def test_clip_vision_stacked_norms_are_one_kernel(monkeypatch):
    import graphkernel.frontends.torch_backend as tb

    seen = []
    count = tb.launch_counts
    monkeypatch.setattr(tb, "launch_counts", lambda g: seen.append(g) or count(g))
    cfg = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        image_size=16, patch_size=8)
    torch.manual_seed(0)
    model = transformers.CLIPVisionModel(cfg).eval()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(x).last_hidden_state
        got = torch.compile(model, backend="graphkernel")(x).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["graphs"] == 1, s
    (graph,) = seen
    stacked = [e for e in _norm_kernels(graph) if e["op_list"].count("ReduceSum") == 4]
    assert len(stacked) == 1, [e["op_list"] for e in _norm_kernels(graph)]
