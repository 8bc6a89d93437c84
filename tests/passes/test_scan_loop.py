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



# ------------------------------------------------------------- row writes, first coefficients
W = 5


def _mask(rows, length: int = L, rank_axis: int = 1, rank: int = 3) -> np.ndarray:
    """``arange(length) == t`` (or a range of rows) as the decomposition of ``out[:, t] = v``
    gives it: size 1 on every axis but the written one."""
    shape = [1] * rank
    shape[rank_axis] = length
    m = np.zeros(length, bool)
    m[list(rows)] = True
    return m.reshape(shape)


def _written(rows_per_step, base_input: bool = False, body: str = "Exp") -> Graph:
    """out[:, rows] = body(x[:, t]) for each step t, into zeros (or an input), as Selects of
    one-hot row masks over the broadcast step value."""
    g = Graph("writes")
    x = g.add_input("x", TensorType((B, L, W), "float32"))
    out = g.add_input("base", TensorType((B, L, W), "float32")) if base_input else \
        g.const(np.zeros((B, L, W), np.float32))
    for t, rows in enumerate(rows_per_step):
        v = g.add_node(body, [_at(g, x, t, 1)]).output
        v = g.add_node("ExpandDims", [v], {"axis": [1]}).output
        v = g.add_node("BroadcastTo", [v], {"shape": [B, L, W]}).output
        out = g.add_node("Select", [g.const(_mask(rows)), v, out]).output
    g.set_outputs([out])
    return g


def test_one_row_written_per_step_becomes_the_step_work_on_the_whole_tensor():
    g = _written([[t] for t in range(L)])
    h, res = apply_pass("scan_loop", g)
    assert "Select" not in ops_of(h) and ops_of(h).count("Exp") == 1, ops_of(h)
    assert_same_results(g, h)


def test_rows_not_written_keep_the_base_and_the_last_write_of_a_row_wins():
    # rows 0 and 5 never written; row 2 written at steps 1 and 3 (the later one stays);
    # step 4 writes rows 3..4 from one value broadcast over them
    g = _written([[1], [2], [3], [2], [3, 4]], base_input=True)
    h, res = apply_pass("scan_loop", g)
    assert "Select" not in ops_of(h) and "Concat" in ops_of(h), ops_of(h)
    assert_same_results(g, h)


def test_masks_that_are_not_one_run_of_rows_are_left_alone():
    g = _written([[0, 2], [1, 3]])  # two rows apart in one mask
    h, res = apply_pass("scan_loop", g)
    assert ops_of(h).count("Select") == 2 and res.rewrites == 0
    g2 = Graph("two_axes")  # a mask that varies along two axes is not a row write
    x = g2.add_input("x", TensorType((B, L, W), "float32"))
    out = g2.const(np.zeros((B, L, W), np.float32))
    for t in range(2):
        m = np.zeros((1, L, W), bool)
        m[0, t, :2] = True
        out = g2.add_node("Select", [g2.const(m), x, out]).output
    g2.set_outputs([out])
    h2, res2 = apply_pass("scan_loop", g2)
    assert ops_of(h2).count("Select") == 2 and res2.rewrites == 0


def test_a_write_read_elsewhere_ends_the_chain_there():
    g = _written([[t] for t in range(3)])
    mid = g.outputs[0].producer.inputs[2]  # after the second write
    g.set_outputs([g.outputs[0], g.add_node("Neg", [mid]).output])
    h, res = apply_pass("scan_loop", g)
    # the first two writes as one Concat (read by the Neg); the third, a chain of one write,
    # stays the Select it is
    assert ops_of(h).count("Select") == 1 and "Concat" in ops_of(h), ops_of(h)
    assert_same_results(g, h)


def test_a_slice_of_rows_kept_or_written_reads_past_the_write():
    """A cache written one column per layer and read back by a later layer (the column it
    reads is one the write kept: the value before it)."""
    g = Graph("cache")
    x = g.add_input("x", TensorType((B, W), "float32"))
    cache = g.add_input("cache", TensorType((B, W, 3), "float32"))
    v = g.add_node("BroadcastTo", [g.add_node("ExpandDims", [x], {"axis": [2]}).output],
                   {"shape": [B, W, 3]}).output
    w0 = g.add_node("Select", [g.const(_mask([0], 3, 2)), v, cache]).output
    kept = g.add_node("StridedSlice", [w0], {"begin": [1], "end": [2], "axes": [2]}).output
    mine = g.add_node("StridedSlice", [w0], {"begin": [0], "end": [1], "axes": [2]}).output
    y = g.add_node("Exp", [g.add_node("Squeeze", [kept], {"axis": [2]}).output]).output
    v1 = g.add_node("BroadcastTo", [g.add_node("ExpandDims", [y], {"axis": [2]}).output],
                    {"shape": [B, W, 3]}).output
    w1 = g.add_node("Select", [g.const(_mask([1], 3, 2)), v1, w0]).output
    g.set_outputs([w1, mine])
    h, res = apply_pass("scan_loop", g)
    assert "Select" not in ops_of(h), ops_of(h)
    assert_same_results(g, h)


def _reset_scan(first: float, later: float = 1.0) -> Graph:
    """h = (a * c)[:, t] * h + b[:, t] as one Scan, c one constant per step."""
    g = Graph("reset")
    a = g.add_input("a", TensorType((B, L, W), "float32"))
    b = g.add_input("b", TensorType((B, L, W), "float32"))
    c = np.full((1, L, 1), later, np.float32)
    c[0, 0, 0] = first
    ac = g.add_node("Mul", [a, g.const(c)]).output
    g.set_outputs([g.add_node("Scan", [ac, b], {"axis": 1, "combine": "linear"}).output])
    return g


@pytest.mark.parametrize("first", [0.0, 1.0, -0.5])
def test_a_factor_of_the_first_coefficient_alone_is_dropped(first):
    """The first coefficient multiplies the zero the scan starts from: a reset mask
    ``~(pos == 0)`` on it changes nothing (a finite factor within [-1, 1] keeps an infinite
    coefficient infinite and a finite one finite)."""
    g = _reset_scan(first)
    h, res = apply_pass("scan_loop", g)
    assert res.rewrites == 1 and "Mul" not in ops_of(h)
    assert_same_results(g, h)
    feeds = [np.full((B, L, W), np.inf, np.float32), np.ones((B, L, W), np.float32)]
    np.testing.assert_array_equal(run_graph(g, feeds)[0], run_graph(h, feeds)[0])  # NaN alike


@pytest.mark.parametrize("first,later", [(2.0, 1.0), (0.0, 0.5)])
def test_a_factor_that_scales_the_first_coefficient_up_or_a_later_one_stays(first, later):
    g = _reset_scan(first, later)
    h, res = apply_pass("scan_loop", g)
    assert res.rewrites == 0 and "Mul" in ops_of(h)


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


def _rnn_into_rows(reset: bool):
    def rnn(x, a):
        h = torch.zeros_like(x[:, 0])
        if reset:  # the reset at the first position of a gated recurrence
            a = a * ~(torch.arange(x.shape[1])[None, :, None] == 0)
        out = torch.zeros_like(x)
        for t in range(x.shape[1]):
            h = a[:, t] * h + x[:, t]
            out[:, t] = h
        return out, h
    return rnn


@pytest.mark.parametrize("reset", [False, True])
def test_a_compiled_loop_writing_one_row_per_step_is_one_scan_kernel(reset):
    """``out[:, t] = h`` in a loop: Dynamo unrolls it and the decompositions write each row
    as a Select over the whole output; rolled up it is the Scan's own result."""
    import graphkernel.torch as gt

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 12, 32, generator=gen), torch.rand(2, 12, 32, generator=gen))
    rnn = _rnn_into_rows(reset)
    counts = {}
    for flags in ("", "--disable_pass=scan_loop"):
        torch._dynamo.reset()
        gt.reset_stats()
        with torch.no_grad():
            got = torch.compile(rnn, backend="graphkernel", options={"flags": flags})(*args)
            want = rnn(*args)
        for g_, w_ in zip(got, want, strict=True):
            torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-6)
        s = gt.stats()
        assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
        counts[flags] = sum(s["launches"].values())
    # the scan and the last state's slice; row by row, a launch every few steps
    assert counts[""] <= 2 and counts["--disable_pass=scan_loop"] >= 4, counts
