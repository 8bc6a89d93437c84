"""Split a kernel that needs several passes over its rows into phase kernels.

Softmax over a row too long for the UB needs the row's maximum before it can exponentiate,
and the sum of the exponentials before it can divide: three passes. Each pass is a kernel
the schedule handles on its own. A node's phase is the number of reductions on its longest
path from the kernel's inputs (a reduction's result is complete only one pass later):

    phase 0: m = ReduceMax(x)
    phase 1: s = ReduceSum(Exp(x - m))          m read from GM, one value per row
    phase 2: y = Exp(x - m) / s                 m, s read from GM

Phase k's kernel computes the reductions of phase k and every node of phase k or lower they
need, except earlier reductions (their results are inputs); the last kernel computes what is
left. What two phases need is recomputed (the inputs are re-read once per phase, never a
full-size intermediate), so each phase kernel reads only its own inputs and the reduced
values of earlier phases: the reduced values are the GM workspace between the passes.
"""

from __future__ import annotations

from collections.abc import Callable

from graphkernel.builder import Builder
from graphkernel.codegen.vector.decompose import nonzero
from graphkernel.codegen.vector.schedule import REDUCE_OPS
from graphkernel.ir import Graph, Node, Value
from graphkernel.kernels import build_kernel, unfuse
from graphkernel.ops import VIEW_OPS


def phases(nodes: list[Node]) -> dict[int, int]:
    """id(node) -> its phase (nodes in topological order)."""
    ph: dict[int, int] = {}
    for n in nodes:
        p = 0
        for v in n.inputs:
            q = v.producer
            if q is not None and id(q) in ph:  # a view of a result is part of its phase
                p = max(p, ph[id(q)] + (1 if q.op in REDUCE_OPS and n.op not in VIEW_OPS
                                        else 0))
        ph[id(n)] = p
    return ph


def _runs(n: Node) -> list[list[int]]:
    """The runs of adjacent reduced axes of a reduction over more than one run, else []."""
    if n.op not in REDUCE_OPS or not n.attrs.get("axis"):
        return []
    rank = len(n.inputs[0].shape)
    axes = sorted(a % rank for a in n.attrs["axis"])
    runs = [[axes[0]]]
    for a in axes[1:]:
        if a == runs[-1][-1] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs if len(runs) > 1 else []


def _split_runs(graph: Graph, n: Node) -> list[Node]:
    """R(x, [0, 2, 3]) as R(R(x, [2, 3], keep_dims), [0]): the last run first (a reduction
    over one run is generated), the others one phase later. Returns the new nodes."""
    runs = _runs(n)
    b = Builder(graph, origin=n.origin, prefix=n.name)
    inner = b.op(n.op, n.inputs[0], axis=runs[-1], keep_dims=True)
    rest = [a for r in runs[:-1] for a in r]
    out = b.op(n.op, inner, axis=rest, keep_dims=bool(n.attrs.get("keep_dims")))
    if tuple(out.shape) != tuple(n.outputs[0].shape):
        out = b.reshape(out, list(n.outputs[0].shape))
    graph.replace_all_uses(n.outputs[0], out)
    graph.erase_node(n)
    return [m for m in b.created if m.op != "Constant"]


def _needed(targets: list[Node], members: dict[int, Node], stop: set[int]) -> set[int]:
    """The targets and their ancestors among ``members``, not crossing ``stop``."""
    out: set[int] = set()
    todo = list(targets)
    while todo:
        n = todo.pop()
        if id(n) in out:
            continue
        out.add(id(n))
        for v in n.inputs:
            q = v.producer
            if q is not None and id(q) in members and id(q) not in stop and id(q) not in out:
                todo.append(q)
    return out


def split_phases(graph: Graph, kernel: Node, name_for: Callable[[list[Node]], str]
                 ) -> list[Node]:
    """Replace ``kernel`` by its phase kernels (in order); [] when it has one phase."""
    body = [n for n in kernel.subgraph.nodes if n.op != "Constant"]
    if max(phases(body).values(), default=0) == 0 and not any(_runs(n) for n in body):
        return []
    nodes = []
    for n in unfuse(graph, kernel):
        nodes += _split_runs(graph, n) if _runs(n) else [n] if n.op != "Constant" else []
    members = {id(n): n for n in nodes}
    ph = phases(nodes)
    last = max(ph.values(), default=0)
    if last == 0:
        return []
    reductions = {id(n) for n in nodes if n.op in REDUCE_OPS}
    outs = {id(v) for v in graph.outputs}
    used_outside = {id(n) for n in nodes for v in n.outputs
                    if id(v) in outs or any(id(u) not in members for u in v.users)}
    sets = []
    for k in range(last + 1):  # phase k: its reductions and results; the last: what is left
        targets = [n for n in nodes if ph[id(n)] == k and (
            k == last or id(n) in reductions or id(n) in used_outside)]
        earlier = {i for i in reductions if ph[i] < k}
        sets.append(_needed(targets, members, earlier))
    owner = {i: max(k for k, s in enumerate(sets) if i in s) for s in sets for i in s}
    kernels = []
    for k, s in enumerate(sets):
        vmap: dict[int, Value] = {}
        group = []
        for n in nodes:  # a node another phase owns is recomputed here by a copy
            if id(n) not in s:
                continue
            if owner[id(n)] == k:
                group.append(n)
                continue
            ins = [vmap.get(id(v), v) for v in n.inputs]
            c = graph.add_node(n.op, ins, n.attrs, name=graph.fresh_name(n.name),
                               origin=n.origin)
            for old, new in zip(n.outputs, c.outputs, strict=True):
                vmap[id(old)] = new
            group.append(c)
        for n in group:  # originals of this phase read this phase's copies
            for i, v in enumerate(n.inputs):
                if id(v) in vmap:
                    graph.replace_input(n, i, vmap[id(v)])
        kernels.append(build_kernel(graph, group, name_for(group),
                                    f"{kernel.attrs['pattern']}/phase{k + 1}"))
    return kernels


def split_whole_reduction(graph: Graph, kernel: Node, parts: int,
                          name_for: Callable[[list[Node]], str]) -> list[Node]:
    """A kernel that reduces every element to one value (one row: one core) as two kernels:
    ``parts`` rows of partial reductions (one per core), then the reduction of the partials
    and what follows it. [] when the kernel does not have that shape."""
    body = [n for n in kernel.subgraph.nodes if n.op != "Constant"]
    red = [n for n in body if n.op in REDUCE_OPS or n.op == "ElemAny"]
    if not red or any(not isinstance(n.inputs[0].type.numel, int) for n in red):
        return []
    N = red[0].inputs[0].type.numel
    if any(n.inputs[0].type.numel != N or n.outputs[0].type.numel != 1 for n in red) or N % parts:
        return []
    late = _needed_by_uses(body, {id(n) for n in red})
    if any(n.outputs[0].type.numel == N for n in body if id(n) in late):
        return []  # a full-size value after the reduction: not two plain stages
    nodes = [n for n in unfuse(graph, kernel) if n.op != "Constant"]
    first: list[Node] = []
    second: list[Node] = []
    for n in nodes:
        if n.op not in REDUCE_OPS and n.op != "ElemAny":
            (second if any(v.producer is not None and any(v.producer is m for m in second)
                           for v in n.inputs) else first).append(n)
            continue
        b = Builder(graph, origin=n.origin, prefix=n.name)
        x = n.inputs[0]
        op = n.op
        if n.op == "ElemAny":  # the maximum of a 0/1 (codegen/vector/decompose.py)
            x, op = nonzero(b, x), "ReduceMax"
        rows = b.reshape(x, [parts, N // parts])
        part = b.op(op, rows, axis=[1], keep_dims=True)
        first += [m for m in b.created if m.op != "Constant"]
        b.created = []
        total = b.reshape(b.op(op, part, axis=[0, 1], keep_dims=False), list(n.outputs[0].shape))
        second += b.created
        graph.replace_all_uses(n.outputs[0], total)
        graph.erase_node(n)
    return [build_kernel(graph, group, name_for(group), f"{kernel.attrs['pattern']}/stage{k}")
            for k, group in ((1, first), (2, second)) if group]


def _needed_by_uses(body: list[Node], roots: set[int]) -> set[int]:
    """The nodes of ``body`` that depend on the ``roots`` (not the roots)."""
    late: set[int] = set()
    for n in body:
        if any(v.producer is not None and (id(v.producer) in roots or id(v.producer) in late)
               for v in n.inputs):
            late.add(id(n))
    return late
