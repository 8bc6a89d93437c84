"""Horizontal matmul fusion: independent products that read the same left operand (or, among
the products left apart, the same right operand) become one kernel that runs them one after
another (codegen/cube/group.py).

q, k and v projections of one hidden state, the key and value projections of cross
attention from the encoder's output, an MLP's gate and up projections, the weight gradients
``xᵀ·dQ``, ``xᵀ·dK``, ``xᵀ·dV`` of training, and in NCHW the 1x1 convolutions of one input
as products ``W_i @ x`` (a pre-activation block's projection shortcut and first
convolution, both reading the norm's output as B): each is a product of its own with its own
weight, tiling and (for a MIX product) epilogue, and each is a launch. Joined, each keeps
all of that and the group is one launch. A product is a cube kernel (the product, with the
transposes of its operands folded in) or a MIX kernel (with its epilogue): the kernels
formed so far, and the products the fusion left outside any kernel (wrapped here as the
codegen pass would wrap them).

Refused: a product that depends on another of the group (a path from one to the other) but
for a product whose epilogue reads another's result directly (a gated MLP's gate reading up:
it reads it back from GM, codegen/cube/group.py decides whether it can), a group whose
kernel would take more inputs than the target's ``max_kernel_inputs``, and a
product the generator cannot plan next to the others (a shape it cannot tile, statically or
at run time: codegen/cube/group.py asks each product's own planner). The products run one
after another, each in its own UB (a TPipe per product): the group adds nothing to a
product's UB or L1, so a product that fits alone fits in the group.

On at the default level: the group launches once where the products launched each; every
product still runs the code, tiling and GM traffic it had alone (A is re-read by each
product; the Matmul objects do not share L1), so the only change is the launches saved.
"""

from __future__ import annotations

from graphkernel.codegen.cube.group import PATTERN, plan_group
from graphkernel.codegen.cube.schedule import is_matmul_kernel, swaps_last_two
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.window import is_window_kernel
from graphkernel.ir import Graph, Node, Value
from graphkernel.kernels import build_kernel, next_kernel_name, parallel_body
from graphkernel.ops import PRODUCT_OPS
from graphkernel.passes.parallel_fusion import reaches
from graphkernel.registry import PassResult, counted


def _source(v: Value, trans: bool, inside: set[int]) -> tuple[Value, bool]:
    """The value an operand reads through the transposes of its last two axes among
    ``inside`` (folded into isTrans), and whether it is read transposed."""
    while v.producer is not None and id(v.producer) in inside:
        p = v.producer
        if not (p.op == "Transpose" and swaps_last_two(p)):
            break
        v, trans = p.inputs[0], not trans
    return v, trans


def _product(k: Node) -> Node | None:
    """The one product of a cube/MIX kernel (None for any other kernel)."""
    if k.attrs.get("pattern") == PATTERN or is_window_kernel(k) or not is_matmul_kernel(k):
        return None
    ps = [n for n in k.subgraph.nodes if n.op in PRODUCT_OPS]
    return ps[0] if len(ps) == 1 else None


def _operand(unit: Node, side: int) -> tuple[int, bool] | None:
    """(id of the outer value a unit's product reads as A (``side`` 0) or B (1), read
    transposed), for a cube/MIX kernel or a product left outside the kernels. A constant B
    has no key: products sharing only a constant right operand (a tied weight) share no
    activation, so nothing makes them one stage of the graph."""
    from graphkernel.codegen.legalize import cube_group

    flag = ("transpose_a", "transpose_b")[side]
    if unit.op == "GraphKernel":
        mm = _product(unit)
        if mm is None:
            return None
        body = unit.subgraph
        v, t = _source(mm.inputs[side], bool(mm.attrs.get(flag)), {id(n) for n in body.nodes})
        if v not in body.inputs:
            return None
        v = unit.inputs[body.inputs.index(v)]
    else:
        v, t = _source(unit.inputs[side], bool(unit.attrs.get(flag)),
                       {id(n) for n in cube_group(unit)})
    if side == 1 and v.producer is not None and v.producer.op == "Constant":
        return None
    return id(v), t


def _independent(graph: Graph, a: Node, b: Node, order: dict[int, int]) -> bool:
    """Whether units ``a`` and ``b`` (``a`` first) can run in one kernel, ``a`` first: no path
    from one to the other, or only ``b`` reading ``a``'s result directly (read back from GM
    by the group's later product: codegen/cube/group.py decides whether it can be)."""
    if not reaches(graph, a, b, order):
        return True
    if b.op != "GraphKernel" or not any(v.producer is a for v in b.inputs):
        return False
    # a path from a to b other than the direct edge refuses
    return not any(reaches(graph, u, b, order) for v in a.outputs for u in v.users
                   if u is not b and order.get(id(u), order[id(b)]) < order[id(b)])


def _plans(kernels: list[Node], ctx) -> str | None:
    """Why the code generator cannot run ``kernels`` as one group, or None when it can."""
    body, ins = parallel_body(kernels, "probe")
    probe = Graph("probe")
    k = probe.add_node("GraphKernel", [probe.add_input(v.name, v.type) for v in ins],
                       {"subgraph": body, "pattern": PATTERN}, name="probe")
    try:
        plan_group(k, ctx.target)
    except Unsupported as e:
        return str(e)
    return None


def _merge(graph: Graph, kernels: list[Node], name: str) -> Node:
    body, inputs = parallel_body(kernels, name)
    k = graph.add_node("GraphKernel", inputs, {"subgraph": body, "pattern": PATTERN},
                       name=graph.fresh_name(name),
                       origin=tuple(dict.fromkeys(o for m in kernels for o in m.origin)))
    olds = [v for m in kernels for v in m.outputs]
    for old, nv in zip(olds, k.outputs, strict=True):
        graph.replace_all_uses(old, nv)
    for m in kernels:
        graph.erase_node(m)
    return k


def _join(graph: Graph, ctx, units: list[Node], max_inputs: int, refused: list[str]
          ) -> tuple[Node, list[str]] | None:
    """The product-group kernel of the independent ``units`` the generator plans together
    and its members' names (None when fewer than two are left); refusals are appended to
    ``refused``."""
    from graphkernel.codegen.legalize import cube_group

    order = {id(n): i for i, n in enumerate(graph.nodes)}  # (earlier groups joined)
    units.sort(key=lambda u: order[id(u)])
    taken: list[Node] = []
    for u in units:
        if all(_independent(graph, t, u, order) for t in taken):
            taken.append(u)
    if len(taken) < 2:
        return None
    names = ", ".join(u.name for u in taken)
    if not ctx.should_apply(f"one kernel for the products {names}", taken):
        return None
    kernels = []
    for u in taken:  # a product outside the kernels: its cube kernel, as codegen makes it
        if u.op != "GraphKernel":
            group = cube_group(u)
            u = build_kernel(graph, group, next_kernel_name(ctx.analyses, group, "cube"),
                             "cube")
        kernels.append(u)
    group_ks: list[Node] = []
    for k in kernels:  # greedily, each product that the generator plans beside the rest
        trial = [*group_ks, k]
        if max_inputs and len({id(x) for m in trial for x in m.inputs}) > max_inputs:
            refused.append(f"{k.name}: more than {max_inputs} kernel inputs")
            continue
        why = _plans(trial, ctx) if len(trial) > 1 else None
        if why is not None:
            refused.append(f"{k.name}: {why}")
            continue
        group_ks = trial
    if len(group_ks) < 2:
        return None
    name = next_kernel_name(ctx.analyses, [n for k in group_ks for n in k.subgraph.nodes],
                            PATTERN)
    members = [m.name for m in group_ks]
    return _merge(graph, group_ks, name), members


def matmul_group(graph, ctx) -> PassResult:
    """Join independent products (cube or MIX kernels, or products outside any kernel) that
    read the same left operand, then those left apart that read the same non-constant right
    operand, into one product-group kernel, within max_kernel_inputs and what the code
    generator plans; each product keeps its own tiling and epilogue. (One right operand:
    convolutions of one input as NCHW products ``W @ x``, a projection shortcut and the
    block's first 1x1 convolution; one activation by the pieces of a weight cut along its
    rows by ``split_slices``.)"""
    max_inputs = ctx.flags.max_kernel_inputs  # the target's cap (0: none)
    joined, products, refused = 0, 0, []
    for side in (0, 1):  # a shared A first; then a shared B among the products left apart
        by_operand: dict[tuple[int, bool], list[Node]] = {}
        for n in graph.nodes:
            if n.op == "GraphKernel" or n.op in PRODUCT_OPS:
                key = _operand(n, side)
                if key is not None:
                    by_operand.setdefault(key, []).append(n)
        for units in by_operand.values():
            if len(units) < 2:
                continue
            got = _join(graph, ctx, units, max_inputs, refused)
            if got is None:
                continue
            k, members = got
            ctx.log(f"{k.name}: one launch for {len(members)} products of one "
                    f"{('left', 'right')[side]} operand ({', '.join(members)})")
            joined += 1
            products += len(members)
    for r in refused:
        ctx.log(f"matmul_group: not joined: {r}")
    notes = [f"{counted(joined, 'product group')} of {counted(products, 'product')}"
             ] if joined else []
    return PassResult(joined > 0, joined, notes)
