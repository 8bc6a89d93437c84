"""Sink elementwise work below a Concat: cat(f(x1, c1), f(x2, c2)) -> f(cat(x1, x2), cat(c1, c2)).

Inception's and DenseNet's branches each end with their own BatchNorm + ReLU (the same ops,
per-channel constants of their own) before the channel Concat. As written, each branch's
elementwise chain is a kernel and the Concat copies their results once more; after the
rewrite, the Concat gathers the branches' raw results and one elementwise chain runs on the
whole tile, with the branches' constants concatenated along the same axis. Exact: every
element goes through the same operations with the same operands.

The variable operand may also be one value shared by every piece that broadcasts along the
Concat's axis: rotary angles ``cat(p * inv_freq, p * inv_freq)`` (a position column times a
row of frequencies, the same product twice) become ``p * cat(inv_freq, inv_freq)``, one
elementwise op whose cos and sin one kernel computes, instead of a Concat whose two readers
(the cos, the sin) no kernel can both take.
"""

from __future__ import annotations

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import OpKind, get
from graphkernel.passes.rewrite import add_like, const_array, replace_with
from graphkernel.registry import PassResult


def _piece_op(graph: Graph, v: Value, concat: Node) -> Node | None:
    """The elementwise node producing ``v`` when only the Concat reads it (maybe as several
    of its operands)."""
    p = v.producer
    if p is None or p.op == "Constant" or get(p.op).kind != OpKind.ELEMWISE:
        return None
    if any(u is not concat for u, _ in v.uses) or len(p.outputs) != 1 or graph.is_output(v):
        return None
    return p


CONCATENATED, SHARED = -1, -2  # roles of a piece's variable operand


def _operand_roles(n: Node, axis: int) -> tuple[int, ...] | None:
    """Per operand of ``n``: CONCATENATED for its one non-constant operand when it has
    ``n``'s output shape (the Concat can take it in ``n``'s place), SHARED when it has
    extent 1 along ``axis`` (it broadcasts along the Concat's axis: the rewritten op reads it
    as it is), else its position; None when ``n`` has not exactly one such operand."""
    out = tuple(n.outputs[0].shape)
    variable = [i for i, x in enumerate(n.inputs) if const_array(x) is None]
    if len(variable) != 1:
        return None
    x = n.inputs[variable[0]]
    if tuple(x.shape) == out:
        role = CONCATENATED
    else:
        at = axis - (len(out) - x.type.rank)  # the axis among x's (right-aligned) axes
        if at >= 0 and x.shape[at] != 1:
            return None
        role = SHARED
    return tuple(role if i == variable[0] else i for i in range(len(n.inputs)))


def _joined_constant(pieces: list[Node], pos: int, axis: int) -> np.ndarray | None:
    """The constants at operand ``pos`` of ``pieces``, each broadcast to its piece's extent
    along ``axis`` (and to a common extent along the others), concatenated along ``axis``."""
    arrays, rank = [], pieces[0].outputs[0].type.rank
    for n in pieces:
        c = const_array(n.inputs[pos])
        arrays.append(c.reshape((1,) * (rank - c.ndim) + c.shape))
    if len({a.dtype for a in arrays}) != 1:
        return None
    if arrays[0].shape[axis] == 1 and all(np.array_equal(a, arrays[0]) for a in arrays):
        return arrays[0]  # one constant shared by every piece (a ReLU's 0): keep it small
    common = [max(a.shape[d] for a in arrays) for d in range(rank)]
    out = []
    for a, n in zip(arrays, pieces, strict=True):
        shape = list(common)
        shape[axis] = n.outputs[0].shape[axis]
        try:
            out.append(np.broadcast_to(a, shape))
        except ValueError:
            return None
    return np.concatenate(out, axis=axis)


def _sink(graph: Graph, concat: Node) -> Value | None:
    """The rewritten Concat's replacement, or None when its operands do not qualify."""
    axis = concat.attrs["axis"] % concat.outputs[0].type.rank
    pieces = [_piece_op(graph, v, concat) for v in concat.inputs]
    if len(pieces) < 2 or any(p is None for p in pieces):
        return None
    first = pieces[0]
    roles = _operand_roles(first, axis)
    if roles is None or any(not isinstance(p.outputs[0].shape[axis], int) for p in pieces):
        return None
    if any(p.op != first.op or p.attrs != first.attrs or _operand_roles(p, axis) != roles
           or p.outputs[0].dtype != first.outputs[0].dtype for p in pieces):
        return None
    operands: list[Value] = []
    for pos, role in enumerate(roles):
        if role == CONCATENATED:
            operands.append(add_like(graph, concat, "Concat",
                                     [p.inputs[pos] for p in pieces], dict(concat.attrs)))
            continue
        if role == SHARED:  # one value for every piece, broadcast along the axis
            if any(p.inputs[pos] is not first.inputs[pos] for p in pieces):
                return None
            operands.append(first.inputs[pos])
            continue
        joined = _joined_constant(pieces, pos, axis)
        if joined is None:
            return None
        operands.append(graph.const(np.ascontiguousarray(joined),
                                    name=graph.fresh_name(f"{concat.name}_c"),
                                    origin=first.inputs[pos].producer.origin))
    new = add_like(graph, first, first.op, operands, dict(first.attrs))
    if tuple(new.shape) != tuple(concat.outputs[0].shape):
        return None  # (a shared operand wider than the pieces along another axis)
    return new


def concat_sink(graph, ctx) -> PassResult:
    """Rewrite cat(f(x1, c1), f(x2, c2)) -> f(cat(x1, x2), cat(c1, c2)) for an elementwise
    f whose constants broadcast along the Concat's axis (and cat(f(p, c1), f(p, c2)) ->
    f(p, cat(c1, c2)) for one p broadcast along it); repeated, a whole BatchNorm + ReLU
    chain per branch sinks below the Concat."""
    changed = 0
    work = [n for n in graph.nodes if n.op == "Concat"]
    while work:
        node = work.pop()
        if node.graph is None:
            continue
        mark = len(graph)
        new = _sink(graph, node)
        if new is None or not ctx.should_apply(f"sink {new.producer.op} below {node.name}",
                                               [node]):
            for extra in reversed(graph.nodes[mark:]):  # what a refused rewrite added
                graph.erase_node(extra)
            continue
        pieces = list({id(v.producer): v.producer for v in node.inputs}.values())
        replace_with(graph, node, new)
        for p in pieces:
            if p.graph is not None and not any(v.uses for v in p.outputs) \
                    and not graph.is_output(p.outputs[0]):
                graph.erase_node(p)
        changed += 1
        inner = next((v.producer for v in new.producer.inputs
                      if v.producer is not None and v.producer.op == "Concat"), None)
        if inner is not None:
            work.append(inner)  # the next op of the chains may sink too
    return PassResult(changed > 0, changed)
