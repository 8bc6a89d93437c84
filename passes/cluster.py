"""Mark fusable nodes and form convex candidate regions for the split model."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.codegen import cost, traffic
from graphkernel.fusion import cluster_ops, reason_checker, regions_of
from graphkernel.ir import Node
from graphkernel.ops import PRODUCT_OPS
from graphkernel.registry import PassResult, counted


@dataclass
class ClusterInfo:
    """The candidate regions, for the split pass (which empties ``regions`` once it has
    consumed them: their nodes, replaced by kernels, are not kept alive by the compile
    result; ``region_sizes`` stays), and why nodes are not fusable, for explain."""

    regions: list[list[Node]]
    reasons: dict[str, str] = field(default_factory=dict)  # node name -> why not fusable
    fusable: set[int] = field(default_factory=set)
    region_sizes: list[int] = field(default_factory=list)  # nodes per region, in order


def cluster(graph, ctx) -> PassResult:
    """Mark nodes the cluster-op lists, skip lists and dtypes allow, and group them into
    convex regions (no path between two nodes of a region leaves it); never rewrites."""
    why_not = reason_checker(cluster_ops(ctx.flags), ctx.flags)
    reasons: dict[str, str] = {}
    fusable: set[int] = set()
    for n in graph.nodes:
        why = why_not(n)
        if why is None:
            fusable.add(id(n))
        elif n.op != "Constant":
            reasons[n.name] = why
    # the ideal's regions (matrix products apart: they join as epilogues) in the same sweep
    products = {id(n) for n in graph.nodes if id(n) in fusable and n.op in PRODUCT_OPS}
    vector = fusable - products
    regions, vector_regions = regions_of(graph, [fusable, vector])
    ctx.analyses.cluster = ClusterInfo(regions, reasons, fusable, [len(r) for r in regions])
    spec = ctx.target
    total, count, us = cost.totals(graph, spec)
    ideal_bytes, ideal_count = traffic.ideal(graph, vector, products, spec, vector_regions)
    r = ctx.report
    r.gm_bytes_unfused, r.kernels_unfused = total, count
    r.gm_bytes_ideal, r.kernels_ideal = ideal_bytes, ideal_count
    r.modeled_us_unfused = round(us, 3)
    return PassResult(False, 0, [f"{counted(len(fusable), 'fusable node')} in "
                                 f"{counted(len(regions), 'region')}; "
                                 f"{counted(len(reasons), 'node')} not fusable"])
