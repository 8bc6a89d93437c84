"""Recompute cheap producers inside their consumer kernels instead of round-tripping GM.

Besides broadcasts (a value much larger than its inputs), a slice with unit steps read by
kernels only, directly or through views (a projection's part split off and read by two
kernels: the input gate and the skip term of a state-space block) is loaded in place by each
of its readers: each reads the slice's elements of the sliced value (a strided load, the
slice's bytes), where the slice kernel read them once, wrote them, and each reader read them
back. One launch and the slice's write and reads fewer; the readers' own reads are the same
bytes. The ``slice`` pattern does this when the readers are one area; here they stay
separate kernels.
"""

from __future__ import annotations

from graphkernel import ops
from graphkernel.codegen.cube.schedule import is_matmul_kernel
from graphkernel.fusion import SUPPORTED_DTYPES, nbytes
from graphkernel.ir import Graph, Node, Value
from graphkernel.kernels import build_kernel, inline_producer, scheduled
from graphkernel.ops import OpKind
from graphkernel.registry import PassResult

MAX_OPS = 8          # a producer worth recomputing is a short elementwise/broadcast chain
MAX_INPUT_RATIO = 0.5  # ... whose inputs are at most half the size of the value it produces


def _members(node) -> list:
    """The ops ``node`` computes but constants: its body's, or itself (no graph built for a
    single node: this is asked of every node)."""
    if node.op == "GraphKernel":
        return [n for n in node.subgraph.nodes if n.op != "Constant"]
    return [node] if node.op != "Constant" else []


def cheap(node) -> bool:
    members = _members(node)
    if not members or len(members) > MAX_OPS:
        return False
    # (a single op recomputed inside a kernel must be one a kernel computes: the cluster's
    # dtypes, so no float -> int64 Cast of an index taken into the kernel reading it)
    return all(ops.get(n.op).kind <= OpKind.BROADCAST and not ops.get(n.op).writes
               and all(v.dtype in SUPPORTED_DTYPES for v in n.outputs) for n in members)


def gain(producer, value, consumers) -> int:
    """GM bytes saved: the value's write (when nobody else reads it) and one read per
    consumer, minus reading the producer's inputs once per consumer."""
    v_bytes = nbytes(value)
    in_bytes = sum(nbytes(v) for v in producer.inputs)
    others = [u for u in value.users if u not in consumers] or \
        value.graph.is_output(value)
    write = 0 if others else v_bytes
    return write + len(consumers) * (v_bytes - in_bytes)


def _too_many_inputs(producer, value, consumers, cap: int) -> bool:
    """A consumer kernel that recomputes ``value`` reads the producer's inputs instead of it:
    whether that takes one over the target's input cap (0: no cap)."""
    if not cap:
        return False
    extra = [v for v in producer.inputs if v.producer is None or v.producer.op != "Constant"
             or v.producer.attrs["value"].size != 1]
    return any(len({id(v) for v in (*c.inputs, *extra) if v is not value}) > cap
               for c in consumers)


def _still_scheduled(consumer: Node, producer: Node, value: Value, target: str) -> bool:
    """Whether ``consumer`` recomputing ``value`` is a kernel the vector code generator
    schedules when ``consumer`` itself is one: a table of rotary angles read by heads is
    loaded as a table, but computed in the kernel it is a value smaller than the loop space
    that no layout holds, and the fallback would take the kernel apart op by op. A product's
    kernel the cube code generator plans keeps being planned (an operand it reads through
    views from GM is not computed in it). Tried on a copy (a probe graph holding the two
    kernels), never on ``graph``."""
    if is_matmul_kernel(consumer):
        return _cube_still_planned(consumer, producer, value, target)
    if not scheduled(consumer):
        return True  # one refused already: as before
    return scheduled(_probe(consumer, producer, value))


def _cube_still_planned(consumer: Node, producer: Node, value: Value, target: str) -> bool:
    from graphkernel.codegen import targets
    from graphkernel.codegen.cube.schedule import plan_matmul
    from graphkernel.codegen.refusal import Unsupported

    spec = targets.load(target)
    try:
        plan_matmul(consumer, spec)
    except Unsupported:
        return True  # refused already: as before
    try:
        plan_matmul(_probe(consumer, producer, value), spec)
    except Unsupported:
        return False
    return True


def _probe(consumer: Node, producer: Node, value: Value) -> Node:
    """``consumer`` with ``producer`` inlined, in a probe graph of their own."""
    probe = Graph("probe")
    outer: dict[int, Value] = {}
    for v in (*producer.inputs, *consumer.inputs):
        if v.producer is producer or id(v) in outer:
            continue
        src = v.producer
        outer[id(v)] = probe.const(src.attrs["value"], name=src.name) \
            if src is not None and src.op == "Constant" else \
            probe.add_input(probe.fresh_name(v.name), v.type)
    p = probe.add_node(producer.op, [outer[id(v)] for v in producer.inputs],
                       dict(producer.attrs), name=producer.name)
    made = {id(v): nv for v, nv in zip(producer.outputs, p.outputs, strict=True)}
    c = probe.add_node("GraphKernel", [made[id(v)] if id(v) in made else outer[id(v)]
                                       for v in consumer.inputs],
                       dict(consumer.attrs), name=consumer.name)
    return inline_producer(probe, c, p, made[id(value)])


SLICES = frozenset({"Slice", "StridedSlice"})
VIEW_CHAIN = frozenset({"Reshape", "ExpandDims", "Squeeze"})


def _unit_slice(n: Node) -> bool:
    """Whether ``n`` is a slice with unit steps or a Transpose (static extents), alone, or a
    kernel of one slice and views."""
    if n.op == "GraphKernel":
        body = [m for m in n.subgraph.nodes if m.op != "Constant"]
        return len(n.outputs) == 1 and sum(m.op in SLICES for m in body) == 1 and all(
            m.op in SLICES or m.op in VIEW_CHAIN for m in body) and all(
            _unit_slice(m) for m in body if m.op in SLICES)
    if n.op == "Transpose":
        return n.inputs[0].dtype in SUPPORTED_DTYPES and all(
            isinstance(d, int) for d in n.inputs[0].shape)
    return n.op in SLICES and len(n.outputs) == 1 and all(
        st == 1 for st in (n.attrs.get("strides") or [1])) and \
        n.inputs[0].dtype in SUPPORTED_DTYPES


def _bare_elementwise(u: Node) -> bool:
    """An elementwise op left outside any kernel (a launch of its own): it reads the view in
    place as a kernel of one op would."""
    return ops.exists(u.op) and ops.get(u.op).kind == OpKind.ELEMWISE and \
        not ops.get(u.op).writes and len(u.outputs) == 1 and \
        all(v.dtype in SUPPORTED_DTYPES for v in (*u.inputs, *u.outputs))


def _slice_readers(graph: Graph, s: Node) -> list[tuple[Node, list[Node]]] | None:
    """(reader kernel, the view nodes from the slice to it, in order) for every reader of
    slice ``s``'s value, through views that only it reads from; None when something else
    reads it (an op outside a kernel, a graph output) or a kernel reads it more than once."""
    out: list[tuple[Node, list[Node]]] = []
    front: list[tuple[Value, list[Node]]] = [(s.outputs[0], [])]
    while front:
        v, chain = front.pop()
        if graph.is_output(v):
            return None
        for u, _ in v.uses:
            if u.op == "GraphKernel" or _bare_elementwise(u):
                if sum(x is v for x in u.inputs) != 1 or any(k is u for k, _ in out):
                    return None
                out.append((u, chain))
            elif u.op in VIEW_CHAIN and len(u.outputs) == 1:
                front.append((u.outputs[0], [*chain, u]))
            else:
                return None
    return out


def _inline_chain(graph: Graph, kernel: Node, s: Node, chain: list[Node]) -> Node:
    """``kernel`` computing slice ``s`` and the views ``chain`` after it itself (an op
    outside any kernel made a kernel of its own first)."""
    if kernel.op != "GraphKernel":
        kernel = build_kernel(graph, [kernel], f"{kernel.name}_in_place", "in_place")
    for node in reversed(chain):
        kernel = inline_producer(graph, kernel, node, node.outputs[0])
    return inline_producer(graph, kernel, s, s.outputs[0])


def _chain_probe(kernel: Node, s: Node, chain: list[Node]) -> Node:
    """``kernel`` with slice ``s`` and its views inlined, in a probe graph of its own."""
    probe = Graph("probe")
    outer: dict[int, Value] = {}
    for v in (*s.inputs, *kernel.inputs):
        if id(v) in outer or any(v is n.outputs[0] for n in (s, *chain)):
            continue
        src = v.producer
        outer[id(v)] = probe.const(src.attrs["value"], name=src.name) \
            if src is not None and src.op == "Constant" else \
            probe.add_input(probe.fresh_name(v.name), v.type)
    copies = []
    for n in (s, *chain):
        m = probe.add_node(n.op, [outer[id(v)] for v in n.inputs], dict(n.attrs), name=n.name)
        outer[id(n.outputs[0])] = m.outputs[0]
        copies.append(m)
    k = probe.add_node(kernel.op, [outer[id(v)] for v in kernel.inputs],
                       dict(kernel.attrs), name=kernel.name)
    probe.set_outputs(list(k.outputs))
    k = _inline_chain(probe, k, copies[0], copies[1:])
    probe.set_outputs(list(k.outputs))
    return k


def _probe_ok(kernel: Node, s: Node, chain: list[Node], target: str) -> bool:
    """Whether ``kernel`` loading the slice in place is still a kernel its code generator
    takes (vector: scheduled; a product's: planned), when it was one before."""
    from graphkernel.codegen import targets
    from graphkernel.codegen.cube.schedule import plan_matmul
    from graphkernel.codegen.refusal import Unsupported

    if kernel.op != "GraphKernel":
        return scheduled(_chain_probe(kernel, s, chain))
    if is_matmul_kernel(kernel):
        spec = targets.load(target)
        try:
            plan_matmul(kernel, spec)
        except Unsupported:
            return False  # (no plan to keep: left as it is)
        try:
            plan_matmul(_chain_probe(kernel, s, chain), spec)
        except Unsupported:
            return False
        return True
    return scheduled(kernel) and scheduled(_chain_probe(kernel, s, chain))


def _slices_in_place(graph: Graph, ctx, notes: list[str]) -> int:
    """Each unit-step slice read only by kernels (through views) loaded in place by them."""
    done = 0
    if ctx.flags.peak_memory_growth >= 0:
        # a reader loading the slice later keeps the sliced value alive until it runs: the
        # memory guard weighs such moves for the fusions, not here, so none is made
        notes.append("slices left to their own launches: peak_memory_growth guards memory")
        return 0
    limit = ctx.flags.composite_op_limit_size
    cap = ctx.flags.max_kernel_inputs
    most = ctx.flags.recompute_max_consumers
    for s in list(graph.nodes):
        if s.graph is None or not _unit_slice(s):
            continue
        readers = _slice_readers(graph, s)
        if not readers or (0 <= most < len(readers)):
            continue
        if any(len(_members(k)) + 1 + len(chain) > limit for k, chain in readers):
            continue  # a reader would exceed composite_op_limit_size
        if cap and any(len({id(v) for v in (*k.inputs, s.inputs[0])}) - 1 > cap
                       for k, _ in readers):
            continue  # a reader would read more than max_kernel_inputs values
        if not all(_probe_ok(k, s, chain, ctx.flags.target) for k, chain in readers):
            continue  # kept: a reader's code generator would not take the slice in place
        names = ", ".join(k.name for k, _ in readers)
        if not ctx.should_apply(f"{s.name} loaded in place by {names}", [s] + [
                k for k, _ in readers]):
            continue
        for k, chain in readers:
            _inline_chain(graph, k, s, chain)
        saved = nbytes(s.outputs[0]) * (1 + len(readers))
        for n in [s, *{id(n): n for _, chain in readers for n in chain}.values()][::-1]:
            if n.graph is not None and not any(v.uses for v in n.outputs):
                graph.erase_node(n)
        notes.append(f"slice {s.name} loaded in place by {len(readers)} kernel(s) "
                     f"({names}): one launch and {saved:,} GM bytes fewer")
        done += 1
    return done


def recompute(graph, ctx) -> PassResult:
    """Rewrite kernel(value of cheap producer P) -> kernel(P recomputed inside) when P is a
    short elementwise/broadcast chain whose inputs are much smaller than its output (a
    broadcast) and the GM bytes saved are positive, into at most recompute_max_consumers
    kernels, none of them taken over composite_op_limit_size or max_kernel_inputs, nor made a
    kernel the vector code generator no longer schedules."""
    done = 0
    notes = []
    for producer in graph.nodes:
        if producer.graph is None or producer.op == "Constant" or not cheap(producer):
            continue
        in_bytes = sum(nbytes(v) for v in producer.inputs)
        for value in list(producer.outputs):
            consumers = [u for u in value.users if u.op == "GraphKernel" and u is not producer]
            if not consumers or in_bytes > MAX_INPUT_RATIO * nbytes(value):
                continue
            most = ctx.flags.recompute_max_consumers
            if 0 <= most < len(consumers):
                continue  # read by more kernels than recompute_max_consumers: materialized
            saved = gain(producer, value, consumers)
            if saved <= 0:
                continue
            limit = ctx.flags.composite_op_limit_size
            size = len(_members(producer))
            if any(len(_members(c)) + size > limit for c in consumers):
                continue  # a consumer would exceed composite_op_limit_size
            if _too_many_inputs(producer, value, consumers, ctx.flags.max_kernel_inputs):
                continue  # a consumer would read more than max_kernel_inputs values
            if not all(_still_scheduled(c, producer, value, ctx.flags.target)
                           for c in consumers):
                continue  # kept materialized: a consumer could not hold it
            names = ", ".join(c.name for c in consumers)
            if not ctx.should_apply(f"{producer.name} into {names}",
                                    [producer, *consumers]):
                continue
            for c in consumers:
                inline_producer(graph, c, producer, value)
            notes.append(f"recomputed {producer.name} in {len(consumers)} kernel(s), "
                         f"saving {saved:,} GM bytes")
            done += 1
        if producer.graph is not None and not any(v.uses for v in producer.outputs) and \
                not any(graph.is_output(v) for v in producer.outputs):
            graph.erase_node(producer)
    done += _slices_in_place(graph, ctx, notes)
    return PassResult(done > 0, done, notes, f"recomputed {done} producers inside their "
                      "consumer kernels" if done else "")
