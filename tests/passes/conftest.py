"""Helpers to run one pass and check it preserved results."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest

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


# transformers' Mamba with a non-default expansion, kernel and state size (one layer): the
# split_slices and transpose_hoist tests read the same compile of it (library defaults)
MAMBA_CONFIG = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 24, "state_size": 4,
                "expand": 3, "conv_kernel": 3}
MAMBA_LAYER = pytest.mark.xdist_group("mamba_layer")  # one worker compiles it once


class MambaRun(NamedTuple):
    out: object      # the compiled function's output
    stats: dict      # graphkernel.torch's stats of the compile (and its one run)
    graphs: list     # every graph graphkernel.compile returned (after the pipeline)


class MambaLayer(NamedTuple):
    model: object
    ids: object
    want: object                         # eager's last hidden state
    run: Callable[[str], MambaRun]       # torch.compile with these flags, run once on ids
    default: MambaRun                    # run(""), made once per session


@pytest.fixture(scope="session")
def mamba_layer():
    """MAMBA_CONFIG's MambaModel, its eager output and its torch.compile with library defaults
    (strict, from a reset dynamo), compiled once for the tests that read it."""
    pytest.importorskip("transformers")
    import torch
    import transformers as T

    import graphkernel
    import graphkernel.torch as gt

    real = graphkernel.compile
    compiled: list = []

    def keep(*a, **k):
        res = real(*a, **k)
        compiled.append(res.graph)
        return res

    torch.manual_seed(0)
    model = T.MambaModel(T.MambaConfig(**MAMBA_CONFIG)).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))

    def run(flags: str) -> MambaRun:
        with pytest.MonkeyPatch.context() as mp:
            for var in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "MS_DEV_GRAPH_KERNEL_FLAGS"):
                mp.delenv(var, raising=False)
            mp.setenv("GRAPHKERNEL_TORCH_STRICT", "1")
            mp.setattr(graphkernel, "compile", keep)
            torch._dynamo.reset()
            gt.reset_stats()
            compiled.clear()
            with torch.no_grad():
                out = torch.compile(lambda x: model(input_ids=x).last_hidden_state,
                                    backend="graphkernel", options={"flags": flags})(ids)
            got = MambaRun(out, gt.stats(), list(compiled))
            torch._dynamo.reset()
            return got

    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
    return MambaLayer(model, ids, want, run, run(""))
