"""Helpers shared by rewrite passes: constant inspection, node replacement and connected
regions of nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from graphkernel.ir import Graph, Node, Value


def const_array(v: Value) -> np.ndarray | None:
    """The array of a value produced by a Constant node, else None."""
    p = v.producer
    if p is not None and p.op == "Constant":
        return p.attrs["value"]
    return None


def splat(v: Value) -> float | None:
    """The single value of a constant whose elements are all equal (a "splat"), else None."""
    arr = const_array(v)
    if arr is None or arr.size == 0:
        return None
    if arr.size == 1:  # (most constants: a scalar, read without an array made of it)
        first = float(arr.reshape(-1)[0])
        return None if first != first else first
    flat = arr.reshape(-1).astype(np.float64) if arr.dtype.kind != "b" else arr.reshape(-1)
    first = flat[0]
    if np.all(flat == first) and not (isinstance(first, float) and np.isnan(first)):
        return float(first)
    return None


def replace_with(graph: Graph, node: Node, new: Value | list[Value]) -> None:
    """Redirect every use of ``node``'s outputs to ``new`` and erase ``node`` when dead."""
    news = new if isinstance(new, list) else [new]
    for old, rep in zip(node.outputs, news, strict=True):
        graph.replace_all_uses(old, rep)
    if not any(v.uses or graph.is_output(v) for v in node.outputs):
        graph.erase_node(node)


def add_like(graph: Graph, node: Node, op: str, inputs: list[Value],
             attrs: dict[str, Any] | None = None) -> Value:
    """A new node standing in for ``node``: same origin, a name derived from it."""
    return graph.add_node(op, inputs, attrs or {}, name=graph.fresh_name(node.name),
                          origin=node.origin).outputs[0]


def merge_origin(a: Node, b: Node) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a.origin + b.origin))


def rewrite_each(graph: Graph, ctx: Any, ops: Iterable[str], what: str,
                 rewrite: Callable[[Graph, Node], Value | None]) -> list[str]:
    """Replace each node of ``ops`` that the bisect counter lets through (``"<name> <what>"``)
    by ``rewrite``'s value; the nodes a declined rewrite made are taken out again. Returns
    the names of the nodes replaced."""
    ops, done = frozenset(ops), []
    for n in list(graph.nodes):
        if n.op not in ops or n.graph is None:
            continue
        with graph.recording() as made:
            y = rewrite(graph, n) if ctx.should_apply(f"{n.name} {what}", [n]) else None
        if y is None:
            for m in reversed(made):
                graph.erase_node(m)
            continue
        graph.replace_all_uses(n.outputs[0], y)
        graph.erase_node(n)
        done.append(n.name)
    return done


def connected_regions(members: list[Node],
                      inputs: Callable[[Node], Iterable[Value]] = lambda n: n.inputs
                      ) -> list[list[Node]]:
    """``members`` grouped by the edges between them (a member reading, through
    ``inputs(member)``, a value another member produces), each group in ``members``' order."""
    parent = {id(n): id(n) for n in members}

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for n in members:
        for v in inputs(n):
            p = v.producer
            if p is not None and id(p) in parent:
                parent[root(id(n))] = root(id(p))
    groups: dict[int, list[Node]] = {}
    for n in members:
        groups.setdefault(root(id(n)), []).append(n)
    return list(groups.values())


def reads_node(values: Iterable[Value], node: Node, cut: frozenset[int] = frozenset()) -> bool:
    """Whether computing any of ``values`` reads a result of ``node``, not following the
    values whose id() is in ``cut`` (values about to be replaced)."""
    seen: set[int] = set()
    todo = [v for v in values if id(v) not in cut]
    while todo:
        p = todo.pop().producer
        if p is None or id(p) in seen:
            continue
        if p is node:
            return True
        seen.add(id(p))
        todo.extend(x for x in p.inputs if id(x) not in cut)
    return False
