"""Rewrite axis attributes to their canonical form: non-negative, sorted, explicit."""

from __future__ import annotations

from typing import Any

from graphkernel.ir import Node
from graphkernel.opdefs.reduce import reduce_axes
from graphkernel.registry import PassResult

_REDUCE = {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"}
_INT_AXIS = {"ArgMax", "ArgMin", "Concat", "Split", "Gather", "CumSum"}


def _wrap(axis: int, rank: int) -> int:
    """A checked axis as an index; a 0-d tensor's axes 0 and -1 are its one position, 0."""
    return axis % rank if rank else 0


def normalized(node: Node) -> dict[str, Any] | None:
    """The node's attrs in canonical form, or None when they already are."""
    a = dict(node.attrs)
    rank = node.inputs[0].type.rank if node.inputs else 0
    if node.op in _REDUCE:
        a["axis"] = reduce_axes(rank, a["axis"])
    elif node.op in _INT_AXIS:
        a["axis"] = _wrap(a["axis"], rank)
    elif node.op == "OneHot":
        a["axis"] = a["axis"] % (rank + 1)
    elif node.op == "ExpandDims":
        out_rank = node.outputs[0].type.rank
        a["axis"] = sorted(x % out_rank for x in a["axis"])
    elif node.op == "Squeeze":
        shape = node.inputs[0].type.shape
        a["axis"] = ([i for i, d in enumerate(shape) if d == 1] if a["axis"] is None
                     else sorted(_wrap(x, rank) for x in a["axis"]) if rank else [])
    elif node.op == "StridedSlice":
        axes = a["axes"] if a["axes"] is not None else list(range(len(a["begin"])))
        a["axes"] = [_wrap(x, rank) for x in axes]
        a["strides"] = a["strides"] or [1] * len(a["begin"])
    elif node.op == "BroadcastTo":
        a["shape"] = list(node.outputs[0].type.shape)
    else:
        return None
    return a if a != node.attrs else None


def axis_normalize(graph, ctx) -> PassResult:
    """Rewrite negative axes to positive, sort reduce axes, make implicit axes explicit."""
    changed = 0
    for node in graph.nodes:
        new = normalized(node)
        if new is not None and ctx.should_apply(f"{node.name} ({node.op})", [node]):
            node.attrs = new
            changed += 1
    return PassResult(changed > 0, changed)
