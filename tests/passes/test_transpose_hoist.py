"""A last-axis transpose taken above the elementwise work computing its operand when the
transposes at the region's leaves cancel, fold, are shared or become slices; refused when it
would leave as many transposes as it removes, change what a value outside sees, or read a row
operand as a column."""

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from tests.passes.conftest import MAMBA_LAYER, apply_pass, assert_same_results, ops_of

BLD = [0, 2, 1]  # [B, L, D] <-> [B, D, L]


def _t(g, x, perm=BLD, name=None):
    return g.add_node("Transpose", [x], {"perm": perm}, name=name).output


def _gate_block():
    """A state-space block's output gate as traced: the projection moved to [B, 2D, L] and
    split, the scan result moved there too, gated, and moved back to [B, L, D]."""
    g = Graph()
    proj = g.add_input("proj", TensorType((2, 8, 32), "float32"))   # [B, L, 2D]
    y = g.add_input("y", TensorType((2, 8, 16), "float32"))         # [B, L, D]
    xc = g.add_input("xc", TensorType((2, 16, 8), "float32"))       # [B, D, L]
    halves = g.add_node("Split", [_t(g, proj, name="to_bdl")], {"axis": 1, "sizes": [16, 16]})
    x_part, gate = halves.outputs
    xt = _t(g, xc, name="xc_bld")  # already computed for another consumer (a projection)
    s = g.add_node("Sigmoid", [gate]).output
    act = g.add_node("Mul", [gate, s]).output
    yd = g.add_node("Add", [_t(g, y, name="y_bdl"),
                            g.add_node("Mul", [xc, g.const(np.full((16, 1), 0.5,
                                                                   np.float32))]).output])
    out = _t(g, g.add_node("Mul", [yd.output, act]).output, name="back")
    g.set_outputs([out, x_part, xt])
    return g


def test_the_gate_runs_in_the_projection_layout():
    g = _gate_block()
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 1
    names = {n.name for n in h.nodes if n.op == "Transpose"}
    # the root and the scan result's transpose are gone; the split's and the shared one stay
    assert names == {"to_bdl", "xc_bld"}
    gate = h.outputs[0].producer
    ops = ops_of(h)
    assert ops.count("Slice") == 1 and ops.count("Transpose") == 2
    assert gate.op == "Mul" and list(gate.outputs[0].shape) == [2, 8, 16]
    assert_same_results(g, h)


def test_operand_used_outside_the_region_is_not_moved():
    """The product is also a graph output: its layout is seen outside, the root stays."""
    g = Graph()
    a = g.add_input("a", TensorType((2, 4, 8), "float32"))
    b = g.add_input("b", TensorType((2, 8, 4), "float32"))
    p = g.add_node("Mul", [_t(g, a), b]).output
    g.set_outputs([_t(g, p), p])
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 0 and ops_of(h).count("Transpose") == 2


def test_refused_when_as_many_transposes_stay_at_the_leaves():
    """T(a + b) of two plain inputs: two transposes at the leaves for one removed."""
    g = Graph()
    a = g.add_input("a", TensorType((2, 4, 8), "float32"))
    b = g.add_input("b", TensorType((2, 4, 8), "float32"))
    g.set_outputs([_t(g, g.add_node("Add", [a, b]).output)])
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 0 and ops_of(h) == ["Add", "Transpose"]


def test_refused_when_a_row_operand_would_be_read_as_a_column():
    """x * c with c along the last axis: after the move c would be a column of the rows."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 8, 4), "float32"))
    c = g.const(np.arange(8, dtype=np.float32))
    g.set_outputs([_t(g, g.add_node("Mul", [_t(g, x), c]).output)])
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 0


def test_a_scan_and_broadcast_operands_move_with_the_root():
    """h[t] = exp(a[t]) * h[t-1] + b[t] along L in [B, D, L, N], read as [B, L, N, D]: the
    scan runs along axis 1 there; dt's transpose cancels, the constant is folded."""
    g = Graph()
    dt = g.add_input("dt", TensorType((2, 6, 4), "float32"))          # [B, L, D]
    u = g.add_input("u", TensorType((2, 6, 4, 3), "float32"))         # [B, L, D, N]
    a = g.const(-np.arange(12, dtype=np.float32).reshape(4, 1, 3) / 10)  # [D, 1, N]
    d4 = g.add_node("ExpandDims", [_t(g, dt)], {"axis": [3]}).output  # [B, D, L, 1]
    da = g.add_node("Exp", [g.add_node("Mul", [d4, a]).output]).output
    db = g.add_node("Mul", [d4, _t(g, u, [0, 2, 1, 3])]).output
    hs = g.add_node("Scan", [da, db], {"axis": 2, "combine": "linear"}).output
    g.set_outputs([_t(g, hs, [0, 2, 3, 1])])                         # [B, L, N, D]
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 1
    scan = next(n for n in h.nodes if n.op == "Scan")
    assert scan.attrs["axis"] == 1
    assert not any(n.op == "Transpose" and n.inputs[0].name == "dt" for n in h.nodes)
    assert_same_results(g, h, exact=False, rtol=1e-5)


def _readout(keep_dims: bool = True) -> Graph:
    """A selective scan's readout as the product pass leaves it: the state [B, D, L, N]
    moved to [B, L, D, N], multiplied by C [B, L, 1, N] and summed over N, the result moved
    back to [B, D, L] for the gate."""
    g = Graph()
    hs = g.add_input("hs", TensorType((2, 6, 5, 4), "float32"))     # [B, D, L, N]
    c = g.add_input("c", TensorType((2, 5, 4), "float32"))          # [B, L, N]
    row = g.add_node("Reshape", [c], {"shape": [2, 5, 1, 4]}).output
    prod = g.add_node("Mul", [_t(g, hs, [0, 2, 1, 3], name="to_bld"), row]).output
    red = g.add_node("ReduceSum", [prod], {"axis": [-1], "keep_dims": keep_dims}).output
    y = g.add_node("Reshape", [red], {"shape": [2, 5, 6]}).output   # [B, L, D]
    g.set_outputs([_t(g, y, name="back")])
    return g


def test_a_reduction_moves_with_the_root_and_the_state_transposes_cancel():
    g = _readout()
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 1
    assert "Transpose" not in ops_of(h)
    red = next(n for n in h.nodes if n.op == "ReduceSum")
    assert red.attrs["axis"] == [3] and list(red.inputs[0].shape) == [2, 6, 5, 4]
    assert_same_results(g, h, exact=False, rtol=1e-5)


def test_a_reduction_that_drops_its_axes_is_not_taken():
    h, res = apply_pass("transpose_hoist", _readout(keep_dims=False))
    assert res.rewrites == 0 and ops_of(h).count("Transpose") == 2


@pytest.mark.slow
@pytest.mark.e2e
@MAMBA_LAYER
@pytest.mark.usefixtures("fresh_torch")
def test_a_mamba_layer_built_by_the_library_loses_its_layout_transposes(mamba_layer):
    """transformers' MambaModel (one layer, from its config, library defaults): the four
    transposes around its projections (in_proj's and dt_proj's results to channels-first,
    x_proj's and out_proj's channels-first operands) go into the products, and the readout's
    transpose back to channels-first (above its sum, cancelling the state's) is taken by
    transpose_hoist; outputs match eager. Without the two passes, one of the five is done in
    UB by the kernel computing its operand (a small value), and in_proj's channels-first
    result is a transpose, not a product whose Split split_slices takes into it; and the
    readout, summed in the scan's layout only after transpose_hoist, joins the scan's kernel
    with its skip term and gate (scan_readout, scan_readout_epilogue): seven launches fewer.
    (The compile with library defaults is the session's, tests/passes/conftest.py.)"""
    import torch

    off = mamba_layer.run("--disable_pass=transpose_hoist,product_transpose")
    counts = {}
    for flags, run in (("", mamba_layer.default), ("off", off)):
        torch.testing.assert_close(run.out, mamba_layer.want, rtol=1e-4, atol=1e-5)
        counts[flags] = sum(run.stats["launches"].values())
    assert counts[""] == counts["off"] - 7, counts


@pytest.mark.slow
@pytest.mark.e2e
@MAMBA_LAYER
@pytest.mark.usefixtures("fresh_torch")
def test_a_mamba_layers_readout_keeps_the_scan_layout(mamba_layer):
    """transformers' Mamba (one layer, from its config with a non-default expansion, kernel
    and state size, library defaults, compiled through torch.compile): the readout ``h @ C``
    (a batch-folded product of width one) is summed in the scan's layout, so no transpose
    moving the last axis is left as a launch of its own; outputs match eager. (FalconMamba
    shares the mixer; benchmarks/RESULTS.md has both. The compile is the session's,
    tests/passes/conftest.py.)"""
    import torch

    run = mamba_layer.default
    torch.testing.assert_close(run.out, mamba_layer.want, rtol=1e-4, atol=1e-5)
    assert run.graphs and run.stats["graphs"] == 1
    moved = [n.name for g in run.graphs for n in g.nodes if n.op == "Transpose"
             and list(n.attrs["perm"])[-1] != n.inputs[0].type.rank - 1]
    assert moved == []


def test_a_last_axis_move_behind_a_trailing_axis_of_one_is_taken_up():
    """A chunked scan's mask: G [b, c, h, l, s] and L [b, h, c, l, s] both moved to
    [b, c, l, s, h], multiplied, given a trailing axis of 1 and moved back heads first: the
    root keeps its literal last axis (the 1) but moves h, the last axis with rows; taken up,
    G's transpose cancels and L's becomes a move of outer axes only."""
    g = Graph()
    gm = g.add_input("g", TensorType((2, 2, 3, 4, 4), "float32"))
    lm = g.add_input("l", TensorType((2, 3, 2, 4, 4), "float32"))
    m = g.add_node("Mul", [_t(g, gm, [0, 1, 3, 4, 2]), _t(g, lm, [0, 2, 3, 4, 1])]).output
    m = g.add_node("ExpandDims", [m], {"axis": [5]}).output
    g.set_outputs([_t(g, m, [0, 1, 4, 2, 3, 5], name="root")])
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 1, res.notes
    (t,) = [n for n in h.nodes if n.op == "Transpose"]
    assert t.inputs[0].name == "l" and list(t.attrs["perm"]) == [0, 2, 1, 3, 4]
    assert_same_results(g, h)


def _capped_gates(read_elsewhere=False):
    """Per-head gates as traced: a projection x·Wᵀ ([B·L, H], W constant) seen as [B, L, H],
    soft-capped (c·tanh(g / c)), then moved to [B, H, L]. ``read_elsewhere``: the projection's
    result is also a graph output."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 8, 32), "float32"))
    w = g.const(np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32))
    c = g.const(np.float32(15.0))
    p = g.add_node("MatMul", [g.add_node("Reshape", [x], {"shape": [16, 32]}).output, w],
                   {"transpose_a": False, "transpose_b": True}).output
    v = g.add_node("Reshape", [p], {"shape": [2, 8, 4]}).output
    capped = g.add_node("Mul", [g.add_node("Tanh", [g.add_node("Div", [v, c]).output]).output,
                                c]).output
    g.set_outputs([_t(g, capped, name="heads"), *([p] if read_elsewhere else [])])
    return g


def test_a_transpose_behind_a_products_epilogue_becomes_the_transposed_product():
    """T(c·tanh(x·Wᵀ / c)) = c·tanh((x·Wᵀ)ᵀ / c), and (x·Wᵀ)ᵀ = W·xᵀ is a product the cube
    reads the other way round: the transpose is taken above the soft cap onto the product,
    where it folds (no transpose left); the same numbers."""
    g = _capped_gates()
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 1 and "into products" in res.notes[0]
    assert "Transpose" not in ops_of(h) and "BatchMatMul" in ops_of(h)
    assert list(h.outputs[0].shape) == [2, 4, 8]
    assert_same_results(g, h, exact=False, rtol=1e-5, atol=1e-6)  # (the sums' order)


def test_a_product_read_elsewhere_keeps_the_transpose():
    """The product's result is a graph output too: the transposed product would not replace
    it, so the leaf would be a transpose of its own; nothing is moved."""
    g = _capped_gates(read_elsewhere=True)
    h, res = apply_pass("transpose_hoist", g)
    assert res.rewrites == 0 and ops_of(h).count("Transpose") == 1


def test_the_capped_gates_are_one_launch_through_the_pipeline():
    """Through the pipeline: one MIX kernel (the transposed product with the soft cap as its
    epilogue), where the product's kernel and the transpose were two launches."""
    import graphkernel
    from graphkernel.codegen.traffic import launches

    res = graphkernel.compile(_capped_gates(), "", env={})
    assert [e["kind"] for e in launches(res.graph)] == ["mix"]
    assert not res.report.extra["fallbacks"]
