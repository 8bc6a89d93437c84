"""Check types, shapes, acyclicity and use-lists before anything else runs (required)."""

from __future__ import annotations

from graphkernel.registry import PassResult


def validate(graph, ctx) -> PassResult:
    """Check types, shapes, acyclicity and use-lists; never rewrites. A graph the compile's
    caller vouches for as a model loader returned it (``api.compile``'s
    ``checked_on_load``) was built through these very checks: it is not checked again."""
    if ctx.checked_on_load:
        ctx.checked_on_load = False  # (only once: what later passes make is theirs)
        return PassResult(False, 0, [], "checked by the model loader")
    graph.validate()
    return PassResult(False)
