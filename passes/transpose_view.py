"""A transpose that moves only axes of size 1 is a view.

Permuting ``[B, 1, N, D]`` to ``[B, N, 1, D]`` (a decoding step's one new position moved behind
its heads, the attention output of that one position moved back) or a multi-query K/V's one
head keeps every element where it was: the axes of other sizes keep their order. As a Reshape
it costs nothing (a view the kernels read in place); as a Transpose it is a launch that copies
the tensor. Runs after the attention pass, which reads head splits and merges as Transposes.
"""

from __future__ import annotations

from graphkernel.ir import Value
from graphkernel.passes.rewrite import add_like, replace_with
from graphkernel.registry import PassResult, counted


def moves_only_ones(x: Value, perm: list[int]) -> bool:
    """Whether permuting ``x`` by ``perm`` moves only axes known to be of size 1 (the other
    axes keep their order, so the elements keep theirs)."""
    kept = [p for p in perm if x.shape[p] != 1]
    return kept == sorted(kept)


def transpose_view(graph, ctx) -> PassResult:
    """Rewrite T(x, p) -> reshape(x) when p moves only axes of size 1."""
    notes = []
    for node in list(graph.nodes):
        if node.graph is None or node.op != "Transpose":
            continue
        src, perm = node.inputs[0], list(node.attrs["perm"])
        if perm == list(range(len(perm))) or not moves_only_ones(src, perm):
            continue
        if ctx.should_apply(f"view {node.name}", [node]):
            replace_with(graph, node, add_like(graph, node, "Reshape", [src],
                                               {"shape": list(node.outputs[0].shape)}))
            notes.append(f"{node.name}: moves only axes of size 1, a Reshape")
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'transpose')} made views")
