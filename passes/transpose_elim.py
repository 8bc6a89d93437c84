"""Fold transpose chains, drop identity transposes and squeeze axes of 1 out of transposes.

A transpose of a value with axes of size 1 that also moves other axes (an einsum's permute
of ``[B, S, N, D, 1]`` to ``[B, N, D, S, 1]``: torch lowers ``einsum("bind,bjnd->bnij")`` to
products of such 5-d views) is the same data movement as the transpose of the axes of other
sizes alone, between two views: ``Reshape(Transpose(Reshape(x, squeezed), perm'), out)``.
The squeezing Reshape reads the value before any reshapes that made ``x`` (a chain of views is
one view). The head splits, merges and Kᵀ of such an einsum attention are then the 4-d
transposes the attention pass reads. A transpose of more than 4 axes that moves only axes
of 1 is a view here; one of at most 4 axes is left to ``transpose_view`` (after the
attention pass, which reads a one-head split ``[B, S, 1, D]`` as a Transpose).
"""

from __future__ import annotations

from graphkernel.ir import Value
from graphkernel.ops import RESHAPE_OPS
from graphkernel.passes.rewrite import add_like, replace_with
from graphkernel.registry import PassResult


def _squeezed(x: Value, perm: list[int]) -> list[int] | None:
    """The permutation of ``x``'s axes other than its axes of 1 when it has some and that
    permutation moves data, or (rank above 4) the identity when it moves none; else None."""
    keep = [a for a in range(len(perm)) if x.shape[a] != 1]
    if len(keep) == len(perm):
        return None
    rank = {a: i for i, a in enumerate(keep)}
    inner = [rank[p] for p in perm if p in rank]
    return inner if inner != sorted(inner) or len(perm) > 4 else None


def _root(x: Value) -> Value:
    """``x`` seen through the reshapes that made it."""
    while (p := x.producer) is not None and p.op in RESHAPE_OPS:
        x = p.inputs[0]
    return x


def transpose_elim(graph, ctx) -> PassResult:
    """Rewrite T(T(x, p1), p2) -> T(x, p1[p2]), T(x, identity) -> x and a transpose of a
    value with axes of 1 -> views around the transpose of its other axes."""
    total = 0
    for _ in range(8):  # a squeezed transpose may meet another squeezed in the same sweep
        changed = _sweep(graph, ctx)
        total += changed
        if not changed:
            break
    return PassResult(total > 0, total)


def _sweep(graph, ctx) -> int:
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
        elif (squeezed := _squeezed(src, perm)) is not None:
            if ctx.should_apply(f"squeeze axes of 1 out of {node.name}", [node]):
                root = _root(src)
                shape = [d for d in src.shape if d != 1]
                if list(root.shape) != shape:
                    root = add_like(graph, node, "Reshape", [root], {"shape": shape})
                moved = root if squeezed == sorted(squeezed) else add_like(
                    graph, node, "Transpose", [root], {"perm": squeezed})
                replace_with(graph, node, add_like(graph, node, "Reshape", [moved], {
                    "shape": list(node.outputs[0].shape)}))
                changed += 1
        elif src is not node.inputs[0]:
            if ctx.should_apply(f"fold chain into {node.name}", [node]):
                replace_with(graph, node, add_like(graph, node, "Transpose", [src],
                                                   {"perm": perm}))
                changed += 1
    return changed
