"""pool_into_product: a global average pool read only by a constant-weight product becomes
one product of the flattened values by the weight repeated along K (the mean is linear),
where the weight's growth costs less than the pool's launch."""

import numpy as np

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, ops_of


def _head(hw=(4, 4), classes=10, channels=16, weight_input=False, expanded=False,
          also_pooled=False, relu=True) -> Graph:
    """A classifier head: ReLU(x) pooled over H, W (a ReduceMean, or ``expanded`` a ReduceSum
    and a division as the expanders write it), viewed [B, C], then ``· Wᵀ + b``."""
    g = Graph()
    x = g.add_input("x", TensorType((2, channels, *hw), "float32"))
    y = g.add_node("ReLU", [x]).output if relu else x
    if expanded:
        s = g.add_node("ReduceSum", [y], {"axis": [2, 3], "keep_dims": True}).output
        p = g.add_node("Div", [s, g.const(np.float32(hw[0] * hw[1]))]).output
    else:
        p = g.add_node("ReduceMean", [y], {"axis": [-1, -2], "keep_dims": True}).output
    flat = g.add_node("Reshape", [p], {"shape": [2, channels]}).output
    arr = np.random.default_rng(0).standard_normal((classes, channels)).astype(np.float32)
    w = g.add_input("w", TensorType((classes, channels), "float32")) if weight_input \
        else g.const(arr)
    mm = g.add_node("MatMul", [flat, w], {"transpose_a": False, "transpose_b": True}).output
    out = g.add_node("Add", [mm, g.const(np.ones(classes, np.float32))]).output
    g.set_outputs([out, flat] if also_pooled else [out])
    return g


def _same(before: Graph, after: Graph) -> None:
    feeds = random_inputs(before, 0)
    for want, got in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_pool_is_taken_into_the_products_weight():
    for expanded in (False, True):
        g = _head(expanded=expanded)
        h, res = apply_pass("pool_into_product", g)
        assert res.rewrites == 1, expanded
        assert "ReduceMean" not in ops_of(h) and "ReduceSum" not in ops_of(h)
        mm = next(n for n in h.nodes if n.op == "MatMul")
        assert tuple(mm.inputs[0].shape) == (2, 16 * 16) and \
            tuple(mm.inputs[1].shape) == (10, 16 * 16)
        _same(g, h)


def test_a_weight_input_a_pooled_output_or_a_costly_weight_is_kept():
    """Training (the weight an input), the pooled value also returned, and a head whose
    weight repeated 49 times would cost more than the launch (2048 channels, 1000 classes:
    a ResNet-50 head at 224x224) keep the pool."""
    for g in (_head(weight_input=True), _head(also_pooled=True),
              _head(hw=(7, 7), classes=1000, channels=2048)):
        h, res = apply_pass("pool_into_product", g)
        assert res.rewrites == 0 and "ReduceMean" in ops_of(h)


def test_the_head_is_one_launch_fewer_through_the_pipeline():
    """The pool of a value computed elsewhere (BiT's and PoolFormer's last norm, whose kernel
    does not take it) is a reduction kernel of its own: taken into the product's weight, the
    head is the product alone."""
    import graphkernel
    from graphkernel.codegen.traffic import launches

    g = _head(relu=False)
    on = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=pool_into_product", env={})
    assert len(launches(on.graph)) == len(launches(off.graph)) - 1
    assert not on.report.extra["fallbacks"]
