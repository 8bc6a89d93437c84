"""Common subexpression elimination.

Two slices are compared by the elements they take, not by how they are spelt: on an input of
static shape, ``x[..., -1:]``, ``x[..., 7:8]`` and ``x[..., 7:9223372036854775807]`` (a
``select`` of the last position, kept as a slice before its Squeeze) are one value, read
from the same places, so one of them is computed (a model that takes a scan's row totals
twice, once to subtract, once to pad, then needs one slice kernel, not two).
"""

from __future__ import annotations

from graphkernel import ops
from graphkernel.ir import DType, Node
from graphkernel.passes.rewrite import merge_origin, replace_with
from graphkernel.registry import PassResult
from graphkernel.structure import attrs_key

_NEVER = {"Assign", "Opaque"}  # side effects, or external code we cannot compare


def node_key(node: Node) -> tuple:
    if node.op == "StridedSlice":
        taken = slice_key(node)
        if taken is not None:
            return (node.op, tuple(map(id, node.inputs)), taken)
    return (node.op, tuple(map(id, node.inputs)), attrs_key(node.attrs))


def slice_key(node: Node) -> tuple | None:
    """The elements a StridedSlice of a static-shaped input takes, per axis it does not take
    whole: (axis, first index, count, step) with Python's clamping (the op's semantics); None
    when a dim is symbolic or the attributes do not parse (the spelt key is used)."""
    x = node.inputs[0]
    if not all(isinstance(d, int) for d in x.shape):
        return None
    a = node.attrs
    begin, end = a.get("begin"), a.get("end")
    strides = a.get("strides") or [1] * len(begin or ())
    axes = a.get("axes") if a.get("axes") is not None else list(range(len(begin or ())))
    if begin is None or end is None or not len(begin) == len(end) == len(strides) == len(axes):
        return None
    taken: dict[int, tuple[int, int, int]] = {}
    for b, e, s, ax in zip(begin, end, strides, axes, strict=True):
        if s == 0 or not -x.type.rank <= ax < x.type.rank:
            return None
        ax %= x.type.rank
        if ax in taken:
            return None  # (an axis listed twice: left to the spelt key)
        r = range(*slice(b, e, s).indices(x.shape[ax]))
        taken[ax] = (r.start, len(r), r.step) if len(r) > 1 else (r.start if r else 0,
                                                                     len(r), 1)
    return ("taken", tuple((ax, *t) for ax, t in sorted(taken.items())
                           if t != (0, x.shape[ax], 1)))


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
