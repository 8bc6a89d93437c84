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
