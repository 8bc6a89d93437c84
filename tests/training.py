"""One training step as the tests take it: the output and every parameter's gradient."""

from __future__ import annotations

from typing import Any


def step(model: Any, fn: Any, args: tuple) -> tuple[Any, dict[str, Any]]:
    """Run ``fn`` (``model`` itself or its compiled twin) on ``args`` with torch's random
    stream seeded, back-propagate the mean squared error of the output against a fixed
    target (standard normal values from a generator of their own), and return the output
    and the gradients by parameter name (None where a parameter got none).

    Not the mean square of the output: after a LayerNorm at its initial weight 1 and bias 0
    (most encoders' last op) that is ``var / (var + eps)``, a constant up to ``eps``, and
    every gradient before the norm is of order ``eps``, below any atol: a backward that
    returned zeros there would match."""
    import torch

    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = fn(*args)
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    (out - target.to(out.dtype)).pow(2).mean().backward()
    return out.detach(), {k: p.grad for k, p in model.named_parameters()}
