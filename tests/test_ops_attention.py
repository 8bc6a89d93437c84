"""FusedAttention's reference against torch's scaled_dot_product_attention."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel.errors import ShapeError
from tests.conftest import assert_close, run_op

torch = pytest.importorskip("torch")
F = torch.nn.functional

B, N1, S1, S2, D = 2, 4, 8, 12, 16


def _layout(x: np.ndarray, layout: str) -> np.ndarray:
    """[B, N, S, D] in ``layout``."""
    if layout == "BNSD":
        return x
    x = x.transpose(0, 2, 1, 3)
    if layout == "BSND":
        return np.ascontiguousarray(x)
    b, s, n, d = x.shape
    x = x.reshape(b, s, n * d)
    return x if layout == "BSH" else np.ascontiguousarray(x.transpose(1, 0, 2))


def _sdpa(q, k, v, mask=None, scale=None, gqa=False):
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(
        mask if mask.dtype == bool else mask.astype(np.float64))
    return F.scaled_dot_product_attention(*t, attn_mask=m, scale=scale,
                                          enable_gqa=gqa).numpy()


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_plain_attention_in_every_layout(layout, dtype, rng):
    q, k, v = (rng.standard_normal((B, N1, s, D)).astype(dtype) for s in (S1, S2, S2))
    want = _sdpa(q, k, v, scale=0.25)
    got = run_op("FusedAttention", [_layout(x, layout) for x in (q, k, v)],
                 {"layout": layout, "head_num": N1, "scale": 0.25})
    assert got.dtype == dtype
    assert_close(got, _layout(want, layout).astype(dtype))


@pytest.mark.parametrize("shape", [(B, N1, S1, S2), (B, 1, S1, S2), (1, 1, S1, S2), (S1, S2)])
def test_atten_mask_is_one_for_masked_out(shape, rng):
    q, k, v = (rng.standard_normal((B, N1, s, D)).astype(np.float32) for s in (S1, S2, S2))
    masked = rng.random(shape) < 0.3
    masked[..., 0] = False  # every row keeps a key
    want = _sdpa(q, k, v, mask=~masked)  # torch's bool mask: True = take part
    got = run_op("FusedAttention", [q, k, v, masked],
                 {"head_num": N1, "mask": "atten_mask", "scale": D ** -0.5})
    assert_close(got, want.astype(np.float32))


def test_causal_mask_as_uint8(rng):
    q, k, v = (rng.standard_normal((B, N1, S1, D)).astype(np.float16) for _ in range(3))
    causal = np.triu(np.ones((S1, S1), np.uint8), 1)  # 1 above the diagonal: masked out
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*t, is_causal=True).numpy()
    got = run_op("FusedAttention", [q, k, v, causal],
                 {"head_num": N1, "mask": "atten_mask", "scale": D ** -0.5})
    assert_close(got, want.astype(np.float16))


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_causal_mode_masks_later_keys(layout, rng):
    """causal (the operator's sparse_mode 2): key j > query i is masked out, no mask input."""
    q, k, v = (rng.standard_normal((B, N1, S1, D)).astype(np.float32) for _ in range(3))
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*t, is_causal=True).numpy()
    got = run_op("FusedAttention", [_layout(x, layout) for x in (q, k, v)],
                 {"layout": layout, "head_num": N1, "scale": D ** -0.5, "causal": True})
    assert_close(got, _layout(want, layout).astype(np.float32))


def test_a_window_keeps_the_last_keys_up_to_the_query(rng):
    """causal with window w: query i keeps keys i - w + 1 .. i (Mistral's sliding window;
    the operator's band, sparse_mode 4, pre_tokens w - 1, next_tokens 0)."""
    q, k, v = (rng.standard_normal((B, N1, S1, D)).astype(np.float32) for _ in range(3))
    i, j = np.arange(S1)[:, None], np.arange(S1)[None, :]
    want = _sdpa(q, k, v, mask=(j <= i) & (j > i - 3))
    got = run_op("FusedAttention", [q, k, v],
                 {"head_num": N1, "scale": D ** -0.5, "causal": True, "window": 3})
    assert_close(got, want.astype(np.float32))
    with pytest.raises(ShapeError, match="window=3 without causal"):
        run_op("FusedAttention", [q, k, v], {"head_num": N1, "window": 3})


def test_causal_mode_takes_no_atten_mask():
    x = np.zeros((1, 1, 4, 16), np.float32)
    with pytest.raises(ShapeError, match="causal with mask=atten_mask"):
        run_op("FusedAttention", [x, x, x, np.zeros((4, 4), bool)],
               {"head_num": 1, "mask": "atten_mask", "causal": True})


def test_pse_is_added_before_the_scale(rng):
    # the documented form: softmax(scale * (pse + Q·Kᵀ)); torch adds its mask after the
    # scale, so pse = mask / scale gives the same result
    q, k, v = (rng.standard_normal((B, N1, s, D)).astype(np.float32) for s in (S1, S2, S2))
    bias = rng.standard_normal((1, N1, S1, S2)).astype(np.float32)
    scale = 0.125
    want = _sdpa(q, k, v, mask=bias, scale=scale)
    got = run_op("FusedAttention", [q, k, v, bias / np.float32(scale)],
                 {"head_num": N1, "mask": "pse", "scale": scale})
    assert_close(got, want.astype(np.float32))


@pytest.mark.parametrize("layout", ["BNSD", "BSH"])
def test_grouped_query_heads_share_kv(layout, rng):
    q = rng.standard_normal((B, N1, S1, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, 2, S2, D)).astype(np.float32) for _ in range(2))
    want = _sdpa(q, k, v, gqa=True)
    got = run_op("FusedAttention", [_layout(x, layout) for x in (q, k, v)],
                 {"layout": layout, "head_num": N1, "scale": D ** -0.5})
    assert_close(got, _layout(want, layout).astype(np.float32))


def test_fully_masked_row_gives_zeros(rng):
    q, k, v = (rng.standard_normal((1, 1, 4, D)).astype(np.float32) for _ in range(3))
    masked = np.zeros((4, 4), bool)
    masked[2] = True
    got = run_op("FusedAttention", [q, k, v, masked],
                 {"head_num": 1, "mask": "atten_mask"})
    assert np.all(got[0, 0, 2] == 0) and np.all(np.isfinite(got))


@pytest.mark.parametrize("shapes,attrs,match", [
    ([(2, 4, 8, 20)] * 3, {"head_num": 4}, r"head size D=20"),
    ([(2, 4, 8, 16)] * 3, {"head_num": 2}, r"q has 4 heads"),
    ([(2, 4, 8, 16), (2, 3, 8, 16), (2, 3, 8, 16)], {"head_num": 4}, r"3 K/V heads"),
    ([(2, 4, 8, 16)] * 3 + [(2, 1, 1, 8)], {"head_num": 4, "mask": "atten_mask"},
     r"atten_mask of shape \[2, 1, 1, 8\]"),
    ([(2, 4, 8, 16)] * 3 + [(2, 1, 8, 8)], {"head_num": 4, "mask": "pse"},
     r"pse of shape \[2, 1, 8, 8\]"),
    ([(2, 8, 60)] * 3, {"head_num": 4, "layout": "BSH"}, r"head size D=15"),
])
def test_limits_are_clear_errors(shapes, attrs, match):
    arrays = [np.zeros(s, np.bool_ if i == 3 and attrs.get("mask") == "atten_mask"
                       else np.float32) for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=match):
        run_op("FusedAttention", arrays, attrs)


def test_int_operands_are_refused():
    x = np.zeros((1, 1, 4, 16), np.int32)
    with pytest.raises(ShapeError, match="dtype int32"):
        run_op("FusedAttention", [x, x, x], {"head_num": 1})


def test_pse_and_atten_mask_together(rng):
    q, k, v = (rng.standard_normal((B, N1, s, D)).astype(np.float32) for s in (S1, S2, S2))
    bias = rng.standard_normal((B, N1, S1, S2)).astype(np.float32)
    masked = np.triu(np.ones((S1, S2), bool), 1)
    scale = 0.25
    want = _sdpa(q, k, v, mask=np.where(masked, -np.inf, bias), scale=scale)
    got = run_op("FusedAttention", [q, k, v, bias / np.float32(scale), masked],
                 {"head_num": N1, "mask": "pse_and_atten_mask", "scale": scale})
    assert_close(got, want.astype(np.float32))


# ------------------------------------------------------ statistics and the gradient
def _torch_grads(q, k, v, dy, mask=None, scale=None, causal=False):
    """(out, logsumexp, dQ, dK, dV) of torch's attention in float64, [B, N, S, D]."""
    t = [torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(mask)
    out = F.scaled_dot_product_attention(*t, attn_mask=m, scale=scale, is_causal=causal,
                                         enable_gqa=q.shape[1] != k.shape[1])
    grads = torch.autograd.grad(out, t, torch.from_numpy(dy.astype(np.float64)))
    s = torch.matmul(t[0], t[1].repeat_interleave(q.shape[1] // k.shape[1], 1)
                     .transpose(-1, -2)) * (scale if scale is not None else D ** -0.5)
    if m is not None:
        s = s.masked_fill(~m, float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return [x.detach().numpy() for x in (out, lse, *grads)]


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH"])
@pytest.mark.parametrize("heads2", [N1, 2])
@pytest.mark.parametrize("masking", ["none", "atten_mask", "causal"])
def test_statistics_and_gradient_match_torch(layout, heads2, masking, rng):
    """FusedAttention's softmax_max/softmax_sum give torch's logsumexp (max + log sum, each
    row's value 8 times), and FusedAttentionGrad fed them gives torch's dQ, dK, dV (K/V heads
    summed over the query heads that share them), in every layout."""
    s1 = S2 if masking == "causal" else S1
    q = rng.standard_normal((B, N1, s1, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, heads2, S2, D)).astype(np.float32) for _ in range(2))
    dy = rng.standard_normal(q.shape).astype(np.float32)
    keep = rng.random((s1, S2)) > 0.3
    keep[:, 0] = True
    attrs = {"layout": layout, "head_num": N1, "scale": 0.3,
             "mask": "atten_mask" if masking == "atten_mask" else "none",
             "causal": masking == "causal"}
    masks = [~keep] if masking == "atten_mask" else []
    out, lse, *want = _torch_grads(q, k, v, dy, keep if masking == "atten_mask" else None,
                                   0.3, masking == "causal")
    got, smax, ssum = run_op("FusedAttention", [*(_layout(x, layout) for x in (q, k, v)),
                                                *masks], attrs | {"stats": True})
    assert smax.shape == ssum.shape == (B, N1, s1, 8) and smax.dtype == np.float32
    assert np.all(smax == smax[..., :1]) and np.all(ssum == ssum[..., :1])
    assert_close(got, _layout(out, layout).astype(np.float32))
    assert_close(smax[..., 0] + np.log(ssum[..., 0]), lse.astype(np.float32))
    grads = run_op("FusedAttentionGrad",
                   [*(_layout(x, layout) for x in (q, k, v, dy, out.astype(np.float32))),
                    smax, ssum, *masks], attrs)
    for w, g in zip(want, grads, strict=True):
        np.testing.assert_allclose(g, _layout(w, layout), rtol=1e-4, atol=1e-5)


def test_gradient_of_a_fully_masked_row_is_zero_from_either_statistics(rng):
    """A row with no key: softmax_sum 0 (the forward's) or the logsumexp 0 with sum 1 (what
    a backward rebuilds from torch's logsumexp): no gradient flows through it, no NaN."""
    q, k, v, dy = (rng.standard_normal((1, 1, 4, D)).astype(np.float32) for _ in range(4))
    masked = np.zeros((4, 4), bool)
    masked[2] = True
    attrs = {"head_num": 1, "mask": "atten_mask", "scale": D ** -0.5}
    out, smax, ssum = run_op("FusedAttention", [q, k, v, masked], attrs | {"stats": True})
    assert np.all(smax[0, 0, 2] == 0) and np.all(ssum[0, 0, 2] == 0)
    lse_max = smax.copy()
    lse_max[..., :] = (smax[..., :1] + np.log(np.where(ssum[..., :1] > 0, ssum[..., :1], 1)))
    for stats in ((smax, ssum), (lse_max, np.ones_like(ssum))):
        dq, dk, dv = run_op("FusedAttentionGrad", [q, k, v, dy, out, *stats, masked], attrs)
        assert np.all(dq[0, 0, 2] == 0) and all(np.all(np.isfinite(x)) for x in (dq, dk, dv))
        _, _, *want = _torch_grads(q, k, v, dy, ~masked)
        for w, g in zip(want, (dq, dk, dv), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_gradient_inputs_are_checked():
    x = np.zeros((1, 1, 4, 16), np.float32)
    stats = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(ShapeError, match="softmax_max"):
        run_op("FusedAttentionGrad", [x, x, x, x, x, stats[..., :4], stats], {"head_num": 1})
    with pytest.raises(ShapeError, match="dy"):
        run_op("FusedAttentionGrad", [x, x, x, x[..., :2, :], x, stats, stats],
               {"head_num": 1})
