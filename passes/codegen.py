"""The codegen pass: schedule every GraphKernel for the target; unfuse what cannot be generated.

The pass orchestrates; what the generator accepts and how a refused kernel is split are the
code generator's (``codegen/legalize.py``). A kernel the generator cannot handle falls back:
it is split around the node it stumbled on and the parts are retried (cube ops split off,
the vector epilogue retried as its own kernel), or it is unfused. Each fallback is reported
(``fallbacks`` in the report) with the reason, or is a CodegenError under
``disable_fallback``; every rewrite asks the bisect counter first. The schedules are kept for
rendering (``ctx.analyses.codegen``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from graphkernel.codegen import legalize
from graphkernel.codegen.accumulate import widen_reductions
from graphkernel.codegen.refusal import NeedsPhases, SplitBefore, Unsupported
from graphkernel.codegen.superkernel import form_groups
from graphkernel.codegen.vector.phases import split_phases, split_whole_reduction
from graphkernel.codegen.vector.schedule import Schedule
from graphkernel.errors import CodegenError
from graphkernel.ir import Graph, Node
from graphkernel.kernels import build_kernel, next_kernel_name
from graphkernel.ops import PRODUCT_OPS
from graphkernel.registry import PassResult, counted
from graphkernel.structure import body_signature


def _wrap_matmuls(graph: Graph, ctx) -> int:
    """Each MatMul/BatchMatMul left outside the kernels becomes a cube kernel
    (``legalize.cube_group``)."""
    wrapped = 0
    for n in list(graph.nodes):
        if n.op not in PRODUCT_OPS or not ctx.should_apply(f"{n.name}: a cube kernel", [n]):
            continue
        group = legalize.cube_group(n)
        build_kernel(graph, group, next_kernel_name(ctx.analyses, group, "cube"), "cube")
        wrapped += 1
    return wrapped


def _two_stages(graph: Graph, k: Node, s: Schedule, ctx) -> list[Node]:
    """A kernel reducing everything to one value on one core, with work for every core: split
    into per-core partial reductions and their combination (codegen/vector/phases.py)."""
    parts = legalize.two_stage_parts(s, ctx.target)
    if parts is None or not ctx.should_apply(f"{k.name}: two stages over {parts} cores", [k]):
        return []
    return _report_split(ctx, k, split_whole_reduction(graph, k, parts, _namer(ctx, k)),
                         f"one value from {s.L} elements: {parts} partial reductions, then "
                         "theirs")


def _in_phases(graph: Graph, k: Node, ctx, reason: str) -> list[Node]:
    """Replace ``k`` by its phase kernels (codegen/vector/phases.py)."""
    if not ctx.should_apply(f"{k.name}: in phases", [k]):
        return []
    return _report_split(ctx, k, split_phases(graph, k, _namer(ctx, k)), reason)


def _report_split(ctx, k: Node, parts: list[Node], reason: str) -> list[Node]:
    """Record the kernels that replace ``k`` under ``phases`` (and in the log)."""
    if parts:
        names = [p.name for p in parts]
        ctx.report.phases.append({"kernel": k.name, "kernels": names, "reason": reason})
        ctx.log(f"{k.name} runs as {len(parts)} kernels ({reason}): {', '.join(names)}")
    return parts


def _namer(ctx, kernel: Node):
    """Names for the kernels that replace ``kernel``: its pattern, their first op, the
    compile's running counter."""
    return lambda group: next_kernel_name(ctx.analyses, group, kernel.attrs["pattern"])


def _super_kernels(graph, ctx, spec, scheds) -> None:
    """The SuperKernel groups over the kernels that were generated."""
    live = {n.name for n in graph.nodes if n.op == "GraphKernel"} & {
        k for k, s in scheds.items() if isinstance(s, Schedule)}  # vector kernels only
    groups = []
    for g in form_groups(graph, ctx.analyses.super_kernel_scopes, live):
        names = [k.name for k in g.members]
        if ctx.should_apply(f"{g.name}: one launch for {', '.join(names)}", g.members):
            g.name = f"superkernel_{len(groups) + 1}"
            groups.append(g)
    ctx.analyses.super_kernels = groups
    saved = sum(g.launches_saved for g in groups)
    ctx.report.super_kernels = [
        {"name": g.name, "kernels": [k.name for k in g.members],
         "barriers_before": [k.name for k, b in zip(g.members, g.barriers, strict=True) if b],
         "launches_saved": g.launches_saved} for g in groups]
    ctx.report.super_kernel_summary = {
        "launches_before": len(live), "launches_after": len(live) - saved,
        "modeled_us_saved": round(saved * spec.launch_overhead_us, 3)}
    if groups:
        ctx.log(f"{len(groups)} SuperKernels: {len(live)} -> {len(live) - saved} kernel "
                f"launches, {saved * spec.launch_overhead_us:.1f} us of modeled launch "
                "overhead saved")


def _shared(scheds: dict[str, Schedule], signature: dict[str, tuple], live: set[str], ctx
            ) -> dict[str, str]:
    """Kernels whose code is another's (equal bodies): kernel -> the first scheduled kernel
    of its body, kept as ``ctx.analyses.codegen_shared``; rendering and the simulator
    generate each body once. SuperKernel members keep their own code (a SuperKernel source
    includes its members' sources)."""
    grouped = {k.name for g in ctx.analyses.super_kernels for k in g.members}
    first: dict[tuple, str] = {}
    shared = {}
    for name in scheds:  # in scheduling order: the first of each body owns the code
        if name in live and name not in grouped:
            owner = first.setdefault(signature[name], name)
            if owner != name:
                shared[name] = owner
    ctx.analyses.codegen_shared = shared
    return shared


def codegen(graph, ctx) -> PassResult:
    """Widen fp16/bf16 sums and products to fp32 accumulation; schedule, tile and check
    every GraphKernel; unfuse what cannot be generated (with the reason)."""
    spec = ctx.target
    ctx.analyses.invalidate("codegen", "codegen_shared", "super_kernels")  # recomputed here
    scheds: dict[str, Schedule] = ctx.analyses.codegen
    if ctx.report.fallbacks is None:
        ctx.report.fallbacks = []
    fallbacks = ctx.report.fallbacks
    changed = 0
    wrapped = _wrap_matmuls(graph, ctx)
    work = deque(n for n in graph.nodes if n.op == "GraphKernel")
    widened = 0
    for k in work:  # sums and products accumulate in fp32 (codegen/accumulate.py)
        body = widen_reductions(k)
        if body is not None:
            k.attrs["subgraph"] = body
            widened += 1
    depth = {id(k): 0 for k in work}  # how often the kernel's nodes were split before
    if ctx.report.phases is None:
        ctx.report.phases = []
    phased = ctx.report.phases
    checker = legalize.Checker(spec)  # each distinct body checked once
    signature: dict[str, tuple] = {}  # scheduled kernel -> its body's signature
    with ctx.task("kernels", len(work)) as shown:
        while work:
            k = work.popleft()
            shown.advance(k.name)
            parts: list[Node] = []
            try:
                key = body_signature(k.subgraph)
                s = checker.check(k, key)
                splittable = depth[id(k)] < legalize.MAX_SPLIT_DEPTH
                parts = _two_stages(graph, k, s, ctx) if splittable else []
                if not parts:
                    scheds[k.name] = s
                    signature[k.name] = key
                    continue
            except NeedsPhases as e:
                reason, bad = str(e), e.node
                splittable = depth[id(k)] < legalize.MAX_SPLIT_DEPTH
                parts = _in_phases(graph, k, ctx, reason) if splittable else []
                before = False
            except Unsupported as e:
                reason, bad = str(e), e.node
                before = isinstance(e, SplitBefore)
                again = legalize.rebind_slices(graph, k, _namer(ctx, k))
                if again is not None:  # its parts loaded one by one: checked again first
                    depth[id(again)] = depth[id(k)]
                    work.appendleft(again)
                    shown.add_total(1)
                    changed += 1
                    ctx.log(f"{k.name} ({reason}): inputs read through slices bound once "
                            f"per slice; retried as {again.name}")
                    continue
            if parts:  # k was replaced by kernels of its own parts: schedule them next
                changed += 1
                for p in parts:
                    depth[id(p)] = depth[id(k)] + 1
                work.extendleft(reversed(parts))
                shown.add_total(len(parts))
                continue
            if ctx.flags.disable_fallback:
                raise CodegenError(f"kernel {k.name}: {reason} (disable_fallback is set)")
            body = list(k.subgraph.nodes)
            members = [n.name for n in body if n.op != "Constant"]
            if not ctx.should_apply(f"fallback {k.name}: {reason}", [k]):
                continue
            changed += 1
            index = next((i for i, n in enumerate(body) if n is bad), None)
            around = index if depth[id(k)] < legalize.MAX_SPLIT_DEPTH else None
            if legalize.is_group_kernel(k):  # a product group: its products' own kernels
                parts = legalize.ungroup(graph, k, _namer(ctx, k))
                bad = None
            else:
                parts = legalize.split_around(graph, k, around, _namer(ctx, k),
                                              ctx.flags.enable_single_node_fusion, before)
            for p in parts:
                depth[id(p)] = depth[id(k)] + 1
            work.extendleft(reversed(parts))
            shown.add_total(len(parts))
            action = (f"split around {bad.op}; retried as {', '.join(p.name for p in parts)}"
                      if parts and bad is not None else
                      f"retried as its products' kernels {', '.join(p.name for p in parts)}"
                      if parts else "unfused")
            fallbacks.append({"kernel": k.name, "nodes": members, "reason": reason,
                              "action": action})
            ctx.log(f"Fallback {k.name} ({reason}): not supported by codegen; {action}")
    for entry in phased:  # why these kernels read their inputs more than once
        for j, name in enumerate(entry["kernels"]):
            if name in scheds:  # (a schedule is a value: a new one with the note)
                s = scheds[name]
                scheds[name] = replace(s, notes=[
                    *s.notes, f"phase {j + 1} of {len(entry['kernels'])} of {entry['kernel']}: "
                    "its inputs are re-read once per phase (a multi-phase reduction)"])
    if changed:
        graph.remove_dead()  # scalar constants the split kernels copied inside
    if ctx.analyses.super_kernel_scopes is not None:
        _super_kernels(graph, ctx, spec, scheds)
    live = {n.name for n in graph.nodes if n.op == "GraphKernel"}
    shared = _shared(scheds, signature, live, ctx)
    ctx.report.codegen = {
        "kernels": len(live & set(scheds)), "target": spec.name, "fallbacks": len(fallbacks),
        "distinct_kernels": len(live & set(scheds)) - len(shared),
        # each generated kernel's kind: vector (AIV only), cube (the Matmul API alone), mix
        "kinds": {k: getattr(s, "kernel_kind", "vector") for k, s in scheds.items()
                  if k in live},
        # why a kernel's GM traffic may exceed inputs-once + outputs-once, per kernel
        "traffic_notes": {k: s.notes for k, s in scheds.items() if k in live and s.notes}}
    summary = [f"{counted(len(scheds), 'kernel')} scheduled"]
    summary += [counted(len(fallbacks), "fallback")] if fallbacks else []
    summary += [f"{len(phased)} run in phases or stages"] if phased else []
    summary += [f"{counted(widened, 'kernel')} accumulating fp16/bf16 in fp32"] if widened \
        else []
    summary += [f"{counted(wrapped, 'matrix product')} as cube kernels"] if wrapped else []
    return PassResult(changed > 0 or widened > 0 or wrapped > 0, changed + widened + wrapped,
                      summary=", ".join(summary))
