"""Rewrite a ScatterElements whose indices repeat one index over the other axes → IndexPut
of whole slices at that 1-D index.

``x.index_add(0, rows, y)`` and ``x[rows] = y`` (a mixture of experts adding its experts'
rows back to their tokens, an embedding's gradient) put whole slices along one axis: the
frontends write them as an element-wise scatter whose index tensor is the 1-D index
broadcast over every other axis (``BroadcastTo(Reshape(rows, [1, .., n, .., 1]))``).
ScatterElements runs alone anyway, and the broadcast of integer indices is a launch of its
own (no vector kernel computes int64): both are the one vendor operator that puts slices at
a 1-D index (an IndexPut with one index tensor; accumulate for ``add``). Exact: element
``[.., i, ..]`` of the broadcast indices is ``rows[i]``, so ScatterElements writes (or
adds) update slice ``i`` at slice ``rows[i]`` of the data, in the same order (duplicate
indices: the last write wins, or all add, as before). Applied when the indices are a
BroadcastTo of a value with one non-unit axis, the scattered one, and the updates have the
indices' shape; anything else is left as it is.
"""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.ir import Graph, Node, Value
from graphkernel.registry import PassResult, counted


def _row_index(n: Node) -> Value | None:
    """The 1-D index (before its broadcast) of ScatterElements ``n``, or None."""
    data, idx, upd = n.inputs
    b = idx.producer
    if b is None or b.op != "BroadcastTo" or idx.type.rank < 2:
        return None
    v, axis = b.inputs[0], n.attrs["axis"] % data.type.rank
    if v.type.rank != idx.type.rank or upd.type.rank != idx.type.rank or \
            not all(map(symbolic.eq, upd.shape, idx.shape)):
        return None
    if any(d != 1 for i, d in enumerate(v.shape) if i != axis) or \
            not symbolic.eq(v.shape[axis], idx.shape[axis]):
        return None
    return v


def _rewrite(graph: Graph, n: Node, v: Value) -> Value:
    data, _, upd = n.inputs
    rows = graph.add_node("Reshape", [v], {"shape": [v.shape[n.attrs["axis"] % v.type.rank]]},
                          name=graph.fresh_name(f"{n.name}/rows"), origin=n.origin).outputs[0]
    return graph.add_node("IndexPut", [data, rows, upd],
                          {"axis": n.attrs["axis"], "reduction": n.attrs["reduction"]},
                          name=graph.fresh_name(f"{n.name}/slices"),
                          origin=n.origin).outputs[0]


def scatter_slices(graph, ctx) -> PassResult:
    """Rewrite ScatterElements(x, BroadcastTo(rows), y) → IndexPut(x, rows, y) when the
    broadcast repeats a 1-D index along the scattered axis over every other axis."""
    notes = []
    for n in list(graph.nodes):
        if n.graph is None or n.op != "ScatterElements":
            continue
        v = _row_index(n)
        if v is None:
            continue
        if not ctx.should_apply(f"ScatterElements {n.name} as IndexPut", [n]):
            continue
        bt = n.inputs[1].producer
        graph.replace_all_uses(n.outputs[0], _rewrite(graph, n, v))
        graph.erase_node(n)
        if not bt.outputs[0].uses and not graph.is_output(bt.outputs[0]):
            graph.erase_node(bt)  # (the broadcast indices: no launch of their own)
        notes.append(f"{n.name}: whole slices at a 1-D index (its broadcast dropped)")
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'scatter')} of whole slices as IndexPut")
