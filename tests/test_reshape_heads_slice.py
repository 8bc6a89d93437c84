"""A slice of the last axis that a Reshape splits into heads (a fused QKV projection sliced
and then viewed as heads: Phi-3's ``qkv[..., q:q + kv].view(B, S, -1, D)``) becomes the heads
split first and a slice of whole heads (``reshape_elim``): exact, and the kernels that read
it generate (on the base tree the code generator found no row split for them and each op
ran as a launch of its own)."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel.interpreter import run_graph
from graphkernel.ir import DType, Graph, TensorType
from graphkernel.torch import launch_counts


def _ctx():
    from graphkernel.api import load_config
    from graphkernel.pipeline import BisectCounter, PassContext

    return PassContext(load_config("", env={}), BisectCounter(), lambda m: None)


def _qkv_heads(begin=64, end=96, heads=2, d=16, width=128):
    g = Graph("qkv_heads")
    x = g.add_input("x", TensorType((2, 16, width), DType.float32))
    s = g.add_node("StridedSlice", [x], {"begin": [begin], "end": [end], "strides": [1],
                                          "axes": [2]}, name="slice").outputs[0]
    v = g.add_node("Reshape", [s], {"shape": [2, 16, heads, d]}, name="view").outputs[0]
    # rotary on halves of each head, as the decoders do
    lo = g.add_node("StridedSlice", [v], {"begin": [0], "end": [d // 2], "axes": [3]},
                    name="lo").outputs[0]
    hi = g.add_node("StridedSlice", [v], {"begin": [d // 2], "end": [d], "axes": [3]},
                    name="hi").outputs[0]
    rot = g.add_node("Concat", [g.add_node("Neg", [hi], name="neg").outputs[0], lo],
                     {"axis": 3}, name="rot").outputs[0]
    cos = g.const(np.linspace(0.5, 1.0, 16 * d, dtype=np.float32).reshape(1, 16, 1, d),
                  name="cos")
    sin = g.const(np.linspace(-1.0, 1.0, 16 * d, dtype=np.float32).reshape(1, 16, 1, d),
                  name="sin")
    out = g.add_node("Add", [g.add_node("Mul", [v, cos], name="mc").outputs[0],
                             g.add_node("Mul", [rot, sin], name="ms").outputs[0]],
                     name="out").outputs[0]
    g.set_outputs([out])
    return g


def _x(width=128):
    return np.random.default_rng(0).standard_normal((2, 16, width)).astype(np.float32)


def _compiled(g):
    return graphkernel.compile(g, "--opt_level=2", env={})


def test_the_heads_are_split_before_the_slice_and_fuse():
    want = run_graph(_qkv_heads(), {"x": _x()})[0]
    res = _compiled(_qkv_heads())
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert sum(launch_counts(res.graph).values()) == 1, launch_counts(res.graph)
    np.testing.assert_allclose(run_graph(res.graph, {"x": _x()})[0], want, rtol=1e-6)


def test_the_rewrite_is_a_slice_of_whole_heads():
    from graphkernel.passes.reshape_elim import reshape_elim

    g = _qkv_heads()
    want = run_graph(g, {"x": _x()})[0]
    assert reshape_elim(g, _ctx()).modified
    g.remove_dead()  # (the slice of the last axis the Reshape read)
    (sl,) = [n for n in g.nodes if n.op == "StridedSlice" and n.attrs["axes"] == [2]]
    assert sl.attrs["begin"] == [4] and sl.attrs["end"] == [6]  # heads 4, 5 of 8
    assert sl.inputs[0].producer.op == "Reshape" and \
        tuple(sl.inputs[0].shape) == (2, 16, 8, 16) and sl.inputs[0].producer.inputs[0].is_input
    np.testing.assert_array_equal(run_graph(g, {"x": _x()})[0], want)


def test_a_slice_off_the_head_boundaries_is_left_as_it_is():
    from graphkernel.passes.reshape_elim import reshape_elim

    for begin, end, heads, d in ((8, 40, 2, 16), (60, 92, 2, 16)):  # starting mid-head
        g = _qkv_heads(begin, end, heads, d)
        assert not reshape_elim(g, _ctx()).modified
