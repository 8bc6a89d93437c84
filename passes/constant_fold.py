"""Evaluate nodes whose inputs are all constants."""

from __future__ import annotations

from graphkernel.interpreter import Interpreter
from graphkernel.ir import Graph, Node
from graphkernel.passes.rewrite import const_array, replace_with
from graphkernel.registry import PassResult

_NEVER = {"Constant", "Opaque", "Assign", "GraphKernel"}
GROWTH_LIMIT = 1 << 16  # bytes a fold may add beyond its inputs (no huge broadcasts)


def foldable(node: Node) -> bool:
    if node.op in _NEVER or not node.inputs:
        return False
    if any(const_array(v) is None for v in node.inputs):
        return False
    if not all(v.type.is_static for v in node.outputs):
        return False
    in_bytes = sum(const_array(v).nbytes for v in node.inputs)
    out_bytes = sum(v.type.nbytes for v in node.outputs)
    return out_bytes <= in_bytes + GROWTH_LIMIT


def evaluate(node: Node) -> list:
    """Run one node on its constant inputs with the interpreter's op-by-op semantics."""
    g = Graph("fold")
    ins = [g.const(const_array(v)) for v in node.inputs]
    n = g.add_node(node.op, ins, node.attrs)
    g.set_outputs(n.outputs)
    return Interpreter(g).run({})


def constant_fold(graph, ctx) -> PassResult:
    """Rewrite op(constants...) -> Constant when the result is not much larger than its inputs."""
    folded = 0
    for node in graph.nodes:
        if not foldable(node) or not ctx.should_apply(f"{node.name} ({node.op})", [node]):
            continue
        consts = [graph.add_node("Constant", [], {"value": arr},
                                 name=graph.fresh_name(f"{node.name}_folded"),
                                 origin=node.origin).output for arr in evaluate(node)]
        replace_with(graph, node, consts)
        folded += 1
    return PassResult(folded > 0, folded)
