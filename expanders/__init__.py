"""Expanders: the rules that write a composite op (GeLU, LayerNorm, Softmax, Adam…) in basic
ops, one module per op family, each registered under the op it expands. Importing this
package registers them all; the ``expand`` pass applies them."""

from graphkernel.expanders import (  # noqa: F401
    activations,
    arithmetic,
    grads,
    losses,
    norms,
    optimizers,
    softmax,
)
