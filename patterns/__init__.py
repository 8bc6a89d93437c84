"""Fusion patterns: the rules of the split model that group vector ops into kernels
(elemwise_broadcast, reduce, reshape, slice, elemany, matmul and the extended patterns), one
module per family on the shared matcher in ``base``. Importing this package registers them
all; the ``split`` pass runs them."""

from graphkernel.patterns import (  # noqa: F401
    elemany,
    elemwise_broadcast,
    extended,
    matmul,
    reduce,
    reshape,
    slice,
)
