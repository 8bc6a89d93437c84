"""Expanders: one module per composite op family; importing registers them all."""

from graphkernel.expanders import (  # noqa: F401
    activations,
    arithmetic,
    grads,
    losses,
    norms,
    optimizers,
    softmax,
)
