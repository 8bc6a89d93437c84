"""The Scan op (its reference), and the scan pass: torch's traced associative scan and CumSum
become one Scan each, and what only looks like one (pairs of even and odd places) does not."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import run_graph


def _scan_graph(combine: str, shape, axis: int, k: int) -> Graph:
    g = Graph("scan")
    ins = [g.add_input(f"x{i}", TensorType(shape, "float32")) for i in range(k)]
    g.set_outputs([g.add_node("Scan", ins, {"axis": axis, "combine": combine}).output])
    return g


@pytest.mark.parametrize("combine,want", [
    ("add", np.cumsum), ("mul", np.cumprod), ("max", np.maximum.accumulate),
    ("min", np.minimum.accumulate)])
def test_scan_reference_is_the_running_combination(combine, want):
    x = np.random.default_rng(0).uniform(0.5, 1.5, (3, 7, 4)).astype(np.float32)
    (got,) = run_graph(_scan_graph(combine, (3, 7, 4), -2, 1), [x])
    np.testing.assert_allclose(got, want(x, axis=1), rtol=1e-6)


def test_linear_scan_is_the_recurrence_from_zero():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, (2, 9, 3)).astype(np.float32), rng.standard_normal((2, 9, 3))
    b = b.astype(np.float32)
    (got,) = run_graph(_scan_graph("linear", (2, 9, 3), 1, 2), [a, b])
    h = np.zeros((2, 3), np.float32)
    for t in range(9):
        h = a[:, t] * h + b[:, t]
        np.testing.assert_allclose(got[:, t], h, rtol=1e-6)


def test_scan_checks_its_operands():
    from graphkernel.errors import GraphKernelError

    g = Graph("bad")
    x = g.add_input("x", TensorType((4,), "float32"))
    with pytest.raises(GraphKernelError, match="takes 2 input"):
        g.add_node("Scan", [x], {"axis": 0, "combine": "linear"})
    with pytest.raises(GraphKernelError):
        g.add_node("Scan", [x], {"axis": 0, "combine": "xor"})


# ------------------------------------------------------------------ the pass, on torch graphs
torch = pytest.importorskip("torch")


def _generic_scan(combine_fn, xs, dim):
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(combine_fn, xs, dim=dim, combine_mode="generic")


class SelectiveScan(torch.nn.Module):
    """A state-space model's scan as transformers' Mamba writes it: decays exp(A·dt) and
    inputs dt·B·u, the pair scanned along the sequence (axis 2) by the linear combine."""

    def forward(self, dt, u):
        a = torch.exp(-torch.nn.functional.softplus(dt)[..., None] * torch.arange(
            1.0, 5.0)[None, None, None, :])
        b = (dt * u)[..., None] * torch.linspace(0.5, 1.0, 4)

        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]

        _, h = _generic_scan(combine, (a, b), 2)
        return h.sum(-1) * u


class Running(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return _generic_scan(self.fn, x, 1) * 2.0


class PairSwap(torch.nn.Module):
    """GPT-J's rotary rotation reads even and odd places too, but scans nothing."""

    def forward(self, x):
        even, odd = x[:, ::2], x[:, 1::2]
        return torch.stack([-odd * even, even + odd], dim=2).flatten(1)


def _compiled(model, args):
    import graphkernel.torch as gt

    g = gt.export_graph(model, args, name="m")
    res = graphkernel.compile(g, "--opt_level=2", env={})
    got = run_graph(res.graph, [a.numpy() for a in args])
    with torch.no_grad():
        want = model(*args)
    return res, got[0], want.numpy()


def _scans(res) -> list:
    from graphkernel.ir import Graph as G

    def walk(g: G):
        for n in g.nodes:
            if n.op == "GraphKernel":
                yield from walk(n.subgraph)
            elif n.op == "Scan":
                yield n
    return list(walk(res.graph))


@pytest.mark.parametrize("n", [16, 13])
def test_a_traced_selective_scan_is_one_scan_fused_with_its_inputs(n):
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 6, n, generator=g), torch.randn(2, 6, n, generator=g))
    res, got, want = _compiled(SelectiveScan(), args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    (s,) = _scans(res)
    assert s.attrs["combine"] == "linear" and s.attrs["axis"] == 2  # torch's moved axis undone
    kernel = next(k for k in res.graph.nodes if k.op == "GraphKernel" and any(
        m is s for m in k.subgraph.nodes))
    assert {"Exp", "Scan"} <= {m.op for m in kernel.subgraph.nodes}  # the decays fused in
    assert sum(1 for k in res.graph.nodes if k.op == "GraphKernel") <= 3


@pytest.mark.parametrize("n", [16, 13])
def test_the_selective_scans_readout_runs_in_the_scans_kernel(n):
    """h.sum(-1) * u: the readout over the state and the gate after it are the scan's
    kernel's epilogue (scan_readout, scan_readout_epilogue); no kernel writes the history
    [B, D, L, N], and the result is the eager one."""
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(2, 6, n, generator=g), torch.randn(2, 6, n, generator=g))
    res, got, want = _compiled(SelectiveScan(), args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    (s,) = _scans(res)
    kernel = next(k for k in res.graph.nodes if k.op == "GraphKernel" and any(
        m is s for m in k.subgraph.nodes))
    assert "ReduceSum" in {m.op for m in kernel.subgraph.nodes}
    history = tuple(s.outputs[0].shape)
    assert all(tuple(v.shape) != history for k in res.graph.nodes if k.op == "GraphKernel"
               for v in k.outputs)


@pytest.mark.parametrize("fn,combine", [(torch.add, "add"), (torch.mul, "mul"),
                                        (torch.maximum, "max"), (torch.minimum, "min")])
def test_each_combine_rule_is_recognised(fn, combine):
    x = torch.rand(3, 10, 5, generator=torch.Generator().manual_seed(2)) + 0.5
    res, got, want = _compiled(Running(fn), (x,))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [s.attrs["combine"] for s in _scans(res)] == [combine]


def test_even_and_odd_places_that_scan_nothing_are_left_alone():
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(3))
    res, got, want = _compiled(PairSwap(), (x,))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not _scans(res)


def test_even_and_odd_places_under_a_symbolic_length_compile(fresh_torch):
    """GPT-J's rotary pairs under dynamic=True: the places are static, the rows symbolic. The
    pass does not try to prove a scan on data of one length, and the graph compiles with no
    op through torch (strict mode raises on a pipeline failure)."""
    import graphkernel.torch as gt

    class RowPairs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(12, 12)  # the places' axis is a weight's: static

        def forward(self, x):
            x = self.proj(x)
            even, odd = x[..., ::2], x[..., 1::2]
            return torch.stack([-odd * even, even + odd], dim=-1).flatten(-2) * 2.0

    m = RowPairs().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    for n in (5, 7, 9):
        x = torch.randn(2, n, 12, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["fallbacks"] == {} and s["bugs"] == 0


def test_cumsum_of_floats_becomes_a_scan_and_of_integers_stays():
    class Sums(torch.nn.Module):
        def forward(self, x, i):
            return torch.cumsum(x, 1) * 3.0, torch.cumsum(i, 0)

    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    i = torch.arange(6)
    import graphkernel.torch as gt

    res = graphkernel.compile(gt.export_graph(Sums(), (x, i)), "--opt_level=2", env={})
    assert [s.attrs["combine"] for s in _scans(res)] == ["add"]
    got = run_graph(res.graph, [x.numpy(), i.numpy()])
    # fp32 tolerances (docs/accuracy.md): a scan adds in another order than cumsum, and a
    # prefix sum near zero cancels
    np.testing.assert_allclose(got[0], torch.cumsum(x, 1).numpy() * 3.0, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(got[1], np.cumsum(i.numpy()))


def test_disabling_the_pass_keeps_the_traced_tree():
    import graphkernel.torch as gt

    x = torch.rand(2, 8, 3) + 0.5
    g = gt.export_graph(Running(torch.add), (x,))
    res = graphkernel.compile(g, "--opt_level=2 --disable_pass=scan", env={})
    assert not _scans(res)
    np.testing.assert_allclose(run_graph(res.graph, [x.numpy()])[0],
                               torch.cumsum(x, 1).numpy() * 2.0, rtol=1e-5)


def test_a_selective_scan_over_a_symbolic_batch_is_one_scan(fresh_torch, monkeypatch):
    """Mamba under dynamic=True: the length is static in each graph (the generic scan
    recurses on its halves), the batch symbolic. torch's interleave joins the halves along
    the batch's axis (``2*B``, viewed back as ``(2, B)``), but every op keeps the batch a
    factor of its own, so the region is checked with the batch bound to one size, for all."""
    import graphkernel.torch as gt
    from tests.test_torch_backend import _compiled_graphs

    seen = _compiled_graphs(monkeypatch)
    m = SelectiveScan()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    g = torch.Generator().manual_seed(2)
    for b in (2, 3, 4):
        args = (torch.randn(b, 6, 8, generator=g), torch.randn(b, 6, 8, generator=g))
        with torch.no_grad():
            torch.testing.assert_close(c(*args), m(*args), rtol=1e-4, atol=1e-5)
    assert gt.stats()["graphs"] == 1
    (graph,) = seen
    assert isinstance(graph.inputs[0].type.shape[0], str)
    scans = [n for k in graph.nodes for n in ([k] if k.op != "GraphKernel"
                                                else k.subgraph.nodes) if n.op == "Scan"]
    assert [s.attrs["combine"] for s in scans] == ["linear"]


def test_a_view_that_mixes_a_symbol_with_other_factors_is_no_batch():
    """The layout rule: a view may regroup static factors around a symbol, never move the
    symbol past them (``(s, 8) -> (8, s)`` reads other elements at each size)."""
    from graphkernel.passes.scan import _regroup

    assert _regroup([4, 2, "s"], [8, "s"]) == [[4, 2], ["s"]]
    assert _regroup([2, "s", 4], ["2*s", 4]) == [[2, "s"], [4]]
    assert _regroup(["s", 8], [8, "s"]) is None
    assert _regroup([2, "s"], ["s", 2]) is None
