"""Turn a set of nodes into one GraphKernel node holding them as a subgraph."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from graphkernel import ops
from graphkernel.errors import OpError, ShapeError
from graphkernel.interpreter import Interpreter
from graphkernel.ir import Graph, Node, TensorType, Value
from graphkernel.ops import Attrs, OpKind


# The op a fused cluster becomes: a node holding its members as a subgraph. It is defined
# here, above the IR, because its attribute is a Graph and its reference runs one.
class GraphKernelAttrs(Attrs):
    subgraph: Graph
    pattern: str = ""


def _gk_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    sub: Graph = attrs["subgraph"]
    if len(ins) != len(sub.inputs):
        raise OpError(f"takes {len(sub.inputs)} inputs (its subgraph's), got {len(ins)}")
    for i, (t, v) in enumerate(zip(ins, sub.inputs, strict=True)):
        if t != v.type:
            raise ShapeError(f"input {i} type {t} differs from the subgraph input {v.type}")
    return [v.type for v in sub.outputs]


def _gk_ref(xs, attrs, ctx):
    sub: Graph = attrs["subgraph"]
    feeds = {v.name: x for v, x in zip(sub.inputs, xs, strict=True)}
    return tuple(Interpreter(sub).run(feeds))


ops.register(ops.OpDef("GraphKernel", OpKind.OPAQUE, (0, None), _gk_infer, _gk_ref,
                       attrs=GraphKernelAttrs, category="fused"))


def pattern_of(label: str) -> str:
    """The pattern a kernel's label starts with: ``reduce_fwd_depth`` for
    ``reduce_fwd_depth+elemwise_broadcast_fwd_width/phase1``, ``parallel`` for
    ``parallel(a|b)``."""
    return re.split(r"[+/(|]", label, maxsplit=1)[0] or "kernel"


def kernel_name(nodes: Sequence[Node], counter: int, pattern: str) -> str:
    """``<pattern>_<first op>_<n>``: the fusion pattern that formed the kernel (the name
    ``--disable_fusion_pattern`` takes), the first op it computes (views are skipped when it
    computes anything else), and a counter."""
    body = [n.op for n in nodes if n.op != "Constant"]
    first = next((op for op in body if ops.get(op).kind > OpKind.RESHAPE),
                 body[0] if body else "empty")
    return f"{pattern_of(pattern)}_{first.lower()}_{counter}"


def next_kernel_name(analyses: Any, nodes: Sequence[Node], pattern: str) -> str:
    """``kernel_name`` with the compile's running kernel counter (``Analyses.kernel_counter``)."""
    analyses.kernel_counter += 1
    return kernel_name(nodes, analyses.kernel_counter, pattern)


def views_left_outside(graph: Graph, nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` without the views that would make a kernel write one value twice: a view
    (Reshape, ExpandDims, Squeeze) of a value the kernel computes and stores anyway for a
    reader outside, whose own result only readers outside the kernel take (and is no graph
    output), is left outside as a view of the stored value. In the kernel it would be one
    more output holding the same bytes again (a projection's result read by the residual
    and, viewed with an axis of 1 added, by a convolution; a LayerNorm's result read as it
    is and merged into rows by the next product)."""
    members = {id(n) for n in nodes}
    outputs = {id(v) for v in graph.outputs}
    keep = []
    for n in nodes:
        if n.op in ops.RESHAPE_OPS and len(n.inputs) == 1 and n.inputs[0].producer is not None \
                and id(n.inputs[0].producer) in members and id(n.outputs[0]) not in outputs \
                and n.outputs[0].users and \
                all(id(u) not in members for u in n.outputs[0].users):
            x = n.inputs[0]
            if id(x) in outputs or any(id(u) not in members and u is not n for u in x.users):
                continue
        keep.append(n)
    return keep


def build_kernel(graph: Graph, nodes: Sequence[Node], name: str, pattern: str,
                 slice_inputs: bool = False) -> Node:
    """Replace ``nodes`` (in topological order, a convex set) by one GraphKernel node.

    Scalar constants used by the kernel are copied inside it; every other value from
    outside becomes a kernel input. Values used outside (or graph outputs) become outputs.
    ``slice_inputs``: a value from outside that the kernel reads only through slices is
    bound once per slice (``separate_slice_reads``).
    """
    nodes = views_left_outside(graph, nodes)
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
                # a copy of the constant as it is (checked and typed when it was made), node
                # and value under one fresh name
                name_in = sub.fresh_name(p.name)
                sub.clone_node(p, vmap, rename=lambda _, name_in=name_in: name_in)
            else:
                vmap[id(v)] = sub.add_input(v.name, v.type)  # named after the value it binds
                inputs.append(v)
    outs = [old for n in nodes for old in n.outputs
            if id(old) in outputs_set or any(id(u) not in members for u, _ in old.uses)]
    origin = tuple(dict.fromkeys(o for n in nodes for o in n.origin))
    kname = graph.fresh_name(name)
    out_names = [graph.fresh_name(f"{name}:{i}") for i in range(len(outs))] \
        if len(outs) > 1 else [graph.fresh_name(name)]
    if any(id(v) in outputs_set for v in outs):
        # a graph output keeps its name on the kernel's output (``replace_all_uses``): the
        # members are copied, and the originals, renamed out of its way, erased
        for n in nodes:
            sub.clone_node(n, vmap)
        sub.set_outputs([vmap[id(v)] for v in outs])
        if slice_inputs:
            separate_slice_reads(sub, inputs, views=True)
        k = graph.add_node("GraphKernel", inputs, {"subgraph": sub, "pattern": pattern},
                           name=kname, origin=origin, output_names=out_names)
        for old, new in zip(outs, k.outputs, strict=True):
            graph.replace_all_uses(old, new)
        for n in reversed(nodes):
            graph.erase_node(n)
        return k
    graph.move_nodes(nodes, sub, vmap)
    sub.set_outputs(outs)
    if slice_inputs:
        separate_slice_reads(sub, inputs, views=True)
    k = graph.add_node("GraphKernel", inputs, {"subgraph": sub, "pattern": pattern},
                       name=kname, origin=origin, output_names=out_names)
    for old, new in zip(outs, k.outputs, strict=True):
        for u, j in [(u, j) for u, j in old.uses if u.graph is graph]:
            graph.replace_input(u, j, new)
    return k


SLICE_OPS = ("Slice", "StridedSlice")


def sliced_inputs(sub: Graph, views: bool = False) -> list[Value]:
    """The inputs of a kernel body read only through two or more slices (and nothing else):
    a product's gate and up halves, a fused key/value product's parts; with ``views`` also
    those read only through two or more ExpandDims of different shapes (``x[None, :] -
    x[:, None]``: the one input would be both a row and a column of the loop space)."""
    out = []
    for p in sub.inputs:
        users = [u for u, _ in p.uses]
        if len(users) < 2 or any(p is o for o in sub.outputs):
            continue
        if all(u.op in SLICE_OPS and u.inputs[0] is p for u in users) or views and all(
                u.op == "ExpandDims" for u in users) and len(
                {tuple(u.outputs[0].shape) for u in users}) > 1:
            out.append(p)
    return out


def separate_slice_reads(sub: Graph, inputs: list[Value], views: bool = False) -> int:
    """Bind each slice of an input read only through slices (``sliced_inputs``) to an input
    of its own, bound to the same outer value (``inputs``, the kernel's operands, grows to
    match): the code generator loads each part as a strided view of the operand's buffer,
    where one input read through several column views would have its parts computed on at
    different column offsets of one tile. Returns how many inputs were added."""
    added = 0
    for p in sliced_inputs(sub, views):
        outer = inputs[next(i for i, v in enumerate(sub.inputs) if v is p)]
        for u in [u for u, _ in p.uses][1:]:
            q = sub.add_input(sub.fresh_name(p.name), p.type)
            sub.replace_input(u, 0, q)
            inputs.append(outer)
            added += 1
    return added


def kernel_body(node: Node) -> Graph:
    """A node's computation as a graph: a kernel's subgraph, or the single node itself."""
    if node.op == "GraphKernel":
        return node.subgraph
    g = Graph(node.name)
    ins = [g.add_input(f"i{i}", v.type) for i, v in enumerate(node.inputs)]
    g._add_raw(node.op, node.name, ins, dict(node.attrs), node.origin,
               [(v.name, v.type) for v in node.outputs])
    g.set_outputs(list(g.node(node.name).outputs))
    return g


def inline_producer(graph: Graph, consumer: Node, producer: Node, value: Value) -> Node:
    """Rebuild kernel ``consumer`` so that it recomputes ``value`` (an output of ``producer``)
    from the producer's own inputs instead of reading it. Returns the new kernel node."""
    sub_k, sub_p = consumer.subgraph, kernel_body(producer)
    new = Graph(sub_k.name)
    params: dict[int, Value] = {}  # id(outer value) -> param of the new kernel
    inputs: list[Value] = []

    def param(outer: Value) -> Value:
        if id(outer) not in params:
            params[id(outer)] = new.add_input(new.fresh_name(outer.name), outer.type)
            inputs.append(outer)
        return params[id(outer)]

    vmap: dict[int, Value] = {}
    for inner, outer in zip(sub_p.inputs, producer.inputs, strict=True):
        vmap[id(inner)] = param(outer)
    for n in sub_p.nodes:
        new.clone_node(n, vmap, rename=lambda s: new.fresh_name(f"{s}_rc"))
    recomputed = vmap[id(sub_p.outputs[producer.outputs.index(value)])]
    for inner, outer in zip(sub_k.inputs, consumer.inputs, strict=True):
        vmap[id(inner)] = recomputed if outer is value else param(outer)
    for n in sub_k.nodes:
        new.clone_node(n, vmap, rename=new.fresh_name)
    new.set_outputs([vmap[id(v)] for v in sub_k.outputs])
    origin = tuple(dict.fromkeys(consumer.origin + producer.origin))
    pattern = consumer.attrs["pattern"]
    k = graph.add_node("GraphKernel", inputs, {"subgraph": new,
                                               "pattern": f"{pattern}+recompute"},
                       name=graph.fresh_name(consumer.name), origin=origin)
    for old, nv in zip(consumer.outputs, k.outputs, strict=True):
        graph.replace_all_uses(old, nv)
    name = consumer.name
    graph.erase_node(consumer)
    graph.rename_node(k, name)  # the same kernel, grown: it keeps its name
    return k


def merge_parallel(graph: Graph, first: Node, second: Node, name: str) -> Node:
    """One kernel computing two independent kernels side by side (shared inputs read once)."""
    new, inputs = parallel_body([first, second], name)
    pattern = f"parallel({first.attrs['pattern']}|{second.attrs['pattern']})"
    k = graph.add_node("GraphKernel", inputs, {"subgraph": new, "pattern": pattern},
                       name=graph.fresh_name(name), origin=tuple(dict.fromkeys(first.origin
                                                                               + second.origin)))
    olds = list(first.outputs) + list(second.outputs)
    for old, nv in zip(olds, k.outputs, strict=True):
        graph.replace_all_uses(old, nv)
    graph.erase_node(first)
    graph.erase_node(second)
    return k


def scheduled(k: Node) -> bool:
    """Whether the vector code generator schedules kernel ``k`` (a reduction needing several
    passes over its rows counts: it becomes phase kernels, not a fallback). Passes probe a
    rewrite with it before making one the code generator would take apart."""
    from graphkernel.codegen.refusal import NeedsPhases, Unsupported
    from graphkernel.codegen.vector.schedule import plan

    try:
        plan(k)
    except NeedsPhases:
        return True
    except Unsupported:
        return False
    return True


def parallel_body(kernels: Sequence[Node], name: str) -> tuple[Graph, list[Value]]:
    """The bodies of ``kernels`` side by side (in order; a shared input read once), and the
    outer values the body reads. A later kernel reading an earlier one's output takes it
    from the body (a product group reads it back from GM); independent kernels read none."""
    new = Graph(name)
    params: dict[int, Value] = {}
    inputs: list[Value] = []
    outs: list[Value] = []
    made: dict[int, Value] = {}  # an earlier kernel's outer output -> its value in the body
    for k in kernels:
        vmap: dict[int, Value] = {}
        for inner, outer in zip(k.subgraph.inputs, k.inputs, strict=True):
            if id(outer) in made:
                vmap[id(inner)] = made[id(outer)]
                continue
            if id(outer) not in params:
                params[id(outer)] = new.add_input(new.fresh_name(outer.name), outer.type)
                inputs.append(outer)
            vmap[id(inner)] = params[id(outer)]
        for n in k.subgraph.nodes:
            new.clone_node(n, vmap, rename=new.fresh_name)
        outs += [vmap[id(v)] for v in k.subgraph.outputs]
        made.update({id(o): vmap[id(v)] for o, v in zip(k.outputs, k.subgraph.outputs,
                                                       strict=True)})
    new.set_outputs(outs)
    return new, inputs


def unfuse(graph: Graph, kernel: Node) -> list[Node]:
    """Put a kernel's nodes back into the graph in its place; returns them in order."""
    vmap: dict[int, Value] = {id(i): o for i, o in zip(kernel.subgraph.inputs, kernel.inputs,
                                                       strict=True)}
    nodes = [graph.clone_node(n, vmap, rename=graph.fresh_name)
             for n in kernel.subgraph.nodes]
    for old, inner in zip(kernel.outputs, kernel.subgraph.outputs, strict=True):
        graph.replace_all_uses(old, vmap[id(inner)])
    graph.erase_node(kernel)
    return nodes  # the graph re-sorts itself on its next traversal


def sole_reader(n: Node) -> Node | None:
    """The only node reading ``n``'s result when it is a kernel, or an elementwise op left
    outside the kernels (a lone ReLU with no kernel of its own to join); None otherwise. The
    passes that grow a kernel of their own by its consumer (window and convolution kernels)
    take this one."""
    users = {id(u): u for u in n.outputs[0].users}
    if len(users) != 1:
        return None
    (k,) = users.values()
    if k.op == "GraphKernel":
        return k
    return k if ops.get(k.op).kind in (OpKind.ELEMWISE, OpKind.BROADCAST) else None
