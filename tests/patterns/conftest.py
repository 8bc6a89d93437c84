"""Build small graphs and look at what the split model made of them."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import Interpreter, random_inputs


class G:
    """A terse graph builder for pattern tests: ``g.op("Exp", x, name="e")``."""

    def __init__(self, name="t"):
        self.g = Graph(name)

    def input(self, name, shape, dtype="float32"):
        return self.g.add_input(name, TensorType(tuple(shape), dtype))

    def op(self, op, *ins, name=None, **attrs):
        return self.g.add_node(op, list(ins), attrs, name=name).outputs[0]

    def const(self, value, dtype="float32"):
        return self.g.const(np.asarray(value, dtype))

    def out(self, *vals):
        self.g.set_outputs(list(vals))
        return self.g


def fuse(graph: Graph, flags: str = ""):
    """Compile at opt_level 2 (no simplification, so the hand-built shape is what fuses; no
    codegen, so the fusion decisions are what the test sees)."""
    res = graphkernel.compile(graph, "--opt_level=2 --disable_pass=cse,arith_simplify,"
                                     "constant_fold,reshape_elim,transpose_elim,codegen "
                                     f"{flags}", env={})
    feeds = random_inputs(graph, 0)
    for a, b in zip(Interpreter(graph, "float64").run(feeds),
                    Interpreter(res.graph, "float64").run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)
    return res


def kernels(res) -> list[set[str]]:
    """Each kernel as the set of its member node names."""
    return [{m.name for m in n.subgraph.nodes if m.op != "Constant"}
            for n in res.graph.nodes if n.op == "GraphKernel"]


def attempts(res, pattern: str, verdict: str | None = None):
    return [a for a in res.analyses.fusion_attempts
            if a.pattern == pattern and (verdict is None or a.verdict == verdict)]


def reasons(res, pattern: str) -> list[str]:
    return [a.reason for a in attempts(res, pattern, "rejected")]
