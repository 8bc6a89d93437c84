"""Rotary angles computed from the positions a KV-cache step is given (``generate()``: the
cache's length plus the new tokens, int64), as the library computes them, through
torch.compile: one kernel loads the int64 positions, scales them by the frequencies and
takes cos and sin (it was four launches: the int64 Cast, the Concat of the angles with
themselves, the cos, the sin), and the rotations read its tables. Computed in the rotations'
kernels instead, the tables would be values smaller than their loop space that no layout
holds: they stay one kernel's results."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")
transformers = pytest.importorskip("transformers")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]

B, HEADS, KV_HEADS, D = 2, 4, 2, 16


class Rotated(torch.nn.Module):
    """Q and K projections rotated by the tables of the given positions (LlamaAttention's
    rotary, on tables from LlamaRotaryEmbedding built from its config)."""

    def __init__(self):
        super().__init__()
        cfg = transformers.LlamaConfig(hidden_size=HEADS * D, num_attention_heads=HEADS,
                                       num_key_value_heads=KV_HEADS,
                                       max_position_embeddings=64)
        self.rotary = llama.LlamaRotaryEmbedding(cfg)
        self.q = torch.nn.Linear(HEADS * D, HEADS * D, bias=False)
        self.k = torch.nn.Linear(HEADS * D, KV_HEADS * D, bias=False)

    def forward(self, x, positions):
        s = x.shape[1]
        cos, sin = self.rotary(x, positions)
        q = self.q(x).view(B, s, HEADS, D).transpose(1, 2)
        k = self.k(x).view(B, s, KV_HEADS, D).transpose(1, 2)
        return llama.apply_rotary_pos_emb(q, k, cos, sin)


def _inputs(steps, start):
    x = torch.randn(B, steps, HEADS * D, generator=torch.Generator().manual_seed(steps))
    positions = torch.arange(start, start + steps).expand(B, steps)
    return x, positions


@pytest.mark.parametrize("steps, start", [(1, 8), (8, 0)])
def test_tables_from_int64_positions_are_one_kernel(steps, start):
    torch.manual_seed(0)
    model = Rotated().eval()
    args = _inputs(steps, start)
    assert args[1].dtype == torch.int64
    with torch.no_grad():
        want = model(*args)
        got = torch.compile(model, backend="graphkernel")(*args)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["graphs"] == 1, s
    # the tables' kernel, the two rotations; the two projections of one input are one
    # launch (matmul_group)
    assert s["launches"] == {"vector": 3, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s
