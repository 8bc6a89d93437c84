"""Fold reshape chains and drop identity reshapes."""

from __future__ import annotations

from graphkernel.ops import RESHAPE_OPS
from graphkernel.passes.rewrite import add_like, replace_with
from graphkernel.registry import PassResult


def reshape_elim(graph, ctx) -> PassResult:
    """Rewrite reshape(x) -> x when shapes match; reshape(reshape(x)) -> reshape(x)."""
    changed = 0
    for node in graph.nodes:
        if node.graph is None or node.op not in RESHAPE_OPS:
            continue
        src = node.inputs[0]
        out = node.outputs[0]
        # walk up the chain of reshapes feeding this one
        root = src
        while root.producer is not None and root.producer.op in RESHAPE_OPS:
            root = root.producer.inputs[0]
        if root.type == out.type:
            if ctx.should_apply(f"identity {node.name}", [node]):
                replace_with(graph, node, root)
                changed += 1
        elif root is not src:
            if ctx.should_apply(f"fold chain into {node.name}", [node]):
                new = add_like(graph, node, "Reshape", [root], {"shape": list(out.type.shape)})
                replace_with(graph, node, new)
                changed += 1
    return PassResult(changed > 0, changed)
