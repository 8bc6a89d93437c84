"""A product group: independent matrix products that read the same left operand, as one
kernel that runs them one after another (q, k and v projections of one hidden state, the
weight gradients ``xᵀ·dQ``, ``xᵀ·dK``, ``xᵀ·dV``).

Each product keeps everything it had as a kernel of its own (codegen/cube/schedule.py): its
B, its tiling (computed by its own host function for the actual shapes), its epilogue if it
is a MIX product, its outputs. The group's kernel calls each product's body in turn on every
block; each body registers its own Matmul object, runs its blocks and calls ``End()`` before
it returns, so no two objects are ever in use at once (the API's rule, which the simulator
enforces). A block beyond a product's ``usedCoreNum`` skips that product (both halves of a
MIX block see the same block index, so the cube and vector sides skip it together). Between
two products a ``PipeBarrier<PIPE_ALL>``: the next body's TPipe takes the UB again, so the
previous body's copies out must be done.

What is saved is the launches (one instead of one per product). What is not: A is read from
GM by each product as its own kernel read it (the objects do not share L1: A is re-read per
product; the traffic model counts it so, codegen/traffic.py).

The tiling buffer holds each product's tiling struct in order, each at a multiple of 8
bytes; the group's host function fills them from the products' host functions and launches
the most blocks any product uses. Body layout: the products' nodes side by side (the
``matmul_group`` pass, passes/matmul_group.py, builds it); each connected part of the body
holds one product.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphkernel.codegen import targets
from graphkernel.codegen.buffers import NO_BUFFERS
from graphkernel.codegen.cube.schedule import MatmulSchedule, plan_matmul
from graphkernel.codegen.kernel_ir import comment_text
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.render import Rendered
from graphkernel.codegen.vector.schedule import FULL, KernelIO, kernel_symbol
from graphkernel.ir import Dim, Graph, Node, Value
from graphkernel.ops import PRODUCT_OPS

PATTERN = "matmul_group"


def is_group_kernel(kernel: Node) -> bool:
    """Whether ``kernel`` is a product group (the matmul_group pass's pattern)."""
    return kernel.attrs.get("pattern") == PATTERN


def parts(body: Graph) -> list[list[Node]]:
    """The body's connected parts (nodes joined by the values they pass each other; shared
    inputs of the body do not join), each in body order."""
    owner: dict[int, int] = {}
    root = list(range(len(body.nodes)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, n in enumerate(body.nodes):
        owner[id(n)] = i
        for v in n.inputs:
            if v.producer is not None and id(v.producer) in owner:
                root[find(i)] = find(owner[id(v.producer)])
    groups: dict[int, list[Node]] = {}
    for i, n in enumerate(body.nodes):
        groups.setdefault(find(i), []).append(n)
    return list(groups.values())


@dataclass
class Member:
    """One product of a group: its kernel (a body of its own), its schedule and where its
    inputs and outputs sit among the group's."""

    kernel: Node
    schedule: MatmulSchedule
    inputs: list[int]   # group input index of each of the product's inputs
    outputs: list[int]  # group output index of each of its outputs


def members(kernel: Node, spec: targets.Target) -> list[Member]:
    """Each product of group ``kernel`` as a kernel of its own, planned by plan_matmul (its
    refusal raised as it is)."""
    body = kernel.subgraph
    out: list[Member] = []
    for j, nodes in enumerate(parts(body)):
        products = [n for n in nodes if n.op in PRODUCT_OPS]
        if len(products) != 1:
            raise Unsupported(f"a product group's part with {len(products)} products (each "
                              "part of the group's body is one product and its epilogue)",
                              node=products[1] if products else None)
        ids = {id(n) for n in nodes}
        read = {id(v) for n in nodes for v in n.inputs}
        ins = [i for i, v in enumerate(body.inputs) if id(v) in read]
        outs = [i for i, v in enumerate(body.outputs)
                if v.producer is not None and id(v.producer) in ids]
        sub = Graph(f"{kernel.name}_p{j}")
        vmap: dict[int, Value] = {}
        for i in ins:
            v = body.inputs[i]
            vmap[id(v)] = sub.add_input(v.name, v.type)
        for n in nodes:
            sub.clone_node(n, vmap)
        sub.set_outputs([vmap[id(body.outputs[i])] for i in outs])
        probe = Graph("probe")
        k = probe.add_node("GraphKernel", [probe.add_input(body.inputs[i].name,
                                                           body.inputs[i].type) for i in ins],
                           {"subgraph": sub, "pattern": "cube"}, name=f"{kernel.name}_p{j}")
        out.append(Member(k, plan_matmul(k, spec), ins, outs))
    if len(out) < 2:
        raise Unsupported(f"a product group of {len(out)} product (a group runs several)")
    return out


@dataclass
class GroupSchedule:
    """A product group's kernel: its products' schedules in the order they run."""

    node: str
    name: str
    body: Graph
    members: list[Member]
    notes: list[str] = field(default_factory=list)
    target: targets.Target | None = field(default=None, repr=False, compare=False)
    kernel_kind: str = "cube"   # "mix" when any product has an epilogue
    variant: None = None
    reduce: bool = False
    tiling: None = None         # each product's own (in the tiling buffer, in order)
    epilogue: None = None
    L: Dim = 1

    @property
    def M(self) -> Dim:
        return self.members[0].schedule.M

    @property
    def inputs(self) -> list[KernelIO]:
        return [KernelIO(i, v, FULL, v.dtype, tuple(v.type.shape))
                for i, v in enumerate(self.body.inputs)]

    @property
    def outputs(self) -> list[KernelIO]:
        return [KernelIO(j, v, FULL, v.dtype, tuple(v.type.shape))
                for j, v in enumerate(self.body.outputs)]

    def plan(self):
        return NO_BUFFERS


def plan_group(kernel: Node, spec: targets.Target) -> GroupSchedule:
    """The group kernel of ``kernel``, or Unsupported naming the product that cannot be
    generated (or why the products cannot share one kernel)."""
    ms = members(kernel, spec)
    a = [_left(m) for m in ms]
    if any(x != a[0] for x in a[1:]):
        raise Unsupported("a product group whose products read different left operands "
                          f"(inputs {sorted(set(a))})", node=ms[1].schedule.matmul)
    name = kernel_symbol(kernel)
    kind = "mix" if any(m.schedule.epilogue is not None for m in ms) else "cube"
    g = GroupSchedule(node=kernel.name, name=name, body=kernel.subgraph, members=ms,
                      target=spec, kernel_kind=kind)
    g.notes = [f"{len(ms)} products of one left operand run one after another in one launch; "
               "each reads A from GM itself (the products' Matmul objects do not share L1)"]
    for j, m in enumerate(ms):
        g.notes += [f"product {j + 1}: {x}" for x in m.schedule.notes]
    return g


def _left(m: Member) -> tuple[int, bool]:
    """(the group input index A is read from, read transposed)."""
    return m.inputs[m.schedule.a], m.schedule.trans_a


def render_group(g: GroupSchedule) -> Rendered:
    """The group kernel's files and manifest entry: each product's body (rendered as a
    member: codegen/cube/render.py), the entry that calls them in turn, the tiling header
    with every product's struct and the host function that fills them."""
    from graphkernel.codegen.cube.render import TILER, render_matmul

    subs = [render_matmul(m.schedule, member=True) for m in g.members]
    name = g.name
    mix = g.kernel_kind == "mix"
    head = [f"// Product group {name} (generated by graphkernel for kernel "
            f"\"{comment_text(g.node)}\"):",
            f"// {len(subs)} products of one left operand, run one after another on every "
            "block; each",
            "// registers its own Matmul object and calls End() before the next one runs.",
            "#ifndef GK_SIM"]
    if not mix:
        head.append("#define ASCENDC_CUBE_ONLY")
    head += ['#include "kernel_operator.h"', '#include "lib/matmul_intf.h"',
             f'#include "{name}_tiling.h"', "using namespace AscendC;", "#endif"]
    body = [*head]
    for r in subs:
        body.append(r.files[f"{r.name}.cpp"])
    ins = len(g.body.inputs)
    outs = len(g.body.outputs)
    params = "".join(f"GM_ADDR in{i}, " for i in range(ins)) + "".join(
        f"GM_ADDR out{j}, " for j in range(outs))
    kt = "KERNEL_TYPE_MIX_AIC_1_2" if mix else "KERNEL_TYPE_AIC_ONLY"
    body.append(f'extern "C" __global__ __aicore__ void {name}({params}GM_ADDR workspace, '
                "GM_ADDR tiling) {")
    body.append(f"    KERNEL_TASK_TYPE_DEFAULT({kt});")
    for j, (m, r) in enumerate(zip(g.members, subs, strict=True)):
        t = f"{r.name}_TilingData"
        if j:
            body.append("    PipeBarrier<PIPE_ALL>();  // the next product's TPipe takes the "
                        "UB again")
        args = ", ".join([*(f"in{i}" for i in m.inputs), *(f"out{o}" for o in m.outputs),
                          "workspace", f"tiling + {name}_offset[{j}]"])
        body += ["    {",
                 f"        {t} t;  // product {j + 1}'s tiling: which blocks it runs on",
                 "        for (uint32_t i = 0; i < sizeof(t); ++i) ((uint8_t*)&t)[i] = "
                 f"((const uint8_t*)tiling)[{name}_offset[{j}] + i];",
                 "        if (t.nc != 0 && GetBlockIdx() < t.cube.usedCoreNum)",
                 f"            {r.name}({args});",
                 "    }"]
    body.append("}")
    offs = ["0"]
    for r in subs[:-1]:
        offs.append(f"{offs[-1]} + (sizeof({r.name}_TilingData) + 7) / 8 * 8")
    tiling_h = [f"// Tiling data of product group {name}: each product's struct in order, "
                "each at a multiple of 8 bytes.", "#pragma once", "#include <cstdint>",
                "#ifndef GK_SIM", '#include "kernel_tiling/kernel_tiling.h"  // TCubeTiling',
                "#endif"]
    tiling_h += [r.files[f"{r.name}_tiling.h"] for r in subs]
    tiling_h += [f"static constexpr uint32_t {name}_offset[] = {{{', '.join(offs)}}};",
                 f"static constexpr uint32_t {name}_size = {offs[-1]} + "
                 f"(sizeof({subs[-1].name}_TilingData) + 7) / 8 * 8;"]
    tiling_cpp = [f"// Host tiling of product group {name}: each product's own host function "
                  "on its shapes,", "// its struct at its offset; the launch takes the most "
                  "blocks any product uses.", "#ifndef GK_SIM", f'#include "{name}_tiling.h"',
                  "#endif", "#include <cstring>", TILER]
    tiling_cpp += [r.files[f"{r.name}_tiling.cpp"] for r in subs]
    ranks = [len(v.type.shape) for v in (*g.body.inputs, *g.body.outputs)]
    starts = [sum(ranks[:i]) for i in range(len(ranks))]
    tiling_cpp += [f'extern "C" uint32_t {name}_tiling_size() {{ return {name}_size; }}', "",
                   "// shapes: every input's dims, then every output's; cores: the cube cores.",
                   f'extern "C" int32_t {name}_tiling(const int64_t* shapes, uint32_t cores, '
                   "uint64_t ub,",
                   "                                      uint8_t* out, uint32_t* blockDim, "
                   "uint64_t* workspace) {",
                   f"    std::memset(out, 0, {name}_size);",
                   "    *blockDim = 0;",
                   "    *workspace = 0;"]
    for j, (m, r) in enumerate(zip(g.members, subs, strict=True)):
        idx = [*m.inputs, *(ins + o for o in m.outputs)]
        pos = [starts[i] + a for i in idx for a in range(ranks[i])]
        dims = ", ".join(f"shapes[{p}]" for p in pos) or "0"
        tiling_cpp += ["    {",
                       f"        const int64_t s[] = {{{dims}}};",
                       "        uint32_t b = 0;",
                       "        uint64_t w = 0;",
                       f"        if ({r.name}_tiling(s, cores, ub, out + {name}_offset[{j}], "
                       "&b, &w) != 0) return -1;",
                       "        if (b > *blockDim) *blockDim = b;",
                       "        if (w > *workspace) *workspace = w;",
                       "    }"]
    tiling_cpp += ["    return 0;", "}"]
    files = {f"{name}.cpp": "\n".join(body) + "\n",
             f"{name}_tiling.h": "\n".join(tiling_h) + "\n",
             f"{name}_tiling.cpp": "\n".join(tiling_cpp) + "\n"}
    manifest: dict[str, Any] = {
        "name": name, "node": g.node, "kind": g.kernel_kind,
        "inputs": [_io(io) for io in g.inputs], "outputs": [_io(io) for io in g.outputs],
        "products": [{**{k: r.manifest[k] for k in ("name", "kind", "matmul", "cube_tiling",
                                                      "buffers")},
                      "inputs": m.inputs, "outputs": m.outputs}
                     for m, r in zip(g.members, subs, strict=True)],
        "tiling_fields": ["each product's tiling struct in order, 8-byte aligned"],
        "block_dim": "the most cube cores any product's tiling uses",
        "tiling_function": f"{name}_tiling", "sources": sorted(files),
        "notes": list(g.notes), "buffers": [],
    }
    return Rendered(g, None, files, manifest, NO_BUFFERS, members=subs)


def _io(io: KernelIO) -> dict[str, Any]:
    from graphkernel.codegen.render import io_entry

    return io_entry(io)
