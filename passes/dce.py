"""Remove nodes whose results are unused."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.registry import PassResult


def dce(graph, ctx) -> PassResult:
    """Remove node -> nothing when no output is used and it writes no parameter."""
    outputs = {id(v) for v in graph.outputs}
    removed = 0
    for node in reversed(graph.nodes):
        for v in node.outputs:  # (a loop, not any(): this runs once per node)
            if v.uses or id(v) in outputs:
                break
        else:  # no output used
            if node.op == "GraphKernel" or not ops.get(node.op).writes:
                if ctx.should_apply(f"{node.name} ({node.op})", [node]):
                    graph.erase_node(node)
                    removed += 1
    return PassResult(removed > 0, removed)
