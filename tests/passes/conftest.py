"""Helpers to run one pass and check it preserved results."""

from __future__ import annotations

import numpy as np

from graphkernel import Graph
from graphkernel.api import load_config
from graphkernel.codegen import targets
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.pipeline import BisectCounter, PassContext
from graphkernel.registry import PASSES, PassResult


def apply_pass(name: str, graph: Graph, flags: str = "") -> tuple[Graph, PassResult]:
    """Run pass ``name`` once on a copy of ``graph``; validate the result."""
    g = graph.copy()
    cfg = load_config(flags, env={})
    ctx = PassContext(cfg, BisectCounter(cfg.bisect_limit), lambda m: None,
                      targets.load(cfg.target))
    ctx.current_pass = name
    result = PASSES[name].fn(g, ctx)
    g.validate()
    return g, result


def assert_same_results(before: Graph, after: Graph, seeds=(0, 1, 2), exact: bool = True,
                        rtol: float = 1e-6, atol: float = 0.0) -> None:
    for seed in seeds:
        feeds = random_inputs(before, seed)
        for a, b in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
            a32, b32 = a.astype(np.float64), b.astype(np.float64)
            if exact:
                np.testing.assert_array_equal(a32, b32)
            else:
                np.testing.assert_allclose(b32, a32, rtol=rtol, atol=atol)


def ops_of(g: Graph) -> list[str]:
    return [n.op for n in g.nodes if n.op != "Constant"]
