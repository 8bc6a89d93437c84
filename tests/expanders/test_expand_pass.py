"""The expand pass: the effective list and its flags, validators, bisect, origins."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.api import load_config
from graphkernel.errors import FlagError
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.passes.expand import default_expand_ops, expand_list


def model() -> Graph:
    g = Graph("m")
    x = g.add_input("x", TensorType(("b", 32), "float32"))
    s = g.add_input("s", TensorType((4, "t"), "float32"))
    gam = g.const(np.ones(32, np.float32))
    y = g.add_node("LayerNorm", [x, gam, gam], name="ln1").outputs[0]
    y = g.add_node("GeLU", [y], name="act").output
    y = g.add_node("Tanh", [y], name="th").output
    m = g.add_node("ReduceMean", [s], {"axis": [-1]}, name="mean_t").output
    g.set_outputs([y, m])
    return g


def compiled(flags: str):
    return graphkernel.compile(model(), f"--opt_level=1 --disable_pass=cluster,split {flags}",
                               env={})


def remaining(res) -> set[str]:
    return {n.op for n in res.graph.nodes}


def test_default_list_covers_composites_not_optional_ones():
    d = set(default_expand_ops())
    assert {"GeLU", "LayerNorm", "Softmax", "Adam", "ReduceMean"} <= d
    assert "Tanh" not in d and "Erf" not in d


def test_default_expansion_and_validator_keeps_symbolic_mean():
    res = compiled("")
    ops = remaining(res)
    assert "LayerNorm" not in ops and "GeLU" not in ops and "Tanh" in ops
    assert "ReduceMean" in ops  # reduced dim 't' is symbolic: kept
    notes = next(p for p in res.report.passes if p.name == "expand").notes
    assert "kept ReduceMean 'mean_t': reduced dims ['t'] must be static" in notes
    assert any(n.startswith("expanded LayerNorm 'ln1' into") for n in notes)
    feeds = random_inputs(model(), 0, {"b": 3, "t": 5})
    for a, b in zip(run_graph(model(), feeds), run_graph(res.graph, feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-5)  # the graph still runs


@pytest.mark.parametrize("flags,present,absent", [
    ("--enable_expand_ops=Tanh", {"ReduceMean"}, {"Tanh", "GeLU"}),
    ("--disable_expand_ops=Gelu", {"GeLU", "Tanh"}, {"LayerNorm"}),   # an alias works
    ("--enable_expand_ops_only=LayerNorm", {"GeLU", "Tanh"}, {"LayerNorm"}),
    ("--enable_expand_ops_only=LayerNorm --disable_expand_ops=LayerNorm", {"GeLU"},
     {"LayerNorm"}),  # *_only ignores the other two
    ("--disable_pass=expand", {"LayerNorm", "GeLU"}, set()),
])
def test_flags_adjust_the_list(flags, present, absent):
    ops = remaining(compiled(flags))
    assert present <= ops and not (absent & ops)


def test_effective_list_function():
    cfg = load_config("--enable_expand_ops=Erf --disable_expand_ops=GeLU", env={})
    lst = expand_list(cfg)
    assert "Erf" in lst and "GeLU" not in lst and "LayerNorm" in lst


def test_unknown_expand_op_suggests():
    with pytest.raises(FlagError, match="unknown op 'LayerNrom'; did you mean 'LayerNorm'"):
        load_config("--disable_expand_ops=LayerNrom", env={})


def test_each_expansion_is_one_bisect_application():
    lines: list[str] = []
    graphkernel.compile(model(), "--opt_level=1 --print_bisect --bisect_limit=1", env={},
                        log=lines.append)
    exp = [ln for ln in lines if " expand on " in ln]
    assert exp[0] == "BISECT: running (1) expand on ln1 (LayerNorm)"
    assert exp[1] == "BISECT: NOT running (2) expand on act (GeLU)"


def test_expanded_nodes_carry_the_composite_origin():
    res = compiled("")
    ln_nodes = [n for n in res.graph.nodes if n.name.startswith("ln1/")]
    assert ln_nodes and all(n.origin == ("ln1",) for n in ln_nodes)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_a_softmax_followed_by_axes_of_one_is_fused_as_a_row_softmax(op):
    """ConvBERT's ``softmax(k.reshape(-1, K, 1), dim=1)``: the axis of 1 after the normalized
    one dropped, the expansion's reductions are row reductions of the last axis: one kernel
    with the product, as over ``[-1, K]``, where the reductions over axis 1 were three."""
    from graphkernel.torch import launch_counts

    def graph(shape, axis) -> Graph:
        g = Graph("m")
        x = g.add_input("x", TensorType((6, 16), "float32"))
        w = g.const(np.random.default_rng(0).standard_normal((16, 9)).astype(np.float32))
        y = g.add_node("MatMul", [x, w]).output
        y = g.add_node("Reshape", [y], {"shape": list(shape)}).output
        g.set_outputs([g.add_node(op, [y], {"axis": axis}).output])
        return g

    counts = []
    for shape, axis in (((6, 9, 1), 1), ((6, 9), -1)):
        g = graph(shape, axis)
        res = graphkernel.compile(g, "--opt_level=2", env={})
        feeds = random_inputs(g, 0)
        np.testing.assert_allclose(run_graph(res.graph, feeds)[0], run_graph(g, feeds)[0],
                                   rtol=1e-6, atol=1e-6)
        counts.append(launch_counts(res.graph))
    assert counts[0] == counts[1] and sum(counts[0].values()) == 1, counts
