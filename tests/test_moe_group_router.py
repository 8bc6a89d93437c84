"""A group-limited router (DeepSeek-V3's: sigmoid scores, a bias for the ranking, each group
scored by its best two experts, the best groups kept, the best experts of those picked, the
picked scores renormalised and scaled) is the vendor's MoeGatingTopK: one launch in place
of the group TopKs, their sum, the group mask and the masked ranking; through torch.compile
on the library's MoE block, and as a plain program ranking groups by their best expert. A
mask filled with another value than -inf, or groups scored another way, are no such
router."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]


def _deepseek_moe(seed=0):
    import transformers as T
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    torch.manual_seed(seed)
    cfg = T.DeepseekV3Config(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
                             n_group=4, topk_group=2, num_experts_per_tok=3,
                             n_shared_experts=1)
    cfg._experts_implementation = "grouped_mm"  # (the model's default; set as the model does)
    m = DeepseekV3MoE(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * 0.2)
        m.gate.e_score_correction_bias.copy_(torch.rand(8) * 0.1)
    return m, torch.randn(2, 8, 64)


def _compiled(fn, args, options=None):
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend="graphkernel", options=options or {})(*args)
    return got, want, gt.stats()


def test_deepseek_router_is_one_gating_operator():
    m, x = _deepseek_moe()
    got, want, s = _compiled(m, (x,))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    # the router's product (cube), the gating operator, the routing operators and the two
    # grouped products (extern), the experts' activation (vector), the shared expert (a
    # product group and its down product)
    assert s["launches"] == {"vector": 1, "cube": 2, "mix": 1, "extern": 6, "opaque": 0}, s


@pytest.mark.sim
def test_deepseek_router_through_the_simulator():
    m, x = _deepseek_moe(1)
    got, want, s = _compiled(m, (x,), {"backend": "sim"})
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    assert s["launches"] == {"vector": 1, "cube": 2, "mix": 1, "extern": 6, "opaque": 0}, s
    assert s["bugs"] == 0, s


def _router(select="max", fill=float("-inf"), groups=2, k_group=1, k=2):
    def f(h, w, bias):
        scores = (h @ w.t()).sigmoid()
        choice = scores + bias
        grouped = choice.view(-1, groups, choice.shape[-1] // groups)
        if select == "max":
            gs = grouped.max(dim=-1).values
        else:
            gs = grouped.topk(3, dim=-1)[0].sum(dim=-1)
        gi = torch.topk(gs, k=k_group, dim=-1, sorted=False)[1]
        gm = torch.zeros_like(gs).scatter_(1, gi, 1)
        mask = gm.unsqueeze(-1).expand(-1, groups, choice.shape[-1] // groups).reshape(
            -1, choice.shape[-1])
        ids = torch.topk(choice.masked_fill(~mask.bool(), fill), k=k, dim=-1)[1]
        wts = scores.gather(1, ids)
        wts = wts / (wts.sum(dim=-1, keepdim=True) + 1e-20)
        return wts * 2.0, ids.to(torch.int32)

    return f


def _router_data(seed=0, experts=8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(16, 32, generator=g), torch.randn(experts, 32, generator=g) * 0.3,
            torch.rand(experts, generator=g) * 0.1)


def test_groups_ranked_by_their_best_expert():
    got, want, s = _compiled(_router("max"), _router_data())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert s["launches"] == {"vector": 0, "cube": 1, "mix": 0, "extern": 1, "opaque": 0}, s


@pytest.mark.parametrize("form", [{"fill": 0.0}, {"select": "top3"}])
def test_other_masks_and_group_scores_are_no_group_router(form):
    got, want, s = _compiled(_router(**form), _router_data(2))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert s["launches"]["opaque"] == 0 and s["launches"]["vector"] >= 3, s


def test_the_group_gating_operator_as_the_vendor_documents_it():
    """The reference: sigmoid scores, ranking by scores + bias, groups by their best two,
    ties to the lower group and expert; its limits as the vendor states them."""
    from graphkernel.codegen.extern import call
    from graphkernel.ir import Graph, TensorType
    from graphkernel.opdefs.experts import group_gating_refusal
    from graphkernel.ops import get

    x = np.array([[0.0, 0.0, 3.0, -3.0, 1.0, 1.0, 2.0, 2.0]], np.float32)
    bias = np.zeros(8, np.float32)
    attrs = {"k": 2, "k_group": 2, "group_count": 4, "group_select_mode": 1, "norm_type": 1,
             "routed_scaling_factor": 1.0, "eps": 1e-20}
    y, ids = get("MoeGatingTopK").reference([x, bias], attrs, None)
    # group scores (top-2 sums of sigmoids): groups 3 then 2 win; experts 6, 7 (a tie at
    # 2.0 ranked by index) beat 4, 5
    assert ids.tolist() == [[6, 7]] and ids.dtype == np.int32
    np.testing.assert_allclose(y, [[0.5, 0.5]], rtol=1e-6)
    assert group_gating_refusal(8, attrs) is None
    assert "divisible" in group_gating_refusal(6, attrs)
    assert "k_group" in group_gating_refusal(8, attrs | {"k": 5})
    assert "2048" in group_gating_refusal(4096, attrs | {"group_count": 8})
    g = Graph("r")
    xv = g.add_input("x", TensorType((4, 8), "float32"))
    bv = g.add_input("b", TensorType((8,), "float32"))
    node = g.add_node("MoeGatingTopK", [xv, bv], attrs)
    c = call(node)
    assert c["operator"] == "torch_npu.npu_moe_gating_top_k"
    assert c["arguments"]["renorm"] == 0 and c["arguments"]["group_count"] == 4
