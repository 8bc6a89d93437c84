"""scan_loop: a recurrence unrolled step by step (what torch.export and ONNX exports make of a
state-space model's sequential scan) becomes one Scan, and a Concat of the same per-step work
becomes that work on whole tensors; what only looks like one is left alone."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import run_graph
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

B, D, L, N = 2, 4, 6, 3


def _at(g: Graph, x, t: int, axis: int, drop: bool = True):
    s = g.add_node("StridedSlice", [x], {"begin": [t], "end": [t + 1], "strides": [1],
                                          "axes": [axis]}).output
    return g.add_node("Squeeze", [s], {"axis": [axis]}).output if drop else s


def _unrolled(start: float = 0.0, order=None, readout: bool = True, sliced: bool = False
              ) -> Graph:
    """h = a[:, :, t] * h + b[:, :, t] from h = ``start``; y_t = sum(h * C[:, t]); stacked."""
    g = Graph("loop")
    a = g.add_input("a", TensorType((B, D, L, N), "float32"))
    b = g.add_input("b", TensorType((B, D, L, N), "float32"))
    c = g.add_input("c", TensorType((B, L, N), "float32"))
    h = g.const(np.full((B, D, N), start, np.float32))
    ys, hs = [], []
    for t in range(L):
        h = g.add_node("Add", [g.add_node("Mul", [_at(g, a, t, 2), h]).output,
                               _at(g, b, t, 2)]).output
        hs.append(h)
        ct = g.add_node("Reshape", [_at(g, c, t, 1, drop=False)], {"shape": [B, 1, N]}).output
        prod = g.add_node("Mul", [h, ct]).output
        y = g.add_node("ReduceSum", [prod], {"axis": [-1], "keep_dims": True}).output
        if sliced:  # an ONNX export's y[:, :, 0] unsqueezed back: the whole axis of 1
            y = _at(g, y, 0, 2, drop=False)
        ys.append(y)
    ys = [ys[i] for i in (order or range(L))]
    out = g.add_node("Concat", ys, {"axis": 2}).output if readout else hs[-1]
    g.set_outputs([out])
    return g


@pytest.mark.parametrize("sliced", [False, True])
def test_the_recurrence_and_its_readouts_become_one_scan_and_one_sum(sliced):
    g = _unrolled(sliced=sliced)
    h, res = apply_pass("scan_loop", g)
    assert res.rewrites == 2
    assert ops_of(h).count("Scan") == 1 and "Concat" not in ops_of(h)
    assert ops_of(h).count("ReduceSum") == 1 and ops_of(h).count("Mul") == 1
    assert_same_results(g, h, exact=False, rtol=1e-6)


def test_the_last_state_alone_is_read_from_the_scan():
    g = _unrolled(readout=False)
    h, res = apply_pass("scan_loop", g)
    assert res.rewrites == 1 and ops_of(h).count("Scan") == 1 and "Add" not in ops_of(h)
    assert_same_results(g, h)


def test_a_recurrence_from_another_start_is_not_a_scan():
    g = _unrolled(start=1.0)  # the Scan starts from zero
    h, res = apply_pass("scan_loop", g)
    assert "Scan" not in ops_of(h)
    assert_same_results(g, h, exact=False, rtol=1e-6)


def test_steps_out_of_order_are_not_rolled_up():
    g = _unrolled(order=[1, 0, 2, 3, 4, 5])
    h, res = apply_pass("scan_loop", g)
    assert "Concat" in ops_of(h) and ops_of(h).count("ReduceSum") == L
    assert_same_results(g, h, exact=False, rtol=1e-6)


def test_a_roll_that_would_move_data_is_refused():
    """Stacking x[:, t] along a new first axis is a transpose of x: not a view, left alone."""
    g = Graph("stack")
    x = g.add_input("x", TensorType((D, L, N), "float32"))
    steps = [g.add_node("ExpandDims", [g.add_node("Exp", [_at(g, x, t, 1)]).output],
                        {"axis": [0]}).output for t in range(L)]
    g.set_outputs([g.add_node("Concat", steps, {"axis": 0}).output])
    h, res = apply_pass("scan_loop", g)
    assert res.rewrites == 0 and ops_of(h).count("Exp") == L
    g2 = Graph("stack_last")  # the same steps stacked where the axis was: one Exp
    x = g2.add_input("x", TensorType((D, L, N), "float32"))
    steps = [g2.add_node("ExpandDims", [g2.add_node("Exp", [_at(g2, x, t, 1)]).output],
                         {"axis": [1]}).output for t in range(L)]
    g2.set_outputs([g2.add_node("Concat", steps, {"axis": 1}).output])
    h2, res2 = apply_pass("scan_loop", g2)
    assert res2.rewrites == 1 and ops_of(h2).count("Exp") == 1
    assert_same_results(g2, h2)


def test_bisect_can_refuse_each_rewrite():
    g = _unrolled()
    h, res = apply_pass("scan_loop", g, "--bisect_limit=0")
    assert res.rewrites == 0 and "Scan" not in ops_of(h)


# ------------------------------------------------------------- through torch.export
torch = pytest.importorskip("torch")


class SequentialScan(torch.nn.Module):
    """transformers' Mamba selective scan as it runs when exported: one step per position."""

    def forward(self, dt, u, c):
        a = torch.exp(-torch.nn.functional.softplus(dt)[..., None] * torch.arange(
            1.0, N + 1.0)[None, None, None, :])
        b = (dt * u)[..., None] * torch.linspace(0.5, 1.0, N)
        h = torch.zeros(dt.shape[0], dt.shape[1], N)
        ys = []
        for t in range(dt.shape[2]):
            h = a[:, :, t] * h + b[:, :, t]
            ys.append(torch.matmul(h, c[:, t, :].unsqueeze(-1))[:, :, 0])
        return torch.stack(ys, dim=-1) * u


def test_an_exported_sequential_scan_rolls_up_to_a_few_kernels():
    import graphkernel.torch as gt

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(B, D, 12, generator=gen), torch.randn(B, D, 12, generator=gen),
            torch.randn(B, 12, N, generator=gen))
    g = gt.export_graph(SequentialScan(), args, name="m")
    on = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=scan_loop", env={})
    (got,) = run_graph(on.graph, [a.numpy() for a in args])
    with torch.no_grad():
        want = SequentialScan()(*args).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ex_on, ex_off = on.report.extra, off.report.extra
    # 12 steps: several launches each unrolled; one scan kernel and a few around it rolled up
    assert ex_on["kernels_fused"] <= 5 and ex_off["kernels_fused"] >= 3 * 12
    # (each unrolled step loads only its slices a[:, :, t], b[:, :, t] and c[:, t]: the
    # steps' launches still move three times the rolled-up kernels' bytes)
    assert ex_on["gm_bytes_fused"] * 3 < ex_off["gm_bytes_fused"]
