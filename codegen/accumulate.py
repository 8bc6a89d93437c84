"""Reductions accumulate in fp32 inside kernels, whatever precision the kernel computes in.

A sum of many fp16 terms accumulated in fp16 loses the small terms once the running sum is
large (a row of 1,024 values near 1 already rounds every addend to a multiple of 0.5), so a
kernel that keeps fp16 (``enable_low_precision``, or opt_level 1 where ``promote_precision``
does not run) would sum far less accurately than the op-by-op run. As TorchInductor and AKG
do, the accumulation is widened: ``ReduceSum/ReduceProd`` of a fp16/bf16 value becomes
``Cast(fp32) -> reduce in fp32 -> Cast back``, so only the result is rounded to the
reduction's dtype. Elementwise math keeps its precision. Max and min are exact in any
precision and stay as they are.

The rewrite is on the kernel's body in the graph, so the compiled graph, its op-by-op run
and the generated code all state the same arithmetic; GM traffic does not change (the casts
are inside the kernel).
"""

from __future__ import annotations

from graphkernel.ir import DType, Graph, Node, Value

LOW = (DType.float16, DType.bfloat16)
ACCUMULATING = frozenset({"ReduceSum", "ReduceProd"})


def needs_widening(n: Node) -> bool:
    """A reduction that would accumulate in fp16/bf16."""
    return n.op in ACCUMULATING and n.inputs[0].dtype in LOW


def widen_reductions(kernel: Node) -> Graph | None:
    """The kernel's body with every fp16/bf16 sum/product accumulated in fp32 and rounded
    back to its dtype; None when no reduction inside needs it."""
    sub = kernel.subgraph
    if not any(needs_widening(n) for n in sub.nodes):
        return None
    new = Graph(sub.name)
    vmap: dict[int, Value] = {id(v): new.add_input(v.name, v.type, v.mutable)
                              for v in sub.inputs}
    wide: dict[int, Value] = {}  # one widening per value, however many reductions read it
    for n in sub.nodes:
        if not needs_widening(n):
            new.clone_node(n, vmap)
            continue
        x = vmap[id(n.inputs[0])]
        if id(x) not in wide:
            wide[id(x)] = new.add_node("Cast", [x], {"dtype": "float32"},
                                       name=new.fresh_name(f"{n.name}_acc"),
                                       origin=n.origin).output
        acc = new.add_node(n.op, [wide[id(x)]], dict(n.attrs), name=n.name,
                           origin=n.origin).output
        vmap[id(n.outputs[0])] = new.add_node(
            "Cast", [acc], {"dtype": n.outputs[0].dtype.value},
            name=new.fresh_name(f"{n.name}_round"), origin=n.origin).output
    new.set_outputs([vmap[id(v)] for v in sub.outputs], sub.output_names)
    return new
