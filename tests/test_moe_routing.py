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
    # TopK, the int64 -> float cast, the comparisons, the sum, the int32 cast: no scan, no
    # op through torch
    assert s["launches"] == {"vector": 5, "cube": 0, "mix": 0, "extern": 0, "opaque": 0}, s


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
