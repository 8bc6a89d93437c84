"""Recompute cheap producers inside their consumer kernels instead of round-tripping GM."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.codegen.cube.schedule import is_matmul_kernel
from graphkernel.fusion import SUPPORTED_DTYPES, nbytes
from graphkernel.ir import Graph, Node, Value
from graphkernel.kernels import inline_producer, scheduled
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
    return PassResult(done > 0, done, notes, f"recomputed {done} producers inside their "
                      "consumer kernels" if done else "")
