"""Drop identity casts and round-trip cast pairs.

This pass changes numerics: Cast(Cast(x: fp32, fp16), fp32) -> x skips the
rounding to fp16, so the result is more precise than op-by-op execution (its
test measures by how much).
"""

from __future__ import annotations

from graphkernel.passes.rewrite import replace_with
from graphkernel.registry import PassResult, register_pass


@register_pass("cast_elim", stage="simplify", level=2, order=60)
def cast_elim(graph, ctx) -> PassResult:
    """Rewrite Cast(x, x.dtype) -> x and Cast(Cast(x, A), x.dtype) -> x."""
    changed = 0
    for node in graph.nodes:
        if node.graph is None or node.op != "Cast":
            continue
        src = node.inputs[0]
        target = node.attrs["dtype"]
        if src.dtype == target:
            if ctx.should_apply(f"identity {node.name}"):
                replace_with(graph, node, src)
                changed += 1
            continue
        inner = src.producer
        if inner is not None and inner.op == "Cast" and inner.inputs[0].dtype == target:
            if ctx.should_apply(f"round trip {inner.name} -> {node.name}"):
                replace_with(graph, node, inner.inputs[0])
                changed += 1
    return PassResult(changed > 0, changed)
