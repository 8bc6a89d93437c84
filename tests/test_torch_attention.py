"""scaled_dot_product_attention through torch.compile: the traced graphs keep every op's
outputs as the op defines them (the backward reads them), attention is one fused op forward
and backward, every argument is honoured, and gradients match eager."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import graphkernel.torch as gt  # noqa: E402
from graphkernel.frontends import fx  # noqa: E402

pytestmark = pytest.mark.e2e  # torch.compile of modules

SDPA_OPS = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default")


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    gt.reset_stats()
    yield
    torch._dynamo.reset()


def _grads(model, args, flags: str = "", seed: int = 0):
    """Every parameter's gradient of one step, eagerly and compiled (the same weights and the
    same random stream on both sides)."""
    twin = copy.deepcopy(model)
    out = {}
    for side, m in (("eager", model), ("compiled", twin)):
        fn = m if side == "eager" else torch.compile(m, backend="graphkernel",
                                                     options={"flags": flags})
        torch.manual_seed(seed)
        fn(*args).pow(2).mean().backward()
        out[side] = {k: p.grad for k, p in m.named_parameters()}
    return out["eager"], out["compiled"]


def assert_same_grads(want, got, rtol=1e-3, atol=1e-5):
    assert [k for k in want if (want[k] is None) != (got[k] is None)] == []
    for k, g in want.items():
        if g is not None:
            torch.testing.assert_close(got[k], g, rtol=rtol, atol=atol, msg=k)


# ---------------------------------------------------------------- the traced graphs
def test_a_decomposition_that_changes_an_ops_outputs_is_refused():
    """torch's rule for the CPU flash attention returns the attention weights where the op
    returns its logsumexp; checked against the op, it is refused and the op traced whole,
    while a rule that returns what its op does still applies."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    core = core_aten_decompositions()
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    silu = torch.ops.aten.silu.default
    table = {op: gt.faithful(op, core[op]) for op in (flash, silu)}

    def f(q, k, v):
        out, lse = flash(q, k, v, 0.0, True)
        return torch.ops.aten.silu(out), lse

    q, k, v = (torch.randn(2, 4, 5, 16) for _ in range(3))
    traced = make_fx(f, decomposition_table=table, tracing_mode="fake")(q, k, v)
    targets = [str(n.target) for n in traced.graph.nodes if n.op == "call_function"]
    assert SDPA_OPS[0] in targets  # kept whole
    assert "aten.silu.default" not in targets and "aten.sigmoid.default" in targets
    unchecked = make_fx(f, decomposition_table={flash: core[flash]}, tracing_mode="fake")
    lse = [n for n in unchecked(q, k, v).graph.nodes if n.op == "output"][0].args[0][1]
    assert tuple(lse.meta["val"].shape) == (2, 4, 5, 7 - 2)  # the weights: [B, H, L, S]
    assert not any(str(op).startswith(tuple(gt.KEEP_WHOLE)) for op in gt.decompositions())


class ConvAttention(torch.nn.Module):
    """A bias-free convolution (its backward has None outputs), then two attention layers
    (causal, and with a boolean mask) over the convolution's channels."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 32, 3, padding=1, bias=False)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.conv(x).transpose(1, 2)  # [B, L, 32]
        b, n = h.shape[:2]
        keep = torch.arange(n)[None, :] <= torch.arange(n)[:, None] + 2
        for mask in (None, keep):
            q, k, v = (t.view(b, n, 2, 16).transpose(1, 2)
                       for t in self.qkv(h).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
            h = h + self.out(a.transpose(1, 2).reshape(b, n, 32))
        return h


@pytest.mark.parametrize("level", [0, 2])
def test_backward_with_several_multi_output_ops_run_through_torch_matches_eager(
        monkeypatch, level):
    """The attention's forward and backward and the convolution's backward (None among its
    outputs), all run through torch as Opaque ops: each reads the saved tensors AOT autograd
    gave it, and every gradient matches eager."""
    for name in (*SDPA_OPS, "aten.convolution_backward.default"):
        monkeypatch.delitem(fx.ATEN, name, raising=False)
    model = ConvAttention().train()
    want, got = _grads(model, (torch.randn(2, 4, 6),), f"--opt_level={level}")
    s = gt.stats()
    assert set(s["fallbacks"]) == {*SDPA_OPS, "aten.convolution_backward.default"}
    assert_same_grads(want, got)
