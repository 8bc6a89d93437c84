"""Legalisation: what the code generator accepts, and how a kernel it refuses is split.

``check`` makes the schedule of a kernel (its loop space, layouts and layout choices: a
vector kernel, or a cube or MIX kernel on the Matmul API) and checks what can be checked
before run time — that the steps lower, that every dim the host code needs has a C
expression over the actual shapes — or raises ``Unsupported`` with the reason and the node
it stumbled on (``codegen/refusal.py``). ``Checker`` checks each distinct body once: a kernel
of equal body gets the first one's schedule carried over (``codegen/instance.py``), or its
refusal when that names none of the kernel's own nodes or values.

A refused kernel is split around the node it stumbled on (``split_around``): the connected
groups of the rest are retried as kernels of their own, cube ops going out with what only
feeds them, and a matrix product retried as a cube kernel with the transposes folded into
it (``cube_group``). A kernel reducing everything to one value is split into partial
reductions on every core and their combination (``two_stage_parts``); one needing several
passes over its rows into phase kernels (``codegen/vector/phases.py``). A kernel made by a
split is split again at most ``MAX_SPLIT_DEPTH`` times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphkernel.codegen.cube.conv import ConvSchedule, is_conv_kernel, plan_conv
from graphkernel.codegen.cube.group import is_group_kernel, plan_group
from graphkernel.codegen.cube.schedule import (
    MatmulSchedule,
    is_matmul_kernel,
    plan_matmul,
    swaps_last_two,
)
from graphkernel.codegen.instance import rebind, rebind_matmul
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.render import c_dim, shape_refs
from graphkernel.codegen.targets import Target
from graphkernel.codegen.trisolve import TriSolveSchedule, is_trisolve_kernel, plan_trisolve
from graphkernel.codegen.vector import layouts
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.schedule import Schedule, plan
from graphkernel.codegen.window import WindowSchedule, is_window_kernel, plan_window
from graphkernel.ir import Dim, Graph, Node

if TYPE_CHECKING:  # (imported where a kernel is split: most compiles never do, and it is
    import networkx as nx  # a tenth of a second to import)
from graphkernel.kernels import build_kernel, sliced_inputs, unfuse
from graphkernel.ops import CUBE_OPS, PRODUCT_OPS, RESHAPE_OPS

MAX_SPLIT_DEPTH = 3         # a kernel made by splitting another is split again at most this often
STAGE_ELEMS_PER_CORE = 1024  # a whole reduction runs in two stages from this many elements a core
MIN_STAGE_PARTS = 8         # ... over at least this many partial reductions


def check(kernel: Node, target: Target) -> Schedule | MatmulSchedule | WindowSchedule:
    """The schedule of ``kernel`` on ``target`` with its layout choices made, checked as far
    as it can be before run time; Unsupported when the generator cannot make the kernel. A
    kernel holding a matrix product is a cube or MIX kernel (codegen/cube/schedule.py)."""
    if is_window_kernel(kernel):
        return plan_window(kernel, target)
    if is_trisolve_kernel(kernel):  # forward substitution, one system per core at a time
        return plan_trisolve(kernel, target)
    if is_conv_kernel(kernel):  # an implicit-GEMM convolution with its epilogue
        return plan_conv(kernel, target)
    if is_group_kernel(kernel):  # products of one left operand, one after another
        g = plan_group(kernel, target)
        for m in g.members:
            _host_dims_matmul(m.schedule)
        return g
    if is_matmul_kernel(kernel):
        s = plan_matmul(kernel, target)
        _host_dims_matmul(s)
        return s
    s = plan(kernel, target=target)
    ir = lower(s)  # the steps lower (a trial: rendering lowers the final schedule)
    if s.block_tile:
        _block_fits(s, ir, target)
    _host_dims(s, (s.M, s.L, s.batch, *(io.value.type.numel for io in (*s.inputs,
                                                                          *s.outputs))))
    return layouts.choose(kernel, s, ir, target)


def _block_fits(s: Schedule, ir, target: Target) -> None:
    """A block-tile kernel (``Schedule.block_tile``) holds all ``M`` rows of a block for its
    narrowest column tile (one 32-byte block) in UB, by the buffer plan the tiling solves at
    run time; else it is split into phase kernels as before."""
    from graphkernel.codegen.buffers import plan as buffer_plan
    from graphkernel.codegen.refusal import NeedsPhases
    from graphkernel.codegen.vector.schedule import align_elems

    ub, a = buffer_plan(ir, target.block_bytes).budget(), align_elems(s)
    need = ub.tile * s.M * a + ub.col * a + ub.row * s.M + ub.fixed
    if need > target.ub_bytes:
        raise NeedsPhases(f"a reduction over the rows whose result is broadcast back and "
                          f"reduced again needs the block's {s.M} rows in one tile: "
                          f"{need} bytes of UB at the narrowest column tile, over "
                          f"{target.ub_bytes}")


def _host_dims_matmul(s: MatmulSchedule) -> None:
    epi = s.epilogue
    _host_dims(s, (s.M, s.N, s.K, *s.batch, *s.a_strides, *s.b_strides,
                   *(io.value.type.numel for io in s.inputs),
                   *(epi.batch if epi else ()),
                   *(st for i in (epi.inputs if epi else ()) for st in i.strides)))


def _host_dims(s: Schedule | MatmulSchedule, dims: tuple[Dim, ...]) -> None:
    """Every dim the host code computes has a C expression over the actual shapes."""
    refs = shape_refs(s)
    for d in dims:
        c_dim(d, refs)


@dataclass(frozen=True)
class Refused:
    """A body the generator refused, for its equal bodies: the refusal's class and message
    and the position of the node it stumbled on in the body."""

    error: type[Unsupported]
    message: str
    at: int | None

    @staticmethod
    def of(kernel: Node, e: Unsupported) -> Refused | None:
        """``e`` as a refusal of ``kernel``'s body, or None when it names something of the
        kernel (``e.about``) or stumbled on a node outside it (the next kernel of that body
        is checked itself, to name its own)."""
        if e.about:
            return None
        body = kernel.subgraph.nodes
        at = next((i for i, n in enumerate(body) if n is e.node), None)
        if e.node is not None and at is None:
            return None
        return Refused(type(e), str(e), at)

    def raise_for(self, kernel: Node) -> None:
        bad = None if self.at is None else kernel.subgraph.nodes[self.at]
        raise self.error(self.message, node=bad)


class Checker:
    """``check``, each distinct body once: a kernel whose body has the signature of one
    checked before gets that schedule carried over to it, or that refusal."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.done: dict[tuple, Schedule | MatmulSchedule | Refused] = {}

    def check(self, kernel: Node, key: tuple) -> Schedule | MatmulSchedule:
        """The schedule of ``kernel``, whose body has signature ``key``, or Unsupported."""
        first = self.done.get(key)
        if isinstance(first, Refused):
            first.raise_for(kernel)
        if isinstance(first, Schedule) and (s := rebind(first, kernel)) is not None:
            return s
        if isinstance(first, MatmulSchedule) and (s := rebind_matmul(first, kernel)) is not None:
            return s
        try:
            s = check(kernel, self.target)
        except Unsupported as e:
            refused = Refused.of(kernel, e) if key not in self.done else None
            if refused is not None:
                self.done[key] = refused
            raise
        self.done.setdefault(key, s)
        return s


def two_stage_parts(s: Schedule, target: Target) -> int | None:
    """The partial reductions (one per core) for a kernel reducing everything to one value on
    one core when there is work for every core; None for any other kernel."""
    if isinstance(s, (WindowSchedule, ConvSchedule, TriSolveSchedule)):
        return None
    M, L = s.M, s.L
    if not (s.reduce and M == 1 and isinstance(L, int)
            and L >= target.aiv_cores * STAGE_ELEMS_PER_CORE):
        return None
    return next((d for d in range(target.aiv_cores, MIN_STAGE_PARTS - 1, -1) if L % d == 0),
                None)


def cube_group(product: Node) -> list[Node]:
    """A matrix product left outside the kernels as a cube kernel's nodes: it, and the
    transposes of its operands' last two axes that feed only it (folded into isTrans)."""
    group = [product]
    for v in product.inputs:
        while (v.producer is not None and v.producer.op == "Transpose"
               and len(v.users) == 1 and swaps_last_two(v.producer)):
            group.insert(0, v.producer)
            v = v.producer.inputs[0]
    return group


Namer = Callable[[list[Node]], str]


def ungroup(graph: Graph, kernel: Node, name_for: Namer) -> list[Node]:
    """A product group the generator refused, as the kernels of its products (each product
    with its epilogue, as it was before the matmul_group pass joined them)."""
    from graphkernel.codegen.cube.group import parts

    pieces = parts(kernel)
    index = {id(n): i for i, n in enumerate(kernel.subgraph.nodes)}
    nodes = unfuse(graph, kernel)
    out = []
    for piece in pieces:
        group = [nodes[index[id(n)]] for n in piece]
        out.append(build_kernel(graph, group, name_for(group), "cube"))
    return out


def rebind_slices(graph: Graph, kernel: Node, name_for: Namer) -> Node | None:
    """A refused kernel that reads an input only through several slices, rebuilt with one
    input per slice (``kernels.separate_slice_reads``): each part a strided load of its own,
    where the generator refused the parts as column views of one tile at different offsets
    (``silu(gate) * up`` of one product). None when it has no such input: kernels the
    generator accepts keep their column views."""
    if kernel.op != "GraphKernel" or is_group_kernel(kernel) or \
            not sliced_inputs(kernel.subgraph, views=True):
        return None
    nodes = [n for n in unfuse(graph, kernel) if n.op != "Constant"]
    return build_kernel(graph, nodes, name_for(nodes), kernel.attrs["pattern"],
                        slice_inputs=True)


def split_around(graph: Graph, kernel: Node, bad: int | None, name_for: Namer,
                 single_nodes: bool, before: bool = False) -> list[Node]:
    """Unfuse ``kernel``, then rebuild as kernels the connected groups of its nodes left when
    the op it could not generate (``bad``: its index among the kernel's nodes) is taken out;
    cube ops go out with what only feeds them. A group of one computing node is a kernel
    only with ``single_nodes`` (or around a cube op: its epilogue stays one). ``before``
    (a ``SplitBefore`` refusal): the op is not taken out but starts the second part, the
    kernel splitting into what does not depend on it and it with what does. Returns the
    new kernels."""
    nodes = unfuse(graph, kernel)
    if bad is None:
        return []
    if before:
        return _split_before(graph, kernel, nodes, bad, name_for, single_nodes)
    out: set[int] = set()
    cube = nodes[bad].op in CUBE_OPS
    product = nodes[bad].op in PRODUCT_OPS  # retried as cube kernels, feeders as vector ones
    for n in reversed(nodes):
        users = [u for v in n.outputs for u in v.users]
        only_feeds = n.op != "Constant" and users and all(id(u) in out for u in users)
        if n is nodes[bad] or (cube and n.op in CUBE_OPS) or (
                cube and only_feeds and (not product or n.op == "Transpose"
                                         and swaps_last_two(n))):
            out.add(id(n))
    import networkx as nx

    dag = nx.DiGraph()  # the kernel's nodes and edges
    dag.add_nodes_from(id(n) for n in nodes)
    dag.add_edges_from((id(v.producer), id(n)) for n in nodes for v in n.inputs
                       if v.producer is not None and id(v.producer) in dag)
    around = [(nx.ancestors(dag, i), nx.descendants(dag, i)) for i in out]
    keep = [id(n) for n in nodes if id(n) not in out and n.op != "Constant"]
    by_id = {id(n): n for n in nodes}
    order = {id(n): k for k, n in enumerate(nodes)}
    groups = [[by_id[i] for i in sorted(c, key=order.__getitem__)]  # in the kernel's order
              for c in nx.weakly_connected_components(dag.subgraph(keep))]
    built = []
    if product and len(out) < len([n for n in nodes if n.op != "Constant"]):
        # each matrix product, with the transposes folded into it, is retried as a cube
        # kernel; what else fed it is a vector kernel of its own (above)
        for c in _cube_groups(dag, out, by_id, order):
            built.append(build_kernel(graph, c, name_for(c), "cube"))
    for group in groups:
        ids = {id(n) for n in group}
        convex = not any(ids & up and ids & down for up, down in around)
        computing = [n for n in group if n.op not in RESHAPE_OPS]
        lone_ok = cube or single_nodes  # a cube op's epilogue stays one kernel
        if not convex or not computing or (len(computing) < 2 and not lone_ok):
            continue
        built.append(build_kernel(graph, group, name_for(group),
                                  f"{kernel.attrs['pattern']}/split"))
    return built


def _split_before(graph: Graph, kernel: Node, nodes: list[Node], bad: int, name_for: Namer,
                  single_nodes: bool) -> list[Node]:
    """The kernel's nodes as two parts rebuilt as kernels: those that do not depend on
    ``nodes[bad]``, and it with those that do. Both are convex (a path between two nodes of
    the first part through the second would make the far end depend on ``nodes[bad]``)."""
    after = {id(nodes[bad])}
    for n in nodes[bad + 1:]:  # (the kernel's nodes are in topological order)
        if any(id(v.producer) in after for v in n.inputs if v.producer is not None):
            after.add(id(n))
    built = []
    for part in ([n for n in nodes if id(n) not in after], [n for n in nodes if id(n) in after]):
        computing = [n for n in part if n.op not in RESHAPE_OPS and n.op != "Constant"]
        if not computing or (len(computing) < 2 and not single_nodes):
            continue
        group = [n for n in part if n.op != "Constant"]
        built.append(build_kernel(graph, group, name_for(group),
                                  f"{kernel.attrs['pattern']}/split"))
    return built


def _cube_groups(dag: nx.DiGraph, out: set[int], by_id: dict, order: dict
                 ) -> list[list[Node]]:
    """The matrix products among ``out`` (nodes split off a kernel), each with the nodes of
    ``out`` (its operands' last-two-axes transposes) that feed it and no other product: the
    cube kernels to retry."""
    import networkx as nx

    mms = [i for i in out if by_id[i].op in PRODUCT_OPS]
    reach = {i: {j for j in nx.descendants(dag, i) if by_id[j].op in PRODUCT_OPS}
             for i in out if i not in mms}
    groups = []
    for m in sorted(mms, key=order.__getitem__):
        ids = {m} | {i for i, r in reach.items() if r == {m} and by_id[i].op not in CUBE_OPS}
        groups.append([by_id[i] for i in sorted(ids, key=order.__getitem__)])
    return groups
