"""One schedule for kernels of equal bodies: plan and lower a body once, then carry the
schedule over to every other kernel whose body has the same structure (``body_signature``:
ops, attributes, types and edges by position, no names).

The planner decides from structure alone; names reach a schedule only through its kernel's
node name, its C symbol and the value names in its notes. So the schedule of a second kernel
is the first one's with every node and value replaced by the one at the same position in its
own body, and those names redone.
"""

from __future__ import annotations

import functools
from dataclasses import fields
from operator import attrgetter
from typing import Any, TypeVar

from graphkernel.codegen.cube.schedule import MatmulSchedule, notes
from graphkernel.codegen.vector import views
from graphkernel.codegen.vector.decompose import decompose
from graphkernel.codegen.vector.schedule import (
    REDUCE_OPS,
    KernelIO,
    Schedule,
    elementwise,
    io_notes,
    kernel_symbol,
)
from graphkernel.ir import Graph, Node

T = TypeVar("T")


@functools.cache
def _layout(cls: type) -> tuple[attrgetter, dict[str, int]]:
    """A dataclass's field values in ``__init__``'s order, and each field's position."""
    fs = fields(cls)
    if not all(f.init and not f.kw_only for f in fs):
        raise TypeError(f"{cls.__name__}: every field must be a positional init field")
    return attrgetter(*(f.name for f in fs)), {f.name: i for i, f in enumerate(fs)}


def copy_with(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for a dataclass whose fields are all positional
    init fields (a schedule, a KernelIO), without ``replace``'s per-call bookkeeping: a
    fourth of its time (~60k copies at 100k nodes)."""
    get, index = _layout(type(obj))
    state = list(get(obj))
    for k, v in changes.items():
        state[index[k]] = v
    return type(obj)(*state)


def _pairs(src: Graph, own: Graph) -> dict[int, object] | None:
    """id() of every input, node and node output of ``src`` -> the one at its place in
    ``own`` (of as many inputs and nodes); None when the bodies do not line up node for
    node."""
    obj: dict[int, object] = {id(a): b for a, b in zip(src.inputs, own.inputs, strict=True)}
    for a, b in zip(src.nodes, own.nodes, strict=True):
        if a.op != b.op or len(a.outputs) != len(b.outputs):
            return None
        obj[id(a)] = b
        for va, vb in zip(a.outputs, b.outputs, strict=True):
            obj[id(va)] = vb
    return obj


def body_of(s: Schedule) -> Graph | None:
    """The (decomposed) body whose nodes and values ``s`` refers to."""
    for io in s.inputs:
        return io.value.graph
    return s.steps[0].graph if s.steps else None


def rebind(s: Schedule, kernel: Node) -> Schedule | None:
    """``s`` (a schedule of a kernel whose body has the same signature as ``kernel``'s) as
    ``kernel``'s own schedule; None when the bodies do not line up node for node."""
    src = body_of(s)
    own, _ = decompose(kernel.subgraph)
    own, _ = views.sink_concats(own, elementwise)
    if src is None or len(src.inputs) != len(own.inputs) or len(src) != len(own):
        return None
    obj = _pairs(src, own)
    if obj is None:
        return None
    variant = None
    if s.variant is not None:  # planned over a body of its own
        variant = rebind(s.variant, kernel)
        if variant is None:
            return None
    try:
        moved = _moved(s, obj, kernel_symbol(kernel), kernel.name)
    except KeyError:  # the schedule refers to something outside its body
        return None
    if variant is not None:
        variant.name = f"{moved.name}_rc"
    moved.variant = variant
    return moved


def rebind_matmul(s: MatmulSchedule, kernel: Node) -> MatmulSchedule | None:
    """``rebind`` for a cube or MIX kernel: planned over the body as it is (no decomposition),
    its epilogue and tiling decided from structure alone, so only the product node (the
    inputs and outputs are the body's), the names and the notes (which name inputs) change."""
    src, own = s.matmul.graph, kernel.subgraph
    if src is None or len(src.inputs) != len(own.inputs) or len(src) != len(own):
        return None
    obj = _pairs(src, own)
    if obj is None:
        return None
    moved = copy_with(s, node=kernel.name, name=kernel_symbol(kernel), matmul=obj[id(s.matmul)])
    moved.notes = notes(moved)
    return moved


def _moved(s: Schedule, obj: dict[int, object], name: str, node: str) -> Schedule:
    def m(x):
        return obj[id(x)]

    def io(x: KernelIO) -> KernelIO:
        return copy_with(x, value=m(x.value), local=None if x.local is None else m(x.local),
                         pieces=tuple((m(v), b, p) for v, b, p in x.pieces))

    inputs = [io(x) for x in s.inputs]
    return copy_with(
        s, node=node, name=name, inputs=inputs, outputs=[io(x) for x in s.outputs],
        steps=[m(n) for n in s.steps],
        kind={id(obj[k]): v for k, v in s.kind.items()},
        root={id(obj[k]): m(v) for k, v in s.root.items()},
        scalars={id(obj[k]): v for k, v in s.scalars.items()},
        final={id(obj[k]) for k in s.final},
        row_reduces=frozenset(id(obj[k]) for k in s.row_reduces),
        late_reduces=frozenset(id(obj[k]) for k in s.late_reduces),
        second=frozenset(id(obj[k]) for k in s.second),
        cols={id(obj[k]): v for k, v in s.cols.items()},
        notes=io_notes(inputs, any(n.op in REDUCE_OPS for n in s.steps)),
        variant=None)
