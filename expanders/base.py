"""The expander framework: a record per composite op, validators, and the run logic.

An expander is a function ``fn(b, inputs, attrs) -> output(s)`` written with the
graph builder, registered with its preconditions::

    @expander("GeLU")
    def gelu(b, x, *, approximate):
        ...

Preconditions are declared, not coded into the body: accepted dtypes of the
first input, and ``validators`` (each returns the reason it cannot expand, or
None). With ``fp32_inside`` (the default), fp16/bf16 inputs are cast to fp32,
the expansion computes in fp32 and each result is cast back once, so the
expansion rounds only where the composite op itself does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel import ops
from graphkernel.builder import Builder
from graphkernel.ir import DType, Graph, Node, TensorType, Value
from graphkernel.registry import EXPANDERS, register_expander

FLOATS = frozenset(d for d in DType if d.is_float)
NUMERIC = frozenset(d for d in DType if d.is_float or d.is_int)

Validator = Callable[[Node], str | None]


@dataclass(frozen=True)
class Expander:
    op: str
    fn: Callable[..., Value | Sequence[Value]]
    dtypes: frozenset[DType]
    validators: tuple[Validator, ...]
    fp32_inside: bool
    default: bool
    note: str

    def why_not(self, node: Node) -> str | None:
        """The reason this node cannot be expanded, or None."""
        dt = node.inputs[0].dtype if node.inputs else None
        if dt is not None and dt not in self.dtypes:
            accepted = ", ".join(sorted(d.value for d in self.dtypes))
            return f"dtype {dt.value} is not accepted (accepted: {accepted})"
        for check in self.validators:
            reason = check(node)
            if reason:
                return reason
        return None


def expander(op: str, dtypes: frozenset[DType] = FLOATS, validators: Sequence[Validator] = (),
             fp32_inside: bool = True, default: bool = True, note: str = ""):
    """Register ``fn(b, *inputs, **attrs)`` as the expansion of composite op ``op``."""
    ops.get(op)  # the op must exist

    def deco(fn):
        register_expander(op)(Expander(op, fn, dtypes, tuple(validators), fp32_inside, default,
                                       note))
        return fn

    return deco


def static_dims(axes_of: Callable[[Node], Sequence[int]], what: str) -> Validator:
    """Validator: the given dims of input 0 must be static (e.g. N in 1/N)."""
    def check(node: Node) -> str | None:
        shape = node.inputs[0].shape
        dyn = [shape[a] for a in axes_of(node) if not isinstance(shape[a], int)]
        return f"{what} {dyn} must be static" if dyn else None

    return check


def expand_node(graph: Graph, node: Node, exp: Expander) -> tuple[list[Value] | None, str]:
    """Build the expansion of ``node`` next to it. Returns (outputs, "") or (None, reason);
    on failure nothing is left behind."""
    b = Builder(graph, origin=node.origin, prefix=node.name)
    ins = list(node.inputs)
    low = exp.fp32_inside and any(v.dtype.is_low_precision for v in ins)
    if low:
        ins = [b.cast(v, DType.float32) if v.dtype.is_low_precision else v for v in ins]
    try:
        out = exp.fn(b, *ins, **node.attrs)
    except (ValueError, KeyError, TypeError) as e:
        b.rollback()
        return None, f"expansion failed: {e}"
    outs = list(out) if isinstance(out, list | tuple) else [out]
    if low:
        outs = [b.cast(v, orig.dtype) for v, orig in zip(outs, node.outputs, strict=False)]
    want = [v.type for v in node.outputs]
    got = [v.type for v in outs]
    if got != want:
        b.rollback()
        return None, ("expansion gives " + ", ".join(map(str, got)) + ", the op declares "
                      + ", ".join(map(str, want)))
    composite = [n.op for n in b.created if ops.get(n.op).composite]
    if composite:
        b.rollback()
        return None, f"expansion emitted composite ops {composite}"
    return outs, ""


# ------------------------------------------------------------------ replay
# A model repeats its layers: thousands of LayerNorms of one shape expand into the same ops.
# The first expansion of each signature is recorded as a template and every equal node
# replays it, adding the same nodes under the same names as ``expand_node`` would, without
# running the expander, checking attributes or inferring types again.

Ref = tuple[int, int]  # (-1, k): the expanded node's input k; (j, i): output i of node j


@dataclass(frozen=True)
class Step:
    """One node of a template: its op, normalized attributes, inputs and output types."""
    op: str
    attrs: dict[str, Any]
    inputs: tuple[Ref, ...]
    out_types: tuple[TensorType, ...]


@dataclass(frozen=True)
class Template:
    """The nodes an expansion adds and the values standing for the node's outputs."""
    steps: tuple[Step, ...]
    outputs: tuple[Ref, ...]

    @functools.cached_property
    def plan(self) -> tuple[tuple[Step, str, bool, bool], ...]:
        """Per step, what ``replay`` would otherwise work out for every node it adds: the
        step, its name's suffix, whether it has one output, and whether an attribute value
        must be copied per node (an array or a list: see ``_owned``)."""
        return tuple((st, "/" + st.op.lower(), len(st.out_types) == 1,
                      any(isinstance(v, np.ndarray | list) for v in st.attrs.values()))
                     for st in self.steps)


def template_key(node: Node) -> tuple | None:
    """What an expansion may depend on: the op, its attributes, its inputs' types and which
    inputs are the same value, its outputs' types. None when an attribute cannot be a key
    (an array, a subgraph): such a node is always expanded afresh."""
    frozen = ops._frozen_attrs(node.attrs)
    if frozen is None:
        return None
    first: dict[int, int] = {}
    same = tuple(first.setdefault(id(v), k) for k, v in enumerate(node.inputs))
    return (node.op, frozen, tuple(v.type for v in node.inputs), same,
            tuple(v.type for v in node.outputs))


def record(node: Node, created: Sequence[Node], outs: Sequence[Value]) -> Template | None:
    """The template of a successful expansion of ``node`` (``created``: the nodes it added,
    in order; ``outs``: its results); None when a node reads a value from elsewhere in the
    graph (no other node could replay it) or is named other than by its op."""
    where: dict[int, Ref] = {}
    for k, v in enumerate(node.inputs):
        where.setdefault(id(v), (-1, k))
    steps = []
    for j, n in enumerate(created):
        refs = tuple(where.get(id(v)) for v in n.inputs)
        base = f"{node.name}/{n.op.lower()}"
        if None in refs or n.graph is None or not (n.name == base or n.name.startswith(base + "_")
                                and n.name[len(base) + 1:].isdigit()):
            return None  # (a name replay would not give it: an op named by an alias)
        attrs = {k: _owned(v) for k, v in n.attrs.items()}
        steps.append(Step(n.op, attrs, refs,  # type: ignore[arg-type]
                          tuple(v.type for v in n.outputs)))
        for i, v in enumerate(n.outputs):
            where[id(v)] = (j, i)
    out_refs = tuple(where.get(id(v)) for v in outs)
    if None in out_refs:
        return None
    return Template(tuple(steps), out_refs)  # type: ignore[arg-type]


def replay(graph: Graph, node: Node, template: Template) -> list[Value]:
    """Add ``template``'s nodes for ``node`` (whose ``template_key`` is the recorded one's):
    the names, origins, attributes and types ``expand_node`` would give them. Returns the
    values standing for the node's outputs."""
    ins = node.inputs
    made: list[list[Value]] = []
    prefix, origin = node.name, tuple(node.origin) or None
    fresh, add = graph.fresh_name, graph._add_raw
    for st, suffix, single, owned in template.plan:
        inputs = [ins[i] if j < 0 else made[j][i] for j, i in st.inputs]
        name = fresh(prefix + suffix)
        outs = [(fresh(name), st.out_types[0])] if single else \
            [(fresh(f"{name}:{i}"), t) for i, t in enumerate(st.out_types)]
        attrs = {k: _owned(v) for k, v in st.attrs.items()} if owned else dict(st.attrs)
        made.append(add(st.op, name, inputs, attrs, origin or (name,), outs).outputs)
    return [ins[i] if j < 0 else made[j][i] for j, i in template.outputs]


def _owned(v: Any) -> Any:
    """An attribute value for a node of its own: arrays and lists copied (a node may
    rewrite its attributes in place), other values shared."""
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, list):
        return [_owned(x) for x in v]
    return v


def registered() -> dict[str, Expander]:
    return dict(EXPANDERS)
