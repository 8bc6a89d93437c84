"""Common subexpression elimination."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.ir import DType, Node
from graphkernel.passes.rewrite import merge_origin, replace_with
from graphkernel.registry import PassResult
from graphkernel.structure import attrs_key

_NEVER = {"Assign", "Opaque"}  # side effects, or external code we cannot compare


def node_key(node: Node) -> tuple:
    return (node.op, tuple(map(id, node.inputs)), attrs_key(node.attrs))


def sample_key(const: Node) -> tuple:
    """A key equal for equal constants, cheap to make: element type, shape and the first and
    last few elements. Only constants whose sample keys meet are digested (``node_key``):
    the weights of a model, all different, are never read whole."""
    a = const.attrs["value"]
    flat = a.reshape(-1)
    return (DType.parse(a.dtype), a.shape, flat[:4].tobytes(), flat[-4:].tobytes())


def cse(graph, ctx) -> PassResult:
    """Rewrite a node -> an earlier identical node (same op, inputs and attributes)."""
    seen: dict[tuple, Node] = {}
    undigested: dict[tuple, Node | None] = {}  # sample key -> its first constant, if alone
    merged = 0
    for node in graph.nodes:
        if node.op in _NEVER or (node.op != "GraphKernel" and ops.get(node.op).writes):
            continue
        if node.op == "Constant":
            sample = sample_key(node)
            if sample not in undigested:
                undigested[sample] = node  # nothing to compare with yet
                continue
            first = undigested[sample]
            if first is not None:  # a second constant like it: key the first one now
                seen[node_key(first)] = first
                undigested[sample] = None
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
