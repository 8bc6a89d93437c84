"""The codegen pass: schedule every GraphKernel for the target; unfuse what cannot be generated.

A kernel the generator cannot handle falls back: when cube ops (MatMul, Conv2D) head it,
they are split off and the vector epilogue is retried as its own kernel; otherwise the kernel
is unfused. Each fallback is reported (``fallbacks`` in the report) with the reason, or is a
CodegenError under ``disable_fallback``. The schedules are kept for rendering
(``ctx.analyses["codegen"]``).
"""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.codegen import targets
from graphkernel.codegen.ascendc import budget, c_dim, shape_refs
from graphkernel.codegen.lower import lower
from graphkernel.codegen.schedule import CUBE_OPS, Schedule, Unsupported, plan
from graphkernel.codegen.superkernel import form_groups
from graphkernel.errors import CodegenError
from graphkernel.ir import Graph, Node
from graphkernel.kernels import build_kernel, kernel_name, unfuse
from graphkernel.registry import PassResult, register_pass


def check(kernel: Node, spec: targets.TargetSpec) -> Schedule:
    """Plan and lower a kernel, and check what can be checked before run time."""
    s = plan(kernel)
    low = lower(s)
    refs = shape_refs(s)
    for d in (s.M, s.L, *(io.value.type.numel for io in (*s.inputs, *s.outputs))):
        c_dim(d, refs)
    if s.reduce and symbolic.is_static(s.L):
        align = 64 if s.masks else 16 if any(
            io.dtype.itemsize == 2 for io in (*s.inputs, *s.outputs)) else 8
        ctp = -(-int(s.L) // align) * align
        need = budget(s, low).bytes(1, ctp)
        if need > spec.ub_bytes:
            raise Unsupported(f"a row of {s.L} elements needs {need} bytes of UB, the target "
                              f"has {spec.ub_bytes} (reductions keep whole rows in UB)")
    return s


def _split_cube(graph: Graph, kernel: Node, ctx) -> Node | None:
    """Unfuse ``kernel``; when cube ops head it, rebuild the rest as a kernel and return it."""
    nodes = unfuse(graph, kernel)
    # the cube side: cube ops and what only feeds them (casts/views of their operands)
    cube: set[int] = set()
    for n in reversed(nodes):
        users = [u for v in n.outputs for u in v.users]
        if n.op in CUBE_OPS or (n.op != "Constant" and users
                                and all(id(u) in cube for u in users)):
            cube.add(id(n))
    rest = [n for n in nodes if id(n) not in cube and n.op != "Constant"]
    keep = {id(r) for r in rest}
    feeds_cube = any(v.producer is not None and id(v.producer) in keep
                     for n in nodes if id(n) in cube for v in n.inputs)
    if not cube or feeds_cube or not any(n.op not in ("Reshape", "ExpandDims", "Squeeze")
                                         for n in rest):
        return None
    counter = ctx.analyses["kernel_counter"] = ctx.analyses.get("kernel_counter", 0) + 1
    rest = [n for n in nodes if id(n) in keep]  # the kernel's (topological) order
    return build_kernel(graph, rest, kernel_name(rest, counter),
                        f"{kernel.attrs['pattern']}/epilogue")


def _super_kernels(graph, ctx, spec, scheds) -> None:
    """The SuperKernel groups over the kernels that were generated."""
    live = {n.name for n in graph.nodes if n.op == "GraphKernel"} & set(scheds)
    groups = []
    for g in form_groups(graph, ctx.analyses["super_kernel_scopes"], live):
        names = [k.name for k in g.members]
        if ctx.should_apply(f"{g.name}: one launch for {', '.join(names)}", g.members):
            g.name = f"superkernel_{len(groups) + 1}"
            groups.append(g)
    ctx.analyses["super_kernels"] = groups
    saved = sum(g.launches_saved for g in groups)
    ctx.report_extra["super_kernels"] = [
        {"name": g.name, "kernels": [k.name for k in g.members],
         "barriers_before": [k.name for k, b in zip(g.members, g.barriers, strict=True) if b],
         "launches_saved": g.launches_saved} for g in groups]
    ctx.report_extra["super_kernel_summary"] = {
        "launches_before": len(live), "launches_after": len(live) - saved,
        "modeled_us_saved": round(saved * spec.launch_overhead_us, 3)}
    if groups:
        ctx.log(f"{len(groups)} SuperKernels: {len(live)} -> {len(live) - saved} kernel "
                f"launches, {saved * spec.launch_overhead_us:.1f} us of modeled launch "
                "overhead saved")


@register_pass("codegen", stage="codegen", level=1, order=50)
def codegen(graph, ctx) -> PassResult:
    """Schedule, tile and check every GraphKernel; unfuse what cannot be generated (with
    the reason)."""
    spec = targets.load(ctx.flags.target)
    scheds: dict[str, Schedule] = ctx.analyses.setdefault("codegen", {})
    fallbacks: list[dict] = ctx.report_extra.setdefault("fallbacks", [])
    changed = 0
    for k in [n for n in graph.nodes if n.op == "GraphKernel"]:
        try:
            scheds[k.name] = check(k, spec)
            continue
        except Unsupported as e:
            reason = str(e)
        if ctx.flags.disable_fallback:
            raise CodegenError(f"kernel {k.name}: {reason} (disable_fallback is set)")
        members = [n.name for n in k.subgraph.nodes if n.op != "Constant"]
        if not ctx.should_apply(f"fallback {k.name}: {reason}", [k]):
            continue
        changed += 1
        rest = _split_cube(graph, k, ctx)
        action = "unfused"
        if rest is not None:
            try:
                scheds[rest.name] = check(rest, spec)
                action = f"cube ops split off; {rest.name} generated for the rest"
            except Unsupported as e2:
                unfuse(graph, rest)
                action = f"unfused (the rest: {e2})"
        fallbacks.append({"kernel": k.name, "nodes": members, "reason": reason,
                          "action": action})
        ctx.log(f"Fallback {k.name} ({reason}): not supported by codegen; {action}")
    if changed:
        graph.remove_dead()  # scalar constants the split kernels copied inside
    if "super_kernel_scopes" in ctx.analyses:
        _super_kernels(graph, ctx, spec, scheds)
    ctx.report_extra["codegen"] = {"kernels": len(scheds), "target": spec.name,
                                   "fallbacks": len(fallbacks)}
    return PassResult(changed > 0, changed,
                      [f"{len(scheds)} kernels scheduled, {len(fallbacks)} fallbacks"])
