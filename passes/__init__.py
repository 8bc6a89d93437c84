"""The passes of the pipeline; importing this package registers every one of them."""

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
