"""Attention pooling heads: ``nn.MultiheadAttention`` with a learned query (SigLIP's head, many
vision heads) is one fused attention launch, its operands read sequence first (SBH) as the
module lays them out, the query folded into a constant laid out at compile time; on an ONNX
export the head's MLP on one token per batch element stays one matrix product per layer
(not a Mul + ReduceSum writing the weight once per batch element). Numerics match eager;
fused/ideal GM bytes stays within 1.05."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import graphkernel
from graphkernel.interpreter import run_graph


class _Pool(torch.nn.Module):
    """A learned query of ``q`` tokens attending over the input through
    nn.MultiheadAttention, as a vision pooling head is written."""

    def __init__(self, e=64, heads=4, q=1, need_weights=True, weights_out=False):
        super().__init__()
        self.probe = torch.nn.Parameter(torch.randn(1, q, e))
        self.attn = torch.nn.MultiheadAttention(e, heads, batch_first=True)
        self.need, self.weights_out = need_weights, weights_out

    def forward(self, x):
        out, w = self.attn(self.probe.repeat(x.shape[0], 1, 1), x, x, need_weights=self.need)
        return (out, w) if self.weights_out else out


def _siglip_head():
    transformers = pytest.importorskip("transformers")
    from transformers.models.siglip.modeling_siglip import SiglipMultiheadAttentionPoolingHead

    cfg = transformers.SiglipVisionConfig(hidden_size=64, num_attention_heads=4,
                                          intermediate_size=128)
    return SiglipMultiheadAttentionPoolingHead(cfg).eval()


def _compiled(g):
    res = graphkernel.compile(g, "--opt_level=2", env={})
    return res, res.report.extra


def _check(model, x, res):
    got = run_graph(res.graph, [x.numpy()])
    with torch.no_grad():
        want = model(x)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-5)


def _fused(res) -> list:
    return [n for n in res.graph.nodes if n.op == "FusedAttention"]


@pytest.mark.parametrize("kw", [dict(), dict(q=3), dict(need_weights=False),
                                dict(heads=2, q=2, need_weights=False)])
def test_a_learned_query_over_multihead_attention_is_one_fused_attention(kw):
    """nn.MultiheadAttention's math path (weights asked for, the default) and its
    scaled_dot_product_attention path (need_weights=False), one or several learned queries:
    one FusedAttention in SBH, no head transpose of its own, the ideal's bytes."""
    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, x = _Pool(**kw).eval(), torch.randn(2, 16, 64)
    res, ex = _compiled(gt.export_graph(model, (x,), name="pool"))
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "SBH"
    assert fa.attrs["head_num"] == kw.get("heads", 4)
    assert ex["gm_bytes_fused"] <= 1.05 * ex["gm_bytes_ideal"]
    _check(model, x, res)


def test_siglip_pooling_head_moves_the_ideal_bytes_through_both_exports(tmp_path):
    """SigLIP's pooling head (probe, MultiheadAttention, LayerNorm, MLP) from its config:
    torch.export and ONNX both give one fused attention and the ideal's bytes (before: the
    attention ran as 9-10 vector launches, 1.66x / 3.1x the ideal; on ONNX the MLP's
    products on one token per batch element became Mul + ReduceSum writing [B, K, N])."""
    import graphkernel.torch as gt
    from graphkernel.frontends import load_model

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    head, x = _siglip_head(), torch.randn(2, 16, 64)
    path = os.path.join(tmp_path, "head.onnx")
    torch.onnx.export(head, (x,), path, dynamo=False, opset_version=17)
    for g in (gt.export_graph(head, (x,), name="head"), load_model(path)):
        res, ex = _compiled(g)
        assert len(_fused(res)) == 1
        assert ex["gm_bytes_fused"] <= 1.05 * ex["gm_bytes_ideal"], (
            ex["gm_bytes_fused"], ex["gm_bytes_ideal"])
        assert ex["kernels_fused"] <= 9
        big = [n for n in res.graph.nodes if n.op == "GraphKernel" and any(
            v.type.numel > 2 * 16 * 128 for v in n.outputs)]
        assert big == [], "a launch writes more than the key/value projection"
        _check(head, x, res)


def test_attention_weights_read_by_the_caller_keep_the_products():
    """The averaged attention weights returned too: the probabilities are read outside the
    attention, so it stays decomposed (refused, with its reason), and still matches."""
    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, x = _Pool(weights_out=True).eval(), torch.randn(2, 16, 64)
    res, _ = _compiled(gt.export_graph(model, (x,), name="pool"))
    assert _fused(res) == []
    assert [a.verdict for a in res.analyses.attention] == ["refused"]
    assert "used outside the attention" in res.analyses.attention[0].reason
    _check(model, x, res)


@pytest.mark.usefixtures("fresh_torch")
def test_a_pooling_head_through_torch_compile_matches_eager(monkeypatch):
    import graphkernel.torch as gt

    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")
    torch.manual_seed(0)
    head, x = _siglip_head(), torch.randn(2, 16, 64)
    fn = torch.compile(head, backend="graphkernel")
    with torch.no_grad():
        got, want = fn(x), head(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert gt.stats()["attentions"] == 1
