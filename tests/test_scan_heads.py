"""Selective scans run head by head on slices of head-major tensors (``x[h]`` of
``[heads, B, D, L]``, Zamba's multi-head Mamba mixer): each head's scan kernel reads its
per-row values (the skip input, the gate) as one block of the input at the head's offset,
so every head's scan, readout, skip and gate are one kernel, as the first head's are."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel.codegen.vector.schedule import COL, ROW, View, classify
from graphkernel.interpreter import run_graph

torch = pytest.importorskip("torch")


def test_a_block_at_an_offset_is_a_column_or_a_row_read_from_there():
    """One value per row ([4, 8, 1] against rows of 16) or one row for all ([1, 1, 16]),
    taken from a larger input at an offset (a slice of a leading axis): the layout it has at
    offset 0, with the offset; a strided view is still no column."""
    S = (4, 8, 16)
    assert classify((4, 8, 1), S, 16, View(64, (8, 1, 1))) == (COL, (), (), 64)
    assert classify((1, 1, 16), S, 16, View(32, (16, 16, 1))) == (ROW, (), (), 32)
    assert classify((4, 8, 1), S, 16, View(0, (8, 1, 1)))[0] == COL
    assert classify((4, 8, 1), S, 16, View(64, (16, 1, 1))) is None  # every other value


def _generic_scan(combine_fn, xs, dim):
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(combine_fn, xs, dim=dim, combine_mode="generic")


class HeadScans(torch.nn.Module):
    """Per head h, a selective scan as transformers' Mamba writes it, on head h's slices:
    dt = softplus(dt[h] + bias), decays exp(A * dt) and inputs dt * B * u[h] in the state's
    shape, the pair scanned along the sequence, the readout ``states @ C``, the skip term
    u[h] * D (D = 1, as the library initialises it, unless ``weighted``) and the gate
    silu(z[h]); the heads' results concatenated along the channels."""

    def __init__(self, heads: int, d: int, n: int, weighted: bool = False):
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.A = torch.nn.Parameter(-torch.rand(heads, d, n, generator=gen) - 0.5)
        # a trained skip weight D (not the library's initial ones, which fold away)
        self.D = torch.nn.Parameter(torch.rand(heads, d, generator=gen) + 0.5) \
            if weighted else None
        self.bias = torch.nn.Parameter(torch.rand(heads, d, generator=gen) * 0.1)

    def forward(self, dt, u, z, B, C):  # [H, b, d, L] x3, [H, b, L, n] x2
        outs = []
        for h in range(dt.shape[0]):
            t = torch.nn.functional.softplus(dt[h] + self.bias[h][..., None])
            a = torch.exp(self.A[h][None, :, None, :] * t[:, :, :, None])
            b = t[:, :, :, None] * B[h][:, None, :, :] * u[h][:, :, :, None]

            def combine(left, right):
                return left[0] * right[0], right[0] * left[1] + right[1]

            _, s = _generic_scan(combine, (a, b), 2)
            y = torch.matmul(s.transpose(1, 2), C[h].unsqueeze(-1)).squeeze(-1).transpose(1, 2)
            y = y + (u[h] if self.D is None else u[h] * self.D[h][None, :, None])
            outs.append(y * torch.nn.functional.silu(z[h]))
        return torch.cat(outs, 1)


@pytest.fixture(scope="module")
def head_scans():
    import graphkernel.torch as gt

    gen = torch.Generator().manual_seed(0)
    args = (*(torch.randn(3, 2, 8, 16, generator=gen) for _ in range(3)),
            *(torch.randn(3, 2, 16, 16, generator=gen) for _ in range(2)))
    model = HeadScans(3, 8, 16)
    g = gt.export_graph(model, args, name="heads")
    res = graphkernel.compile(g, "--opt_level=2", env={})
    with torch.no_grad():
        want = model(*args).numpy()
    return res, [a.numpy() for a in args], want


def _scan_kernels(res):
    return [k for k in res.graph.nodes if k.op == "GraphKernel"
            and any(m.op == "Scan" for m in k.subgraph.nodes)]


def test_each_heads_scan_readout_and_gate_are_one_kernel(head_scans):
    res, feeds, want = head_scans
    assert not res.report.extra.get("fallbacks")
    kernels = _scan_kernels(res)
    assert len(kernels) == 3  # one per head
    for k in kernels:
        ops = {m.op for m in k.subgraph.nodes}
        assert {"Scan", "ReduceSum", "Exp"} <= ops  # decays, scan, readout
        assert any(m.op in ("StridedSlice", "Slice") for m in k.subgraph.nodes)
    # nothing outside the kernels but views and the Concat of the heads
    loose = {n.op for n in res.graph.nodes if n.op not in ("GraphKernel", "Constant")}
    assert loose <= {"Concat", "Reshape", "Split", "Transpose"}, loose
    (got,) = run_graph(res.graph, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.sim
@pytest.mark.parametrize("compiled", ["head_scans", "weighted_scans"])
def test_the_kernels_compute_the_eager_result_in_the_simulator(compiled, request):
    """The heads' kernels (blocks read at an offset), and the scans whose readout's work
    on a trained skip weight is a kernel of its own, in the simulator."""
    from graphkernel.codegen.backend import run_sim

    res, feeds, want = request.getfixturevalue(compiled)
    (got,), _ = run_sim(res, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _offset_blocks():
    """exp(x - r) * c on x [4, 8, 16], r one row of a [3, 16] table (its second), c one
    value per row from the second half of a [2, 4, 8, 1] input: a ROW and a COL each read at
    an offset of their input."""
    from graphkernel import Graph, TensorType

    g = Graph("offset_blocks")
    x = g.add_input("x", TensorType((4, 8, 16), "float32"))
    r = g.add_input("r", TensorType((3, 16), "float32"))
    c = g.add_input("c", TensorType((2, 4, 8, 1), "float32"))
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    row = n("StridedSlice", [r], begin=[1], end=[2], strides=[1], axes=[0])
    col = n("Squeeze", [n("StridedSlice", [c], begin=[1], end=[2], strides=[1], axes=[0])],
            axis=[0])
    g.set_outputs([n("Mul", [n("Exp", [n("Sub", [x, row])]), col])])
    return g


@pytest.fixture(scope="module")
def offset_blocks():
    g = _offset_blocks()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal(tuple(v.type.shape)).astype(np.float32) for v in g.inputs]
    return res, feeds


def test_a_row_and_a_column_at_offsets_are_one_kernel(offset_blocks):
    from graphkernel.codegen.backend import schedules

    res, feeds = offset_blocks
    assert not res.report.extra.get("fallbacks")
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    (s,) = schedules(res).values()
    assert sorted((io.kind, io.base) for io in s.inputs if io.kind in (COL, ROW)) == [
        (COL, 32), (ROW, 16)]
    x, r, c = feeds
    (got,) = run_graph(res.graph, feeds)
    np.testing.assert_allclose(got, np.exp(x - r[1]) * c[1], rtol=1e-6)


@pytest.mark.sim
def test_a_row_and_a_column_at_offsets_in_the_simulator(offset_blocks):
    from graphkernel.codegen.backend import run_sim

    res, feeds = offset_blocks
    x, r, c = feeds
    (got,), _ = run_sim(res, feeds)
    np.testing.assert_allclose(got, np.exp(x - r[1]) * c[1], rtol=1e-5, atol=1e-6)


def test_the_offset_loads_compile_against_the_real_headers(head_scans, offset_blocks):
    from graphkernel.codegen.backend import render_all, schedules
    from tests.codegen.test_realcheck import assert_all_compile, headers

    if headers() is None:
        pytest.skip("no Ascend C headers (GRAPHKERNEL_ASCEND_HEADERS)")
    rendered = [r for res in (head_scans[0], offset_blocks[0])
                for r in render_all(schedules(res))]
    text = "".join("".join(r.files.values()) for r in rendered)
    assert "t_.pb" in text and "+ r0]" in text and "+ c0]" in text
    assert_all_compile(rendered)


@pytest.fixture(scope="module")
def weighted_scans():
    import graphkernel.torch as gt

    gen = torch.Generator().manual_seed(4)
    args = (*(torch.randn(2, 2, 8, 16, generator=gen) for _ in range(3)),
            *(torch.randn(2, 2, 16, 16, generator=gen) for _ in range(2)))
    model = HeadScans(2, 8, 16, weighted=True)
    res = graphkernel.compile(gt.export_graph(model, args, name="weighted"), "--opt_level=2",
                              env={})
    with torch.no_grad():
        want = model(*args).numpy()
    return res, [a.numpy() for a in args], want


def test_a_trained_skip_weight_splits_the_readouts_work_off_not_the_scan(weighted_scans):
    """u * D[None, :, None] (one weight per channel, broadcast over the batch and the steps)
    has no place in the scan's tile, whose rows run over batch, channel and step: the
    scan and its readout stay one kernel, the skip term and gate after them are another
    (the refusal says so), instead of every op of the head running on its own."""
    res, feeds, want = weighted_scans
    loose = [n.op for n in res.graph.nodes if n.op not in ("GraphKernel", "Constant", "Reshape")]
    assert loose == ["Concat"]
    assert len(_scan_kernels(res)) == 2
    assert sum(1 for n in res.graph.nodes if n.op == "GraphKernel") == 4
    reasons = [f["reason"] for f in res.report.extra["fallbacks"]]
    assert reasons and all("a kernel of its own loop space" in r for r in reasons)
    (got,) = run_graph(res.graph, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
