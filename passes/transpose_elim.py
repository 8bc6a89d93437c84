"""Fold transpose chains and drop identity transposes."""

from __future__ import annotations

from graphkernel.passes.rewrite import add_like, replace_with
from graphkernel.registry import PassResult


def transpose_elim(graph, ctx) -> PassResult:
    """Rewrite T(T(x, p1), p2) -> T(x, p1[p2]) and T(x, identity) -> x."""
    changed = 0
    for node in graph.nodes:
        if node.graph is None or node.op != "Transpose":
            continue
        src, perm = node.inputs[0], list(node.attrs["perm"])
        inner = src.producer
        if inner is not None and inner.op == "Transpose":
            src, perm = inner.inputs[0], [inner.attrs["perm"][p] for p in perm]
        if perm == list(range(len(perm))):
            if ctx.should_apply(f"identity {node.name}", [node]):
                replace_with(graph, node, src)
                changed += 1
        elif src is not node.inputs[0]:
            if ctx.should_apply(f"fold chain into {node.name}", [node]):
                replace_with(graph, node, add_like(graph, node, "Transpose", [src],
                                                   {"perm": perm}))
                changed += 1
    return PassResult(changed > 0, changed)
