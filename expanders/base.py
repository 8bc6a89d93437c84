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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphkernel import ops
from graphkernel.builder import Builder
from graphkernel.ir import DType, Graph, Node, Value
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


def registered() -> dict[str, Expander]:
    return dict(EXPANDERS)
