"""One exception hierarchy for everything graphkernel reports to a user.

Every message names the offending item (node, field, flag, file) and what
would be accepted. The CLI prints ``str(error)`` and exits with status 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GraphKernelError(Exception):
    """Base class of every error graphkernel raises on bad input."""

    exit_code = 2


class GraphError(GraphKernelError):
    """A graph violates an invariant: cycle, dangling value, bad use-list."""


class ShapeError(GraphError):
    """Shape or dtype inference failed for a node."""


class OpError(GraphError):
    """Unknown op, wrong arity, or invalid attributes."""


class FormatError(GraphKernelError):
    """A graph file is malformed; the message carries the JSON path."""


class FrontendError(GraphKernelError):
    """A model from another framework uses a construct that cannot be imported."""


class ConfigError(GraphKernelError):
    """A configuration file is malformed."""


class FlagError(ConfigError):
    """A flag string is malformed or names something that does not exist."""


class CodegenError(GraphKernelError):
    """The code generator cannot handle a kernel and fallback is disabled."""


class ExecutionError(GraphKernelError):
    """Running a graph failed: missing inputs, wrong input shapes or dtypes."""


class OutputError(GraphKernelError):
    """An output path cannot be written, or a write would leave the folder the user gave."""


class RegistrationError(GraphKernelError, ValueError):
    """Two registrations claim one pass, expander or pattern name."""


class PluginError(GraphKernelError):
    """Code registered from outside graphkernel (a plugin) failed: the plugin's bug, reported
    with its file, the pass and the exception."""

    exit_code = 1


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``"; did you mean 'a' or 'b'?"`` for the closest choices, or ``""``."""
    pool = list(choices)
    close = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in pool}
        close = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=n)]
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escapes, NUL, bidirectional
    overrides; not newline and tab) written as an escape (``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else
                   c.encode("unicode_escape").decode("ascii") for c in text)


def shown(text: str, limit: int = 60) -> str:
    """``text`` for an error message: printable, and cut to ``limit`` characters (a
    5,000-digit value is named by its start and its length, not echoed whole)."""
    text = printable(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
