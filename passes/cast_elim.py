"""Drop identity casts and round-trip cast pairs.

This pass changes numerics: Cast(Cast(x: fp32, fp16), fp32) -> x skips the
rounding to fp16, so the result is more precise than op-by-op execution (its
test measures by how much). A round trip that changes *values* — through an
integer type from a float (truncation), or through a narrower integer (wrap) — is
never dropped.
"""

from __future__ import annotations

import numpy as np

from graphkernel.ir import DType
from graphkernel.passes.rewrite import replace_with
from graphkernel.registry import PassResult


def removable_round_trip(src: DType, mid: DType) -> bool:
    """src -> mid -> src may be dropped: mid is a float (only precision changes) or can hold
    every value of src exactly."""
    if src.is_float and mid.is_float:
        return True
    if src is DType.bool:
        return True
    if src.is_int and mid.is_int:
        return bool(np.can_cast(src.np, mid.np, casting="safe"))
    if src.is_int and mid.is_float:
        return bool(np.can_cast(src.np, mid.np, casting="safe"))
    return False



def cast_elim(graph, ctx) -> PassResult:
    """Rewrite Cast(x, x.dtype) -> x and Cast(Cast(x, A), x.dtype) -> x."""
    changed = 0
    for node in graph.nodes:
        if node.graph is None or node.op != "Cast":
            continue
        src = node.inputs[0]
        target = node.attrs["dtype"]
        if src.dtype == target:
            if ctx.should_apply(f"identity {node.name}", [node]):
                replace_with(graph, node, src)
                changed += 1
            continue
        inner = src.producer
        if inner is not None and inner.op == "Cast" and inner.inputs[0].dtype == target and \
                removable_round_trip(target, src.dtype):
            if ctx.should_apply(f"round trip {inner.name} -> {node.name}",
                                [inner, node]):
                replace_with(graph, node, inner.inputs[0])
                changed += 1
    return PassResult(changed > 0, changed)
