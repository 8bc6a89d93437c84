"""Rewrite a kxk convolution left outside the kernels and the elementwise kernel consuming it
→ one MIX kernel (an implicit-GEMM product with its epilogue), when the code generator can
make it (codegen/cube/conv.py).

A convolution the 1x1 rewrite (conv_matmul) and the window kernels (depthwise ones) did not
take is a cube launch of its own, and its bias, folded batch norm, activation and residual
add are a vector kernel that reads its result back from GM. Here the convolution and that
consumer become one kernel: the vector core builds the im2col panel of a block of output
pixels, the cube core multiplies the weights by it, and the consumer's work runs on each
output tile before it is written. A bias of the convolution becomes an ``Add`` of a
per-channel column in the epilogue. The consumer joins when it is a kernel, or an
elementwise op outside the kernels, whose every op the MIX epilogue runs, and the
convolution's result goes nowhere else. Each fusion is recorded for ``graphkernel explain``
(pattern ``conv_fusion``); a refusal goes to the pass's log with the generator's reason
(the convolution then stays as it was).

The launch saved costs GM traffic the separate launches do not have: the panel (``K = C*kh*kw``
rows per output pixel) is written to a workspace and read back by the cube core, which the
traffic model counts (codegen/cube/conv.py's ``conv_reads``). Two bounds keep that honest:
the joined kernel may move at most ``conv_panel_growth`` percent (5 by default) more GM
bytes than the convolution and its consumer apart (what the ideal kernels move: the input
and weights once, the result written and read back), and the extra bytes must take less
time at the target's HBM rate than the launch they save. A 3x3 convolution's panel is
about 18 times its input, so on activation-dominated layers the convolution stays apart;
where the panel is a subset of the input (a strided 1x1 convolution) it joins. Reading the
input once instead needs the feature map in L1 as NC1HWC0 for the cube core's Load3D,
which an NCHW input in GM does not give (docs/codegen.md, "Convolutions").
"""

from __future__ import annotations

from graphkernel.codegen.cube.conv import conv_reads, is_conv_op, plan_conv, refusal
from graphkernel.codegen.refusal import Unsupported
from graphkernel.fusion import nbytes
from graphkernel.ir import Graph, Node, TensorType, Value
from graphkernel.kernels import build_kernel, next_kernel_name, sole_reader, unfuse
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted
from graphkernel.runlog import Attempt

PATTERN = "conv_fusion"



def _trial(conv: Node, cons: Node, target, growth: int = -1) -> str | None:
    """Why ``conv`` and ``cons`` are not one kernel, or None: the generator refuses them, or
    the joined kernel moves more than ``growth`` percent more GM bytes, or costs more time,
    than the two apart (``_costlier``). The kernel is built
    apart from the graph (which a refusal leaves exactly as it was, names included), its bias
    an input column ``[M, 1, 1]``."""
    sub = Graph("conv_fusion_trial")
    vmap: dict[int, Value] = {}

    def take(v: Value) -> Value:
        if id(v) not in vmap:
            p = v.producer
            if p is not None and p.op == "Constant" and p.attrs["value"].size == 1:
                sub.clone_node(p, vmap)  # (a scalar constant is copied, as build_kernel does)
            else:
                # a fresh name: a trial value of its own (the bias Add's ``add``) may
                # already carry an outer value's name
                vmap[id(v)] = sub.add_input(sub.fresh_name(v.name), v.type)
        return vmap[id(v)]

    y = sub.add_node("Conv2D", [take(conv.inputs[0]), take(conv.inputs[1])],
                     dict(conv.attrs)).outputs[0]
    if len(conv.inputs) == 3:
        m = int(conv.inputs[1].shape[0])
        col = sub.add_input(sub.fresh_name(f"{conv.name}_b"),
                            TensorType((m, 1, 1), conv.inputs[2].dtype))
        y = sub.add_node("Add", [y, col]).outputs[0]
    vmap[id(conv.outputs[0])] = y_conv = y
    if cons.op == "GraphKernel":
        body = cons.subgraph
        for outer, inner in zip(cons.inputs, body.inputs, strict=True):
            vmap[id(inner)] = take(outer)
        for n in body.nodes:
            sub.clone_node(n, vmap)
        outs = [vmap[id(v)] for v in body.outputs]
    else:
        for v in cons.inputs:
            take(v)
        outs = list(sub.clone_node(cons, vmap).outputs)
    sub.set_outputs(outs)
    host = Graph("conv_fusion_trial")
    args = [host.add_input(v.name, v.type) for v in sub.inputs]
    k = host.add_node("GraphKernel", args, {"subgraph": sub, "pattern": PATTERN},
                      name=f"{PATTERN}_{conv.name}")
    try:
        plan_conv(k, target)
    except Unsupported as e:
        return str(e)
    return _costlier(k, y_conv, target, growth)


def _costlier(k: Node, y: Value, target, growth: int = -1) -> str | None:
    """Why the joined kernel moves more GM bytes or costs more time than the convolution and
    its consumer apart, by the target's model, or None. Apart, the convolution reads its
    input and weights once and writes its result, which the consumer reads back (the ideal
    kernels' bytes); joined, the kernel writes and reads back the im2col panel
    (``conv_reads``) and saves one launch. ``growth`` (``conv_panel_growth``, -1: none)
    bounds the extra bytes as a percent of the bytes apart, so the model's fused/ideal GM
    bytes stay within it; the launch must also save more time than the panel costs (at
    large images the panel dominates)."""
    from graphkernel.codegen import targets
    from graphkernel.flags import DEFAULT_TARGET

    spec = target if target is not None else targets.load(DEFAULT_TARGET)
    moved = conv_reads(k, spec)
    if moved is None:
        return None
    body = k.subgraph
    apart = (sum(nbytes(v) for v in body.inputs) + sum(nbytes(v) for v in body.outputs)
             + 2 * nbytes(y))
    extra_us = (sum(moved) - apart) / (spec.hbm_gbps * 1e3)
    if growth >= 0 and sum(moved) * 100 > apart * (100 + growth):
        return (f"the im2col panel makes the kernel move {sum(moved) / 1e6:.3f} MB, "
                f"{sum(moved) / apart:.2f}x the {apart / 1e6:.3f} MB of the convolution and "
                f"its consumer apart (more than conv_panel_growth={growth}%)")
    if extra_us <= spec.launch_overhead_us:
        return None
    return (f"the im2col panel moves {(sum(moved) - apart) / 1e6:.2f} MB more than the "
            f"convolution and its consumer apart ({extra_us:.1f} us at the target's HBM rate, "
            f"more than the {spec.launch_overhead_us:g} us launch it saves)")


def _split_bias(g: Graph, conv: Node) -> list[Node]:
    """``conv`` without its bias and the nodes adding the bias back (a per-channel column
    ``[M, 1, 1]``): [the new convolution, the bias's reshape if any, the Add]."""
    x, w, b = conv.inputs
    m = int(w.shape[0])
    bare = add_like(g, conv, "Conv2D", [x, w], dict(conv.attrs)).producer
    arr = const_array(b)
    if arr is not None:
        col = g.const(arr.reshape(m, 1, 1), name=g.fresh_name(f"{conv.name}_b"))
        extra: list[Node] = []
    else:
        col = add_like(g, conv, "Reshape", [b], {"shape": [m, 1, 1]})
        extra = [col.producer]
    y = add_like(g, conv, "Add", [bare.outputs[0], col])
    g.replace_all_uses(conv.outputs[0], y)
    g.erase_node(conv)
    g.toposort()
    return [bare, *extra, y.producer]


def _join_bias(g: Graph, nodes: list[Node], b: Value) -> Node:
    """Undo ``_split_bias`` (``nodes`` back in the graph): the convolution with its bias."""
    bare, add = nodes[0], nodes[-1]
    conv = add_like(g, bare, "Conv2D", [*bare.inputs, b], dict(bare.attrs)).producer
    g.replace_all_uses(add.outputs[0], conv.outputs[0])
    col = add.inputs[1].producer
    for n in reversed(nodes):
        if n.graph is not None:
            g.erase_node(n)
    if col is not None and col.op == "Constant" and not col.outputs[0].uses:
        g.erase_node(col)
    g.toposort()
    return conv


def conv_fusion(graph: Graph, ctx) -> PassResult:
    """Each kxk convolution outside the kernels with its elementwise consumer as one MIX
    kernel, when the generator takes them and the im2col panel keeps the kernel's GM bytes
    within conv_panel_growth percent of the two apart."""
    log = ctx.analyses.fusion_attempts
    fused = 0
    for conv in [n for n in graph.nodes if is_conv_op(n)]:
        cons = sole_reader(conv) if conv.graph is not None else None
        if cons is None:  # (nothing to join: it stays a cube launch)
            continue
        names = [conv.name, cons.name]
        why = refusal(conv)
        if why is not None:
            ctx.log(f"{PATTERN}: {' + '.join(names)} refused: Conv2D of {why}")
            continue
        if not ctx.should_apply(f"{PATTERN}: {conv.name}", [conv]):
            continue
        why = _trial(conv, cons, ctx.target, ctx.flags.conv_panel_growth)
        if why is not None:  # (in the pass's log: conv_fusion is no fusion pattern with
            ctx.log(f"{PATTERN}: {' + '.join(names)} refused: {why}")  # refusal codes)
            continue
        saved = 2 * nbytes(conv.outputs[0])  # the result's round trip through GM
        bias = conv.inputs[2] if len(conv.inputs) == 3 else None
        pattern = cons.attrs["pattern"] if cons.op == "GraphKernel" else ""
        mine = _split_bias(graph, conv) if bias is not None else [conv]
        theirs = [n for n in unfuse(graph, cons) if n.op != "Constant"] \
            if cons.op == "GraphKernel" else [cons]
        nodes = [*mine, *theirs]
        k = build_kernel(graph, nodes, next_kernel_name(ctx.analyses, nodes, PATTERN), PATTERN)
        try:
            plan_conv(k, ctx.target)
        except Unsupported as e:
            back = [n for n in unfuse(graph, k) if n.op != "Constant"]
            mine, rest = back[:len(mine)], back[len(mine):]
            if pattern:
                build_kernel(graph, rest, next_kernel_name(ctx.analyses, rest, pattern),
                             pattern)
            if bias is not None:
                _join_bias(graph, mine, bias)
            log.append(Attempt(PATTERN, names, names, 0, "rejected", str(e)))
            ctx.log(f"{PATTERN}: {' + '.join(names)} refused: {e}")
            continue
        log.append(Attempt(PATTERN, names, names, saved, "fused", ""))
        fused += 1
    if fused:
        graph.toposort()
    return PassResult(fused > 0, fused, summary=f"{counted(fused, 'convolution')} fused with "
                                               "their epilogues")
