"""The passes of the pipeline, one module each, registered with their stage and level
(``graphkernel.registry.register_pass``): expansion, simplification, clustering, the split into
GraphKernel nodes, post-fusion rewrites and code generation. Importing this package registers
every one of them; ``graphkernel passes`` lists them in pipeline order."""

from graphkernel.passes import (  # noqa: F401
    arith_simplify,
    axis_normalize,
    cast_elim,
    cluster,
    codegen,
    constant_fold,
    cse,
    dce,
    expand,
    parallel_fusion,
    promote_precision,
    recompute,
    reshape_elim,
    split,
    super_kernel,
    transpose_elim,
    validate,
)
