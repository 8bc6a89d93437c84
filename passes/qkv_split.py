"""Q, K and V sliced from one fused projection: the slices become one Split.

A fused QKV projection (Falcon's ``query_key_value``, BLOOM's) is cut into Q, K and V by
slices of one axis of its result — an axis other than the last, so no consumer kernel can
read a slice as columns of its rows. Each slice left for the attention operator to read is
a launch that copies its part; one Split writes all the parts in one launch.
"""

from __future__ import annotations

from graphkernel.ir import Graph, Node, Value

VIEWS = ("Reshape", "ExpandDims", "Squeeze", "Identity")


def _part(n: Node) -> tuple[int, int, int] | None:
    """(axis, start, stop) of a StridedSlice of one static axis with step 1, else None."""
    if n.op != "StridedSlice" or n.attrs["axes"] is None or len(n.attrs["axes"]) != 1:
        return None
    x = n.inputs[0]
    axis = n.attrs["axes"][0] % x.type.rank
    d = x.shape[axis]
    if (n.attrs["strides"] or [1])[0] != 1 or not isinstance(d, int):
        return None
    start, stop, _ = slice(n.attrs["begin"][0], n.attrs["end"][0]).indices(d)
    return (axis, start, stop) if stop > start else None


def sliced_source(v: Value) -> Node | None:
    """The StridedSlice ``v`` shows (through views), else None."""
    while v.producer is not None and v.producer.op in VIEWS:
        v = v.producer.inputs[0]
    return v.producer if v.producer is not None and v.producer.op == "StridedSlice" else None


def split_parts(graph: Graph, slices: list[Node]) -> list[str]:
    """Replace the slices of each value whose every reader is a slice of one axis (not the
    last) and that together tile that axis by one Split of it; ``slices`` are the slices the
    attention operator reads. Returns a note per Split made."""
    notes = []
    done: set[int] = set()
    for s in slices:
        x = s.inputs[0]
        if id(x) in done or s.graph is None or any(o is x for o in graph.outputs):
            continue
        done.add(id(x))
        readers = list(dict.fromkeys(x.users))
        parts = [_part(n) for n in readers]
        if len(readers) < 2 or None in parts or len({p[0] for p in parts}) != 1:
            continue
        axis = parts[0][0]
        if axis == x.type.rank - 1:
            continue
        order = sorted(range(len(readers)), key=lambda k: parts[k][1])
        bounds = [parts[k][1:] for k in order]
        if bounds[0][0] != 0 or bounds[-1][1] != x.shape[axis] or any(
                a[1] != b[0] for a, b in zip(bounds, bounds[1:], strict=False)):
            continue  # the slices overlap or leave a gap: not one Split
        node = graph.add_node("Split", [x], {"axis": axis, "sizes": [b - a for a, b in bounds]},
                              name=graph.fresh_name(f"{x.name}/split"),
                              origin=tuple(dict.fromkeys(o for n in readers for o in n.origin)))
        for k, out in zip(order, node.outputs, strict=True):
            graph.replace_all_uses(readers[k].outputs[0], out)
            graph.erase_node(readers[k])
        notes.append(f"{', '.join(readers[k].name for k in order)} of {x.name} made one "
                     f"Split along axis {axis}")
    return notes
