"""Attention with sinks as GPT-OSS writes it (a learned logit per head joined to every row of
scores, its column dropped after the softmax), through torch.compile and the simulator: one
fused attention reading its softmax statistics and a small epilogue, instead of the scores'
product, a Concat, a max, two softmax kernels, a slice and the probabilities' product; and
the form it must leave alone (the probabilities returned as well)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]

B, S, HEADS, KV, D = 2, 8, 4, 2, 16


class SinkAttention(torch.nn.Module):
    """Q/K/V projections (grouped K/V), GPT-OSS's eager attention with sinks, the head merge;
    ``mask``: an additive mask [1, 1, S, S] (0 kept, the dtype's lowest masked out)."""

    def __init__(self, mask, probs=False):
        super().__init__()
        torch.manual_seed(0)
        self.q = torch.nn.Linear(HEADS * D, HEADS * D, bias=False)
        self.k = torch.nn.Linear(HEADS * D, KV * D, bias=False)
        self.v = torch.nn.Linear(HEADS * D, KV * D, bias=False)
        self.sinks = torch.nn.Parameter(torch.randn(HEADS))
        self.num_key_value_groups = HEADS // KV
        self.register_buffer("mask", mask)
        self.probs = probs

    def forward(self, x):
        q = self.q(x).view(B, S, HEADS, D).transpose(1, 2)
        k = self.k(x).view(B, S, KV, D).transpose(1, 2)
        v = self.v(x).view(B, S, KV, D).transpose(1, 2)
        out, p = gpt_oss.eager_attention_forward(self, q, k, v, self.mask, scaling=D ** -0.5)
        out = out.reshape(B, S, HEADS * D)
        return (out, p) if self.probs else out


def _causal():
    low = torch.finfo(torch.float32).min
    return torch.full((S, S), low).triu(1)[None, None]


def _x(seed):
    return torch.randn(B, S, HEADS * D, generator=torch.Generator().manual_seed(seed))


def _compiled(model, x, options=None):
    model = model.eval()
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="graphkernel", options=options or {})(x)
    return got, want, gt.stats()


def test_sinks_are_one_fused_attention_and_an_epilogue():
    got, want, s = _compiled(SinkAttention(_causal()), _x(0))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the three projections of one input as one launch (Q, K, V read in place in BSND), the
    # fused attention, its statistics' rows (two), the sink's share per row and its product
    # with the output: no launch for the scores, a Concat, a max or a softmax
    assert s["attentions"] == 1, s
    assert s["launches"] == {"vector": 4, "cube": 1, "mix": 0, "extern": 1, "opaque": 0}, s


@pytest.mark.sim
def test_sinks_through_the_simulator():
    got, want, s = _compiled(SinkAttention(_causal()), _x(1), {"backend": "sim"})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["attentions"] == 1 and s["bugs"] == 0, s


def test_a_row_with_every_key_masked_gives_zeros_as_eager():
    """The sink takes the whole weight of a row whose keys are all masked out: the output row
    is zeros (the operator's statistics are 0 there)."""
    mask = _causal().clone()
    mask[..., 3, :] = torch.finfo(torch.float32).min
    got, want, s = _compiled(SinkAttention(mask), _x(2))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["attentions"] == 1 and float(want[:, 3].abs().max()) == 0.0, s


def test_probabilities_returned_too_are_left_alone():
    """The probabilities (with the sink's share taken out) are an output: no fused attention,
    the graph as the model wrote it, and the same numbers."""
    got, want, s = _compiled(SinkAttention(_causal(), probs=True), _x(3))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert s["attentions"] == 0, s


def test_scores_read_elsewhere_keep_the_attention_as_written():
    """The scores' row max also returned (the scores read outside the attention; a reader of
    the softmax's own row max is refused too: tests/passes/test_attention_sinks.py): the
    attention stays as written and the numbers are eager's."""
    class RowMax(torch.nn.Module):
        def forward(self, q, k, v):
            s = q @ k.transpose(-1, -2) * D ** -0.5 + _causal()[0, 0]
            return torch.softmax(s, dim=-1) @ v, s.amax(dim=-1, keepdim=True)

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, HEADS, S, D, generator=g) for _ in range(3))
    with torch.no_grad():
        want = RowMax()(q, k, v)
        got = torch.compile(RowMax(), backend="graphkernel")(q, k, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert gt.stats()["attentions"] == 0, gt.stats()
