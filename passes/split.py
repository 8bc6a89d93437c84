"""The split model: run the fusion patterns over each region and build GraphKernel nodes."""

from __future__ import annotations

from graphkernel import pipeline, traffic
from graphkernel.codegen import cost
from graphkernel.codegen.targets import load as load_target
from graphkernel.flags import Config
from graphkernel.fusion import MATMUL_OPS, Area, Attempt, SplitModel, cluster_ops, fusable_reason
from graphkernel.kernels import build_kernel, next_kernel_name
from graphkernel.patterns.base import Pattern, all_patterns
from graphkernel.registry import PassResult, counted, register_pass
from graphkernel.traffic import VIEWS


def selected(name: str, selectors: list[str]) -> str | None:
    """The selector (exact name, or ``prefix*``) that matches ``name``."""
    for s in selectors:
        if s == name or (s.endswith("*") and name.startswith(s[:-1])):
            return s
    return None


def enabled_patterns(cfg: Config) -> tuple[list[Pattern], dict[str, str]]:
    """The patterns that run, in order, and why each other one does not."""
    on, off = [], {}
    for p in all_patterns():
        if cfg.enable_fusion_pattern_only:
            if selected(p.name, cfg.enable_fusion_pattern_only) is None:
                off[p.name] = "pattern disabled by flag: not in --enable_fusion_pattern_only"
                continue
        else:
            if (s := selected(p.name, cfg.disable_fusion_pattern)) is not None:
                off[p.name] = f"pattern disabled by flag --disable_fusion_pattern={s}"
                continue
            if cfg.opt_level < p.level and selected(p.name, cfg.enable_fusion_pattern) is None:
                off[p.name] = f"pattern level {p.level} > opt_level {cfg.opt_level}"
                continue
        on.append(p)
    return on, off


def run_pattern(model: SplitModel, p: Pattern) -> None:
    """Apply ``p`` around every area; an area that grew is tried again at once, and its
    neighbours in a later round, until nothing changes."""
    pending = model.areas()
    while pending:
        grown: list[Area] = []
        for a in pending:
            if model.area(a.nodes[0]) is not a:
                continue  # merged away in this round
            cur, fused = a, False
            while (res := p.fn(model, cur)) is not None:
                cur, fused = res, True
            if fused:
                grown.append(cur)
        again: dict[int, Area] = {}
        for a in grown:
            if model.area(a.nodes[0]) is not a:
                continue
            for n in [a, *model.producer_areas(a), *model.consumers(a)[0]]:
                again.setdefault(id(n), n)
        pending = sorted(again.values(), key=lambda x: model.index[id(x.nodes[0])])


def becomes_kernel(area: Area, cfg: Config) -> bool:
    if all(n.op in VIEWS for n in area.nodes):
        return False  # reshape views need no launch
    if area.ops >= 2:
        return True
    n = area.nodes[0]
    return cfg.enable_single_node_fusion and n.op not in MATMUL_OPS


@register_pass("split", stage="split", level=1, order=10)
def split(graph, ctx) -> PassResult:
    """Rewrite each group of fused nodes -> one GraphKernel node, by the split model: the
    patterns run one at a time in a fixed order over each region's areas."""
    info = ctx.analyses.get("cluster")
    if info is None:
        return PassResult(False, 0, ["no candidate regions: the cluster pass did not run"])
    cfg = ctx.flags
    attempts: list[Attempt] = ctx.analyses.setdefault("fusion_attempts", [])
    if cfg.composite_op_limit_size == 0:
        return PassResult(False, 0, ["fusion off: composite_op_limit_size=0"])
    patterns, off = enabled_patterns(cfg)
    for name, why in off.items():
        attempts.append(Attempt(name, [], [], 0, "rejected", why))
    built = 0
    for region in info.regions:
        region = [n for n in region if n.graph is graph]
        if not region:
            continue
        model = SplitModel(graph, region, cfg, ctx, attempts)
        for p in patterns:
            run_pattern(model, p)
        for area in model.areas():
            if becomes_kernel(area, cfg):
                label = "+".join(dict.fromkeys(area.patterns)) or "single_node"
                build_kernel(graph, area.nodes,
                             next_kernel_name(ctx.analyses, area.nodes, label), label)
                built += 1
    fused = sum(1 for a in attempts if a.verdict == "fused")
    refused = counted(len(attempts) - fused, "candidate")
    return PassResult(built > 0, fused, [f"{counted(built, 'kernel')} from "
                                         f"{counted(fused, 'fusion')} ({refused} refused)"])


def _finish(graph, ctx) -> None:
    """Final GM-traffic figures and, with dump_as_text, the cluster report."""
    total, count, kernels = traffic.summary(graph)
    extra = ctx.report_extra
    spec = load_target(ctx.flags.target)
    fused_us = cost.model(graph, spec, kernels)
    if "gm_bytes_unfused" not in extra:  # no fusion ran: the graph is its own baseline
        allowed = cluster_ops(ctx.flags)
        vector = {id(n) for n in graph.nodes if fusable_reason(n, allowed, ctx.flags) is None
                  and n.op not in MATMUL_OPS}
        ideal_bytes, ideal_count = traffic.ideal(graph, vector)
        extra.update(gm_bytes_unfused=total, kernels_unfused=count, gm_bytes_ideal=ideal_bytes,
                     kernels_ideal=ideal_count, modeled_us_unfused=round(fused_us, 3))
    extra.update(gm_bytes_fused=total, kernels_fused=count, traffic_model=traffic.NOTE,
                 kernels=[k for k in kernels if k["op"] == "GraphKernel"],
                 modeled_us_fused=round(fused_us, 3), target=spec.name,
                 cost_model=cost.__doc__.strip().splitlines()[0])
    attempts = ctx.analyses.get("fusion_attempts", [])
    extra["fusion_decisions"] = {"fused": sum(a.verdict == "fused" for a in attempts),
                                 "refused": sum(a.verdict != "fused" for a in attempts)}
    if ctx.dumper is not None:
        lines = []
        for n in graph.nodes:
            if n.op == "GraphKernel":
                members = [f"{m.name} ({m.op})" for m in n.subgraph.nodes if m.op != "Constant"]
                origin = ", ".join(n.origin)
                lines.append(f"{n.name}  pattern={n.attrs['pattern']}  origin=[{origin}]")
                lines += [f"    {m}" for m in members]
        ctx.dumper.write_text("graph_kernel_cluster.txt", "\n".join(lines) or "(no kernels)")


pipeline.FINISH_HOOKS.append(_finish)
