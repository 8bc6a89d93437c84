"""One training step as the tests take it: the output and every parameter's gradient."""

from __future__ import annotations

from typing import Any


def step(model: Any, fn: Any, args: tuple) -> tuple[Any, dict[str, Any]]:
    """Run ``fn`` (``model`` itself or its compiled twin) on ``args`` with torch's random
    stream seeded, back-propagate ``graphkernel.torch.step_loss`` (the mean squared error
    against a fixed target; not the mean square of the output, whose gradients before a
    final LayerNorm are rounding noise), and return the output and the gradients by
    parameter name (None where a parameter got none)."""
    import torch

    from graphkernel.torch import step_loss

    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = fn(*args)
    step_loss(out).backward()
    return out.detach(), {k: p.grad for k, p in model.named_parameters()}
