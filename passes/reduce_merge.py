"""Rewrite a reduction of a reduction → one reduction over both sets of axes.

A mean taken one axis at a time (FocalNet's global context ``x.mean(2, keepdim=True)
.mean(3, keepdim=True)``, a pool written as two means) expands to ReduceSum, a division by
the count, ReduceSum, a division: two reduction kernels, the first writing its partial sums
to GM for the second to read. The same values are one reduction over both axes:

    ReduceSum(ReduceSum(x, A) * c, B) = ReduceSum(x, A ∪ B) * c     (c a scalar constant)
    ReduceMax(ReduceMax(x, A), B)     = ReduceMax(x, A ∪ B)          (also Min, Mean)

The scalar factors between (Mul or Div by a one-element constant) are applied, in the same
order, to the merged sum. Sums are the same terms added in another order and the factor is
applied once instead of to each partial sum (accuracy.md's fp32 tolerance holds); max and
min are exact. Taken only where nothing else reads the inner reduction or the values between
(they would be computed anyway). Each merge is logged; a reduction whose inner value has
other readers is left as it is.
"""

from __future__ import annotations

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.opdefs.reduce import reduce_axes, reduced_shape
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted

MERGEABLE = ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean")


def _scalar(v: Value) -> bool:
    c = const_array(v)
    return c is not None and np.asarray(c).size == 1


def _sole_reader(graph: Graph, v: Value) -> Node | None:
    """The one node reading ``v`` (once), None when another node or the graph's outputs read
    it too."""
    if graph.is_output(v) or len(v.uses) != 1:
        return None
    return v.uses[0][0]


def _inner(graph: Graph, outer: Node) -> tuple[Node, list[Node]] | None:
    """(the inner reduction, the scalar factors between, innermost first) when ``outer``
    reduces, alone-read, a reduction of the same op, through Mul/Div by scalar constants
    (only for sums) and nothing else."""
    v, between = outer.inputs[0], []
    while outer.op == "ReduceSum" and v.producer is not None \
            and v.producer.op in ("Mul", "Div"):
        f = v.producer  # (a float factor: an integer Div truncates each partial sum)
        if not _scalar(f.inputs[1]) or f.inputs[0].type != f.outputs[0].type \
                or not f.outputs[0].dtype.is_float or _sole_reader(graph, v) is None:
            return None
        between.insert(0, f)
        v = f.inputs[0]
    inner = v.producer
    if inner is None or inner.op != outer.op or _sole_reader(graph, v) is None:
        return None
    if inner.inputs[0].dtype != inner.outputs[0].dtype:
        return None
    return inner, between


def _factors_after(graph: Graph, outer: Node) -> list[Node]:
    """The Mul/Div by float scalar constants that alone read ``outer``'s sum, one after the
    other (the division ending a mean)."""
    out, v = [], outer.outputs[0]
    while True:
        f = _sole_reader(graph, v)
        if f is None or f.op not in ("Mul", "Div") or f.inputs[0] is not v \
                or not _scalar(f.inputs[1]) or f.outputs[0].type != v.type \
                or not v.dtype.is_float:
            return out
        out.append(f)
        v = f.outputs[0]
        if graph.is_output(v):
            return out


def _merged_axes(inner: Node, outer: Node) -> list[int]:
    """The axes of the inner reduction's input that the two reduce together."""
    rank = inner.inputs[0].type.rank
    a = reduce_axes(rank, inner.attrs.get("axis"))
    if inner.attrs.get("keep_dims"):
        b = reduce_axes(rank, outer.attrs.get("axis"))
    else:  # the outer axes index the axes the inner reduction kept
        kept = [d for d in range(rank) if d not in a]
        b = [kept[d] for d in reduce_axes(len(kept), outer.attrs.get("axis"))]
    return sorted(set(a) | set(b))


def reduce_merge(graph, ctx) -> PassResult:
    """Rewrite Reduce(Reduce(x, A) [* c], B) → Reduce(x, A ∪ B) [* c] (one reduction kernel
    where a mean was taken one axis at a time)."""
    notes = []
    for outer in list(graph.nodes):
        if outer.graph is None or outer.op not in MERGEABLE:
            continue
        found = _inner(graph, outer)
        if found is None:
            continue
        inner, between = found
        keep = bool(inner.attrs.get("keep_dims"))
        if keep != bool(outer.attrs.get("keep_dims")):
            continue  # (the merged result would not have the outer one's rank)
        axes = _merged_axes(inner, outer)
        if not ctx.should_apply(f"{inner.name} into {outer.name}", [inner, outer]):
            continue
        x = inner.inputs[0]
        if reduced_shape(x.type, axes, keep) != tuple(outer.outputs[0].type.shape):
            continue  # (not for the forms taken above: a guard, not a rule)
        v = add_like(graph, outer, outer.op, [x], {"axis": axes, "keep_dims": keep})
        after = _factors_after(graph, outer) if between else []
        ops_ = {f.op for f in between + after}
        if len(ops_) == 1:  # one factor: s / H / W -> s / (H*W), one rounding
            last = (after or between)[-1]
            total = np.prod([np.asarray(const_array(f.inputs[1]), np.float64).reshape(())
                             for f in between + after])
            c = graph.const(np.asarray(total, last.outputs[0].dtype.np),
                            name=graph.fresh_name(f"{last.name}_factor"), origin=last.origin)
            v = add_like(graph, last, last.op, [v, c])
            graph.replace_all_uses(last.outputs[0], v)
            gone = [*reversed(after), outer, *reversed(between), inner]
        else:
            for f in between:  # the factors, applied once to the merged sum
                v = add_like(graph, f, f.op, [v, f.inputs[1]], dict(f.attrs))
            graph.replace_all_uses(outer.outputs[0], v)
            gone = [outer, *reversed(between), inner]
        for n in gone:
            graph.erase_node(n)
        notes.append(f"{inner.name} and {outer.name}: one {outer.op} over axes {axes}")
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'reduction')} merged into the one it feeds")
