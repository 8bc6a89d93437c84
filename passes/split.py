"""The split model: run the fusion patterns over each region and build GraphKernel nodes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from graphkernel.codegen import cost, extern, traffic
from graphkernel.flags import Config
from graphkernel.fusion import (
    Area,
    LiveProfile,
    SplitModel,
    cluster_ops,
    guard_free,
    guard_signature,
    peak_refusal,
    reason_checker,
)
from graphkernel.kernels import build_kernel, next_kernel_name
from graphkernel.ops import PRODUCT_OPS, RESHAPE_OPS
from graphkernel.patterns.base import Pattern, all_patterns
from graphkernel.registry import PassResult, counted
from graphkernel.runlog import Attempt, AttemptLog, Template, spelled
from graphkernel.structure import region_signature


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
    if all(n.op in RESHAPE_OPS for n in area.nodes):
        return False  # reshape views need no launch
    if area.ops >= 2:
        return True
    n = area.nodes[0]
    return cfg.enable_single_node_fusion and n.op not in PRODUCT_OPS


@dataclass
class Decisions:
    """What the split model did on a region, by position in the region: the rewrites it asked
    for, the attempts it recorded and the kernels it formed. Area names in the strings are
    tokens that ``names`` turns into the names of any region of the same signature."""

    applies: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    attempts: list[tuple[str, list[str], tuple[int, ...], int, str, str]] = field(
        default_factory=list)
    kernels: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    complete: bool = True  # every rewrite was allowed (a refused one may not be replayed)
    # the peak-memory guard's verdicts (areas by position, reason or None): they depend on
    # where a region lies, and hold for another region only if they come out the same there
    guards: list[tuple[tuple[tuple[int, ...], ...], str | None]] = field(default_factory=list)
    guard_key: tuple | None = None  # what the guard read about the region (guard_signature)


_TOKEN = re.compile("\x00(\\d+)\x00")


def _token(index: dict[int, int]):
    """Name a region's node by its position (a token no user name contains)."""
    return lambda n: f"\x00{index[id(n)]}\x00"


def _text(s: str) -> str:
    """A string with tokens as a Template (made once, filled in for every region)."""
    if "\x00" not in s:
        return s
    parts = _TOKEN.split(s)
    return Template("".join(f"{{{x}}}" if i % 2 else x.replace("{", "{{").replace("}", "}}")
                            for i, x in enumerate(parts)))


class _Recorder:
    """The pass context as the split model sees it: each rewrite it asks for is recorded
    (with tokens) and asked of the real context with the region's names."""

    def __init__(self, ctx, names: list[str], index: dict[int, int], dec: Decisions) -> None:
        self.ctx, self.names, self.index, self.dec = ctx, names, index, dec

    def should_apply(self, description: str, nodes=()) -> bool:
        nodes = list(nodes)
        text = _text(description)
        self.dec.applies.append((text, tuple(self.index[id(n)] for n in nodes)))
        ok = self.ctx.should_apply(spelled(text, self.names), nodes)
        self.dec.complete &= ok
        return ok


def decide(graph, region: list, cfg: Config, ctx, patterns: list[Pattern],
           tokens: bool, order: list | None = None,
           position: dict[int, int] | None = None,
           profile: LiveProfile | None = None) -> Decisions:
    """Run the split model on ``region``; its rewrites are asked of ``ctx`` as they happen.
    With ``tokens``, area names are tokens (replayable on another region). ``order`` and
    ``position``: the graph's topological order before the pass, for the cycle check;
    ``profile``: the live bytes along it, for the peak-memory guard."""
    index = {id(n): i for i, n in enumerate(region)}
    names = [n.name for n in region]
    by_name = {n: i for i, n in enumerate(names)}
    dec = Decisions()
    attempts: list[Attempt] = []
    model = SplitModel(graph, region, cfg, _Recorder(ctx, names, index, dec), attempts,
                       label=_token(index) if tokens else None, order=order,
                       position=position, profile=profile)
    for p in patterns:
        run_pattern(model, p)
    dec.guards = model.guards
    if profile is not None:
        dec.guard_key = guard_signature(region, profile, position)
    dec.attempts = [(a.pattern, [_text(x) for x in a.areas], tuple(by_name[n] for n in a.nodes),
                     a.score, a.verdict, _text(a.reason)) for a in attempts]
    dec.kernels = [(tuple(index[id(n)] for n in area.nodes),
                    "+".join(dict.fromkeys(area.patterns)) or "single_node")
                   for area in model.areas() if becomes_kernel(area, cfg)]
    return dec


def guards_hold(dec: Decisions, region: list, profile: LiveProfile | None,
                position: dict[int, int], outputs: set[int], cfg: Config) -> bool:
    """Whether the peak-memory guard gives ``region`` the verdicts it gave the region ``dec``
    was decided on (the same fusions asked, by position)."""
    if profile is None or dec.guard_key == guard_signature(region, profile, position):
        return True  # the guard reads the same figures here: the same verdicts
    if guard_free(region, profile, position, cfg.peak_memory_growth):  # nothing refused here
        return all(reason is None for _, reason in dec.guards)
    return all(peak_refusal([[region[i] for i in g] for g in groups], profile, position,
                            outputs, cfg.peak_memory_growth)[0] == reason
               for groups, reason in dec.guards)


def replay(dec: Decisions, region: list, ctx, attempts: AttemptLog, ask: bool) -> None:
    """Record ``dec``'s attempts for ``region`` (and, with ``ask``, ask its rewrites)."""
    names = [n.name for n in region]
    if ask:
        ctx.replay_rewrites(dec.applies, region)
    attempts.replay(dec.attempts, names)


def replayable(cfg: Config, patterns: list[Pattern]) -> bool:
    """Decisions are reused when every rewrite is allowed anyway (no bisect limit) and every
    pattern is graphkernel's own (a plugin's may read anything, names included)."""
    return cfg.bisect_limit < 0 and all(
        p.fn.__module__.startswith("graphkernel.patterns.") for p in patterns)


def split(graph, ctx) -> PassResult:
    """Rewrite each group of fused nodes -> one GraphKernel node, by the split model: the
    patterns run one at a time in a fixed order over each region's areas. Regions of equal
    structure (repeated layers) are decided once; the others replay the decisions."""
    info = ctx.analyses.cluster
    if info is None:
        return PassResult(False, 0, ["no candidate regions: the cluster pass did not run"])
    cfg = ctx.flags
    ctx.analyses.invalidate("fusion_attempts")  # this run's candidates only
    attempts: AttemptLog = ctx.analyses.fusion_attempts
    if cfg.composite_op_limit_size == 0:
        return PassResult(False, 0, ["fusion off: composite_op_limit_size=0"])
    patterns, off = enabled_patterns(cfg)
    for name, why in off.items():
        attempts.append(Attempt(name, [], [], 0, "rejected", why))
    memo: dict[tuple, Decisions] | None = {} if replayable(cfg, patterns) else None
    built = 0
    order = graph.nodes  # once: every region's cycle check sweeps its span of this order
    position = {id(n): i for i, n in enumerate(order)}
    regions, info.regions = info.regions, []  # consumed: see ClusterInfo
    # which of a region's values are graph outputs: building the kernels of other regions
    # replaces their own values only
    outputs = {id(v) for v in graph.outputs}
    # live bytes along the order before any kernel is built (the peak-memory guard's figures)
    profile = LiveProfile(order, position, outputs) if cfg.peak_memory_growth >= 0 and \
        regions else None
    for r, region in enumerate(regions):
        regions[r] = []
        region = [n for n in region if n.graph is graph]
        if not region:
            continue
        key = region_signature(region, outputs) \
            if memo is not None else None
        dec = memo.get(key) if memo is not None else None
        if dec is not None and not guards_hold(dec, region, profile, position, outputs, cfg):
            dec = None  # here the peak-memory guard decides otherwise: decide afresh
            key = None
        if dec is None:  # decide (asking each rewrite as it happens)
            dec = decide(graph, region, cfg, ctx, patterns, tokens=memo is not None,
                         order=order, position=position, profile=profile)
            if memo is not None and key is not None and dec.complete:
                memo[key] = dec
            replay(dec, region, ctx, attempts, ask=False)
        else:
            replay(dec, region, ctx, attempts, ask=True)
        for idx, label in dec.kernels:
            nodes = [region[i] for i in idx]
            build_kernel(graph, nodes, next_kernel_name(ctx.analyses, nodes, label), label)
            built += 1
            for n in nodes:  # gone: the sweeps of later regions skip their place
                order[position[id(n)]] = None
        # free the replaced nodes now rather than after the pass (their bodies' copies are
        # as large): nothing of this pass keys a table by their ids any more (``position``
        # is read for the nodes of regions, all alive)
        graph.release_erased()
    fused = attempts.fused
    refused = counted(len(attempts) - fused, "candidate")
    return PassResult(built > 0, fused, [f"{counted(built, 'kernel')} from "
                                         f"{counted(fused, 'fusion')} ({refused} refused)"])


def traffic_summary(graph, ctx) -> None:
    """Final GM-traffic figures and, with dump_as_text, the cluster report."""
    total, count, kernels = traffic.summary(graph)
    r = ctx.report
    spec = ctx.target
    fused_us = cost.model(graph, spec, kernels)
    if r.gm_bytes_unfused is None:  # no fusion ran: the graph is its own baseline
        why_not = reason_checker(cluster_ops(ctx.flags), ctx.flags)
        ok = {id(n) for n in graph.nodes if why_not(n) is None}
        vector = {id(n) for n in graph.nodes if id(n) in ok and n.op not in PRODUCT_OPS}
        r.gm_bytes_ideal, r.kernels_ideal = traffic.ideal(graph, vector, ok - vector, spec)
        r.gm_bytes_unfused, r.kernels_unfused = total, count
        r.modeled_us_unfused = round(fused_us, 3)
    r.gm_bytes_fused, r.kernels_fused, r.traffic_model = total, count, traffic.NOTE
    r.kernels = [k for k in kernels if k["op"] == "GraphKernel"]
    # vendor operators called as they are: the call a device build makes
    r.externs = [k | extern.call(graph.node(k["name"])) for k in kernels
                 if k["kind"] == "extern"]
    r.modeled_us_fused, r.modeled_us_by_kind = round(fused_us, 3), cost.by_kind(kernels)
    r.target, r.cost_model = spec.name, cost.__doc__.strip().splitlines()[0]
    attempts = ctx.analyses.fusion_attempts
    r.fusion_decisions = {"fused": attempts.fused, "refused": len(attempts) - attempts.fused}
    if ctx.dumper is not None:
        lines = []
        for n in graph.nodes:
            if n.op == "GraphKernel":
                members = [f"{m.name} ({m.op})" for m in n.subgraph.nodes if m.op != "Constant"]
                origin = ", ".join(n.origin)
                lines.append(f"{n.name}  pattern={n.attrs['pattern']}  origin=[{origin}]")
                lines += [f"    {m}" for m in members]
        ctx.dumper.write_text("graph_kernel_cluster.txt", "\n".join(lines) or "(no kernels)")

