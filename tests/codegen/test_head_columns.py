"""A product whose result's rows or columns are written as pieces apart in memory (a
projection ``[B·S, H·D]`` seen as ``[B, S, H, D]`` and its heads moved before the positions,
or a fused QKV projection moved to ``[3, B, H, S, D]``): the cube kernel writes C in that
layout as one product per piece (codegen/cube/strided.py ``split_matrix``), no transpose
launch of its own."""

from __future__ import annotations

import math

import pytest

from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen.backend import render_all, run_sim, schedules
from graphkernel.codegen.cube.schedule import MatmulSchedule
from graphkernel.codegen.sim.execute import CUBE_FIELDS
from graphkernel.codegen.traffic import launches
from tests.codegen.cases import Case, compile_cases

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def _projection(cid: str, dtype: str, split, perm, tb: bool = True, rows=(2, 24), k=32,
                then: str | None = None) -> Graph:
    """x [*rows, k] merged to [prod(rows), k], times a weight (stored [N, k] read transposed
    when ``tb``), the result seen as ``[*rows, *split]`` and permuted by ``perm``."""
    g = Graph(cid)
    n = math.prod(split)
    x = g.add_input("x", TensorType((*rows, k), dtype))
    w = g.add_input("w", TensorType((n, k) if tb else (k, n), dtype))

    def op(name, ins, **attrs):
        return g.add_node(name, ins, attrs).output

    y = op("MatMul", [op("Reshape", [x], shape=[math.prod(rows), k]), w], transpose_a=False,
           transpose_b=tb)
    y = op("Transpose", [op("Reshape", [y], shape=[*rows, *split])], perm=list(perm))
    if then:
        y = op(then, [y])
    g.set_outputs([y])
    return g


CASES = [
    # heads moved before the positions: C's rows split by batch, its columns by heads
    Case("heads", _projection("heads", "float32", (4, 16), (0, 2, 1, 3)), flags=""),
    Case("heads_b_stored", _projection("heads_b_stored", "float16", (4, 16), (0, 2, 1, 3),
                                       tb=False), flags=""),
    # a fused projection cut into three parts of heads, each part's heads before positions
    Case("qkv_parts", _projection("qkv_parts", "bfloat16", (3, 2, 16), (2, 0, 3, 1, 4)),
         flags=""),
    # the rows' two axes swapped (positions before the batch), the columns kept whole
    Case("rows_only", _projection("rows_only", "float32", (40,), (1, 0, 2), rows=(3, 8)),
         flags=""),
]


@pytest.fixture(scope="module")
def library():
    return compile_cases(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_moved_result_is_the_products_addressing(case, library):
    """One cube launch, no Transpose left; the simulator's result is the interpreter's, C
    written once, and every byte read is the tiler's model of one product per piece."""
    result = case.result
    assert [e["kind"] for e in launches(result.graph)] == ["cube"]
    assert "Transpose" not in [n.op for n in result.graph.nodes]
    (s,) = schedules(result).values()
    assert isinstance(s, MatmulSchedule) and s.pitches is not None
    feeds = case.feeds({})
    got, backend = run_sim(result, feeds, library=library)
    assert not backend.unscheduled
    judged = Evaluator(case.graph, feeds).judge(got)
    assert not judged.bad, judged.reason
    (st,) = backend.stats.values()
    assert st.gm_written == got[0].nbytes
    assert st.gm_read == s.tiling.gm_bytes
    assert st.tiling == {f: getattr(s.tiling, f) for f in CUBE_FIELDS}


def test_the_pieces_are_batch_axes_of_their_own(library):
    """The heads' product: batch (B, H), A read at stride 0 over the heads, B's head columns
    D apart (stored [N, K]: D rows of K apart), C's heads S·D apart and its batch H·S·D."""
    by = {c.id: c for c in CASES}
    (s,) = schedules(by["heads"].result).values()
    assert (s.M, s.N, s.K) == (24, 16, 32) and s.batch == (2, 4)
    assert s.a_strides == (24 * 32, 0) and s.b_strides == (0, 16 * 32)
    assert s.c_strides == (4 * 24 * 16, 24 * 16) and s.trans_b
    (s,) = schedules(by["heads_b_stored"].result).values()
    assert s.b_strides == (0, 16) and s.pitches[1] == 64 and not s.trans_b
    (s,) = schedules(by["qkv_parts"].result).values()
    assert s.batch == (2, 3, 2) and s.N == 16
    assert s.c_strides == (2 * 24 * 16, 2 * 2 * 24 * 16, 24 * 16)
    (s,) = schedules(by["rows_only"].result).values()
    assert (s.M, s.N) == (8, 40) and s.batch == (3,) and s.pitches[4] == 3 * 40
    (r,) = render_all({"k": s})
    assert "mm.SetOrgShape((int)t.orgM" in r.files[f"{s.name}.cpp"]


def test_a_result_moving_its_last_axis_stays_a_transpose():
    """[B·S, H·D] seen as [B, S, H, D] then [B, S, D, H]: the columns' pieces swapped, the
    innermost no longer contiguous, which no row pitch writes: the plan says why, and the
    transpose stays a launch of its own."""
    import graphkernel
    from graphkernel.codegen.cube.schedule import MAX_BATCH_AXES
    from graphkernel.codegen.cube.strided import plan

    g = _projection("moved_last", "float32", (4, 16), (0, 1, 3, 2))
    mm = next(n for n in g.nodes if n.op == "MatMul")
    outs = set(map(id, g.outputs))
    why = plan(mm, lambda n: True, lambda v: id(v) in outs, MAX_BATCH_AXES)
    assert why == "the result is written through views moving its last axis"
    res = graphkernel.compile(g, "", env={})
    assert sorted(e["kind"] for e in launches(res.graph)) == ["cube", "vector"]


def test_the_pieces_compile_against_the_real_headers():
    """The kernels above (batch pieces over heads, B's and C's pitches) type-check against
    the real API with their host tiling (skipped without the headers)."""
    from graphkernel.codegen import realcheck
    from tests.codegen.test_realcheck import headers, rendered_cases

    if headers() is None:
        pytest.skip("no Ascend C headers (GRAPHKERNEL_ASCEND_HEADERS)")
    results = realcheck.check_rendered(rendered_cases(CASES), headers())
    assert {r.mode for r in results} >= {"cube", "host"}
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
