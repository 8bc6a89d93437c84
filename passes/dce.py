"""Remove nodes whose results are unused."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.registry import PassResult


def dce(graph, ctx) -> PassResult:
    """Remove node -> nothing when no output is used and it writes no parameter."""
    outputs = {id(v) for v in graph.outputs}
    removed = 0
    for node in reversed(graph.nodes):
        outs = node.outputs
        if len(outs) == 1:  # (most nodes: no generator made to ask)
            if outs[0].uses or id(outs[0]) in outputs:
                continue
        elif any(v.uses or id(v) in outputs for v in outs):
            continue
        if node.op != "GraphKernel" and ops.get(node.op).writes:
            continue
        if ctx.should_apply(f"{node.name} ({node.op})", [node]):
            graph.erase_node(node)
            removed += 1
    return PassResult(removed > 0, removed)
