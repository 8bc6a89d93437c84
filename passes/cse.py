"""Common subexpression elimination."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel import ops
from graphkernel.ir import DType, Graph, Node
from graphkernel.passes.rewrite import merge_origin, replace_with
from graphkernel.registry import PassResult, register_pass

_NEVER = {"Assign", "Opaque"}  # side effects, or external code we cannot compare


def _attr_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("array", DType.parse(v.dtype).value, v.shape, v.tobytes())
    if isinstance(v, Graph):
        return ("graph", str(v))
    if isinstance(v, list | tuple):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _attr_key(x)) for k, x in v.items()))
    return v


def node_key(node: Node) -> tuple:
    return (node.op, tuple(id(v) for v in node.inputs),
            tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())))


@register_pass("cse", stage="simplify", level=2, order=30)
def cse(graph, ctx) -> PassResult:
    """Rewrite a node -> an earlier identical node (same op, inputs and attributes)."""
    seen: dict[tuple, Node] = {}
    merged = 0
    for node in graph.nodes:
        if node.op in _NEVER or (node.op != "GraphKernel" and ops.get(node.op).writes):
            continue
        key = node_key(node)
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        if ctx.should_apply(f"{node.name} ({node.op}) -> {first.name}", [node, first]):
            if node.op != "Constant":  # a shared constant would collect every user's name
                first.origin = merge_origin(first, node)
            replace_with(graph, node, list(first.outputs))
            merged += 1
    return PassResult(merged > 0, merged)
