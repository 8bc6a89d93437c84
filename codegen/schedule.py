"""Schedule a GraphKernel for the vector unit: the loop space, every value's layout, the steps.

The loop space of a kernel is a matrix of ``M`` rows by ``L`` columns over its largest
tensors (``FULL`` values, all with the same element count, read and written contiguously).
``L`` is the product of the trailing axes that every broadcast and every reduction respects:
the reduced extent when the kernel reduces, else the longest trailing run over which no input
is partly broadcast (``M = 1, L = numel`` for a plain elementwise kernel). Every other value
is held in UB in one of the compact layouts of that matrix:

- ``ROW``     one row of ``L`` (broadcast over the rows; a bias),
- ``COL``     one value per row (a last-axis reduction, a per-channel scale),
- ``SCALAR``  one value (a scalar constant or a one-element input),
- ``PARTIAL`` an input broadcast over some outer axes only; loaded row by row into a full tile.

Views (Reshape, ExpandDims, Squeeze, Identity) do not move data: a view's value shares its
source's storage. The schedule refuses, with a reason, anything outside this model (the
reason becomes the fallback message).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from graphkernel import symbolic
from graphkernel.ir import Dim, DType, Graph, Node, Value

FULL, ROW, COL, SCALAR, PARTIAL = "full", "row", "col", "scalar", "partial"
VIEW_OPS = frozenset({"Reshape", "ExpandDims", "Squeeze", "Identity"})
REDUCE_OPS = {"ReduceSum": "ReduceSum", "ReduceMax": "ReduceMax", "ReduceMin": "ReduceMin"}
UNARY_OPS = {"Exp": "Exp", "Log": "Ln", "Abs": "Abs", "Sqrt": "Sqrt", "Rsqrt": "Rsqrt",
             "Reciprocal": "Reciprocal", "Relu": "Relu", "Neg": None}
TMP_UNARY_OPS = {"Erf": "Erf", "Tanh": "Tanh", "Sigmoid": "Sigmoid"}  # need a scratch buffer
BINARY_OPS = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Maximum": "Max",
              "Minimum": "Min", "Pow": None}
CUBE_OPS = frozenset({"MatMul", "BatchMatMul", "Conv2D"})
FLOATS = frozenset({DType.float32, DType.float16, DType.bfloat16})


class Unsupported(Exception):
    """The generator cannot handle this kernel; the message is the reason shown to the user."""


@dataclass
class KernelIO:
    """A kernel input or output: its GM buffer and how a tile of it sits in UB."""

    index: int
    value: Value          # the subgraph's input/output value
    kind: str
    dtype: DType
    shape: tuple[Dim, ...]
    outer: tuple[Dim, ...] = ()    # PARTIAL: the outer dims a row index decomposes over
    strides: tuple[Dim, ...] = ()  # PARTIAL: the input's element stride per outer dim (0: bcast)


@dataclass
class Schedule:
    node: str                      # the GraphKernel node's name
    name: str                      # a C identifier derived from it
    M: Dim
    L: Dim
    reduce: bool                   # some step reduces the rows: a tile holds whole rows
    inputs: list[KernelIO]
    outputs: list[KernelIO]
    steps: list[Node]              # computing nodes in order (views and constants excluded)
    kind: dict[int, str] = field(default_factory=dict)     # id(value) -> layout
    root: dict[int, Value] = field(default_factory=dict)   # id(view value) -> storage owner
    scalars: dict[int, float] = field(default_factory=dict)  # id(value) -> constant
    notes: list[str] = field(default_factory=list)

    def layout(self, v: Value) -> str:
        return self.kind[id(self.storage(v))]

    def storage(self, v: Value) -> Value:
        return self.root.get(id(v), v)

    @property
    def low_precision(self) -> bool:
        return any(io.dtype != DType.float32 for io in (*self.inputs, *self.outputs))


_IDENT = re.compile(r"[^A-Za-z0-9_]")


def sanitize(name: str) -> str:
    """A C identifier from a user-derived name: nothing but [A-Za-z0-9_], never a keyword."""
    s = _IDENT.sub("_", name)
    return "gk_" + s[:96]


def comment_text(text: str) -> str:
    """Text safe inside a C++ comment: names shown as they are, minus anything else."""
    return re.sub(r"[^A-Za-z0-9_.:\-\[\], ]", "_", text)[:100]


def kernel_symbol(kernel: Node) -> str:
    """The kernel's C name: its sanitized node name plus a hash of its body, so kernels of
    different graphs can share one library and equal bodies share one symbol."""
    body = str(kernel.subgraph) + "|" + ";".join(
        f"{v.type}" for v in (*kernel.subgraph.inputs, *kernel.subgraph.outputs))
    return f"{sanitize(kernel.name)}_{hashlib.sha1(body.encode()).hexdigest()[:8]}"


def _eq(a: Dim, b: Dim) -> bool:
    return symbolic.canon(a) == symbolic.canon(b)


def _trailing_split(shape: tuple[Dim, ...], L: Dim) -> int | None:
    """The axis k with prod(shape[k:]) == L (the outermost such), or None."""
    found = None
    for k in range(len(shape), -1, -1):
        if _eq(symbolic.numel(shape[k:]), L):
            found = k
    return found


def classify(vshape: tuple[Dim, ...], S: tuple[Dim, ...], L: Dim):
    """Layout of a value of shape ``vshape`` used in an op whose output (a FULL value) has
    shape ``S``, under row length ``L``: (kind, outer dims, strides) or None."""
    if len(vshape) > len(S):
        return None
    k = _trailing_split(S, L)
    if k is None:
        return None
    v = (1,) * (len(S) - len(vshape)) + tuple(vshape)
    span = [_eq(a, b) for a, b in zip(v, S, strict=True)]
    bcast = [_eq(a, 1) for a in v]
    if not all(s or b for s, b in zip(span, bcast, strict=True)):
        return None
    inner = "span" if all(span[k:]) else "bcast" if all(bcast[k:]) else None
    outer = "span" if all(span[:k]) else "bcast" if all(bcast[:k]) else "partial"
    if inner is None:
        return None
    if outer == "partial":
        if inner != "span":
            return None
        strides = []
        for i in range(k):
            strides.append(0 if bcast[i] and not span[i] else symbolic.numel(v[i + 1:]))
        return PARTIAL, tuple(S[:k]), tuple(strides)
    return {("span", "span"): FULL, ("bcast", "span"): ROW, ("span", "bcast"): COL,
            ("bcast", "bcast"): SCALAR}[(outer, inner)], (), ()


def _size(d: Dim) -> int:
    """A dim's size for comparisons (symbols assumed large)."""
    c, syms = symbolic.parse_dim(d)
    return c * 4096 ** len(syms)


class _Planner:
    def __init__(self, kernel: Node):
        self.kernel = kernel
        self.sub: Graph = kernel.subgraph
        self.root: dict[int, Value] = {}
        self.scalars: dict[int, float] = {}

    def owner(self, v: Value) -> Value:
        return self.root.get(id(v), v)

    def plan(self) -> Schedule:
        sub = self.sub
        for v in (*sub.inputs, *sub.outputs):
            if v.dtype not in FLOATS:
                raise Unsupported(f"{v.dtype} data (the generator handles float16/bfloat16/"
                                  "float32)")
        steps = []
        for n in sub.nodes:
            if n.op == "Constant":
                self.scalars[id(n.outputs[0])] = float(np.asarray(n.attrs["value"]).reshape(-1)[0])
            elif n.op in VIEW_OPS or (n.op == "Cast" and self._cast_is_view(n)):
                self.root[id(n.outputs[0])] = self.owner(n.inputs[0])
            elif n.op == "BroadcastTo":
                steps.append(n)  # an alias, or materialised when its source is compact
            elif n.op in CUBE_OPS:
                raise Unsupported(f"{n.op} is a cube op; the generator emits vector code")
            elif (n.op in UNARY_OPS or n.op in TMP_UNARY_OPS or n.op in BINARY_OPS
                  or n.op in REDUCE_OPS):
                steps.append(n)
            elif n.op == "Cast":
                raise Unsupported("Cast to a lower precision inside a kernel")
            else:
                raise Unsupported(f"{n.op} not supported by codegen")
        N = max((v.type.numel for v in self._all_values()), key=_size)
        reduces = [n for n in steps if n.op in REDUCE_OPS]
        L = self._row_length(steps, reduces, N)
        M = symbolic.div(N, L)
        if M is None:
            raise Unsupported(f"row length {L} does not divide the element count {N}")
        kind = self._layouts(steps, N, L)
        ins = [self._io(i, v, kind) for i, v in enumerate(sub.inputs)]
        outs = [self._io(i, v, kind) for i, v in enumerate(sub.outputs)]
        for o in outs:
            if o.kind not in (FULL, COL):
                raise Unsupported(f"output {o.value.name} is a broadcast ({o.kind}) value")
            if o.kind == COL and not reduces:
                raise Unsupported(f"output {o.value.name} is smaller than the loop space")
        sched = Schedule(self.kernel.name, kernel_symbol(self.kernel), M, L, bool(reduces),
                         ins, outs, steps, kind, self.root, self.scalars)
        for io in ins:
            if io.kind == PARTIAL:
                sched.notes.append(f"input {io.index} ({io.value.name}) is broadcast over outer "
                                   "axes: its rows are re-read for every row that uses them")
            elif io.kind == ROW:
                sched.notes.append(f"input {io.index} ({io.value.name}) is a broadcast row: each "
                                   "core reads it once (once per column tile when rows are "
                                   "split)")
            elif io.kind == COL and not reduces:
                sched.notes.append(f"input {io.index} ({io.value.name}) holds one value per row: "
                                   "re-read for each column tile when rows are split")
        return sched

    def _all_values(self):
        yield from self.sub.inputs
        for n in self.sub.nodes:
            yield from n.outputs

    def _cast_is_view(self, n: Node) -> bool:
        """A float cast is free inside a kernel (everything is fp32 in UB) when it widens, or
        when its result only leaves the kernel (the store rounds it)."""
        src, dst = n.inputs[0].dtype, n.outputs[0].dtype
        if src not in FLOATS or dst not in FLOATS:
            raise Unsupported(f"Cast {src} -> {dst} (integer casts are not generated)")
        if dst == DType.float32 or src == dst:
            return True
        out = n.outputs[0]
        return not out.users and any(o is out for o in self.sub.outputs)

    def _row_length(self, steps: list[Node], reduces: list[Node], N: Dim) -> Dim:
        if reduces:
            L = None
            for n in reduces:
                shape = n.inputs[0].shape
                axes = n.attrs.get("axis")
                axes = list(range(len(shape))) if not axes else sorted(a % len(shape) for a in axes)
                if axes != list(range(len(shape) - len(axes), len(shape))):
                    raise Unsupported(f"{n.op} over axes {axes} of a rank-{len(shape)} tensor "
                                      "(only trailing-axis reductions are generated)")
                if not _eq(n.inputs[0].type.numel, N):
                    raise Unsupported(f"{n.op} of a value smaller than the kernel's loop space")
                r = symbolic.numel(shape[len(shape) - len(axes):])
                if L is not None and not _eq(L, r):
                    raise Unsupported(f"reductions over different extents ({L} and {r})")
                L = r
            self._check_uses(steps, N, L)
            return L
        candidates = None
        for n in steps:
            S = n.outputs[0].shape
            if not _eq(n.outputs[0].type.numel, N):
                continue
            for v in n.inputs:
                if _eq(v.type.numel, N) or id(v) in self.scalars or _eq(v.type.numel, 1):
                    continue
                ok = {symbolic.canon(symbolic.numel(S[k:])) for k in range(len(S) + 1)
                      if classify(tuple(v.shape), tuple(S), symbolic.numel(S[k:]))}
                candidates = ok if candidates is None else candidates & ok
        if candidates is None:
            return N
        if not candidates:
            raise Unsupported("no row split suits every broadcast in the kernel")
        return max(candidates, key=_size)

    def _check_uses(self, steps: list[Node], N: Dim, L: Dim) -> None:
        for n in steps:
            if n.op in REDUCE_OPS or not _eq(n.outputs[0].type.numel, N):
                continue
            for v in n.inputs:
                if id(v) in self.scalars:
                    continue
                if classify(tuple(v.shape), tuple(n.outputs[0].shape), L) is None:
                    raise Unsupported(f"{n.op} broadcasts {v.name} in a way that does not "
                                      f"follow rows of {L}")

    def _layouts(self, steps: list[Node], N: Dim, L: Dim) -> dict[int, str]:
        kind: dict[int, str] = {}
        self.partial: dict[int, tuple] = {}
        for v in self.sub.inputs:
            if _eq(v.type.numel, N):
                kind[id(v)] = FULL
            elif _eq(v.type.numel, 1):
                kind[id(v)] = SCALAR
        for c in self.scalars:
            kind[c] = SCALAR
        for n in steps:
            out = n.outputs[0]
            full_space = _eq(out.type.numel, N)
            for v in n.inputs:
                o = self.owner(v)
                if id(o) in kind:
                    continue
                if not full_space:
                    raise Unsupported(f"cannot place {v.name} (used by {n.op} on a compact "
                                      "value) in the loop space")
                c = classify(tuple(v.shape), tuple(out.shape), L)
                if c is None:
                    raise Unsupported(f"{n.op} broadcasts {v.name} in a way that does not "
                                      f"follow rows of {L}")
                kind[id(o)] = c[0]
                if c[0] == PARTIAL:
                    self.partial[id(o)] = (c[1], c[2])
            srcs = [kind[id(self.owner(v))] for v in n.inputs]
            if n.op in REDUCE_OPS:
                if srcs[0] not in (FULL, PARTIAL):
                    raise Unsupported(f"{n.op} of a {srcs[0]} value")
                kind[id(out)] = COL
            elif n.op == "BroadcastTo" and (srcs[0] in (FULL, PARTIAL) or not full_space):
                self.root[id(out)] = self.owner(n.inputs[0])
            elif n.op == "BroadcastTo":
                kind[id(out)] = FULL
            else:
                kind[id(out)] = _join(srcs)
        return kind

    def _io(self, i: int, v: Value, kind: dict[int, str]) -> KernelIO:
        o = self.owner(v)
        k = kind.get(id(o))
        if k is None:
            raise Unsupported(f"value {v.name} is not used by any computing op")
        outer, strides = self.partial.get(id(o), ((), ()))
        return KernelIO(i, v, k, v.dtype, tuple(v.shape), outer, strides)


def _join(kinds: list[str]) -> str:
    ks = set(kinds) - {SCALAR}
    if not ks:
        return SCALAR
    if ks & {FULL, PARTIAL} or ks == {ROW, COL}:
        return FULL
    return ks.pop()


def plan(kernel: Node) -> Schedule:
    """The schedule of a GraphKernel node, or Unsupported with the reason."""
    return _Planner(kernel).plan()
