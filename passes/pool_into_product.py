"""Rewrite a global average pool read only by a constant-weight product → one product over
the pooled values.

A classifier head computes ``mean(y[b, c, ...]) · W``: the pool is a reduction kernel of its
own (its input's rows reduced to one value per channel), then the product. The mean is
linear, so ``Σ_c mean_p(y[b, c, p]) W[n, c] = Σ_(c,p) y[b, c, p] · W[n, c] / P``: one product
of the flattened values ``[B, C·P]`` (a view of the NCHW tensor) by the weight repeated P
times along K and divided by P. The pool's launch is saved; the weight grows P times. That
is taken only where the weight's extra bytes cost less time at the target's HBM rate than
the launch they save (a small image's head: BiT's 8x8, PoolFormer's 2x2; never a 7x7 head
of a thousand classes). The sums are the same values in another order (accuracy.md's fp32
tolerance holds). Weights that are graph inputs (training) are never rewritten.
"""

from __future__ import annotations

import math

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.opdefs.reduce import reduce_axes
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted


def _scale(v: Value) -> tuple[float, Node] | None:
    """(the factor, the node) when ``v``'s only reader divides or multiplies it by a scalar
    constant (a mean expanded into a sum and a division)."""
    if len(v.users) != 1 or v.users[0].op not in ("Div", "Mul"):
        return None
    u = v.users[0]
    c = const_array(u.inputs[1]) if u.inputs[0] is v else None
    if c is None or np.asarray(c).size != 1 or float(np.asarray(c).reshape(())) == 0.0:
        return None
    c = float(np.asarray(c).reshape(()))
    return (1.0 / c if u.op == "Div" else c), u


def _head(graph: Graph, pool: Node) -> tuple[Node, list[Node], float] | None:
    """(the product, the nodes between, the factor applied to the sums) when ``pool`` (a
    ReduceMean, or a ReduceSum then a scalar factor) reduces every axis after the channels of
    a static float ``[B, C, ...]`` value and its ``[B, C]`` result (through views) is read
    only by a product as its left operand, by a constant 2-D weight."""
    x = pool.inputs[0]
    r = x.type.rank
    if r < 3 or not x.dtype.is_float or not all(isinstance(d, int) for d in x.shape):
        return None
    if reduce_axes(r, pool.attrs.get("axis")) != list(range(2, r)):
        return None
    outputs = {id(v) for v in graph.outputs}
    v, between = pool.outputs[0], []
    factor = 1.0 / math.prod(x.shape[2:])
    if pool.op == "ReduceSum":
        found = _scale(v)
        if found is None or id(v) in outputs:
            return None
        factor, u = found
        between.append(u)
        v = u.outputs[0]
    while len(v.users) == 1 and v.users[0].op == "Reshape" and id(v) not in outputs:
        between.append(v.users[0])
        v = between[-1].outputs[0]
    if tuple(v.shape) != tuple(x.shape[:2]) or len(v.users) != 1 or id(v) in outputs:
        return None
    mm = v.users[0]
    if mm.op != "MatMul" or mm.inputs[0] is not v or mm.attrs.get("transpose_a") or \
            set(mm.attrs) - {"transpose_a", "transpose_b"}:
        return None
    w = const_array(mm.inputs[1])
    if w is None or w.ndim != 2:
        return None
    return mm, between, factor


def pool_into_product(graph, ctx) -> PassResult:
    """Rewrite ReduceMean(y, spatial axes) → MatMul(W) → one MatMul of y's flattened values
    by W repeated along K (divided by the pooled count), when the weight's extra bytes cost
    less than the pool's launch at the target's HBM rate."""
    from graphkernel.codegen import targets
    from graphkernel.flags import DEFAULT_TARGET

    spec = ctx.target if ctx.target is not None else targets.load(DEFAULT_TARGET)
    notes = []
    for mean in list(graph.nodes):
        if mean.graph is None or mean.op not in ("ReduceMean", "ReduceSum"):
            continue
        found = _head(graph, mean)
        if found is None:
            continue
        mm, between, factor = found
        x = mean.inputs[0]
        p = math.prod(x.shape[2:])
        w = const_array(mm.inputs[1])
        extra_us = (p - 1) * w.nbytes / (spec.hbm_gbps * 1e3)  # the weight P times, not once
        if extra_us > spec.launch_overhead_us:
            ctx.log(f"pool_into_product: {mean.name} kept: the weight repeated "
                    f"{p} times costs {extra_us:.1f} us at the target's "
                    f"HBM rate, more than the {spec.launch_overhead_us:g} us launch it saves")
            continue
        if not ctx.should_apply(f"{mean.name} into {mm.name}'s weight", [mean, mm]):
            continue
        tb = bool(mm.attrs.get("transpose_b"))
        wide = np.repeat(w, p, axis=1 if tb else 0) * np.asarray(factor, dtype=w.dtype)
        c = graph.add_node("Constant", [], {"value": wide.astype(w.dtype)},
                           name=graph.fresh_name(f"{mm.inputs[1].name}_pooled"),
                           origin=mm.inputs[1].producer.origin).outputs[0]
        flat = add_like(graph, mean, "Reshape", [x], {"shape": [x.shape[0], -1]})
        y = add_like(graph, mm, "MatMul", [flat, c], dict(mm.attrs))
        graph.replace_all_uses(mm.outputs[0], y)
        for n in reversed([mean, *between, mm]):
            graph.erase_node(n)
        notes.append(f"{mean.name}: the mean over {p} values per channel taken into "
                     f"{mm.name}'s weight")
    if notes:
        graph.toposort()
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'global average pool')} taken into products")
