"""A product group: independent matrix products that read the same left operand, as one
kernel that runs them one after another (q, k and v projections of one hidden state, the
weight gradients ``xᵀ·dQ``, ``xᵀ·dK``, ``xᵀ·dV``).

Each product keeps everything it had as a kernel of its own (codegen/cube/schedule.py): its
B, its tiling (computed by its own host function for the actual shapes), its epilogue if it
is a MIX product, its outputs. The group's kernel calls each product's body in turn on every
block; each body registers its own Matmul object, runs its blocks and calls ``End()`` before
it returns, so no two objects are ever in use at once (the API's rule, which the simulator
enforces). A block beyond a product's ``usedCoreNum`` skips that product. The test is on
the block: ``GetBlockIdx()`` in a cube-only group, ``GetBlockIdx() / GetTaskRatio()`` in a
MIX group, the same value on a MIX block's cube core and both its vector cores
(``GetBlockIdx()`` alone is ``block * 2 + sub-block`` on a vector core of a MIX launch): all
three must reach the same registrations, or the cube core's Matmul server waits for a vector
core that never comes (docs/codegen.md, "Block indices"). Between
two products a ``PipeBarrier<PIPE_ALL>``: the next body's TPipe takes the UB again, so the
previous body's copies out must be done.

What is saved is the launches (one instead of one per product). What is not: A is read from
GM by each product as its own kernel read it (the objects do not share L1: A is re-read per
product; the traffic model counts it so, codegen/traffic.py).

A product whose epilogue reads another product's result (gate's ``silu(x·Wg) · up``) runs
after it and reads it back from GM tile by tile; the read (cube) product takes the reader's
core split and the same worker numbering, so that every vector core reads back only what it
wrote itself (the cores of a launch are not synchronised; the simulator refuses a read of
bytes another core wrote), and its
synchronous ``IterateAll`` has returned, C written, before the reader's object runs.

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


def parts(kernel: Node) -> list[list[Node]]:
    """The group's products, each as its body nodes in body order, in the order they run.
    The body's connected parts, but that a product's result written to GM (a body output)
    and read by another product's epilogue does not join the two: the reader reads it back
    from GM and runs after the product that writes it."""
    body = kernel.subgraph
    nodes = body.nodes
    pos = {id(n): i for i, n in enumerate(nodes)}
    root = list(range(len(nodes)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    outs = {id(v) for v in body.outputs}
    cut: list[tuple[int, int]] = []
    for i, n in enumerate(nodes):
        for v in n.inputs:
            p = v.producer
            if p is None or id(p) not in pos:
                continue
            if p.op in PRODUCT_OPS and id(v) in outs:
                cut.append((pos[id(p)], i))
            else:
                root[find(i)] = find(pos[id(p)])
    has_product = {find(i) for i, n in enumerate(nodes) if n.op in PRODUCT_OPS}
    for a, b in cut:  # a consumer with no product of its own is the product's epilogue
        if find(b) not in has_product:
            root[find(b)] = find(a)
    groups: dict[int, list[Node]] = {}
    for i, n in enumerate(nodes):
        groups.setdefault(find(i), []).append(n)
    after = {r: {find(a) for a, b in cut if find(b) == r and find(a) != r} for r in groups}
    order: list[int] = []
    while len(order) < len(groups):  # writers first, else in body order
        r = next(r for r in groups if r not in order and after[r] <= set(order))
        order.append(r)
    return [groups[r] for r in order]


Arg = tuple[str, int]  # ("in", group input index) or ("out", group output index)


@dataclass
class Member:
    """One product of a group: its kernel (a body of its own), its schedule, the group's
    arguments it reads (an input, or an earlier product's output, which it reads back from
    GM) and the group outputs it writes, and the product whose core split it takes (a cube
    product read back by a later product: every block then reads back only what it wrote)."""

    kernel: Node
    schedule: MatmulSchedule
    inputs: list[Arg]
    outputs: list[int]
    split_of: int | None = None


def reads(m: Member, kernel: Node) -> list[Value]:
    """The outer values a product of group ``kernel`` reads."""
    return [kernel.inputs[i] if w == "in" else kernel.outputs[i] for w, i in m.inputs]


def members(kernel: Node, spec: targets.Target) -> list[Member]:
    """Each product of group ``kernel`` as a kernel of its own, planned by plan_matmul (its
    refusal raised as it is); a product that reads an earlier one's result is checked to read
    only the blocks it computes itself."""
    body = kernel.subgraph
    in_index = {id(v): i for i, v in enumerate(body.inputs)}
    out_index = {id(v): j for j, v in enumerate(body.outputs)}
    out: list[Member] = []
    made: dict[int, int] = {}  # id(body output) -> the product computing it
    for j, nodes in enumerate(parts(kernel)):
        products = [n for n in nodes if n.op in PRODUCT_OPS]
        if len(products) != 1:
            raise Unsupported(f"a product group's part with {len(products)} products (each "
                              "part of the group's body is one product and its epilogue)",
                              node=products[1] if products else None)
        ids = {id(n) for n in nodes}
        read: list[Value] = []
        for n in nodes:
            for v in n.inputs:
                if (v.producer is None or id(v.producer) not in ids) and v not in read:
                    read.append(v)
        args: list[Arg] = []
        for v in read:
            if id(v) in in_index:
                args.append(("in", in_index[id(v)]))
            elif id(v) in made:
                args.append(("out", out_index[id(v)]))
            else:
                raise Unsupported("a product of a group reads a value another product "
                                  "computes inside the kernel (only a result written to GM "
                                  "can be read back)", node=v.producer)
        outs = [i for i, v in enumerate(body.outputs)
                if v.producer is not None and id(v.producer) in ids]
        name = f"{kernel.name}_p{j}"
        sub = Graph(name)
        vmap: dict[int, Value] = {}
        for v in read:
            vmap[id(v)] = sub.add_input(v.name, v.type)
        for n in nodes:
            sub.clone_node(n, vmap)
        sub.set_outputs([vmap[id(body.outputs[i])] for i in outs])
        probe = Graph("probe")
        k = probe.add_node("GraphKernel", [probe.add_input(v.name, v.type) for v in read],
                           {"subgraph": sub, "pattern": "cube"}, name=name)
        m = Member(k, plan_matmul(k, spec), args, outs)
        for w, i in args:
            if w == "out":
                _chain(out, m, made[id(body.outputs[i])], i, len(out))
        out.append(m)
        for i in outs:
            made[id(body.outputs[i])] = j
    if len(out) < 2:
        raise Unsupported(f"a product group of {len(out)} product (a group runs several)")
    return out


def _chain(done: list[Member], m: Member, p: int, o: int, j: int) -> None:
    """Product ``j`` (``m``) reads product ``p``'s output ``o`` back: allowed when ``p`` is a
    cube product whose one output is its product, ``m``'s epilogue reads it as a tile of
    exactly its own product's extent, and no other product reads it back; ``p`` then takes
    ``m``'s core split, so that each block reads back only the part it wrote."""
    first = done[p]
    epi = m.schedule.epilogue
    if first.schedule.epilogue is not None or first.split_of is not None:
        raise Unsupported("a product group's product reads back the result of a product with "
                          "an epilogue, or one read back already (only a cube product's result "
                          "is read back, by one product)", node=m.schedule.matmul)
    at = m.inputs.index(("out", o))
    rec = next((i for i in epi.inputs if i.index == at), None) if epi is not None else None
    mine = m.schedule.matmul.outputs[0].type.shape
    theirs = m.kernel.subgraph.inputs[at].type.shape
    if rec is None or rec.layout != "tile" or tuple(mine) != tuple(theirs):
        raise Unsupported("a product group's product reads another's result other than as a "
                          "tile of its own product's extent (each block must read back only "
                          "what it wrote)", node=m.schedule.matmul)
    first.split_of = j


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
    b = [_right(m) for m in ms]
    if any(x != a[0] for x in a[1:]) and any(x != b[0] for x in b[1:]):
        raise Unsupported("a product group whose products read different left operands "
                          f"(inputs {sorted(set(a))}) and different right ones",
                          node=ms[1].schedule.matmul)
    name = kernel_symbol(kernel)
    kind = "mix" if any(m.schedule.epilogue is not None for m in ms) else "cube"
    g = GroupSchedule(node=kernel.name, name=name, body=kernel.subgraph, members=ms,
                      target=spec, kernel_kind=kind)
    g.notes = [f"{len(ms)} products of one left operand run one after another in one launch; "
               "each reads A from GM itself (the products' Matmul objects do not share L1)"]
    for j, m in enumerate(ms):
        if m.split_of is not None:
            g.notes.append(f"product {j + 1} runs on product {m.split_of + 1}'s tiling (its "
                           "result is read back by it, each block reading what it wrote): "
                           "its reads of A and B are that split's")
            continue
        g.notes += [f"product {j + 1}: {x}" for x in m.schedule.notes]
    return g


def _left(m: Member) -> tuple[Arg, bool]:
    """(the group argument A is read from, read transposed)."""
    return m.inputs[m.schedule.a], m.schedule.trans_a


def _right(m: Member) -> tuple[Arg, bool]:
    """(the group argument B is read from, read transposed): products of one activation by
    the pieces of a weight cut along M share B (each still reads it itself)."""
    return m.inputs[m.schedule.b], m.schedule.trans_b


def render_group(g: GroupSchedule) -> Rendered:
    """The group kernel's files and manifest entry: each product's body (rendered as a
    member: codegen/cube/render.py), the entry that calls them in turn, the tiling header
    with every product's struct and the host function that fills them."""
    from graphkernel.codegen.cube.render import TILER, render_matmul

    mix = g.kernel_kind == "mix"
    subs = [render_matmul(m.schedule, member=True, in_mix=mix) for m in g.members]
    name = g.name
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
        args = ", ".join([*(f"{w}{i}" for w, i in m.inputs), *(f"out{o}" for o in m.outputs),
                          "workspace", f"tiling + {name}_offset[{j}]"])
        # the block: on a cube-only launch GetBlockIdx(); on a MIX launch the same value on
        # the block's cube core and both vector cores (GetBlockIdx() / GetTaskRatio())
        guard = (["        // the block (the same on its cube core and both vector cores, "
                  "which must all",
                  "        // reach the same Matmul registrations)",
                  "        if (t.nc != 0 && GetBlockIdx() / GetTaskRatio() < "
                  "t.cube.usedCoreNum)"] if mix else
                 ["        if (t.nc != 0 && GetBlockIdx() < t.cube.usedCoreNum)"])
        body += ["    {",
                 f"        {t} t;  // product {j + 1}'s tiling: which blocks it runs on",
                 "        for (uint32_t i = 0; i < sizeof(t); ++i) ((uint8_t*)&t)[i] = "
                 f"((const uint8_t*)tiling)[{name}_offset[{j}] + i];",
                 *guard,
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
        idx = [*(i if w == "in" else ins + i for w, i in m.inputs),
               *(ins + o for o in m.outputs)]
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
    for p, (m, r) in enumerate(zip(g.members, subs, strict=True)):
        if m.split_of is None:
            continue
        q = subs[m.split_of].name
        tiling_cpp += [
            f"    {{  // product {p + 1}'s result is read back by product {m.split_of + 1}: the "
            "same core split,",
            "        // so that every block reads back only the part it wrote",
            f"        {q}_TilingData src;",
            f"        {r.name}_TilingData dst;",
            f"        std::memcpy(&src, out + {name}_offset[{m.split_of}], sizeof src);",
            f"        std::memcpy(&dst, out + {name}_offset[{p}], sizeof dst);",
            "        if (dst.nc != 0) {",
            "            dst.cube = src.cube;",
            "            dst.coresM = src.coresM;",
            "            dst.coresN = src.coresN;",
            f"            dst.cube.transLength = dst.cube.baseM * dst.cube.baseN * "
            f"{m.schedule.c_bytes};",
            "        }",
            f"        std::memcpy(out + {name}_offset[{p}], &dst, sizeof dst);",
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
                      "inputs": [f"{w}{i}" for w, i in m.inputs], "outputs": m.outputs,
                      "core_split_of": m.split_of}
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
