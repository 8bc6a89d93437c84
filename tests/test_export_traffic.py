"""GM traffic of exported transformers from families the zoo has, built as the library
builds them (configs, library defaults, seeded weights) but not the zoo's own models: a
windowed vision model (Swin V2: window partition and merge, patch merge, each beside a
LayerNorm) and a parallel-attention decoder with a fused QKV projection cut into column
blocks and a partial rotary embedding (GPT-NeoX with half the head rotated). fused/ideal GM
bytes at opt_level 2 stays within 1.05 of the ideal, and the compiled graph matches eager."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import graphkernel
from graphkernel.interpreter import run_graph

transformers = pytest.importorskip("transformers")


class _Hidden(torch.nn.Module):
    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return self.model(**{self.key: x}).last_hidden_state


def _swinv2():
    cfg = transformers.Swinv2Config(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1],
                                    num_heads=[2, 4], window_size=4)
    return _Hidden(transformers.Swinv2Model(cfg).eval(), "pixel_values"), \
        torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _gpt_neox_half_rotary():
    cfg = transformers.GPTNeoXConfig(num_hidden_layers=2, hidden_size=48, num_attention_heads=3,
                                     intermediate_size=96, vocab_size=256,
                                     max_position_embeddings=64, rotary_pct=0.5)
    return _Hidden(transformers.GPTNeoXModel(cfg).eval(), "input_ids"), \
        torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("make", [_swinv2, _gpt_neox_half_rotary])
def test_an_exported_relative_of_the_zoo_moves_near_the_ideal_bytes(make):
    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, x = make()
    g = gt.export_graph(model, (x,), name="m")
    res = graphkernel.compile(g, "--opt_level=2", env={})
    ex = res.report.extra
    assert not ex["fallbacks"]
    assert ex["gm_bytes_fused"] <= 1.05 * ex["gm_bytes_ideal"], (
        ex["gm_bytes_fused"], ex["gm_bytes_ideal"])
    (got,) = run_graph(res.graph, [x.numpy()])
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_swin_windows_and_patch_merge_join_their_layer_norms():
    """Swin V2's window partition after a LayerNorm, its window merge before the residual
    and its patch merge before a LayerNorm are no launches of their own: 30 launches (37
    with each a transpose kernel of its own), none of them failing to generate."""
    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, x = _swinv2()
    res = graphkernel.compile(gt.export_graph(model, (x,), name="m"), "--opt_level=2", env={})
    assert not res.report.extra["fallbacks"]
    assert res.report.extra["kernels_fused"] <= 30
