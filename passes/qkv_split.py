"""Q, K and V sliced from one fused projection: the slices become one Split.

A fused QKV projection (Falcon's ``query_key_value``, BLOOM's) is cut into Q, K and V by
slices of one axis of its result — an axis other than the last, so no consumer kernel can
read a slice as columns of its rows — or of the last axis when only the attention operator
reads the parts (GPT-BigCode's ``split`` into Q and one K and V head: the extern operator
reads whole rows, never columns). Each slice left for the attention operator to read is
a launch that copies its part; one Split writes all the parts in one launch. When Q and K
are then rotated alike (the same per-head work), the rotation runs once on the whole value
before the Split, ``Select(heads of Q and K, rotated, value)`` keeping V's heads exactly as
they were: one kernel instead of one per operand. The heads may span two axes (Falcon's
grouped projection [B, S, N2, G + 2, D], cut along G): the work sees them merged into one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.ops import VIEW_OPS
from graphkernel.passes.head_layout import Rebuild


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


@dataclass
class Built:
    """An operand's elementwise work rebuilt in BSND: what built it, the value it made, and
    the [B, S, N, D] value it read in place of the head split."""

    work: Rebuild
    value: Value
    source: Value


def sliced_source(v: Value) -> Node | None:
    """The StridedSlice ``v`` shows (through views), else None."""
    while v.producer is not None and v.producer.op in VIEW_OPS:
        v = v.producer.inputs[0]
    return v.producer if v.producer is not None and v.producer.op == "StridedSlice" else None


def split_parts(graph: Graph, slices: list[Node], built: list[Built]) -> list[str]:
    """Replace the slices of each value whose every reader is a slice of one axis (not the
    last) and that together tile that axis by one Split of it; ``slices`` are the slices the
    attention operator reads. When two or more parts are read by the same per-head work
    (``built``: Q's and K's rotary embedding), that work runs once on the whole value before
    the Split, a Select keeping the other parts' heads as they were. Returns a note per Split
    made."""
    notes = []
    done: set[int] = set()
    for s in slices:
        x = s.inputs[0]
        if id(x) in done or s.graph is None or graph.is_output(x):
            continue
        done.add(id(x))
        readers = list(dict.fromkeys(x.users))
        parts = [_part(n) for n in readers]
        if len(readers) < 2 or None in parts or len({p[0] for p in parts}) != 1:
            continue
        axis = parts[0][0]
        if axis == x.type.rank - 1 and not all(
                _operator_only(graph, r.outputs[0]) for r in readers):
            continue  # columns a kernel reads in place (no copy): not copied apart
        order = sorted(range(len(readers)), key=lambda k: parts[k][1])
        bounds = [parts[k][1:] for k in order]
        if bounds[0][0] != 0 or bounds[-1][1] != x.shape[axis] or any(
                a[1] != b[0] for a, b in zip(bounds, bounds[1:], strict=False)):
            continue  # the slices overlap or leave a gap: not one Split
        origin = tuple(dict.fromkeys(o for n in readers for o in n.origin))
        works = {id(r): b for r in readers for b in built if _reads(b.source, r.outputs[0])}
        whole, note = _together(graph, x, axis, [readers[k] for k in order], works, origin)
        node = graph.add_node("Split", [whole], {"axis": axis,
                                                 "sizes": [b - a for a, b in bounds]},
                              name=graph.fresh_name(f"{x.name}/split"), origin=origin)
        for k, out in zip(order, node.outputs, strict=True):
            done_by = works.get(id(readers[k])) if note else None
            old = done_by.value if done_by else readers[k].outputs[0]
            if old.type.shape != out.type.shape:  # the work's heads in one axis: a view
                out = graph.add_node("Reshape", [out], {"shape": list(old.type.shape)},
                                     name=graph.fresh_name(f"{out.name}/heads"),
                                     origin=origin).outputs[0]
            graph.replace_all_uses(old, out)
        for r in readers:
            if not r.outputs[0].uses:
                graph.erase_node(r)
        notes.append(f"{', '.join(readers[k].name for k in order)} of {x.name} made one "
                     f"Split along axis {axis}" + note)
    return notes


def _operator_only(graph: Graph, v: Value, depth: int = 0) -> bool:
    """Whether ``v`` is read only by attention operators (through views; readers left dead
    by the rewrite do not count): an extern operator reads whole rows, never columns of a
    wider value, so the parts of a last axis it reads are copies anyway — one Split makes
    them all in one launch."""
    if graph.is_output(v) or depth > 8:
        return False
    for u in v.users:
        if u.op in ("FusedAttention", "FusedAttentionGrad") or _dead(graph, u):
            continue
        if u.op not in VIEW_OPS or not all(  # (a live Transpose reads columns in place)
                _operator_only(graph, o, depth + 1) for o in u.outputs):
            return False
    return True


def _dead(graph: Graph, n: Node, depth: int = 0) -> bool:
    """Whether nothing live reads ``n``'s results (what a rewrite replaced, before the dead
    nodes are removed)."""
    return depth <= 16 and not any(graph.is_output(o) for o in n.outputs) and all(
        _dead(graph, u, depth + 1) for o in n.outputs for u in o.users)


def _reads(source: Value, part: Value) -> bool:
    """Whether ``source`` is ``part`` or a reshape view of it (a part of [B, S, N2, G, D]
    read as [B, S, N2·G, D])."""
    p = source.producer
    return source is part or (p is not None and p.op == "Reshape" and p.inputs[0] is part)


def _together(graph: Graph, x: Value, axis: int, parts: list[Node], works: dict[int, Built],
              origin: tuple) -> tuple[Value, str]:
    """(the value to split, a note): ``x`` itself, or — when two or more parts are read by
    the same per-head work — Select(heads of those parts, the work on all of x, x). ``x``
    is [B, S, heads..., D]: the heads in one axis, or in several (Falcon's grouped QKV
    [B, S, N2, G + 2, D], cut along G), which the work sees merged into one."""
    done = list(works.values())
    first = done[0].work if done else None
    heads = tuple(x.shape[2:-1])
    if len(done) < 2 or x.type.rank < 4 or not 2 <= axis < x.type.rank - 1 \
            or not all(isinstance(h, int) for h in (*heads, x.shape[-1])) \
            or not first.per_head() or not all(first.same_work(b.work) for b in done[1:]):
        return x, ""
    # [1, 1, heads..., D]: whole rows (a kernel's rows are the D elements of a head)
    mine = np.zeros((1, 1, *heads, x.shape[-1]), bool)
    at = 0
    for p in parts:
        width = p.outputs[0].shape[axis]
        cut = [slice(None)] * mine.ndim
        cut[axis] = slice(at, at + width)
        mine[tuple(cut)] = id(p) in works
        at += width
    rows = [*x.shape[:2], int(np.prod(heads)), x.shape[-1]]
    flat = x if x.type.rank == 4 else graph.add_node(
        "Reshape", [x], {"shape": rows}, name=graph.fresh_name(f"{x.name}/heads"),
        origin=origin).outputs[0]
    work = first([], on=flat)
    mine = mine.reshape(1, 1, *rows[2:])
    whole = graph.add_node("Select", [graph.const(mine, DType.bool, origin=origin), work,
                                      flat],
                           name=graph.fresh_name(f"{x.name}/heads"), origin=origin).outputs[0]
    if x.type.rank != 4:
        whole = graph.add_node("Reshape", [whole], {"shape": list(x.type.shape)},
                               name=graph.fresh_name(f"{x.name}/heads"),
                               origin=origin).outputs[0]
    names = ", ".join(p.name for p in parts if id(p) in works)
    return whole, f"; the work on {names} done once on all of {x.name} before it"
