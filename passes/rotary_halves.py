"""Rotary embeddings on the two halves with half-width tables → the ``rotate_half`` form.

GPT-OSS writes its rotary on the halves of a head, each against a table of half the head's
width: ``cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)`` (``x1, x2 = x.chunk(2, -1)``), and
DeepSeek's interleaved rotary becomes the same form once ``rotary_pairs`` has turned its pairs
into halves. A vector kernel holds such a rotary only if each kernel input sits at one column
offset of the rows, but here the cos/sin tables are read against both halves (columns 0 and
h); the kernel is refused and the rotary runs op by op (ten launches or so). The same values
are ``x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin)``, the form LLaMA and GPT-NeoX write,
which the code generator takes as one kernel reading every table at column 0. Each element is
computed by the same operations in the same order (``a - b`` is ``a + (-b)`` exactly), so the
results are bit-identical. A constant table is widened here (the tables are folded constants
when the positions are); a computed one through a Concat of the table with itself.
"""

from __future__ import annotations

import numpy as np

from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import const_array
from graphkernel.registry import PassResult, counted


def _half(v: Value) -> tuple[Value, int] | None:
    """(x, 0 or 1) when ``v`` is the first or the second half of the static last axis of x:
    a step-1 StridedSlice of that axis, or an output of a Split of it in two equal parts."""
    p = v.producer
    if p is None:
        return None
    x = p.inputs[0] if p.inputs else None
    if x is None or not x.type.rank or not isinstance(x.shape[-1], int) or x.shape[-1] % 2:
        return None
    d, last = x.shape[-1], x.type.rank - 1
    if p.op == "StridedSlice":
        a = p.attrs
        if len(a["begin"]) != 1 or (a["strides"] or [1])[0] != 1:
            return None
        axis = (a["axes"][0] if a["axes"] is not None else 0) % x.type.rank
        start, stop, _ = slice(a["begin"][0], min(a["end"][0], d)).indices(d)
        if axis != last or stop - start != d // 2 or start not in (0, d // 2):
            return None
        return x, start // (d // 2)
    if p.op == "Split" and len(p.outputs) == 2 and p.attrs.get("axis", 0) % x.type.rank == last \
            and p.outputs[0].shape[-1] == p.outputs[1].shape[-1] == d // 2:
        return x, p.outputs.index(v)
    return None


def _product(v: Value) -> tuple[Value, Value] | None:
    """The two operands of a Mul making ``v`` alone (its only use), else None."""
    p = v.producer
    if p is None or p.op != "Mul" or len(v.uses) != 1:
        return None
    return p.inputs[0], p.inputs[1]


def _split(m: tuple[Value, Value], x: Value) -> tuple[int, Value] | None:
    """(which half of x, table) of a product of a half of x and a table, else None."""
    a, b = m
    for h, t in ((a, b), (b, a)):
        got = _half(h)
        if got is not None and got[0] is x:
            return got[1], t
    return None


def match(cat: Node) -> tuple[Value, Value, Value, Value, Value] | None:
    """(x, x1, x2, cos, sin) when ``cat`` is ``Concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)``
    along the last axis, x1 and x2 the halves of x, the tables of the halves' width (the
    products in either operand order, the sum in either order), each intermediate read only
    there, and the result of x's shape; else None. (A table may itself be a half of a wider
    one: x is the value whose halves every product reads.)"""
    out = cat.outputs[0]
    if cat.op != "Concat" or len(cat.inputs) != 2 or not out.type.rank or \
            cat.attrs["axis"] % out.type.rank != out.type.rank - 1:
        return None
    first, second = cat.inputs
    fp, sp = first.producer, second.producer
    if fp is None or sp is None or fp.op != "Sub" or sp.op != "Add" or \
            len(first.uses) != 1 or len(second.uses) != 1:
        return None
    prods = [_product(v) for v in (*fp.inputs, *sp.inputs)]
    if any(p is None for p in prods):
        return None
    sources = [{id(h[0]): h[0] for v in p if (h := _half(v)) is not None} for p in prods]
    shared = set(sources[0]).intersection(*sources[1:])
    if len(shared) != 1:
        return None
    x = sources[0][shared.pop()]
    picked = [_split(p, x) for p in prods]
    if any(p is None for p in picked):
        return None
    (h0, c0), (h1, s0), (h2, c1), (h3, s1) = picked
    if (h0, h1) != (0, 1) or {h2, h3} != {0, 1}:
        return None
    if h2 == 0:  # the sum written x1 * sin + x2 * cos
        (h2, c1), (h3, s1) = (h3, s1), (h2, c1)
    if c0 is not c1 or s0 is not s1 or c0 is s0:
        return None
    d = x.shape[-1]
    for t in (c0, s0):
        if not t.type.rank or t.shape[-1] != d // 2 or t.dtype != x.dtype:
            return None
    if tuple(out.shape) != tuple(x.shape):
        return None
    x1, x2 = (next(v for v in prods[k] if (h := _half(v)) is not None and h[0] is x)
              for k in (0, 1))
    return x, x1, x2, c0, s0


def _wide(graph: Graph, t: Value, at: Node) -> Value:
    """``cat(t, t)`` along the last axis: a constant when ``t`` is one."""
    arr = const_array(t)
    name = graph.fresh_name(f"{at.name}/halves_{t.name}")
    if arr is not None:
        return graph.add_node("Constant", [], {"value": np.concatenate([arr, arr], axis=-1)},
                              name=name, origin=at.origin).outputs[0]
    return graph.add_node("Concat", [t, t], {"axis": t.type.rank - 1}, name=name,
                          origin=at.origin).outputs[0]


def rewrite(graph: Graph, cat: Node, x: Value, x1: Value, x2: Value, cos: Value,
            sin: Value) -> Value:
    """Build ``x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin)`` in place of ``cat``."""
    last = x.type.rank - 1

    def add(op: str, ins: list[Value], attrs: dict | None = None) -> Value:
        return graph.add_node(op, ins, attrs or {}, name=graph.fresh_name(f"{cat.name}/{op}"),
                              origin=cat.origin).outputs[0]

    wc, ws = _wide(graph, cos, cat), _wide(graph, sin, cat)
    turned = add("Concat", [add("Neg", [x2]), x1], {"axis": last})
    out = add("Add", [add("Mul", [x, wc]), add("Mul", [turned, ws])])
    graph.replace_all_uses(cat.outputs[0], out)
    return out


def rotary_halves(graph, ctx) -> PassResult:
    """Rewrite cat(x1*cos - x2*sin, x2*cos + x1*sin) on the halves x1, x2 of x with
    half-width tables → x*cat(cos, cos) + cat(-x2, x1)*cat(sin, sin) (bit-identical), which
    the vector kernels take whole (each table read at one column offset)."""
    notes = []
    for cat in [n for n in graph.nodes if n.op == "Concat"]:
        got = match(cat)
        if got is None or not ctx.should_apply(f"rotary halves {cat.name}", [cat]):
            continue
        rewrite(graph, cat, *got)
        notes.append(f"{cat.name}: rotary of {got[0].shape[-1]} features on halves")
    return PassResult(bool(notes), len(notes), notes,
                      f"{counted(len(notes), 'rotary', 'rotaries')} as rotate-half")
