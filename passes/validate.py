"""Check types, shapes, acyclicity and use-lists before anything else runs (required)."""

from __future__ import annotations

from graphkernel.registry import PassResult


def validate(graph, ctx) -> PassResult:
    """Check types, shapes, acyclicity and use-lists; never rewrites."""
    graph.validate()
    return PassResult(False)
