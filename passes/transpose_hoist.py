"""Move a Transpose above the elementwise work that computes its operand, where that makes
transposes cancel.

A transpose of the last two axes is a kernel of its own (the vector code generator moves rows; it
transposes in UB only a small value, its kernel then one tile on one core), so a layer that
permutes ``[B, L, C]`` to ``[B, C, L]``, runs elementwise work, a scan or a gate there, and
permutes back pays two launches for layout alone. State-space blocks do this around their causal
convolution, their selective scan and their output gate. Elementwise ops (with numpy broadcasting),
views that only add or drop axes of size 1, ``BroadcastTo``, ``Scan`` and reductions that keep
their axes commute with a permutation of their axes: ``T(f(a, b)) == f(T(a), T(b))`` with each
operand permuted the same way (a broadcast operand padded to the output's rank first), ``T(Scan(x,
axis)) == Scan(T(x), axis')`` and ``T(Reduce(x, axes)) == Reduce(T(x), axes')``. So the root
transpose can be taken to the region's leaves instead, where a transpose

- meets another transpose (their composition, often the identity: both disappear),
- lands on a constant (folded here),
- moves only axes of size 1 (a view),
- is already computed elsewhere (the same permutation of the same value, shared), or
- swaps the last two axes of a product's result that only the region reads: it folds into
  the transposed product (``product_transpose``: ``(A·B)ᵀ = Bᵀ·Aᵀ``), and the region becomes
  that product's epilogue (per-head gates soft-capped, then moved to heads first).

The region is the nodes whose every use is inside it (or the root), so nothing outside sees a
changed layout. The rewrite is made only when it leaves fewer real transposes than it removes
(the root and the leaf transposes that die with it); a transpose left at a leaf that is none of
the above counts as one.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import OpKind
from graphkernel.passes.product_transpose import fold_result, result_foldable
from graphkernel.passes.rewrite import add_like
from graphkernel.passes.transpose_view import moves_only_ones
from graphkernel.registry import PassResult, counted

MAX_REGION = 64  # nodes taken above one transpose (bounds the work per transpose)
VIEWS = frozenset({"Reshape", "ExpandDims", "Squeeze"})
REDUCES = frozenset({"ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"})


def _elementwise(n: Node) -> bool:
    if not ops.exists(n.op) or len(n.outputs) != 1 or n.op == "BiasAdd":
        return False
    d = ops.get(n.op)
    return d.kind == OpKind.ELEMWISE and not d.writes


def _view_perm(src: list, dst: list, q: list[int]) -> list[int] | None:
    """The permutation q' of ``src`` such that ``T(src, q')`` viewed as ``dst`` permuted by q
    is ``T(dst, q)``, when ``dst`` is ``src`` with axes of size 1 added or dropped (the other
    axes equal and in order), else None. The size-1 axes of ``src`` go last."""
    si = [i for i, d in enumerate(src) if d != 1]
    di = [i for i, d in enumerate(dst) if d != 1]
    if len(si) != len(di) or any(src[a] != dst[b] for a, b in zip(si, di, strict=True)):
        return None
    where = dict(zip(di, si, strict=True))
    return [where[a] for a in q if a in where] + [i for i, d in enumerate(src) if d == 1]


def _padded(shape: list, rank: int) -> list:
    return [1] * (rank - len(shape)) + list(shape)


def _joins(n: Node) -> bool:
    """Whether a transpose of ``n``'s output can be taken to ``n``'s operands."""
    if len(n.outputs) != 1 or not all(isinstance(d, int) for v in (*n.inputs, *n.outputs)
                                      for d in v.shape):
        return False
    if _elementwise(n) or n.op == "Scan":
        return True
    if n.op in REDUCES:  # (a reduction that drops its axes is a view away from one that
        # keeps them; only the kept form is taken)
        return bool(n.attrs["keep_dims"])
    out, ins = n.outputs[0], n.inputs
    if n.op in VIEWS:
        return _view_perm(list(ins[0].shape), list(out.shape),
                          list(range(out.type.rank))) is not None
    if n.op == "BroadcastTo":
        return ins[0].type.rank <= out.type.rank
    return False


class _Plan:
    """The region above one root transpose, the permutation each leaf needs and the cost."""

    def __init__(self, graph: Graph, root: Node):
        self.graph, self.root = graph, root
        self.region: list[Node] = []
        self.members: set[int] = set()
        self._grow()

    def _grow(self) -> None:
        x = self.root.inputs[0]
        inside = {id(self.root)}
        cands = [x.producer] if x.producer is not None else []
        seen: set[int] = set()
        changed = True
        while changed and len(self.region) < MAX_REGION:
            changed = False
            for n in list(cands):
                if id(n) in inside or not _joins(n) or self.graph.is_output(n.outputs[0]):
                    continue
                if all(id(u) in inside for u, _ in n.outputs[0].uses):
                    inside.add(id(n))
                    self.region.append(n)
                    changed = True
                    for v in n.inputs:
                        p = v.producer
                        if p is not None and id(p) not in seen:
                            seen.add(id(p))
                            cands.append(p)
        self.members = inside - {id(self.root)}


def _need(n: Node, q: list[int]) -> list[tuple[Value, list[int], list | None]]:
    """For each operand of region node ``n`` whose output is wanted permuted by ``q``: the
    operand, the permutation of its own axes, and the shape to view the result as (None: as
    it comes)."""
    out = n.outputs[0]
    r = out.type.rank
    if n.op in VIEWS:
        src = n.inputs[0]
        return [(src, _view_perm(list(src.shape), list(out.shape), q), None)]
    res = []
    for u in n.inputs:
        if u.type.rank == r:
            res.append((u, q, None))
        else:
            pad = _padded(list(u.shape), r)
            res.append((u, _view_perm(list(u.shape), pad, q), [pad[a] for a in q]))
    return res


def _moves_last(v: Value, q: list[int]) -> bool:
    """Whether permuting ``v`` by ``q`` is a kernel of its own: it moves the last axis of
    extent other than 1 (a permutation of outer axes is a strided copy that fuses into its
    consumers' copy-in; trailing axes of extent 1 hold no rows) and does not move only axes
    of size 1 (a view)."""
    shape = list(v.shape)
    real = [k for k in range(len(q)) if shape[k] != 1]
    moved = [k for k in q if shape[k] != 1]
    return bool(real) and moved[-1] != real[-1] and not moves_only_ones(v, q)


def _split_part(v: Value) -> tuple[Node, int] | None:
    """(the Split, the output's offset along its axis) when ``v`` is an output of a Split."""
    p = v.producer
    if p is None or p.op != "Split":
        return None
    return p, sum(p.attrs["sizes"][:v.index])


def _leaf_cost(graph: Graph, v: Value, q: list[int], members: set[int]) -> int:
    """0 when permuting ``v`` by ``q`` costs nothing (see the module doc), else 1: even a
    permutation of outer axes that a kernel's copy-in could take in place counts, since the
    vector schedule refuses operands read across its rows (a scan's or a broadcast's)."""
    if q == list(range(len(q))) or moves_only_ones(v, q):
        return 0
    p = v.producer
    if p is not None and p.op == "Constant":
        return 0
    if p is not None and p.op == "Transpose":
        comp = [p.attrs["perm"][i] for i in q]
        if comp == list(range(len(comp))) or moves_only_ones(p.inputs[0], comp):
            return 0
    if _existing(v, q, members) is not None:
        return 0
    part = _split_part(v)
    if part is not None:  # a slice of the permuted whole (a slice fuses into its consumers)
        return _leaf_cost(graph, part[0].inputs[0], q, members)
    if _product_leaf(graph, v, q, members):
        return 0
    return 1


def _product_leaf(graph: Graph, v: Value, q: list[int], members: set[int]) -> bool:
    """A swap of the last two axes of a product's result read only by the region: the
    transposed product computes it (``product_transpose``: ``(A·B)ᵀ = Bᵀ·Aᵀ``, the cube
    reading its operands the other way round), so it costs no transpose."""
    r = len(q)
    return r >= 2 and q == [*range(r - 2), r - 1, r - 2] and \
        result_foldable(graph, v, members)


def _existing(v: Value, q: list[int], members: set[int]) -> Value | None:
    for u, _ in v.uses:
        if u.op == "Transpose" and id(u) not in members and list(u.attrs["perm"]) == q:
            return u.outputs[0]
    return None


def _new_column(n: Node, q: list[int]) -> bool:
    """Whether permuting ``n``'s axes by ``q`` makes an operand that varied along the last
    axis constant along it while the output still varies there (a row operand read as a
    column): the vector schedule reads such a broadcast across its rows only in some
    layouts, and a kernel it refuses is split."""
    out = list(n.outputs[0].shape)
    if not q or out[q[-1]] == 1:
        return False
    for u in n.inputs:
        pad = _padded(list(u.shape), len(out))
        if pad[-1] != 1 and pad[q[-1]] == 1:
            return True
    return False


def _plan_cost(plan: _Plan) -> tuple[int, int]:
    """(transposes left at the leaves, transposes removed)."""
    graph, members = plan.graph, plan.members
    need: dict[int, list[int]] = {id(plan.root.inputs[0]): list(plan.root.attrs["perm"])}
    added, leaves = 0, {}
    for n in reversed(graph.in_order(plan.region)):
        nq = need[id(n.outputs[0])]
        if _new_column(n, nq):
            return 1, 0
        for u, q, _ in _need(n, nq):
            if u.producer is not None and id(u.producer) in members:
                prev = need.setdefault(id(u), q)
                if prev != q:  # two uses want two layouts of one region value
                    return 1, 0
            elif (id(u), tuple(q)) not in leaves:
                leaves[(id(u), tuple(q))] = u
                added += _leaf_cost(graph, u, q, members)
    removed = 1
    dying = {id(u.producer) for u in leaves.values() if u.producer is not None
             and u.producer.op == "Transpose"
             and all(id(m) in members for m, _ in u.uses)
             and _moves_last(u.producer.inputs[0], list(u.producer.attrs["perm"]))}
    removed += len(dying)
    plan.need = need
    return added, removed


def _permuted_leaf(graph: Graph, at: Node, v: Value, q: list[int],
                   members: set[int]) -> Value:
    if q == list(range(len(q))):
        return v
    p = v.producer
    shape = [v.shape[a] for a in q]
    if p is not None and p.op == "Constant":
        return add_like(graph, at, "Constant", [],
                        {"value": np.ascontiguousarray(np.transpose(p.attrs["value"], q))})
    if p is not None and p.op == "Transpose":
        comp = [p.attrs["perm"][i] for i in q]
        src = p.inputs[0]
        if comp == list(range(len(comp))):
            return src
        if moves_only_ones(src, comp):
            return add_like(graph, at, "Reshape", [src], {"shape": shape})
        return add_like(graph, at, "Transpose", [src], {"perm": comp})
    if moves_only_ones(v, q):
        return add_like(graph, at, "Reshape", [v], {"shape": shape})
    found = _existing(v, q, members)
    if found is not None:
        return found
    part = _split_part(v)
    if part is not None and _leaf_cost(graph, v, q, members) == 0:
        split, offset = part
        whole = _permuted_leaf(graph, at, split.inputs[0], q, members)
        axis = q.index(split.attrs["axis"] % v.type.rank)
        begin = [0] * len(q)
        begin[axis] = offset
        return add_like(graph, at, "Slice", [whole], {"begin": begin, "size": shape})
    return add_like(graph, at, "Transpose", [v], {"perm": q})


def _rewrite(plan: _Plan) -> Value:
    """Build the region again on permuted operands; returns the root's replacement."""
    graph, members, root = plan.graph, plan.members, plan.root
    made: dict[int, Value] = {}
    leaves: dict[tuple, Value] = {}
    for n in graph.in_order(plan.region):
        out = n.outputs[0]
        q = plan.need[id(out)]
        ins = []
        for u, uq, view in _need(n, q):
            if u.producer is not None and id(u.producer) in members:
                w = made[id(u)]
            else:
                key = (id(u), tuple(uq), tuple(view or ()))
                if key not in leaves:
                    w = _permuted_leaf(graph, root, u, uq, members)
                    if view is not None and list(w.shape) != view:
                        w = add_like(graph, root, "Reshape", [w], {"shape": view})
                    leaves[key] = w
                w = leaves[key]
            ins.append(w)
        shape = [out.shape[a] for a in q]
        if n.op in VIEWS:
            made[id(out)] = ins[0] if list(ins[0].shape) == shape else \
                add_like(graph, n, "Reshape", ins, {"shape": shape})
        elif n.op == "BroadcastTo":
            made[id(out)] = add_like(graph, n, "BroadcastTo", ins, {"shape": shape})
        elif n.op == "Scan":
            attrs = dict(n.attrs)
            attrs["axis"] = q.index(n.attrs["axis"] % out.type.rank)
            made[id(out)] = add_like(graph, n, "Scan", ins, attrs)
        elif n.op in REDUCES:
            attrs = dict(n.attrs)
            if n.attrs["axis"]:  # (none: every axis, in any layout)
                attrs["axis"] = sorted(q.index(a % out.type.rank) for a in n.attrs["axis"])
            made[id(out)] = add_like(graph, n, n.op, ins, attrs)
        else:
            made[id(out)] = add_like(graph, n, n.op, ins, dict(n.attrs))
    return made[id(root.inputs[0])]


def transpose_hoist(graph, ctx) -> PassResult:
    """Rewrite T(f(a, b, ...)) -> f(T(a), T(b), ...) over a region of elementwise ops, views,
    broadcasts, scans and kept-axis reductions when the transposes at its leaves cancel, fold
    or are shared."""
    notes = []
    for root in list(graph.nodes):
        if root.graph is None or root.op != "Transpose":
            continue
        x = root.inputs[0]
        if not _moves_last(x, list(root.attrs["perm"])) or any(
                isinstance(d, str) for d in x.shape):
            continue
        plan = _Plan(graph, root)
        if not plan.region:
            continue
        added, removed = _plan_cost(plan)
        if added >= removed or not ctx.should_apply(f"hoist {root.name}", [root]):
            continue
        with graph.recording() as made:
            y = _rewrite(plan)
        graph.replace_all_uses(root.outputs[0], y)
        graph.erase_node(root)
        graph.remove_dead()
        folded = 0
        for t in made:  # a leaf transpose of a product's result: the transposed product
            if t.graph is None or t.op != "Transpose":
                continue
            p = fold_result(graph, t)
            if p is not None:
                graph.replace_all_uses(t.outputs[0], p)
                graph.erase_node(t)
                folded += 1
        if folded:
            graph.remove_dead()
        notes.append(f"{root.name}: taken above {counted(len(plan.region), 'node')} "
                     f"({removed} transposes removed, {added} left at the leaves"
                     f"{f', {folded} into products' if folded else ''})")
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'transpose')} taken above elementwise work")
