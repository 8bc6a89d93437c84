"""Complex tensors in a torch.compile graph lowered to real pairs (a last axis of 2): the
rotary embeddings written as complex products (``torch.polar``, ``view_as_complex``, a
complex multiply, ``view_as_real``) as DeepSeek-V2, Llama 4 and Meta's original Llama code
write them compile to graphkernel's kernels and match eager, forward and backward; a complex
op without a lowering still runs the graph through torch, with its reason logged."""

from __future__ import annotations

import copy
import logging

import pytest

from tests.training import step

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402
from graphkernel.frontends.complex_lowering import (  # noqa: E402
    NotLowered,
    has_complex,
    lower_complex,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]


def _g(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _strict(monkeypatch):
    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")


def _compiled(fn, *args):
    """(eager's result, the compiled one's, stats) of one call, no grad."""
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend="graphkernel")(*args)
    return want, got, gt.stats()


def _all_ours(s):
    assert s["graphs_through_torch"] == {} and s["bugs"] == 0, s["graphs_through_torch"]
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, (s["fallbacks"],
                                                                   s["launches"])


# ------------------------------------------------------- modules as the libraries write them
def apply_rotary_emb(xq, xk, freqs_cis):
    """DeepSeek-V2's (transformers) rotary: channel pairs as complex numbers."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.unsqueeze(1)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)
    return xq_out, xk_out


class PolarRotaryAttention(torch.nn.Module):
    """Attention with the rotations made in the forward by ``torch.polar`` from position ids
    (DeepSeek-V2's and Llama 4's rotary embedding), scaled, and applied as complex products."""

    def __init__(self, dim=32, heads=2, scaling=1.0):
        super().__init__()
        self.heads, self.hd, self.scaling = heads, dim // heads, scaling
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float()
                                                          / self.hd)), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        pos = torch.arange(s, device=x.device)[None]
        freqs = pos[..., None].float() * self.inv_freq
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * self.scaling
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary_emb(q, k, freqs_cis)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(att.transpose(1, 2).reshape(b, s, -1))


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


class MetaLlamaAttention(torch.nn.Module):
    """Meta's original Llama attention: a complex ``freqs_cis`` buffer (``torch.outer`` of
    positions and frequencies, ``torch.polar``) sliced to the sequence, ``[B, S, H, D]``
    queries and keys rotated as complex numbers."""

    def __init__(self, dim=32, heads=4, max_len=32):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.wk = torch.nn.Linear(dim, dim, bias=False)
        self.wv = torch.nn.Linear(dim, dim, bias=False)
        self.wo = torch.nn.Linear(dim, dim, bias=False)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2)[: self.hd // 2].float()
                                   / self.hd))
        t = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(t, freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(freqs), freqs),
                             persistent=False)

    def forward(self, x, start_pos: int = 0):
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, self.heads, self.hd)
        xk = self.wk(x).view(b, s, self.heads, self.hd)
        xv = self.wv(x).view(b, s, self.heads, self.hd)
        freqs_cis = self.freqs_cis[start_pos: start_pos + s]
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
        xq = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
        xk = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)
        q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))
        scores = torch.matmul(q, k.transpose(2, 3)) / self.hd ** 0.5
        mask = torch.full((s, s), float("-inf")).triu(1)
        out = torch.matmul(torch.softmax(scores + mask, dim=-1), v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


# (module, width, launches at most: on the base tree every op of the graph, 36 and 40 ATen
# ops, ran through torch)
MODULES = {"polar in the forward (DeepSeek-V2)": (PolarRotaryAttention, 32, 14),
           "complex buffer (Meta's Llama)": (MetaLlamaAttention, 32, 12)}


@pytest.mark.parametrize("case", sorted(MODULES))
def test_complex_rotary_compiles_to_our_kernels_and_matches_eager(case, monkeypatch):
    _strict(monkeypatch)
    cls, dim, most = MODULES[case]
    torch.manual_seed(0)
    model = cls(dim).eval()
    x = _g(2, 8, dim)
    want, got, s = _compiled(model, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    _all_ours(s)
    # the rotations run in vector kernels beside the projections, not one launch per op
    assert sum(s["launches"].values()) <= most, s["launches"]


@pytest.mark.parametrize("case", sorted(MODULES))
def test_complex_rotary_trains_with_eager_gradients(case, monkeypatch):
    """The backward graph takes the complex rotations saved by the forward (a complex graph
    input and output) and multiplies by their conjugates: gradients as eager's."""
    _strict(monkeypatch)
    cls, dim, _ = MODULES[case]
    torch.manual_seed(0)
    model = cls(dim).train()
    twin = copy.deepcopy(model)
    x = _g(2, 8, dim)
    want_out, want = step(model, model, (x,))
    got_out, got = step(twin, torch.compile(twin, backend="graphkernel"), (x,))
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=2e-5)
    for k, g in want.items():
        torch.testing.assert_close(got[k], g, rtol=1e-3, atol=1e-5, msg=k)
    s = gt.stats()
    assert {g["role"] for g in s["per_graph"]} == {"forward", "backward"}
    _all_ours(s)


# ------------------------------------------------------------------ each op's lowering
def _w(*shape, seed=3):
    return torch.view_as_complex(_g(*shape, 2, seed=seed))


OPS = {
    # (function of real tensors returning real tensors, argument shapes)
    "mul": (lambda a, b: torch.view_as_real(torch.view_as_complex(a)
                                            * torch.view_as_complex(b)), [(3, 4, 2), (4, 2)]),
    "mul real": (lambda a, r: torch.view_as_real(torch.view_as_complex(a) * r),
                 [(3, 4, 2), (3, 1)]),
    "mul complex scalar": (lambda a: torch.view_as_real(torch.view_as_complex(a)
                                                        * (0.5 - 2j)), [(3, 4, 2)]),
    "div": (lambda a, b: torch.view_as_real(torch.view_as_complex(a)
                                            / torch.view_as_complex(b)), [(3, 4, 2), (4, 2)]),
    "div real": (lambda a, r: torch.view_as_real(torch.view_as_complex(a) / (r.abs() + 1)),
                 [(3, 4, 2), (4,)]),
    "add sub": (lambda a, b, r: torch.view_as_real(
        torch.view_as_complex(a) + torch.view_as_complex(b) - r - 2
        + torch.view_as_complex(b) * 0.5), [(3, 4, 2), (3, 4, 2), (4,)]),
    "add alpha": (lambda a, b: torch.view_as_real(torch.add(
        torch.view_as_complex(a), torch.view_as_complex(b), alpha=3)), [(3, 4, 2), (4, 2)]),
    "conj neg": (lambda a: torch.view_as_real(-torch.view_as_complex(a).conj()
                                              .resolve_conj()), [(3, 4, 2)]),
    "abs angle real imag": (lambda a: torch.view_as_complex(a).abs()
                            + torch.view_as_complex(a).angle() * 2
                            + torch.view_as_complex(a).real * torch.view_as_complex(a).imag,
                            [(3, 4, 2)]),
    "exp": (lambda a: torch.view_as_real(torch.exp(torch.view_as_complex(a) * 0.3)),
            [(3, 4, 2)]),
    "polar complex": (lambda r, t: torch.view_as_real(torch.polar(r.abs(), t)
                                                      + torch.complex(t, r)), [(5,), (5,)]),
    "views": (lambda a: torch.view_as_real(
        torch.view_as_complex(a).permute(2, 0, 1).unsqueeze(-1).transpose(0, 1)
        .reshape(4, -1)[1:3].squeeze() * 2), [(3, 1, 4, 2)]),
    "cat select sum mean": (lambda a, b: torch.view_as_real(torch.cat(
        [torch.view_as_complex(a), torch.view_as_complex(b)], dim=-1)[:, 1]
        + torch.view_as_complex(a).sum(-1) + torch.view_as_complex(b).mean(dim=-1)),
        [(3, 4, 2), (3, 4, 2)]),
    "where": (lambda a, m: torch.view_as_real(torch.where(
        m > 0, torch.view_as_complex(a), torch.view_as_complex(a) * 1j)), [(3, 4, 2), (3, 4)]),
    "to complex128": (lambda a: torch.view_as_real(torch.view_as_complex(a).to(
        torch.complex128) * 2).float(), [(3, 4, 2)]),
    # Fourier transforms as DFT matrix products: FNet's token mixing (fftn of a real tensor
    # over two dims, its real part), an rfft then an inverse FFT, other dims and norms
    "fftn real part": (lambda x: torch.fft.fftn(x, dim=(1, 2)).real, [(2, 8, 12)]),
    "fft complex": (lambda a: torch.view_as_real(torch.fft.fft(torch.view_as_complex(a))),
                    [(3, 7, 2)]),
    "fft ortho dim 0": (lambda x: torch.view_as_real(torch.fft.fft(x, dim=0, norm="ortho")),
                        [(6, 5)]),
    "rfft ifft": (lambda x: torch.fft.ifft(torch.fft.rfft(x), dim=-1).imag, [(2, 4, 10)]),
    "rfft2 forward norm": (lambda x: torch.view_as_real(torch.fft.rfft2(x, norm="forward")),
                           [(2, 6, 9)]),
    "fft2 inverse": (lambda a: torch.view_as_real(torch.fft.ifft2(torch.view_as_complex(a))),
                     [(2, 3, 5, 2)]),
}


@pytest.mark.parametrize("case", sorted(OPS))
def test_each_complex_op_lowers_to_real_pairs_and_matches_eager(case, monkeypatch):
    _strict(monkeypatch)
    fn, shapes = OPS[case]
    args = [_g(*s, seed=i) for i, s in enumerate(shapes)]
    want, got, s = _compiled(fn, *args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    _all_ours(s)


def test_a_fourier_mixing_block_is_matrix_products_with_eager_gradients(monkeypatch):
    """FNet's block (the real part of a 2-d FFT over the tokens and the channels, a residual
    LayerNorm): one cube product per transformed dim, no graph through torch, no Opaque op;
    its gradients (the backward's transforms too) match eager."""
    _strict(monkeypatch)

    class Fourier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(x + torch.fft.fftn(x, dim=(1, 2)).real)

    m, x = Fourier(), _g(2, 8, 16)
    want, got, s = _compiled(m, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    _all_ours(s)
    assert s["launches"]["cube"] + s["launches"]["mix"] == 2, s["launches"]
    torch._dynamo.reset()
    gt.reset_stats()
    m.train()
    twin = copy.deepcopy(m)
    _, want = step(m, m, (x,))
    _, got = step(twin, torch.compile(twin, backend="graphkernel"), (x,))
    for k, g in want.items():
        torch.testing.assert_close(got[k], g, rtol=1e-3, atol=1e-4, msg=k)
    _all_ours(gt.stats())


def test_a_fourier_transform_it_does_not_lower_names_why():
    """Above DFT_MAX points (the matrix would be 4 (2N)^2 bytes) and the inverse real FFT
    (``_fft_c2r``) stay unlowered, the reason naming the size or the op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from graphkernel.frontends.complex_lowering import DFT_MAX

    x = _g(2, 2 * DFT_MAX)
    gm = make_fx(lambda x: torch.fft.rfft(x).abs())(x)
    with pytest.raises(NotLowered, match=rf"an FFT over {2 * DFT_MAX} points"):
        lower_complex(gm, [x])
    y = _g(2, 8)
    gm = make_fx(lambda x: torch.fft.irfft(torch.fft.rfft(x)))(y)
    with pytest.raises(NotLowered, match=r"aten\._fft_c2r\.default has no lowering"):
        lower_complex(gm, [y])


def test_complex_graph_inputs_and_outputs_keep_the_callers_signature(monkeypatch):
    """A compiled function taking and returning complex tensors: fed as ``view_as_real`` of
    the caller's tensors, returned as complex again (a conjugated input resolved first)."""
    _strict(monkeypatch)

    def fn(z, w):
        return (z * w).conj() + 1, torch.view_as_real(z) * 2

    z, w = _w(3, 4, seed=1), _w(4, seed=2).conj()  # (w with its conjugate bit set)
    (want_a, want_b), (got_a, got_b), s = _compiled(fn, z, w)
    assert got_a.dtype == torch.complex64
    torch.testing.assert_close(got_a, want_a)
    torch.testing.assert_close(got_b, want_b)
    _all_ours(s)


def test_a_complex_op_without_a_lowering_runs_the_graph_through_torch(caplog):
    """A complex square root has no lowering here: the graph runs through torch, as Dynamo
    gave it, with the op named in the logged reason (no failure of graphkernel's, so strict
    does not raise)."""
    def fn(x):
        return torch.view_as_real(torch.view_as_complex(x).sqrt()) * 2

    x = _g(3, 4, 2)
    with caplog.at_level(logging.WARNING, logger="graphkernel.torch"):
        want, got, s = _compiled(fn, x)
    torch.testing.assert_close(got, want)
    (reason, count), = s["graphs_through_torch"].items()
    assert reason.startswith("complex values: aten.sqrt.default has no lowering"), reason
    assert count == 1 and s["bugs"] == 0
    assert any(reason in r.getMessage() for r in caplog.records)


def test_lowering_leaves_real_graphs_alone_and_names_what_it_cannot_lower():
    from torch.fx.experimental.proxy_tensor import make_fx

    x = _g(3, 4, 2)
    real = make_fx(lambda x: x * 2)(x)
    assert not has_complex(real) and lower_complex(real, [x]) is None
    gm = make_fx(lambda x: torch.view_as_real(torch.view_as_complex(x).log()))(x)
    assert has_complex(gm)
    with pytest.raises(NotLowered, match=r"aten\.log\.default has no lowering"):
        lower_complex(gm, [x])
    ok = make_fx(lambda x: torch.view_as_real(torch.view_as_complex(x) * 3j))(x)
    low = lower_complex(ok, [x])
    assert not has_complex(low.gm) and low.inputs == [] and low.outputs == []
    torch.testing.assert_close(low.gm(x), ok(x))

