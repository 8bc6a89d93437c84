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


def _chunked_heads(groups=1, heads=4, perm=(0, 1, 3, 4, 2, 5), side=1) -> Graph:
    """Mamba2's B (or C) before its chunked products: ``[b, L, g, n]`` repeated over the heads
    of each group (``repeat_interleave`` → a BroadcastTo), split into chunks of the sequence
    ``[b, c, l, h, n, 1]``, transposed (heads before the chunk's positions) and merged into the
    product's batch ``[b·c·h, ·, ·]``."""
    b, length, chunk, n = 2, 8, 4, 6
    c = length // chunk
    g = Graph("chunked")
    x = g.add_input("x", TensorType((b, length, groups, n), "float32"))
    t = g.add_node("Reshape", [x], {"shape": [b, length, groups, 1, n]}).output
    t = g.add_node("BroadcastTo", [t], {"shape": [b, length, groups, heads // groups, n]})
    t = g.add_node("Reshape", [t.output], {"shape": [b, c, chunk, heads, n, 1]}).output
    t = g.add_node("Transpose", [t], {"perm": list(perm)}).output
    rows, cols = (n, chunk) if perm == (0, 1, 3, 4, 2, 5) else (chunk, n)
    t = g.add_node("Reshape", [t], {"shape": [b * c * heads, rows, cols]}).output
    a = g.add_input("a", TensorType((b * c * heads, 5, rows), "float32"))
    ins = [a, t] if side == 1 else [t, g.add_input("o", TensorType((b * c * heads, cols, 3),
                                                                    "float32"))]
    g.set_outputs([g.add_node("BatchMatMul", ins).output])
    return g


@pytest.mark.parametrize("groups,perm,side,transposes", [
    (1, (0, 1, 3, 4, 2, 5), 1, 0),  # Bᵀ per head: the transpose folds into transpose_b
    (1, (0, 1, 3, 2, 4, 5), 0, 0),  # C per head: only the size-1 head axis moves (a view)
    # two groups of two heads: the heads axis cut into (group, head in group); the groups
    # move before the chunk's positions, a transpose of the small tensor that stays
    (2, (0, 1, 3, 4, 2, 5), 1, 1),
    (2, (0, 1, 3, 2, 4, 5), 0, 1),
])
def test_a_broadcast_under_views_is_read_in_place(groups, perm, side, transposes):
    """The BroadcastTo moves below the chunk split and the transpose (on the small tensor)
    and the product reads it with a broadcast batch: no broadcast left, and no transpose
    where the one left swaps the matrix axes (the product reads it transposed) or moves
    only size-1 axes."""
    g = _chunked_heads(groups, perm=perm, side=side)
    h, res = apply_pass("product_broadcast", g)
    assert res.rewrites == 1
    assert "BroadcastTo" not in ops_of(h) and ops_of(h).count("Transpose") == transposes
    mm = next(n for n in h.nodes if n.op == "BatchMatMul")
    if not transposes:
        assert mm.attrs.get("transpose_b", False) == (perm == (0, 1, 3, 4, 2, 5))
    _same(g, h)


def test_a_reshape_mixing_broadcast_and_kept_axes_is_left():
    """The heads broadcast and the state axis merged into one axis of the product's rows:
    the broadcast cannot move below that reshape, and the product keeps its operand."""
    g = Graph("mixed")
    x = g.add_input("x", TensorType((2, 8, 1, 6), "float32"))
    t = g.add_node("BroadcastTo", [x], {"shape": [2, 8, 4, 6]}).output
    t = g.add_node("Reshape", [t], {"shape": [2, 8, 24]}).output
    t = g.add_node("Transpose", [t], {"perm": [0, 2, 1]}).output
    a = g.add_input("a", TensorType((2, 5, 24), "float32"))
    g.set_outputs([g.add_node("BatchMatMul", [a, t]).output])
    h, res = apply_pass("product_broadcast", g)
    assert res.rewrites == 0 and "BroadcastTo" in ops_of(h)
    _same(g, h)


@pytest.mark.sim
def test_chunked_heads_products_run_in_the_simulator_without_copies():
    """Compiled whole: the product is the only launch (no broadcast copy, no transpose
    kernel: with two groups the transpose left on the small tensor moves rows only and is
    the product's addressing, codegen/cube/strided.py), and the simulator's numbers match
    the reference."""
    import graphkernel
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.traffic import launches

    for groups, kinds in ((1, ["cube"]), (2, ["cube"])):
        g = _chunked_heads(groups)
        res = graphkernel.compile(g, "--opt_level=2", env={})
        assert [e["kind"] for e in launches(res.graph)] == kinds
        feeds = random_inputs(g, 4)
        got, _ = run_sim(res, feeds)
        np.testing.assert_allclose(got[0], run_graph(g, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("w_shape,transpose_b", [((6, 5), False), ((1, 5, 6), True)])
def test_one_weight_broadcast_over_the_batch_is_a_plain_product(w_shape, transpose_b):
    """``bmm(x, W.expand(B, k, n))`` (a module's weight expanded for a batched product): the
    batch's rows times W, one MatMul, the copies never written."""
    g = Graph()
    a = g.add_input("a", TensorType((4, 7, 6), "float32"))
    w = g.add_input("w", TensorType(w_shape, "float32"))
    full = (4, 5, 6) if transpose_b else (4, 6, 5)
    t = g.add_node("BroadcastTo", [w], {"shape": list(full)}).output
    g.set_outputs([g.add_node("BatchMatMul", [a, t], {"transpose_b": transpose_b}).output])
    h, res = apply_pass("product_broadcast", g)
    assert res.rewrites == 1 and "BroadcastTo" not in ops_of(h)
    assert "MatMul" in ops_of(h) and "BatchMatMul" not in ops_of(h)
    _same(g, h)


def test_a_broadcast_of_batch_axes_of_both_sides_is_left_to_the_general_rule():
    g = Graph()
    a = g.add_input("a", TensorType((1, 7, 6), "float32"))  # a itself broadcast: no rows to merge
    w = g.add_input("w", TensorType((6, 5), "float32"))
    t = g.add_node("BroadcastTo", [w], {"shape": [4, 6, 5]}).output
    g.set_outputs([g.add_node("BatchMatMul", [a, t], {}).output])
    h, res = apply_pass("product_broadcast", g)
    assert "MatMul" not in ops_of(h)
    _same(g, h)
