"""A Split of the last axis whose parts only vector work reads → one slice per part.

A Split is a launch of its own: it copies every part of its operand to a buffer of the
part's own. When each part is read only by ops a vector kernel computes (elementwise work,
reductions, scans; through views), each part is instead a ``StridedSlice`` of the last
axis, which the kernel reading it loads in place as columns of its rows: no launch, no copy.
A state-space layer's ``x_proj`` output cut into ``dt``, ``B`` and ``C`` (each normalised,
FalconMamba) and Mamba2's convolved ``x``, ``B`` and ``C`` are read so. A part that a matrix
product, a convolution or another operator reads keeps the Split (a slice would be a launch
of its own for each such part, and no fewer launches than the one Split).
"""

from __future__ import annotations

from graphkernel import ops
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import RESHAPE_OPS, OpKind
from graphkernel.passes.rewrite import add_like
from graphkernel.registry import PassResult, counted

VECTOR_KINDS = (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.REDUCE)
SLICES = ("Slice", "StridedSlice")


def _vector_read(v: Value, outputs: set[int]) -> bool:
    """Whether every reader of ``v`` (through views) is vector work, and it has readers: not
    a graph output (a training forward keeps the parts for the backward graph; stored, each
    slice would be a launch of its own)."""
    if not v.users or id(v) in outputs:
        return False
    for u in v.users:
        if u.op in RESHAPE_OPS or u.op in SLICES:
            if not all(_vector_read(o, outputs) for o in u.outputs):
                return False
        elif u.op == "Concat":  # (a rotate-half's halves swapped)
            continue
        elif not ops.exists(u.op) or ops.get(u.op).kind not in VECTOR_KINDS or \
                u.op == "Gather" or u.graph is None:
            return False
    return True


def _parts(graph: Graph, n: Node) -> list[Value] | None:
    x = n.inputs[0]
    axis = n.attrs["axis"] % x.type.rank
    outputs = {id(v) for v in graph.outputs}
    if axis != x.type.rank - 1 or not x.dtype.is_float or \
            not all(_vector_read(o, outputs) for o in n.outputs):
        return None
    out, start = [], 0
    for size in n.attrs["sizes"]:
        out.append(add_like(graph, n, "StridedSlice", [x], {
            "begin": [start], "end": [start + size], "strides": [1], "axes": [axis]}))
        start += size
    return out


def split_slices(graph, ctx) -> PassResult:
    """Rewrite Split(x, last axis) → StridedSlice per part when only vector work reads it."""
    notes = []
    for n in list(graph.nodes):
        if n.graph is None or n.op != "Split" or not ctx.should_apply(
                f"{n.name} as slices", [n]):
            continue
        with graph.recording() as made:
            parts = _parts(graph, n)
        if parts is None:
            for m in reversed(made):
                graph.erase_node(m)
            continue
        for old, new in zip(n.outputs, parts, strict=True):
            graph.replace_all_uses(old, new)
        graph.erase_node(n)
        notes.append(f"{n.name}: {len(parts)} parts read in place as slices of the last axis")
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'Split')} read as slices")
