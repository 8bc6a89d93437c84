"""The graph IR: Value, Node, Graph (DType and TensorType, from tensor_types, are re-exported).

One ``Graph`` type flows through every part of graphkernel. A graph owns its
nodes (kept in topological order whenever it is observed), its inputs and its
outputs. Values know their producer and every use, and all mutation goes
through the small API below so that use-lists stay right:

- ``add_input``, ``add_node``, ``const``, ``set_outputs``
- ``replace_all_uses`` / ``replace_input`` (return what they changed; a graph output
  keeps its name through a replacement: see ``output_names``)
- ``erase_node`` (refuses a node that still has users), ``remove_dead``
- ``toposort`` (stable), ``validate`` (invariants, with fix-it messages)
- ``recording`` (the nodes a block adds, for a rewrite that may undo them)
- ``is_output`` (indexed: graph outputs change only through ``set_outputs`` and
  ``replace_all_uses``), ``copy`` and ``settle`` (a copy's bookkeeping, in place)

A fused cluster is an ordinary ``Node`` with ``op == "GraphKernel"`` whose
``attrs["subgraph"]`` is a ``Graph``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from graphkernel import ops
from graphkernel.errors import GraphError
from graphkernel.symbolic import Dim, Shape  # noqa: F401 - Dim re-exported
from graphkernel.tensor_types import DType, TensorType
from graphkernel.textir import format_graph


class Value:
    """One output of one node, or a graph input. Knows its type, producer and uses."""

    __slots__ = ("name", "type", "producer", "index", "uses", "mutable", "graph")

    def __init__(self, name: str, type: TensorType, producer: Node | None = None,
                 index: int = 0, mutable: bool = False) -> None:
        self.name = name
        self.type = type
        self.producer = producer
        self.index = index
        self.uses: list[tuple[Node, int]] = []
        self.mutable = mutable
        self.graph: Graph | None = None

    @property
    def users(self) -> list[Node]:
        """Distinct consumer nodes, in the order their uses were recorded."""
        uses = self.uses
        if len(uses) <= 1:
            return [uses[0][0]] if uses else []
        if len(uses) == 2:
            a, b = uses[0][0], uses[1][0]
            return [a] if a is b else [a, b]
        return list({id(node): node for node, _ in uses}.values())  # (a key keeps its place)

    @property
    def is_input(self) -> bool:
        return self.producer is None

    @property
    def shape(self) -> Shape:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """An op application: ``outputs = op(*inputs, **attrs)``.

    ``origin`` names the user's source nodes this node came from; rewrites keep
    it so that dumps and bisection can always point at the user's own nodes.
    """

    __slots__ = ("op", "name", "inputs", "outputs", "attrs", "origin", "graph", "_seq")

    def __init__(self, op: str, name: str, attrs: dict[str, Any], origin: tuple[str, ...]):
        self.op = op
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.attrs = attrs
        self.origin = origin
        self.graph: Graph | None = None
        self._seq = 0

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise GraphError(f"node '{self.name}' ({self.op}) has {len(self.outputs)} outputs")
        return self.outputs[0]

    @property
    def users(self) -> list[Node]:
        """Distinct consumer nodes of all outputs, in the order their uses were recorded."""
        if len(self.outputs) == 1:
            return self.outputs[0].users
        seen: dict[int, Node] = {}
        for v in self.outputs:
            for u in v.users:
                seen.setdefault(id(u), u)
        return list(seen.values())

    @property
    def subgraph(self) -> Graph:
        return self.attrs["subgraph"]

    def __repr__(self) -> str:
        outs = ", ".join(repr(v) for v in self.outputs)
        ins = ", ".join("%" + v.name for v in self.inputs)
        return f"{outs} = {self.op}({ins})  # {self.name}"


class Graph:
    """Inputs, nodes in topological order, outputs.

    ``output_names`` are the names the graph's outputs are known by (the user's names, set
    with ``set_outputs``); rewrites never change them. When a rewrite replaces an output
    value, the new value takes the output's name, unless it cannot (it is a graph input, or
    already another output): then the output is an alias, and exporters write it under its
    own name (``named_outputs``)."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []  # (changed only by set_outputs and replace_all_uses)
        self.output_names: list[str] = []
        self._output_at: dict[int, list[int]] = {}  # id of an output value -> its positions
        self._nodes: dict[int, Node] = {}
        self._node_names: dict[str, Node] = {}
        self._values: dict[str, Value] = {}
        self._seq = itertools.count(1)
        self._order_dirty = False
        self._name_counters: dict[str, itertools.count] = {}
        self._recorders: list[list[Node]] = []  # open ``recording`` blocks
        self._erased: list[Node] | None = None  # erased since the last ``release_erased``

    # ------------------------------------------------------------------ lookup
    @property
    def nodes(self) -> list[Node]:
        """Nodes in topological order."""
        if self._order_dirty:
            self.toposort()
        return list(self._nodes.values())

    def in_order(self, nodes: Iterable[Node]) -> list[Node]:
        """``nodes`` (nodes of this graph) in topological order, at the cost of sorting them
        rather than the whole graph: the order they were added or last sorted in when it
        puts each after those of them it reads, else the order once the graph is sorted (a
        rewrite rewired them)."""
        found = sorted(nodes, key=lambda n: n._seq)
        ids = {id(n) for n in found}
        if all(v.producer._seq < n._seq for n in found for v in n.inputs
               if v.producer is not None and id(v.producer) in ids):
            return found
        self.toposort()
        return sorted(found, key=lambda n: n._seq)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, name: str) -> Node:
        try:
            return self._node_names[name]
        except KeyError:
            from graphkernel.errors import did_you_mean

            raise GraphError(f"no node named {name!r}"
                             + did_you_mean(name, self._node_names)) from None

    def has_node(self, name: str) -> bool:
        return name in self._node_names

    def value(self, name: str) -> Value:
        try:
            return self._values[name]
        except KeyError:
            from graphkernel.errors import did_you_mean

            raise GraphError(f"no value named {name!r}"
                             + did_you_mean(name, self._values)) from None

    def has_value(self, name: str) -> bool:
        return name in self._values

    def is_output(self, value: Value) -> bool:
        """Whether ``value`` is one of the graph's outputs (at the cost of a dict look-up)."""
        return id(value) in self._output_at

    @property
    def constants(self) -> list[Node]:
        return [n for n in self._nodes.values() if n.op == "Constant"]

    def fresh_name(self, base: str) -> str:
        """A node/value name not used yet in this graph, derived from ``base``."""
        if base not in self._node_names and base not in self._values:
            return base
        counter = self._name_counters.setdefault(base, itertools.count(1))
        while True:
            cand = f"{base}_{next(counter)}"
            if cand not in self._node_names and cand not in self._values:
                return cand

    @contextmanager
    def recording(self) -> Iterator[list[Node]]:
        """The nodes added while the block runs, in the order they were added (for a rewrite
        that may have to undo its additions: cheaper than comparing the whole graph)."""
        added: list[Node] = []
        self._recorders.append(added)
        try:
            yield added
        finally:  # this one, not an equal one (recordings nest, and both may be empty)
            self._recorders = [r for r in self._recorders if r is not added]

    # ---------------------------------------------------------------- building
    def add_input(self, name: str, type: TensorType, mutable: bool = False) -> Value:
        if name in self._values:
            raise GraphError(f"graph '{self.name}': a value named {name!r} already exists")
        v = Value(name, type, mutable=mutable)
        v.graph = self
        self.inputs.append(v)
        self._values[name] = v
        return v

    def remove_input(self, v: Value) -> None:
        """Remove an unused graph input (one a frontend added and then computed otherwise)."""
        if v.graph is not self or v not in self.inputs:
            raise GraphError(f"graph '{self.name}': {v.name!r} is not one of its inputs")
        if v.uses or self.is_output(v):
            raise GraphError(f"graph '{self.name}': input {v.name!r} is still used; replace "
                             "its uses first")
        self.inputs.remove(v)
        del self._values[v.name]
        v.graph = None

    def add_node(
        self,
        op: str,
        inputs: Sequence[Value],
        attrs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        origin: Iterable[str] | None = None,
        out_types: Sequence[TensorType] | None = None,
        output_names: Sequence[str] | None = None,
    ) -> Node:
        """Append a node; attributes are checked and output types inferred by the op registry.

        ``out_types`` skips inference (used by loaders that already know the types;
        ``validate()`` re-checks them).
        """
        opdef = ops.get(op)
        if name is None:
            nname = self.fresh_name(opdef.name.lower())
        elif name in self._node_names:
            raise GraphError(f"graph '{self.name}': a node named {name!r} already exists")
        else:
            nname = name
        for i, v in enumerate(inputs):
            if not isinstance(v, Value):
                raise GraphError(f"node '{nname}' ({op}): input {i} is not a Value: {v!r}")
            if v.graph is not self:
                raise GraphError(
                    f"node '{nname}' ({op}): input {i} '%{v.name}' belongs to another graph"
                )
        where = f"node '{nname}' ({op})"
        in_types = [v.type for v in inputs]
        if out_types is None:  # (checked and inferred at once, remembered per signature)
            norm_attrs, out_types = opdef.node_types(dict(attrs or {}), in_types, where=where)
        else:
            norm_attrs = opdef.check_attrs(dict(attrs or {}), where=where)
            opdef.check_arity(len(inputs), where=where)
        if output_names is not None and len(output_names) < len(out_types):
            raise GraphError(f"{where}: the op has {len(out_types)} outputs, but "
                             f"{len(output_names)} output names are given")
        origin_t = tuple(origin) if origin is not None else (nname,)
        node = Node(opdef.name, nname, norm_attrs, origin_t)
        node.graph = self
        node._seq = next(self._seq)
        for i, v in enumerate(inputs):
            node.inputs.append(v)
            v.uses.append((node, i))
        n_out = len(out_types)
        for i, t in enumerate(out_types):
            if output_names is not None:
                vname = output_names[i]
                if vname in self._values:
                    raise GraphError(f"node '{nname}' ({op}): value name {vname!r} already exists")
            else:
                vname = self.fresh_name(nname if n_out == 1 else f"{nname}:{i}")
            out = Value(vname, t, producer=node, index=i)
            out.graph = self
            node.outputs.append(out)
            self._values[vname] = out
        self._nodes[id(node)] = node
        self._node_names[nname] = node
        for added in self._recorders:
            added.append(node)
        return node

    def const(self, value: Any, dtype: DType | str | None = None, name: str | None = None,
              origin: Iterable[str] | None = None) -> Value:
        """Add a Constant node holding ``value`` (cast to ``dtype`` when given)."""
        arr = np.asarray(value)
        if dtype is not None:
            arr = arr.astype(DType.parse(dtype).np)
        elif arr.dtype == np.float64 and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)  # a Python float defaults to float32, as in torch
        return self.add_node("Constant", [], {"value": arr}, name=name or self.fresh_name("const"),
                             origin=origin).output

    def set_outputs(self, values: Sequence[Value], names: Sequence[str] | None = None) -> None:
        """Set the graph outputs; ``names`` (default: the values' names) is what they are
        called from now on."""
        for v in values:
            if v.graph is not self:
                raise GraphError(f"graph '{self.name}': output '%{v.name}' belongs to another "
                                 "graph")
        names = [v.name for v in values] if names is None else list(names)
        given = dict(zip(names, values, strict=False))
        if len(names) != len(values) or any(given[n] is not v for n, v in zip(names, values)):
            raise GraphError(f"graph '{self.name}': output names {names}: give one name per "
                             "output, distinct for distinct values")
        self.outputs = list(values)
        self.output_names = names
        self._output_at = _positions(self.outputs)

    def named_outputs(self) -> list[tuple[str, Value]]:
        """(name, value) of every output, in order."""
        return list(zip(self.output_names, self.outputs, strict=True))

    def with_output_values_named(self) -> Graph:
        """This graph if every output value carries its output's name; else a copy in which
        each aliased output (a graph input, or a value that is several outputs) is an
        Identity of it, named after the output. File formats that name outputs by their
        values (graphkernel JSON, ONNX) write this form."""
        if all(v.name == n for n, v in self.named_outputs()):
            return self
        g = self.copy()
        outs = []
        for name, v in g.named_outputs():
            if v.name != name:
                holder = g._values.get(name)
                if holder is not None:  # an intermediate value that happens to hold the name
                    g.rename_value(holder, g.fresh_name(f"{name}_value"))
                v = g.add_node("Identity", [v], name=g.fresh_name(name),
                               output_names=[name]).output
            outs.append(v)
        g.set_outputs(outs)
        return g

    # ---------------------------------------------------------------- mutation
    def rename_value(self, value: Value, new: str) -> None:
        self._rename(self._values, value, new, "value")

    def rename_node(self, node: Node, new: str) -> None:
        self._rename(self._node_names, node, new, "node")

    def _rename(self, table: dict[str, Any], obj: Value | Node, new: str, kind: str) -> None:
        if new == obj.name:
            return
        if new in table:
            raise GraphError(f"graph '{self.name}': a {kind} named {new!r} already exists")
        del table[obj.name]
        obj.name = new
        table[new] = obj

    def replace_input(self, node: Node, index: int, new: Value) -> None:
        """Make ``node`` read ``new`` at input ``index``."""
        old = node.inputs[index]
        old.uses.remove((node, index))
        node.inputs[index] = new
        new.uses.append((node, index))
        if new.producer is not None and new.producer._seq > node._seq:
            self._order_dirty = True

    def replace_all_uses(self, old: Value, new: Value) -> int:
        """Redirect every use of ``old`` (graph outputs included) to ``new``; return the count.

        An output keeps its name: ``new`` is renamed after it (``old`` takes a fresh name)
        unless ``new`` is a graph input or already an output."""
        if old is new:
            return 0
        count = 0
        for node, idx in list(old.uses):
            self.replace_input(node, idx, new)
            count += 1
        at = self._output_at.pop(id(old), None)
        if at is not None:
            if id(new) not in self._output_at and new.producer is not None:
                if len(at) > 1:  # (outputs are replaced in order: old is still a later one)
                    self._output_at[id(old)] = at[1:]
                self._take_name(new, self.output_names[at[0]])
                self._output_at.pop(id(old), None)
            for i in at:
                self.outputs[i] = new
            self._output_at[id(new)] = sorted(self._output_at.get(id(new), []) + at)
            count += len(at)
        return count

    def _take_name(self, value: Value, name: str) -> None:
        """Give ``value`` the name ``name``, moving a value that holds it out of the way
        (only a value that is no graph output: an output's name is never taken from it)."""
        holder = self._values.get(name)
        if holder is value:
            return
        if holder is not None:
            if holder.producer is None or id(holder) in self._output_at:
                return
            self.rename_value(holder, self.fresh_name(f"{name}_replaced"))
        self.rename_value(value, name)

    def erase_node(self, node: Node) -> None:
        """Remove a node whose outputs have no users and are not graph outputs."""
        for v in node.outputs:
            if v.uses:
                users = ", ".join(sorted({u.name for u, _ in v.uses}))
                raise GraphError(
                    f"cannot erase node '{node.name}': its output '%{v.name}' is still used by "
                    f"{users}; call replace_all_uses first"
                )
            if id(v) in self._output_at:
                raise GraphError(
                    f"cannot erase node '{node.name}': '%{v.name}' is a graph output"
                )
        for i, v in enumerate(node.inputs):
            v.uses.remove((node, i))
        for v in node.outputs:
            del self._values[v.name]
            v.graph = None
        del self._nodes[id(node)]
        del self._node_names[node.name]
        node.graph = None
        if self._erased is None:  # (made on demand: a kernel's body rarely erases)
            self._erased = []
        self._erased.append(node)

    def release_erased(self) -> None:
        """Let the nodes erased so far be freed as soon as nothing else holds them: a node
        and its outputs refer to each other, a cycle only the cyclic collector would free
        (and it is paused while a graph is compiled). Their outputs lose their producer.
        Called between passes, so that within one a node erased stays what it was (and the
        ids a pass keys its tables by are not given to new objects), or by a pass at a point
        where nothing it keeps refers to the nodes it erased."""
        for node in self._erased or ():
            for v in node.outputs:
                v.producer = None
        self._erased = None

    def remove_dead(self, keep_side_effects: bool = True) -> int:
        """Erase nodes whose results are unused (in-place ops are kept: they write parameters).

        Works back from the unused nodes to the producers they leave unused; only the nodes
        kept are sorted (when the graph was out of order), not those erased."""
        outputs = self._output_at

        def dead(node: Node) -> bool:  # (used first: most nodes are, and it is cheaper)
            outs = node.outputs
            if len(outs) == 1:
                if outs[0].uses or id(outs[0]) in outputs:
                    return False
            elif any(v.uses or id(v) in outputs for v in outs):
                return False
            return not (keep_side_effects and node.op != "GraphKernel"
                        and ops.get(node.op).writes)

        todo = [n for n in self._nodes.values() if dead(n)]
        removed = 0
        while todo:
            node = todo.pop()
            if node.graph is not self:
                continue  # (a producer can be queued by each of its users)
            producers = [v.producer for v in node.inputs if v.producer is not None]
            self.erase_node(node)
            removed += 1
            todo += [p for p in producers if p.graph is self and dead(p)]
        if self._order_dirty:
            self.toposort()
        return removed

    def toposort(self) -> None:
        """Re-sort nodes topologically, keeping the current order where it is already valid:
        among the nodes whose producers are placed, the earliest in the current order goes
        next.

        One walk through the current order: a node whose producers are all placed is placed
        when reached; one still waiting for a producer is parked until its last producer is
        placed, and then goes before the rest of the walk (it came earlier). So a producer
        is placed when it came earlier in the walk and is not parked. (During the walk a
        node's ``_seq`` is its position in the current order, which indexes the tables.)"""
        nodes = list(self._nodes.values())
        for i, n in enumerate(nodes):
            n._seq = i
        order: list[Node] = []
        place = order.append
        missing = [0] * len(nodes)  # of a parked node: its inputs whose producer is not placed
        waiting: dict[int, list[int]] = {}  # a producer not placed -> the nodes parked on it
        ready: list[int] = []  # parked nodes whose producers are all placed (a heap)
        push, pop = heapq.heappush, heapq.heappop
        for i, n in enumerate(nodes):
            k = 0
            for v in n.inputs:
                p = v.producer
                if p is not None:
                    j = p._seq
                    if j >= i or p.graph is not self or missing[j]:
                        k += 1
                        waiting.setdefault(j if p.graph is self else -1, []).append(i)
            if k:
                missing[i] = k
                continue
            place(n)
            if waiting and i in waiting:  # parked nodes freed, earliest first, and so on
                for w in waiting.pop(i):
                    missing[w] -= 1
                    if not missing[w]:
                        push(ready, w)
                while ready:
                    w = pop(ready)
                    place(nodes[w])
                    for u in waiting.pop(w, ()):
                        missing[u] -= 1
                        if not missing[u]:
                            push(ready, u)
        seqs = self._seq
        if len(order) != len(nodes):
            for n in nodes:  # (the order as it was)
                n._seq = next(seqs)
            raise GraphError(f"graph '{self.name}' has a cycle: " + self._describe_cycle())
        if any(a is not b for a, b in zip(order, nodes)):
            self._nodes = dict(zip(map(id, order), order))
        for n, seq in zip(order, seqs):
            n._seq = seq
        self._order_dirty = False

    def _describe_cycle(self) -> str:
        import networkx as nx

        g = nx.DiGraph()
        for n in self._nodes.values():
            for v in n.inputs:
                if v.producer is not None:
                    g.add_edge(v.producer.name, n.name)
        try:
            cyc = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            return "(cycle not found)"
        path = [a for a, _ in cyc] + [cyc[0][0]]
        return " -> ".join(path) + "; a node must not depend on its own output"

    # -------------------------------------------------------------- validation
    def validate(self) -> None:
        """Check acyclicity, use-lists, names and types; raise GraphError saying how to fix it."""
        self._check_use_lists()
        self.toposort()
        seen: set[int] = {id(v) for v in self.inputs}
        for v in self.inputs:
            if v.graph is not self or self._values.get(v.name) is not v:
                raise GraphError(f"graph input '%{v.name}' is not registered in graph "
                                 f"'{self.name}'")
        for node in self._nodes.values():
            where = f"node '{node.name}' ({node.op})"
            if node.graph is not self:
                raise GraphError(f"{where} is not owned by graph '{self.name}'")
            for i, v in enumerate(node.inputs):
                if id(v) not in seen:
                    raise GraphError(
                        f"{where}: input {i} '%{v.name}' is dangling (not a graph input and not "
                        "produced by an earlier node); add its producer or a graph input"
                    )
            for i, v in enumerate(node.outputs):
                if v.producer is not node or v.index != i:
                    raise GraphError(f"{where}: output {i} '%{v.name}' has the wrong producer")
                seen.add(id(v))
            opdef = ops.get(node.op)
            opdef.check_arity(len(node.inputs), where=where)
            expect = opdef.infer_types([v.type for v in node.inputs], node.attrs, where=where)
            got = [v.type for v in node.outputs]
            if list(expect) != got:
                raise GraphError(
                    f"{where}: output types {', '.join(map(str, got))} do not match inferred "
                    f"{', '.join(map(str, expect))}"
                )
            if node.op == "GraphKernel":
                node.subgraph.validate()
        for v in self.outputs:
            if id(v) not in seen:
                raise GraphError(f"graph output '%{v.name}' is not produced in graph '{self.name}'")
        if self._output_at != _positions(self.outputs):
            raise GraphError(f"graph '{self.name}': its outputs were changed in place; set them "
                             "with set_outputs (or replace_all_uses), which keep their index")

    def _check_use_lists(self) -> None:
        """Every input edge is recorded in its value's use-list, and nothing else is."""
        values = list(self.inputs) + [v for n in self._nodes.values() for v in n.outputs]
        many: dict[int, set[tuple[Node, int]]] = {}  # the uses of a value with many, as a set
        for node in self._nodes.values():
            for i, v in enumerate(node.inputs):
                uses = v.uses
                if len(uses) > 8:  # (a shared constant or input: no scan of its uses per use)
                    uses = many.get(id(v))
                    if uses is None:
                        uses = many[id(v)] = set(v.uses)
                if (node, i) not in uses:
                    raise GraphError(f"node '{node.name}' ({node.op}): use-list of '%{v.name}' "
                                     f"misses input {i}; mutate through Graph.replace_input")
        for v in values:
            for u, j in v.uses:
                if u.graph is not self or j >= len(u.inputs) or u.inputs[j] is not v:
                    raise GraphError(f"value '%{v.name}' has a stale use by '{u.name}' input "
                                     f"{j}; mutate through Graph.replace_input")

    # ------------------------------------------------------------------- misc
    def copy(self) -> Graph:
        """A deep copy (attribute values other than subgraphs are shared, they are immutable)."""
        g = Graph(self.name)
        vmap: dict[int, Value] = {}
        for v in self.inputs:
            vmap[id(v)] = g.add_input(v.name, v.type, v.mutable)
        for n in self.nodes:  # (clone_node without its checks and renaming)
            attrs = dict(n.attrs)
            if n.op == "GraphKernel":
                attrs["subgraph"] = n.subgraph.copy()
            new = g._add_raw(n.op, n.name, [vmap[id(v)] for v in n.inputs], attrs, n.origin,
                             [(v.name, v.type) for v in n.outputs])
            for v, out in zip(n.outputs, new.outputs):
                vmap[id(v)] = out
        g.set_outputs([vmap[id(v)] for v in self.outputs], self.output_names)
        return g

    def settle(self, built_in_order: bool = False) -> None:
        """Bring this graph's bookkeeping to the state of a fresh ``copy()`` of it, in place:
        nodes sorted and numbered from 1, every use-list in node order, name tables in that
        order, name counters restarted, subgraphs copied. A pass run on the graph then does
        what it does on a copy (names it makes, users it visits first) without the copy's
        new objects (``compile(..., copy=False)``).

        ``built_in_order``: the caller knows the graph was only built, its inputs then each
        node added after those it reads (nothing erased, rewired or renamed since), as a
        loader builds a file's graph: its nodes, numbers, use-lists and name tables are then
        in that state already, and only the name counters and subgraphs are redone."""
        if built_in_order and not self._order_dirty and self._erased is None:
            for n in self._nodes.values():
                if n.op == "GraphKernel":
                    n.attrs = dict(n.attrs, subgraph=n.subgraph.copy())
            self._name_counters = {}
            return
        nodes = self.nodes
        self.release_erased()
        values: dict[str, Value] = {}
        for v in self.inputs:
            v.uses = []
            values[v.name] = v
        names: dict[str, Node] = {}
        seqs = itertools.count(1)
        for n in nodes:
            if n.op == "GraphKernel":
                n.attrs = dict(n.attrs, subgraph=n.subgraph.copy())
            n._seq = next(seqs)
            for i, v in enumerate(n.inputs):
                v.uses.append((n, i))
            for v in n.outputs:  # (read only by later nodes: emptied before they are)
                v.uses = []
                values[v.name] = v
            names[n.name] = n
        self._values, self._node_names, self._seq = values, names, seqs
        self._name_counters = {}

    def clone_node(self, n: Node, vmap: dict[int, Value],
                   rename: Callable[[str], str] | None = None,
                   attrs: dict[str, Any] | None = None) -> Node:
        """Add a copy of ``n`` (a node of another graph): its inputs are looked up in ``vmap``
        (id of the old value -> new value) and its outputs recorded there. ``rename`` maps the
        node's and its outputs' names (default: kept); ``attrs`` defaults to a copy of n's."""
        name = rename or (lambda s: s)
        new = self._add_raw(n.op, name(n.name), [vmap[id(v)] for v in n.inputs],
                            dict(n.attrs) if attrs is None else attrs, n.origin,
                            [(name(v.name), v.type) for v in n.outputs])
        for old, nv in zip(n.outputs, new.outputs, strict=True):
            vmap[id(old)] = nv
        return new

    def move_nodes(self, nodes: Sequence[Node], into: Graph, vmap: dict[int, Value]) -> None:
        """Move ``nodes`` (a convex set of this graph's nodes, in topological order) into graph
        ``into``, as ``into.clone_node`` of each would copy them: the same names, attributes
        and order, an input from outside read as ``vmap[id(value)]`` (a value of ``into``),
        each value's uses in ``into`` in node order. Uses of their outputs by nodes left here
        stay, for the caller to redirect. Moving, not copying: a fused kernel takes its
        members as they are instead of copying each and erasing the original."""
        members = {id(n) for n in nodes}
        for n in nodes:
            del self._nodes[id(n)]
            del self._node_names[n.name]
            ins = n.inputs
            for i, v in enumerate(ins):
                p = v.producer
                if p is None or id(p) not in members:
                    v.uses.remove((n, i))
                    ins[i] = vmap[id(v)]
            n.graph = into
            n._seq = next(into._seq)
            n.attrs = dict(n.attrs)
            for v in n.outputs:
                del self._values[v.name]
                v.graph = into
                into._values[v.name] = v
            into._nodes[id(n)] = n
            into._node_names[n.name] = n
            for added in into._recorders:
                added.append(n)
        outside: list[tuple[Value, list[tuple[Node, int]]]] = []
        for n in nodes:  # uses by members first, in node order, as copies would get them
            for v in n.outputs:
                outside.append((v, [(u, j) for u, j in v.uses if id(u) not in members]))
                v.uses = []
        for n in nodes:
            for i, v in enumerate(n.inputs):
                v.uses.append((n, i))
        for v, uses in outside:  # then those by nodes left here, in the order they had
            v.uses += uses

    def _add_raw(self, op: str, name: str, inputs: list[Value], attrs: dict[str, Any],
                 origin: tuple[str, ...], outs: list[tuple[str, TensorType]]) -> Node:
        node = Node(op, name, attrs, origin)
        node.graph = self
        node._seq = next(self._seq)
        for i, v in enumerate(inputs):
            node.inputs.append(v)
            v.uses.append((node, i))
        for i, (vname, t) in enumerate(outs):
            out = Value(vname, t, producer=node, index=i)
            out.graph = self
            node.outputs.append(out)
            self._values[vname] = out
        self._nodes[id(node)] = node
        self._node_names[name] = node
        for added in self._recorders:
            added.append(node)
        return node

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self._nodes.values():
            hist[n.op] = hist.get(n.op, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def __str__(self) -> str:
        return format_graph(self)


def _positions(values: list[Value]) -> dict[int, list[int]]:
    """id of each value -> the positions it holds in ``values``, ascending."""
    at: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        at.setdefault(id(v), []).append(i)
    return at
