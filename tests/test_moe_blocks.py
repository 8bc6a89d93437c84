"""A mixture-of-experts decoder's attention block as the library builds it: OLMoE-style
Q/K norms over all heads' features (a norm over heads x head size, then the heads split),
joined to their projections' MIX kernels, through torch.compile and the simulator; and the
case the epilogue must refuse (the split heads read inside the kernel)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]

B, S, HEADS, D = 2, 8, 4, 16


def _rms(x, w):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * x


def _rotate(x):
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, HEADS * D, generator=g),
            torch.randn(HEADS * D, HEADS * D, generator=g) * 0.2,
            torch.rand(HEADS * D, generator=g) + 0.5,
            torch.randn(S, D, generator=g), torch.randn(S, D, generator=g))


def _normed_heads(x, w, g, cos, sin):
    """q = norm(x @ w) over heads x head size, split into heads, rotated (OLMoE's q/k)."""
    q = _rms(x @ w.t(), g).view(B, S, HEADS, D)
    return q * cos[:, None, :] + _rotate(q) * sin[:, None, :]


def _compiled(fn, args, options=None):
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend="graphkernel", options=options or {})(*args)
    return got, want, gt.stats()


def test_norm_over_all_heads_joins_its_projection_kernel():
    got, want, s = _compiled(_normed_heads, _data())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the projection with the norm (MIX), the rotary kernel: no kernel for the norm alone
    assert s["launches"] == {"vector": 1, "cube": 0, "mix": 1, "extern": 0, "opaque": 0}, s


@pytest.mark.sim
def test_norm_over_all_heads_in_the_projection_through_the_simulator():
    got, want, s = _compiled(_normed_heads, _data(1), {"backend": "sim"})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["launches"]["mix"] == 1 and s["bugs"] == 0, s


def test_split_heads_read_inside_the_epilogue_are_refused():
    """The norm's heads read by work of their own in the epilogue (a per-head sum): the
    product's rows are no longer what the epilogue computes on; the norm stays a MIX
    epilogue only up to its stored rows, the per-head work is a kernel of its own."""
    def f(x, w, g, cos, sin):
        q = _rms(x @ w.t(), g).view(B, S, HEADS, D)
        return q.sum(-1)

    got, want, s = _compiled(f, _data(2))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["launches"]["opaque"] == 0 and sum(s["launches"].values()) == 2, s


def test_group_mask_of_a_grouped_router_is_one_kernel():
    """DeepSeek-V3's group-limited routing: the picked groups' mask spread over their
    experts, cast to bool, inverted, selecting the scores: one kernel (the float mask's
    cast to bool is a comparison with zero, which kernels run)."""
    n, groups, per = 16, 4, 2

    def f(scores, picked):
        mask = torch.zeros(n, groups).scatter(1, picked, 1.0)
        spread = mask.unsqueeze(-1).expand(n, groups, per).reshape(n, -1)
        return scores.masked_fill(~spread.bool(), 0.0)

    g = torch.Generator().manual_seed(3)
    scores = torch.rand(n, groups * per, generator=g)
    picked = torch.stack([torch.randperm(groups, generator=g)[:2] for _ in range(n)])
    got, want, s = _compiled(f, (scores, picked))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the scatter of the picked groups, then the mask's kernel
    assert s["launches"] == {"vector": 2, "cube": 0, "mix": 0, "extern": 0, "opaque": 0}, s


def _latent_attention():
    """transformers' DeepSeek-V3 attention (latent K/V, the key written into a buffer as
    two slice copies), built from its config: 4 heads, no query LoRA, seeded."""
    tr = pytest.importorskip("transformers")
    if not hasattr(tr, "DeepseekV3Config"):
        pytest.skip("transformers without DeepSeek-V3")
    torch.manual_seed(0)
    cfg = tr.DeepseekV3Config(hidden_size=64, num_attention_heads=HEADS,
                              num_key_value_heads=HEADS,
                              q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8,
                              qk_nope_head_dim=8, v_head_dim=16, num_hidden_layers=1,
                              vocab_size=32, max_position_embeddings=64)
    return tr.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention(cfg, 0).eval()


def test_latent_key_written_by_two_slice_copies_is_one_concat():
    """``key[..., :d].copy_(k_nope)`` then ``key[..., d:].copy_(k_rot)``: the second copy
    reads back exactly the first's piece (a slice of a Concat that is one of its pieces),
    so the key is one Concat of the two: one kernel (two before)."""
    attn = _latent_attention()
    g = torch.Generator().manual_seed(4)
    kv = torch.randn(B, 1, S, 32, generator=g)
    k_rot = torch.randn(B, 1, S, 8, generator=g)
    got, want, s = _compiled(lambda a, b: attn.expand_kv(a, b), (kv, k_rot))
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    # the product, its head split, the key's Concat, the value's slice
    assert s["launches"]["opaque"] == 0 and s["launches"]["vector"] <= 3, s
