"""Elementwise work a scan reads broadcast, computed in the scan's own shape (its prologue).

A selective scan's step size is ``softplus(dt_proj(x) + bias)``, one value per token and
channel, then broadcast over the state (``dt[..., None] * A``, ``dt[..., None] * B * x``)
into the values the Scan combines. Its softplus (``Log1p``, a comparison and a ``Select``)
is no matrix-product epilogue, and computed in its own smaller shape it cannot join the scan's
kernel either (the vector generator places a value smaller than the loop space only as one
per row, per column or a scalar, and the bias varies along the channels, neither): it is a
launch of its own whose result goes to GM and back.

Computed on the value broadcast first, the work has the scan's shape: each element of it is
the same function of the same operands (elementwise ops commute with a broadcast:
``f(broadcast(x)) = broadcast(f(x))``, exactly, in every element), so the Scan's kernel runs
it on the loaded broadcast rows, N times over (N the broadcast extent, the state size), and
the launch and the round trip are gone. Only work that a product's epilogue could not run
is moved (otherwise it stays for the product's kernel), and only where everything reading
the broadcast is elementwise work of the scan's shape that flows into the Scan.

The same work in a smaller shape that the ops of the scan's shape broadcast themselves (no
ExpandDims: a gated recurrence's ``exp(gate * softplus(param))``, the softplus of a
per-channel parameter ``[W]`` read by a Mul over ``[B, L, W]``) is computed on its operands
of its own shape broadcast to the scan's (constants and scalars stay as they are: the ops
broadcast them as before; an operand of another computed shape leaves the work alone), when
everything reading it is elementwise work of the scan's shape flowing into the Scan.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops, symbolic
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import OpKind
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(symbolic.eq(x, y) for x, y in zip(a, b))


def _elementwise(n: Node) -> bool:
    return ops.exists(n.op) and ops.get(n.op).kind == OpKind.ELEMWISE and len(n.outputs) == 1


def _feeds(u: Node, scan: Node, shape) -> bool:
    """Whether ``u``'s result reaches ``scan`` through elementwise work of ``shape``."""
    stack, seen = [u], set()
    while stack:
        n = stack.pop()
        for v in n.outputs:
            for w in v.users:
                if w is scan:
                    return True
                if id(w) not in seen and _elementwise(w) and \
                        _same_shape(w.outputs[0].shape, shape):
                    seen.add(id(w))
                    stack.append(w)
    return False


def _cone(e: Node) -> list[Node]:
    """The elementwise work above ``e``'s operand that only ``e`` (through it) reads, in
    graph order."""
    w = e.inputs[0]
    if w.producer is None or not _elementwise(w.producer) or len(w.users) != 1:
        return []
    return _closure(w.producer)


def _closure(top: Node) -> list[Node]:
    """``top`` and the elementwise work above it that only this set reads, in graph order."""
    cone = {id(top): top}
    changed = True
    while changed:
        changed = False
        for n in list(cone.values()):
            for x in n.inputs:
                p = x.producer
                if p is None or id(p) in cone or not _elementwise(p) or \
                        not all(id(u) in cone for u in x.users):
                    continue
                cone[id(p)] = p
                changed = True
    order = {id(n): i for i, n in enumerate(top.graph.nodes)}
    return sorted(cone.values(), key=lambda n: order[id(n)])


def _no_epilogue(cone: list[Node]) -> bool:
    from graphkernel.patterns.matmul import _epilogue_op

    return any(not _epilogue_op(n) for n in cone)


def _candidate(e: Node, scans: list[Node]) -> tuple[list[Node], tuple] | None:
    """(the cone, the scan's shape) when ExpandDims ``e`` is read only by elementwise work of
    a Scan's shape flowing into that Scan, and the cone above it holds work no product
    epilogue runs; else None."""
    out = e.outputs[0]
    if not out.users or e.graph.is_output(out):
        return None
    for scan in scans:
        shape = tuple(scan.outputs[0].shape)
        if len(shape) != out.type.rank:
            continue
        if all(_elementwise(u) and _same_shape(u.outputs[0].shape, shape) and
               _feeds(u, scan, shape) for u in out.users):
            cone = _cone(e)
            if cone and _no_epilogue(cone):
                return cone, shape
    return None


def _rewrite(graph: Graph, e: Node, cone: list[Node], shape: tuple) -> bool:
    w = e.inputs[0]
    inside = {id(n) for n in cone}
    leaves: list[Value] = []
    for n in cone:
        for x in n.inputs:
            if (x.producer is None or id(x.producer) not in inside) and \
                    all(x is not y for y in leaves):
                leaves.append(x)
    full = [x for x in leaves if _same_shape(x.shape, w.shape)]
    if not full or any(x.type.rank > w.type.rank for x in leaves):
        return False
    if any(x.type.rank and const_array(x) is None and all(x is not y for y in full)
           for x in leaves):
        return False  # a computed or input operand smaller than the value (a training
        #               graph's bias): broadcast along the state, no kernel places it
    axes = list(e.attrs["axis"])
    rank = w.type.rank
    vmap: dict[int, Value] = {}
    for x in leaves:
        if x.type.rank == 0:
            vmap[id(x)] = x  # a scalar broadcasts as it is
            continue
        padded = (1,) * (rank - x.type.rank) + tuple(x.shape)
        arr = const_array(x)
        if arr is not None:  # a constant: the same values at the expanded shape
            tmp = np.reshape(arr, padded)
            for a in sorted(ax % (rank + len(axes)) for ax in axes):
                tmp = np.expand_dims(tmp, a)
            last = shape[-1]
            if tmp.shape[-1] == 1 and isinstance(last, int) and last > 1:
                # spread along the rows the scan's kernel loads (a per-channel bias over the
                # state): a value broadcast along a row is not one it can place
                tmp = np.repeat(tmp, last, axis=-1)
            vmap[id(x)] = graph.add_node("Constant", [], {"value": np.ascontiguousarray(tmp)},
                                         name=graph.fresh_name(f"{x.name}_expanded"),
                                         origin=x.producer.origin).outputs[0]
            continue
        v = x if x.type.rank == rank else add_like(graph, e, "Reshape", [x],
                                                   {"shape": list(padded)})
        v = add_like(graph, e, "ExpandDims", [v], dict(e.attrs))
        if any(x is y for y in full):
            v = add_like(graph, e, "BroadcastTo", [v], {"shape": list(shape)})
        vmap[id(x)] = v
    for n in cone:
        new = add_like(graph, n, n.op, [vmap.get(id(x), x) for x in n.inputs], dict(n.attrs))
        vmap[id(n.outputs[0])] = new
    graph.replace_all_uses(e.outputs[0], vmap[id(w)])
    graph.erase_node(e)
    for n in reversed(cone):
        graph.erase_node(n)
    return True


# ------------------------------------------------------------ broadcast by the op reading it


def _smaller_operand(x: Value, scan: Node, shape: tuple) -> list[Node] | None:
    """The cone above ``x`` when ``x`` is computed elementwise in a smaller shape and read,
    broadcast by the ops themselves (no ExpandDims: ``gate * softplus(param)``), only by
    elementwise work of the scan's shape flowing into the scan; else None."""
    p = x.producer
    if p is None or not _elementwise(p) or x.graph.is_output(x) or \
            _same_shape(x.shape, shape) or x.type.rank > len(shape) or not x.users:
        return None
    if not all(_elementwise(u) and _same_shape(u.outputs[0].shape, shape) and
               (u is scan or _feeds(u, scan, shape)) for u in x.users):
        return None
    nodes = _closure(p)
    return nodes if _no_epilogue(nodes) else None


def _rewrite_smaller(graph: Graph, x: Value, cone: list[Node], shape: tuple) -> bool:
    """The cone computed on its operands broadcast to the scan's shape (operands of ``x``'s
    shape; constants and scalars broadcast by the ops as before)."""
    inside = {id(n) for n in cone}
    vmap: dict[int, Value] = {}
    rank = len(shape)
    for n in cone:
        for v in n.inputs:
            if (v.producer is not None and id(v.producer) in inside) or id(v) in vmap:
                continue
            if const_array(v) is not None or v.type.rank == 0:
                vmap[id(v)] = v
                continue
            if not _same_shape(v.shape, x.shape):
                return False  # a computed operand of another shape: left as it is
            w = v if v.type.rank == rank else add_like(
                graph, n, "Reshape", [v], {"shape": [1] * (rank - v.type.rank) + list(v.shape)})
            vmap[id(v)] = add_like(graph, n, "BroadcastTo", [w], {"shape": list(shape)})
    for n in cone:
        vmap[id(n.outputs[0])] = add_like(graph, n, n.op, [vmap.get(id(v), v) for v in n.inputs],
                                          dict(n.attrs))
    new = vmap[id(x)]
    if not _same_shape(new.shape, shape):
        return False
    graph.replace_all_uses(x, new)
    return True


def _implicit(graph: Graph, scans: list[Node], ctx) -> list[str]:
    notes = []
    for scan in scans:
        shape = tuple(scan.outputs[0].shape)
        region, stack = set(), [scan]
        while stack:  # the elementwise work of the scan's shape flowing into it
            n = stack.pop()
            for v in n.inputs:
                q = v.producer
                if q is not None and id(q) not in region and _elementwise(q) and \
                        _same_shape(q.outputs[0].shape, shape):
                    region.add(id(q))
                    stack.append(q)
        for n in [m for m in graph.nodes if id(m) in region or m is scan]:
            for x in list(dict.fromkeys(n.inputs)):
                cone = _smaller_operand(x, scan, shape)
                if cone is None or not ctx.should_apply(
                        f"{x.name}: computed in the scan's shape", [x.producer]):
                    continue
                with graph.recording() as made:
                    ok = _rewrite_smaller(graph, x, cone, shape)
                if not ok:
                    for m in reversed(made):
                        graph.erase_node(m)
                    continue
                for m in reversed(cone):
                    if not any(v.users or graph.is_output(v) for v in m.outputs):
                        graph.erase_node(m)
                notes.append(f"{x.name}: {len(cone)} ops computed in the scan's shape "
                             f"{list(shape)} (read broadcast by the ops)")
    return notes


def scan_prologue(graph, ctx) -> PassResult:
    """Rewrite elementwise work a Scan reads broadcast (and no product epilogue runs) →
    the same work on the broadcast value, in the scan's shape, so the scan's kernel runs it."""
    scans = [n for n in graph.nodes if n.op == "Scan"]
    if not scans:
        return PassResult(False, 0, [])
    notes = []
    for e in [n for n in graph.nodes if n.op == "ExpandDims"]:
        if e.graph is None:
            continue
        found = _candidate(e, scans)
        if found is None or not ctx.should_apply(f"{e.name}: computed in the scan's shape",
                                                 [e]):
            continue
        cone, shape = found
        with graph.recording() as made:
            ok = _rewrite(graph, e, cone, shape)
        if not ok:
            for m in reversed(made):
                graph.erase_node(m)
            continue
        notes.append(f"{e.name}: {len(cone)} ops computed in the scan's shape {list(shape)}")
    notes += _implicit(graph, [n for n in graph.nodes if n.op == "Scan"], ctx)
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'broadcast operand')} computed in a scan's shape")
