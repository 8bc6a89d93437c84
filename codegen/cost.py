"""A cost model of kernel launches on a target: a *model*, not a measurement.

Per launch: max(GM bytes / HBM bandwidth, vector work / vector throughput, cube work / cube
throughput) + the launch overhead. Vector work counts 256-byte repeats over every op's output
(fp16/bf16 are computed in fp32 inside kernels), spread over all AIV cores. Cube work counts
a MatMul/BatchMatMul's 2·M·N·K flops per batch element at the target's ``cube_tflops`` (an
estimate for fp16/bf16 over all AIC; fp32 operands at half the rate); in a MIX launch the
cube and the vector work overlap, so the slower of the two counts. An extern fused attention
counts its two products as cube work and its softmax (five passes over the fp32 scores) as
vector work, overlapped likewise. Convolutions are not
modeled on the cube unit: they cost their GM traffic and the launch overhead.

A generated kernel's scalar UB accesses (GetValue/SetValue) and pipe syncs (event pairs,
PipeBarrier<PIPE_ALL>) are counted by the simulator; ``pipe_us`` turns those counts into the
time they hold the core's pipes (added to a launch: a sync drains the pipes it orders, so it
does not overlap the work it separates).
"""

from __future__ import annotations

import math
from typing import Any

from graphkernel.codegen import extern
from graphkernel.codegen.targets import Target
from graphkernel.codegen.traffic import _io_bytes
from graphkernel.fusion import ITEMSIZE, SYMBOL_SIZE, numel
from graphkernel.ir import Graph, Node
from graphkernel.ops import CUBE_OPS, PRODUCT_OPS, RESHAPE_OPS

NO_VECTOR_WORK = frozenset({"Constant", "Opaque"})  # besides views and cube ops


def _repeats(node: Node, spec: Target) -> int:
    if extern.is_extern(node):
        return extern.vector_repeats(node, spec.repeat_bytes)
    if node.op in NO_VECTOR_WORK or node.op in RESHAPE_OPS or node.op in CUBE_OPS or \
            node.op == "Transpose" and _feeds_a_product(node):
        return 0
    out = node.outputs[0]
    dtype = out.type.dtype
    itemsize = 4 if dtype.is_float else ITEMSIZE[dtype]
    return math.ceil(numel(out) * itemsize / spec.repeat_bytes)


def _feeds_a_product(node: Node) -> bool:
    """A Transpose read only by a MatMul/BatchMatMul: folded into its isTrans, no work."""
    users = [u for v in node.outputs for u in v.users]
    return bool(users) and all(u.op in ("MatMul", "BatchMatMul") for u in users)


def cube_flops(node: Node) -> float:
    """fp16-equivalent cube flops of a MatMul/BatchMatMul (fp32 operands count twice: the
    cube runs them at half rate); an extern attention's two products; 0 for any other op.
    Symbolic dims count as SYMBOL_SIZE."""
    if extern.is_extern(node):
        return extern.cube_flops(node)
    if node.op not in PRODUCT_OPS:
        return 0.0
    a = node.inputs[0].type
    k = a.shape[-2] if node.attrs.get("transpose_a") else a.shape[-1]
    k = k if isinstance(k, int) else SYMBOL_SIZE
    rate = 2 if a.dtype.itemsize >= 4 else 1
    return 2.0 * numel(node.outputs[0]) * k * rate


def launch_us(node: Node, spec: Target, gm_bytes: int) -> float:
    """Modeled time of one launch in microseconds."""
    repeats, flops = 0, 0.0
    for m in (node.subgraph.nodes if node.op == "GraphKernel" else (node,)):
        repeats += _repeats(m, spec)
        if m.op in PRODUCT_OPS or m.op in extern.OPERATORS:  # (no other op has cube work)
            flops += cube_flops(m)
    vector_s = repeats / (spec.repeats_per_cycle * spec.aiv_cores * spec.clock_ghz * 1e9)
    memory_s = gm_bytes / (spec.hbm_gbps * 1e9)
    cube_s = flops / (spec.cube_tflops * 1e12)
    return max(vector_s, memory_s, cube_s) * 1e6 + spec.launch_overhead_us


def pipe_us(scalar: int, syncs: int, blocks: int, spec: Target) -> float:
    """Modeled microseconds of a launch's scalar UB accesses and pipe syncs (counted over all
    its cores by the simulator), spread over the ``blocks`` cores that ran them."""
    cycles = scalar * spec.scalar_cycles + syncs * spec.sync_cycles
    return cycles / (max(blocks, 1) * spec.clock_ghz * 1e9) * 1e6


def model(graph: Graph, spec: Target, launches: list[dict[str, Any]]) -> float:
    """Total modeled microseconds of ``launches`` (from graphkernel.codegen.traffic.launches), each
    entry gaining its own ``modeled_us``."""
    total = 0.0
    for entry in launches:
        us = launch_us(graph.node(entry["name"]), spec,
                       entry["bytes_read"] + entry["bytes_written"])
        entry["modeled_us"] = round(us, 3)
        total += us
    return total


def totals(graph: Graph, spec: Target) -> tuple[int, int, float]:
    """(GM bytes, launches, modeled microseconds) of ``graph`` as it stands: the totals of
    ``traffic.summary`` and ``model``, without an entry per launch. A launch of a single op
    is costed once per ``launch_key`` (a model's repeated layers launch the same few)."""
    nbytes, count, us = 0, 0, 0.0
    known: dict[tuple, tuple[int, float]] = {}
    for node in graph.nodes:
        op = node.op
        if op == "Constant" or op in RESHAPE_OPS:
            continue
        key = launch_key(node)
        cost = known.get(key) if key is not None else None
        if cost is None:
            read, written = _io_bytes(node.inputs, node.outputs)
            cost = (read + written, launch_us(node, spec, read + written))
            if key is not None:
                known[key] = cost
        nbytes += cost[0]
        count += 1
        us += cost[1]
    return nbytes, count, us


def launch_key(node: Node) -> tuple | None:
    """What the bytes and the modeled time of a launch of ``node`` alone depend on: its op,
    its inputs' and outputs' shapes and dtypes, a product's ``transpose_a``. None for a
    node whose cost reads more (a kernel's body, a Transpose's users, an extern operator's
    attributes) or that reads one value twice."""
    op = node.op
    if op == "GraphKernel" or op == "Transpose" or extern.is_extern(node):
        return None
    ins = node.inputs
    if len(ins) > 1 and len({id(v) for v in ins}) < len(ins):
        return None
    return (op, tuple([(v.type.shape, v.type.dtype._value_) for v in ins]),
            tuple([(v.type.shape, v.type.dtype._value_) for v in node.outputs]),
            node.attrs.get("transpose_a") if op in PRODUCT_OPS else None)


def by_kind(launches: list[dict[str, Any]]) -> dict[str, float]:
    """Modeled microseconds per kernel kind (vector, cube, mix, extern, opaque) of ``launches`` that
    went through ``model``."""
    out: dict[str, float] = {}
    for entry in launches:
        out[entry["kind"]] = round(out.get(entry["kind"], 0.0) + entry["modeled_us"], 3)
    return out
