"""The expand pass's replay: a node equal to one already expanded (op, attributes, input and
output types, which inputs are the same value) gets the recorded expansion again, giving the
graph that expanding it afresh gives; anything else is expanded afresh."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphkernel import Graph, TensorType, registry
from graphkernel.expanders import base
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.passes import expand as expand_pass
from tests.passes.conftest import apply_pass


def layers() -> Graph:
    """Repeated layers with what a template must tell apart: LayerNorms of two shapes and
    dtypes (fp16 widened inside), GeLUs of both approximations, a LayerNorm reading one value
    twice and one reading two, a Softmax, and nodes without an origin of their own."""
    g = Graph("layers")
    x = g.add_input("x", TensorType((2, 8, 32), "float32"))
    h = g.add_input("h", TensorType((4, 16), "float16"))
    w32 = g.const(np.linspace(0.5, 1.5, 32, dtype=np.float32))
    b32 = g.const(np.linspace(-0.1, 0.1, 32, dtype=np.float32))
    w16 = g.const(np.ones(16, np.float16))
    for i in range(4):
        gam = b32 if i % 2 else w32  # i odd: weight and bias are one value
        x = g.add_node("LayerNorm", [x, w32, gam], name=f"l{i}.ln").outputs[0]
        x = g.add_node("GeLU", [x], {"approximate": "tanh" if i < 2 else "none"},
                       name=f"l{i}.gelu").output
        x = g.add_node("Softmax", [x], {"axis": -1}, name=f"l{i}.sm").output
        h = g.add_node("LayerNorm", [h, w16, w16], name=f"l{i}.ln16",
                       origin=() if i == 3 else None).outputs[0]
    g.set_outputs([x, h])
    return g


def described(g: Graph) -> list[tuple]:
    """Everything a node is: op, name, attributes, inputs, outputs with types, origin."""
    out = []
    for n in g.nodes:
        attrs = {k: (v.dtype.str, v.shape, v.tolist()) if isinstance(v, np.ndarray) else v
                 for k, v in n.attrs.items()}
        out.append((n.op, n.name, attrs, [v.name for v in n.inputs],
                    [(v.name, str(v.type)) for v in n.outputs], n.origin))
    return out


@pytest.fixture
def expansions(monkeypatch):
    """Counts the runs of every expander by op."""
    calls: dict[str, int] = {}
    for op, exp in list(registry.EXPANDERS.items()):
        def counting(*a, _fn=exp.fn, _op=op, **kw):
            calls[_op] = calls.get(_op, 0) + 1
            return _fn(*a, **kw)
        monkeypatch.setitem(registry.EXPANDERS, op, dataclasses.replace(exp, fn=counting))
    return calls


def test_replay_gives_the_graph_expanding_each_node_gives(monkeypatch, expansions):
    g = layers()
    replayed, res = apply_pass("expand", g)
    assert res.modified and res.rewrites == 16
    # the expander ran once per distinct signature, not once per node
    assert expansions == {"LayerNorm": 3, "GeLU": 2, "Softmax": 1}
    expansions.clear()
    monkeypatch.setattr(expand_pass, "template_key", lambda node: None)  # no replay
    fresh, _ = apply_pass("expand", g)
    assert expansions == {"LayerNorm": 8, "GeLU": 4, "Softmax": 4}
    assert not {n.op for n in replayed.nodes} & {"LayerNorm", "GeLU", "Softmax"}
    assert described(replayed) == described(fresh)
    feeds = random_inputs(g, 0)
    for a, b in zip(run_graph(g, feeds), run_graph(replayed, feeds), strict=True):
        np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=2e-3,
                                   atol=2e-3)


def test_replayed_nodes_own_their_attributes():
    g, _ = apply_pass("expand", layers())
    consts = [n for n in g.nodes if n.op == "Constant" and n.name.startswith("l")]
    arrays = [n.attrs["value"] for n in consts]
    assert len(arrays) > 8
    assert len({id(a) for a in arrays}) == len(arrays)  # no array shared by two nodes
    lists = [n.attrs["axis"] for n in g.nodes if n.op == "ReduceSum"]
    assert len({id(a) for a in lists}) == len(lists)


def test_template_key_tells_attributes_types_and_shared_inputs_apart():
    g = Graph("k")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    y = g.add_input("y", TensorType((4, 8), "float16"))
    w, v = g.const(np.ones(8, np.float32)), g.const(np.zeros(8, np.float32))
    keys = [base.template_key(n) for n in (
        g.add_node("GeLU", [x], {"approximate": "tanh"}),
        g.add_node("GeLU", [x], {"approximate": "tanh"}),
        g.add_node("GeLU", [x], {"approximate": "none"}),
        g.add_node("GeLU", [y], {"approximate": "tanh"}),
        g.add_node("LayerNorm", [x, w, v]),
        g.add_node("LayerNorm", [x, w, w]),
        g.add_node("LayerNorm", [x, w, v], {"epsilon": 1e-6}),
    )]
    assert keys[0] == keys[1]
    assert len(set(keys[1:])) == 6
    opaque = g.add_node("Constant", [], {"value": np.ones(3, np.float32)})
    assert base.template_key(opaque) is None  # an array attribute is never a key


def test_an_expansion_reading_another_value_is_not_recorded():
    g = Graph("r")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    other = g.add_input("o", TensorType((4, 8), "float32"))
    node = g.add_node("GeLU", [x], {"approximate": "tanh"}, name="act")
    stray = g.add_node("Add", [x, other], name="act/add")
    assert base.record(node, [stray], stray.outputs) is None
    own = g.add_node("Neg", [x], name="act/neg")
    assert base.record(node, [own], own.outputs) is not None
    named = g.add_node("Neg", [x], name="act/negative")
    assert base.record(node, [named], named.outputs) is None  # replay could not name it so
