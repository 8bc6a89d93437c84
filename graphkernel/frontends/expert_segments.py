"""Rows split into segments, each multiplied by its own matrix, concatenated back: one grouped
product (``GroupedMatMul``), for the ``torch.compile`` path.

Mixture-of-experts layers written in the ScatterMoE / Megablocks way (JetMoE's and
GraniteMoE's ``ParallelExperts``, many research codes) sort the tokens by expert, count each
expert's tokens, read the counts as Python numbers (``expert_size.tolist()``), split the rows
by them and run one ``F.linear`` per expert with its slice of a stacked weight:

    parts = x.split(expert_size, dim=0)
    out = torch.cat([F.linear(parts[i], self.weight[i]) for i in range(E)], dim=0)

Dynamo breaks the graph at ``tolist()``; the graph after the break gets the counts as
integer inputs, symbolic once they change between calls (they do: they are the data's).
graphkernel's sizes are single symbols or multiples of them, so a split by several
symbols and the concatenation of its parts (whose length is their sum) cannot be typed, and
the whole graph used to run through torch. Yet the computation is the contract of torch's
``_grouped_mm`` and of the vendor's GroupedMatmul (``opdefs/experts.py``): row ``s`` times
the weight of its segment, the segments given by their running row counts. This rewrite of
the ATen graph makes it that: ``_grouped_mm(x, stack(B_i), cumsum(sizes))``, the counts
turned into a tensor of the graph (``scalar_tensor`` of each size). The result has the rows
of ``x``: the values computed from it are typed again from there on.

The match is structural (a split along the rows whose every part feeds one 2-D product
``mm(part_i, B_i)`` with matrices of one shape, those products concatenated in order along
the rows and read by nothing else), whatever names, sizes or number of segments. Anything
else is left as it is.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
_SPLITS = (aten.split_with_sizes.default, aten.split_with_sizes_copy.default)


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, Node) else x


def _match(split: Node) -> tuple[list[Node], Node] | None:
    """(the products in order, the Concat) when ``split`` is a segmented product."""
    x = split.args[0]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    xv = _val(x)
    if not isinstance(xv, torch.Tensor) or xv.dim() != 2 or dim not in (0, -2):
        return None
    sizes = split.args[1]
    if not isinstance(sizes, list | tuple) or len(sizes) < 2:
        return None
    parts: dict[int, Node] = {}
    for u in split.users:
        if u.target is not operator.getitem or len(u.users) != 1:
            return None
        parts[u.args[1]] = u
    if sorted(parts) != list(range(len(sizes))):
        return None
    mms = []
    for i in range(len(sizes)):
        (mm,) = parts[i].users
        if mm.target is not aten.mm.default or mm.args[0] is not parts[i] or \
                mm.args[1] is parts[i] or len(mm.users) != 1:
            return None
        mms.append(mm)
    b0 = _val(mms[0].args[1])
    if not all(isinstance(_val(m.args[1]), torch.Tensor) and
               tuple(_val(m.args[1]).shape) == tuple(b0.shape) and
               _val(m.args[1]).dtype == b0.dtype == xv.dtype for m in mms):
        return None
    (cat,) = mms[0].users
    if cat.target is not aten.cat.default or list(cat.args[0]) != mms or \
            (cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)) not in (0, -2):
        return None
    return mms, cat


def group_segmented_products(gm: GraphModule) -> GraphModule | None:
    """A copy of ``gm`` with its segmented products as grouped products (None when it has
    none: ``gm`` is left as it is)."""
    if not any(n.op == "call_function" and n.target in _SPLITS and _match(n)
               for n in gm.graph.nodes):
        return None
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    new = GraphModule(gm, graph)
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    changed: set[Node] = set()
    for split in [n for n in graph.nodes if n.op == "call_function" and n.target in _SPLITS]:
        found = _match(split)
        if found is not None:
            changed.add(_rewrite(graph, split, *found, mode))
    _retype(graph, changed, mode)
    graph.eliminate_dead_code()
    new.recompile()
    return new


def _rewrite(graph: torch.fx.Graph, split: Node, mms: list[Node], cat: Node,
             mode: Any) -> Node:
    """Put ``_grouped_mm(x, stack(B_i), cumsum(sizes))`` in ``cat``'s place."""
    x, sizes = split.args[0], split.args[1]

    def call(target: Any, *args: Any, **kwargs: Any) -> Node:
        node = graph.call_function(target, args, kwargs)
        a, k = torch.fx.node.map_arg((args, kwargs), _val)
        with mode if mode is not None else _nothing():
            node.meta["val"] = target(*a, **k)
        return node

    with graph.inserting_before(cat):
        w = call(aten.cat.default, [call(aten.unsqueeze.default, m.args[1], 0) for m in mms])
        counts = [call(aten.unsqueeze.default,
                       call(aten.scalar_tensor.default, s, dtype=torch.int32), 0)
                  for s in sizes]
        offs = call(aten.cumsum.default, call(aten.cat.default, counts), 0,
                    dtype=torch.int32)
        gmm = graph.call_function(aten._grouped_mm.default, (x, w, offs))
        xv, wv = _val(x), _val(w)
        with mode if mode is not None else _nothing():  # (its meta kernel takes bf16 only)
            gmm.meta["val"] = xv.new_empty((xv.shape[0], wv.shape[2]))
    cat.replace_all_uses_with(gmm)
    return gmm


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()


def _retype(graph: torch.fx.Graph, changed: set[Node], mode: Any) -> None:
    """Values computed from the grouped products have their rows' length, not the sum of
    the segment sizes the Concat had: their metadata is computed again."""
    from torch.utils._pytree import tree_map

    stale = set(changed)
    for n in graph.nodes:
        if n in stale or n.op != "call_function":
            continue
        if not any(a in stale for a in n.all_input_nodes):
            continue
        a, k = torch.fx.node.map_arg((n.args, n.kwargs), _val)
        with mode if mode is not None else _nothing():
            val = n.target(*a, **k)
        n.meta["val"] = tree_map(lambda t: t, val)
        stale.add(n)
