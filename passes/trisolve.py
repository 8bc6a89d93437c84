"""Rewrite a forward substitution unrolled row by row → one TriSolve (``form="rows"``).

Linear-attention references (the chunked delta rule of Kimi, Qwen3-Next and OLMo-hybrid as
transformers writes it, and the FLA-derived references of other models) solve the
within-chunk unit-lower-triangular system with a Python loop over the rows of one matrix:

    for i in range(1, n):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)

A trace unrolls it into n - 1 steps of slices, a product, a sum and a write of the row back
into the matrix (a slice_scatter/copy_ that the frontend imports as a Concat and a Select of
one row, or an index_put): some 8 ops a row, each its own launch. This pass finds the steps
by what they compute, not by names or sizes:

* a **step** is ``x + ReduceSum(p * S, axis=-2)`` where x, p and S are the same matrix M
  [..., n, n] moved only (slices, squeezes, expands, reshapes, identities), and they are
  exactly ``M[..., i, :i]``, ``M[..., i, :i, None]`` and ``M[..., :i, :i]`` for one i;
* its **write** is a value M' of M's shape computed from M and the step's result by movement
  alone (slices, Concats, expands, broadcasts, Selects by constant conditions), that is M with
  ``[..., i, :i]`` replaced by the result;
* the steps i = 1 .. n-1 chained (the write of step i the matrix of step i + 1), from a
  matrix A to the last write T.

The row reads and writes may be slices, Concats and Selects (``slice_scatter``/``copy_``) or
Gathers and ScatterElements by constant indices (``index_put``).

The movement checks are exact: the movement ops run (their references) on A's element
indices and on the step result's, and must put every index where the algorithm puts it,
which (movement being a fixed selection of elements) proves the map for every input. T then
becomes ``TriSolve(A, form="rows")`` (``opdefs/trisolve.py``), which runs the same rows in
the same order: exact up to float summation order within a row's sum. Refused, with the
reason logged: fewer steps than rows (a loop stopped early or started late), a step value
read outside the chain (a training graph saving it for the backward pass), symbolic sizes.

Solves of one system (``solve`` TriSolves of one L: qwen3_next's new values and decayed keys)
become one TriSolve of all their right-hand sides (``_siblings``): exact, each column gets
the same operations as alone.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops
from graphkernel.codegen.trisolve import fits
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import RefContext
from graphkernel.passes.rewrite import reads_node
from graphkernel.registry import PassResult, counted

CHAIN = frozenset({"StridedSlice", "Slice", "Squeeze", "ExpandDims", "Reshape", "Identity",
                   "Gather"})
MOVE = CHAIN | {"Concat", "BroadcastTo", "Select", "Transpose", "ScatterElements"}
INDEXED = frozenset({"Gather", "ScatterElements"})  # (by constant indices only)
MAX_CHECKED = 1 << 22  # elements of a matrix batch the movement check runs on


class Refused(Exception):
    """The steps found are not a whole forward substitution; the message says why."""


def _source(v: Value) -> tuple[Value, list[Node]]:
    """The value ``v`` is a movement of along a chain of one-input views, and the chain (in
    order from the source)."""
    chain: list[Node] = []
    while v.producer is not None and v.producer.op in CHAIN and _moves(v.producer) and \
            all(_constant(x) for x in v.producer.inputs[1:]):
        chain.insert(0, v.producer)
        v = v.producer.inputs[0]
    return v, chain


def _constant(v: Value) -> bool:
    return v.producer is not None and v.producer.op == "Constant"


def _moves(n: Node) -> bool:
    """Whether ``n`` only moves elements: a Select by a constant condition, a Gather or a
    ScatterElements (no reduction) by constant indices, any other op of MOVE."""
    if n.op == "Select":
        return _constant(n.inputs[0])
    if n.op in INDEXED:
        return _constant(n.inputs[1]) and n.attrs.get("reduction", "none") == "none"
    return n.op in MOVE


def _run(nodes: list[Node], env: dict[int, np.ndarray]) -> None:
    """Each node's reference on the element indices in ``env`` (by value id), in order."""
    for n in nodes:
        args = []
        for x in n.inputs:
            if id(x) not in env:
                arr = x.producer.attrs["value"]  # (a constant: checked by the caller)
                env[id(x)] = np.asarray(arr)
            args.append(env[id(x)])
        ctx = RefContext(tuple(tuple(o.shape) for o in n.outputs),
                         tuple(np.dtype(np.float64) for _ in n.outputs), n.name)
        out = ops.get(n.op).reference(args, n.attrs, ctx)
        outs = out if isinstance(out, tuple | list) else (out,)
        for o, a in zip(n.outputs, outs, strict=True):
            env[id(o)] = np.asarray(a)


def _static(v: Value) -> bool:
    return all(isinstance(d, int) for d in v.shape)


class _Finder:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.pos = {id(n): i for i, n in enumerate(graph.nodes)}
        self.ids: dict[int, np.ndarray] = {}

    def index(self, m: Value) -> np.ndarray:
        if id(m) not in self.ids:
            self.ids[id(m)] = np.arange(int(np.prod(m.shape)), dtype=np.float64).reshape(
                m.shape)
        return self.ids[id(m)]

    def step(self, add: Node) -> tuple[Value, int, list[Node]] | None:
        """(M, i, the step's nodes) when ``add`` is step i of a forward substitution on M."""
        if len(add.inputs) != 2 or not add.outputs[0].dtype.is_float:
            return None
        for x, r in (add.inputs, add.inputs[::-1]):
            red = r.producer
            if red is None or red.op != "ReduceSum" or red.attrs.get("keep_dims") or \
                    len(r.users) != 1:
                continue
            mul = red.inputs[0].producer
            rank = red.inputs[0].type.rank
            axes = [a % rank for a in (red.attrs.get("axis") or [])]
            if mul is None or mul.op != "Mul" or axes != [rank - 2] or \
                    len(mul.outputs[0].users) != 1 or rank < 2:
                continue
            got = self._check(add, x, mul)
            if got is not None:
                return got[0], got[1], [*got[2], mul, red, add]
        return None

    def _check(self, add: Node, x: Value, mul: Node) -> tuple[Value, int, list[Node]] | None:
        if len(x.shape) < 1 or not isinstance(x.shape[-1], int):
            return None
        i = x.shape[-1]
        M, xc = _source(x)
        if M.type.rank < 2 or not _static(M) or M.shape[-1] != M.shape[-2] or \
                not 1 <= i < M.shape[-1] or M.dtype != x.dtype or \
                int(np.prod(M.shape)) > MAX_CHECKED:
            return None
        ids = self.index(M)
        want = {"x": ids[..., i, :i], "p": ids[..., i, :i, None], "S": ids[..., :i, :i]}
        env = {id(M): ids}
        _run(xc, env)
        if not np.array_equal(env[id(x)], want["x"]):
            return None
        for p, S in (mul.inputs, mul.inputs[::-1]):
            (mp, pc), (ms, sc) = _source(p), _source(S)
            if mp is not M or ms is not M:
                continue
            env2 = {id(M): ids}
            _run(pc, env2)
            _run(sc, env2)
            if np.array_equal(env2[id(p)], want["p"]) and \
                    np.array_equal(env2[id(S)], want["S"]):
                return M, i, [*xc, *pc, *sc]
        return None

    def write(self, M: Value, i: int, new: Value) -> tuple[Value, list[Node]] | None:
        """The value of M's shape computed from M and ``new`` by movement alone that is M with
        ``[..., i, :i]`` replaced by ``new``, and the nodes computing it from them."""
        seen: set[int] = set()
        todo = [new]
        cands: list[Value] = []
        while todo:
            v = todo.pop()
            for u in v.users:
                if id(u) in seen or not _moves(u):
                    continue
                seen.add(id(u))
                for o in u.outputs:
                    if tuple(o.shape) == tuple(M.shape) and o.dtype == M.dtype:
                        cands.append(o)
                    if len(seen) < 64:
                        todo.append(o)
        for c in sorted(cands, key=lambda o: self.pos.get(id(o.producer), 0)):
            nodes = self._between(c, {id(M), id(new)})
            if nodes is None:
                continue
            ids = self.index(M)
            nid = ids.size + np.arange(int(np.prod(new.shape)), dtype=np.float64).reshape(
                new.shape)
            env = {id(M): ids, id(new): nid}
            _run(nodes, env)
            want = ids.copy()
            want[..., i, :i] = nid
            if env[id(c)].shape == want.shape and np.array_equal(env[id(c)], want):
                return c, nodes
        return None

    def _between(self, v: Value, stops: set[int]) -> list[Node] | None:
        """The movement nodes computing ``v`` from the values ``stops`` and constants, in
        graph order; None when other work or another value takes part."""
        got: dict[int, Node] = {}
        todo = [v]
        while todo:
            x = todo.pop()
            if id(x) in stops:
                continue
            p = x.producer
            if p is None:
                return None
            if p.op == "Constant":
                continue
            if not _moves(p):
                return None
            if id(p) in got:
                continue
            got[id(p)] = p
            todo.extend(p.inputs)
            if len(got) > 64:
                return None
        return sorted(got.values(), key=lambda n: self.pos[id(n)])


def _chain(f: _Finder, steps: dict[int, tuple[Value, int, list[Node], Node]], A: Value
           ) -> tuple[Value, list[Node]]:
    """From the matrix A, the steps 1 .. n-1 in order: the last write and every node."""
    n = A.shape[-1]
    M, nodes = A, []
    for i in range(1, n):
        got = steps.get(id(M))
        if got is None or got[1] != i:
            raise Refused(f"row {i} of {n}: no step of the substitution reads "
                          f"{M.name} (the loop stops early or does other work)")
        _, _, part, add = got
        w = f.write(M, i, add.outputs[0])
        if w is None:
            raise Refused(f"row {i}: the step's result is not written back as row {i} of "
                          f"{M.name} by movement alone")
        M = w[0]
        nodes += [*part, *w[1]]
    return M, nodes


def _live(graph: Graph) -> set[int]:
    """id() of the nodes something reads (a graph output, or a live node's operand)."""
    live: set[int] = set()
    todo = [v.producer for v in graph.outputs if v.producer is not None]
    while todo:
        n = todo.pop()
        if id(n) in live:
            continue
        live.add(id(n))
        todo += [x.producer for x in n.inputs if x.producer is not None]
    return live


def _outside(graph: Graph, nodes: list[Node], last: Value, live: set[int]) -> str | None:
    """Why a value of the steps (but the last write) is read by live work outside them."""
    ids = {id(n) for n in nodes}
    for n in nodes:
        for o in n.outputs:
            if o is last:
                continue
            if graph.is_output(o):
                return f"{o.name} is a graph output"
            for u in o.users:
                if id(u) not in ids and id(u) in live:
                    return f"{o.name} is read by {u.name} ({u.op}) outside the loop"
    return None


def _siblings(graph: Graph, ctx, target) -> list[str]:
    """Solves of one system (TriSolve ``solve`` nodes reading one L) → one TriSolve of all
    their right-hand sides: the system is read and its coefficients walked once. Exact: each
    right-hand side's columns get the same operations as alone. Not when one right-hand side
    reads another's solution, or when they would not fit one kernel's UB together."""
    groups: dict[int, list[Node]] = {}
    for n in graph.nodes:
        if n.op == "TriSolve" and n.attrs["form"] == "solve":
            groups.setdefault(id(n.inputs[0]), []).append(n)
    notes = []
    for nodes in groups.values():
        keep = [n for n in nodes if not any(
            reads_node([x], m) for m in nodes if m is not n for x in n.inputs[1:])]
        if len(keep) < 2:
            continue
        L = keep[0].inputs[0]
        xs = [x for n in keep for x in n.inputs[1:]]
        static = all(isinstance(d, int) for v in (L, *xs) for d in v.shape)
        if static and not fits(L.shape[-1], [x.shape[-1] for x in xs], target):
            notes.append(f"{', '.join(n.name for n in keep)}: solves of {L.name} left apart: "
                         "their right-hand sides together do not fit one kernel's UB")
            ctx.log(f"trisolve: {notes[-1]}")
            continue
        if not ctx.should_apply(f"trisolve: the solves of {L.name} as one", keep):
            continue
        origin = tuple(dict.fromkeys(o for n in keep for o in n.origin))
        one = graph.add_node("TriSolve", [L, *xs], {"form": "solve"},
                             name=graph.fresh_name(f"{L.name}/solves"), origin=origin)
        at = 0
        for n in keep:
            for o in n.outputs:
                graph.replace_all_uses(o, one.outputs[at])
                at += 1
        notes.append(f"{', '.join(n.name for n in keep)}: {len(xs)} right-hand sides of "
                     f"{L.name} solved as one TriSolve")
    return notes


def trisolve(graph: Graph, ctx) -> PassResult:
    """Rewrite a forward substitution traced row by row → one TriSolve of the matrix, and
    solves of one system → one TriSolve of all their right-hand sides."""
    merged = _siblings(graph, ctx, ctx.target) if any(
        n.op == "TriSolve" for n in graph.nodes) else []
    adds = [n for n in graph.nodes if n.op == "Add"]
    if not adds or not any(n.op == "ReduceSum" for n in graph.nodes):
        if merged:
            graph.remove_dead()
            graph.toposort()
        return PassResult(bool(merged), len(merged), merged,
                          f"{counted(0, 'forward substitution')} as one op; "
                          f"{counted(len(merged), 'system')} solved once for its right-hand "
                          "sides")
    f = _Finder(graph)
    steps: dict[int, tuple[Value, int, list[Node], Node]] = {}
    for a in adds:
        got = f.step(a)
        if got is not None:
            M, i, part = got
            steps.setdefault(id(M), (M, i, part, a))
    notes: list[str] = []
    done = 0
    starts = [s for s in steps.values() if s[1] == 1]
    live = _live(graph) if starts else set()
    for M, _, _, add in starts:
        if M.producer is not None and M.producer.graph is None:
            continue
        try:
            T, nodes = _chain(f, steps, M)
        except Refused as e:
            notes.append(f"{add.name}: not a forward substitution of {M.name}: {e}")
            ctx.log(f"trisolve: {notes[-1]}")
            continue
        why = _outside(graph, nodes, T, live)
        if why:
            notes.append(f"{M.name}: the substitution's {M.shape[-1] - 1} rows stay as they "
                         f"are: {why}")
            ctx.log(f"trisolve: {notes[-1]}")
            continue
        if not ctx.should_apply(f"trisolve of {M.name}", nodes):
            continue
        origin = tuple(dict.fromkeys(o for n in nodes for o in n.origin))
        y = graph.add_node("TriSolve", [M], {"form": "rows"},
                           name=graph.fresh_name(f"{T.name}/trisolve"), origin=origin)
        graph.replace_all_uses(T, y.outputs[0])
        done += 1
        notes.append(f"{T.name}: the forward substitution of {M.name} ({M.shape[-1] - 1} "
                     f"rows, {len(nodes)} nodes) as one TriSolve")
    if done or merged:
        graph.remove_dead()
        graph.toposort()
    return PassResult(done + len(merged) > 0, done + len(merged), merged + notes,
                      f"{counted(done, 'forward substitution')} as one op; "
                      f"{counted(len(merged), 'system')} solved once for its right-hand "
                      "sides")
