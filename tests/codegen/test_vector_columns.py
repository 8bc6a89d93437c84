"""Vector kernel forms for per-row and per-column values: an int32 index per row read as
floats; block tiles (a kernel over the rows whose row tile holds every row of a block)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.codegen.cases import compile_cases, pattern_cases
from tests.codegen.test_codegen import check_case

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)

INT32_ROWS = [c for c in pattern_cases() if c.id.startswith("int32-index-per-row-")]
BLOCK_NORMS = [c for c in pattern_cases() if c.id.startswith("block-tile-channel-norm-")]


@pytest.fixture(scope="module")
def library():
    return compile_cases(INT32_ROWS + BLOCK_NORMS)


@pytest.mark.parametrize("case", INT32_ROWS, ids=lambda c: c.id)
def test_an_int32_index_per_row_is_one_kernel(case, library):
    """ids (int32, one per row) cast to float32, compared with a row of expert ids, the
    one-hot mask times the scores: one vector kernel loading the ids as a column and
    converting them on loading (before, the kernel was refused, GK501, and ran op by op),
    simulated against the interpreter at odd sizes."""
    (backend,) = check_case(case, library)
    (st,) = backend.stats.values()
    sched = backend.rendered[st.node].schedule
    assert [io.kind for io in sched.inputs][:1] == ["col"], sched.inputs
    assert not case.result.report.extra.get("fallbacks")


@pytest.mark.parametrize("case", BLOCK_NORMS, ids=lambda c: c.id)
def test_a_channel_norm_is_one_block_tile_kernel(case, library):
    """LayerNorm over axis 1 of [B, C, L] after a residual add: one kernel over the rows
    whose row tile is the whole block (rt = M = C), so the variance reduces the mean broadcast
    back within the tile (before, the mean's and the variance's reductions were a kernel each
    at best, and the fused area was split into phase kernels); simulated against the
    interpreter at odd sizes, with several column tiles per block."""
    (backend,) = check_case(case, library)
    (st,) = backend.stats.values()
    sched = backend.rendered[st.node].schedule
    B, C, L = (int(x) for x in case.id.rsplit("-", 1)[1].split("x"))
    assert sched.col_reduce and sched.block_tile and not sched.second and not sched.final
    assert sched.M == C and sched.batch == B
    assert st.tiling["rt"] == C and st.tiling["units"] == B * st.tiling["nColTiles"]
    assert not case.result.report.extra.get("phases")


def test_a_block_too_tall_for_the_ub_runs_as_phase_kernels():
    """The same norm over 3000 channels: the block's rows at the narrowest column tile do not
    fit the UB by the kernel's own buffer plan, so the kernel is split into phase kernels as
    before (the reason names the bytes), never a tile of part of the block."""
    from graphkernel import Graph, TensorType
    from graphkernel.codegen import targets
    from graphkernel.codegen.legalize import check
    from graphkernel.codegen.refusal import NeedsPhases
    from graphkernel.kernels import build_kernel

    g = Graph("tall")
    x = g.add_input("x", TensorType((2, 3000, 24), "float32"))
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    d = n("Sub", [x, n("ReduceSum", [x], axis=[1], keep_dims=True)])
    g.set_outputs([n("Mul", [d, n("ReduceSum", [n("Mul", [d, d])], axis=[1], keep_dims=True)])])
    k = build_kernel(g, [m for m in g.nodes if m.op != "Constant"], "one", "test")
    with pytest.raises(NeedsPhases, match="needs the block.s 3000 rows in one tile"):
        check(k, targets.load("ascend910b"))


@pytest.mark.parametrize("shape", [(2, 64, 16), (4, 24, 40), (2, 300, 9)])
def test_a_channel_norm_is_one_launch_through_the_pipeline(shape):
    """LayerNorm over axis 1 of [B, C, L] as a permute -> LayerNorm -> permute leaves it
    once the permutes are gone (the element count a Reshape of a one-element Constant, read
    by both means): the whole pipeline at opt_level 2 makes it one block-tile launch (before:
    two kernels over the rows at best, six in SqueezeBERT)."""
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.codegen.backend import schedules

    g = Graph("channel_norm")
    x = g.add_input("x", TensorType(shape, "float32"))
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    count = n("Reshape", [g.const(np.asarray([float(shape[1])], np.float32))], shape=[1, 1, 1])
    d = n("Sub", [x, n("Div", [n("ReduceSum", [x], axis=[1], keep_dims=True), count])])
    var = n("Div", [n("ReduceSum", [n("Mul", [d, d])], axis=[1], keep_dims=True), count])
    g.set_outputs([n("Mul", [d, n("Rsqrt", [n("Add", [var, g.const(np.float32(1e-5))])])])])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert res.report.extra["kernels_fused"] == 1, res.report.extra["kernels"]
    (sched,) = schedules(res).values()
    assert sched.block_tile and sched.M == shape[1]
