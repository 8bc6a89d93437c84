"""product_broadcast: a batched product reads a tiled operand (``repeat``/``expand`` then a
reshape merging the batch axes) in place, with a broadcast batch, instead of a copy."""

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import apply_pass, ops_of


def _tiled_product(x_shape, tiled_shape, merged, a_shape, side=1, **attrs) -> Graph:
    """bmm(a, reshape(broadcast(x, tiled_shape), merged)) (operands swapped when side=0)."""
    g = Graph()
    x = g.add_input("x", TensorType(x_shape, "float32"))
    a = g.add_input("a", TensorType(a_shape, "float32"))
    t = g.add_node("BroadcastTo", [x], {"shape": list(tiled_shape)}).output
    t = g.add_node("Reshape", [t], {"shape": list(merged)}).output
    ins = [a, t] if side == 1 else [t, a]
    g.set_outputs([g.add_node("BatchMatMul", ins, attrs).output])
    return g


def _same(before: Graph, after: Graph) -> None:
    feeds = random_inputs(before, 0)
    for want, got in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x,tiled,merged,a,side,attrs", [
    # DeBERTa: position keys [1, H, 1, P, 1, D] repeated over the batch, q [B*H, L, D] @ kᵀ
    ((1, 4, 1, 12, 1, 8), (2, 4, 1, 12, 1, 8), (8, 12, 8), (8, 5, 8), 1,
     {"transpose_b": True}),
    ((1, 3, 6, 5), (4, 3, 6, 5), (12, 6, 5), (12, 7, 6), 1, {}),   # x.expand(B, ...).reshape
    ((3, 1, 6, 5), (3, 4, 6, 5), (12, 6, 5), (12, 5, 7), 0, {}),   # tiled first operand
])
def test_a_tiled_operand_is_read_in_place(x, tiled, merged, a, side, attrs):
    g = _tiled_product(x, tiled, merged, a, side, **attrs)
    h, res = apply_pass("product_broadcast", g)
    assert res.rewrites == 1 and "BroadcastTo" not in ops_of(h)
    mm = next(n for n in h.nodes if n.op == "BatchMatMul")
    assert mm.attrs["transpose_b"] == attrs.get("transpose_b", False)
    _same(g, h)


@pytest.mark.parametrize("x,tiled,merged,a", [
    ((1, 3, 6, 5), (4, 3, 6, 5), (12, 30, 1), (12, 7, 30)),  # the reshape mixes the matrix axes
    ((3, 1, 6, 5), (3, 4, 6, 5), (12, 6, 5), (2, 12, 7, 6)),  # the other operand: more batch axes
])
def test_reshapes_that_are_not_a_batch_merge_are_left(x, tiled, merged, a):
    g = _tiled_product(x, tiled, merged, a)
    h, res = apply_pass("product_broadcast", g)
    assert res.rewrites == 0 and "BroadcastTo" in ops_of(h)


@pytest.mark.sim
def test_the_broadcast_product_runs_in_the_simulator():
    """The cube kernel reads the position keys with a batch stride of 0 (checked by the
    simulator against the reference)."""
    import graphkernel
    from graphkernel.codegen.backend import run_sim

    g = _tiled_product((1, 4, 1, 12, 1, 8), (2, 4, 1, 12, 1, 8), (8, 12, 8), (8, 5, 8),
                       transpose_b=True)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert "BroadcastTo" not in {n.op for n in res.graph.nodes}
    feeds = random_inputs(g, 3)
    got, backend = run_sim(res, feeds)
    assert backend.stats
    np.testing.assert_allclose(got[0], run_graph(g, feeds)[0], rtol=1e-4, atol=1e-5)
