"""Ops a state-space model's training graph holds (the backward of its scans): torch.flip as
a Gather of each axis's places in reverse, and slice_scatter with a stride (the scan's
even/odd places written back) as a ScatterElements; each against eager, and what they
decline running through torch with its reason."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]


def test_flip_and_strided_slice_scatter_as_eager():
    def f(x, s):
        a = torch.flip(x, [0, -1])
        b = torch.slice_scatter(x, s, dim=1, start=1, step=2)
        c = torch.slice_scatter(x, s[:, :2], dim=1, start=0, end=4, step=3)
        return a, b, c

    g = torch.Generator().manual_seed(0)
    x, s = torch.randn(2, 6, 3, generator=g), torch.randn(2, 3, 3, generator=g)
    with torch.no_grad():
        want = f(x, s)
        got = torch.compile(f, backend="graphkernel")(x, s)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    st = gt.stats()
    assert st["launches"]["opaque"] == 0 and not st["fallbacks"], st


def test_flip_along_a_symbolic_axis_runs_through_torch():
    def f(x):
        return torch.flip(x, [1]) * 2

    x = torch.randn(2, 7)
    with torch.no_grad():
        fn = torch.compile(f, backend="graphkernel", dynamic=True)
        got = fn(x)
    torch.testing.assert_close(got, f(x))
    why = gt.stats()["fallbacks"]
    assert "symbolic axis" in why.get("aten.flip.default", ""), why
