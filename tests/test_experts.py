"""Mixture-of-experts products: GroupedMatMul (and its weights' gradient) against the ops it
stands for, transformers' grouped_mm_fallback recognised in torch.compile graphs forward and
backward, and the vendor call a device build makes."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import run_graph

torch = pytest.importorskip("torch")
moe = pytest.importorskip("transformers.integrations.moe")

import graphkernel.torch as gt  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_torch")  # Dynamo and stats reset

# uneven groups, one expert with no rows, and rows routed to no expert at the end
OFFS = np.array([3, 3, 7, 10], np.int32)
S, K, N, E = 12, 8, 6, 4


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(S, K, generator=g), torch.randn(E, K, N, generator=g),
            torch.tensor(OFFS), torch.randn(S, N, generator=g))


def _graph(op: str, *types) -> Graph:
    g = Graph(op)
    ins = [g.add_input(f"i{k}", TensorType(shape, dt)) for k, (shape, dt) in enumerate(types)]
    g.set_outputs([g.add_node(op, ins).output])
    return g


def test_grouped_matmul_is_the_fallbacks_product_per_group():
    x, w, offs, _ = _data()
    want = moe._grouped_mm_fallback(x, w, offs).numpy()
    g = _graph("GroupedMatMul", ((S, K), "float32"), ((E, K, N), "float32"), ((E,), "int32"))
    (got,) = run_graph(g, [x.numpy(), w.numpy(), OFFS])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not got[10:].any()  # rows past the last group: zeros, as the fallback leaves them


def test_weight_gradient_is_the_fallbacks_backward():
    x, w, offs, dy = _data(1)
    dx, dw = moe._grouped_mm_fallback_bwd(x, w, offs, dy)
    g = _graph("GroupedMatMulWeightGrad", ((S, K), "float32"), ((S, N), "float32"),
               ((E,), "int32"))
    (got,) = run_graph(g, [x.numpy(), dy.numpy(), OFFS])
    np.testing.assert_allclose(got, dw.numpy(), rtol=1e-5, atol=1e-5)
    assert not got[1].any()  # the expert with no rows


class Experts(torch.nn.Module):
    """Routed rows through two stacked expert projections, as transformers' grouped_mm
    experts call them (the fallback op, the weights transposed)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.up = torch.nn.Parameter(torch.randn(E, 16, K, generator=g) * 0.3)
        self.down = torch.nn.Parameter(torch.randn(E, K, 16, generator=g) * 0.3)

    def forward(self, x, offs):
        h = torch.ops.transformers.grouped_mm_fallback(x, self.up.transpose(-2, -1), offs)
        h = torch.nn.functional.silu(h)
        return torch.ops.transformers.grouped_mm_fallback(h, self.down.transpose(-2, -1), offs)


@pytest.mark.e2e
def test_compiled_experts_match_eager_as_grouped_matmul_externs():
    model, (x, _, offs, _) = Experts(), _data(3)
    with torch.no_grad():
        want = model(x, offs)
        got = torch.compile(model, backend="graphkernel")(x, offs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    s = gt.stats()
    assert s["launches"]["extern"] == 2 and s["launches"]["opaque"] == 0, s
    assert s["attentions"] == 0  # (the grouped products are externs, not fused attention)
    assert not s["fallbacks"], s["fallbacks"]


@pytest.mark.e2e
def test_compiled_experts_gradients_match_eager():
    model, (x, _, offs, _) = Experts(), _data(4)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(x1, offs).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()] + [x1.grad]
    model.zero_grad()
    torch.compile(model, backend="graphkernel")(x2, offs).square().sum().backward()
    for a, b in zip([p.grad for p in model.parameters()] + [x2.grad], want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    s = gt.stats()
    assert not s["fallbacks"], s["fallbacks"]  # the backward custom op was recognised too


def test_the_device_call_names_the_vendor_operator_and_its_operands():
    from graphkernel.codegen import extern
    from graphkernel.codegen.traffic import launch_kind

    g = _graph("GroupedMatMul", ((S, K), "float16"), ((E, K, N), "float16"), ((E,), "int64"))
    (n,) = g.nodes
    call = extern.call(n)
    assert launch_kind(n) == "extern"
    assert call["operator"] == "torch_npu.npu_grouped_matmul"
    assert call["arguments"] == {"split_item": 3, "group_type": 0, "group_list_type": 0}
    assert [o["role"] for o in call["operands"]] == ["x", "weight", "group_list"]
    assert extern.cube_flops(n) == 2.0 * S * K * N
