"""Fusion patterns, one module per family; importing registers them all."""

from graphkernel.patterns import (  # noqa: F401
    elemany,
    elemwise_broadcast,
    extended,
    matmul,
    reduce,
    reshape,
    slice,
)
