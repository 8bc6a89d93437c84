"""The code generator's refusals: a kernel (or a part of it) it cannot generate, and why."""

from __future__ import annotations

from graphkernel.ir import Node


class Unsupported(Exception):
    """The generator cannot handle this kernel; the message is the reason shown to the user,
    ``node`` the op of the kernel it stumbled on (the fallback splits the kernel around it)."""

    def __init__(self, message: str, node: Node | None = None):
        super().__init__(message)
        self.node = node


class NeedsPhases(Unsupported):
    """A value depends on a reduction of its own rows that is accumulated across tiles (a
    second pass over the rows): the kernel runs as a sequence of phase kernels instead
    (``codegen/vector/phases.py``)."""
