"""Op definitions, one module per family (elementwise, arithmetic, reduce, shape, nn,
pooling, norms, activations, attention, losses, grads, optimizers, misc): each op's kind,
arity, attribute schema, shape inference and numpy reference, registered in
``graphkernel.ops``. Importing this package registers every basic and composite op
(``import graphkernel`` does)."""

from graphkernel.opdefs import (  # noqa: F401
    activations,
    arithmetic,
    attention,
    elementwise,
    experts,
    grads,
    indexing,
    losses,
    misc,
    nn,
    norms,
    optimizers,
    pooling,
    reduce,
    scan,
    shape_ops,
    trisolve,
)
