"""split_slices: a Split of the last axis read only by vector work becomes one slice per
part (read in place by the kernels); a part read by a product keeps the Split, unless it
splits a product by a constant weight: then one product per part on its rows of the
weight."""

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import random_inputs, run_graph
from tests.passes.conftest import MAMBA_LAYER, apply_pass, ops_of


def _split(axis=2, product=False) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType((2, 6, 12), "float32"))
    a, b = g.add_node("Split", [x], {"axis": axis, "sizes": [4, 8] if axis == 2 else [2, 4]}
                      ).outputs
    ea = g.add_node("Exp", [g.add_node("Reshape", [a], {"shape": [12, -1]}).output]).output
    if product:
        w = g.const(np.ones((b.shape[-1], 3), np.float32))
        eb = g.add_node("MatMul", [g.add_node("Reshape", [b], {"shape": [-1, b.shape[-1]]})
                                   .output, w]).output
    else:
        eb = g.add_node("ReduceSum", [b], {"axis": [2]}).output
    g.set_outputs([ea, eb])
    return g


def _same(before: Graph, after: Graph) -> None:
    feeds = random_inputs(before, 0)
    for want, got in zip(run_graph(before, feeds), run_graph(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_split_read_by_vector_work_becomes_slices():
    g = _split()
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 1 and "Split" not in ops_of(h)
    assert ops_of(h).count("StridedSlice") == 2
    _same(g, h)


def test_a_split_read_by_a_product_or_of_another_axis_is_kept():
    for g in (_split(product=True), _split(axis=1)):
        h, res = apply_pass("split_slices", g)
        assert res.rewrites == 0 and "Split" in ops_of(h)
        _same(g, h)


def test_a_split_whose_part_is_a_graph_output_is_kept():
    """A training forward returns the parts for the backward graph: stored, each slice
    would be a launch of its own, more than the one Split."""
    g = _split()
    a = next(n for n in g.nodes if n.op == "Split").outputs[0]
    g.set_outputs([*g.outputs, a])
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 0 and "Split" in ops_of(h)


def _product_split(left_weight=False, weight_input=False, also_read=False) -> Graph:
    """x·Wᵀ (W [16, 8] constant, read transposed) viewed [6, 16] -> [2, 3, 16], split along
    its columns into [4, 12]: the first part read by a product, the second by vector work.
    ``left_weight``: W·xᵀ instead ([2, 16, 3], split along its rows M); ``weight_input``: W
    a graph input (a training graph); ``also_read``: the product's result read beside the
    Split."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 3, 8), "float32"))
    arr = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    w = g.add_input("w", TensorType((16, 8), "float32")) if weight_input else g.const(arr)
    if left_weight:
        y = g.add_node("BatchMatMul", [w, x], {"transpose_a": False, "transpose_b": True}
                       ).output
        axis, view = 1, y
    else:
        y = g.add_node("BatchMatMul", [x, w], {"transpose_a": False, "transpose_b": True}
                       ).output
        flat = g.add_node("Reshape", [y], {"shape": [6, 16]}).output
        axis, view = 2, g.add_node("Reshape", [flat], {"shape": [2, 3, 16]}).output
    a, b = g.add_node("Split", [view], {"axis": axis, "sizes": [4, 12]}).outputs
    w2 = g.const(np.random.default_rng(4).standard_normal((4, 5)).astype(np.float32))
    pa = g.add_node("MatMul", [g.add_node("Reshape", [a], {"shape": [-1, 4]}).output, w2]
                    ).output if not left_weight else g.add_node("Exp", [a]).output
    pb = g.add_node("Exp", [b]).output
    outs = [pa, pb]
    if also_read:
        outs.append(g.add_node("Neg", [y]).output)
    g.set_outputs(outs)
    return g


def test_a_split_of_a_constant_weights_product_becomes_products_on_its_rows():
    """(x·Wᵀ)[..., a:b] = x·W[a:b]ᵀ: the Split a product reads is taken into the product, one
    per part, the views repeated on each; the same numbers (each element the same sum)."""
    g = _product_split()
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 1 and "Split" not in ops_of(h)
    assert ops_of(h).count("BatchMatMul") == 2 and "a product on its rows" in res.notes[0]
    mms = [n for n in h.nodes if n.op == "BatchMatMul"]
    assert sorted(tuple(n.outputs[0].shape) for n in mms) == [(2, 3, 4), (2, 3, 12)]
    _same(g, h)


def test_a_split_along_the_rows_of_a_left_weight_is_cut_too():
    g = _product_split(left_weight=True)
    split = next(n for n in g.nodes if n.op == "Split")
    conv_like = g.add_node("MatMul", [g.add_node("Reshape", [split.outputs[0]],
                                                 {"shape": [-1, 3]}).output,
                                      g.const(np.ones((3, 2), np.float32))]).output
    g.set_outputs([*g.outputs, conv_like])
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 1 and "Split" not in ops_of(h)
    mms = [n for n in h.nodes if n.op == "BatchMatMul"]
    assert sorted(tuple(n.outputs[0].shape) for n in mms) == [(2, 4, 3), (2, 12, 3)]
    _same(g, h)


def test_a_split_of_a_weight_input_or_of_a_result_read_elsewhere_is_kept():
    """A weight that is a graph input (training) would need a copy per slice; a result read
    beside the Split would need the whole product as well."""
    for g in (_product_split(weight_input=True), _product_split(also_read=True)):
        h, res = apply_pass("split_slices", g)
        assert res.rewrites == 0 and "Split" in ops_of(h)
        assert ops_of(h).count("BatchMatMul") == 1


@pytest.mark.slow
@pytest.mark.e2e
@MAMBA_LAYER
@pytest.mark.usefixtures("fresh_torch")
def test_a_mamba_layer_built_by_the_library_keeps_no_split(mamba_layer):
    """transformers' MambaModel (one layer, from its config with a non-default expansion,
    kernel and state size; library defaults; torch.compile): ``in_proj``'s result split
    between the convolution and the gate, and ``x_proj``'s between ``dt_proj`` and the scan,
    are taken into their products; the pieces launch as one product group each, so the
    layer launches twice fewer than with the Splits; outputs match eager. (The compile with
    library defaults is the session's, tests/passes/conftest.py.)"""
    import torch

    off = "--disable_pass=split_slices"
    runs = {"": mamba_layer.default, off: mamba_layer.run(off)}
    for r in runs.values():
        torch.testing.assert_close(r.out, mamba_layer.want, rtol=1e-4, atol=1e-5)
    counts = {flags: sum(r.stats["launches"].values()) for flags, r in runs.items()}
    ops = [n.op for g in runs[""].graphs for n in g.nodes]
    pats = [n.attrs.get("pattern") for g in runs[""].graphs for n in g.nodes]
    assert "Split" not in ops and pats.count("matmul_group") == 2
    assert counts[""] == counts[off] - 2


def test_the_cut_products_launch_as_one_group_at_every_level():
    """Through the pipeline at opt levels 2 and 3: the pieces are one product-group kernel
    (at level 3 the parallel fusion, which would put them in one kernel the generator refuses
    and splits again, leaves products to matmul_group); no fallback."""
    import graphkernel

    g = _product_split()
    for level in (2, 3):
        res = graphkernel.compile(g, f"--opt_level={level}", env={})
        pats = [n.attrs["pattern"] for n in res.graph.nodes if n.op == "GraphKernel"]
        assert "matmul_group" in pats and not res.report.extra["fallbacks"], (level, pats)


def _normalised_split(weight_input=False, normalised=True) -> Graph:
    """FalconMamba's ``x_proj``: a channels-first activation ``[2, 8, 6]`` by a constant
    weight repeated per batch element (``[2, 12, 8]``, read transposed), its ``[2, 6, 12]``
    result split along its columns into ``[4, 4, 4]``, each part RMS-normalised over its
    columns (``normalised``; else each part only exponentiated)."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 8, 6), "float32"))
    arr = np.random.default_rng(5).standard_normal((12, 8)).astype(np.float32)
    w = g.add_input("w", TensorType((2, 12, 8), "float32")) if weight_input else \
        g.const(np.stack([arr, arr]))
    y = g.add_node("BatchMatMul", [x, w], {"transpose_a": True, "transpose_b": True}).output
    outs = []
    for part in g.add_node("Split", [y], {"axis": 2, "sizes": [4, 4, 4]}).outputs:
        if not normalised:
            outs.append(g.add_node("Exp", [part]).output)
            continue
        sq = g.add_node("Mul", [part, part]).output
        ms = g.add_node("ReduceSum", [sq], {"axis": [2], "keep_dims": True}).output
        ms = g.add_node("Div", [ms, g.const(np.float32(4.0))]).output
        r = g.add_node("Rsqrt", [g.add_node("Add", [ms, g.const(np.float32(1e-6))]).output]
                       ).output
        outs.append(g.add_node("Mul", [part, r]).output)
    g.set_outputs(outs)
    return g


def test_parts_normalised_along_the_cut_axis_are_cut_into_products():
    """Read in place as slices, each part's norm is a vector kernel of its own beside the
    product; cut along the rows of the (batched) constant weight, each norm can run in its
    product's epilogue: one product per part, the same numbers."""
    g = _normalised_split()
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 1 and "Split" not in ops_of(h) and "StridedSlice" not in ops_of(h)
    mms = [n for n in h.nodes if n.op == "BatchMatMul"]
    assert [tuple(n.inputs[1].shape) for n in mms] == [(2, 4, 8)] * 3
    _same(g, h)


def test_parts_not_normalised_or_of_a_weight_input_stay_slices():
    """Elementwise readers share one kernel reading the slices in place; a weight that is a
    graph input is not cut (a copy per slice)."""
    for g in (_normalised_split(normalised=False), _normalised_split(weight_input=True)):
        h, res = apply_pass("split_slices", g)
        assert res.rewrites == 1 and "Split" not in ops_of(h)
        assert ops_of(h).count("BatchMatMul") == 1 and ops_of(h).count("StridedSlice") == 3
        _same(g, h)


@pytest.mark.sim
@pytest.mark.slow
def test_normalised_parts_run_in_their_products_epilogues_in_the_simulator():
    """Through the pipeline: the three products with their norms are one product-group
    launch (a cube launch and three norm kernels without the cut); the simulator matches the
    reference."""
    import graphkernel
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.traffic import launches

    g = _normalised_split()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    pats = [n.attrs["pattern"] for n in res.graph.nodes if n.op == "GraphKernel"]
    assert pats == ["matmul_group"] and not res.report.extra["fallbacks"]
    assert len(launches(res.graph)) == 1
    feeds = random_inputs(g, 0)
    sim, backend = run_sim(res, feeds)
    assert not backend.unscheduled
    for got, want in zip(sim, run_graph(g, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _clipped_qkv(bound=None, also_read=False) -> Graph:
    """DBRX's fused QKV projection clipped before its Split: ``x·Wᵀ`` ([32, 128], W constant)
    viewed [2, 16, 128], ``Minimum(Maximum(y, -8), 8)`` (``bound``: the Maximum's other
    operand instead of -8), split into Q [.., 64], K and V [.., 32], each viewed as heads of
    16 and moved to [B, N, S, D] (graph outputs, as a cache keeps K and V); ``also_read``:
    the clipped value read beside the Split."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 16, 64), "float32"))
    w = g.const(np.random.default_rng(6).standard_normal((128, 64)).astype(np.float32))
    y = g.add_node("MatMul", [g.add_node("Reshape", [x], {"shape": [32, 64]}).output, w],
                   {"transpose_b": True}).output
    y = g.add_node("Reshape", [y], {"shape": [2, 16, 128]}).output
    low = g.const(np.float32(-8.0)) if bound is None else bound(g)
    y = g.add_node("Maximum", [y, low]).output
    c = g.add_node("Minimum", [y, g.const(np.float32(8.0))]).output
    outs = []
    for part in g.add_node("Split", [c], {"axis": 2, "sizes": [64, 32, 32]}).outputs:
        heads = g.add_node("Reshape", [part], {"shape": [2, 16, -1, 16]}).output
        outs.append(g.add_node("Transpose", [heads], {"perm": [0, 2, 1, 3]}).output)
    if also_read:
        outs.append(g.add_node("Exp", [c]).output)
    g.set_outputs(outs)
    return g


def test_a_split_of_a_clipped_product_is_cut_with_the_clip_on_each_part():
    """Elementwise work whose other operands are single values (a clamp's bounds) computes
    each element of a part from the same element of the whole: it is repeated on each
    product, ``clip(x·Wᵀ)[..., a:b] = clip(x·W[a:b]ᵀ)``, exactly."""
    g = _clipped_qkv()
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 1 and "Split" not in ops_of(h), ops_of(h)
    assert ops_of(h).count("MatMul") == 3 and ops_of(h).count("Maximum") == 3
    assert ops_of(h).count("Minimum") == 3
    feeds = random_inputs(g, 0)  # (the interpreter's sums over K = 64 in another order)
    for want, got in zip(run_graph(g, feeds), run_graph(h, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_clip_by_a_per_column_bound_or_read_elsewhere_keeps_the_split():
    """A bound of one value per column would have to be cut too (not done); the clipped
    whole read beside the Split would be computed twice."""
    def per_column(g):
        return g.const(np.linspace(-9, -7, 128).astype(np.float32))

    for g in (_clipped_qkv(bound=per_column), _clipped_qkv(also_read=True)):
        h, res = apply_pass("split_slices", g)
        assert res.rewrites == 0 and "Split" in ops_of(h)


def test_the_clipped_parts_are_one_product_group_with_the_clip_in_its_epilogues():
    """Through the pipeline: the product with its clip, the Split and three transposes were
    5 launches; the cut products run their clips in their epilogues, each storing its part
    in the heads' view ([2, 16, N, 16]: the product's rows split, nothing in the kernel
    reads it), one group kernel, and the transposes: 4. Simulated as the reference."""
    import graphkernel
    from graphkernel.codegen.backend import run_sim
    from graphkernel.torch import launch_counts

    g = _clipped_qkv()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 4, launch_counts(res.graph)
    pats = [n.attrs["pattern"] for n in res.graph.nodes if n.op == "GraphKernel"]
    assert "matmul_group" in pats and not res.report.extra["fallbacks"], pats
    (group,) = [n for n in res.graph.nodes if n.op == "GraphKernel"
                and n.attrs["pattern"] == "matmul_group"]
    assert [n.op for n in group.attrs["subgraph"].nodes].count("Minimum") == 3
    feeds = random_inputs(g, 0)
    sim, backend = run_sim(res, feeds)
    assert not backend.unscheduled
    for got, want in zip(sim, run_graph(g, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _fused_qkv_moved(parts=(1, 1, 1), interleaved=False) -> Graph:
    """A fused QKV projection x·Wᵀ ([2·5, 3·2·4] from W [24, 8] constant) seen as [2, 5, 3,
    2, 4] (parts, heads, head size), moved to [3, 2, 2, 5, 4] (each part's heads before its
    positions) and split into its parts along axis 0, each read by a product.
    ``interleaved``: seen as [2, 5, 2, 3, 4] instead (heads outside the parts), so a part's
    columns are no contiguous range of the weight's rows."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 5, 8), "float32"))
    w = g.const(np.random.default_rng(5).standard_normal((24, 8)).astype(np.float32))
    flat = g.add_node("Reshape", [x], {"shape": [10, 8]}).output
    y = g.add_node("MatMul", [flat, w], {"transpose_a": False, "transpose_b": True}).output
    if interleaved:
        v = g.add_node("Reshape", [y], {"shape": [2, 5, 2, 3, 4]}).output
        perm = [3, 0, 2, 1, 4]
    else:
        v = g.add_node("Reshape", [y], {"shape": [2, 5, 3, 2, 4]}).output
        perm = [2, 0, 3, 1, 4]
    t = g.add_node("Transpose", [v], {"perm": perm}).output
    outs = g.add_node("Split", [t], {"axis": 0, "sizes": list(parts)}).outputs
    k = g.const(np.random.default_rng(6).standard_normal((4, 3)).astype(np.float32))
    g.set_outputs([g.add_node("BatchMatMul", [o, k], {}).output for o in outs])
    return g


def test_a_split_of_a_moved_fused_projection_is_cut_into_products():
    """The parts of a fused QKV projection moved before the batch (through a view cutting
    the projection's columns into parts of heads, and a transpose) are contiguous ranges of
    the weight's rows: one product per part on its rows, the view and the transpose repeated
    on each; the same numbers. Parts of unequal size too."""
    for parts in ((1, 1, 1), (2, 1)):
        g = _fused_qkv_moved(parts)
        h, res = apply_pass("split_slices", g)
        assert res.rewrites == 1 and "Split" not in ops_of(h), parts
        assert ops_of(h).count("MatMul") == len(parts) and ops_of(h).count("Transpose") == \
            len(parts)
        got = sorted(tuple(n.outputs[0].shape) for n in h.nodes if n.op == "Transpose")
        assert got == sorted((p, 2, 2, 5, 4) for p in parts)
        _same(g, h)


def test_a_split_of_interleaved_parts_is_kept():
    """Heads outside the parts ([.., heads, parts, head size]): a part is every third run of
    4 columns, no range of the weight's rows; the Split stays."""
    g = _fused_qkv_moved(interleaved=True)
    h, res = apply_pass("split_slices", g)
    assert res.rewrites == 0 and "Split" in ops_of(h)


@pytest.mark.sim
def test_the_moved_parts_launch_as_one_product_group():
    """Through the pipeline: the three parts' products, each writing its heads moved
    (codegen/cube/strided.py), are one product-group launch; no Split, no Transpose launch;
    the simulator's results are the interpreter's."""
    from graphkernel.bisect import Evaluator
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.traffic import launches
    from tests.codegen.cases import Case, compile_cases

    case = Case("qkv_moved", _fused_qkv_moved(), flags="")
    library = compile_cases([case])
    res = case.result
    kinds = [(e["kind"], e["op"], e.get("pattern", "")) for e in launches(res.graph)]
    groups = [k for k in kinds if k[2] == "matmul_group"]
    assert len(groups) == 1 and not any(k[1] in ("Split", "Transpose") for k in kinds), kinds
    assert not res.report.extra["fallbacks"]
    feeds = case.feeds({})
    got, _ = run_sim(res, feeds, library=library)
    judged = Evaluator(case.graph, feeds).judge(got)
    assert not judged.bad, judged.reason
