"""A Concat of strided slices that take every phase of some axes is a transpose.

A windowed vision model merges patches by taking ``x[:, 0::2, 0::2]``, ``x[:, 1::2, 0::2]``,
``x[:, 0::2, 1::2]`` and ``x[:, 1::2, 1::2]`` and concatenating them along the channels (Swin's
patch merging; the same space-to-depth as a detector's "Focus" layer or a pixel unshuffle).
As written that is one launch per slice (each a strided copy) and one for the Concat; the
code generator also loads each kernel input once, so the four views of one value never
share a kernel. Every element of ``x`` lands once in the result: splitting each sliced axis
``n·s`` into ``(n, s)``, the result is those phase axes moved in front of the Concat's axis,
one Transpose between two Reshapes (views). Exact: the same elements, moved.
"""

from __future__ import annotations

import itertools

from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import add_like, replace_with
from graphkernel.registry import PassResult, counted


def _phase(node: Node, src: Value) -> dict[int, tuple[int, int]] | None:
    """{axis: (stride, phase)} of a StridedSlice of ``src`` that takes, along each axis it
    slices, every ``stride``-th element from ``phase`` < ``stride`` to the end of an axis of a
    static size divisible by the stride; None for any other slice."""
    if node is None or node.op != "StridedSlice" or node.inputs[0] is not src:
        return None
    a = node.attrs
    rank = src.type.rank
    axes = a["axes"] if a["axes"] is not None else list(range(len(a["begin"])))
    strides = a["strides"] or [1] * len(a["begin"])
    out: dict[int, tuple[int, int]] = {}
    for b, e, s, ax in zip(a["begin"], a["end"], strides, axes, strict=True):
        ax = ax % rank
        d = src.shape[ax]
        if ax in out or not isinstance(d, int) or s < 1 or d % s or not 0 <= b < s \
                or e < d:
            return None
        if s > 1:
            out[ax] = (s, b)
    return out


def _order(phases: list[dict[int, tuple[int, int]]], axes: list[int]) -> list[int] | None:
    """The sliced axes from the slowest-varying phase to the fastest when the Concat's
    operands enumerate every combination of phases once, in that order; else None."""
    strides = [phases[0][ax][0] for ax in axes]
    seen = [tuple(p[ax][1] for ax in axes) for p in phases]
    for perm in itertools.permutations(range(len(axes))):
        want = itertools.product(*(range(strides[k]) for k in perm))
        if [tuple(t[k] for k in perm) for t in seen] == list(want):
            return [axes[k] for k in perm]
    return None


def _rewrite(graph: Graph, cat: Node) -> Value | None:
    ins = cat.inputs
    src = ins[0].producer.inputs[0] if ins[0].producer is not None and \
        ins[0].producer.inputs else None
    if src is None or len(ins) < 2:
        return None
    phases = [_phase(x.producer, src) for x in ins]
    if any(p is None for p in phases) or not phases[0]:
        return None
    axes = sorted(phases[0])
    if any(sorted(p) != axes or any(p[ax][0] != phases[0][ax][0] for ax in axes)
           for p in phases):
        return None
    rank, c = src.type.rank, cat.attrs["axis"] % src.type.rank
    if c in axes:
        return None
    order = _order(phases, axes)
    if order is None:
        return None
    # split each sliced axis ax into (n, s): position of the n and s parts in the split shape
    split_shape: list = []
    where: dict[int, tuple[int, int]] = {}
    for ax in range(rank):
        d = src.shape[ax]
        if ax in axes:
            s = phases[0][ax][0]
            where[ax] = (len(split_shape), len(split_shape) + 1)
            split_shape += [d // s, s]
        else:
            where[ax] = (len(split_shape), -1)
            split_shape.append(d)
    perm: list[int] = []
    for ax in range(rank):
        if ax == c:
            perm += [where[o][1] for o in order]
        perm.append(where[ax][0])
    split = add_like(graph, cat, "Reshape", [src], {"shape": split_shape})
    moved = add_like(graph, cat, "Transpose", [split], {"perm": perm})
    return add_like(graph, cat, "Reshape", [moved], {"shape": list(cat.outputs[0].shape)})


def slice_phases(graph, ctx) -> PassResult:
    """Rewrite cat(x[p1::s], …, x[pk::s]) -> reshape(T(reshape(x))) when the slices take
    every phase of their axes once, in an order a transpose keeps, along axes other than the
    Concat's."""
    notes = []
    for node in list(graph.nodes):
        if node.graph is None or node.op != "Concat":
            continue
        mark = len(graph)
        new = _rewrite(graph, node)
        if new is None or not ctx.should_apply(f"transpose {node.name}", [node]):
            for extra in reversed(graph.nodes[mark:]):  # what a refused rewrite added
                graph.erase_node(extra)
            continue
        slices = [x.producer for x in node.inputs]
        replace_with(graph, node, new)
        for s in slices:
            if s.graph is not None and not s.outputs[0].uses and not graph.is_output(
                    s.outputs[0]):
                graph.erase_node(s)
        notes.append(f"{node.name}: every phase of a strided slice, a Transpose")
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'concat')} of strided slices made transposes")
