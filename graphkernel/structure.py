"""Structural keys: what a piece of graph computes, without its names.

Two pieces with equal keys are interchangeable for the pass that made the key, so that pass
can decide once and reuse the decision (the split pass for its regions):

- ``attr_key``: a hashable form of an attribute value (an array by dtype, shape and digest).
- ``region_signature``: everything the split model and the built-in fusion patterns read of
  a region: its nodes in order (op, attributes, output types), every edge by position inside
  the region, and what lies outside only as far as the patterns look (the types of outside
  inputs, which outside node uses what, graph outputs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphkernel import ops
from graphkernel.ir import Graph, Node
from graphkernel.ops import OpKind

# Arrays of at most this many bytes are keyed by their bytes themselves (scalar constants,
# copied into every kernel that uses them): cheaper than a digest, and as exact
SMALL_ARRAY_BYTES = 64
# Attribute values that are their own key (exact types: a list or an array is not)
_PLAIN = frozenset({int, float, str, bool, type(None)})


def array_digest(a: np.ndarray) -> bytes:
    """A digest of an array's bytes (no copy of a contiguous array; as bytes, since not
    every dtype, float16 for one, can be handed over as a typed buffer)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    return hashlib.sha1(flat.view(np.uint8)).digest()


def attr_key(v: Any) -> Any:
    """A hashable, comparable form of an attribute value: equal keys, equal values (arrays
    are keyed by dtype, shape and their bytes: the bytes themselves for a small array, a
    SHA-1 digest of them otherwise)."""
    if type(v) in _PLAIN:
        return v
    if isinstance(v, np.ndarray):
        data = v.tobytes() if v.nbytes <= SMALL_ARRAY_BYTES else array_digest(v)
        return ("array", v.dtype, v.shape, data)
    if isinstance(v, Graph):
        return ("graph", str(v))
    if isinstance(v, list | tuple):
        return tuple([attr_key(x) for x in v])
    if isinstance(v, dict):
        return tuple(sorted((k, attr_key(x)) for k, x in v.items()))
    return v


def attrs_key(attrs: dict[str, Any]) -> tuple:
    """``attr_key`` of every attribute, in name order."""
    if not attrs:
        return ()
    return tuple([(k, attr_key(attrs[k])) for k in sorted(attrs)])


def _scalar_const(v) -> bool:
    p = v.producer
    return p is not None and p.op == "Constant" and p.attrs["value"].size == 1


def _beyond(u: Node, index: dict[int, int]) -> Any:
    """An outside user as matmul_depth sees it: its op and, through reshape views with a
    single user, the node they lead to (its position in the region, ``index``, if in it).
    (A module function: a closure calling itself is a cycle, left for the cyclic collector,
    with the region's index, by every call.)"""
    if ops.get(u.op).kind != OpKind.RESHAPE or not u.outputs:
        return u.op
    users = u.outputs[0].users
    if len(users) != 1:
        return (u.op, len(users))
    w = users[0]
    j = index.get(id(w))
    return (u.op, 1, j if j is not None else _beyond(w, index))


def region_signature(region: Sequence[Node], outputs: set[int]) -> tuple:
    """The structure of ``region`` (nodes in topological order) as the split model sees it;
    ``outputs`` holds id() of the graph's outputs. Outside nodes and values are numbered in
    the order they are met, so which outside node reads which value is kept. (Types enter
    as shape and dtype name: tuples of them hash and compare without a Python call.)"""
    index = {id(n): i for i, n in enumerate(region)}
    inside = index.get
    outside: dict[int, int] = {}
    number = outside.setdefault  # an outside node or value: its number, given when first met
    parts = []
    for n in region:
        ins = []
        for v in n.inputs:
            p = v.producer
            j = inside(id(p)) if p is not None else None
            if j is not None:
                ins.append((j, v.index))
            else:
                t = v.type
                ins.append((-1, number(id(v), len(outside)), t.shape, t.dtype._value_,
                            _scalar_const(v)))
        outs = []
        for v in n.outputs:
            uses = []
            for u, k in v.uses:
                j = inside(id(u))
                uses.append((j, k) if j is not None else
                            (-1, number(id(u), len(outside)), k, _beyond(u, index)))
            t = v.type
            outs.append((t.shape, t.dtype._value_, id(v) in outputs, tuple(uses)))
        parts.append((n.op, attrs_key(n.attrs), tuple(ins), tuple(outs)))
    return tuple(parts)


def body_signature(sub: Graph) -> tuple:
    """The structure of a kernel body without its names: its inputs' types, its nodes in
    order (op, attributes, inputs by position, output types) and its outputs by position.
    Bodies with equal signatures get the same schedule, tiling and code but for names.
    (Values enter by number, in the order they are defined: inputs, then each node's
    outputs; types as shape and dtype name, as in ``region_signature``.)"""
    number = {id(v): i for i, v in enumerate(sub.inputs)}
    parts = []
    for n in sub.nodes:
        outs = n.outputs
        parts.append((n.op, attrs_key(n.attrs), tuple([number[id(v)] for v in n.inputs]),
                      tuple([(v.type.shape, v.type.dtype._value_) for v in outs])))
        for v in outs:
            number[id(v)] = len(number)
    return (tuple([(v.type.shape, v.type.dtype._value_, v.mutable) for v in sub.inputs]),
            tuple(parts), tuple([number[id(v)] for v in sub.outputs]))
