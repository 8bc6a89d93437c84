"""Elementwise work on attention heads, rebuilt in the layout the heads arrive in.

Rotary embedding is computed on Q and K after their head split: ``x`` ([B, S, N, D], the
projection's output seen by heads) is transposed to [B, N, S, D], then rotated (slices of
the last axis, a Concat of them, products with cos/sin tables of shape [1, 1, S, D]). The
same computation on ``x`` itself, with the tables seen as [1, S, 1, D], gives the rotated
value in [B, S, N, D] — the layout the fused attention operator reads without a transpose —
and the head split's Transpose disappears with it (the attention pass then needs no
Transpose for V nor a head merge on the output either).

``bsnd_builder`` finds such a region behind a [B, N, S, D] value and returns what rebuilds
it; the attention pass calls it only once it has picked BSND. Q's and K's regions, when they
are the same work on every head (rotary: the tables do not vary over heads), can be built
once on the whole projection the heads are sliced from (see ``qkv_split``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphkernel import ops
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import OpKind
from graphkernel.passes.rewrite import const_array

HEAD_SPLIT = (0, 2, 1, 3)  # [B, S, N, D] <-> [B, N, S, D] (its own inverse)
LAYOUT_ATTRS = frozenset({"axis", "axes", "perm", "shape", "begin", "end", "size"})
MAX_NODES = 64  # a rotary embedding is about ten ops; a larger region is not this pattern


def _head_split_source(v: Value) -> Value | None:
    """x when ``v`` is Transpose(x, [0, 2, 1, 3]), or a Reshape that is one (one head, or a
    sequence of one: the swapped axes move no element), else None."""
    p = v.producer
    if p is None or v.type.rank != 4:
        return None
    if p.op == "Transpose" and tuple(p.attrs["perm"]) == HEAD_SPLIT:
        return p.inputs[0]
    shape = tuple(v.type.shape)
    if p.op == "Reshape" and 1 in shape[1:3] and \
            tuple(p.inputs[0].type.shape) == tuple(shape[a] for a in HEAD_SPLIT):
        return p.inputs[0]
    return None


def _movable(n: Node) -> bool:
    """An op whose result in the other layout is the same op on the other layout's inputs
    (with its axis renamed): elementwise ops without axis attributes, a StridedSlice listing
    its axes, a Concat."""
    if len(n.outputs) != 1 or n.outputs[0].type.rank != 4:
        return False
    if n.op == "StridedSlice":
        return n.attrs["axes"] is not None
    if n.op == "Concat":
        return True
    return ops.get(n.op).kind == OpKind.ELEMWISE and not (LAYOUT_ATTRS & set(n.attrs))


def _leaf_ok(v: Value) -> bool:
    """A value read by the region that is not computed in it: a head split (read before its
    Transpose), a scalar, or a value of rank <= 4 whose axes 1 and 2 (once padded to rank 4)
    are not both longer than 1 (swapping them is a reshape), or a constant."""
    if _head_split_source(v) is not None or v.type.rank == 0:
        return True
    if v.type.rank > 4:
        return False
    full = (1,) * (4 - v.type.rank) + tuple(v.type.shape)
    return full[1] == 1 or full[2] == 1 or const_array(v) is not None


def _reads_split(v: Value, memo: dict[int, bool], depth: int = 0) -> bool:
    """Whether ``v`` is computed by movable ops from a head split."""
    if id(v) not in memo:
        p = v.producer
        memo[id(v)] = _head_split_source(v) is not None or (
            p is not None and depth < MAX_NODES and _movable(p)
            and any(_reads_split(x, memo, depth + 1) for x in p.inputs))
    return memo[id(v)]


def _region(base: Value, outside_ok: set[int]) -> list[Node] | None:
    """The nodes computing ``base`` from head splits and small operands, in graph order;
    None when ``base`` is not such a value, reads no head split, or a value computed in the
    region is also read outside it or is a graph output (the region would then be computed
    twice). ``base`` itself may be a graph output (a key cache returned in [B, N, S, D]): the
    output is then the rebuilt value transposed back (``Rebuild``)."""
    found: dict[int, Node] = {}
    work = [base]
    memo: dict[int, bool] = {}
    if not _reads_split(base, memo):
        return None
    while work:
        v = work.pop()
        p = v.producer
        if p is None or id(p) in found:
            continue
        if not _movable(p):
            return None
        found[id(p)] = p
        if len(found) > MAX_NODES:
            return None
        for x in p.inputs:
            if _head_split_source(x) is None and _reads_split(x, memo):
                work.append(x)  # computed from a head split: rebuilt too
            elif not _leaf_ok(x):
                return None
    for n in found.values():
        for out in n.outputs:
            if base.graph.is_output(out) and out is not base:
                return None
            readers = out.users if out is not base else []
            if any(id(u) not in found for u in readers):
                return None
    if any(id(u) not in outside_ok and id(u) not in found for u in base.users):
        return None
    return base.graph.in_order(found.values())


def _leaf(graph: Graph, v: Value, origin: tuple) -> Value:
    """Leaf ``v`` as the region reads it in [B, S, N, D]."""
    src = _head_split_source(v)
    if src is not None:
        return src
    if v.type.rank == 0:
        return v
    full = (1,) * (4 - v.type.rank) + tuple(v.type.shape)
    want = [full[a] for a in HEAD_SPLIT]
    arr = const_array(v)
    if arr is not None and full[1] != 1 and full[2] != 1:
        return graph.const(np.ascontiguousarray(arr.reshape(full).transpose(HEAD_SPLIT)),
                           v.dtype, origin=origin)
    return graph.add_node("Reshape", [v], {"shape": want}, origin=origin,
                          name=graph.fresh_name(f"{v.name}/bsnd")).outputs[0]


def _attrs(n: Node) -> dict:
    """``n``'s attributes with its axes named in [B, S, N, D]."""
    attrs = dict(n.attrs)
    if n.op == "StridedSlice":
        attrs["axes"] = [HEAD_SPLIT[a % 4] for a in n.attrs["axes"]]
    elif n.op == "Concat":
        attrs["axis"] = HEAD_SPLIT[n.attrs["axis"] % 4]
    return attrs


@dataclass
class Rebuild:
    """The region computing ``base`` ([B, N, S, D]) from head splits, to be computed again
    in [B, S, N, D]."""

    base: Value
    nodes: list[Node]

    def __call__(self, sources: list[Value], on: Value | None = None) -> Value:
        """Build the region in [B, S, N, D]; the [B, S, N, D] values read in place of the
        head splits are appended to ``sources``. ``on``: a [B, S, N', D] value read in place
        of the head split instead (the same work on other heads: ``per_head`` regions)."""
        graph = self.base.graph
        new: dict[int, Value] = {}
        for n in self.nodes:
            ins = []
            for x in n.inputs:
                if id(x) in new:
                    ins.append(new[id(x)])
                    continue
                split = _head_split_source(x) is not None
                ins.append(on if split and on is not None else _leaf(graph, x, n.origin))
                if split:
                    sources.append(ins[-1])
            out = graph.add_node(n.op, ins, _attrs(n), origin=n.origin,
                                 name=graph.fresh_name(f"{n.name}/bsnd")).outputs[0]
            new[id(n.outputs[0])] = out
        built = new[id(self.base)]
        if on is None and graph.is_output(self.base):
            # the graph returns the [B, N, S, D] value (a key cache): the head transpose of
            # the rebuilt value is that value exactly (the ops move no element across heads
            # and positions), and the kernel computing the rebuilt value stores it too
            # (a transpose keeping the last axis is a strided store); the region goes
            back = graph.add_node("Transpose", [built], {"perm": list(HEAD_SPLIT)},
                                  origin=self.nodes[-1].origin,
                                  name=graph.fresh_name(f"{self.base.name}/bnsd"))
            graph.replace_all_uses(self.base, back.outputs[0])
        return built

    def _leaves(self) -> list[tuple[int, int, Value]]:
        """(node, input) positions and values of the inputs not computed in the region."""
        inside = {id(v) for n in self.nodes for v in n.outputs}
        return [(k, i, x) for k, n in enumerate(self.nodes) for i, x in enumerate(n.inputs)
                if id(x) not in inside]

    def per_head(self) -> bool:
        """Whether the region reads one head split and does the same to every head: every
        other value it reads is the same for all heads (extent 1 on the head axis), no op
        slices or joins along the head axis, and the result has the head split's shape (so
        it can be computed on more heads and selected from head by head)."""
        if self.base.graph.is_output(self.base):  # (returned: transposed back as it is)
            return False
        leaves = [x for _, _, x in self._leaves()]
        splits = {id(x): x for x in leaves if _head_split_source(x) is not None}
        if len(splits) != 1 or next(iter(splits.values())).type != self.base.type:
            return False
        for n in self.nodes:
            axes = n.attrs["axes"] if n.op == "StridedSlice" else [n.attrs["axis"]] \
                if n.op == "Concat" else []
            if any(a % 4 == 1 for a in axes):
                return False
        return all(_head_split_source(x) is not None or x.type.rank < 3
                   or x.type.shape[x.type.rank - 3] == 1 for x in leaves)

    def split_source(self) -> Value | None:
        """The [B, S, N, D] value a ``per_head`` region reads in place of its head split."""
        for _, _, x in self._leaves():
            if (src := _head_split_source(x)) is not None:
                return src
        return None

    def same_work(self, other: Rebuild) -> bool:
        """Whether ``other`` is the same ops on the same values but for its head split."""
        if len(self.nodes) != len(other.nodes) or any(
                a.op != b.op or a.attrs != b.attrs or len(a.inputs) != len(b.inputs)
                for a, b in zip(self.nodes, other.nodes, strict=True)):
            return False
        pos = {id(v): k for k, n in enumerate(self.nodes) for v in n.outputs}
        opos = {id(v): k for k, n in enumerate(other.nodes) for v in n.outputs}
        for a, b in zip(self.nodes, other.nodes, strict=True):
            for x, y in zip(a.inputs, b.inputs, strict=True):
                if id(x) in pos or id(y) in opos:
                    if pos.get(id(x)) != opos.get(id(y)):
                        return False
                elif (_head_split_source(x) is None) != (_head_split_source(y) is None) or (
                        _head_split_source(x) is None and x is not y):
                    return False
        return True


def bsnd_builder(base: Value, outside_ok: set[int]) -> Rebuild | None:
    """What builds ``base`` (a [B, N, S, D] value computed elementwise from head splits)
    again in [B, S, N, D], or None when ``base`` is not such a value. ``outside_ok``: ids of
    the nodes besides the region that may read ``base`` (they stop reading it once the
    attention reads the rebuilt value)."""
    if base.type.rank != 4:
        return None
    nodes = _region(base, outside_ok)
    return Rebuild(base, nodes) if nodes is not None else None
