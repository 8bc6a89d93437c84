"""Cube kernels: every MatMul/BatchMatMul shape class, transpose combination and dtype is
generated on the Matmul API, run in the simulator and judged against the op-by-op run (one
simulator library for all); the host tiler agrees with the Python one; GM traffic is the
tiler's; what is not generated falls back naming why."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen import targets
from graphkernel.codegen.backend import run_sim, schedules
from graphkernel.codegen.matmul_schedule import MatmulSchedule
from graphkernel.codegen.matmul_tiling import tile
from graphkernel.codegen.sim.execute import CUBE_FIELDS
from tests.codegen.cases import Case, compile_cases

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
SPEC = targets.load("ascend910b")


def _mm(shape_a, shape_b, dtype="float16", ta=False, tb=False, op="MatMul",
        transpose=(), name="mm") -> Graph:
    """A product of two inputs; ``transpose`` names the operands fed through a Transpose of
    their last two axes (folded into isTrans)."""
    g = Graph(name)
    ins = [g.add_input("a", TensorType(shape_a, dtype)), g.add_input("b", TensorType(shape_b,
                                                                                    dtype))]
    for i, which in enumerate("ab"):
        if which in transpose:
            r = len(ins[i].shape)
            ins[i] = g.add_node("Transpose", [ins[i]], {"perm": [*range(r - 2), r - 1, r - 2]}
                                ).output
    g.set_outputs([g.add_node(op, ins, {"transpose_a": ta, "transpose_b": tb}).output])
    return g


def _case(cid: str, graph: Graph, **kw) -> Case:
    return Case(cid, graph, flags="", **kw)  # the default pipeline


CASES = [
    _case("aligned", _mm((128, 256), (256, 64))),
    _case("unaligned", _mm((50, 90), (90, 70))),
    _case("k_tail", _mm((64, 1000), (1000, 48))),          # K not a multiple of baseK
    _case("m_below_cores", _mm((5, 64), (64, 2000))),       # M < the cube cores
    _case("ta", _mm((90, 50), (90, 70), ta=True)),
    _case("tb", _mm((50, 90), (70, 90), tb=True)),
    _case("ta_tb", _mm((90, 50), (70, 90), ta=True, tb=True)),
    _case("transpose_node", _mm((50, 90), (70, 90), transpose="b")),
    _case("transpose_node_and_attr", _mm((90, 50), (90, 70), tb=True, transpose="ab")),
    _case("bf16", _mm((50, 90), (90, 70), "bfloat16")),
    _case("fp32", _mm((50, 90), (90, 70), "float32")),
    _case("batch", _mm((2, 3, 40, 64), (2, 3, 64, 48), op="BatchMatMul")),
    _case("batch_broadcast", _mm((2, 3, 40, 64), (3, 64, 48), op="BatchMatMul", tb=False)),
    _case("grouped_query", _mm((1, 4, 2, 24, 32), (1, 4, 1, 32, 24), op="BatchMatMul",
                              dtype="float32")),
    _case("batch_transpose", _mm((2, 4, 24, 32), (1, 4, 24, 32), op="BatchMatMul",
                                transpose="b", dtype="bfloat16")),
    _case("symbolic_m", _mm(("s0", 64), (64, 80)), dims=[{"s0": 3}, {"s0": 333}]),
]


@pytest.fixture(scope="module")
def library():
    return compile_cases(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cube_kernels_match_the_interpreter(case, library):
    (k,) = [n for n in case.result.graph.nodes if n.op != "Constant"]
    s = schedules(case.result)[k.name]
    assert isinstance(s, MatmulSchedule) and not case.result.report.extra["fallbacks"]
    assert s.trans_a == (case.id in ("ta", "ta_tb")) or "transpose" in case.id
    for dims in case.dims:
        feeds = case.feeds(dims)
        got, backend = run_sim(case.result, feeds, library=library)
        assert not backend.unscheduled
        judged = Evaluator(case.graph, feeds).judge(got)
        assert not judged.bad, f"{case.id} {dims}: {judged.reason}"
        (st,) = backend.stats.values()
        assert st.gm_written == got[0].nbytes
        if s.tiling is not None:  # static: the simulator's loads are the tiler's model
            assert st.gm_read == s.tiling.gm_bytes
            assert st.tiling == {f: getattr(s.tiling, f) for f in CUBE_FIELDS}
            assert st.block_dim == s.tiling.usedCoreNum


def test_transposes_fold_into_is_trans(library):
    by_id = {c.id: c for c in CASES}
    for cid, want in [("transpose_node", (False, True)), ("transpose_node_and_attr",
                                                           (True, False))]:
        (s,) = schedules(by_id[cid].result).values()
        assert (s.trans_a, s.trans_b) == want
        assert "Transpose" not in [n.op for n in by_id[cid].result.graph.nodes]
    src = next(iter(schedules(by_id["ta_tb"].result).values()))
    from graphkernel.codegen.backend import render_all

    (r,) = render_all({"k": src})
    text = r.files[f"{src.name}.cpp"]
    assert "MatmulType<TPosition::GM, CubeFormat::ND, half, true>" in text
    assert "mm.End();" in text and "#define ASCENDC_CUBE_ONLY" in text
    assert "matmul_tiling::MatmulApiTiling" in r.files[f"{src.name}_tiling.cpp"]


def test_the_host_tiler_is_the_python_tiler(library):
    """The symbolic-M kernel's host function (C++) against codegen/matmul_tiling.py over
    a sweep of M: the same TCubeTiling field for field."""
    case = next(c for c in CASES if c.id == "symbolic_m")
    (s,) = schedules(case.result).values()
    for m in (1, 7, 16, 100, 333, 1024, 5000, 20000):
        _, block, fields = library.tiling(s.name, [(m, 64), (64, 80)], SPEC)
        t = tile(m, 80, 64, 2, 2, 2, SPEC)
        assert fields == {f: getattr(t, f) for f in CUBE_FIELDS}, m
        assert block == t.usedCoreNum


def test_a_broadcast_batch_reads_its_operand_per_batch_element(library):
    case = next(c for c in CASES if c.id == "batch_broadcast")
    (s,) = schedules(case.result).values()
    assert s.b_strides == (0, 64 * 48) and s.a_strides == (3 * 40 * 64, 40 * 64)
    assert any("broadcast batch operand" in n for n in s.notes)


def test_what_is_not_generated_falls_back_naming_it():
    g = Graph("i8")
    a = g.add_input("a", TensorType((16, 32), "int8"))
    b = g.add_input("b", TensorType((32, 16), "int8"))
    g.set_outputs([g.add_node("MatMul", [a, b], {}).output])
    res = graphkernel.compile(g, "", env={})
    (fb,) = res.report.extra["fallbacks"]
    assert "MatMul of int8" in fb["reason"] and "int32" in fb["reason"]
    with pytest.raises(graphkernel.errors.CodegenError, match="MatMul of int8"):
        graphkernel.compile(g, "--disable_fallback", env={})


def test_feeds_are_exact_for_integers_in_the_product():
    """Small integers in fp16: every product and sum is exact in fp32, so the cube kernel's
    result equals numpy's to the bit (the accumulation is fp32, rounded once)."""
    case = _case("exact", _mm((33, 70), (70, 20)))
    lib = compile_cases([case])
    rng = np.random.default_rng(1)
    feeds = {"a": rng.integers(-3, 4, (33, 70)).astype(np.float16),
             "b": rng.integers(-3, 4, (70, 20)).astype(np.float16)}
    (got,), _ = run_sim(case.result, feeds, library=lib)
    np.testing.assert_array_equal(got, (feeds["a"].astype(np.float32) @ feeds["b"].astype(
        np.float32)).astype(np.float16))
