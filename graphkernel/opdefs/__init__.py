"""Op families; importing this package registers every basic and composite op."""

from graphkernel.opdefs import (  # noqa: F401
    activations,
    arithmetic,
    elementwise,
    grads,
    losses,
    misc,
    nn,
    norms,
    optimizers,
    reduce,
    shape_ops,
)
