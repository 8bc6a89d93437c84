"""Op families; importing this package registers every basic op."""

from graphkernel.opdefs import elementwise, misc, nn, reduce, shape_ops  # noqa: F401
