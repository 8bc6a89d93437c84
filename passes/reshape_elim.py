"""Fold reshape chains and drop identity reshapes; split heads before a slice of them.

A slice of the last axis read by a Reshape that splits that axis into heads (Phi-3's fused
QKV projection: ``qkv[..., :q].view(B, S, N, D)``) is the same data as the heads split first
and a slice of whole heads (``qkv.view(B, S, (q + 2kv) / D, D)[:, :, :q / D]``) when the
slice starts and ends on head boundaries: pure data movement, exact. The vector kernels read
a slice of heads (an axis before the last) by rows; a slice inside the last axis that a
Reshape then splits leaves the code generator no row split, and the kernel falls back to one
launch per op.
"""

from __future__ import annotations

from graphkernel.ops import RESHAPE_OPS
from graphkernel.passes.rewrite import add_like, replace_with
from graphkernel.registry import PassResult


def _heads_of_slice(node) -> tuple[object, list, int, int, int] | None:
    """(x, the heads' shape of x, the first head, the end head, the axis) when ``node`` is a
    Reshape splitting the last axis of a step-1 StridedSlice of the last axis of ``x`` into
    [h, D], the slice starting and ending on multiples of D of a static axis divisible by D."""
    if node.op != "Reshape":
        return None
    sl = node.inputs[0].producer
    if sl is None or sl.op != "StridedSlice":
        return None
    x = sl.inputs[0]
    rank = x.type.rank
    a = sl.attrs
    axes = a.get("axes") or list(range(len(a["begin"])))
    if rank < 1 or len(axes) != 1 or axes[0] % rank != rank - 1 or \
            (a.get("strides") or [1])[0] != 1:
        return None
    length = x.shape[-1]
    out = node.outputs[0].shape
    if not isinstance(length, int) or len(out) != rank + 1 or \
            tuple(out[:rank - 1]) != tuple(x.shape[:-1]):
        return None
    d = out[-1]
    begin, end = a["begin"][0], a["end"][0]
    begin = min(max(begin + length if begin < 0 else begin, 0), length)
    end = min(max(end + length if end < 0 else end, 0), length)
    if not isinstance(d, int) or d <= 0 or length % d or begin % d or end % d or \
            end <= begin or (end - begin) // d != out[-2]:
        return None
    return x, [*x.shape[:-1], length // d, d], begin // d, end // d, rank - 1


def reshape_elim(graph, ctx) -> PassResult:
    """Rewrite reshape(x) -> x when shapes match; reshape(reshape(x)) -> reshape(x); a head
    split of a slice of the last axis -> a slice of whole heads."""
    changed = 0
    for node in graph.nodes:
        if node.graph is None or (m := _heads_of_slice(node)) is None:
            continue
        x, shape, first, last, axis = m
        if ctx.should_apply(f"heads before the slice of {node.name}", [node]):
            heads = add_like(graph, node, "Reshape", [x], {"shape": shape})
            new = add_like(graph, node, "StridedSlice", [heads], {
                "begin": [first], "end": [last], "strides": [1], "axes": [axis]})
            replace_with(graph, node, new)
            changed += 1
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
