"""The op registry: one ``OpDef`` per op, looked up by canonical name or alias.

An OpDef holds the op's kind (for fusion), arity, attribute schema (a pydantic
model), shape+dtype inference and a numpy reference. The op families live in
``graphkernel/opdefs/`` and register themselves when imported, which ``import graphkernel``
does (the registry itself imports none of them).

Traits say what an op is to the rest of the compiler, so that no module keeps its own list:
``view`` (it moves no data: its output is its input's elements in another shape; the
reshapes, of kind ``RESHAPE``, and ``Identity``), ``unit``
(the device unit that computes it: ``VECTOR``, or ``CUBE`` for the products and convolutions)
and ``product`` (a matrix product of the Matmul API, the head of a MIX kernel). ``OpSet``
holds the ops with a trait (``VIEW_OPS``, ``RESHAPE_OPS``, ``CUBE_OPS``, ``PRODUCT_OPS``),
always current.

Reference contract: ``reference(inputs, attrs, ctx) -> array | tuple of arrays``.
Floating inputs arrive already widened to the compute precision (float32 for
fp16/bf16 graphs, or the interpreter's ``compute_dtype``); the interpreter
rounds every result to the op's declared output dtype (op-by-op semantics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from graphkernel.errors import OpError, ShapeError, did_you_mean
from graphkernel.tensor_types import DType, TensorType


class OpKind(IntEnum):
    """Fusion kinds, ordered like MindSpore's node patterns (lower fuses more freely)."""

    VIRTUAL = 0
    RESHAPE = 10
    ELEMWISE = 20
    BROADCAST = 30
    REDUCE = 40
    SLICE = 45
    TRANSPOSE = 46
    CONCAT = 47
    GATHER = 48
    OPAQUE = 50


class Attrs(BaseModel):
    """Base of every attribute schema: unknown attributes are errors."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class NoAttrs(Attrs):
    pass


@dataclass(frozen=True)
class RefContext:
    """What a reference implementation may know besides its inputs."""

    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[np.dtype, ...]
    node_name: str = ""


VECTOR, CUBE = "vector", "cube"  # the units an op runs on (``OpDef.unit``)

Infer = Callable[[Sequence[TensorType], dict[str, Any]], list[TensorType]]
Reference = Callable[[list[np.ndarray], dict[str, Any], RefContext], Any]


@dataclass
class OpDef:
    name: str
    kind: OpKind
    arity: tuple[int, int | None]
    infer: Infer
    reference: Reference
    attrs: type[Attrs] = NoAttrs
    composite: bool = False
    aliases: tuple[str, ...] = ()
    category: str = ""
    doc: str = ""
    # in-place ops: (output index, input index) pairs; the output is written back into the
    # input when that input is a mutable graph input (a parameter)
    writes: tuple[tuple[int, int], ...] = ()
    view: bool = False    # moves no data: the output is the input's elements in another shape
    unit: str = VECTOR    # the device unit computing it: VECTOR, or CUBE (Matmul API, convolution)
    product: bool = False  # a matrix product on the Matmul API (a MIX kernel's head)
    _fields: tuple[str, ...] = field(default=(), repr=False)
    # inferred output types by (input types, attributes): most nodes of a graph repeat a few
    # signatures, and a TensorType is immutable, so equal signatures share their result
    _inferred: dict[tuple, tuple[TensorType, ...]] = field(default_factory=dict, repr=False,
                                                           compare=False)
    # normalized attributes by the attributes given (keyed as ``_inferred``), with whether
    # they hold a list (copied per node, so that no two nodes share a mutable value): the
    # schema's validation is the same work for every node of a repeated layer
    _checked: dict[tuple, tuple[dict[str, Any], bool]] = field(default_factory=dict,
                                                               repr=False, compare=False)
    # both at once, by (attributes given, input types): what ``node_types`` found (its
    # normalized attributes, whether they hold a list, the output types), one look-up and
    # one key per node instead of two of each
    _nodes: dict[tuple, tuple[dict[str, Any], bool, tuple[TensorType, ...]]] = field(
        default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._fields = tuple(self.attrs.model_fields)
        if self.unit not in (VECTOR, CUBE):
            raise OpError(f"op {self.name}: unit {self.unit!r} (accepted: {VECTOR}, {CUBE})")

    def check_attrs(self, attrs: dict[str, Any], where: str = "") -> dict[str, Any]:
        """Validate and normalize attributes against the schema (defaults filled in)."""
        if not self._fields:
            if attrs:
                raise OpError(f"{where or self.name}: op {self.name} takes no attributes, got "
                              + ", ".join(repr(k) for k in attrs))
            return {}
        key = _frozen_attrs(attrs) if attrs else ()
        if key is not None:
            known = self._checked.get(key)
            if known is not None:
                norm, has_list = known
                return {k: _copied(v) for k, v in norm.items()} if has_list else dict(norm)
        try:
            model = self.attrs.model_validate(attrs)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            msg = first["msg"].removeprefix("Value error, ")
            if first["type"] == "extra_forbidden":
                msg = ("unknown attribute" + did_you_mean(str(first["loc"][0]), self._fields)
                       + f" (accepted: {', '.join(self._fields)})")
            raise OpError(f"{where or self.name}: attribute '{loc}': {msg}") from None
        out = {k: getattr(model, k) for k in self._fields}
        # remembered only when what the schema made of them is plain values too (never an
        # array or a subgraph, which a node owns)
        if key is not None and _frozen_attrs(out) is not None:
            if len(self._checked) >= _INFERRED_LIMIT:
                self._checked.clear()
            has_list = any(_holds_list(v) for v in out.values())
            self._checked[key] = ({k: _copied(v) for k, v in out.items()}, has_list)
        return out

    def node_types(self, attrs: dict[str, Any], in_types: Sequence[TensorType], where: str = ""
                   ) -> tuple[dict[str, Any], list[TensorType]]:
        """``check_attrs``, ``check_arity`` and ``infer_types`` of a node of this op: its
        normalized attributes (a dict of its own) and output types. Remembered by the
        attributes given and the input types when both are plain values (all three are a
        function of them), as each of those is on its own."""
        frozen = _frozen_attrs(attrs) if attrs else ()
        key = None if frozen is None else (frozen, tuple(in_types))
        if key is not None:
            known = self._nodes.get(key)
            if known is not None:
                norm, has_list, out = known
                return ({k: _copied(v) for k, v in norm.items()} if has_list else dict(norm),
                        list(out))
        norm = self.check_attrs(attrs, where=where)
        self.check_arity(len(in_types), where=where)
        out = self.infer_types(in_types, norm, where=where)
        if key is not None and _frozen_attrs(norm) is not None:
            if len(self._nodes) >= _INFERRED_LIMIT:
                self._nodes.clear()
            self._nodes[key] = ({k: _copied(v) for k, v in norm.items()},
                                any(_holds_list(v) for v in norm.values()), tuple(out))
        return norm, out

    def check_arity(self, n: int, where: str = "") -> None:
        lo, hi = self.arity
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if lo == hi else f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            raise OpError(f"{where or self.name}: takes {want} inputs, got {n}")

    def infer_types(self, in_types: Sequence[TensorType], attrs: dict[str, Any],
                    where: str = "") -> list[TensorType]:
        """The output types of this op on inputs of ``in_types``; remembered for attributes
        of plain values (an inference is a function of its types and attributes only)."""
        frozen = _frozen_attrs(attrs) if attrs else ()
        key = None if frozen is None else (tuple(in_types), frozen)
        if key is not None:
            known = self._inferred.get(key)
            if known is not None:
                return list(known)
        try:
            out = self.infer(list(in_types), attrs)
        except ShapeError as e:
            ins = ", ".join(str(t) for t in in_types)
            raise ShapeError(f"{where or self.name}: {e} (inputs: {ins})") from None
        if key is not None:
            if len(self._inferred) >= _INFERRED_LIMIT:
                self._inferred.clear()
            self._inferred[key] = tuple(out)
        return list(out)


_INFERRED_LIMIT = 4096  # signatures remembered per op (a bound for graphs of many shapes)
_PLAIN = frozenset({type(None), bool, int, float, str, DType})


def _frozen(v: Any) -> Any:
    """``v`` as a dict key that only an equal value of the same type meets (``True`` and
    ``1``, ``1`` and ``1.0`` differ), or ``_UNFROZEN`` for values other than plain scalars
    and lists or tuples of them (arrays, subgraphs: never keyed)."""
    cls = v.__class__
    if cls in _PLAIN:
        return (cls, v)
    if cls is list or cls is tuple:
        items = tuple(_frozen(x) for x in v)
        return _UNFROZEN if _UNFROZEN in items else (cls, items)
    return _UNFROZEN


_UNFROZEN = object()


def _holds_list(v: Any) -> bool:
    cls = v.__class__
    return cls is list or cls is tuple and any(_holds_list(x) for x in v)


def _copied(v: Any) -> Any:
    """``v`` with every list in it a new list (a plain value as ``_frozen`` accepts it)."""
    cls = v.__class__
    if cls is list:
        return [_copied(x) for x in v]
    if cls is tuple:
        return tuple(_copied(x) for x in v)
    return v


def _frozen_attrs(attrs: dict[str, Any]) -> tuple | None:
    """The attributes as a key (see ``_frozen``), or None when one cannot be keyed."""
    items = []
    for k, v in attrs.items():
        cls = v.__class__
        f = (cls, v) if cls in _PLAIN else _frozen(v)
        if f is _UNFROZEN:
            return None
        items.append((k, f))
    return tuple(items)


frozen_attrs = _frozen_attrs  # (public: other modules key their own memos by it)

_REGISTRY: dict[str, OpDef] = {}
_ALIASES: dict[str, str] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY or opdef.name in _ALIASES:
        raise OpError(f"op {opdef.name!r} is registered twice")
    _REGISTRY[opdef.name] = opdef
    for s in _OP_SETS:
        s._note(opdef)
    for a in opdef.aliases:
        if a in _REGISTRY or a in _ALIASES:
            raise OpError(f"alias {a!r} of {opdef.name} clashes with an existing op")
        _ALIASES[a] = opdef.name
    return opdef


def canonical(name: str) -> str:
    """Resolve an alias to the canonical op name; raise OpError with a suggestion if unknown."""
    if name in _REGISTRY:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    raise OpError(f"unknown op {name!r}" + did_you_mean(name, list(_REGISTRY) + list(_ALIASES))
                  + "; run `graphkernel ops` to list them all")


def get(name: str) -> OpDef:
    op = _REGISTRY.get(name)
    return op if op is not None else _REGISTRY[canonical(name)]


def exists(name: str) -> bool:
    return name in _REGISTRY or name in _ALIASES


def all_ops() -> list[OpDef]:
    return sorted(_REGISTRY.values(), key=lambda o: o.name)


class OpSet(set):
    """The canonical names of the registered ops with a trait: a set kept current as ops
    register (a module may hold one from import time on), so ``node.op in VIEW_OPS`` asks
    the registry rather than a list kept by hand, at the speed of a set. Read-only: an op
    joins by being registered with the trait."""

    def __init__(self, trait: Callable[[OpDef], bool], doc: str) -> None:
        super().__init__(n for n, d in _REGISTRY.items() if trait(d))
        self._trait = trait
        self.__doc__ = doc
        _OP_SETS.append(self)

    def _note(self, opdef: OpDef) -> None:
        if self._trait(opdef):
            set.add(self, opdef.name)

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an OpSet follows the op registry: register an op with the trait")

    add = discard = remove = pop = clear = update = _refuse
    difference_update = intersection_update = symmetric_difference_update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"OpSet({sorted(self)})"


_OP_SETS: list[OpSet] = []


def _unregister(name: str) -> None:
    """Take an op out of the registry and its sets (tests that register an op of their own)."""
    _REGISTRY.pop(name, None)
    for a in [a for a, n in _ALIASES.items() if n == name]:
        del _ALIASES[a]
    for s in _OP_SETS:
        set.discard(s, name)


VIEW_OPS = OpSet(lambda d: d.view, "ops that move no data (Reshape, ExpandDims, Squeeze, "
                 "Identity)")
RESHAPE_OPS = OpSet(lambda d: d.kind == OpKind.RESHAPE, "views that change only the shape "
                    "(Reshape, ExpandDims, Squeeze): one GM buffer, never a launch")
CUBE_OPS = OpSet(lambda d: d.unit == CUBE, "ops the cube unit computes (products, "
                 "convolutions)")
PRODUCT_OPS = OpSet(lambda d: d.product, "matrix products on the Matmul API (MatMul, "
                    "BatchMatMul)")


# ----------------------------------------------------------------- helpers
DTYPE_CLASSES: dict[str, frozenset[DType]] = {
    "float": frozenset(d for d in DType if d.is_float),
    "int": frozenset(d for d in DType if d.is_int),
    "numeric": frozenset(d for d in DType if d.is_float or d.is_int),
    "bool": frozenset({DType.bool}),
    "intbool": frozenset(d for d in DType if d.is_int or d is DType.bool),
    "any": frozenset(DType),
}


def check_dtype(t: TensorType, cls: str, what: str = "input") -> None:
    if t.dtype not in DTYPE_CLASSES[cls]:
        accepted = ", ".join(sorted(d.value for d in DTYPE_CLASSES[cls]))
        raise ShapeError(f"{what} dtype {t.dtype.value} is not accepted (accepted: {accepted})")


def check_scalar_fits(value: float | None, t: TensorType, what: str) -> None:
    """An attribute value applied to ``t``'s elements (a fill value, a clamp bound) is a value
    of an integer dtype: finite and within its range (``inf`` has no int32 value)."""
    if value is None or not t.dtype.is_int:
        return
    info = np.iinfo(t.dtype.np)
    if not (math.isfinite(value) and info.min <= value <= info.max):
        raise ShapeError(f"{what} {value!r} is not a value of the input's dtype {t.dtype.value} "
                         f"(accepted: a number in {info.min}..{info.max})")


def swaps_last_two(n: Any) -> bool:
    """A Transpose node whose permutation swaps the last two axes and keeps the others."""
    perm = list(n.attrs.get("perm") or [])
    r = len(perm)
    return r >= 2 and perm == [*range(r - 2), r - 1, r - 2]


def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` as an index in 0..rank-1. A 0-d tensor accepts axis 0 and -1 and both give 0,
    as torch wraps a scalar's dim: a reduction over them reduces nothing. An op that needs a
    real dim at ``axis`` uses ``dim_axis``."""
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {rank} "
                         f"(accepted: {-max(rank, 1)}..{max(rank, 1) - 1})")
    return axis % rank if rank else 0


def dim_axis(axis: int, rank: int) -> int:
    """``axis`` as the index of a dim the op reads (a concat, split or channel axis): a 0-d
    input has none, which is an error naming the fix rather than an index past the shape."""
    return dim_axes([axis], rank)[0]


def dim_axes(axes: Sequence[int], rank: int) -> list[int]:
    """``normalize_axes`` for axes that name dims the op reads (see ``dim_axis``)."""
    if rank == 0 and axes:
        raise ShapeError(f"a 0-d (scalar) input has no axis {axes[0]}; this op needs an input "
                         "of rank >= 1 (reshape the scalar to [1])")
    return normalize_axes(axes, rank)


def normalize_axes(axes: Sequence[int], rank: int) -> list[int]:
    out = [normalize_axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"axes {list(axes)} repeat an axis")
    return out
