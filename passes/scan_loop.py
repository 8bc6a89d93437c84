"""Rewrite a recurrence unrolled step by step → one Scan, per-step writes of rows → a Concat,
and a Concat of the same work done on each step → that work done once on whole tensors.

A loop over a sequence that torch.export or an ONNX export traces is unrolled: a state-space
model's selective scan becomes, for each of L positions t, ``h = a[:, :, t] * h + b[:, :, t]``
(from ``h = 0``) and a readout of ``h`` with ``C[:, t]``, the L readouts stacked at the end.
That is a few small ops per position, each a launch of its own or a kernel boundary, where
the work is one scan and one reduction over whole tensors (what torch.compile's trace of the
same model, an associative scan, already reaches through the ``scan`` pass). Two rewrites,
both exact (the same float operations in the same order):

* **the recurrence**: a chain ``h[t] = a_t * h[t-1] + b_t``, t = 0..L-1, started from a
  constant zero, where ``a_t`` and ``b_t`` are position t of one axis of tensors A and B of
  one shape and that axis has exactly L positions, becomes ``S = Scan(A, B, linear)`` along
  that axis, each ``h[t]`` position t of S (the Scan starts from zero too:
  ``h[0] = a_0 * 0 + b_0``, so an infinite ``a_0`` gives NaN on both sides).
* **the re-roll**: ``Concat(v_0 .. v_{L-1})`` where every ``v_t`` is the same expression
  (the same ops and attributes) of position t of some tensors' axis (that axis has exactly L
  positions) and of values shared by all t, becomes the expression computed once with that
  axis kept, then a view into the Concat's shape. Only elementwise ops, casts, reductions and
  views take part; the rewrite is refused (the graph left as it was) when the kept axis would
  need data moved (it must sit where the Concat puts it, or only size-1 axes lie between).
* **the row writes**: a loop that writes one row of an output per step (``out[:, t] = y``,
  transformers' CPU recurrences), traced through torch.compile, is a chain of Selects over
  the whole output: functionalization and the core decompositions write row t as
  ``Select(arange(L) == t, broadcast(y), out)``. A chain of at least two Selects whose masks
  are constants true on one run of positions of one axis (size 1 on every other axis), each
  write read only by the next, becomes the Concat of the rows each position last got (rows
  never written from the value written into): the same elements, moved, not computed. A
  slice along that axis of one write that reads only rows it wrote, or only rows it kept,
  reads them from the written value or from the value before (a cache written a column per
  layer and read back by the next layer), so the writes before it end no chain. The Concat
  is then the re-roll's (one Scan's rows: the Scan itself).
* **the loop**: a Concat of rows ``y_t`` of a recurrence whose step carries several states
  (RWKV's WKV: a numerator, a denominator and a running maximum, updated with exp, max, mul
  and add; no single-state ``a * h + b``) becomes one ``Scan`` with ``combine="loop"``
  holding one step's ops. Each value is labelled with the last step it reads (position t of
  a tensor of the Concat's shape along its axis); a step's work is walked from its row and
  from the values the next step reads of it, its leaves being position t of a tensor, values
  no step computes (shared by all) and values of the step before (the states). Steps s0..L-1
  that do one template step's work (the same ops with the same operands in the same order;
  the last steps may do only the part anything reads) become the loop, from the states step
  s0 read. The first step reads the initial constants, which constant folding and CSE leave
  in another form: when it is elementwise work on rows too, it is the loop's own first step
  (``first``: its ops run at position 0 and leave the states, so no step stays outside and
  no Concat is left); else (or when it reads a slice of a larger tensor computed at run
  time, a cache's column, which the loop's kernel would have to read broadcast over its
  rows; logged) it stays, and the loop starts from the values it leaves. A value of the
  first step's that is work on constants only (a column of a cache before anything is
  written: the row writes read it from the constant the cache starts as) is folded first
  to a compact constant of at most a row, as constant folding would (the interpreter's
  op-by-op semantics), and elementwise work on it and on other values redone on that
  constant, so such a step runs inside the loop. Exact: the loop runs the same ops in the
  same order on the same values (the last step's updates of states nothing reads are run
  and dropped). Refused, with the reason logged: a step that reduces, broadcasts or does
  work other than the elementwise ops of ``LOOP_OPS`` (``opdefs/scan.py``) across the
  carried row, a step reading a value two steps back, a last step that differs from the
  steps before, fewer than two like steps, and steps whose values are read outside them (a
  training graph saving them for the backward pass: the unrolled steps would stay beside
  the loop).
* **the first coefficient**: a linear Scan's first coefficient multiplies the zero it starts
  from, so a constant factor of the coefficients that is 1 at every later position and within
  [-1, 1] at the first (a reset mask ``~(pos == 0)`` of a gated recurrence) is dropped: ``a_0
  * c_0 * 0`` and ``a_0 * 0`` are both zero for a finite ``a_0`` (|c_0| <= 1: no overflow)
  and both NaN for an infinite or NaN one, so the results are equal (up to the sign of a
  zero). The kernel around the scan then has no per-position constant to read.

Runs after ``matvec``, which makes the per-step products of width 1 (``h @ C[:, t]``)
elementwise products and sums that the re-roll can take.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops
from graphkernel.interpreter import Interpreter
from graphkernel.ir import Graph, Node, Value
from graphkernel.opdefs.scan import LOOP_OPS
from graphkernel.ops import OpKind
from graphkernel.passes.rewrite import add_like, const_array, splat
from graphkernel.registry import PassResult, counted

MAX_TREE = 64  # nodes of one step's expression the re-roll walks (a step's readout is a few)
_AXIS_ATTRS = frozenset({"axis", "axes", "perm", "shape", "data_format", "begin", "end"})


def _position(v: Value) -> tuple[Value, int, int, bool] | None:
    """(X, axis, t, dropped) when ``v`` is position t of one static axis of X: a unit
    StridedSlice of X (``dropped`` False), or that slice with its axis squeezed away (True)."""
    p = v.producer
    dropped = False
    if p is not None and p.op == "Squeeze":
        s = p.inputs[0].producer
        axes = p.attrs.get("axis")
        if s is None or s.op != "StridedSlice" or not axes or len(axes) != 1:
            return None
        p, dropped, sq = s, True, axes[0] % s.outputs[0].type.rank
    if p is None or p.op != "StridedSlice":
        return None
    a = p.attrs
    axes, strides = a.get("axes"), a.get("strides")
    if not axes or len(axes) != 1 or len(a["begin"]) != 1 or (strides and strides != [1]):
        return None
    x = p.inputs[0]
    ax = axes[0] % x.type.rank
    size, t, end = x.shape[ax], a["begin"][0], a["end"][0]
    if not isinstance(size, int) or t < 0 or end != t + 1 or end > size:
        return None
    if dropped and sq != ax:
        return None
    return x, ax, t, dropped


# ---------------------------------------------------------------------------- the recurrence


def _step(h: Value, a_src: tuple[Value, int], t: int) -> tuple[Node, Node, Value] | None:
    """The Mul and Add of ``a_t * h + b_t`` reading ``h``, with the B it slices."""
    for mul in h.users:
        if mul.op != "Mul" or len(mul.inputs) != 2:
            continue
        other = mul.inputs[1] if mul.inputs[0] is h else mul.inputs[0]
        pos = _position(other)
        if pos is None or not pos[3] or (pos[0], pos[1]) != a_src or pos[2] != t:
            continue
        m = mul.outputs[0]
        for add in m.users:
            if add.op != "Add" or len(add.inputs) != 2:
                continue
            b = add.inputs[1] if add.inputs[0] is m else add.inputs[0]
            bpos = _position(b)
            if bpos is None or not bpos[3] or bpos[1] != a_src[1] or bpos[2] != t:
                continue
            if bpos[0].type != a_src[0].type or add.outputs[0].type != m.type:
                continue
            return mul, add, bpos[0]
    return None


def _recurrence(mul: Node) -> tuple[Value, Value, int, list[Value]] | None:
    """(A, B, axis, [h_0 .. h_{L-1}]) of a recurrence whose first step multiplies a_0 by a
    constant zero in ``mul``."""
    for i, zero in enumerate(mul.inputs):
        a0 = mul.inputs[1 - i]
        if zero.producer is None or zero.producer.op != "Constant":
            continue
        pos = _position(a0)  # (before the constant's values: a splat reads a whole weight)
        if pos is None or not pos[3] or pos[2] != 0 or not a0.dtype.is_float or \
                splat(zero) != 0.0:
            continue
        A, axis = pos[0], pos[1]
        if mul.outputs[0].type != a0.type:  # the zero only broadcast into a_0's shape
            continue
        first = _step(zero, (A, axis), 0)
        if first is None or first[0] is not mul:
            continue
        B, hs = first[2], [first[1].outputs[0]]
        while len(hs) < A.shape[axis]:
            nxt = _step(hs[-1], (A, axis), len(hs))
            if nxt is None or nxt[2] is not B:
                break
            hs.append(nxt[1].outputs[0])
        if len(hs) == A.shape[axis] and len(hs) > 1:
            return A, B, axis, hs
    return None


def _scans(graph: Graph, ctx) -> list[str]:
    notes = []
    for mul in list(graph.nodes):
        if mul.graph is None or mul.op != "Mul" or len(mul.inputs) != 2:
            continue
        found = _recurrence(mul)
        if found is None:
            continue
        A, B, axis, hs = found
        last = hs[-1].producer
        if not ctx.should_apply(f"{last.name} a recurrence over {len(hs)} steps as a Scan",
                                [h.producer for h in hs]):
            continue
        scan = add_like(graph, last, "Scan", [A, B], {"axis": axis, "combine": "linear"})
        rank = A.type.rank
        for t, h in enumerate(hs):
            step = add_like(graph, h.producer, "StridedSlice", [scan],
                            {"begin": [t], "end": [t + 1], "strides": [1], "axes": [axis]})
            graph.replace_all_uses(h, add_like(graph, h.producer, "Squeeze", [step],
                                               {"axis": [axis % rank]}))
        notes.append(f"{last.name}: a recurrence over {len(hs)} steps of "
                     f"{A.producer.name if A.producer else A.name} as one Scan")
    return notes


# ---------------------------------------------------------------------------- the re-roll


class _Refused(Exception):
    pass


def _identity(n: Node) -> bool:
    """A slice, or a view, that gives its input as it is (an export's ``x[:, :, 0]`` of an
    axis of 1 then unsqueezed back)."""
    return n.op in ("StridedSlice", "Reshape", "Identity") and \
        n.outputs[0].type == n.inputs[0].type


def _batchable(n: Node) -> bool:
    if _identity(n):
        return True
    if n.op in ("Reshape", "ExpandDims", "Squeeze", "Transpose", "Cast"):
        return True
    if n.op.startswith("Reduce"):
        return set(n.attrs) <= {"axis", "keep_dims"}
    opdef = ops.get(n.op)
    return (opdef.kind == OpKind.ELEMWISE and len(n.outputs) == 1
            and not _AXIS_ATTRS & set(n.attrs) and n.op != "BiasAdd")


class _Reroll:
    """The expression of one Concat's operands, built once with the step axis kept.

    A batched value is (value, p): the per-step value's shape with the L steps inserted as
    axis p."""

    def __init__(self, graph: Graph, cat: Node, steps: int) -> None:
        self.graph, self.cat, self.L = graph, cat, steps
        self.made: dict[int, tuple[Value, int]] = {}
        self.walked = 0

    def view(self, v: Value, shape: list) -> Value:
        if list(v.shape) == list(shape):
            return v
        return add_like(self.graph, self.cat, "Reshape", [v], {"shape": list(shape)})

    def move(self, v: Value, per: list, p: int, q: int) -> Value:
        """``v`` (per-step shape ``per``, steps at p) with the steps at q: a view when only
        size-1 axes lie between."""
        if p == q:
            return v
        lo, hi = min(p, q), max(p, q)
        if any(d != 1 for d in per[lo:hi]):
            raise _Refused
        return self.view(v, per[:q] + [self.L] + per[q:])

    def build(self, vs: list[Value]) -> tuple[Value, int]:
        first = vs[0]
        if all(v is first for v in vs):
            raise _Refused  # (shared values are handled by their users)
        key = id(first)
        if key in self.made:
            return self.made[key]
        self.walked += 1
        if self.walked > MAX_TREE:
            raise _Refused
        pos = [_position(v) for v in vs]
        if all(x is not None for x in pos):
            xs = {(x[0], x[1], x[3]) for x in pos}
            if len(xs) == 1 and [x[2] for x in pos] == list(range(self.L)):
                X, ax, dropped = pos[0][0], pos[0][1], pos[0][3]
                if X.shape[ax] == self.L:  # the whole axis, in order
                    per = list(first.shape)
                    out = (X, ax) if dropped else (self.view(X, per[:ax] + [self.L] + per[ax:]),
                                                   ax)
                    self.made[key] = out
                    return out
        ns = [v.producer for v in vs]
        n0 = ns[0]
        if any(n is None for n in ns) or not _batchable(n0) or any(
                n.op != n0.op or n.attrs != n0.attrs or len(n.inputs) != len(n0.inputs)
                or v.type != first.type for n, v in zip(ns, vs, strict=True)):
            raise _Refused
        args = [[n.inputs[i] for n in ns] for i in range(len(n0.inputs))]
        out = self.apply(n0, args)
        self.made[key] = out
        return out

    def apply(self, n0: Node, args: list[list[Value]]) -> tuple[Value, int]:
        per_out = list(n0.outputs[0].shape)
        rank = len(per_out)
        if _identity(n0):
            return self.build(args[0])
        if n0.op in ("Reshape", "ExpandDims", "Squeeze", "Transpose", "Cast") or \
                n0.op.startswith("Reduce"):
            x, p = self.build(args[0])
            per_in = list(args[0][0].shape)
            return self.unary(n0, x, p, per_in, per_out)
        # elementwise: every operand in the output's rank, the steps at one place
        batched = []
        for vs in args:
            if all(v is vs[0] for v in vs):
                batched.append(None)
            else:
                batched.append(self.build(vs))
        places = [b[1] + rank - len(vs[0].shape) for b, vs in zip(batched, args, strict=True)
                  if b is not None]
        for q in dict.fromkeys(places):
            try:
                ins = [self.operand(vs, b, rank, q) for vs, b in zip(args, batched, strict=True)]
            except _Refused:
                continue
            return add_like(self.graph, n0, n0.op, ins, dict(n0.attrs)), q
        raise _Refused

    def operand(self, vs: list[Value], b: tuple[Value, int] | None, rank: int, q: int
                ) -> Value:
        per = list(vs[0].shape)
        pad = rank - len(per)
        if b is None:  # shared: broadcast over the steps, whose axis it may have to gain
            if pad >= q:
                return vs[0]
            at = q - pad
            return self.view(vs[0], per[:at] + [1] + per[at:])
        full = [1] * pad + per
        x = self.view(b[0], full[:b[1] + pad] + [self.L] + full[b[1] + pad:])
        return self.move(x, full, b[1] + pad, q)

    def unary(self, n0: Node, x: Value, p: int, per_in: list, per_out: list
              ) -> tuple[Value, int]:
        g, op, a = self.graph, n0.op, n0.attrs
        if op == "Cast":
            return add_like(g, n0, op, [x], dict(a)), p
        if op.startswith("Reduce"):
            axes = sorted(ax % len(per_in) for ax in (a.get("axis") or range(len(per_in))))
            new = [ax + (ax >= p) for ax in axes]
            q = p if a.get("keep_dims") else p - sum(ax < p for ax in axes)
            return add_like(g, n0, op, [x], {"axis": new, "keep_dims": a.get("keep_dims",
                                                                            False)}), q
        if op == "Transpose":
            perm = [ax + (ax >= p) for ax in a["perm"]]
            q = next((i for i, ax in enumerate(a["perm"]) if ax >= p), len(perm))
            return add_like(g, n0, op, [x], {"perm": perm[:q] + [p] + perm[q:]}), q
        # views: the steps stay between the same elements when the prefix keeps its size
        before = 1
        for d in per_in[:p]:
            before *= d
        run = 1
        for q in range(len(per_out) + 1):
            if run == before:
                return self.view(x, per_out[:q] + [self.L] + per_out[q:]), q
            if q < len(per_out):
                run *= per_out[q]
        raise _Refused

    def finish(self) -> Value:
        cat = self.cat
        out = list(cat.outputs[0].shape)
        c = cat.attrs["axis"] % len(out)
        per = list(cat.inputs[0].shape)
        x, p = self.build(list(cat.inputs))
        if p == c or (p == c + 1 and per[c] == 1):
            return self.view(x, out)
        raise _Refused


def _attempt(graph: Graph, ctx, cat: Node, what: str, build, refusal: str = "",
             log: list[str] | None = None):
    """``build()``'s result, the nodes it made kept; None, with them erased, when it raises
    _Refused (logged as ``refusal: reason`` when both are given) or the flags turn ``what``
    off. ``log``: lines the build leaves, logged after it succeeds."""
    with graph.recording() as made:
        try:
            found = build()
            for line in log or ():
                ctx.log(f"{cat.name}: {line}")
        except _Refused as e:
            found = None
            if refusal and str(e):
                ctx.log(f"{cat.name}: {refusal}: {e}")
        if found is not None and not ctx.should_apply(what, [cat]):
            found = None
    if found is None:
        for m in reversed(made):
            graph.erase_node(m)
    return found


def _rerolls(graph: Graph, ctx) -> list[str]:
    notes = []
    for cat in list(graph.nodes):
        if cat.graph is None or cat.op != "Concat" or len(cat.inputs) < 2:
            continue
        ins = cat.inputs
        if len({x.type for x in ins}) != 1 or not all(isinstance(d, int) for d in
                                                      ins[0].shape):
            continue
        new = _attempt(graph, ctx, cat, f"{cat.name} the same work on {len(ins)} steps, done once",
                       _Reroll(graph, cat, len(ins)).finish)
        if new is None:
            continue
        graph.replace_all_uses(cat.outputs[0], new)
        notes.append(f"{cat.name}: the same work on {len(ins)} steps done once on whole "
                     "tensors")
    return notes


# ---------------------------------------------------------------------------- the loop


class _Step:
    """One step's work, walked from its roots (its output row, then the values the next step
    reads of it): ``entries`` its ops in post-order as (op, operand descriptors), ``roots``
    the roots' descriptors, ``carried`` the values of the step before it reads, in the order
    met, and ``first`` how many entries the first root alone needs."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, tuple]] = []
        self.roots: list[tuple] = []
        self.carried: list[Value] = []
        self.counts: list[int] = []  # entries after each root
        self.nodes: list[Node] = []   # the step's nodes, as entries


class _Loop:
    """An unrolled recurrence carrying several states, stacked by a Concat: the steps that do
    the same work (the same ops in the same order on position t of the same tensors, values
    shared by all steps and values of the step before) as one ``Scan`` with a step body."""

    def __init__(self, graph: Graph, cat: Node) -> None:
        self.graph, self.cat = graph, cat
        out = cat.outputs[0]
        self.shape, self.c = list(out.shape), cat.attrs["axis"] % out.type.rank
        self.L = self.shape[self.c]
        self.row = self.shape[:self.c] + self.shape[self.c + 1:]
        self.dtype = out.dtype
        self.label: dict[int, int | None] = {}
        self.leaf: dict = {}  # the tensors and shared values the steps read, by key
        self.keys: dict[int, tuple] = {}
        self.log: list[str] = []  # what the loop left apart, and why

    def labels(self) -> None:
        for n in self.graph.nodes:  # (graph order is topological) the last step each value reads
            for v in n.outputs:
                pos = self.seq(v)
                if pos is not None:
                    self.label[id(v)] = pos[1]
                    continue
                labs = [self.label.get(id(x)) for x in n.inputs]
                labs = [x for x in labs if x is not None]
                self.label[id(v)] = max(labs) if labs else None

    def seq(self, v: Value) -> tuple[Value, int] | None:
        """(X, t) when ``v`` is position t of X along the Concat's axis, X of its shape."""
        pos = _position(v)
        if pos is None or not pos[3] or pos[1] != self.c or list(pos[0].shape) != self.shape \
                or pos[0].dtype != self.dtype:
            return None
        return pos[0], pos[2]

    def shared(self, v: Value) -> tuple:
        """A key of a value no step computes: the value itself, or for work on such values
        the op, its attributes and its operands' keys (the same work in each step, left
        apart by a graph that was not CSE'd, is one value read by every step)."""
        key = self.keys.get(id(v))
        if key is None:
            p = v.producer
            if p is None or p.op == "Constant" or len(p.outputs) != 1:
                key = ("value", id(v))
            else:
                key = (p.op, repr(sorted(p.attrs.items())),
                       tuple(self.shared(x) for x in p.inputs))
            self.keys[id(v)] = key
        return key

    def piece(self, u: Value) -> Value:
        p = u.producer
        if p is None or p.op not in ("ExpandDims", "Reshape") or \
                list(p.inputs[0].shape) != self.row:
            raise _Refused("a stacked row is not a value of one step")
        return p.inputs[0]

    def walk(self, roots: list[Value], t: int) -> _Step:
        st = _Step()
        slot: dict[int, tuple] = {}

        def visit(v: Value, depth: int) -> tuple:
            if id(v) in slot:
                return slot[id(v)]
            lab = self.label.get(id(v))
            pos = self.seq(v)
            if pos is not None and pos[1] == t:
                d = ("seq", id(pos[0]))
                self.leaf[d[1]] = pos[0]
            elif lab is None:
                d = ("shared", self.shared(v))
                self.leaf[d[1]] = v
            elif lab == t - 1:
                st.carried.append(v)
                d = ("carry", len(st.carried) - 1)
            elif lab != t:
                raise _Refused(f"step {t} reads {v.name}, a value of step {lab}")
            else:
                n = v.producer
                if n.op not in LOOP_OPS or n.attrs or len(n.outputs) != 1:
                    raise _Refused(f"{n.name} ({n.op}) in step {t} is not elementwise work "
                                   "without attributes")
                if list(v.shape) != self.row or v.dtype != self.dtype:
                    raise _Refused(f"{n.name} in step {t} is not a whole row (a step that "
                                   "reduces or broadcasts across the carried row)")
                if depth > MAX_TREE or len(st.entries) >= MAX_TREE:
                    raise _Refused(f"step {t} holds over {MAX_TREE} ops")
                ins = tuple(visit(x, depth + 1) for x in n.inputs)
                st.entries.append((n.op, ins))
                st.nodes.append(n)
                d = ("node", len(st.entries) - 1)
            slot[id(v)] = d
            return d

        for r in roots:
            st.roots.append(visit(r, 0))
            st.counts.append(len(st.entries))
        return st

    def find(self) -> tuple[int, _Step, list[Value]]:
        """(s0, the step's work, the values step s0 reads of step s0 - 1): steps s0..L-1 do
        the work of one template step (the last steps only part of it: nothing reads what
        they would leave for the steps after the end), s0 >= 1 (the first step reads the
        initial states, which constant folding and CSE leave in another form)."""
        L = self.L
        if L < 3:
            raise _Refused(f"{L} steps")
        self.ws = ws = [self.piece(u) for u in self.cat.inputs]
        self.labels()
        if any(self.label.get(id(w)) != t for t, w in enumerate(ws)):
            raise _Refused("the stacked rows are not one per step")
        walks: dict[int, _Step] = {}
        carried: list[Value] = []
        for t in range(L - 1, 0, -1):
            try:
                walks[t] = self.walk([ws[t], *carried], t)
            except _Refused:
                if t >= L - 2:
                    raise
                break
            carried = walks[t].carried
        lo = min(walks)
        while True:  # the template: the step of most work among a run that does its work
            best = max(range(lo, L), key=lambda t: len(walks[t].entries))
            tmpl, s0 = walks[best], L
            while s0 - 1 >= lo and _fits(walks[s0 - 1], tmpl):
                s0 -= 1
            if s0 == L:
                raise _Refused("the last step does not do the work of the steps before it")
            if s0 <= best:
                break
            lo = s0
        live, todo = set(), [v.producer for v in self.graph.outputs if v.producer]
        while todo:  # (dead users, a last step's updates nothing reads, do not count)
            n = todo.pop()
            if id(n) not in live:
                live.add(id(n))
                todo += [x.producer for x in n.inputs if x.producer is not None]
        inside = {id(n) for t in range(s0, L) for n in walks[t].nodes}
        inside |= {id(u.producer) for u in self.cat.inputs}
        for t in range(s0, L):
            for n in walks[t].nodes:
                v = n.outputs[0]
                if self.graph.is_output(v) or any(
                        id(u) not in inside and id(u) in live for u in v.users):
                    raise _Refused(f"{v.name} of step {t} is read outside the steps (a value "
                                   "saved for a backward pass): the unrolled steps would stay")
        K = len(tmpl.carried)
        if K == 0:
            raise _Refused("no state carried from one step to the next")
        if L - s0 < 2 or len(tmpl.roots) - 1 != K or len(walks[s0].carried) != K:
            raise _Refused(f"no run of steps carrying one set of states (steps {s0}..{L - 1})")
        return s0, tmpl, walks[s0].carried

    def build(self) -> tuple[Value, int, int, int]:
        s0, tmpl, init = self.find()
        g, cat, c = self.graph, self.cat, self.c
        first = None
        if s0 == 1:  # the first step's own work, when it is elementwise work on rows too
            try:
                first = self.walk([self.ws[0], *init], 0)
            except _Refused:
                first = None
            if first is not None:
                for d in (*first.roots, *(x for _, ins in first.entries for x in ins)):
                    if d[0] == "shared" and const_array(self.leaf[d[1]]) is None:
                        # (work on constants only: its value, compact)
                        self.leaf[d[1]] = _compacted(g, cat, self.leaf[d[1]], self.row)
                part = [self.leaf[d[1]].name for d in
                        (*first.roots, *(x for _, ins in first.entries for x in ins))
                        if d[0] == "shared" and _part_of(self.leaf[d[1]])]
                if part:
                    # a part of a larger tensor (a cache's column) broadcast over the loop's
                    # rows is no read of whole rows the loop's kernel takes: the first step
                    # stays, computing the states as values of their own
                    self.log.append(f"its first step stays apart: it reads {part[0]}, a part "
                                    "of a larger tensor computed at run time")
                    first = None
        start = 0 if first is not None else s0
        full = self.shape[:c] + [self.L - start] + self.shape[c + 1:]
        one = self.shape[:c] + [1] + self.shape[c + 1:]
        K = len(init)
        operands: list[Value] = []
        if first is None:
            for v in init:  # the states before step s0: the first position of K operands
                operands.append(add_like(g, cat, "BroadcastTo", [add_like(
                    g, cat, "Reshape", [v], {"shape": one})], {"shape": full}))
        slots: dict[tuple, int] = {("carry", k): k for k in range(K)}
        leaves = {}
        for st in (tmpl, first) if first is not None else (tmpl,):
            for _, ins in st.entries:
                for d in ins:
                    if d[0] in ("seq", "shared"):
                        leaves.setdefault(d, None)
            for d in st.roots:
                if d[0] in ("seq", "shared"):
                    leaves.setdefault(d, None)
        for d in leaves:
            v = self.leaf[d[1]]
            if d[0] == "seq":
                x = v if start == 0 else add_like(g, cat, "StridedSlice", [v], {
                    "begin": [start], "end": [self.L], "strides": [1], "axes": [c]})
            else:
                pad = [1] * (len(self.row) - v.type.rank) + list(v.shape)
                if len(pad) != len(self.row) or v.dtype != self.dtype or any(
                        a not in (1, b) for a, b in zip(pad, self.row, strict=True)):
                    raise _Refused(f"{v.name}, read by every step, does not broadcast to "
                                   "the row")
                x = add_like(g, cat, "BroadcastTo", [add_like(
                    g, cat, "Reshape", [v], {"shape": pad[:c] + [1] + pad[c:]})],
                    {"shape": full})
            slots[d] = K + len(operands)
            operands.append(x)
        base = K + len(operands)

        def ops_of(st: _Step) -> tuple[list[str], list[list[int]], list[int], int]:
            own = dict(slots)
            for j in range(len(st.entries)):
                own[("node", j)] = base + j
            return ([op for op, _ in st.entries], [[own[d] for d in ins] for _, ins in
                                                   st.entries],
                    [own[d] for d in st.roots[1:]], own[st.roots[0]])

        body, args, states, out = ops_of(tmpl)
        attrs = {"axis": c, "combine": "loop", "body": body, "args": args,
                 "states": states, "out": out}
        if first is not None:
            attrs["first"], attrs["first_args"], attrs["first_states"], attrs["first_out"] = \
                ops_of(first)
            return add_like(g, cat, "Scan", operands, attrs), 0, K, len(body)
        y = add_like(g, cat, "Scan", operands, attrs)
        return add_like(g, cat, "Concat", [*cat.inputs[:s0], y], {"axis": c}), s0, K, len(body)


def _folded(g: Graph, at: Node, v: Value, row: list) -> Value | None:
    """``v`` as one compact Constant when it is work on constants only (a slice of a
    constant, a cache's column before anything is written, and elementwise work on it), no
    larger than a row; else None. Exact: the interpreter's op-by-op semantics, once."""
    if const_array(v) is not None:
        return v
    arr = _fold_array(v, int(np.prod(row)), 0)
    if arr is None:
        return None
    return g.add_node("Constant", [], {"value": np.ascontiguousarray(arr)},
                      name=g.fresh_name(f"{v.name}_folded"), origin=at.origin).outputs[0]


def _fold_array(v: Value, most: int, depth: int) -> np.ndarray | None:
    arr = const_array(v)
    if arr is not None:
        return arr
    p = v.producer
    if p is None or depth > MAX_TREE or len(p.outputs) != 1 or not p.inputs or \
            p.op in ("Opaque", "Assign", "GraphKernel") or not v.type.is_static or \
            v.type.numel > most:
        return None
    ins = [_fold_array(x, most, depth + 1) for x in p.inputs]
    if any(x is None for x in ins):
        return None
    t = Graph("fold")
    n = t.add_node(p.op, [t.const(x) for x in ins], p.attrs)
    t.set_outputs(n.outputs)
    return Interpreter(t).run({})[0]


def _compacted(g: Graph, at: Node, v: Value, row: list, depth: int = 0) -> Value:
    """``v`` with its work on constants only folded (``_folded``): elementwise work of
    ``LOOP_OPS`` on such work and on other values redone on the folded constants."""
    k = _folded(g, at, v, row)
    if k is not None:
        return k
    p = v.producer
    if p is None or depth > MAX_TREE or p.op not in LOOP_OPS or p.attrs or len(p.outputs) != 1:
        return v
    ins = [_compacted(g, at, x, row, depth + 1) for x in p.inputs]
    if all(a is b for a, b in zip(ins, p.inputs, strict=True)):
        return v
    return add_like(g, at, p.op, ins)


def _part_of(v: Value) -> bool:
    """A slice (squeezed or not) that takes part of its input."""
    p = v.producer
    if p is not None and p.op in ("Squeeze", "Reshape"):
        p = p.inputs[0].producer
    return p is not None and p.op == "StridedSlice" and \
        p.outputs[0].type.numel != p.inputs[0].type.numel


def _fits(st: _Step, tmpl: _Step) -> bool:
    """Whether a step does the template's work for the first of its roots (the template's
    first roots, its entries the template's first ones)."""
    m = len(st.roots)
    return m <= len(tmpl.roots) and st.roots == tmpl.roots[:m] and \
        st.entries == tmpl.entries[:tmpl.counts[m - 1]] and \
        len(st.entries) == tmpl.counts[m - 1]


def _loops(graph: Graph, ctx) -> list[str]:
    notes = []
    for cat in list(graph.nodes):
        if cat.graph is None or cat.op != "Concat" or len(cat.inputs) < 3:
            continue
        out = cat.outputs[0]
        if not out.type.is_static or not out.dtype.is_float or \
                out.shape[cat.attrs["axis"] % out.type.rank] != len(cat.inputs):
            continue
        loop = _Loop(graph, cat)
        found = _attempt(graph, ctx, cat, f"{cat.name} an unrolled recurrence as one loop",
                         loop.build, f"no loop over its {len(cat.inputs)} rows", loop.log)
        if found is None:
            continue
        new, s0, k, ops_ = found
        graph.replace_all_uses(out, new)
        notes.append(f"{cat.name}: steps {s0}..{len(cat.inputs) - 1} of a recurrence "
                     f"carrying {k} states ({ops_} ops a step) as one loop")
    return notes


# ---------------------------------------------------------------------------- the row writes


def _row_mask(m: Value, out: list) -> tuple[int, int, int] | None:
    """(axis, p0, p1) when ``m`` is a constant boolean mask true exactly on positions
    [p0, p1) of one axis of the shape ``out`` and of size 1 on every other axis (the
    ``arange(L) == t`` that the decomposition of ``out[:, t] = v`` selects row t with)."""
    arr = const_array(m)
    if arr is None or arr.dtype.kind != "b" or arr.ndim != len(out):
        return None
    long = [i for i, d in enumerate(arr.shape) if d != 1]
    if len(long) != 1 or arr.shape[long[0]] != out[long[0]]:
        return None
    axis = long[0]
    on = np.flatnonzero(arr.reshape(-1))
    if on.size == 0 or on.size == arr.size or on[-1] - on[0] + 1 != on.size:
        return None
    return axis, int(on[0]), int(on[-1]) + 1


def _row_select(n: Node | None) -> tuple[int, int, int] | None:
    if n is None or n.op != "Select" or len(n.inputs) != 3:
        return None
    out = n.outputs[0]
    if not out.type.is_static or any(v.dtype != out.dtype for v in n.inputs[1:]):
        return None
    return _row_mask(n.inputs[0], list(out.shape))


def _rows(graph: Graph, at: Node, src: Value, axis: int, lo: int, hi: int, out: list
          ) -> Value:
    """Rows [lo, hi) along ``axis`` of ``src`` broadcast to ``out``: a broadcast's input
    broadcast to the piece when it has one row, else a slice of the rows."""
    piece = out[:axis] + [hi - lo] + out[axis + 1:]
    while True:
        if src.type.rank < len(out):  # (numpy broadcasting aligns the trailing axes)
            src = add_like(graph, at, "Reshape", [src],
                           {"shape": [1] * (len(out) - src.type.rank) + list(src.shape)})
        p = src.producer
        if p is None or p.op != "BroadcastTo" or p.inputs[0].type.rank > len(out):
            break
        src = p.inputs[0]
    if src.shape[axis] != 1 and (lo, hi) != (0, out[axis]):
        src = add_like(graph, at, "StridedSlice", [src], {"begin": [lo], "end": [hi],
                                                          "strides": [1], "axes": [axis]})
    if list(src.shape) != piece:
        src = add_like(graph, at, "BroadcastTo", [src], {"shape": piece})
    return src


def _row_reads(graph: Graph, ctx) -> list[str]:
    """Slices along a row write's axis that read only rows it wrote, or only rows it kept,
    read them from the written value or from the value written into (a loop reading back
    its cache: layer 1 slicing ``state[:, :, 1]`` after layer 0 wrote ``state[:, :, 0]``)."""
    notes = []
    for n in list(graph.nodes):
        found = _row_select(n)
        if n.graph is None or found is None:
            continue
        axis, p0, p1 = found
        out = n.outputs[0]
        shape = list(out.shape)
        for u in list(out.users):
            axes = u.attrs.get("axes") if u.op == "StridedSlice" else None
            if not axes or len(axes) != 1 or axes[0] % len(shape) != axis or \
                    (u.attrs.get("strides") or [1]) != [1]:
                continue
            lo, hi, _ = slice(u.attrs["begin"][0], u.attrs["end"][0]).indices(shape[axis])
            if hi <= lo:
                continue
            src = n.inputs[1] if p0 <= lo and hi <= p1 else n.inputs[2] \
                if hi <= p0 or p1 <= lo else None
            if src is None or not ctx.should_apply(
                    f"{u.name} rows read from what {n.name} writes or keeps", [u, n]):
                continue
            graph.replace_all_uses(u.outputs[0], _rows(graph, u, src, axis, lo, hi, shape))
            notes.append(f"{u.name}: rows {lo}..{hi - 1} read past the row write {n.name}")
    return notes


def _row_writes(graph: Graph, ctx) -> list[str]:
    notes = []
    for last in list(graph.nodes):
        found = _row_select(last)
        if last.graph is None or found is None:
            continue
        axis, out = found[0], last.outputs[0]
        if any(_row_select(u) is not None and _row_select(u)[0] == axis
               and u.inputs[2] is out and u.outputs[0].type == out.type and len(out.users) == 1
               and not graph.is_output(out) for u in out.users):
            continue  # not the last write of its chain
        chain, base = [last], last.inputs[2]
        while True:
            p = base.producer
            f = _row_select(p)
            if f is None or f[0] != axis or p.outputs[0].type != out.type or \
                    len(base.users) != 1 or graph.is_output(base):
                break
            chain.append(p)
            base = p.inputs[2]
        if len(chain) < 2:
            continue
        shape = list(out.shape)
        owner: list[Value | None] = [None] * shape[axis]
        for s in chain:  # the last write of a row wins
            _, lo, hi = _row_select(s)
            for i in range(lo, hi):
                if owner[i] is None:
                    owner[i] = s.inputs[1]
        owner = [base if o is None else o for o in owner]
        if not ctx.should_apply(f"{last.name} {len(chain)} row writes as one Concat", chain):
            continue
        pieces, lo = [], 0
        for i in range(1, len(owner) + 1):
            if i == len(owner) or owner[i] is not owner[lo]:
                pieces.append(_rows(graph, last, owner[lo], axis, lo, i, shape))
                lo = i
        new = pieces[0] if len(pieces) == 1 else \
            add_like(graph, last, "Concat", pieces, {"axis": axis})
        graph.replace_all_uses(out, new)
        notes.append(f"{last.name}: {len(chain)} writes of rows along axis {axis} as a "
                     f"Concat of {len(pieces)} pieces")
    return notes


# ---------------------------------------------------------------------------- the first step


def _first_step_factor(a: Value, axis: int) -> Value | None:
    """``x`` when ``a`` is ``x * c`` with ``c`` a constant that is 1 at every position of the
    scanned axis but the first and within [-1, 1] there (a reset mask ``~(pos == 0)``),
    broadcast into ``x``'s shape; else None."""
    p = a.producer
    if p is None or p.op != "Mul" or len(p.inputs) != 2:
        return None
    for x, c in (p.inputs, reversed(p.inputs)):
        arr = const_array(c)
        if arr is None or arr.dtype.kind != "f" or x.type != a.type or arr.ndim > a.type.rank:
            continue
        arr = arr.reshape((1,) * (a.type.rank - arr.ndim) + arr.shape)
        rest = np.take(arr, range(1, arr.shape[axis]), axis=axis) if arr.shape[axis] > 1 \
            else None
        if arr.shape[axis] == 1 or not np.all(rest == 1.0):
            continue
        first = np.take(arr, [0], axis=axis)
        if np.all(np.abs(first) <= 1.0):
            return x
    return None


def _first_steps(graph: Graph, ctx) -> list[str]:
    notes = []
    for n in list(graph.nodes):
        if n.graph is None or n.op != "Scan" or n.attrs["combine"] != "linear":
            continue
        a = n.inputs[0]
        axis = n.attrs["axis"] % a.type.rank
        x = _first_step_factor(a, axis)
        if x is None or not ctx.should_apply(
                f"{n.name} the factor of its first coefficient dropped", [n, a.producer]):
            continue
        graph.replace_input(n, 0, x)
        notes.append(f"{n.name}: {a.producer.name}'s constant factor (1 after the first step) "
                     "dropped: the first coefficient multiplies the zero start")
    return notes


def scan_loop(graph, ctx) -> PassResult:
    """Rewrite an unrolled recurrence → Scan, per-step row writes → Concat, a Concat of one
    expression per step → the expression on whole tensors, and the steps of a recurrence
    carrying several states → one Scan running the step body."""
    hist = graph.op_histogram()
    if not (hist.get("StridedSlice") or hist.get("Scan") or hist.get("Select")):
        return PassResult(False, 0, [], "no unrolled loop")  # (a step is a slice, a write a
        # Select)
    notes = _scans(graph, ctx) if hist.get("Squeeze") else []
    notes += _first_steps(graph, ctx) if hist.get("Scan") or notes else []
    if hist.get("Select"):
        notes += _row_reads(graph, ctx)
        graph.remove_dead()
        notes += _row_writes(graph, ctx)
    notes += _rerolls(graph, ctx) if hist.get("Concat") or notes else []
    notes += _loops(graph, ctx) if hist.get("Concat") or notes else []
    if notes:
        graph.remove_dead()
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'unrolled loop')} rolled up")
