"""Regions of equal structure are split once and the decisions replayed on the others: the
result must be what deciding every region afresh gives (bisect_limit turns replay off)."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.passes import split as split_pass
from graphkernel.structure import region_signature


def layers(n: int, output_of: int | None = None, skip_of: int | None = None) -> Graph:
    """``n`` equal layers (LayerNorm, matmul + bias, tanh GeLU, residual add, then a CumSum
    that ends the layer's fusable region); layer
    ``output_of`` also returns its GeLU, layer ``skip_of`` feeds its bias add to the next."""
    g = Graph("layers")
    x = g.add_input("x", TensorType(("b", 32), "float32"))
    extra, skip = [], None
    rng = np.random.default_rng(0)
    for i in range(n):
        ones = g.const(np.ones(32, np.float32))
        h = g.add_node("LayerNorm", [x, ones, ones], name=f"l{i}.ln").outputs[0]
        w = g.const(rng.standard_normal((32, 32)).astype(np.float32))
        h = g.add_node("MatMul", [h, w], name=f"l{i}.mm").output
        h = g.add_node("Add", [h, g.const(np.zeros(32, np.float32))], name=f"l{i}.bias").output
        if skip is not None:
            h = g.add_node("Add", [h, skip], name=f"l{i}.skip").output
        skip = h if i == skip_of else None
        a = g.add_node("GeLU", [h], {"approximate": "tanh"}, name=f"l{i}.gelu").output
        if i == output_of:
            extra.append(a)
        x = g.add_node("Add", [x, a], name=f"l{i}.res").output
        x = g.add_node("CumSum", [x], {"axis": 1}, name=f"l{i}.cumsum").output  # not fusable
    g.set_outputs([x, *extra])
    return g


def decisions(res):
    kernels = [(n.name, n.attrs["pattern"], n.origin, str(n.subgraph))
               for n in res.graph.nodes if n.op == "GraphKernel"]
    attempts = [(a.pattern, a.areas, a.nodes, a.score, a.verdict, a.reason)
                for a in res.analyses.fusion_attempts]
    applied = [(a.pass_name, a.description, a.origin) for a in res.applications]
    return kernels, attempts, applied


@pytest.mark.parametrize("variant", [{}, {"output_of": 2}, {"skip_of": 1}])
@pytest.mark.parametrize("level", [1, 3])
def test_replayed_regions_decide_as_fresh_ones(variant, level, monkeypatch):
    g = layers(5, **variant)
    calls = []
    decide = split_pass.decide
    monkeypatch.setattr(split_pass, "decide", lambda *a, **k: calls.append(1) or decide(*a, **k))
    # (the scan pass would make the CumSum separating the layers a fusable Scan)
    flags = f"--opt_level={level} --disable_pass=codegen,scan"
    replayed = graphkernel.compile(g, flags, env={})
    n_regions = len(replayed.analyses.cluster.region_sizes)
    assert not replayed.analyses.cluster.regions  # consumed by the split pass
    assert len(calls) < n_regions  # equal layers were decided once
    fresh_calls = len(calls)
    calls.clear()
    fresh = graphkernel.compile(g, f"{flags} --bisect_limit=1000000", env={})
    assert len(calls) == n_regions  # a bisect limit decides every region afresh
    assert decisions(replayed)[:2] == decisions(fresh)[:2]
    assert [a[1:] for a in decisions(replayed)[2]] == [a[1:] for a in decisions(fresh)[2]]
    apps = replayed.applications  # replayed rewrites are numbered as asked one by one
    assert [(a.number, a.pass_name, a.applied) for a in apps] == \
        [(a.number, a.pass_name, a.applied) for a in fresh.applications]
    assert len(apps) == replayed.report.bisect_applications == apps[-1].number
    assert apps[len(apps) // 2] == list(apps)[len(apps) // 2]
    log = replayed.analyses.fusion_attempts  # replayed runs are made into attempts when read
    every = list(log)
    assert len(log) == len(every) == len(fresh.analyses.fusion_attempts)
    assert log.fused == sum(a.verdict == "fused" for a in every) > 0
    assert [log[i] for i in (0, len(every) // 2, -1)] == \
        [every[0], every[len(every) // 2], every[-1]]
    assert log[2:5] == every[2:5]
    with pytest.raises(IndexError):
        log[len(every)]
    if variant:  # the odd layer (and its neighbour) are decided apart from the others
        assert fresh_calls > len(layers_signatures(layers(5)))


def layers_signatures(g: Graph) -> set:
    res = graphkernel.compile(g, "--opt_level=1 --disable_pass=split,codegen", env={})
    outs = {id(v) for v in res.graph.outputs}
    return {region_signature(r, outs) for r in res.analyses.cluster.regions}


def test_signature_sees_what_patterns_read():
    """A graph output, or one more user outside the region, makes a region different."""
    plain = layers_signatures(layers(4))
    assert len(plain) < 4
    assert len(layers_signatures(layers(4, output_of=1))) > len(plain)
    assert len(layers_signatures(layers(4, skip_of=1))) > len(plain)


def test_no_replay_with_plugin_patterns():
    from graphkernel.patterns.base import Pattern, all_patterns

    cfg = graphkernel.load_config("--opt_level=2", env={})
    assert split_pass.replayable(cfg, all_patterns())
    plugin = Pattern("mine", 1, "fwd", "depth", 1, lambda model, a: None, "")
    assert not split_pass.replayable(cfg, [*all_patterns(), plugin])
    limited = graphkernel.load_config("--opt_level=2 --bisect_limit=3", env={})
    assert not split_pass.replayable(limited, all_patterns())


def test_signature_tells_one_outside_user_from_two():
    """Patterns count a value's distinct users: two uses by one outside node are not two
    outside users."""
    def region(two_users: bool):
        g = Graph("g")
        x = g.add_input("x", TensorType((4, 8), "float32"))
        r = g.add_node("Relu", [x], name="r")
        if two_users:  # the same ops and input slots, by two nodes
            outs = [g.add_node("Concat", [r.output, x], {"axis": 0}).output,
                    g.add_node("Concat", [x, r.output], {"axis": 0}).output]
        else:
            outs = [g.add_node("Concat", [r.output, r.output], {"axis": 0}).output]
        g.set_outputs(outs)
        return region_signature([r], set())

    assert region(True) != region(False)
    assert region(True) == region(True)
