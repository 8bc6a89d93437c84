"""A cost model of kernel launches on a target: a *model*, not a measurement.

Per launch: max(GM bytes / HBM bandwidth, vector work / vector throughput) + the launch
overhead. Vector work counts 256-byte repeats over every op's output (fp16/bf16 are computed
in fp32 inside kernels), spread over all AIV cores. Matmul and convolution work on the cube
unit is not modeled: those launches cost their GM traffic and the launch overhead.

A generated kernel's scalar UB accesses (GetValue/SetValue) and pipe syncs (event pairs,
PipeBarrier<PIPE_ALL>) are counted by the simulator; ``pipe_us`` turns those counts into the
time they hold the core's pipes (added to a launch: a sync drains the pipes it orders, so it
does not overlap the work it separates).
"""

from __future__ import annotations

import math
from typing import Any

from graphkernel.codegen.targets import Target
from graphkernel.codegen.traffic import VIEWS
from graphkernel.fusion import numel
from graphkernel.ir import Graph, Node

CUBE_OPS = frozenset({"MatMul", "BatchMatMul", "Conv2D"})


def _repeats(node: Node, spec: Target) -> int:
    if node.op in ("Constant", *VIEWS) or node.op in CUBE_OPS or node.op == "Opaque":
        return 0
    out = node.outputs[0]
    itemsize = 4 if out.dtype.is_float else out.dtype.itemsize
    return math.ceil(numel(out) * itemsize / spec.repeat_bytes)


def launch_us(node: Node, spec: Target, gm_bytes: int) -> float:
    """Modeled time of one launch in microseconds."""
    members = [m for m in node.subgraph.nodes] if node.op == "GraphKernel" else [node]
    repeats = sum(_repeats(m, spec) for m in members)
    vector_s = repeats / (spec.repeats_per_cycle * spec.aiv_cores * spec.clock_ghz * 1e9)
    memory_s = gm_bytes / (spec.hbm_gbps * 1e9)
    return max(vector_s, memory_s) * 1e6 + spec.launch_overhead_us


def pipe_us(scalar: int, syncs: int, blocks: int, spec: Target) -> float:
    """Modeled microseconds of a launch's scalar UB accesses and pipe syncs (counted over all
    its cores by the simulator), spread over the ``blocks`` cores that ran them."""
    cycles = scalar * spec.scalar_cycles + syncs * spec.sync_cycles
    return cycles / (max(blocks, 1) * spec.clock_ghz * 1e9) * 1e6


def model(graph: Graph, spec: Target, launches: list[dict[str, Any]]) -> float:
    """Total modeled microseconds of ``launches`` (from graphkernel.codegen.traffic.launches), each
    entry gaining its own ``modeled_us``."""
    by_name = {n.name: n for n in graph.nodes}
    total = 0.0
    for entry in launches:
        us = launch_us(by_name[entry["name"]], spec,
                       entry["bytes_read"] + entry["bytes_written"])
        entry["modeled_us"] = round(us, 3)
        total += us
    return total
