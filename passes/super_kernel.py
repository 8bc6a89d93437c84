"""The super_kernel pass: choose the SuperKernel scopes (the codegen pass forms the groups
from the kernels it could generate, and renders each group as one launch)."""

from __future__ import annotations

from graphkernel.codegen.superkernel import form_groups
from graphkernel.registry import PassResult, counted


def super_kernel(graph, ctx) -> PassResult:
    """Merge consecutive statically shaped kernels of a scope (super_kernel_scope: node-name
    prefixes or globs; every run of kernels when none is given) into one SuperKernel launch,
    with an all-core barrier only between dependent kernels."""
    scopes = list(ctx.flags.super_kernel_scope)
    ctx.analyses.super_kernel_scopes = scopes
    groups = form_groups(graph, scopes)
    n = sum(len(g.members) for g in groups)
    return PassResult(False, 0, [f"{counted(len(groups), 'candidate SuperKernel')} over "
                                 f"{counted(n, 'kernel')} "
                                 f"(scopes: {', '.join(scopes) or 'automatic'}); final after "
                                 "codegen"])
