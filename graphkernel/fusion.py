"""The fusion model: cluster ops, candidate regions, areas, and the split model's checks.

- ``fusable_reason`` says why a node may not join a fused kernel (op not in the
  cluster list, skip list, dtype the vector unit does not support).
- ``form_regions`` groups fusable nodes into *convex* regions: no path between two
  nodes of a region ever leaves it, so fusing inside a region can never create a
  cycle through the rest of the graph. Built in one topological sweep with
  Python-int bitsets of region ids (``regions_of``: one sweep for several sets).
- ``SplitModel`` holds a region's areas (sets of nodes that will become one kernel)
  and a reachability table (one bitset per node, over the region's nodes, following
  paths through the whole graph), so a cycle check is a few ANDs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from graphkernel import limits, ops, symbolic
from graphkernel.flags import Config
from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.opdefs.elementwise import BINARY, UNARY
from graphkernel.ops import OpKind
from graphkernel.runlog import Attempt

SYMBOL_SIZE = 32  # how a symbolic dim counts in byte and size estimates

DEFAULT_CLUSTER_OPS = frozenset(
    set(UNARY) | set(BINARY) | {
        "Cast", "Select", "BroadcastTo", "ReduceSum", "ReduceMax", "ReduceMin",
        "ReduceProd", "ElemAny", "Scan", "Reshape", "ExpandDims", "Squeeze", "Transpose",
        "Slice", "StridedSlice"})
# AutoFuse's extended fusions: these ops join the list at their patterns' level (concat 2,
# gather 3; lookup 2, for row lookups only; split_store 2, for Splits of an axis before the
# last), or with a pattern enabled
EXTENDED_CLUSTER_OPS = {"Concat": ("concat",), "Gather": ("gather", "lookup"),
                        "Split": ("split_store",)}
# the vector unit has no float64 and limited int64
SUPPORTED_DTYPES = frozenset({DType.float16, DType.bfloat16, DType.float32, DType.int8,
                              DType.uint8, DType.int16, DType.int32, DType.bool})
INJECTIVE, BROADCAST = "INJECTIVE", "BROADCAST"


def cluster_ops(cfg: Config) -> frozenset[str]:
    """The effective cluster-op list: ``*_only`` replaces it; else default + enable - disable
    (Concat/Gather from their extended pattern's level, or when it is enabled)."""
    if cfg.enable_cluster_ops_only:
        return frozenset(cfg.enable_cluster_ops_only)

    extended = {op for op, pats in EXTENDED_CLUSTER_OPS.items() if any(
        _pattern_on(pat, cfg) for pat in pats)}
    return frozenset((DEFAULT_CLUSTER_OPS | extended | set(cfg.enable_cluster_ops))
                     - set(cfg.disable_cluster_ops))


def _pattern_on(pat: str, cfg: Config) -> bool:
    from graphkernel.registry import PATTERNS

    return (cfg.opt_level >= (PATTERNS[pat].level if pat in PATTERNS else 3)
            or pat in cfg.enable_fusion_pattern or pat in cfg.enable_fusion_pattern_only)


def row_lookup(node: Node) -> bool:
    """A Gather of whole rows of a 2-D float table (a weight: a constant or a graph input) by
    integer indices (an embedding lookup): the vector kernels load such rows by index (the
    scalar unit reads each index), so the lookup joins the kernel that consumes its rows."""
    if node.op != "Gather" or len(node.inputs) != 2:
        return False
    table, idx = node.inputs
    while idx.producer is not None and idx.producer.op in ops.VIEW_OPS:
        idx = idx.producer.inputs[0]
    if idx.producer is not None and idx.producer.op == "BroadcastTo":
        return False  # (the kernel reads each row's index from GM: a broadcast is no array)
    return (len(table.shape) == 2 and node.attrs.get("axis", 0) % 2 == 0
            and isinstance(table.shape[0], int) and table.dtype.is_float
            and idx.dtype in (DType.int32, DType.int64)
            and (table.producer is None or table.producer.op == "Constant"))


def _split_reason(node: Node) -> str | None:
    """Why a vector kernel cannot store a Split's parts (None when one can): a kernel stores
    the parts by rows of a value it computes, so the axis is not the last and the operand
    (seen through views) comes from vector work, not a product, a constant or an input."""
    x = node.inputs[0]
    if node.attrs["axis"] % len(x.shape) == len(x.shape) - 1:
        return "Split of the last axis (its parts are columns of rows, not rows)"
    while x.producer is not None and x.producer.op in ops.VIEW_OPS:
        x = x.producer.inputs[0]
    src = x.producer
    if src is None or src.op == "Constant" or src.op in ops.PRODUCT_OPS or \
            ops.get(src.op).kind > OpKind.REDUCE:
        return ("Split of a value no vector kernel computes (an input, a constant, a "
                "product's, a data movement's or another operator's result: the Split "
                "copies the parts)")
    return None


def _widening(node: Node) -> bool:
    """A Cast of int64 data to float32: a kernel loads the int64 values and converts them (a
    KV-cache step's positions, from which its rotary angles are computed), though it
    computes nothing in int64. The kernel converts them as tiles or as one value per row
    only: not when a reader broadcasts them over leading axes (a row of values compared
    with every bin of a histogram)."""
    if node.op != "Cast" or node.inputs[0].dtype != DType.int64 or \
            node.outputs[0].dtype != DType.float32:
        return False
    todo, seen = [node.outputs[0]], 0
    while todo and seen < 64:
        v = todo.pop()
        seen += 1
        for u in v.users:
            if u.op in ops.VIEW_OPS:
                todo.extend(u.outputs)
            elif u.outputs and not _broadcast_trailing(v, u.outputs[0]):
                return False
    return not todo


def _narrowing(node: Node) -> bool:
    """A Cast of float32 data to int64 that no op reads (a graph output: counts summed in
    float32, ``small_ints``): the kernel computing the floats stores them converted toward
    zero (the vector unit's float -> int64 Cast), as torch's ``.long()``, computing nothing
    in int64."""
    return node.op == "Cast" and node.inputs[0].dtype == DType.float32 and \
        node.outputs[0].dtype == DType.int64 and not node.outputs[0].uses


def _broadcast_trailing(v: Value, out: Value) -> bool:
    """Whether ``v``, read for ``out``, is broadcast over trailing axes only (or not at all)."""
    vs, os_ = list(v.shape), list(out.shape)
    if len(vs) > len(os_):
        return True  # (not a broadcast read: a reduction or a view of it)
    vs = [1] * (len(os_) - len(vs)) + vs
    spread = [a == 1 and b != 1 for a, b in zip(vs, os_, strict=True)]
    first = spread.index(True) if True in spread else len(spread)
    return all(spread[k] or vs[k] == os_[k] == 1 for k in range(first, len(spread)))


def fusable_reason(node: Node, allowed: frozenset[str], cfg: Config) -> str | None:
    """Why ``node`` cannot join a fused kernel, or None when it can."""
    return reason_checker(allowed, cfg)(node)


def reason_checker(allowed: frozenset[str], cfg: Config) -> Callable[[Node], str | None]:
    """``fusable_reason`` for many nodes: the skip lists read from the flags once."""
    skip_names, skip_types = cfg.skip_node_names, cfg.skip_node_types
    gathers = _pattern_on("gather", cfg) or "Gather" in cfg.enable_cluster_ops or \
        "Gather" in cfg.enable_cluster_ops_only

    def reason(node: Node) -> str | None:
        if node.op == "Constant":
            return "constant (an input of kernels, not a member)"
        if skip_names and (node.name in skip_names
                           or any(o in skip_names for o in node.origin)):
            return "node in skip list (skip_node_names_cfg [ByNodeName])"
        if skip_types and node.op in skip_types:
            return "op type in skip list (skip_node_names_cfg [ByNodeType])"
        if node.op not in allowed and node.op not in ops.PRODUCT_OPS:  # (matmul_depth's)
            return f"op {node.op} not in the cluster list"
        if node.op == "Split":
            why = _split_reason(node)
            if why is not None:
                return why
        lookup = node.op == "Gather" and row_lookup(node)
        if node.op == "Gather" and not lookup and not gathers:
            return ("Gather of other than whole rows of a 2-D table (the gather pattern, "
                    "opt_level 3)")
        loaded = lookup or _widening(node)  # (int64 data it only loads)
        stored = _narrowing(node)  # (int64 data it only stores)
        for v in (node.outputs if loaded else node.inputs if stored else
                  (*node.inputs, *node.outputs)):
            if v.dtype not in SUPPORTED_DTYPES:
                return f"dtype {v.dtype.value} not supported by the vector unit"
        return None

    return reason


# ----------------------------------------------------------------------- sizes
def numel(v: Value) -> int:
    n = v.type.numel
    return n if type(n) is int else estimate(n)


@functools.lru_cache(maxsize=4096)
def estimate(d: symbolic.Dim) -> int:
    """A dim's size with every symbol counted as ``SYMBOL_SIZE``, at most ``MAX_NUMEL`` (a
    product of hundreds of symbols is "huge", not a number past a float's range)."""
    return min(int(symbolic.evaluate(d, _Sym())), limits.MAX_NUMEL)


def nbytes(v: Value) -> int:
    t = v.type
    n = t.numel
    return (n if type(n) is int else estimate(n)) * ITEMSIZE[t.dtype]


ITEMSIZE = {d: d.np.itemsize for d in DType}  # (read per value: DType.itemsize asks numpy)


class _Sym(dict):
    def __missing__(self, key: str) -> int:
        return SYMBOL_SIZE

    def __contains__(self, key: object) -> bool:
        return True


def elements(node: Node) -> Any:
    """A node's iteration space: a reduce scans its input, others produce their output."""
    if ops.get(node.op).kind == OpKind.REDUCE and node.inputs:
        return node.inputs[0].type.numel
    return node.outputs[0].type.numel if node.outputs else 1


def is_scalar_const(v: Value) -> bool:
    p = v.producer
    return p is not None and p.op == "Constant" and p.attrs["value"].size == 1


def edge_relation(v: Value, consumer: Node) -> str:
    """BROADCAST when an elementwise/broadcast consumer's output is larger than this input."""
    kind = ops.get(consumer.op).kind
    if kind in (OpKind.ELEMWISE, OpKind.BROADCAST) and not is_scalar_const(v):
        if consumer.outputs[0].type.numel != v.type.numel:
            return BROADCAST
    return INJECTIVE


# --------------------------------------------------------------------- regions
def form_regions(graph: Graph, fusable: set[int]) -> list[list[Node]]:
    """Convex regions of fusable nodes, each in topological order.

    One sweep: ``anc[n]`` holds the regions among n's ancestors, ``left[n]`` those
    with a path to n that leaves the region on the way. A node joins a producer's
    region only if that region is not in ``left`` of its inputs, and two producer
    regions merge only if neither reaches the other through the outside.
    """
    return regions_of(graph, [fusable])[0]


class _Sweep(NamedTuple):
    """The state of ``form_regions`` for one set of fusable nodes."""

    fusable: set[int]
    parent: list[int]       # union-find over region ids
    members: list[int]      # per root: the bit slots of its class
    region_left: list[int]  # per root: the classes reaching it through the outside
    # per node (nodes hash by identity): its region id, ``anc``, ``left``
    region_of: dict[Node, int]
    anc: dict[Node, int]
    left: dict[Node, int]
    live: dict[int, int]    # per root of an open class: its members whose bitsets are kept
    slots: list[int]        # [slots in use, how many before the next renumbering]


def _union(bitsets: dict[Node, int], nodes: Sequence[Node]) -> int:
    """The bitsets of ``nodes`` or-ed together (an absent one reads as 0)."""
    out = 0
    for n in nodes:
        out |= bitsets.get(n, 0)
    return out


def regions_of(graph: Graph, sets: Sequence[set[int]]) -> list[list[list[Node]]]:
    """``form_regions`` of each set of fusable nodes in ``sets``, in one sweep of the graph
    (its order and each node's producers read once for all).

    Bitsets name classes of regions, never single regions: every test reads them through
    ``members`` (the bit slots of a class), and merging two classes merges their slots. So
    a node joining a producer's region passes its producer's ``anc`` on unchanged; ``left``
    is always within ``anc``, and past a node outside every region each region above
    reaches on through the outside: there ``left`` is ``anc`` itself.

    Only *open* classes are ever tested: those with a member some later node reads (a node
    joins, and merges, the classes of its producers only). A class closes for good when its
    last such member is read, so its bit is dead weight in every bitset after; once the
    slots in use reach twice the open classes and some (more while many bitsets are kept),
    each open class gets one slot anew (``_renumber``) and the closed ones none. The bitsets
    stay as wide as the graph's open classes, not as its count of regions. Only bitsets a
    later node reads are kept (an absent one reads as 0).
    """
    nodes = graph.nodes
    # each node's distinct producers, and the position of each producer's last user: after
    # that user nobody reads the producer's bitsets again, so they are freed
    preds_of: list[Sequence[Node]] = []
    last_user: dict[Node, int] = {}
    for i, n in enumerate(nodes):
        ins = n.inputs
        if len(ins) == 1:
            p = ins[0].producer
            preds: Sequence[Node] = () if p is None else (p,)
        else:  # distinct: Sub(x, x) reads x once
            preds = list(dict.fromkeys(v.producer for v in ins if v.producer is not None))
        preds_of.append(preds)
        for p in preds:
            last_user[p] = i
    sweeps = [_Sweep(fusable, [], [], [], {}, {}, {}, {}, [0, RENUMBER_AT])
              for fusable in sets]

    for i, n in enumerate(nodes):
        preds = preds_of[i]
        single = len(preds) == 1
        read_later = n in last_user
        for fusable, parent, members, region_left, region_of, anc, left, live, slots in sweeps:
            a_in = anc.get(preds[0], 0) if single else _union(anc, preds)
            if id(n) not in fusable:
                if read_later and a_in:  # (an absent bitset reads as 0)
                    anc[n] = left[n] = a_in
                continue
            l_in = left.get(preds[0], 0) if single else _union(left, preds)
            chosen = -1
            for p in preds:
                r = region_of.get(p)
                if r is None:
                    continue
                r = _find(parent, r)
                if r == chosen or members[r] & l_in:
                    continue
                if chosen < 0:
                    chosen = r
                elif not (members[r] & region_left[chosen]) and \
                        not (members[chosen] & region_left[r]):
                    parent[r] = chosen
                    members[chosen] |= members[r]
                    region_left[chosen] |= region_left[r]
                    live[chosen] += live.pop(r)
            if chosen < 0:
                chosen = len(parent)
                parent.append(chosen)
                members.append(1 << slots[0])
                slots[0] += 1
                region_left.append(0)
                live[chosen] = 0
                a_in |= members[chosen]
            region_of[n] = chosen
            # l_in holds no slot of the chosen class (else it was not chosen), and is within
            # a_in: what reaches n from outside its region is a_in without the region
            left_n = a_in & ~members[chosen]
            region_left[chosen] |= left_n
            if read_later:
                anc[n], left[n] = a_in, left_n
                live[chosen] += 1
            elif not live[chosen]:  # closed as soon as opened
                del live[chosen]
        for p in preds:  # free bitsets nobody will read again
            if last_user[p] == i:
                for sweep in sweeps:
                    sweep.anc.pop(p, None)
                    sweep.left.pop(p, None)
                    r = sweep.region_of.get(p)
                    if r is not None:
                        r = _find(sweep.parent, r)
                        sweep.live[r] -= 1
                        if not sweep.live[r]:
                            del sweep.live[r]
        for sweep in sweeps:
            if sweep.slots[0] >= sweep.slots[1]:
                _renumber(sweep)
    out = []
    for sweep in sweeps:
        groups: dict[int, list[Node]] = {}
        for n in nodes:
            r = sweep.region_of.get(n)
            if r is not None:
                groups.setdefault(_find(sweep.parent, r), []).append(n)
        out.append(list(groups.values()))
    return out


RENUMBER_AT = 64  # slots in use before the first renumbering


def _find(parent: list[int], r: int) -> int:
    while parent[r] != r:
        parent[r] = parent[parent[r]]
        r = parent[r]
    return r


def _renumber(sweep: _Sweep) -> None:
    """One bit slot per open class, none for closed ones, in every bitset still read."""
    classes = [(r, sweep.members[r]) for r in sweep.live]
    renamed: dict[int, int] = {0: 0}

    def rename(bits: int) -> int:
        out = renamed.get(bits)
        if out is None:
            out = 0
            for k, (_, mask) in enumerate(classes):
                if bits & mask:
                    out |= 1 << k
            renamed[bits] = out
        return out

    for table in (sweep.anc, sweep.left):
        for n, bits in table.items():
            table[n] = rename(bits)
    for r, _ in classes:
        sweep.region_left[r] = rename(sweep.region_left[r])
    for k, (r, _) in enumerate(classes):
        sweep.members[r] = 1 << k
    sweep.slots[0] = len(classes)
    # the next renumbering once as many slots again (and some) are taken, or more while
    # many bitsets are kept (renumbering reads every one of them)
    sweep.slots[1] = 2 * len(classes) + max(RENUMBER_AT, len(sweep.anc) // 8)


# ------------------------------------------------------------------ live memory
class LiveProfile:
    """How many bytes of intermediate values are alive at each place of a topological order
    (a value lives from its producer to its last user; a graph output to the end; graph
    inputs and constants live throughout and are left out). The peak-memory guard asks it
    what a fusion does to the peak: the kernel runs where its last node ran, so a value an
    earlier node of it read stays alive until then, while the values passed inside the
    kernel are never written and those it passes on are written only then."""

    def __init__(self, order: Sequence[Node | None], position: dict[int, int],
                 outputs: set[int]) -> None:
        end = len(order)
        diff = [0] * (end + 1)
        self.last: dict[int, int] = {}  # id(value) -> position of its last user
        for k, n in enumerate(order):
            if n is None or n.op == "Constant":
                continue
            for v in n.outputs:
                last = end - 1 if id(v) in outputs else max(
                    (position.get(id(u), k) for u in v.users), default=k)
                self.last[id(v)] = last
                b = nbytes(v)
                diff[k] += b
                diff[last + 1] -= b
        live, run = [], 0
        for d in diff[:end]:
            run += d
            live.append(run)
        self.live = live
        self.peak = max(live, default=0)
        # per node (by id): (id(value), its last use, bytes) of each value it reads that has a
        # producer (made when first asked)
        self._reads: dict[int, tuple[tuple[int, int, int], ...]] = {}

    def reads(self, n: Node) -> tuple[tuple[int, int, int], ...]:
        r = self._reads.get(id(n))
        if r is None:
            r = self._reads[id(n)] = tuple(
                (id(v), self.last[id(v)], nbytes(v)) for v in n.inputs
                if v.producer is not None and id(v) in self.last)
        return r

    def peak_with(self, changes: list[tuple[int, int, int]]) -> int:
        """The peak over the places ``changes`` touch, each (first, last, bytes) added to the
        live bytes from ``first`` to ``last`` (inclusive)."""
        cuts = sorted({p for a, b, _ in changes for p in (a, b + 1)})
        best = 0
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            d = sum(x for a, b, x in changes if a <= lo and hi - 1 <= b)
            best = max(best, max(self.live[lo:hi]) + d)
        return best


# ------------------------------------------------------------------ split model
@dataclass
class Area:
    nodes: list[Node]
    mask: int
    patterns: list[str] = field(default_factory=list)
    _dominant: Node | None = field(default=None, repr=False)
    _kind: OpKind | None = field(default=None, repr=False)
    _name: str | None = field(default=None, repr=False)
    # edges crossing the area's boundary; they change only when this area merges
    _in_edges: list[tuple[Value, Node]] | None = field(default=None, repr=False)
    _out_edges: list[tuple[Value, Node]] | None = field(default=None, repr=False)
    # how a node is named in the area's name (default: its own name)
    _label: Callable[[Node], str] | None = field(default=None, repr=False)

    @property
    def ops(self) -> int:
        return len(self.nodes)

    @property
    def dominant(self) -> Node:
        """The node of highest kind (the largest iteration space among equals)."""
        if self._dominant is None:
            self._dominant = max(self.nodes, key=lambda n: (
                ops.get(n.op).kind, estimate(elements(n))))
        return self._dominant

    @property
    def name(self) -> str:
        if self._name is None:
            dom = self._label(self.dominant) if self._label else self.dominant.name
            self._name = dom if self.ops == 1 else f"{dom}(+{self.ops - 1})"
        return self._name


class SplitModel:
    """Areas of one convex region and the checks every pattern shares."""

    def __init__(self, graph: Graph, region: list[Node], cfg: Config, ctx: Any,
                 attempts: list[Attempt], label: Callable[[Node], str] | None = None,
                 order: Sequence[Node | None] | None = None,
                 position: dict[int, int] | None = None,
                 profile: LiveProfile | None = None) -> None:
        """``order``/``position``: a topological order of ``graph`` and each node's place in
        it (computed here when not given; the split pass computes them once for every
        region, and leaves None where it erased a node). ``profile``: the live bytes along
        that order, for the peak-memory guard (made here when the guard is on and none is
        given)."""
        self.graph = graph
        self.cfg = cfg
        self.ctx = ctx
        self.attempts = attempts
        self.index = {id(n): i for i, n in enumerate(region)}
        self.nodes = region
        self.outputs = {id(v) for v in graph.outputs}
        # reachability over every path, outside the region too: reach[id(n)] = bitset of
        # region nodes reachable from n (itself included). A path between two region nodes
        # runs through nodes topologically between them, so the sweep covers that span only.
        # Convex regions never route a path outside, but the cycle check must not depend on
        # that: a merge that makes the graph cyclic is refused whatever the region. (Paths
        # through kernels the split pass built from earlier regions are not in the order;
        # the graph's own toposort still rejects a cycle through one.)
        if order is None or position is None:
            order = graph.nodes
            position = {id(n): i for i, n in enumerate(order)}
        pos = position
        self.position = position
        if profile is None and cfg.peak_memory_growth >= 0:
            profile = LiveProfile(order, position, self.outputs)
        self.profile = profile
        # the guard's verdicts, by the areas' node positions: they depend on where the region
        # lies, so the split pass checks them again before it replays this region's
        # decisions on another one
        self.guards: list[tuple[tuple[tuple[int, ...], ...], str | None]] = []
        # far from the peak no fusion of this region can raise it enough: no guard to ask
        self.guard_free = profile is None or guard_free(region, profile, position,
                                                        cfg.peak_memory_growth)
        lo = min((pos[id(n)] for n in region), default=0)
        hi = max((pos[id(n)] for n in region), default=-1)
        reach: dict[int, int] = {}
        for k in range(hi, lo - 1, -1):
            n = order[k]
            if n is None:  # replaced by a kernel of the split pass (it had no users)
                continue
            i = self.index.get(id(n))
            r = 0 if i is None else 1 << i
            for u in n.users:
                r |= reach.get(id(u), 0)
            if r:
                reach[id(n)] = r
        self.reach = reach
        self._seen: set[tuple] = set()  # rejections already recorded
        self._multi: dict[int, Area] = {}  # areas of more than one node (the cycle check)
        self._bytes: dict[int, int] = {}
        self._area: dict[int, Area] = {  # id(node) -> its area
            id(n): Area([n], 1 << i, _label=label) for i, n in enumerate(region)}

    # ------------------------------------------------------------ structure
    def areas(self) -> list[Area]:
        seen: dict[int, Area] = {}
        for a in self._area.values():
            seen.setdefault(id(a), a)
        return sorted(seen.values(), key=lambda a: self.index[id(a.nodes[0])])

    def area(self, node: Node) -> Area | None:
        return self._area.get(id(node))

    def _inputs_of(self, a: Area) -> list[tuple[Value, Node]]:
        """(value, consuming node) for every in-region edge entering ``a`` (cached)."""
        if a._in_edges is None:
            a._in_edges = [(v, n) for n in a.nodes for v in n.inputs
                           if v.producer is not None and self._area.get(id(v.producer))
                           not in (None, a)]
        return a._in_edges

    def _outputs_of(self, a: Area) -> list[tuple[Value, Node]]:
        """(value, using node) for every use leaving ``a``; the user may be outside the
        region (cached)."""
        if a._out_edges is None:
            a._out_edges = [(v, u) for n in a.nodes for v in n.outputs for u, _ in v.uses
                            if self._area.get(id(u)) is not a]
        return a._out_edges

    def producers(self, a: Area) -> list[tuple[Area, Value, Node]]:
        """(producer area, value, consuming node) for every in-region edge into ``a``."""
        area = self._area
        return [(area[id(v.producer)], v, n) for v, n in self._inputs_of(a)]

    def producer_areas(self, a: Area) -> list[Area]:
        return _unique(pa for pa, _, _ in self.producers(a))

    def consumers(self, a: Area) -> tuple[list[Area], bool]:
        """Consumer areas in the region, and whether some consumer lies outside the region
        (or an output is a graph output)."""
        out: dict[int, Area] = {}
        external = self.is_output(a)
        for _, u in self._outputs_of(a):
            ua = self._area.get(id(u))
            if ua is None:
                external = True
            else:
                out.setdefault(id(ua), ua)
        return list(out.values()), external

    def outputs_of(self, a: Area) -> list:
        """(value, reading node) of every read of ``a``'s values outside it."""
        return list(self._outputs_of(a))

    def area_of(self, n: Node) -> Area | None:
        """The area holding node ``n`` in this region, None outside the region."""
        return self._area.get(id(n))

    def is_output(self, a: Area) -> bool:
        outs = self.outputs
        return bool(outs) and any(id(v) in outs for n in a.nodes for v in n.outputs)

    def kind(self, a: Area) -> OpKind:
        """The highest op kind; an elementwise area fed through a broadcast edge from outside
        the area is a BROADCAST area."""
        if a._kind is not None:
            return a._kind
        k = max(ops.get(n.op).kind for n in a.nodes)
        if k == OpKind.ELEMWISE:
            for n in a.nodes:
                for v in n.inputs:
                    if (v.producer is None or self.area(v.producer) is not a) and \
                            edge_relation(v, n) == BROADCAST:
                        k = OpKind.BROADCAST
                        break
        a._kind = k
        return k

    def size(self, a: Area) -> Any:
        """The area's compute size: the element count of its dominant node."""
        return elements(a.dominant)

    def relation(self, producer: Area, consumer: Area) -> str:
        rels = {edge_relation(v, n) for pa, v, n in self.producers(consumer) if pa is producer}
        return BROADCAST if BROADCAST in rels else INJECTIVE

    def only_consumer_is(self, producer: Area, consumer: Area) -> bool:
        cons, external = self.consumers(producer)
        return not external and cons == [consumer]

    # ------------------------------------------------------------- checks
    def creates_cycle(self, areas: Iterable[Area]) -> bool:
        """Fusing ``areas`` is cyclic iff a path leaves the union (through the region or the
        rest of the graph, and through the areas fused so far: a path that enters an area
        leaves it from any of its nodes, since its kernel reads all its inputs before it
        writes any output) and comes back."""
        union = 0
        group = list(areas)
        for a in group:
            union |= a.mask
        seen = 0  # region nodes a path leaving the union reaches
        for a in group:
            for n in a.nodes:
                for u in n.users:
                    j = self.index.get(id(u))
                    if j is not None and (union >> j) & 1:
                        continue
                    seen |= self.reach.get(id(u), 0)
        if seen & union:
            return True
        if not seen:  # no path leaves the union into the region
            return False
        fused = [a for a in self._multi.values() if not a.mask & union]
        grew = True
        while grew and fused:  # into an area at one node, out of it at every other
            grew, rest = False, []
            for a in fused:
                if a.mask & seen:
                    seen |= self._area_reach(a)
                    grew = True
                else:
                    rest.append(a)
            if seen & union:
                return True
            fused = rest
        return False

    def _area_reach(self, a: Area) -> int:
        r = 0
        for n in a.nodes:
            r |= self.reach.get(id(n), 0)
        return r

    def score(self, areas: list[Area]) -> int:
        """GM bytes saved: every value passed between two of the areas is no longer read back,
        nor written when nothing outside the union still needs it."""
        ids = {id(a) for a in areas}
        saved = 0
        seen: set[int] = set()
        for a in areas:
            for n in a.nodes:
                for v in n.inputs:
                    p = v.producer
                    if p is None or id(v) in seen:
                        continue
                    pa = self.area(p)
                    if pa is None or pa is a or id(pa) not in ids:
                        continue
                    seen.add(id(v))
                    # the write is saved too when every use is inside the union
                    inside = id(v) not in self.outputs and all(
                        (ua := self._area.get(id(u))) is not None and id(ua) in ids
                        for u, _ in v.uses)
                    saved += self._nbytes(v) * (2 if inside else 1)
        return saved

    def _nbytes(self, v: Value) -> int:
        b = self._bytes.get(id(v))
        if b is None:
            b = self._bytes[id(v)] = nbytes(v)
        return b

    # -------------------------------------------------------------- fusing
    def try_fuse(self, pattern: str, areas: list[Area], limit: int | None = None) -> bool:
        areas = _unique(areas)
        names = [a.name for a in areas]
        nodes = [n.name for a in areas for n in a.nodes]
        total = sum(a.ops for a in areas)
        cap = self.cfg.composite_op_limit_size

        def record(verdict: str, reason: str = "", score: int | None = None) -> bool:
            key = (pattern, tuple(names), reason)
            if verdict == "fused" or key not in self._seen:
                self._seen.add(key)
                self.attempts.append(Attempt(pattern, names, nodes,
                                             self.score(areas) if score is None else score,
                                             verdict, reason))
            return verdict == "fused"

        if total > cap:
            return record("rejected", f"size limit: {total} ops > composite_op_limit_size={cap}")
        if limit is not None and total > limit:
            return record("rejected", f"size limit: {total} ops > {pattern} limit {limit}")
        max_inputs = self.cfg.max_kernel_inputs
        if max_inputs and (n_in := len(kernel_inputs(areas))) > max_inputs:
            return record("rejected", f"input limit: {n_in} inputs > max_kernel_inputs="
                                      f"{max_inputs} (target {self.cfg.target})")
        if self.creates_cycle(areas):
            return record("rejected", "cycle: a path between these areas leaves them "
                                       "(the kernel would feed itself)")
        if (grown := self.peak_growth(areas)) is not None:
            return record("rejected", grown)
        if not self.ctx.should_apply(f"{pattern}: " + " + ".join(names),
                                     [n for a in areas for n in a.nodes]):
            return record("rejected", "refused by bisect_limit")
        saved = self.score(areas)  # before the merge changes the areas
        target = areas[0]
        for other in areas[1:]:
            target.nodes.extend(other.nodes)
            target.mask |= other.mask
            target.patterns.extend(other.patterns)
            for n in other.nodes:
                self._area[id(n)] = target
        target.nodes.sort(key=lambda n: self.index[id(n)])
        for other in areas[1:]:
            self._multi.pop(id(other), None)
        self._multi[id(target)] = target
        target.patterns.append(pattern)
        target._dominant = target._kind = target._name = None
        target._in_edges = target._out_edges = None
        return record("fused", score=saved)

    def peak_growth(self, areas: list[Area]) -> str | None:
        """Why fusing ``areas`` raises the estimated peak of live memory by more than
        ``peak_memory_growth`` percent, or None (see ``peak_refusal``)."""
        if self.profile is None:
            return None
        groups = [a.nodes for a in areas]
        reason = None if self.guard_free else peak_refusal(
            groups, self.profile, self.position, self.outputs, self.cfg.peak_memory_growth)[0]
        self.guards.append((tuple(tuple(self.index[id(n)] for n in g) for g in groups), reason))
        return reason

    def reject(self, pattern: str, areas: list[Area], reason: str) -> bool:
        names = [a.name for a in areas]
        key = (pattern, tuple(names), reason)
        if key not in self._seen:
            self._seen.add(key)
            self.attempts.append(Attempt(pattern, names, [n.name for a in areas for n in a.nodes],
                                         self.score(areas), "rejected", reason))
        return False


def guard_free(region: Sequence[Node], prof: LiveProfile, pos: dict[int, int],
               growth: int) -> bool:
    """Whether no fusion within ``region`` can raise the estimated peak by more than
    ``growth`` percent: even every value its nodes read kept alive from its last use to the
    region's last node stays within the bound. (A value a fusion keeps alive longer is one a
    node of the region reads, kept until a later node of it.)"""
    hi = max(pos[id(n)] for n in region)
    kept: dict[int, tuple[int, int]] = {}  # id(value) -> (its last use, bytes), if before hi
    for n in region:
        for v in n.inputs:
            p = v.producer
            if p is not None and p.op != "Constant" and id(v) not in kept:
                last = prof.last.get(id(v))
                if last is not None and last < hi:
                    kept[id(v)] = (last, nbytes(v))
    bound = prof.peak + prof.peak * growth // 100
    extra = 0
    ends = sorted(kept.values())
    for i, (last, b) in enumerate(ends):
        extra += b  # alive from last + 1 on, with every value that ended earlier
        stop = ends[i + 1][0] if i + 1 < len(ends) else hi
        if stop > last and max(prof.live[last + 1:stop + 1]) + extra > bound:
            return False
    return True


def guard_signature(region: Sequence[Node], prof: LiveProfile, pos: dict[int, int]) -> tuple:
    """Everything the peak-memory guard reads about ``region``, relative to its first place:
    two regions of equal structure and equal signature get the same verdicts for the same
    fusions (the live bytes along the span, where each node is, when each value it reads and
    writes is last used, where its outside users are)."""
    lo = min(pos[id(n)] for n in region)
    hi = max(pos[id(n)] for n in region)
    where = tuple(pos[id(n)] - lo for n in region)
    reads = tuple(last - lo for n in region for _, last, _ in prof.reads(n))
    writes = tuple((prof.last.get(id(v), lo - 1) - lo,
                    tuple(pos[id(u)] - lo if id(u) in pos else None for u in v.users))
                   for n in region for v in n.outputs)
    return prof.peak, tuple(prof.live[lo:hi + 1]), where, reads, writes


def peak_refusal(groups: Sequence[Sequence[Node]], prof: LiveProfile, pos: dict[int, int],
                 outputs: set[int], growth: int) -> tuple[str | None, bool]:
    """Why fusing the node ``groups`` into one kernel raises the estimated peak of live memory
    by more than ``growth`` percent (None if it does not), and whether it keeps any value
    alive longer at all. The kernel runs where its last node ran: a value an earlier node read
    from outside, and nothing later reads, stays alive until then; the values passed inside
    are never written, and those leaving it are written only there."""
    at = max(pos[id(n)] for g in groups for n in g)
    late: dict[int, tuple[int, int]] = {}  # values read whose last use is before ``at``
    for g in groups:
        for n in g:
            for vid, last, b in prof.reads(n):
                if last < at:
                    late[vid] = (last, b)
    if not late:
        return None, False
    members = {id(n) for g in groups for n in g}
    inner = {id(v) for g in groups for n in g for v in n.outputs}
    changes = [(last + 1, at, b) for vid, (last, b) in late.items() if vid not in inner]
    if not changes:
        return None, False
    allowed = prof.peak * growth // 100
    kept = sum(b for _, _, b in changes)
    first = min(a for a, _, _ in changes)
    if max(prof.live[first:at + 1]) + kept - prof.peak <= allowed:
        return None, True  # even all of it alive at the busiest place stays within the bound
    for g in groups:
        for n in g:
            k = pos[id(n)]
            for v in n.outputs:
                last = prof.last.get(id(v))
                if last is None or k >= at:
                    continue
                if id(v) not in outputs and all(id(u) in members for u in v.users):
                    changes.append((k, last, -nbytes(v)))  # never written
                elif all(pos.get(id(u), at) >= at for u in v.users if id(u) not in members):
                    changes.append((k, at - 1, -nbytes(v)))  # written only at the kernel
    grown = prof.peak_with(changes) - prof.peak
    if grown <= allowed:
        return None, True
    return (f"peak memory: keeps {kept:,} B alive until the kernel runs, raising the "
            f"estimated peak by {grown:,} B ({100 * grown / prof.peak:.0f}%) > "
            f"peak_memory_growth={growth}%"), True


def kernel_inputs(areas: Iterable[Area]) -> list[Value]:
    """The values a kernel made of ``areas`` would read (scalar constants are copied in)."""
    members = {id(n) for a in areas for n in a.nodes}
    seen: dict[int, Value] = {}
    for a in areas:
        for n in a.nodes:
            for v in n.inputs:
                p = v.producer
                if (p is None or id(p) not in members) and not is_scalar_const(v):
                    seen.setdefault(id(v), v)
    return list(seen.values())


def _unique(items: Iterable[Area]) -> list[Area]:
    seen: dict[int, Area] = {}
    for a in items:
        seen.setdefault(id(a), a)
    return list(seen.values())

