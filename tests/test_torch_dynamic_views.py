"""torch.compile(dynamic=True) over a symbolic batch: a scan's halves taken apart and joined
back (torch's interleave viewed as ``(2, B, ...)``, ``x[1]``, ``cat(x[:1], y)``) stay one
generated kernel each, with no codegen fallback, for every batch one compile serves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]

R = torch.Generator().manual_seed(3)


class Halves(torch.nn.Module):
    """The second half of a value stacked over a leading axis of 2 (its start ``B * 8``
    elements in: the 2 is static, the view's, the batch symbolic), scaled and added to the
    first half."""

    def forward(self, x, y):
        h = x.view(2, y.shape[0], y.shape[1])
        return torch.exp(h[1]) * y + h[0]


class Joined(torch.nn.Module):
    """A scan step's join: the first row of one value kept, the rest another's."""

    def forward(self, x, y):
        a = x.view(6, y.shape[1], y.shape[2])
        return torch.cat([a[:1], y], dim=0) * 2.0


def _run(m, make, sizes):
    torch._dynamo.reset()
    gt.reset_stats()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for b in sizes:
            args = make(b)
            torch.testing.assert_close(c(*args), m(*args), rtol=1e-5, atol=1e-6)
    return gt.stats()


@pytest.mark.parametrize("model, make", [
    (Halves(), lambda b: (torch.rand(2, b, 8, generator=R), torch.rand(b, 8, generator=R))),
    (Joined(), lambda b: (torch.rand(6, b, 16, generator=R),
                          torch.rand(3, b, 16, generator=R))),
], ids=["halves", "joined"])
def test_views_at_a_symbolic_offset_are_one_kernel(model, make):
    s = _run(model, make, (4, 5, 7))  # (not 2, 3, 6, 8, 16: sizes Dynamo would share)
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}, s
    (g,) = s["per_graph"]
    assert g["symbols"], g  # the batch stayed symbolic
    assert g["codegen_fallbacks"] == 0, g
    assert sum(s["launches"].values()) == 1, s["launches"]
