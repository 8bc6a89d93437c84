"""Integer arithmetic whose values provably stay small runs in float32, where it is exact.

Position ids computed from a mask (RoBERTa and its relatives:
``cumsum(ne(ids, pad).int(), 1).type_as(mask) * mask + pad``) are int64 arithmetic, and int64
is no type of the vector unit: each op would be a launch of its own. Every integer of
magnitude up to 2**24 is a float32, and so are the sums, differences and products of such
integers while the results stay in that range: computed in float32 they are exact, and the
vector kernels (and the Scan a CumSum becomes) take them. This pass bounds every integer
value by interval arithmetic from what is known exactly — booleans are 0 or 1, constants
their extremes, a CumSum along a static axis of n elements at most n times its operand's —
and rewrites each connected region of bounded integer ops (casts, Add, Sub, Mul, Neg,
Maximum, Minimum, Select, CumSum, views, and comparisons of such values) that holds an int64
op into the same ops on float32, cast back where a value leaves it: to int32 when it only
indexes a Gather (its values fit), else to its own type. An index an ArgMax/ArgMin returns
along a static axis of n elements is within 0 .. n - 1: the arithmetic that wraps it
(``index < 0 ? index + n : index``, then its row's offset — CLIP's pooled token) runs in
float32 from it. A float32 value that is provably integral (a scatter of ones into zeros,
a Select of integral constants, a bounded integer cast to float) casts to an integer type
without truncating, so its cast joins a region too; a ReduceSum over static axes of n
elements is at most n times its operand (a mixture of experts' token counts,
``zeros.scatter(1, ids, 1).long().sum(0)``: summed in float32, the kernel storing them as
int64). Runs before ``scan``, which makes the float CumSum a Scan.

A ``Range`` over a symbolic length (``arange(L)`` under ``torch.compile(dynamic=True)``: T5's
relative positions, ``arange(L)[None, :] - arange(L)[:, None]`` and its buckets) is bounded
by what the graph's own tensors say of the symbol (``symbol_bounds``): a value the program
computes, of ``c * L**k`` elements with ``k >= 2``, holds at most ``MAX_NUMEL`` (2**40)
elements — a terabyte even at one byte each, beyond any device's memory — so
``L <= (2**40 / c) ** (1/k)`` (2**20 for an ``[L, L]`` value) on every input the program can
run on. Only values the program materialises count: not a BroadcastTo (torch's ``expand`` is
a view of its smaller operand) nor a view of another value, and not a shape another symbol
shares (that one might be 0). A Range read by the region alone is then made in float32.
"""

from __future__ import annotations

import numpy as np

from graphkernel import symbolic
from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.limits import MAX_NUMEL
from graphkernel.ops import VIEW_OPS
from graphkernel.passes.rewrite import connected_regions, const_array
from graphkernel.registry import PassResult, counted

EXACT = 2 ** 24  # every integer of at most this magnitude is a float32
ARITH = frozenset({"Add", "Sub", "Mul", "Neg", "Abs", "Maximum", "Minimum", "CumSum", "Cast",
                   "Select"})
COMPARE = frozenset({"Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual"})
POSITIONS = frozenset({"ArgMax", "ArgMin"})  # an index along a static axis: 0 .. n - 1
MOVES = frozenset({"BroadcastTo", "Transpose", "StridedSlice", "Slice"}) | VIEW_OPS
INDEX_OPS = frozenset({"Gather", "GatherElements"})  # (their operand 1 is the index)
INTS = frozenset({DType.int8, DType.int16, DType.int32, DType.int64, DType.uint8})
Range = tuple[int, int]


def _root(n: int, k: int) -> int:
    """The largest integer r with r**k <= n."""
    r = int(round(n ** (1 / k)))
    while r ** k > n:
        r -= 1
    while (r + 1) ** k <= n:
        r += 1
    return r


def symbol_bounds(graph: Graph) -> dict[str, int]:
    """symbol -> the largest value it can take on an input the program runs on: for each value
    the program materialises (an input, or the output of an op that is neither a view nor a
    BroadcastTo) whose shape holds one symbol ``s``, ``k >= 2`` times, with static factors of
    product ``c > 0``: ``c * s**k <= MAX_NUMEL``. (A symbol that appears once is bounded only
    by ``MAX_NUMEL / c``, too wide for float32; a second symbol might be 0.)"""
    bounds: dict[str, int] = {}
    values = list(graph.inputs) + [v for n in graph.nodes
                                   if n.op not in MOVES and n.op != "Constant"
                                   for v in n.outputs]
    for v in values:
        shape = v.type.shape
        if all(isinstance(d, int) for d in shape):
            continue
        coef, syms = 1, []
        for d in shape:
            c, ss = symbolic.parse_dim(d)
            coef *= c
            syms.extend(ss)
        if coef == 0 or len(set(syms)) != 1 or len(syms) < 2:
            continue
        b = _root(MAX_NUMEL // coef, len(syms))
        bounds[syms[0]] = min(b, bounds.get(syms[0], b))
    return bounds


def _dim_bound(d, symbols: dict[str, int]) -> int | None:
    """The largest value dim ``d`` can take (None: a symbol of it is unbounded)."""
    coef, syms = symbolic.parse_dim(d)
    for s in syms:
        if s not in symbols:
            return None
        coef *= symbols[s]
    return coef


def _interval(op: str, rs: list[Range]) -> Range:
    if op == "Select":  # (rs[0] is the condition's)
        return min(rs[1][0], rs[2][0]), max(rs[1][1], rs[2][1])
    if op == "Neg":
        return -rs[0][1], -rs[0][0]
    if op == "Abs":
        lo, hi = rs[0]
        return (lo, hi) if lo >= 0 else (-hi, -lo) if hi <= 0 else (0, max(-lo, hi))
    (a, b), (c, d) = rs
    if op == "Add":
        return a + c, b + d
    if op == "Sub":
        return a - d, b - c
    if op == "Maximum":
        return max(a, c), max(b, d)
    if op == "Minimum":
        return min(a, c), min(b, d)
    ps = (a * c, a * d, b * c, b * d)  # Mul
    return min(ps), max(ps)


def value_range(v: Value, known: dict[int, Range | None],
                symbols: dict[str, int] | None = None) -> Range | None:
    """Bounds of an integer or boolean value (see ``_bounds``; ``symbols``: the bounds
    ``symbol_bounds`` gives), None when they may pass its type's range (the integer op wraps
    around there)."""
    r = _bounds(v, known, symbols or {})
    if r is None or v.dtype == DType.bool:
        return r
    info = np.iinfo(v.dtype.np)
    return r if int(info.min) <= r[0] and r[1] <= int(info.max) else None


def _bounds(v: Value, known: dict[int, Range | None],
            symbols: dict[str, int]) -> Range | None:
    """Bounds of an integer or boolean value, from ranges already ``known`` of its producer's
    inputs; None when unbounded (a graph input, a float cast to int, an op not modelled, a
    Range over a length no materialised value bounds)."""
    if v.dtype == DType.bool:
        return 0, 1
    if v.dtype not in INTS:
        return None
    arr = const_array(v)
    if arr is not None:
        return (int(arr.min()), int(arr.max())) if arr.size else (0, 0)
    n = v.producer
    if n is None or len(n.outputs) != 1:
        return None
    if n.op == "Range":  # start + delta * i, i < length
        length = _dim_bound(n.attrs["length"], symbols)
        if length is None:
            return None
        start, delta = n.attrs.get("start", 0), n.attrs.get("delta", 1)
        if not all(isinstance(x, int) for x in (start, delta)):
            return None
        ends = (start, start + delta * max(length - 1, 0))
        return min(ends), max(ends)
    if n.op in POSITIONS:
        x = n.inputs[0]
        length = x.shape[n.attrs["axis"] % x.type.rank] if x.type.rank else 1
        return (0, length - 1) if isinstance(length, int) and length > 0 else None
    rs = [known.get(id(x)) if x.dtype != DType.bool else (0, 1) for x in n.inputs]
    if any(r is None for r in rs):
        return None
    if n.op in MOVES or n.op == "Concat":
        return min(r[0] for r in rs), max(r[1] for r in rs)
    if n.op == "Cast":  # (of a float: known only when integral, see _float_bounds)
        return rs[0]
    if n.op == "ReduceSum":  # n addends: every partial sum within n times the extremes, and 0
        count = _reduced_count(n)
        if count is None:
            return None
        lo, hi = rs[0]
        return min(0, count * lo), max(0, count * hi)
    if n.op == "CumSum":
        x = n.inputs[0]
        length = x.shape[n.attrs["axis"] % x.type.rank] if x.type.rank else 1
        if not isinstance(length, int):
            return None
        lo, hi = rs[0]
        lo, hi = min(lo, length * lo), max(hi, length * hi)
        return (min(lo, 0), max(hi, 0)) if n.attrs["exclusive"] else (lo, hi)
    if n.op in ARITH:
        return _interval(n.op, rs)
    return None


def _reduced_count(n: Node) -> int | None:
    """The number of elements a ReduceSum adds into each result (None: a symbolic axis)."""
    x = n.inputs[0]
    axes = n.attrs.get("axis")
    count = 1
    for a in (range(x.type.rank) if not axes else axes):
        d = x.shape[a % x.type.rank]
        if not isinstance(d, int):
            return None
        count *= d
    return count


def _float_bounds(v: Value, known: dict[int, Range | None]) -> Range | None:
    """Bounds of a float32 value every element of which is an integer within ±2**24 (its
    Cast to an integer type truncates nothing): an integral constant, a scatter of such
    values into such a value (a one-hot count's ``zeros.scatter(1, ids, 1)``), a Select of
    two, the max or min of one, a view of one, or a bounded integer cast to float32."""
    arr = const_array(v)
    if arr is not None:
        if not arr.size or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            return None
        r = int(arr.min()), int(arr.max())
        return r if -EXACT <= r[0] and r[1] <= EXACT else None
    n = v.producer
    if n is None or len(n.outputs) != 1:
        return None
    if n.op == "Cast" and n.inputs[0].dtype in INTS | {DType.bool}:
        r = known.get(id(n.inputs[0])) if n.inputs[0].dtype != DType.bool else (0, 1)
        return r if r is not None and -EXACT <= r[0] and r[1] <= EXACT else None
    if n.op == "ScatterElements" and n.attrs.get("reduction", "none") == "none":
        rs = [known.get(id(n.inputs[0])), known.get(id(n.inputs[2]))]
    elif n.op == "Select":
        rs = [known.get(id(x)) for x in n.inputs[1:]]
    elif n.op in ("ReduceMax", "ReduceMin") or n.op in MOVES:
        rs = [known.get(id(n.inputs[0]))]
    else:
        return None
    if any(r is None for r in rs):
        return None
    return min(r[0] for r in rs), max(r[1] for r in rs)


def _member(n: Node, known: dict[int, Range | None]) -> bool:
    """An integer op of bounded values that float32 computes exactly, or a comparison of
    such values (float32 compares them exactly)."""
    if n.op in COMPARE and len(n.outputs) == 1 and all(x.dtype in INTS for x in n.inputs):
        rs = [known.get(id(x)) for x in n.inputs]
        return all(r is not None and -EXACT <= r[0] and r[1] <= EXACT for r in rs)
    if len(n.outputs) != 1 or n.outputs[0].dtype not in INTS:
        return False
    if n.op not in ARITH and n.op not in MOVES and n.op not in ("Concat", "ReduceSum"):
        return False
    if n.op == "Cast" and n.inputs[0].dtype not in INTS | {DType.bool} and \
            known.get(id(n.inputs[0])) is None:  # (a float: an integral one only)
        return False
    r = known.get(id(n.outputs[0]))
    return r is not None and -EXACT <= r[0] and r[1] <= EXACT


def _narrow(graph: Graph, x: Value, inside: set[int]) -> Value:
    """An int64 ArgMax/ArgMin read by the region alone returns its index as int32 (the
    vector kernels load int32, not int64, and widen it to float32), an integer Range read by
    the region alone is made in float32 (its values are within ±2**24: exact); else ``x``
    itself."""
    p = x.producer
    if p is None or p.op not in POSITIONS | {"Range"} or graph.is_output(x) \
            or any(id(u) not in inside for u in x.users):
        return x
    if p.op == "Range":
        return graph.add_node("Range", [], dict(p.attrs) | {"dtype": DType.float32},
                              name=graph.fresh_name(f"{p.name}/f32"),
                              origin=p.origin).outputs[0]
    if x.dtype != DType.int64:
        return x
    return graph.add_node(p.op, list(p.inputs), dict(p.attrs) | {"dtype": DType.int32},
                          name=graph.fresh_name(f"{p.name}/int32"),
                          origin=p.origin).outputs[0]


def _rewrite(graph: Graph, region: list[Node]) -> None:
    inside = {id(n) for n in region}
    new: dict[int, Value] = {}

    def as_float(x: Value, at: Node) -> Value:
        if id(x) in new:
            return new[id(x)]
        arr = const_array(x)
        if arr is not None:
            return graph.add_node("Constant", [], {"value": arr.astype(np.float32)},
                                  name=graph.fresh_name(f"{at.name}/f32"),
                                  origin=at.origin).outputs[0]
        if x.dtype in INTS:  # a bounded integer from outside (an ArgMax's index, a Range)
            narrow = _narrow(graph, x, inside)
            new[id(x)] = narrow if narrow.dtype == DType.float32 else graph.add_node(
                "Cast", [narrow], {"dtype": DType.float32},
                name=graph.fresh_name(f"{x.name}/f32"), origin=at.origin).outputs[0]
            return new[id(x)]
        return x  # a boolean operand (of a Cast, or a Select's condition)

    for n in region:
        ins = [as_float(x, n) for x in n.inputs]
        name = graph.fresh_name(f"{n.name}/f32")
        if n.op == "Cast" and ins[0].dtype == DType.bool:  # (no bool -> float Cast in UB)
            one, zero = (graph.add_node("Constant", [], {"value": np.float32(c)},
                                        name=graph.fresh_name(f"{n.name}/{c}"),
                                        origin=n.origin).outputs[0] for c in (1, 0))
            out = graph.add_node("Select", [ins[0], one, zero], {}, name=name,
                                 origin=n.origin).outputs[0]
        elif n.op == "Cast":
            out = ins[0] if ins[0].dtype == DType.float32 else graph.add_node(
                "Cast", ins, {"dtype": DType.float32}, name=name, origin=n.origin).outputs[0]
        else:
            out = graph.add_node(n.op, ins, dict(n.attrs), name=name,
                                 origin=n.origin).outputs[0]
        new[id(n.outputs[0])] = out
    for n in region:
        old = n.outputs[0]
        outside = [(u, i) for u, i in old.uses if id(u) not in inside]
        if not outside and not graph.is_output(old):
            continue
        if new[id(old)].dtype == old.dtype:  # a comparison's booleans
            graph.replace_all_uses(old, new[id(old)])
            continue
        for u, _ in outside:  # a Cast to float32 of the integer: the region's value itself
            if u.op == "Cast" and u.outputs[0].dtype == DType.float32:
                graph.replace_all_uses(u.outputs[0], new[id(old)])
        outside = [(u, i) for u, i in old.uses if id(u) not in inside
                   and not (u.op == "Cast" and u.outputs[0].dtype == DType.float32)]
        if not outside and not graph.is_output(old):
            continue
        index_only = not graph.is_output(old) and all(
            u.op in INDEX_OPS and i == 1 for u, i in outside)
        dtype = DType.int32 if index_only else old.dtype
        back = graph.add_node("Cast", [new[id(old)]], {"dtype": dtype},
                              name=graph.fresh_name(f"{n.name}/{dtype.value}"),
                              origin=n.origin).outputs[0]
        if dtype == old.dtype:
            graph.replace_all_uses(old, back)
        else:
            for u, i in outside:
                graph.replace_input(u, i, back)


def _small_constant(v: Value) -> np.ndarray | None:
    """The values of integer constant ``v`` when every one is of magnitude below 2**24, else
    None."""
    arr = const_array(v)
    if arr is None or v.dtype not in INTS or not arr.size:
        return None
    return arr if -EXACT < int(arr.min()) and int(arr.max()) < EXACT else None


def _compared_with_constants(graph: Graph, ctx, known: dict[int, Range | None]
                             ) -> list[str]:
    """Rewrite a comparison of int64 values of unknown range (no region's) with an integer
    constant below 2**24 in magnitude (``ids == arange(E)``: a one-hot of expert ids that are
    a graph input) → the same comparison of the values converted to float32 (the vector
    unit's int64 -> float32 Cast, made on loading) with the constant as float32. Exact for
    every int64 ``x``: an integer below 2**24 in magnitude converts exactly, and one at or
    above it converts to a float at or above 2**24 in magnitude (the conversion rounds
    monotonically), never to a constant's value nor across it; so ``x == c``, ``x < c`` ...
    hold exactly when they do in float32."""
    notes = []
    for n in list(graph.nodes):
        if n.graph is None or n.op not in COMPARE or len(n.inputs) != 2:
            continue
        consts = [_small_constant(x) for x in n.inputs]
        if _member(n, known):
            continue  # (of bounded values: a region's)
        at = [i for i, x in enumerate(n.inputs) if x.dtype == DType.int64 and consts[i] is None]
        if len(at) != 1 or consts[1 - at[0]] is None or not ctx.should_apply(
                f"{n.name} of int64 values in float32", [n]):
            continue
        x, c = n.inputs[at[0]], consts[1 - at[0]]
        xf = graph.add_node("Cast", [x], {"dtype": DType.float32},
                            name=graph.fresh_name(f"{x.name}/f32"), origin=n.origin).outputs[0]
        cf = graph.add_node("Constant", [], {"value": c.astype(np.float32)},
                            name=graph.fresh_name(f"{n.name}/f32"), origin=n.origin).outputs[0]
        ins = [xf, cf] if at[0] == 0 else [cf, xf]
        out = graph.add_node(n.op, ins, dict(n.attrs), name=graph.fresh_name(f"{n.name}/f32"),
                             origin=n.origin).outputs[0]
        graph.replace_all_uses(n.outputs[0], out)
        graph.erase_node(n)
        notes.append(f"{n.name}: int64 {x.name} compared with constants below 2**24 in "
                     "float32")
    return notes


def _mask_of_positions(graph: Graph, region: list[Node]) -> bool:
    """Whether ``region`` reads a Range over a symbolic length and only booleans leave it: a
    mask built from positions (LLaMA's causal mask, Mistral's sliding window under
    ``dynamic=True``), which the attention pass takes as the operator's causal mode or band
    from its int64 positions; it stays as it is."""
    inside = {id(n) for n in region}
    reads_range = any(x.producer is not None and x.producer.op == "Range"
                      and not symbolic.is_static(x.producer.attrs["length"])
                      for n in region for x in n.inputs)
    leaving = [n.outputs[0] for n in region
               if graph.is_output(n.outputs[0])
               or any(id(u) not in inside for u in n.outputs[0].users)]
    return reads_range and all(v.dtype == DType.bool for v in leaving)


def small_ints(graph, ctx) -> PassResult:
    """Rewrite a region of integer ops whose values stay within ±2**24 (and which holds an
    int64 op) → the same ops on float32, cast back where its values are used; a comparison
    of int64 values of unknown range with small integer constants → float32 as well."""
    wide = ARITH - {"Cast"} | {"ReduceSum"}
    if not any(n.op in wide and len(n.outputs) == 1 and n.outputs[0].dtype == DType.int64
               or n.op in COMPARE and any(x.dtype == DType.int64 for x in n.inputs)
               for n in graph.nodes):  # (nothing to rewrite: no value ranges needed)
        return PassResult(False, 0, [], f"{counted(0, 'integer region')} in float32")
    known: dict[int, Range | None] = {}
    members = []
    symbols = symbol_bounds(graph) if any(n.op == "Range" for n in graph.nodes) else {}
    for n in graph.nodes:
        for v in n.outputs:
            if v.dtype in INTS or v.dtype == DType.bool:
                known[id(v)] = value_range(v, known, symbols)
            elif v.dtype == DType.float32:
                known[id(v)] = _float_bounds(v, known)
        if n.op != "Constant" and _member(n, known):
            members.append(n)
    # (a comparison of bounded values is a region's: only the others here)
    compared = _compared_with_constants(graph, ctx, known)
    notes = []
    for region in connected_regions(members):
        if not any(n.outputs[0].dtype == DType.int64 and n.op in wide for n in region):
            continue  # nothing the vector unit could not take already
        if _mask_of_positions(graph, region):
            continue  # (causal_mask reads it as the attention operator's causal mode or band)
        if not ctx.should_apply(f"float32 {region[0].name}..{region[-1].name}", region):
            continue
        _rewrite(graph, region)
        notes.append(f"{', '.join(n.name for n in region)}: within ±2**24, in float32")
    if compared:
        graph.toposort()
    return PassResult(bool(notes or compared), len(notes) + len(compared), notes + compared,
                      f"{counted(len(notes), 'integer region')} in float32"
                      + (f", {counted(len(compared), 'comparison')} of int64 values"
                         if compared else ""))
