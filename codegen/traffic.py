"""The GM-traffic model: bytes each kernel launch reads and writes, so fusion is a number.

A launch is a fused kernel or any op left outside a kernel that needs one (opaque
ops included). Constants and views (Reshape/ExpandDims/Squeeze of contiguous data)
are not launches and move no bytes. A launch reads each distinct input once and
writes each output once -- of an input it reads only through unit-step slices, the slices'
bytes (a strided load: ``sliced_bytes``) -- but for a vector kernel's second pass over its
rows (an input it loads again: ``second_pass_inputs``), a window kernel (per-channel values
once per plane: codegen/window.py) and a product group (the shared left operand once per
product, and a product's result read back by another once more: codegen/cube/group.py).
Symbolic dims count as ``SYMBOL_SIZE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from graphkernel import ops, symbolic
from graphkernel.codegen.cube.conv import conv_reads, is_conv_kernel
from graphkernel.codegen.cube.epilogue import reduces_along
from graphkernel.codegen.cube.group import is_group_kernel, parts
from graphkernel.codegen.cube.schedule import whole_rows_refusal
from graphkernel.codegen.extern import is_extern
from graphkernel.codegen.targets import Target
from graphkernel.codegen.window import is_window_kernel, is_window_op, window_reads
from graphkernel.fusion import SYMBOL_SIZE, nbytes
from graphkernel.ir import Graph, Node, Value
from graphkernel.ops import CUBE_OPS, RESHAPE_OPS, OpKind
from graphkernel.structure import region_signature

EPILOGUE = (OpKind.RESHAPE, OpKind.ELEMWISE, OpKind.BROADCAST)  # what a MIX kernel runs
# ops beside a product that are its addressing (transposes into isTrans or row pitches,
# broadcasts and slices of operands: codegen/cube/strided.py), no vector work
ADDRESSING = frozenset({"Transpose", "BroadcastTo", "Slice", "StridedSlice"})


def launch_kind(node: Node) -> str:
    """How a launch runs: ``cube`` (a matrix product alone), ``mix`` (a product with fused
    vector work), ``extern`` (a vendor operator called as it is: codegen/extern.py),
    ``opaque`` (an op run by another framework), else ``vector`` (a fused kernel or a
    vector op alone)."""
    if node.op == "GraphKernel":
        if is_window_kernel(node):  # a depthwise convolution too: a vector-unit stencil
            return "vector"
        body = [m.op for m in node.subgraph.nodes if m.op != "Constant" and m.op not in RESHAPE_OPS]
        if any(op in CUBE_OPS for op in body):  # (operand transposes fold into isTrans)
            return "mix" if any(op not in CUBE_OPS | ADDRESSING for op in body) else "cube"
        return "vector"
    if node.op in CUBE_OPS:
        return "cube"
    if is_extern(node):  # reads its operands once and writes its result once
        return "extern"
    return "opaque" if node.op == "Opaque" else "vector"


def _io_bytes(inputs: list[Value], outputs: list[Value]) -> tuple[int, int]:
    if len(inputs) == 1:
        read = nbytes(inputs[0])
    else:
        seen: set[int] = set()
        read = 0
        for v in inputs:
            if id(v) not in seen:
                seen.add(id(v))
                read += nbytes(v)
    if len(outputs) == 1:
        return read, nbytes(outputs[0])
    return read, sum(nbytes(v) for v in outputs)


def sliced_bytes(v: Value, readers: list[Node]) -> int | None:
    """GM bytes a kernel loads of ``v`` when ``readers`` (its ops reading ``v``) are all
    slices of it with unit steps: the slices' bytes (a slice of a kernel input is a strided
    load of the rows or columns it keeps: a fused QKV projection's V columns, a gate's half),
    at most the whole value; None when something reads ``v`` whole."""
    if not readers or not all(
            r.op == "StridedSlice" and r.inputs[0] is v and all(
                s == 1 for s in (r.attrs.get("strides") or [1])) for r in readers):
        return None
    return min(nbytes(v), sum(nbytes(r.outputs[0]) for r in readers))


def _kernel_reads(n: Node) -> int:
    """GM bytes launch ``n`` reads: each input once, or only its slices (``sliced_bytes``);
    an input a vector kernel's second pass loads again (``second_pass_inputs``) twice."""
    if n.op == "StridedSlice":
        got = sliced_bytes(n.inputs[0], [n])
        return nbytes(n.inputs[0]) if got is None else got
    body = n.subgraph
    again = second_pass_inputs(body)
    total = 0
    for outer, inner in zip(n.inputs, body.inputs, strict=True):
        got = sliced_bytes(inner, list(dict.fromkeys(inner.users)))
        total += (nbytes(outer) if got is None else got) * (2 if id(inner) in again else 1)
    return total


def second_pass_inputs(body: Graph) -> set[int]:
    """id() of the inputs of a fused body that a vector kernel over the rows loads twice:
    the body reduces a run of leading or middle axes and computes full-size work from the
    result (a value of the reduction's input size; codegen/vector/schedule.py's second
    pass), which reads the input, and so does the work before the reduction. Empty for any
    other body."""
    col = [m for m in body.nodes if ops.exists(m.op) and ops.get(m.op).kind == OpKind.REDUCE
           and m.op not in ("Scan", "ElemAny") and isinstance(m.attrs.get("axis"), list)
           and m.attrs["axis"] and _column_axes(m)]
    if not col:
        return set()
    full = {symbolic.canon(m.inputs[0].type.numel) for m in col}
    after: set[int] = {id(m.outputs[0]) for m in col}
    second: list[Node] = []
    for m in body.nodes:
        if m in col or not any(id(v) in after for v in m.inputs):
            continue
        for v in m.outputs:
            after.add(id(v))
        if m.op not in RESHAPE_OPS and symbolic.canon(m.outputs[0].type.numel) in full:
            second.append(m)
    if not second:
        return set()
    inside = {id(v) for v in body.inputs}
    in_second = {id(v) for m in second for v in _through_views(m.inputs) if id(v) in inside}
    first = {id(v) for m in body.nodes if m not in second and id(m.outputs[0]) not in after
             for v in _through_views(m.inputs) if id(v) in inside}
    return in_second & first


def _column_axes(m: Node) -> bool:
    """Whether reduction ``m`` reduces one run of axes before the last."""
    from graphkernel.opdefs.reduce import reduce_axes

    rank = m.inputs[0].type.rank
    axes = reduce_axes(rank, m.attrs["axis"])
    return bool(axes) and axes[-1] != rank - 1 and axes == list(range(axes[0], axes[-1] + 1))


def _through_views(vals) -> list[Value]:
    """The values, each followed back through views to what they view."""
    out = []
    for v in vals:
        while v.producer is not None and v.producer.op in RESHAPE_OPS:
            v = v.producer.inputs[0]
        out.append(v)
    return out


def group_reads(kernel: Node) -> int:
    """GM bytes a product group reads: each product its own inputs, the shared left operand
    once per product (the products' Matmul objects do not share L1: codegen/cube/group.py)."""
    body = kernel.subgraph
    index = {id(v): i for i, v in enumerate(body.inputs)}
    outs = {id(v): j for j, v in enumerate(body.outputs)}
    total = 0
    for nodes in parts(kernel):
        ids = {id(n) for n in nodes}
        read = {("in", index[id(v)]) if id(v) in index else ("out", outs[id(v)])
                for n in nodes for v in n.inputs
                if id(v) in index or (id(v) in outs and id(v.producer) not in ids)}
        total += sum(nbytes(kernel.inputs[i] if w == "in" else kernel.outputs[i])
                     for w, i in read)
    return total


def launch_io(graph: Graph) -> Iterator[tuple[Node, int, int]]:
    """(node, bytes read, bytes written) of every kernel launch of ``graph`` as it stands. A
    window kernel reads its per-channel values once per plane (``window.window_reads``); a
    convolution kernel its input rows per unit and its panel (``cube.conv.conv_reads``)."""
    for n in graph.nodes:
        if n.op == "Constant" or n.op in RESHAPE_OPS:
            continue
        r, w = _io_bytes(n.inputs, n.outputs)
        reads = window_reads(n) if n.op == "GraphKernel" and is_window_kernel(n) else None
        conv = conv_reads(n) if n.op == "GraphKernel" and is_conv_kernel(n) else None
        if reads:  # (each input of a kernel is a distinct value)
            r = sum(reads.values())
        elif conv is not None:  # the im2col panel: written to a workspace and read back
            r, w = conv
        elif n.op == "GraphKernel" and is_group_kernel(n):
            r = group_reads(n)
        elif n.op in ("GraphKernel", "StridedSlice"):
            r = _kernel_reads(n)
        yield n, r, w


def launches(graph: Graph) -> list[dict[str, Any]]:
    """One entry per kernel launch of ``graph`` as it stands."""
    out = []
    for n, r, w in launch_io(graph):
        entry = {"name": n.name, "op": n.op, "kind": launch_kind(n), "bytes_read": r,
                 "bytes_written": w,
                 "ops": len(n.subgraph.nodes) if n.op == "GraphKernel" else 1}
        if n.op == "GraphKernel":
            entry["pattern"] = n.attrs["pattern"]
            entry["op_list"] = [m.op for m in n.subgraph.nodes if m.op != "Constant"]
            entry["origin"] = list(n.origin)
        out.append(entry)
    return out


def ideal(graph: Graph, fusable: set[int], products: frozenset[int] | set[int] = frozenset(),
          spec: Target | None = None, regions: list[list[Node]] | None = None,
          detail: list[tuple[list[Node], int]] | None = None) -> tuple[int, int]:
    """(bytes, launches) with every candidate region of fusable nodes as one kernel, ignoring
    every size limit and pattern rule: the lower bound fusion can reach. Each ideal launch
    reads and writes as a fused one does (``launch_io``'s rules: an input read only through
    unit-step slices, the slices' bytes), so the two are counted alike for every model.

    Regions are the cluster pass's convex regions: a group whose members are connected only
    through a path that leaves it (DenseNet's concats, joined across convolutions) could
    never be one kernel, so it is not one region. A matrix product among ``products`` whose
    every user is in one region that does not also feed it joins that region (a product and
    its epilogue are one MIX kernel) when the region is what a MIX epilogue runs: elementwise
    work, or also reductions along the product's last axis N when the region writes rows of
    the product only (a reduction broadcast back: LayerNorm, RMSNorm, softmax) and a base
    tile holds whole rows of N (N static; on the ``spec`` target, as the generator's own
    epilogue, buffer plan and tiler find: the one size limit kept, since beyond it the
    generator cannot fuse at all). Any other reduction is no epilogue.

    A pool or depthwise convolution (a window kernel's op) joins the region of its users in
    the same way when that region is elementwise work (a window kernel's epilogue), its
    input read once (as the generated kernel reads it).

    ``regions``: ``form_regions(graph, fusable)`` when the caller has it (its lists grow).
    ``detail``: when given, receives (members, bytes) of each ideal launch, so a report can
    set each fused kernel's bytes against the ideal launch its nodes belong to."""
    from graphkernel.fusion import form_regions

    outputs = {id(v) for v in graph.outputs}
    total, count = 0, 0
    nodes = graph.nodes
    if regions is None:
        regions = form_regions(graph, fusable)
    where = {id(n): k for k, members in enumerate(regions) for n in members}
    joined: set[int] = set()
    verdicts: dict[tuple, bool] = {}  # the tiler's verdict per structure (repeated layers)
    for n in nodes:
        if id(n) not in products:
            continue
        homes = {where.get(id(u)) for v in n.outputs for u, _ in v.uses}
        feeders = {where.get(id(v.producer)) for v in n.inputs if v.producer is not None}
        if len(homes) == 1 and None not in homes and not homes & feeders and \
                _epilogue_of(n, regions[next(iter(homes))], outputs, spec, verdicts):
            regions[homes.pop()].append(n)
            joined.add(id(n))
    for n in nodes:  # a pool or depthwise convolution and the elementwise work on its result
        if not is_window_op(n) or id(n) in fusable or id(n) in products:
            continue
        homes = {where.get(id(u)) for v in n.outputs for u, _ in v.uses}
        feeders = {where.get(id(v.producer)) for v in n.inputs if v.producer is not None}
        if len(homes) == 1 and None not in homes and not homes & feeders:
            home = next(iter(homes))
            if all(ops.get(m.op).kind in EPILOGUE for m in regions[home]):
                regions[home].append(n)
                joined.add(id(n))
    for members in regions:
        if all(n.op in RESHAPE_OPS for n in members):
            continue
        ids = {id(n) for n in members}
        ins = [v for n in members for v in n.inputs
               if (p := v.producer) is None or id(p) not in ids and not (
                   p.op == "Constant" and p.attrs["value"].size == 1)]
        outs = [v for n in members for v in n.outputs
                if id(v) in outputs or any(id(u) not in ids for u, _ in v.uses)]
        r, w = _io_bytes(ins, outs)
        for v in {id(v): v for v in ins}.values():  # inputs only sliced: the slices' bytes
            got = sliced_bytes(v, [u for u in dict.fromkeys(v.users) if id(u) in ids])
            r -= 0 if got is None else nbytes(v) - got
        total += r + w
        count += 1
        if detail is not None:
            detail.append((members, r + w))
    for n in nodes:
        if id(n) in fusable or id(n) in joined or n.op == "Constant" or n.op in RESHAPE_OPS:
            continue
        r, w = _io_bytes(n.inputs, n.outputs)
        if n.op == "StridedSlice":
            r = _kernel_reads(n)
        total += r + w
        count += 1
        if detail is not None:
            detail.append(([n], r + w))
    return total, count


def _epilogue_of(product: Node, members: list[Node], outputs: set[int],
                 spec: Target | None, verdicts: dict[tuple, bool]) -> bool:
    """Whether a MIX kernel runs region ``members`` as the epilogue of ``product``.
    ``verdicts`` keeps the tiler's answer per region structure (``region_signature``: all
    the epilogue, its buffer plan and the tiling read), so equal layers ask it once."""
    if all(ops.get(m.op).kind in EPILOGUE for m in members):
        return True
    out = product.outputs[0]
    last, whole = out.type.shape[-1], symbolic.canon(out.type.numel)
    ids = {id(m) for m in members} | {id(product)}
    if not all(ops.get(m.op).kind in EPILOGUE or reduces_along(m, last) for m in members):
        return False
    leaving = [v for m in members for v in m.outputs
               if id(v) in outputs or any(id(u) not in ids for u, _ in v.uses)]
    if not symbolic.is_static(last) or any(symbolic.canon(v.type.numel) != whole
                                           for v in leaving):
        return False
    # the generator's own epilogue, buffer plan and tiler: can a base tile hold the rows?
    if spec is None:
        return True
    key = region_signature([product, *members], outputs)
    if key not in verdicts:
        verdicts[key] = whole_rows_refusal(product, [product, *members], leaving, spec) is None
    return verdicts[key]


def summary(graph: Graph) -> tuple[int, int, list[dict[str, Any]]]:
    ks = launches(graph)
    return sum(k["bytes_read"] + k["bytes_written"] for k in ks), len(ks), ks


NOTE = (f"GM-traffic model: each launch reads its inputs once (a window kernel: its "
        f"per-channel values once per plane; an input read only through unit-step slices: "
        f"the slices) and writes its outputs "
        f"once; constants and reshape views are free; symbolic dims count as {SYMBOL_SIZE}")
