"""SuperKernel: consecutive statically shaped kernels of a scope launched as one kernel.

The SuperKernel entry calls each sub-kernel's body in order on every core; an all-core
barrier (``SyncAll``) separates two sub-kernels only when the later one reads a GM buffer
written since the last barrier (a data dependency); independent neighbours run back to back.
Before each sub-kernel an instruction-cache preload hint fetches its code. Scopes are the
``super_kernel_scope`` patterns (node-name prefixes or globs, matched against a kernel's
name and the user's node names it holds), or every run of qualifying kernels when no scope
is given.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphkernel import symbolic
from graphkernel.ir import Graph, Node, Value
from graphkernel.traffic import VIEWS


@dataclass
class Group:
    name: str
    members: list[Node]
    barriers: list[bool] = field(default_factory=list)  # before member j (j >= 1)

    @property
    def launches_saved(self) -> int:
        return len(self.members) - 1


def _in_scope(node: Node, scopes: Sequence[str]) -> bool:
    if not scopes:
        return True
    names = [node.name, *node.origin]
    return any(fnmatch.fnmatchcase(n, p) or n.startswith(p) for p in scopes for n in names)


def _static(node: Node) -> bool:
    return all(symbolic.is_static(d) for v in (*node.inputs, *node.outputs) for d in v.shape)


def base(v: Value) -> Value:
    """The GM buffer behind a value: views (Reshape/ExpandDims/Squeeze) share their source's."""
    while v.producer is not None and v.producer.op in VIEWS:
        v = v.producer.inputs[0]
    return v


def form_groups(graph: Graph, scopes: Sequence[str], eligible: set[str] | None = None
                ) -> list[Group]:
    """Maximal runs of consecutive launches that are in-scope, static GraphKernels (and, if
    given, among ``eligible``); runs of one are not groups."""
    groups: list[Group] = []
    run: list[Node] = []

    def close() -> None:
        if len(run) > 1:
            groups.append(Group(f"superkernel_{len(groups) + 1}", list(run)))
        run.clear()

    for n in graph.nodes:
        if n.op == "Constant" or n.op in VIEWS:
            continue  # no launch
        ok = (n.op == "GraphKernel" and _in_scope(n, scopes) and _static(n)
              and (eligible is None or n.name in eligible))
        if ok:
            run.append(n)
        else:
            close()
    close()
    for g in groups:
        g.barriers = barriers(g.members)
    return groups


def barriers(members: Sequence[Node]) -> list[bool]:
    """barrier[j]: member j reads a buffer some member wrote since the last barrier."""
    out = [False]
    written: set[int] = set()
    for j, k in enumerate(members):
        if j:
            dep = any(id(base(v)) in written for v in k.inputs)
            out.append(dep)
            if dep:
                written = set()
        written |= {id(v) for v in k.outputs}
    return out


def split_at(groups: list[Group], missing: set[str]) -> list[Group]:
    """Groups without the kernels in ``missing`` (fallen back): a gap splits a group."""
    out: list[Group] = []
    for g in groups:
        run: list[Node] = []
        for k in [*g.members, None]:
            if k is not None and k.name not in missing:
                run.append(k)
                continue
            if len(run) > 1:
                out.append(Group(f"superkernel_{len(out) + 1}", run, barriers(run)))
            run = []
    return out


def buffers(group: Group) -> tuple[list[Value], list[list[int]]]:
    """The SuperKernel's GM buffers (external inputs, then every member's outputs) and, per
    member, the buffer index of each of its inputs and outputs."""
    bufs: list[Value] = []
    index: dict[int, int] = {}

    def idx(v: Value) -> int:
        b = base(v)
        if id(b) not in index:
            index[id(b)] = len(bufs)
            bufs.append(b)
        return index[id(b)]

    produced = {id(v) for k in group.members for v in k.outputs}
    for k in group.members:
        for v in k.inputs:
            if id(base(v)) not in produced:
                idx(v)
    for k in group.members:
        for v in k.outputs:
            idx(v)
    return bufs, [[idx(v) for v in (*k.inputs, *k.outputs)] for k in group.members]


def symbol(group: Group, subs: Sequence[Any]) -> str:
    import hashlib

    h = hashlib.sha1("|".join(r.name for r in subs).encode() + bytes(group.barriers))
    return f"gk_{group.name}_{h.hexdigest()[:8]}"


def render(group: Group, subs: Sequence[Any]) -> str:
    """The SuperKernel's C++ source. The sub-kernels' sources come first in the same
    translation unit (or project); the tiling buffer holds each sub-kernel's tiling struct in
    order, each at a multiple of 8 bytes."""
    bufs, arg_index = buffers(group)
    name = symbol(group, subs)
    lines = [f"// {name}: one launch for {len(subs)} kernels (generated by graphkernel).",
             "static constexpr uint32_t gk_align8(uint32_t n) { return (n + 7) / 8 * 8; }"]
    offs = ["0"]
    for r in subs[:-1]:
        offs.append(f"{offs[-1]} + gk_align8(sizeof({r.name}_TilingData))")
    lines.append(f"static constexpr uint32_t {name}_offset[] = {{{', '.join(offs)}}};")
    params = ", ".join(f"GM_ADDR b{i}" for i in range(len(bufs)))
    lines.append(f'extern "C" __global__ __aicore__ void {name}({params}, GM_ADDR workspace, '
                 "GM_ADDR tiling) {")
    lines.append("    const uint8_t* tb = (const uint8_t*)tiling;")
    for j, (r, args) in enumerate(zip(subs, arg_index, strict=True)):
        t = f"{r.name}_TilingData"
        if j and group.barriers[j]:
            lines.append("    SyncAll();  // the next kernel reads what the previous ones wrote")
        if j:  # its TPipe takes the UB again: the previous kernel's copies out must be done
            lines.append("    PipeBarrier<PIPE_ALL>();")
        lines.append(f"    ICachePreLoad(2);  // fetch {r.name}'s instructions")
        lines.append("    {")
        lines.append(f"        {t} t;")
        lines.append(f"        for (uint32_t i = 0; i < sizeof(t); ++i) ((uint8_t*)&t)[i] = "
                     f"tb[{name}_offset[{j}] + i];")
        lines.append("        if ((uint64_t)GetBlockIdx() < t.blockDim) {")
        lines.append(f"            {r.name}_Kernel k;")
        call = ", ".join(f"b{i}" for i in args)
        lines.append(f"            k.Init({call}, t);")
        lines.append("            k.Process();")
        lines.append("        }")
        lines.append("    }")
    lines.append("    (void)workspace;")
    lines.append("}")
    return "\n".join(lines) + "\n"
