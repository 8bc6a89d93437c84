"""Rewrite an associative scan traced as a tree of slices → one Scan op, and CumSum → Scan.

torch traces ``associative_scan`` in its generic mode (what it runs on the CPU, and what a
state-space model's selective scan asks for) as a recursive odd/even scheme: the
combination of the elements at even and odd places (``x[0:-1:2]``, ``x[1::2]``), the same
on the half-length result, then the even places filled in and interleaved back (Concat and
Reshape views). For a sequence of 16 that is about 50 small ops per scanned tensor, each its
own launch. This pass finds the tensors sliced that way, takes the region of slices, views,
Concats and elementwise ops computed from them (and from constants) alone, and asks which of
its values is the scan of those tensors under one of the combine rules of
``opdefs/scan.py`` — add, mul, max, min, or the linear recurrence of an (a, b) pair —
by running the region on random data against the op's reference. The region is a rational
function of its leaves, so agreement on random inputs is agreement everywhere but on a
negligible set (the Schwartz–Zippel argument). Each value that agrees becomes one
``Scan`` node; the tree is left dead for dce. A symbolic size on another axis (the batch
under dynamic=True) is checked at one size when every op of the region keeps it a factor of
its own (``_uniform``): the region then does the same work at each of its indices.

A CumSum of floats (forward, inclusive) is the ``add`` scan and becomes one too, so the
code generator has one op to make a kernel of.
"""

from __future__ import annotations

import numpy as np

from graphkernel import ops, symbolic
from graphkernel.interpreter import run_graph
from graphkernel.ir import Graph, Node, Value
from graphkernel.opdefs.scan import COMBINES
from graphkernel.ops import VIEW_OPS, OpKind
from graphkernel.registry import PassResult, counted

REGION_OPS = frozenset({"StridedSlice", "Slice", "Concat"})
MAX_LEAVES = 2  # the combine rules' largest operand count
SCAN_SIGNS = frozenset({"StridedSlice", "CumSum"})  # a graph without either holds no scan


def _step2(n: Node) -> tuple[int, int] | None:
    """(axis, start) of a StridedSlice taking every other element of one static axis from
    position 0 or 1 (to the end, or one short of it), else None."""
    if n.op != "StridedSlice" or not n.attrs["axes"] or len(n.attrs["axes"]) != 1:
        return None
    x = n.inputs[0]
    axis = n.attrs["axes"][0] % x.type.rank
    d = x.shape[axis]
    if not isinstance(d, int) or d < 2 or (n.attrs["strides"] or [1])[0] != 2:
        return None
    start, _, _ = slice(n.attrs["begin"][0], n.attrs["end"][0], 2).indices(d)
    return (axis, start) if start in (0, 1) else None


def _leaves(graph: Graph) -> list[tuple[Value, int]]:
    """Values read at their even and at their odd places along one axis."""
    out = []
    for n in graph.nodes:
        for v in n.outputs:
            if not v.dtype.is_float:
                continue
            seen = {_step2(u) for u in v.users} - {None}
            for axis in {a for a, _ in seen}:
                if {(axis, 0), (axis, 1)} <= seen:
                    out.append((v, axis))
    return out


def _in_region(n: Node) -> bool:
    if n.op in REGION_OPS or n.op in VIEW_OPS:
        return True
    return ops.exists(n.op) and ops.get(n.op).kind == OpKind.ELEMWISE


def _region(graph: Graph, leaves: list[Value]) -> list[Node]:
    """The nodes computed from ``leaves`` and constants alone through slices, views, Concats
    and elementwise ops, in graph order."""
    inside = {id(v) for v in leaves}
    region = []
    for n in graph.nodes:
        if n.op == "Constant" or not _in_region(n):
            continue
        if not any(id(v) in inside for v in n.inputs):
            continue
        if all(id(v) in inside or (v.producer is not None and v.producer.op == "Constant")
               for v in n.inputs):
            region.append(n)
            inside.update(id(v) for v in n.outputs)
    return region


def _groups(graph: Graph, cands: list[tuple[Value, int]]) -> list[tuple[list[Value], int]]:
    """Leaves whose even/odd slices meet within a few elementwise ops (one combine call)
    grouped together, at most ``MAX_LEAVES`` to a group."""
    reach: list[set[int]] = []
    for v, axis in cands:
        seen: set[int] = set()
        front = [u for u in v.users if (_step2(u) or (None,))[0] == axis]
        for _ in range(3):
            nxt = []
            for n in front:
                for u in (u for o in n.outputs for u in o.users):
                    if id(u) not in seen and ops.exists(u.op) and \
                            ops.get(u.op).kind == OpKind.ELEMWISE:
                        seen.add(id(u))
                        nxt.append(u)
            front = nxt
        reach.append(seen)
    parent = list(range(len(cands)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(cands)):
        for j in range(i):
            if cands[i][1] == cands[j][1] and reach[i] & reach[j] and \
                    tuple(cands[i][0].shape) == tuple(cands[j][0].shape):
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(cands)):
        groups.setdefault(find(i), []).append(i)
    return [([cands[i][0] for i in g], cands[g[0]][1]) for g in groups.values()
            if len(g) <= MAX_LEAVES]


def _hypotheses(k: int) -> list[tuple[str, tuple[int, ...]]]:
    """(combine, leaf indices) pairs a group of ``k`` leaves may scan by."""
    out = [(c, (i,)) for i in range(k) for c, (arity, _) in COMBINES.items() if arity == 1]
    if k == 2:
        out += [("linear", (0, 1)), ("linear", (1, 0))]
    return out


def _scan_ref(combine: str, xs: list[np.ndarray], axis: int) -> np.ndarray:
    from graphkernel.opdefs.scan import _scan_ref as ref

    return ref(xs, {"axis": axis, "combine": combine}, None)


def _identify(graph: Graph, leaves: list[Value], axis: int, region: list[Node],
              seed: int = 0) -> list[tuple[Value, str, tuple[int, ...]]]:
    """(value, combine, leaf order) for each value of the region read outside it that is the
    scan of the leaves along ``axis`` by a combine rule (checked on random data)."""
    shape = tuple(leaves[0].shape)
    bound: dict[str, int] = {}
    if not all(isinstance(d, int) for d in shape):
        # random data of one size proves nothing for all, unless every symbolic size is an
        # index the region treats alike (a batch): then one size stands for every size
        if _uniform(region, leaves, axis) is None:
            return []
        bound = {x: 2 for d in shape for x in symbolic.symbols(d)}
    members = {id(n) for n in region}
    outs = [v for n in region for v in n.outputs if tuple(v.shape) == shape and (
        graph.is_output(v) or any(id(u) not in members for u in v.users))]
    if not outs:
        return []
    sub = Graph("scan_region")
    vmap = {id(v): sub.add_input(f"leaf{i}", v.type) for i, v in enumerate(leaves)}
    for n in region:
        for v in n.inputs:
            if id(v) not in vmap:  # a constant
                vmap[id(v)] = sub.clone_node(v.producer, vmap).outputs[0]
        sub.clone_node(n, vmap)
    sub.set_outputs([vmap[id(v)] for v in outs])
    rng = np.random.default_rng(seed)
    dt = leaves[0].dtype
    # positive and below 1: products and recurrences stay well scaled over the axis
    concrete = tuple(symbolic.evaluate(d, bound) for d in shape)
    feeds = [rng.uniform(0.5, 1.0, concrete).astype(dt.np) for _ in leaves]
    try:
        got = run_graph(sub, feeds)
    except Exception:  # a region the interpreter cannot run is no scan we can prove
        return []
    tol = 1e-4 if dt.itemsize >= 4 else 2e-2
    found = []
    for v, y in zip(outs, got, strict=True):
        for combine, order in _hypotheses(len(leaves)):
            want = _scan_ref(combine, [feeds[i] for i in order], axis)
            if np.allclose(np.asarray(y, np.float64), want.astype(np.float64), rtol=tol,
                           atol=tol):
                found.append((v, combine, order))
                break
    return found


Layout = list[list]  # per axis, its factors (ints, symbols), major first


def _uniform(region: list[Node], leaves: list[Value], axis: int) -> dict | None:
    """When the leaves' symbolic sizes are plain symbols on axes other than the scanned one
    and every op of the region keeps each symbol a factor of its own (the region treats every
    index of it alike, as a batch), each value's layout: per axis, its factors, major first
    (``2*s`` after a Concat of two along an axis of ``s`` is ``[2, s]``); else None. Then the
    region computes, at every index of every symbol, the same function of the leaves at that
    index: running it with the symbols bound to one size checks it for all sizes. The rules:
    an elementwise op reads operands of one layout (constants broadcast to 1 on an axis of a
    symbol); a slice takes only axes of static factors; a Concat along an axis of a symbol
    joins equal layouts (``n`` copies: ``[n, *factors]``); a view (Reshape, ExpandDims,
    Squeeze, Identity) keeps the row-major order, so its output dims must regroup the same
    factor sequence, each symbol inside one dim with the static factors around it."""
    lay: dict[int, Layout] = {}
    for v in leaves:
        if v.shape[axis] is None or not isinstance(v.shape[axis], int):
            return None
        f = []
        for d in v.shape:
            coef, syms = symbolic.parse_dim(d)
            if syms and (coef != 1 or len(syms) != 1):
                return None
            f.append([syms[0]] if syms else [d])
        lay[id(v)] = f
    syms = [x for g in lay[id(leaves[0])] for x in g if isinstance(x, str)]
    if len(set(syms)) != len(syms):
        return None
    for n in region:
        got = _layout(n, lay)
        if got is None:
            return None
        lay[id(n.outputs[0])] = [_merged(g) for g in got]
    return lay


def _merged(group: list) -> list:
    """A group's factors with consecutive static ones multiplied (one form per layout)."""
    out: list = []
    for f in group:
        if isinstance(f, int) and out and isinstance(out[-1], int):
            out[-1] *= f
        elif f != 1 or not out:
            out.append(f)
    return out


def _layout(n: Node, lay: dict[int, Layout]) -> Layout | None:
    ins = [lay.get(id(v)) for v in n.inputs]
    mine = [x for x in ins if x is not None]
    if not mine or len(n.outputs) != 1:
        return None
    out = n.outputs[0]
    if n.op in REGION_OPS and n.op != "Concat":
        (x,) = ins
        if n.op == "StridedSlice":
            rank = len(x)
            axes = n.attrs["axes"] if n.attrs["axes"] is not None else range(len(n.attrs["begin"]))
            touched = {a % rank for a in axes}
        else:  # Slice: every axis whose extent changes
            touched = {a for a, (d, e) in enumerate(zip(n.inputs[0].shape, out.shape,
                                                        strict=True)) if d != e}
        if any(isinstance(f, str) for a in touched for f in x[a]):
            return None
        return [[out.shape[a]] if a in touched else g for a, g in enumerate(x)]
    if n.op == "Concat":
        if any(x is None for x in ins):
            return None
        a = n.attrs["axis"] % len(ins[0])
        if any(isinstance(f, str) for f in ins[0][a]):
            if any(x != ins[0] for x in ins):
                return None
            return [[len(ins), *g] if i == a else g for i, g in enumerate(ins[0])]
        if any([g for i, g in enumerate(x) if i != a] != [g for i, g in enumerate(ins[0])
                                                          if i != a] for x in ins):
            return None
        return [[out.shape[a]] if i == a else g for i, g in enumerate(ins[0])]
    if n.op in VIEW_OPS:
        return _regroup([f for g in mine[0] for f in g], list(out.shape))
    # elementwise: the region's operands of one layout and of the output's shape
    if any(x != mine[0] for x in mine) or any(
            tuple(v.shape) != tuple(out.shape) for v, x in zip(n.inputs, ins, strict=True)
            if x is not None):
        return None
    return mine[0]


def _regroup(factors: list, dims: list) -> Layout | None:
    """The row-major factor sequence ``factors`` grouped into ``dims`` (a static factor may
    split across dims; a symbol sits inside one dim with static factors around it), or
    None."""
    q = [f for f in factors if f != 1]
    out: Layout = []

    def take(d: int) -> list | None:
        got = []
        while d > 1:
            if not q or isinstance(q[0], str):
                return None
            f = q[0]
            if d % f == 0:
                got.append(q.pop(0))
                d //= f
            elif f % d == 0:
                q[0] = f // d
                got.append(d)
                d = 1
            else:
                return None
        return got

    for d in dims:
        coef, syms = symbolic.parse_dim(d)
        if not syms:
            g = take(coef)
        elif len(syms) != 1 or syms[0] not in q:
            return None
        else:
            major = 1
            for f in q[:q.index(syms[0])]:
                major *= f
            if coef % major:
                return None
            g = take(major)
            if g is not None:
                q.pop(0)
                rest = take(coef // major)
                g = None if rest is None else [*g, syms[0], *rest]
        if g is None:
            return None
        out.append(g or [1])
    return out if not q else None


def _unmoved(ins: list[Value], axis: int) -> tuple[list[Value], int, list[int] | None]:
    """torch moves the scanned axis to the front before it scans: when every operand is a
    Transpose by one permutation, scan their sources along the axis it moved instead
    (the work that made them then fuses with the scan, in its own layout): (operands,
    axis, the permutation to apply to the result, or None)."""
    prods = [v.producer for v in ins]
    if any(p is None or p.op != "Transpose" for p in prods):
        return ins, axis, None
    perm = list(prods[0].attrs["perm"])
    if any(list(p.attrs["perm"]) != perm for p in prods):
        return ins, axis, None
    return [p.inputs[0] for p in prods], perm[axis] % len(perm), perm


def _cumsum(graph: Graph, ctx) -> int:
    done = 0
    for n in list(graph.nodes):
        if n.op != "CumSum" or n.attrs["exclusive"] or n.attrs["reverse"] or \
                not n.inputs[0].dtype.is_float or n.inputs[0].type.rank == 0:
            continue
        if not ctx.should_apply(f"CumSum {n.name} as a Scan", [n]):
            continue
        s = graph.add_node("Scan", [n.inputs[0]], {"axis": n.attrs["axis"], "combine": "add"},
                           name=graph.fresh_name(f"{n.name}/scan"), origin=n.origin)
        graph.replace_all_uses(n.outputs[0], s.outputs[0])
        graph.erase_node(n)
        done += 1
    return done


def scan(graph, ctx) -> PassResult:
    """Rewrite a traced associative scan (slices of even and odd places, combined and
    interleaved back) → one Scan node per scanned value, and a float CumSum → Scan, when the
    region computes the scan of its leaves by one combine rule."""
    if not any(n.op in SCAN_SIGNS for n in graph.nodes):  # (nothing to look for: no walk)
        return PassResult(False, 0, [], f"{counted(0, 'scan')} as one op each")
    notes = []
    for leaves, axis in _groups(graph, _leaves(graph)):
        if any(v.producer is not None and v.producer.graph is None for v in leaves):
            continue  # (a leaf of a group rewritten before)
        region = _region(graph, leaves)
        for v, combine, order in _identify(graph, leaves, axis, region):
            ins = [leaves[i] for i in order]
            if not ctx.should_apply(f"scan {combine} of {', '.join(x.name for x in ins)}",
                                    region):
                continue
            origin = tuple(dict.fromkeys(o for n in region for o in n.origin))
            ins, at, perm = _unmoved(ins, axis)
            s = graph.add_node("Scan", ins, {"axis": at, "combine": combine},
                               name=graph.fresh_name(f"{v.name}/scan"), origin=origin)
            out = s.outputs[0]
            if perm is not None:  # back where torch moved the axis (transpose_elim folds the
                # pair with the transpose that moves it back)
                out = graph.add_node("Transpose", [out], {"perm": perm}, origin=origin,
                                     name=graph.fresh_name(f"{v.name}/moved")).outputs[0]
            graph.replace_all_uses(v, out)
            notes.append(f"{v.name}: the {combine} scan of {', '.join(x.name for x in ins)} "
                         f"along axis {axis} ({len(region)} nodes traced)")
    done = len(notes) + _cumsum(graph, ctx)
    if done:
        graph.remove_dead()
        graph.toposort()
    return PassResult(done > 0, done, notes, f"{counted(done, 'scan')} as one op each")
