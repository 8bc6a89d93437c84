"""The training check's default loss (``graphkernel.torch.step_bisect``, ``bisect(...,
backward=True)``) sees a wrong gradient before a final LayerNorm."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import graphkernel.torch as gt  # noqa: E402
from graphkernel.frontends import fx  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]

SDPA_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


class _NormedAttention(torch.nn.Module):
    """Attention and a LayerNorm at its initial weight 1 and bias 0, an encoder's last op:
    the mean square of its output is var / (var + eps), a constant up to eps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))
        self.norm = torch.nn.LayerNorm(32, eps=1e-12)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (m(x).view(b, n, 2, 16).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.norm(y.transpose(1, 2).reshape(b, n, 32))


X = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4))


def test_a_wrong_gradient_before_a_final_layernorm_is_found(monkeypatch):
    """The query's gradient doubled in the backward graph's import: with the mean square of
    the output as the loss every gradient before the norm was ~1e-8 and the doubled one
    passed the atol ("match")."""
    assert not gt.bisect(_NormedAttention(), (X,), backward=True).mismatch
    handler = fx.ATEN[SDPA_BACKWARD]

    def doubled(c):
        dq, dk, dv = handler(c)
        return [c.emit("Mul", [dq, c.const(2.0, dq.dtype)]), dk, dv]

    monkeypatch.setitem(fx.ATEN, SDPA_BACKWARD, doubled)
    r = gt.bisect(_NormedAttention(), (X,), backward=True)
    assert (r.mismatch, r.stage, r.graph) == (True, "import", "backward")
