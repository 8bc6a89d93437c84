"""Generated Ascend C kernels, compiled in the CPU simulator, against the interpreter.

Every case's kernels are built in one g++ run (module fixture). A case passes when every
output of the compiled graph run through the generated kernels matches the unoptimized
graph op by op within accuracy.md's tolerance for the output dtype.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphkernel import symbolic
from graphkernel.bisect import Evaluator
from graphkernel.codegen import targets
from graphkernel.codegen.backend import run_sim
from graphkernel.interpreter import Interpreter
from graphkernel.verify import compare
from tests.codegen.cases import (
    STRICT,
    compile_cases,
    pattern_cases,
    single_op_cases,
)

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)

SINGLE = single_op_cases()
PATTERNS = pattern_cases()
ALL = SINGLE + PATTERNS

SPEC = targets.load("ascend910b")


@pytest.fixture(scope="module")
def library():
    return compile_cases(ALL)


def selected(source, test) -> list:
    """The cases of ``source`` that ``test`` selects: never none, so a renamed case cannot
    turn a test into one that checks nothing."""
    chosen = [c for c in source if test(c.id)]
    assert chosen, "no case selected: the case list changed"
    return chosen


def simulate(case, library) -> list[tuple[dict, dict, list, object]]:
    """``(dims, feeds, outputs, backend)`` of each of the case's runs through its generated
    kernels in the simulator. Done once per library and kept on the case: the tests that
    check the same launches for different things (accuracy, traffic, core counts, exact
    composites) read the same runs instead of simulating them again."""
    done = getattr(case, "_simulated", None)
    if done is None or done[0] is not library:
        runs = []
        for dims in case.dims:
            feeds = case.feeds(dims)
            got, backend = run_sim(case.result, feeds, library=library)
            runs.append((dims, feeds, got, backend))
        case._simulated = done = (library, runs)
    return done[1]


def check_case(case, library):
    """accuracy.md, as verify judges it: within the dtype's tolerance of the op-by-op run, or
    no further from a high-precision reference than the op-by-op run is (summation order is
    not an error), and no NaN/Inf the op-by-op run does not have.

    Judged once per library and remembered on the case (the tests that read a case's runs
    again get them without judging the same outputs once more); a case that failed is
    remembered as nothing, so every test reading it judges it again and fails too."""
    done = getattr(case, "_checked", None)
    if done is not None and done[0] is library:
        return done[1]
    runs = []
    for dims, feeds, got, backend in simulate(case, library):
        assert not backend.unscheduled, backend.unscheduled
        j = Evaluator(case.graph, feeds).judge(got)
        assert not j.bad, f"{case.id} {dims}: {j.reason}"
        runs.append(backend)
    case._checked = (library, runs)
    return runs


@pytest.mark.parametrize("case", SINGLE, ids=[c.id for c in SINGLE])
def test_single_op_kernel_matches_the_interpreter(case, library):
    (backend,) = check_case(case, library)
    stages = case.result.report.extra.get("phases", [])  # a whole-tensor reduction: two
    assert len(backend.stats) == (len(stages[0]["kernels"]) if stages else 1), \
        "the op became exactly one generated kernel (or its stages)"


@pytest.mark.parametrize("case", PATTERNS, ids=[c.id for c in PATTERNS])
def test_pattern_kernels_match_the_interpreter(case, library):
    runs = check_case(case, library)
    assert all(b.stats for b in runs), "at least one generated kernel ran"
    assert not case.result.report.extra.get("fallbacks"), case.result.report.extra["fallbacks"]


def test_dynamic_shapes_one_kernel_many_sizes(library):
    case = next(c for c in PATTERNS if c.id == "dynamic-layernorm-like")
    runs = check_case(case, library)
    names = {st.name for b in runs for st in b.stats.values()}
    assert len(names) == 1, names  # the same generated kernel served every size
    blocks = [st.block_dim for b in runs for st in b.stats.values()]
    assert blocks[0] == 1 and blocks[-1] == SPEC.aiv_cores, blocks  # b=1 vs b=500


def test_traffic_is_ideal_unless_the_report_says_why(library):
    over = []
    for case in ALL:
        for backend in check_case(case, library):
            for st in backend.stats.values():
                notes = backend.rendered[st.node].schedule.notes
                if st.gm_read + st.gm_written > 1.05 * st.ideal and not notes:
                    over.append((case.id, st.name, st.gm_read + st.gm_written, st.ideal))
    assert not over, over


def test_rows_longer_than_the_ub_are_reduced_in_chunks(library):
    for case in selected(PATTERNS, lambda i: i.startswith("reduce-row-larger-than-ub")):
        (backend,) = check_case(case, library)
        (st,) = backend.stats.values()
        assert backend.rendered[st.node].schedule.row_chunks
        assert st.tiling["ct"] < st.tiling["L"] and st.tiling["nColTiles"] > 1, st.tiling


def test_a_second_pass_over_the_rows_runs_as_phase_kernels(library):
    """Softmax and LayerNorm over rows too long for the UB, softmax over a leading axis: the
    kernel becomes one kernel per pass (max; sum of exponentials; the division), each reading
    the earlier passes' reduced values, reported under ``phases`` with a traffic note."""
    cases = [c for c in PATTERNS if c.id.startswith("phases-")]
    assert len(cases) == 4
    for case in cases:
        (backend,) = check_case(case, library)
        (entry,) = case.result.report.extra["phases"]
        assert len(entry["kernels"]) == 3 and "second pass" in entry["reason"], entry
        assert sorted(backend.stats) == sorted(entry["kernels"])
        notes = case.result.report.extra["codegen"]["traffic_notes"]
        assert all("multi-phase" in " ".join(notes[k]) for k in entry["kernels"]), notes


def test_a_reduction_over_separate_runs_of_axes_runs_in_two_passes(library):
    """ReduceSum/Max over axes (0, 2, 3) of NCHW: over (2, 3) per (n, c) row first, then over
    the leading axis of those results — two phase kernels, no fallback."""
    for case in selected(PATTERNS, lambda i: i.startswith("reduce-separate-runs-")):
        (backend,) = check_case(case, library)
        (entry,) = case.result.report.extra["phases"]
        assert len(entry["kernels"]) == 2 and "one run of adjacent axes" in entry["reason"]
        assert sorted(backend.stats) == sorted(entry["kernels"])


def test_a_whole_tensor_reduction_uses_every_core(library):
    """One value from 300,000 elements: 48 partial reductions (one per core), then a kernel
    combining them — not one core walking one long row."""
    for case in selected(PATTERNS, lambda i: i.startswith("two-stages-")):
        (backend,) = check_case(case, library)
        (entry,) = case.result.report.extra["phases"]
        assert len(entry["kernels"]) == 2
        dims = sorted(backend.stats[k].block_dim for k in entry["kernels"])
        assert dims == [1, SPEC.aiv_cores], dims


def test_concat_is_stored_operand_by_operand(library):
    """A Concat output: no fallback, one kernel whose output is stored in blocks (one queue per
    operand), each operand's rows at their pitch in the output."""
    cases = [c for c in PATTERNS if c.id.startswith("concat-")]
    assert len(cases) == 5
    for case in cases:
        for backend in check_case(case, library):
            (st,) = backend.stats.values()
            (out,) = backend.rendered[st.node].schedule.outputs
            assert len(out.pieces) == 3, case.id


def test_a_symbolic_row_picks_its_variant_at_run_time(library):
    """One kernel, two schedules: whole rows per tile (key 0) where a row fits the UB, rows
    walked in chunks (key 1) where it does not — chosen by the tiling function."""
    (case,) = (c for c in PATTERNS if c.id == "reduce-row-symbolic-length")
    keys = []
    for backend, dims in zip(check_case(case, library), case.dims, strict=True):
        (st,) = [st for st in backend.stats.values() if st.tiling["L"] == dims["n"]]
        keys.append(st.tiling["key"])
        r = backend.rendered[st.node]
        assert r.schedule.variant is not None and "1" in r.manifest["tiling_keys"]
    assert keys == [0, 1, 0]


def test_an_outer_difference_binds_its_input_twice_and_is_one_kernel(library):
    """``x[None, :] - x[:, None]``: one load of x cannot be both the row broadcast over the
    loop space and the value per row; the generator refuses one input in both roles (the
    kernel had computed x[None, :] - x[None, :]) and the kernel is rebuilt with x bound twice,
    each a load of its own."""
    for case in (c for c in PATTERNS if c.id.startswith("outer-difference-")):
        for backend in check_case(case, library):
            (st,) = backend.stats.values()
            ins = backend.rendered[st.node].schedule.inputs
            assert sorted(io.kind for io in ins) == ["col", "row"], case.id
        (k,) = [n for n in case.result.graph.nodes if n.op == "GraphKernel"]
        assert len(k.inputs) == 2 and k.inputs[0] is k.inputs[1]


def test_a_large_kernel_occupies_every_core(library):
    # (a reduction of everything to one value runs in two stages: partials on every core,
    # then one kernel combining them; the first stage is the large one)
    for case in selected(SINGLE, lambda i: "-large-float32" in i):
        (backend,) = check_case(case, library)
        st = max(backend.stats.values(), key=lambda st: st.block_dim)
        assert st.block_dim == SPEC.aiv_cores, (case.id, st.block_dim, st.tiling)
        assert st.tiling["units"] >= SPEC.aiv_cores


def test_larger_than_one_tile_loops_over_tiles(library):
    case = next(c for c in SINGLE if c.id == "Add-large-float32")
    (backend,) = check_case(case, library)
    (st,) = backend.stats.values()
    t = st.tiling
    assert t["units"] > SPEC.aiv_cores and t["ct"] < t["L"], t  # several tiles on a core
    elems = t["rt"] * t["ctp"]
    assert elems * 4 * 6 <= SPEC.ub_bytes  # x, y, z double-buffered in fp32 fit the UB


def test_codegen_output_is_deterministic():
    import graphkernel
    from graphkernel.codegen.backend import render_all, schedules

    case = next(c for c in PATTERNS if c.id == "LayerNorm-float16")
    a = render_all(schedules(graphkernel.compile(case.graph, case.flags, env={})))
    b = render_all(schedules(graphkernel.compile(case.graph, case.flags, env={})))
    assert [r.files for r in a] == [r.files for r in b]


def test_node_names_cannot_inject_code():
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.codegen.backend import render_all, schedules

    g = Graph("evil")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    bad = 'x"); system("rm -rf /"); //\n*/ #include <evil>'
    g.set_outputs([g.add_node("Exp", [x], name=bad).output])
    res = graphkernel.compile(g, "--enable_single_node_fusion", env={})
    (r,) = render_all(schedules(res))
    for text in r.files.values():
        assert "system(" not in text and "#include <evil>" not in text
    assert r.name.replace("_", "").isalnum()


def test_unsupported_kernel_falls_back_with_reason_or_errors():
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.errors import CodegenError

    g = Graph("fb")
    x = g.add_input("x", TensorType((8, 8, 16), "float32"))
    t = g.add_node("Transpose", [x], {"perm": [1, 0, 2]}).output  # x read through two views
    g.set_outputs([g.add_node("Add", [t, g.add_node("Reshape", [x], {"shape": [8, 8, 16]})
                                      .output]).output])
    res = graphkernel.compile(g, "--opt_level=3", env={})
    fb = res.report.extra["fallbacks"]
    assert fb and "Transpose" in fb[0]["reason"] and fb[0]["nodes"], fb
    assert not [n for n in res.graph.nodes if n.op == "GraphKernel"]
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 8, 16)).astype(np.float32)}
    np.testing.assert_allclose(Interpreter(res.graph).run(feeds)[0],
                               Interpreter(g).run(feeds)[0], rtol=1e-6)
    with pytest.raises(CodegenError, match="disable_fallback"):
        graphkernel.compile(g, "--opt_level=3 --disable_fallback", env={})


# ops of the default cluster list the generator does not emit alone (each falls back, with the
# reason naming it); the composites without an instruction are rewritten by
# codegen/vector/decompose.py, int32 data is generated through BitwiseAnd/BitwiseOr
NOT_GENERATED: set[str] = set()
ALONE_NOT_GENERATED: set[str] = set()


def test_every_elementwise_cluster_op_is_generated_or_falls_back_naming_it():
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.fusion import DEFAULT_CLUSTER_OPS
    from graphkernel.opdefs.elementwise import BINARY, UNARY

    seen = {"generated": [], "fallback": []}
    for op in sorted(DEFAULT_CLUSTER_OPS & (set(UNARY) | set(BINARY))):
        if op in ("Identity",):
            continue
        dtype = "bool" if op.startswith("Logical") else "int32" if op.startswith(
            "Bitwise") else "float32"
        g = Graph(op)
        ins = [g.add_input(f"x{i}", TensorType((8, 40), dtype))
               for i in range(1 if op in UNARY else 2)]
        g.set_outputs([g.add_node(op, ins, name="the_op").output])
        res = graphkernel.compile(g, "--enable_single_node_fusion", env={})
        kernels = [n for n in res.graph.nodes if n.op == "GraphKernel"]
        if kernels:
            seen["generated"].append(op)
            assert op not in NOT_GENERATED | ALONE_NOT_GENERATED, op
        else:
            (fb,) = res.report.extra["fallbacks"]
            assert op in NOT_GENERATED | ALONE_NOT_GENERATED, (op, fb["reason"])
            assert op in fb["reason"] or "data" in fb["reason"], fb
            seen["fallback"].append(op)
    assert set(seen["fallback"]) == NOT_GENERATED | ALONE_NOT_GENERATED
    assert len(seen["generated"]) >= 48, seen  # 48 of 48 when this was written


def test_int32_data_outside_bitwise_ops_falls_back_naming_the_op():
    import graphkernel
    from graphkernel import Graph, TensorType

    g = Graph("ints")
    x, y = (g.add_input(k, TensorType((8, 40), "int32")) for k in "xy")
    a = g.add_node("BitwiseAnd", [x, y]).output
    g.set_outputs([g.add_node("Add", [a, y], name="int_add").output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    (fb,) = res.report.extra["fallbacks"]
    assert "Add of int32 data" in fb["reason"], fb


@pytest.mark.parametrize("case", [c for c in SINGLE if c.id.split("-")[0] in STRICT],
                         ids=lambda c: c.id)
def test_rewritten_composites_and_power_match_elementwise(case, library):
    """The ops codegen/vector/decompose.py rewrites, and Pow by a tensor exponent: every element
    within the dtype's tolerance of the op itself (stricter than verify's RMSE criterion), on
    inputs at their edge cases (tiny arguments of Expm1/Log1p, rounded multiples of the
    divisor, both axes of Atan2,
    negative bases with integer exponents)."""
    ((dims, feeds, got, _),) = simulate(case, library)
    assert dims == {}, dims
    want = Interpreter(case.graph).run(feeds)
    m = compare(got[0], want[0], case.graph.outputs[0].dtype)
    assert m.passed, f"{case.id}: {m.mismatched} of {m.numel} elements off, max rel {m.max_rel_err}"
    op = case.id.split("-")[0]
    if op in ("Expm1", "Log1p") and case.id.endswith("float32"):  # a few ulp at every magnitude
        exact = getattr(np, op.lower())(feeds["x"].astype(np.float64))
        assert np.max(np.abs(got[0] - exact) / np.abs(exact)) < 4e-7, case.id


def test_enable_low_precision_kernels_compute_in_fp16():
    """With enable_low_precision an all-fp16 kernel keeps fp16 in UB (CT = half): an
    elementwise chain then equals the fp16 op-by-op run bit for bit (each op rounds to fp16,
    as numpy's fp16 ops do), where the promoted kernel (fp32 inside) rounds once; and half
    the bytes per element in UB leave room for larger tiles."""
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.codegen.backend import render_all, schedules
    from graphkernel.codegen.vector.lower import lower
    from graphkernel.codegen.vector.tiling import budget

    g = Graph("lp")
    x, y = (g.add_input(k, TensorType((37, 300), "float16")) for k in "xy")
    n = lambda op, ins: g.add_node(op, ins).output  # noqa: E731
    z = n("Mul", [n("Exp", [n("Sub", [x, y])]), n("Add", [x, n("Tanh", [y])])])
    g.set_outputs([n("Maximum", [n("Div", [z, n("Abs", [y])]), x])])
    rng = np.random.default_rng(3)
    feeds = {k: rng.standard_normal((37, 300)).astype(np.float16) for k in "xy"}
    want = Interpreter(g).run(feeds)[0]
    runs = {}
    for flags in ("--opt_level=2", "--opt_level=2 --enable_low_precision"):
        res = graphkernel.compile(g, flags, env={})
        scheds = schedules(res)
        (s,) = scheds.values()
        (r,) = render_all(scheds)
        got, backend = run_sim(res, feeds)
        assert backend.stats, flags
        runs[flags] = (s, r, got[0])
    s16, r16, got16 = runs["--opt_level=2 --enable_low_precision"]
    s32, r32, got32 = runs["--opt_level=2"]
    assert s16.compute.value == "float16" and s32.compute.value == "float32"
    src16 = r16.files[f"{s16.name}.cpp"]
    assert "using CT = half;" in src16 and "LocalTensor<CT> wf0" in src16
    assert "RoundMode::CAST_NONE" not in src16  # no widening of the fp16 inputs
    assert np.array_equal(got16, want)
    assert not np.array_equal(got32, want)  # fp32 inside: rounded once, differently
    assert budget(s16, lower(s16)).tile < budget(s32, lower(s32)).tile


def _one_kernel(g):
    """g (copied) with all its computing nodes in one GraphKernel, scheduled: a kernel shape
    the fusion patterns may not form, for the schedule's own tests."""
    from graphkernel.codegen.legalize import check
    from graphkernel.kernels import build_kernel

    g2 = g.copy()
    k = build_kernel(g2, [n for n in g2.nodes if n.op != "Constant"], "one", "test")
    return g2, {k.name: check(k, SPEC)}


@pytest.mark.parametrize("wshape", [(4, 1, 33), (33,), (4, 50, 1), (1,), (4, 50, 33)])
def test_reductions_over_middle_axes_in_blocks_of_rows(wshape):
    """ReduceSum over axis 1 of [4, 50, 33]: 4 blocks of 50 rows, each reduced column-wise
    (row b*M + r of the loop space), with a second input in each layout (not (50, 1): one
    value per row broadcast over the blocks is not placed in the loop space); and the same over
    a symbolic number of blocks (1, 5 and 100 of them: units = blocks x column tiles)."""
    from graphkernel import Graph, TensorType
    from graphkernel.codegen.backend import SimBackend

    for lead in (4, "a"):
        g = Graph("mid")
        x = g.add_input("x", TensorType((lead, 50, 33), "float32"))
        w = g.add_input("w", TensorType(tuple(lead if d == 4 else d for d in wshape),
                                        "float32"))
        e = g.add_node("Mul", [g.add_node("Exp", [x]).output, w]).output
        s = g.add_node("ReduceSum", [e], {"axis": [1], "keep_dims": True}).output
        g.set_outputs([s, g.add_node("ReduceMax", [x], {"axis": [1]}).output])
        g2, scheds = _one_kernel(g)
        (sch,) = scheds.values()
        assert sch.col_reduce and symbolic.canon(sch.batch) == symbolic.canon(lead)
        for a in ((4,) if lead == 4 else (1, 5, 100)):
            rng = np.random.default_rng(a)
            feeds = {v.name: rng.standard_normal(tuple(a if d == "a" else d for d in v.shape))
                     .astype(np.float32) for v in g.inputs}
            backend = SimBackend(g2, scheds)
            got = Interpreter(g2, kernel_runner=backend).run(feeds)
            assert backend.stats and not backend.unscheduled
            j = Evaluator(g, feeds).judge(got)
            assert not j.bad, (wshape, a, j.reason)
            (st,) = backend.stats.values()
            assert st.tiling["nBatch"] == a and st.tiling["units"] >= a


def _grn_graph(shape, dtype="float32"):
    """ConvNeXt-V2's global response norm on ``shape`` ([N, H, W, C]), the mean over C a
    sum and a scale (as the expanders leave it)."""
    from graphkernel import Graph, TensorType

    g = Graph("grn")
    C = shape[-1]
    x = g.add_input("x", TensorType(shape, dtype))
    gamma = g.add_input("gamma", TensorType((1, 1, 1, C), dtype))
    beta = g.add_input("beta", TensorType((1, 1, 1, C), dtype))
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    gx = n("Sqrt", [n("ReduceSum", [n("Mul", [x, x])], axis=[1, 2], keep_dims=True)])
    mean = n("Mul", [n("ReduceSum", [gx], axis=[3], keep_dims=True),
                     g.const(np.float32(1.0 / C))])
    nx = n("Div", [gx, n("Add", [mean, g.const(np.float32(1e-6))])])
    g.set_outputs([n("Add", [n("Add", [n("Mul", [gamma, n("Mul", [x, nx])]), beta]), x])])
    return g


def _grn_numpy(x, gamma, beta):
    x64 = x.astype(np.float64)
    gx = np.sqrt((x64 * x64).sum(axis=(1, 2), keepdims=True))
    nx = gx / (gx.mean(axis=-1, keepdims=True) + 1e-6)
    return gamma * (x64 * nx) + beta + x64


@pytest.mark.parametrize("shape", [(2, 4, 4, 32), (3, 5, 7, 37), (1, 3, 3, 7),
                                   (2, 40, 40, 96)])
def test_a_global_response_norm_is_one_kernel_over_the_rows_in_two_passes(shape):
    """GRN as one kernel: N blocks of H*W rows of C (a reduction over middle axes), the
    sums of squares accumulated per column tile, the mean over C of their square roots a
    final step (a reduction of the reduced row: the column tile is the whole row), then a
    second pass over the block's rows broadcasting Nx back. Simulated against numpy, odd
    sizes and a block of several row tiles included."""
    from graphkernel.codegen.backend import SimBackend

    N, H, W, C = shape
    g = _grn_graph(shape)
    g2, scheds = _one_kernel(g)
    (s,) = scheds.values()
    assert s.col_reduce and s.batch == N and s.M == H * W and s.L == C
    assert s.whole_row_tiles and len(s.late_reduces) == 1
    assert sorted(n.op for n in s.steps if id(n) in s.second) == ["Add", "Add", "Mul", "Mul"]
    assert s.second_inputs() == {0, 1, 2} and s.second_outputs() == {0}  # x, gamma, beta
    rng = np.random.default_rng(N * C)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "gamma": rng.standard_normal((1, 1, 1, C)).astype(np.float32),
             "beta": rng.standard_normal((1, 1, 1, C)).astype(np.float32)}
    backend = SimBackend(g2, scheds)
    (got,) = Interpreter(g2, kernel_runner=backend).run(feeds)
    assert backend.stats and not backend.unscheduled
    np.testing.assert_allclose(got, _grn_numpy(**feeds), rtol=2e-5, atol=2e-5)
    (st,) = backend.stats.values()
    assert st.tiling["ct"] == C and st.tiling["nColTiles"] == 1 and st.tiling["units"] == N
    if shape == (2, 40, 40, 96):
        assert st.tiling["rt"] < H * W  # the passes walk several row tiles of each block


def test_a_second_pass_refuses_what_it_cannot_have_again():
    """The second pass reads inputs, rows held for the column tile and its own values: a
    tile of the first pass (softmax over middle axes divides exp(x), computed before the
    sum) splits the kernel into phase kernels, as before, naming what it reads."""
    from graphkernel import Graph, TensorType
    from graphkernel.codegen.legalize import check
    from graphkernel.codegen.refusal import NeedsPhases
    from graphkernel.kernels import build_kernel

    g = Graph("k")
    # (blocks of 4100 rows: more than a block tile holds, which fewer rows run as)
    x = g.add_input("x", TensorType((2, 820, 5, 8), "float32"))
    e = g.add_node("Exp", [x], name="e").output
    s = g.add_node("ReduceSum", [e], {"axis": [1, 2], "keep_dims": True}).output
    g.set_outputs([g.add_node("Div", [e, s]).output])
    k = build_kernel(g, [n for n in g.nodes if n.op != "Constant"], "one", "test")
    with pytest.raises(NeedsPhases, match="a second pass over the rows: it reads e, a full "
                                          "value of the first pass"):
        check(k, SPEC)


def test_a_global_response_norm_through_the_pipeline_is_one_launch_reading_x_twice():
    """Compiled with the library's defaults: one launch (three without
    reduce_broadcast_back), reading x once per pass (the traffic model counts both) and
    writing the result once; simulated, the outputs are the interpreter's."""
    import graphkernel
    from graphkernel.codegen.traffic import launches

    g = _grn_graph((2, 6, 5, 40))
    res = graphkernel.compile(g, "", env={})
    (one,) = launches(res.graph)
    x_bytes = 2 * 6 * 5 * 40 * 4
    assert one["kind"] == "vector" and one["bytes_read"] == 2 * x_bytes + 2 * 40 * 4
    assert one["bytes_written"] == x_bytes
    assert len(launches(graphkernel.compile(
        g, "--disable_fusion_pattern=reduce_broadcast_back", env={}).graph)) == 3
    feeds = {v.name: np.random.default_rng(1).standard_normal(v.shape).astype(np.float32)
             for v in g.inputs}
    got, backend = run_sim(res, feeds)
    assert backend.stats and not backend.unscheduled
    j = Evaluator(g, feeds).judge(got)
    assert not j.bad, j.reason


def test_a_concat_of_different_shapes_is_one_kernel_or_refused_naming_why():
    """DenseNet's and Inception's concats (operands with different channel counts): pieces
    that end with the same ops become one kernel (the ops run once after the Concat, which
    loads its inputs piece by piece); other pieces are not pulled in, and explain says why."""
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.explain import explain

    for second, kernels in (("Exp", 1), ("Neg", 2)):
        g = Graph("cat")
        a = g.add_input("a", TensorType((1, 8, 6, 6), "float32"))
        b = g.add_input("b", TensorType((1, 4, 6, 6), "float32"))
        ra = g.add_node("Exp", [g.add_node("Relu", [a]).output]).output
        rb = g.add_node(second, [g.add_node("Relu", [b]).output]).output
        g.set_outputs([g.add_node("Concat", [ra, rb], {"axis": 1}).output])
        res = graphkernel.compile(g, "--opt_level=2", env={})
        assert not res.report.extra["fallbacks"]
        assert sum(n.op == "GraphKernel" for n in res.graph.nodes) == kernels
        refused = [r["reason"] for r in explain(res)["candidates"]
                   if r["pattern"] == "concat" and r["verdict"] != "fused"]
        assert bool(refused) == (kernels == 2), refused


def _row_loops(text: str) -> list[str]:
    """The text of every loop over a tile's rows in a kernel source (one line, or a braced
    block to its closing brace)."""
    lines, loops = text.splitlines(), []
    for k, ln in enumerate(lines):
        if "i < rows; ++i)" not in ln:
            continue
        body, depth = [ln], ln.count("{") - ln.count("}")
        for nxt in lines[k + 1:]:
            if depth <= 0:
                break
            body.append(nxt)
            depth += nxt.count("{") - nxt.count("}")
        loops.append("\n".join(body))
    return loops


def test_per_row_values_stay_on_the_vector_unit(library):
    """No scalar GetValue/SetValue inside a loop over rows in any generated kernel (a scalar
    round trip there would need a V->S and an S->V sync per row): row reductions are
    WholeReduce*, a column against rows is Brcb then strided vector instructions. A product
    along rows has no vector instruction: the scalar unit walks it, fenced once per tile. (An
    embedding lookup's read of each row's index is a GetValue of GM, not of UB: no vector
    result is waited for.)"""
    from graphkernel.codegen.backend import render_all, schedules

    loops = 0
    for case in ALL:
        if "ReduceProd" in case.id:
            continue
        for r in render_all(schedules(case.result)):
            for loop in _row_loops(r.files[f"{r.name}.cpp"]):
                loops += 1
                ub = re.sub(r"\bgi\d+\.GetValue", "", loop)  # (GM reads of indices)
                assert "GetValue" not in ub and "SetValue" not in ub, (case.id, loop)
    assert loops > 50  # the check saw the row loops it is about


def test_layernorm_kernel_has_no_scalar_round_trip():
    """examples/layernorm_residual.json: mean and variance by WholeReduceSum, subtraction
    and scaling of each row by Brcb + strided Sub/Mul; the simulator counts no scalar UB
    access, the pipe check passes and the output matches."""
    import graphkernel
    from graphkernel.codegen.backend import render_all, schedules
    from graphkernel.frontends import load_model
    from graphkernel.interpreter import random_inputs

    g = load_model("examples/layernorm_residual.json")
    res = graphkernel.compile(g, env={})
    (r,) = render_all(schedules(res))
    src = r.files[f"{r.name}.cpp"]
    compute = src[src.index("void Compute("):]
    assert "RowReduce<OP_ADD>" in compute and "ColOp<OP_SUB" in compute
    assert "GetValue" not in compute and "SetValue" not in compute
    feeds = random_inputs(g, 0, {})
    outs, backend = run_sim(res, feeds)
    assert not Evaluator(g, feeds).judge(outs).bad
    (st,) = backend.stats.values()
    assert st.scalar == 0 and st.vector > 0, (st.scalar, st.vector)


def test_every_instruction_table_entry_is_generated_by_a_case(library):
    """Each entry of the instruction table is lowered by at least one single-op or pattern
    case above (so each is checked against the interpreter in the simulator), but for the
    two no case's kernel reaches: Sigmoid is expanded before codegen, and simplification
    folds the fp16 round trip a rounding Cast inside a kernel would come from. Every op the
    cases' kernels run has an entry, but for a Concat of column pieces (rotary's halves),
    whose step copies columns into one tile (``ColsCopy``) rather than computing."""
    from graphkernel.codegen.backend import schedules
    from graphkernel.codegen.instructions import INSTRUCTIONS

    seen = {n.op for case in ALL for s in schedules(case.result).values()
            if hasattr(s, "steps")  # (a vector kernel's: a case's product is the cube's)
            for x in (s, s.variant) if x is not None for n in x.steps}
    assert len(seen) > 20
    assert set(INSTRUCTIONS) - seen == {"Sigmoid", "Cast"}
    assert seen - set(INSTRUCTIONS) <= {"Concat"}


def test_rotary_stored_as_is_and_head_transposed_is_one_kernel(library):
    """Rotary on [B, S, N, D] heads whose result the graph also returns transposed to
    [B, N, S, D] (a key cache beside the attention's BSND read): the `transpose` pattern
    puts the Transpose into the rotary's kernel, which stores its tile twice, the second
    time row by row to the transposed places."""
    (case,) = selected(PATTERNS, lambda i: i == "rotary-stored-head-transposed")
    (backend,) = check_case(case, library)
    (st,) = backend.stats.values()
    kernels = [n for n in case.result.graph.nodes if n.op == "GraphKernel"]
    assert len(kernels) == 1 and len(kernels[0].outputs) == 2
    assert "transpose" in kernels[0].attrs["pattern"]
