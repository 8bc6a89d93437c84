"""The launch count the vs-Inductor tables use for Inductor's side: every call of a fused
kernel is a launch, also when Inductor compiled one kernel for several identical layers."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from benchmarks import vs_inductor  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]


class _Layers(torch.nn.Module):
    """Identical layers (a product, then a LayerNorm and GELU that Inductor fuses)."""

    def __init__(self, n):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32))
            for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def test_each_call_of_a_kernel_shared_by_identical_layers_is_a_launch():
    from torch._inductor.utils import run_and_get_code

    fn = torch.compile(_Layers(3), backend="inductor")
    with torch.no_grad():
        _, code = run_and_get_code(fn, torch.randn(4, 32))
    distinct = {k for src in code for k in re.findall(r"cpp_fused_\w+", src)}
    fused, externs = vs_inductor._count(code)
    # one compiled kernel serves the three layers, launched three times between the products
    assert len(distinct) == 1
    assert (fused, externs) == (3, 3)
