"""The codegen pass: schedule every GraphKernel for the target; unfuse what cannot be generated.

A kernel the generator cannot handle falls back: when cube ops (MatMul, Conv2D) head it,
they are split off and the vector epilogue is retried as its own kernel; otherwise the kernel
is unfused. Each fallback is reported (``fallbacks`` in the report) with the reason, or is a
CodegenError under ``disable_fallback``. The schedules are kept for rendering
(``ctx.analyses.codegen``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import networkx as nx

from graphkernel.codegen import targets
from graphkernel.codegen.accumulate import widen_reductions
from graphkernel.codegen.cube.schedule import (
    MatmulSchedule,
    is_matmul_kernel,
    plan_matmul,
    swaps_last_two,
)
from graphkernel.codegen.instance import rebind, rebind_matmul
from graphkernel.codegen.refusal import NeedsPhases, Unsupported
from graphkernel.codegen.superkernel import form_groups
from graphkernel.codegen.vector import resident
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.phases import split_phases, split_whole_reduction
from graphkernel.codegen.vector.render import c_dim, shape_refs
from graphkernel.codegen.vector.schedule import Schedule, plan
from graphkernel.codegen.vector.tiling import row_bytes
from graphkernel.errors import CodegenError
from graphkernel.ir import Graph, Node
from graphkernel.kernels import build_kernel, next_kernel_name, unfuse
from graphkernel.ops import CUBE_OPS, PRODUCT_OPS, RESHAPE_OPS
from graphkernel.registry import PassResult, counted
from graphkernel.structure import body_signature


def check(kernel: Node, spec: targets.Target) -> Schedule | MatmulSchedule:
    """Plan and lower a kernel, and check what can be checked before run time. A kernel
    holding a matrix product is planned as a cube kernel (codegen/cube/schedule.py)."""
    if is_matmul_kernel(kernel):
        s = plan_matmul(kernel, spec)
        refs = shape_refs(s)
        epi = s.epilogue
        for d in (s.M, s.N, s.K, *s.batch, *s.a_strides, *s.b_strides,
                  *(io.value.type.numel for io in s.inputs),
                  *(epi.batch if epi else ()), *(st for i in (epi.inputs if epi else ())
                                                  for st in i.strides)):
            c_dim(d, refs)
        return s
    s = plan(kernel, target=spec)
    low = lower(s)
    refs = shape_refs(s)
    for d in (s.M, s.L, s.batch, *(io.value.type.numel for io in (*s.inputs, *s.outputs))):
        c_dim(d, refs)
    need = row_bytes(s, low) if s.reduce else None
    if s.reduce and need is None:  # a symbolic row: the run-time shape picks the variant
        try:
            v = plan(kernel, row_chunks=True, target=spec)
            lower(v)
        except Unsupported:
            return s  # whole rows only; the tiling function reports a row too long for the UB
        v.name = f"{s.name}_rc"
        s.variant = v
        return s
    if need is not None and need > spec.ub_bytes:
        try:  # the variant that walks each row in chunks
            s = plan(kernel, row_chunks=True, target=spec)
            lower(s)
            return s
        except Unsupported as e:
            cls = NeedsPhases if isinstance(e, NeedsPhases) else Unsupported
            raise cls(f"a row of {s.L} elements needs {need} bytes of UB, the target has "
                      f"{spec.ub_bytes}, and it cannot be walked in chunks: {e}", node=e.node
                      ) from None
    resident.choose(s, low)  # tables broadcast over the leading axes: loaded once per core
    return s


@dataclass(frozen=True)
class _Refused:
    """A body the generator refused, for its equal bodies: the error's class and message and
    the position of the node it stumbled on in the body."""

    error: type[Unsupported]
    message: str
    at: int | None


def check_once(kernel: Node, spec: targets.Target, key: tuple,
               done: dict[tuple, Schedule | _Refused]) -> Schedule:
    """``check``, planning each distinct body once: a kernel whose body has the signature
    ``key`` of one checked before gets that schedule carried over to it, or that refusal
    (``done``: signature -> schedule or refusal). A refusal whose reason names a node or
    value is not carried over (the next kernel is checked itself, to name its own)."""
    first = done.get(key)
    if isinstance(first, _Refused):
        bad = None if first.at is None else kernel.subgraph.nodes[first.at]
        raise first.error(first.message, node=bad)
    if isinstance(first, Schedule) and (s := rebind(first, kernel)) is not None:
        return s
    if isinstance(first, MatmulSchedule) and (s := rebind_matmul(first, kernel)) is not None:
        return s
    try:
        s = check(kernel, spec)
    except Unsupported as e:
        refused = _refusal(kernel, e) if key not in done else None
        if refused is not None:
            done[key] = refused
        raise
    done.setdefault(key, s)
    return s


def _refusal(kernel: Node, e: Unsupported) -> _Refused | None:
    """``e`` as a refusal of ``kernel``'s body, or None when it names something of it."""
    body = kernel.subgraph.nodes
    msg = str(e)
    names = [kernel.name, *(n.name for n in body), *(v.name for v in kernel.subgraph.inputs),
             *(v.name for n in body for v in n.outputs)]
    if any(name in msg for name in names):
        return None
    at = next((i for i, n in enumerate(body) if n is e.node), None)
    if e.node is not None and at is None:
        return None
    return _Refused(type(e), msg, at)


def _split_around(graph: Graph, kernel: Node, bad: int | None, ctx) -> list[Node]:
    """Unfuse ``kernel``, then rebuild as kernels the connected groups of its nodes left when
    the op it could not generate (``bad``: its index among the kernel's nodes) is taken out;
    cube ops go out with what only feeds them. Returns the new kernels."""
    nodes = unfuse(graph, kernel)
    if bad is None:
        return []
    out: set[int] = set()
    cube = nodes[bad].op in CUBE_OPS
    product = nodes[bad].op in PRODUCT_OPS  # retried as cube kernels, feeders as vector ones
    for n in reversed(nodes):
        users = [u for v in n.outputs for u in v.users]
        only_feeds = n.op != "Constant" and users and all(id(u) in out for u in users)
        if n is nodes[bad] or (cube and n.op in CUBE_OPS) or (
                cube and only_feeds and (not product or n.op == "Transpose"
                                         and swaps_last_two(n))):
            out.add(id(n))
    dag = nx.DiGraph()  # the kernel's nodes and edges
    dag.add_nodes_from(id(n) for n in nodes)
    dag.add_edges_from((id(v.producer), id(n)) for n in nodes for v in n.inputs
                       if v.producer is not None and id(v.producer) in dag)
    around = [(nx.ancestors(dag, i), nx.descendants(dag, i)) for i in out]
    keep = [id(n) for n in nodes if id(n) not in out and n.op != "Constant"]
    by_id = {id(n): n for n in nodes}
    order = {id(n): k for k, n in enumerate(nodes)}
    groups = [[by_id[i] for i in sorted(c, key=order.__getitem__)]  # in the kernel's order
              for c in nx.weakly_connected_components(dag.subgraph(keep))]
    built = []
    if product and len(out) < len([n for n in nodes if n.op != "Constant"]):
        # each matrix product, with the transposes folded into it, is retried as a cube
        # kernel; what else fed it is a vector kernel of its own (above)
        for c in _cube_groups(dag, out, by_id, order):
            built.append(build_kernel(graph, c, _namer(ctx, kernel)(c), "cube"))
    for group in groups:
        ids = {id(n) for n in group}
        convex = not any(ids & up and ids & down for up, down in around)
        computing = [n for n in group if n.op not in RESHAPE_OPS]
        lone_ok = cube or ctx.flags.enable_single_node_fusion  # a cube op's epilogue stays one
        if not convex or not computing or (len(computing) < 2 and not lone_ok):
            continue
        built.append(build_kernel(graph, group, _namer(ctx, kernel)(group),
                                  f"{kernel.attrs['pattern']}/split"))
    return built


def _cube_groups(dag: nx.DiGraph, out: set[int], by_id: dict, order: dict
                 ) -> list[list[Node]]:
    """The matrix products among ``out`` (nodes split off a kernel), each with the nodes of
    ``out`` (its operands' last-two-axes transposes) that feed it and no other product: the
    cube kernels to retry."""
    mms = [i for i in out if by_id[i].op in PRODUCT_OPS]
    reach = {i: {j for j in nx.descendants(dag, i) if by_id[j].op in PRODUCT_OPS}
             for i in out if i not in mms}
    groups = []
    for m in sorted(mms, key=order.__getitem__):
        ids = {m} | {i for i, r in reach.items() if r == {m} and by_id[i].op not in CUBE_OPS}
        groups.append([by_id[i] for i in sorted(ids, key=order.__getitem__)])
    return groups


def _wrap_matmuls(graph: Graph, ctx) -> int:
    """Each MatMul/BatchMatMul left outside the kernels becomes a cube kernel, with the
    transposes of its operands' last two axes that feed only it (folded into isTrans)."""
    wrapped = 0
    for n in list(graph.nodes):
        if n.op not in PRODUCT_OPS or not ctx.should_apply(f"{n.name}: a cube kernel", [n]):
            continue
        group = [n]
        for v in n.inputs:
            while (v.producer is not None and v.producer.op == "Transpose"
                   and len(v.users) == 1 and swaps_last_two(v.producer)):
                group.insert(0, v.producer)
                v = v.producer.inputs[0]
        build_kernel(graph, group, next_kernel_name(ctx.analyses, group, "cube"), "cube")
        wrapped += 1
    return wrapped


def _two_stages(graph: Graph, k: Node, s: Schedule, spec, ctx) -> list[Node]:
    """A kernel reducing everything to one value on one core, with work for every core: split
    into per-core partial reductions and their combination (codegen/vector/phases.py)."""
    M, L = s.M, s.L
    if not (s.reduce and M == 1 and isinstance(L, int) and L >= spec.aiv_cores * 1024):
        return []
    parts = next((d for d in range(spec.aiv_cores, 7, -1) if L % d == 0), None)
    if parts is None or not ctx.should_apply(f"{k.name}: two stages over {parts} cores", [k]):
        return []
    return _report_split(ctx, k, split_whole_reduction(graph, k, parts, _namer(ctx, k)),
                         f"one value from {L} elements: {parts} partial reductions, then "
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
        ctx.report_extra["phases"].append({"kernel": k.name, "kernels": names,
                                           "reason": reason})
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
    spec = targets.load(ctx.flags.target)
    ctx.analyses.invalidate("codegen", "codegen_shared", "super_kernels")  # recomputed here
    scheds: dict[str, Schedule] = ctx.analyses.codegen
    fallbacks: list[dict] = ctx.report_extra.setdefault("fallbacks", [])
    changed = 0
    wrapped = _wrap_matmuls(graph, ctx)
    work = deque(n for n in graph.nodes if n.op == "GraphKernel")
    widened = 0
    for k in work:  # sums and products accumulate in fp32 (codegen/accumulate.py)
        body = widen_reductions(k)
        if body is not None:
            k.attrs["subgraph"] = body
            widened += 1
    depth = {id(k): 0 for k in work}
    phased: list[dict] = ctx.report_extra.setdefault("phases", [])
    done: dict[tuple, Schedule | _Refused] = {}  # body signature -> its schedule
    signature: dict[str, tuple] = {}  # scheduled kernel -> its body's signature
    with ctx.task("kernels", len(work)) as shown:
        while work:
            k = work.popleft()
            shown.advance(k.name)
            parts: list[Node] = []
            try:
                key = body_signature(k.subgraph)
                s = check_once(k, spec, key, done)
                parts = _two_stages(graph, k, s, spec, ctx) if depth[id(k)] < 3 else []
                if not parts:
                    scheds[k.name] = s
                    signature[k.name] = key
                    continue
            except NeedsPhases as e:
                reason, bad = str(e), e.node
                parts = _in_phases(graph, k, ctx, reason) if depth[id(k)] < 3 else []
            except Unsupported as e:
                reason, bad = str(e), e.node
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
            parts = _split_around(graph, k, index if depth[id(k)] < 3 else None, ctx)
            for p in parts:
                depth[id(p)] = depth[id(k)] + 1
            work.extendleft(reversed(parts))
            shown.add_total(len(parts))
            action = (f"split around {bad.op}; retried as {', '.join(p.name for p in parts)}"
                      if parts else "unfused")
            fallbacks.append({"kernel": k.name, "nodes": members, "reason": reason,
                              "action": action})
            ctx.log(f"Fallback {k.name} ({reason}): not supported by codegen; {action}")
    for entry in phased:  # why these kernels read their inputs more than once
        for j, name in enumerate(entry["kernels"]):
            if name in scheds:
                scheds[name].notes.append(f"phase {j + 1} of {len(entry['kernels'])} of "
                                          f"{entry['kernel']}: its inputs are re-read once "
                                          "per phase (a multi-phase reduction)")
    if changed:
        graph.remove_dead()  # scalar constants the split kernels copied inside
    if ctx.analyses.super_kernel_scopes is not None:
        _super_kernels(graph, ctx, spec, scheds)
    live = {n.name for n in graph.nodes if n.op == "GraphKernel"}
    shared = _shared(scheds, signature, live, ctx)
    ctx.report_extra["codegen"] = {
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
