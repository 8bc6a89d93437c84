"""A mixture of experts' token routing through torch.compile: the sort of the expert ids
(a TopK of the whole axis), torch.histc and its running count (the groups' ends) as
comparisons with the bin edges, each against eager; what the mappings decline runs through
torch with its reason; and a MoE decoder's fused attentions counted per attention layer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]


def _compiled(fn, *args):
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend="graphkernel")(*args)
    return got, want, gt.stats()


def test_sort_is_a_topk_of_the_axis_ties_and_nan_as_torch():
    x = torch.tensor([[3.0, 1.0, float("nan"), 1.0, -0.0, 0.0, 2.0, 1.0],
                      [5.0, 5.0, -1.0, float("inf"), 5.0, -2.0, 0.5, 5.0]])

    def f(x):
        a, i = torch.sort(x)  # ascending, last axis
        b, j = torch.sort(x, dim=0, descending=True)
        c, k = torch.sort(x, stable=True, descending=True)
        return a, i, b, j, c, k

    got, want, s = _compiled(f, x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    assert s["launches"]["opaque"] == 0 and not s["fallbacks"], s


def test_expert_ids_sorted_stably_where_the_permutation_is_observed():
    ids = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 3, 0, 1, 2])

    def f(ids):
        v, p = torch.sort(ids, stable=True)
        return v, p

    got, want, s = _compiled(f, ids)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert s["launches"]["opaque"] == 0, s


def test_histc_bins_edges_outside_values_and_nan_as_torch():
    x = torch.tensor([0.0, 0.75, 0.7499999, 1.5, 3.0, 3.0000002, -1e-7, float("nan"), 2.9999,
                      -5.0, 1.2, 2.25, float("inf"), 0.3])

    def f(x):
        return torch.histc(x, bins=4, min=0, max=3), torch.histc(x * 2, bins=7, min=-1, max=6)

    got, want, s = _compiled(f, x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert s["launches"]["opaque"] == 0 and not s["fallbacks"], s


def test_running_count_of_a_histogram_is_one_comparison_kernel_and_a_sum():
    # transformers' grouped-MM routing: sorted expert ids, histc as floats, running count
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 5, (10, 2), generator=g)

    def f(ids):
        v, _ = torch.sort(ids.reshape(-1))
        counts = torch.histc(v.float(), bins=6, min=0, max=5)
        return torch.cumsum(counts, dim=0, dtype=torch.int32)

    got, want, s = _compiled(f, ids)
    assert got.dtype == torch.int32 and torch.equal(got, want)
    # TopK, the int64 -> float cast, and one kernel: the comparisons, the sum and its int32
    # cast (the reduce_output pattern; the store truncates to int32): no scan, no op through
    # torch
    assert s["launches"] == {"vector": 3, "cube": 0, "mix": 0, "extern": 0, "opaque": 0}, s


def test_what_the_mappings_decline_runs_through_torch_with_its_reason():
    x = torch.tensor([0.5, 2.0, 1.0, 7.0])

    def f(x, b):
        # histc over the data's own range (min == max), a sort of booleans
        return torch.histc(x, bins=3), torch.sort(b)[1]

    b = torch.tensor([True, False, True, False])
    with torch.no_grad():
        want = f(x, b)
        got = torch.compile(f, backend="graphkernel")(x, b)
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])
    why = gt.stats()["fallbacks"]
    assert "data's own range" in why["aten.histc.default"], why
    assert "booleans" in why["aten.sort.default"], why


def test_a_moe_decoder_has_one_fused_attention_per_attention_layer():
    """The router's softmax over experts is no attention layer, and the grouped products
    (extern launches too) are no attention: the count is by op."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from export_models import attention_layers
    from moe_ssm_models import builders

    build, inputs = builders()["mixtral"]
    model, args = build(), inputs()
    layers = attention_layers(model, args)
    got, want, s = _compiled(model, *args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    assert layers == 2  # 2 decoder layers; 2 router softmaxes not counted
    assert s["attentions"] == layers, s
    assert s["launches"]["extern"] > s["attentions"]  # the grouped products
    assert s["launches"]["opaque"] == 0, s


class SpanWeightsAndScores(torch.nn.Module):
    """ConvBERT's two softmaxes: the span-convolution weights over the kernel axis of
    [B·S·H, k, 1], then attention scores over their last axis (the keys)."""

    def forward(self, w, s):
        return torch.softmax(w, dim=1).sum() + torch.softmax(s, dim=-1).sum() + \
            s.softmax(3).sum()


def test_attention_layers_count_softmaxes_over_the_scores_last_axis_only():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from export_models import attention_layers

    args = (torch.randn(32, 9, 1), torch.randn(2, 4, 8, 8))
    assert attention_layers(SpanWeightsAndScores(), args) == 2


# ------------------------------------------------------------- the routing rewrite
N, K, E, H, F = 12, 2, 4, 16, 24


def _one_by_one(logits):
    """A router that picks its experts one at a time (PhiMoE's sparsemixer form): the
    largest, then the largest of the rest; its weights a softmax each."""
    v1, i1 = torch.max(logits, dim=-1, keepdim=True)
    rest = logits.scatter(-1, i1, float("-inf"))
    v2, i2 = torch.max(rest, dim=-1, keepdim=True)
    w = torch.cat([torch.softmax(logits, -1).gather(-1, i1),
                   torch.softmax(rest, -1).gather(-1, i2)], dim=-1)
    return w, torch.cat([i1, i2], dim=-1)


def _routing(exclusive: bool = False, self_added: bool = False, picked: bool = False):
    """A MoE layer's experts as transformers' grouped-MM path writes them (sort, rows and
    weights by expert, histc + cumsum, the inverse permutation, the per-token sum);
    ``exclusive``: the groups' starts instead of their ends (other products, no running
    count); ``self_added``: the sum added to a value computed from it (read twice);
    ``picked``: the experts picked one by one (``_one_by_one``), no TopK of K."""
    def route(x, logits, up, down):
        if picked:
            tw, ti = _one_by_one(logits)
        else:
            tw, ti = torch.topk(torch.softmax(logits, -1), K, dim=-1)
            tw = tw / tw.sum(-1, keepdim=True)
        sw, ids = tw.reshape(-1), ti.reshape(-1)
        ids_g, perm = torch.sort(ids)
        xg, wg = x[perm // K], sw[perm]
        counts = torch.histc(ids_g.float(), bins=E, min=0, max=E - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        if exclusive:
            offs = offs - counts.to(torch.int32)
        h = torch.ops.transformers.grouped_mm_fallback(xg, up, offs)
        y = torch.ops.transformers.grouped_mm_fallback(torch.nn.functional.silu(h), down, offs)
        y = y * wg.unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        total = y[inv].view(N, K, -1).sum(dim=1)
        if self_added:
            return total + torch.tanh(total)
        return x + total  # the residual too
    return route


def _routing_data(seed=0):
    pytest.importorskip("transformers.integrations.moe")
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, H, generator=g), torch.randn(N, E, generator=g),
            torch.randn(E, H, F, generator=g) * 0.3, torch.randn(E, F, H, generator=g) * 0.3)


def _ops(fn, args):
    import graphkernel

    res = []
    orig = graphkernel.compile

    def capture(*a, **k):
        res.append(orig(*a, **k))
        return res[-1]

    try:
        graphkernel.compile = capture
        got, want, s = _compiled(fn, *args)
    finally:
        graphkernel.compile = orig
    ops = [n.op for r in res for n in r.graph.nodes]
    return got, want, s, ops


def test_sort_based_routing_becomes_the_vendor_routing_operators():
    got, want, s, ops = _ops(_routing(), _routing_data())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for op in ("MoeInitRouting", "MoeComputeExpertTokens", "MoeFinalizeRouting"):
        assert ops.count(op) == 1, ops
    assert "ScatterElements" not in ops and "Gather" not in ops and "FloorDiv" not in ops
    # the router's softmax, TopK, the weights' normalisation and the ids' int32 cast as the
    # gating operator; 3 routing + 2 grouped products (externs); silu; the residual is the
    # finalize's skip
    assert ops.count("MoeGatingTopKSoftmax") == 1 and "TopK" not in ops, ops
    assert s["launches"] == {"vector": 1, "cube": 0, "mix": 0, "extern": 6, "opaque": 0}, s


def test_experts_picked_one_by_one_are_routed_by_the_vendor_operators():
    """Ids concatenated from TopKs over the experts (each names one of the E experts)."""
    got, want, s, ops = _ops(_routing(picked=True), _routing_data(8))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for op in ("MoeInitRouting", "MoeComputeExpertTokens", "MoeFinalizeRouting"):
        assert ops.count(op) == 1, ops
    # the picks as the gating operator's ids (the sort, both TopKs and the mask are gone)
    assert "ScatterElements" not in ops and "TopK" not in ops, ops
    assert ops.count("MoeGatingTopKSoftmax") == 1, ops


def _picked(fill: float = float("-inf"), jitter: bool = False):
    """Experts picked one by one, the ids to int32 (as the routing operators read them);
    ``fill``: what masks the first pick out; ``jitter``: PhiMoE's sparsemixer, each pick's
    softmax over the scores near its max only."""
    def near(scores, top, logits):
        factor = logits.abs().clamp(min=top)
        return scores.masked_fill((top - logits) / factor > 2 * 0.01, float("-inf"))

    def pick(logits):
        v1, i1 = torch.max(logits, dim=-1, keepdim=True)
        rest = logits.scatter(-1, i1, fill)
        v2, i2 = torch.max(rest, dim=-1, keepdim=True)
        g1 = near(logits, v1, logits) if jitter else logits
        g2 = near(rest, v2, logits) if jitter else rest
        w = torch.cat([torch.softmax(g1, -1).gather(-1, i1),
                       torch.softmax(g2, -1).gather(-1, i2)], dim=-1)
        return w * 2.0, torch.cat([i1, i2], dim=-1).to(torch.int32)
    return pick


def _tied_logits(seed: int) -> torch.Tensor:
    """Router scores with ties: two experts sharing the max, the second max shared, a row of
    equal scores, scores a jitter threshold apart."""
    x = torch.randn(N, E, generator=torch.Generator().manual_seed(seed))
    x[0] = torch.tensor([1.0, 3.0, 3.0, 0.5])
    x[1] = torch.tensor([2.0, 1.0, 2.0, 2.0])
    x[2] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    x[3] = torch.tensor([1.0, 0.995, -1.0, 0.999])
    return x


@pytest.mark.parametrize("jitter", [False, True])
def test_experts_picked_one_by_one_are_the_gating_ids_and_vector_kernels(jitter):
    """Each pick's max, its expert (the lowest holding the max, as torch's max), the mask
    of the next pick's scores and the gathers of the pick's weights are vector ops; the ids
    are the gating operator's top 2 (renorm 1: a TopK of the scores)."""
    got, want, s, ops = _ops(_picked(jitter=jitter), (_tied_logits(3),))
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1], want[1])
    assert ops.count("MoeGatingTopKSoftmax") == 1, ops
    assert "TopK" not in ops and "ScatterElements" not in ops and \
        "GatherElements" not in ops, ops
    # the gating operator and the weights' vector kernels (the TopKs, the scatter, the
    # gathers, the ids' Concat and cast as launches of their own: 10, 11 with the masks)
    assert s["launches"]["extern"] == 1 and s["launches"]["opaque"] == 0, s
    assert sum(s["launches"].values()) <= (7 if jitter else 6), s


def test_picks_masked_with_a_finite_fill_or_ids_kept_int64_are_left_as_they_are():
    """A pick masked out with a finite number is no top-k (a fill can be below the scores);
    ids read as int64 are no gating operator's int32 ids."""
    def kept(logits):
        v1, i1 = torch.max(logits, dim=-1, keepdim=True)
        v2, i2 = torch.max(logits.scatter(-1, i1, float("-inf")), dim=-1, keepdim=True)
        return v1 + v2, torch.cat([i1, i2], dim=-1)

    for fn in (_picked(fill=-1e4), kept):
        got, want, s, ops = _ops(fn, (_tied_logits(5),))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        assert ops.count("TopK") == 2 and "MoeGatingTopKSoftmax" not in ops, ops


def _sort_routed(x, ids, w, up, down):
    """Tokens ``x`` through the experts ``ids`` [N, K] picked, weighted by ``w`` [N, K], the
    way a sort-based MoE layer routes them (sort, gather, grouped products, inverse)."""
    ids_g, perm = torch.sort(ids.reshape(-1))
    offs = torch.cumsum(torch.histc(ids_g.float(), bins=E, min=0, max=E - 1), dim=0,
                        dtype=torch.int32)
    y = torch.ops.transformers.grouped_mm_fallback(x[perm // K], up, offs)
    y = torch.ops.transformers.grouped_mm_fallback(y, down, offs)
    y = y * w.reshape(-1)[perm].unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.size(0))
    return y[inv].view(N, K, -1).sum(dim=1)


def test_ids_concatenated_from_other_values_are_not_routed():
    """A Concat of a TopK's ids with ids of no router: not every id names an expert."""
    def route(x, logits, up, down, extra):
        _, i1 = torch.max(logits, dim=-1, keepdim=True)
        ids = torch.cat([i1, extra], dim=-1)
        return _sort_routed(x, ids, torch.softmax(logits, -1)[:, :K], up, down)

    extra = torch.randint(0, E, (N, 1), generator=torch.Generator().manual_seed(9))
    got, want, s, ops = _ops(route, (*_routing_data(9), extra))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "MoeInitRouting" not in ops, ops


def test_a_moe_decoder_built_from_its_config_routes_by_the_vendor_operators():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from moe_ssm_models import builders

    build, inputs = builders()["olmoe"]
    got, want, s, ops = _ops(build(), inputs())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    assert ops.count("MoeFinalizeRouting") == 2 and ops.count("MoeInitRouting") == 2, ops
    assert ops.count("MoeGatingTopKSoftmax") == 2, ops
    assert s["launches"]["opaque"] == 0 and sum(s["launches"].values()) <= 36, s


def test_a_sum_read_twice_is_routed_without_a_skip():
    got, want, s, ops = _ops(_routing(self_added=True), _routing_data(4))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert ops.count("MoeFinalizeRouting") == 1, ops  # routed; the Add and tanh read it


def test_routing_is_refused_where_the_offsets_are_no_running_count():
    got, want, s, ops = _ops(_routing(exclusive=True), _routing_data(1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not {"MoeInitRouting", "MoeFinalizeRouting"} & set(ops), ops


def test_routing_is_refused_where_the_ids_pick_no_expert_of_a_router():
    def route(x, ids, sw, up, down):  # ids and weights given: no TopK over the experts
        return _sort_routed(x, ids, sw, up, down)

    x, _, up, down = _routing_data(2)
    g = torch.Generator().manual_seed(3)
    ids, sw = torch.randint(0, E, (N, K), generator=g), torch.rand(N, K, generator=g)
    got, want, s, ops = _ops(route, (x, ids, sw, up, down))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "MoeInitRouting" not in ops, ops


def test_the_routing_operators_as_the_vendor_documents_them():
    """npu_moe_init_routing's documented example (row_idx: pair (t, k) is row k * N + t);
    finalize undoes init (identity experts give each token its weights' sum times its
    row); the expert tokens are each expert's running count; the device calls."""
    import numpy as np

    from graphkernel import ops
    from graphkernel.codegen import extern
    from graphkernel.ir import Graph, TensorType

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    rows = np.array([[0, 3], [1, 4], [2, 5]], np.int32)
    ids = np.array([[1, 2], [0, 1], [0, 2]], np.int32)
    ex, where, srt = ops.get("MoeInitRouting").reference([x, rows, ids], {}, None)
    assert np.array_equal(ex, x[[1, 2, 0, 1, 0, 2]])
    assert where.tolist() == [2, 0, 1, 4, 3, 5] and srt.tolist() == [0, 0, 1, 1, 2, 2]
    tokens = ops.get("MoeComputeExpertTokens").reference([srt], {"experts": 4}, None)
    assert tokens.tolist() == [2, 4, 6, 6]
    scales = np.array([[0.5, 2.0], [1.0, -1.0], [3.0, 0.25]], np.float32)
    skip = np.ones((3, 4), np.float32)
    out = ops.get("MoeFinalizeRouting").reference(
        [ex, skip, np.zeros((3, 4), np.float32), scales, where, ids], {}, None)
    np.testing.assert_allclose(out, skip + x * scales.sum(1, keepdims=True), rtol=1e-6)

    g = Graph("routing")
    xi, ri, ii = (g.add_input(n, TensorType(v.shape, dt)) for n, v, dt in (
        ("x", x, "float32"), ("row_idx", rows, "int32"), ("expert_idx", ids, "int32")))
    init = g.add_node("MoeInitRouting", [xi, ri, ii])
    g.set_outputs(list(init.outputs))
    call = extern.call(init)
    assert call["operator"] == "torch_npu.npu_moe_init_routing"
    assert call["arguments"] == {"active_num": 3}
    assert [o["role"] for o in call["operands"]] == ["x", "row_idx", "expert_idx"]
    assert [o["role"] for o in call["results"]] == ["expanded_x", "expanded_row_idx",
                                                     "expanded_expert_idx"]
    assert extern.cube_flops(init) == 0.0


def test_router_max_and_tensor_clamp_as_eager():
    """Routers that pick by max (its first index, NaN the largest) and clamp by tensors."""
    def f(x, lo, hi):
        v, i = torch.max(x, dim=1)
        v2, i2 = torch.max(x, dim=-1, keepdim=True)
        return v, i, v2, i2, torch.clamp(x, lo, hi), torch.clamp(x, min=lo), \
            torch.clamp(x, max=hi)

    nan = float("nan")
    x = torch.tensor([[1.0, 3.0, 3.0, nan], [2.0, 2.0, 0.0, -1.0], [5.0, nan, 1.0, nan]])
    lo, hi = torch.tensor([0.0, 2.5, 1.0, 9.0]), torch.tensor([[1.0], [2.0], [3.0]])
    got, want, s = _compiled(f, x, lo, hi)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    assert s["launches"]["opaque"] == 0 and not s["fallbacks"], s


def test_max_of_booleans_runs_through_torch():
    def f(b):
        return torch.max(b, dim=0)[1]

    b = torch.tensor([[True, False], [True, True]])
    got, want, s = _compiled(f, b)
    assert torch.equal(got, want)
    assert "booleans" in s["fallbacks"]["aten.max.dim"], s


@pytest.mark.sim
def test_routed_experts_through_the_simulators_kernels():
    """The generated kernel around the routing operators (the activation) runs in the
    simulator; the gating and routing operators and the grouped products as their
    references, as a device build calls them."""
    fn, args = _routing(), _routing_data(5)
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend="graphkernel", options={"backend": "sim"})(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["launches"]["extern"] == 6 and s["bugs"] == 0, s


def _phimoe_block(seed: int = 0):
    """PhiMoE's sparse MoE block as the library builds it (its decoder from a config with
    the library's defaults, seeded; the first layer's block) and hidden states for it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.PhimoeConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    num_local_experts=4, num_experts_per_tok=2,
                                    vocab_size=256)
    block = transformers.PhimoeModel(cfg).layers[0].mlp.eval()
    return block, torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(seed + 1))


@pytest.mark.parametrize("backend", ["reference", pytest.param("sim", marks=pytest.mark.sim)])
def test_a_router_picking_experts_one_by_one_is_one_vector_kernel(backend):
    """PhiMoE's sparsemixer after moe_routing: each pick's max and expert, the next pick's
    scores masked by it, each pick's softmax of the scores near its max read at it -- row
    reductions over the experts, several read by several others, behind the router's product
    -- are one kernel (reduce_rows; they were four). The block's launches: the router product,
    the router kernel, the weights' Concat, the gated activation, the gating operator, the
    three routing operators and the two grouped products."""
    block, x = _phimoe_block()
    with torch.no_grad():
        want = block(x)
        got = torch.compile(block, backend="graphkernel", options={"backend": backend})(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["launches"] == {"vector": 3, "cube": 1, "mix": 0, "extern": 6, "opaque": 0}, s
    assert s["bugs"] == 0, s


# ------------------------------------------------------------- the router as one operator
def _gated(form: str):
    """A router as the MoE decoders write it: softmax over the experts, TopK, the picked
    weights renormalised (``renorm``: Mixtral; others where ``norm_topk_prob``) or not
    (``plain``), or the TopK of the logits then a softmax over the picked (``after``:
    GPT-OSS); the ids to int32."""
    def gate(logits):
        if form == "after":
            w, ids = torch.topk(logits, K, dim=-1)
            w = torch.softmax(w, dim=1)
        else:
            w, ids = torch.topk(torch.softmax(logits, -1), K, dim=-1)
        if form == "renorm":
            w = w / w.sum(-1, keepdim=True)
        return w * 3.0, ids.to(torch.int32) + 1
    return gate


@pytest.mark.parametrize("form", ["plain", "renorm", "after"])
def test_router_softmax_topk_and_renormalisation_are_one_gating_operator(form):
    logits = torch.randn(N, E, generator=torch.Generator().manual_seed(6))
    got, want, s, ops = _ops(_gated(form), (logits,))
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1], want[1])
    assert ops.count("MoeGatingTopKSoftmax") == 1 and "TopK" not in ops, ops
    # the operator; the weights' scale and the ids' +1 (no softmax, TopK, sum or cast)
    assert s["launches"]["extern"] == 1 and sum(s["launches"].values()) == 3, s


def test_gating_refused_where_ids_are_int64_the_softmax_elsewhere_or_values_read_twice():
    def f(logits):
        w, ids = torch.topk(torch.softmax(logits, -1), K, dim=-1)  # ids kept int64
        v, j = torch.topk(torch.softmax(logits, 0), K, dim=-1)  # softmax over tokens
        u, i = torch.topk(logits, K, dim=-1)  # the picked logits read besides their softmax
        return w, ids, v, j.to(torch.int32), torch.softmax(u, -1), u, i.to(torch.int32)

    logits = torch.randn(N, E, generator=torch.Generator().manual_seed(7))
    got, want, s, ops = _ops(f, (logits,))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert "MoeGatingTopKSoftmax" not in ops and ops.count("TopK") == 3, ops


def test_the_gating_operator_as_the_vendor_documents_it():
    """renorm 0: the K largest of softmax(x); renorm 1: softmax over the K largest logits
    (the picked softmax weights over their sum); int32 ids, ties to the lower expert; the
    device call."""
    import numpy as np

    from graphkernel import ops
    from graphkernel.codegen import extern
    from graphkernel.ir import Graph, TensorType

    x = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, -1.0, 2.0, 1.5]], np.float32)
    op = ops.get("MoeGatingTopKSoftmax")
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    y0, i0 = op.reference([x], {"k": 2, "renorm": 0}, None)
    y1, i1 = op.reference([x], {"k": 2, "renorm": 1}, None)
    assert i0.dtype == np.int32 and i0.tolist() == [[1, 2], [2, 3]] == i1.tolist()
    picked = np.take_along_axis(p, i0.astype(np.int64), 1)
    np.testing.assert_allclose(y0, picked, rtol=1e-6)
    np.testing.assert_allclose(y1, picked / picked.sum(1, keepdims=True), rtol=1e-6)

    g = Graph("gating")
    xi = g.add_input("x", TensorType((2, 4), "float32"))
    node = g.add_node("MoeGatingTopKSoftmax", [xi], {"k": 2, "renorm": 1})
    g.set_outputs(list(node.outputs))
    call = extern.call(node)
    assert call["operator"] == "torch_npu.npu_moe_gating_top_k_softmax_v2"
    assert call["aclnn"] == "aclnnMoeGatingTopKSoftmaxV2"
    assert call["arguments"] == {"k": 2, "renorm": 1, "finished": None,
                                 "output_softmax": False}
    assert [o["role"] for o in call["results"]] == ["y", "expert_idx"]
    assert extern.cube_flops(node) == 0.0 and extern.vector_repeats(node, 256) > 0
    with pytest.raises(Exception, match="0 < k"):
        g.add_node("MoeGatingTopKSoftmax", [xi], {"k": 5, "renorm": 0})


def test_compile_command_lists_the_gating_extern(tmp_path, capsys):
    """`graphkernel compile` lists each extern with its call's arguments (an attention's
    layout and heads; the MoE operators' own arguments)."""
    import json

    from graphkernel.cli import main

    doc = {"format": "graphkernel/1", "name": "g",
           "inputs": [{"name": "x", "shape": [4, 8], "dtype": "float32"}],
           "nodes": [{"name": "gate", "op": "MoeGatingTopKSoftmax", "inputs": ["x"],
                      "outputs": ["w", "ids"], "attrs": {"k": 2, "renorm": 1}}],
           "outputs": ["w", "ids"]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    assert main(["compile", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "extern torch_npu.npu_moe_gating_top_k_softmax_v2 (k 2, renorm 1" in out, out


def _ranked(logits, bias):
    """DeepSeek's last router step: the experts ranked by biased scores for their ids alone,
    the weights gathered from the unbiased ones, renormalised; the ids to int32."""
    scores = torch.sigmoid(logits)
    ids = torch.topk(scores + bias, K, dim=-1, sorted=False)[1]
    w = scores.gather(1, ids)
    return w / (w.sum(-1, keepdim=True) + 1e-20), ids.to(torch.int32)


def test_a_top_k_read_for_its_ids_alone_is_the_gating_operators_ids():
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(N, E, generator=g)
    logits[0] = torch.tensor([0.5, 0.5, -1.0, 0.5])  # ties: the lower expert first
    bias = torch.randn(E, generator=g) * 0.1
    bias[:] = torch.where(torch.arange(E) < 3, 0.0, bias)
    got, want, s, ops = _ops(_ranked, (logits, bias))
    # sorted=False: the order of tied experts is torch's own; compared expert by expert
    (w1, i1), (w2, i2) = ((w.gather(1, i.argsort(-1)), i.sort(-1)[0]) for w, i in (got, want))
    torch.testing.assert_close(w1, w2, rtol=1e-6, atol=1e-6)
    assert torch.equal(i1, i2)
    assert ops.count("MoeGatingTopKSoftmax") == 1 and "TopK" not in ops, ops
    # the gating operator and the vector work around it (the TopK and the ids' cast gone)
    assert s["launches"]["extern"] == 1 and sum(s["launches"].values()) <= 5, s


def test_a_top_k_whose_values_are_read_or_ids_kept_int64_is_no_gating_operator():
    def f(logits):
        v, i = torch.topk(logits, K, dim=-1)
        _, j = torch.topk(logits * 2.0, K, dim=-1)
        return v, i.to(torch.int32), j

    got, want, s, ops = _ops(f, (torch.randn(N, E, generator=torch.Generator().manual_seed(12)),))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert "MoeGatingTopKSoftmax" not in ops and ops.count("TopK") == 2, ops
