"""``Tensor.unfold(dim, size, step)`` (sliding windows as a new last axis: PatchTST's patches
of each channel) lowers to one Gather of constant rows, split and transposed: no Opaque op,
the same elements as eager, in the reference interpreter and in the simulator."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]


def _g(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape, dim, size, step", [
    ((2, 32, 3), 1, 8, 8),   # patches without overlap, the windowed axis in the middle
    ((2, 3, 32), -1, 8, 4),  # overlapping windows of the last axis
    ((2, 10), 0, 2, 3),      # the first axis, windows with gaps, a tail left over
])
def test_unfold_is_a_gather_of_windows_not_an_opaque_op(shape, dim, size, step):
    def fn(x):
        return x.unfold(dim, size, step) * 2.0 + 1.0

    x = _g(*shape)
    want = fn(x)
    got = torch.compile(fn, backend="graphkernel")(x)
    s = gt.stats()
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert s["launches"]["opaque"] == 0 and s["fallbacks"] == {} and s["bugs"] == 0, s


def test_unfold_in_the_simulator():
    def fn(x):
        return x.unfold(1, 4, 2).sum(-1)

    x = _g(2, 10, 3)
    got = torch.compile(fn, backend="graphkernel", options={"backend": "sim"})(x)
    torch.testing.assert_close(got, fn(x))
    assert gt.stats()["launches"]["opaque"] == 0


def test_unfold_of_a_symbolic_axis_runs_through_torch_with_its_reason():
    """With ``dynamic=True`` the window count depends on the symbolic length: the op runs
    through torch inside the compiled graph (its reason in the fallbacks), never raises,
    and every length matches eager."""
    def fn(x):
        return x.unfold(1, 4, 2) * 2.0

    compiled = torch.compile(fn, backend="graphkernel", dynamic=True)
    for length in (10, 13):
        x = _g(2, length, 3)
        torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)
    s = gt.stats()
    assert "symbolic" in s["fallbacks"].get("aten.unfold.default", "") and s["bugs"] == 0, s
