"""Turn a set of nodes into one GraphKernel node holding them as a subgraph."""

from __future__ import annotations

from collections.abc import Sequence

from graphkernel.ir import Graph, Node, Value

MAX_NAME_OPS = 6


def kernel_name(nodes: Sequence[Node], counter: int) -> str:
    """``fused_mul_add_exp_reducesum_3``: the distinct ops in order, then a counter."""
    seen: list[str] = []
    for n in nodes:
        op = n.op.lower()
        if op not in seen:
            seen.append(op)
    return "fused_" + "_".join(seen[:MAX_NAME_OPS]) + f"_{counter}"


def build_kernel(graph: Graph, nodes: Sequence[Node], name: str, pattern: str) -> Node:
    """Replace ``nodes`` (in topological order, a convex set) by one GraphKernel node.

    Scalar constants used by the kernel are copied inside it; every other value from
    outside becomes a kernel input. Values used outside (or graph outputs) become outputs.
    """
    members = {id(n) for n in nodes}
    outputs_set = {id(v) for v in graph.outputs}
    sub = Graph(name)
    vmap: dict[int, Value] = {}
    inputs: list[Value] = []
    for n in nodes:
        for v in n.inputs:
            if id(v) in vmap or (v.producer is not None and id(v.producer) in members):
                continue
            p = v.producer
            if p is not None and p.op == "Constant" and p.attrs["value"].size == 1:
                vmap[id(v)] = sub.add_node("Constant", [], {"value": p.attrs["value"]},
                                           name=sub.fresh_name(p.name), origin=p.origin).output
            else:
                vmap[id(v)] = sub.add_input(v.name, v.type)  # named after the value it binds
                inputs.append(v)
    outs: list[Value] = []
    for n in nodes:
        new = sub._add_raw(n.op, n.name, [vmap[id(v)] for v in n.inputs], dict(n.attrs),
                           n.origin, [(v.name, v.type) for v in n.outputs])
        for old, nv in zip(n.outputs, new.outputs, strict=True):
            vmap[id(old)] = nv
            if id(old) in outputs_set or any(id(u) not in members for u in old.users):
                outs.append(old)
    sub.set_outputs([vmap[id(v)] for v in outs])
    origin = tuple(dict.fromkeys(o for n in nodes for o in n.origin))
    k = graph.add_node("GraphKernel", inputs, {"subgraph": sub, "pattern": pattern},
                       name=graph.fresh_name(name), origin=origin,
                       output_names=[graph.fresh_name(f"{name}:{i}") for i in range(len(outs))]
                       if len(outs) > 1 else [graph.fresh_name(name)])
    for old, new in zip(outs, k.outputs, strict=True):
        graph.replace_all_uses(old, new)
    for n in reversed(nodes):
        graph.erase_node(n)
    return k
