"""The code generator's refusals: a kernel (or a part of it) it cannot generate, and why.

A refusal carries what a caller acts on as data, not as text to search: ``node``, the op of
the kernel the generator stumbled on (the fallback splits the kernel around it), and
``about``, the nodes and values of the kernel its message names. A kernel of equal body (the
same structure under other names) is refused for the same reason; when the message names
none of the kernel's own nodes or values it holds for that kernel word for word, so it is
carried over without checking the kernel again (``codegen/legalize.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from graphkernel.ir import Node, Value


class Unsupported(Exception):
    """The generator cannot handle this kernel; the message is the reason shown to the user,
    ``node`` the op of the kernel it stumbled on, ``about`` what of the kernel it names."""

    def __init__(self, message: str, node: Node | None = None,
                 about: Sequence[Node | Value] = ()):
        super().__init__(message)
        self.node = node
        self.about = tuple(about)


class NeedsPhases(Unsupported):
    """A value depends on a reduction of its own rows that is accumulated across tiles (a
    second pass over the rows): the kernel runs as a sequence of phase kernels instead
    (``codegen/vector/phases.py``)."""


class SplitBefore(Unsupported):
    """The kernel cannot hold ``node`` with the work before it (a reduction of rows of another
    length than the kernel's other reductions): the fallback splits it in two, the work
    ``node`` does not depend on and ``node`` with the work that depends on it, rather than
    taking ``node`` out on its own."""
