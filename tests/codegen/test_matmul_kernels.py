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
from graphkernel.codegen.cube.schedule import MatmulSchedule
from graphkernel.codegen.cube.tiling import tile
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


def _strided(cid: str, dtype: str) -> Graph:
    """Products read or written through views that move batch or row axes only (a chunked
    scan's layouts: [b, c, l, h, p] moved to heads before positions and back)."""
    g = Graph(cid)

    def inp(name, shape):
        return g.add_input(name, TensorType(shape, dtype))

    def n(op, ins, **attrs):
        return g.add_node(op, ins, attrs).output

    bmm = "BatchMatMul"
    if cid == "strided_result_rows":  # [b, c, h, l, n] -> [b, c, l, h, n]
        y = n(bmm, [inp("a", (2, 3, 4, 8, 16)), inp("b", (2, 3, 4, 16, 24))])
        out = n("Transpose", [y], perm=[0, 1, 3, 2, 4])
    elif cid == "strided_operand_rows":  # A's heads and rows swapped before the product
        a = n("Transpose", [inp("a", (2, 8, 3, 16))], perm=[0, 2, 1, 3])
        out = n(bmm, [a, inp("b", (2, 3, 16, 24))])
    elif cid == "strided_merged_batch_transposed":  # x [b, c, l, h, p] as [b c h, p, l]
        a = n("Transpose", [inp("a", (2, 2, 8, 3, 16))], perm=[0, 1, 3, 4, 2])
        a = n("Reshape", [a], shape=[12, 16, 8])
        out = n(bmm, [a, inp("b", (12, 8, 20))])
    elif cid == "strided_broadcast_split":  # C shared by heads; the result split, moved
        a = n("BroadcastTo", [n("Reshape", [inp("a", (2, 2, 8, 16))], shape=[2, 2, 1, 8, 16])],
              shape=[2, 2, 4, 8, 16])
        y = n(bmm, [a, inp("b", (2, 2, 4, 16, 12))])
        y = n("Reshape", [y], shape=[2, 2, 4, 8, 12, 1])
        out = n("Transpose", [y], perm=[0, 1, 3, 2, 5, 4])
    elif cid == "strided_sliced_operand":  # chunk states after the first, moved [.., n, p]
        b = n("StridedSlice", [inp("b", (2, 3, 4, 16, 12))], begin=[1], end=[3], strides=[1],
              axes=[1])
        b = n("Transpose", [b], perm=[0, 1, 2, 4, 3])
        y = n(bmm, [inp("a", (2, 2, 4, 8, 16)), b], transpose_b=True)
        out = n("Transpose", [y], perm=[0, 1, 3, 2, 4])
    else:  # both operands and the result moved, B read transposed
        a = n("Transpose", [inp("a", (2, 24, 3, 16))], perm=[0, 2, 1, 3])
        b = n("Transpose", [inp("b", (2, 20, 3, 16))], perm=[0, 2, 3, 1])
        out = n("Transpose", [n(bmm, [a, b])], perm=[0, 2, 1, 3])
    g.set_outputs([out])
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
    # the forms product_transpose makes: a weight read for every batch element (a projection
    # moved to channels-first), a batch of operands read transposed (channels-first data)
    _case("weight_over_batch", _mm((70, 90), (2, 50, 90), op="BatchMatMul", tb=True,
                                   dtype="float32")),
    _case("batch_read_transposed", _mm((2, 90, 50), (70, 90), op="BatchMatMul", ta=True,
                                       tb=True, dtype="float32")),
    # views moving batch or row axes only, taken into the product's addressing (strided.py)
    *[_case(cid, _strided(cid, dt)) for cid, dt in (
        ("strided_result_rows", "float32"), ("strided_operand_rows", "float16"),
        ("strided_merged_batch_transposed", "float32"), ("strided_broadcast_split", "float32"),
        ("strided_both", "bfloat16"), ("strided_sliced_operand", "float32"))],
]


@pytest.fixture(scope="module")
def library():
    return compile_cases(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cube_kernels_match_the_interpreter(case, library):
    (k,) = [n for n in case.result.graph.nodes if n.op != "Constant"]
    s = schedules(case.result)[k.name]
    assert isinstance(s, MatmulSchedule) and not case.result.report.extra["fallbacks"]
    assert s.trans_a == (case.id in ("ta", "ta_tb")) or "transpose" in case.id or \
        case.id.startswith("strided")
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


def test_views_moving_rows_are_the_products_addressing(library):
    """Each strided case is one cube launch: the views around the product are its row
    pitches (SetOrgShape) and batch offsets, none a kernel of its own."""
    from graphkernel.codegen.backend import render_all

    for case in (c for c in CASES if c.id.startswith("strided")):
        (s,) = schedules(case.result).values()
        assert s.pitches is not None and s.kernel_kind == "cube", case.id
        (r,) = render_all({"k": s})
        assert "mm.SetOrgShape((int)t.orgM" in r.files[f"{s.name}.cpp"]
        assert "t.orgKc = " in r.files[f"{s.name}_tiling.cpp"]
    (s,) = schedules(next(c for c in CASES if c.id == "strided_merged_batch_transposed")
                     .result).values()
    # A is x[b, c, l, h, p] read as [b c h][p, l]: the (b, c) and h batch pieces apart, the
    # positions at a pitch of h * p, read transposed
    assert s.batch == (4, 3) and s.a_strides == (8 * 3 * 16, 16) and s.trans_a
    assert s.pitches[0] == 3 * 16
    (s,) = schedules(next(c for c in CASES if c.id == "strided_sliced_operand").result).values()
    assert s.offsets == (0, 4 * 16 * 12)  # B starts at its second chunk


def test_the_host_tiler_is_the_python_tiler(library):
    """The symbolic-M kernel's host function (C++) against codegen/cube/tiling.py over
    a sweep of M: the same TCubeTiling field for field."""
    case = next(c for c in CASES if c.id == "symbolic_m")
    (s,) = schedules(case.result).values()
    for m in (1, 7, 16, 100, 333, 1024, 5000, 20000):
        _, block, fields = library.tiling(s.name, [(m, 64), (64, 80), (m, 80)], SPEC)
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


# ------------------------------------------------------------------ MIX kernels
def _mix(name: str, a_shape, b_shape, epilogue, dtype="float16", op="MatMul", tb=False):
    """A product and ``epilogue(graph, node, product)`` as one kernel, built directly (the
    generator's own test, whatever the fusion patterns would form)."""
    from graphkernel.kernels import build_kernel

    g = Graph(name)
    a = g.add_input("a", TensorType(a_shape, dtype))
    b = g.add_input("b", TensorType(b_shape, dtype))

    def node(op_, ins, **attrs):
        return g.add_node(op_, ins, attrs).output

    g.set_outputs(list(epilogue(g, node, node(op, [a, b], transpose_b=tb))))
    fused = g.copy()
    k = build_kernel(fused, [n for n in fused.nodes if n.op != "Constant"], "k", "test")
    return g, fused, k


def _inp(g, name, shape, dtype="float16"):
    return g.add_input(name, TensorType(shape, dtype))


MIX = {
    "bias": lambda g, n, y: [n("Add", [y, _inp(g, "bias", (70,))])],
    "bias_fp32_row": lambda g, n, y: [n("Cast", [n("Add", [n("Cast", [y], dtype="float32"),
                                                           _inp(g, "bias", (70,), "float32")
                                                           ])], dtype="float16")],
    "scale_mask": lambda g, n, y: [n("Add", [n("Mul", [y, g.add_node(
        "Constant", [], {"value": np.array(0.125, np.float16)}).output]),
        _inp(g, "mask", (1, 1, 40, 40))])],
    "gelu": lambda g, n, y: [n("Mul", [y, n("Sigmoid", [n("Mul", [y, g.add_node(
        "Constant", [], {"value": np.array(1.702, np.float16)}).output])])])],
    "silu_two_outputs": lambda g, n, y: [y, n("Mul", [y, n("Sigmoid", [y])])],
    "relu_residual": lambda g, n, y: [n("Add", [n("Maximum", [y, g.add_node(
        "Constant", [], {"value": np.array(0.0, np.float16)}).output]),
        _inp(g, "r", (50, 70))])],
    "cast_out": lambda g, n, y: [n("Cast", [y], dtype="float32")],
    "sub_div_pow": lambda g, n, y: [n("Div", [n("Pow", [n("Sub", [y, _inp(g, "r", (50, 70))]),
                                                        g.add_node("Constant", [], {
                                                            "value": np.array(2.0, np.float16)
                                                        }).output]), _inp(g, "d", (1,))])],
}
MIX["regrouped_mask"] = lambda g, n, y: [n("Add", [n("Reshape", [y], shape=[2, 4, 40, 40]),
                                                   _inp(g, "mask", (2, 1, 40, 40))])]


def _c(g, value, dtype="float16"):
    return g.add_node("Constant", [], {"value": np.array(value, dtype)}).output


def _layernorm(g, n, s, dtype, affine=True):
    """LayerNorm along the last axis as the expander leaves it: mean, variance, rsqrt, then
    the scale and shift rows."""
    width = int(s.type.shape[-1])
    mean = n("Div", [n("ReduceSum", [s], axis=[-1], keep_dims=True), _c(g, width, dtype)])
    d = n("Sub", [s, mean])
    var = n("Div", [n("ReduceSum", [n("Mul", [d, d])], axis=[-1], keep_dims=True),
                    _c(g, width, dtype)])
    y = n("Mul", [d, n("Rsqrt", [n("Add", [var, _c(g, 1e-5, dtype)])])])
    return n("Add", [n("Mul", [y, _inp(g, "gamma", (width,), dtype)]),
                     _inp(g, "beta", (width,), dtype)]) if affine else y


def _rmsnorm(g, n, y):
    """LLaMA's: x * rsqrt(mean(x^2) + eps) * weight, in fp32."""
    ms = n("Div", [n("ReduceSum", [n("Pow", [y, _c(g, 2.0, "float32")])], axis=[-1],
                     keep_dims=True), _c(g, 70.0, "float32")])
    inv = n("Rsqrt", [n("Add", [ms, _c(g, 1e-6, "float32")])])
    return [n("Mul", [n("Mul", [y, inv]), _inp(g, "w", (70,), "float32")])]


def _softmax(g, n, y):
    """Attention scores: scale, mask, then softmax along the keys (expanded)."""
    x = n("Add", [n("Mul", [y, _c(g, 0.125)]), _inp(g, "mask", (1, 1, 40, 40))])
    e = n("Exp", [n("Sub", [x, n("ReduceMax", [x], axis=[-1], keep_dims=True)])])
    return [n("Div", [e, n("ReduceSum", [e], axis=[-1], keep_dims=True)])]


# epilogues that reduce along N: a base tile holds whole rows
MIX["layernorm_two_outputs"] = lambda g, n, y: [  # GPT-2: the residual sum, normalised
    s := n("Add", [y, _inp(g, "r", (50, 70))]), _layernorm(g, n, s, "float16")]
MIX["bias_residual_layernorm_fp32"] = lambda g, n, y: [_layernorm(  # BERT's
    g, n, n("Add", [n("Add", [y, _inp(g, "bias", (70,), "float32")]),
                    _inp(g, "r", (300, 70), "float32")]), "float32")]
MIX["rmsnorm_fp32"] = _rmsnorm
MIX["scale_mask_softmax"] = _softmax
MIX["regrouped_softmax"] = lambda g, n, y: [  # GPT-2's export: heads merged back after
    n("Reshape", [_softmax(g, n, n("Reshape", [y], shape=[2, 4, 40, 40]))[0]],
      shape=[8, 40, 40])]
# a 1x1 convolution as W[M, C] @ x[n][C, H*W] (conv_matmul): per-channel operands are
# columns of the product; a view splits H*W into [H, W]
MIX["conv_bias_relu"] = lambda g, n, y: [n("Maximum", [n("Reshape", [n("Add", [
    y, _inp(g, "bias", (40, 1))])], shape=[2, 40, 6, 11]), _c(g, 0.0)])]
MIX["conv_affine_residual_relu6"] = lambda g, n, y: [n("Minimum", [n("Maximum", [n("Add", [
    n("Add", [n("Mul", [n("Reshape", [y], shape=[2, 40, 6, 11]), _inp(g, "alpha", (1, 40, 1, 1))]),
              _inp(g, "beta", (40, 1, 1))]), _inp(g, "r", (2, 40, 6, 11))]), _c(g, 0.0)]),
    _c(g, 6.0)])]
MIX["conv_per_image_scale_fp32"] = lambda g, n, y: [  # squeeze-and-excitation's scale
    n("Mul", [n("Reshape", [y], shape=[2, 40, 66, 1]), _inp(g, "se", (2, 40, 1, 1), "float32")])]
SHAPES = {"scale_mask": ((2, 3, 40, 64), (2, 3, 40, 64), "BatchMatMul", True),
          "conv_bias_relu": ((40, 24), (2, 24, 66), "BatchMatMul", False),
          "conv_affine_residual_relu6": ((40, 24), (2, 24, 66), "BatchMatMul", False),
          "conv_per_image_scale_fp32": ((40, 24), (2, 24, 66), "BatchMatMul", False),
          "regrouped_mask": ((8, 40, 64), (8, 40, 64), "BatchMatMul", True),
          "scale_mask_softmax": ((2, 3, 40, 64), (2, 3, 40, 64), "BatchMatMul", True),
          "regrouped_softmax": ((8, 40, 64), (8, 40, 64), "BatchMatMul", True),
          "bias_residual_layernorm_fp32": ((300, 90), (90, 70), "MatMul", False)}
DTYPES = {"bias_residual_layernorm_fp32": "float32", "rmsnorm_fp32": "float32",
          "conv_per_image_scale_fp32": "float32"}


@pytest.fixture(scope="module")
def mix_library():
    from graphkernel.codegen.backend import render_all
    from graphkernel.codegen.legalize import check
    from graphkernel.codegen.sim.execute import SimLibrary

    built = {}
    for name, epi in MIX.items():
        a, b, op, tb = SHAPES.get(name, ((50, 90), (90, 70), "MatMul", False))
        g, fused, k = _mix(name, a, b, epi, DTYPES.get(name, "float16"), op=op, tb=tb)
        built[name] = (g, fused, k, check(k, SPEC))
    lib = SimLibrary(render_all({v[2].name + n: v[3] for n, v in built.items()}))
    return built, lib


@pytest.mark.parametrize("name", MIX)
def test_mix_kernels_match_the_interpreter(name, mix_library):
    from graphkernel.codegen.backend import SimBackend
    from graphkernel.interpreter import Interpreter

    built, lib = mix_library
    g, fused, k, s = built[name]
    assert isinstance(s, MatmulSchedule) and s.kernel_kind == "mix"
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([int(d) for d in v.shape]).astype(v.dtype.np)
             for v in g.inputs}
    if "d" in feeds:
        feeds["d"] = np.abs(feeds["d"]) + 1
    backend = SimBackend(fused, {k.name: s}, library=lib)
    got = Interpreter(fused, kernel_runner=backend).run(feeds)
    assert not backend.unscheduled
    judged = Evaluator(g, feeds).judge(got)
    assert not judged.bad, f"{name}: {judged.reason}"
    (st,) = backend.stats.values()
    assert st.gm_written == sum(o.nbytes for o in got)  # each output tile written once
    # the product's operands as the tiler models them; a tile input once (a broadcast one
    # once per batch element), a row once per tile, a scalar once per vector core with
    # blocks (these products have no more blocks than AI Cores: one per block)
    t = s.tiling
    layout = {fused.inputs[i.index].name: i.layout for i in s.epilogue.inputs}
    size = got[0].size  # a tile input: the product's extent (a broadcast one re-read)
    once = sum(size * feeds[v].itemsize for v, lay in layout.items() if lay == "tile")
    once += sum(feeds[v].nbytes * st.block_dim for v, lay in layout.items() if lay == "scalar")
    if {"row", "col"} & set(layout.values()):  # a row or column per tile of each core
        assert st.gm_read > t.gm_bytes + once
    else:
        assert st.gm_read == t.gm_bytes + once


def test_mix_kernel_code_runs_the_epilogue_on_each_tile(mix_library):
    from graphkernel.codegen.backend import render_all

    built, _ = mix_library
    s = built["gelu"][3]
    (r,) = render_all({"k": s})
    text = r.files[f"{s.name}.cpp"]
    assert "while" not in text and "mm.Iterate()" in text and "mm.GetTensorC(c);" in text
    assert "Sigmoid(" in text and "IterateAll" not in text and "ASCENDC_CUBE_ONLY" not in text
    assert r.manifest["kind"] == "mix"
    assert s.tiling.baseM * s.tiling.baseN * s.ub_per_elem(s.plan()) <= SPEC.ub_bytes


def test_reductions_along_n_hold_whole_rows_in_a_tile(mix_library):
    """An epilogue reducing along N tiles with N in one core and one base tile (the cores
    split M); its reductions and per-row operations are the vector kernels' row forms."""
    from graphkernel.codegen.backend import render_all

    built, lib = mix_library
    for name in ("layernorm_two_outputs", "bias_residual_layernorm_fp32", "rmsnorm_fp32",
                 "scale_mask_softmax", "regrouped_softmax"):
        s = built[name][3]
        t = s.tiling
        assert s.whole_rows and t.coresN == 1 and t.singleCoreN == t.N <= t.baseN, name
        _, block, fields = lib.tiling(s.name, [io.shape for io in [*s.inputs, *s.outputs]], SPEC)
        assert fields == {f: getattr(t, f) for f in CUBE_FIELDS}, name  # the host's tiler
        assert block == t.usedCoreNum
        assert t.baseN < t.N + 16 and [b.name for b in s.plan().buffers if b.name.startswith(
            ("bwc", "btb", "brw"))][-2:] == ["btb", "brw"], name
    assert built["bias_residual_layernorm_fp32"][3].tiling.coresM > 1  # M split over cores
    s = built["layernorm_two_outputs"][3]
    (r,) = render_all({"k": s})
    text = r.files[f"{s.name}.cpp"]
    assert "R.RowReduce<R.OP_ADD>(wc" in text and "R.ColOp<R.OP_SUB, false>(" in text
    assert "__aicore__ inline void RowReduce(" in text  # the vector kernels' own form
    assert not built["gelu"][3].whole_rows and "RowReduce" not in render_all(
        {"k": built["gelu"][3]})[0].files[f"{built['gelu'][3].name}.cpp"]


@pytest.mark.parametrize("n, dtype, limit", [
    (600, "float32", r"L0B 77824 of 65536"),  # baseN 608 at baseK 16: past half of L0B
    (768, "float16", r"UB \d+ of 196352"),    # within L0B; 16 rows of the epilogue: past UB
])
def test_rows_too_long_for_a_tile_split_the_kernel_with_the_reason(n, dtype, limit):
    """Rows the MIX kernel cannot hold: the codegen declines naming the limit, and the pass
    splits the kernel into the cube kernel and the normalisation's vector kernel, as without
    the fusion (the fusion itself asks first; this is the codegen's own check)."""
    g, fused, k = _mix("long_rows", (50, 90), (90, n), lambda g, nd, y: [_layernorm(
        g, nd, nd("Add", [y, _inp(g, "r", (50, n), dtype)]), dtype, affine=False)], dtype)
    from graphkernel.codegen.legalize import check
    from graphkernel.codegen.refusal import Unsupported

    with pytest.raises(Unsupported, match=rf"no base tile holds whole rows of N = {n} .*"
                                          + limit) as e:
        check(k, SPEC)
    assert e.value.node.op == "MatMul"
    res = graphkernel.compile(fused, "", env={})
    (fb,) = res.report.extra["fallbacks"]
    assert "no base tile holds whole rows" in fb["reason"]
    assert fb["action"].startswith("split around MatMul")
    kinds = sorted(res.report.extra["codegen"]["kinds"].values())
    assert kinds == ["cube", "vector"]


def test_an_epilogue_outside_the_model_falls_back_to_two_kernels():
    """A reduction after the product that is not broadcast back writes a value per row, not
    tiles of the product: the kernel is split into a cube kernel and a vector kernel, with
    the reason."""
    g = Graph("mm_reduce")
    a = g.add_input("a", TensorType((32, 64), "float16"))
    b = g.add_input("b", TensorType((64, 48), "float16"))
    y = g.add_node("MatMul", [a, b], {}).output
    g.set_outputs([g.add_node("ReduceSum", [y], {"axis": [1], "keep_dims": True}).output])
    from graphkernel.codegen.legalize import check
    from graphkernel.kernels import build_kernel

    fused = g.copy()
    k = build_kernel(fused, [n for n in fused.nodes if n.op != "Constant"], "k", "test")
    with pytest.raises(Exception, match="is not a tile of the product"):
        check(k, SPEC)


def test_a_reduced_value_broadcast_along_the_other_axis_is_refused():
    """A sum of rows kept as [M] and subtracted from the [M, M] product broadcasts along the
    rows (numpy aligns it with N): not a value per row, so the epilogue refuses it."""
    from graphkernel.codegen.legalize import check
    from graphkernel.codegen.refusal import Unsupported

    g, fused, k = _mix("col_as_row", (70, 90), (90, 70), lambda g, n, y: [
        n("Sub", [y, n("ReduceSum", [y], axis=[-1])])])
    with pytest.raises(Unsupported, match=r"broadcasts a reduced value of shape \[70\] over "
                                          r"\[70,70\]"):
        check(k, SPEC)


@pytest.mark.parametrize(("wrong", "message"), [
    ("rows", "out of bounds"),      # a whole base tile's worth read past the M values
    ("offset", "out of bounds"),    # the column read at the tile's column offset, not its row
])
def test_a_broken_column_load_is_caught(wrong, message):
    """The column input of a convolution epilogue (the per-channel bias, M = 40 values) is
    read at the tile's first row for its rows; the simulator refuses the kernel that reads a
    whole base tile of rows, or at the column offset, past the input's 40 values."""
    import dataclasses

    from graphkernel.codegen.backend import SimBackend, render_all
    from graphkernel.codegen.legalize import check
    from graphkernel.codegen.sim.execute import SimLibrary
    from graphkernel.codegen.sim.runner import SimulatorError
    from graphkernel.interpreter import Interpreter

    name = "conv_bias_relu"
    a, b, op, tb = SHAPES[name]
    g, fused, k = _mix(name, a, b, MIX[name], op=op, tb=tb)
    s = check(k, SPEC)
    assert s.tiling.baseM > 40 or s.tiling.baseN > 40  # the broken reads leave the input
    (r,) = render_all({"k": s})
    src = r.files[f"{s.name}.cpp"]
    good = "[offX2 + gr], DataCopyExtParams{1, (uint32_t)(rows * sizeof(half))"
    assert good in src
    bad = {"rows": good.replace("(rows *", "(bM *"),
           "offset": good.replace("offX2 + gr]", "offX2 + gr + gcol + bN]")}[wrong]
    broken = dataclasses.replace(r, files={**r.files, f"{s.name}.cpp": src.replace(good, bad)})
    lib = SimLibrary([broken])
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([int(d) for d in v.shape]).astype(v.dtype.np)
             for v in g.inputs}
    backend = SimBackend(fused, {k.name: s}, library=lib)
    with pytest.raises(SimulatorError, match=message):
        Interpreter(fused, kernel_runner=backend).run(feeds)


def _many_blocks():
    """A batched product with a bias epilogue that has more blocks of work than the target
    has cube cores: the launch's blocks take several each, so both vector cores of a block
    have blocks to drive."""
    a, b = (30, 40, 64), (30, 64, 40)
    g, fused, k = _mix("many_blocks", a, b, lambda g, n, y: [n("Add", [y, _inp(g, "bias",
                                                                               (40,))])],
                       op="BatchMatMul")
    from graphkernel.codegen.legalize import check

    s = check(k, SPEC)
    t = s.tiling
    assert t.batch * t.coresM * t.coresN > t.usedCoreNum  # more blocks than the launch's
    return g, fused, k, s


OLD_LOOP = "for (uint64_t blk = GetBlockIdx(); blk < t.nBatch * per; blk += GetBlockNum()) {"
NEW_LOOP = "for (uint64_t blk = w; blk < t.nBatch * per; blk += nw) {"


@pytest.mark.parametrize("loop", ["vector_cores", "block_index"])
def test_a_mix_kernel_takes_its_blocks_by_vector_core(loop):
    """On a vector core of a MIX_AIC_1_2 launch GetBlockIdx() is block * 2 + sub-block and
    GetBlockNum() the blocks: the kernel numbers its workers by vector core, so every output
    tile is written once. The loop that took GetBlockIdx() for the block and stepped by
    GetBlockNum() gives two vector cores the same blocks, which the simulator refuses."""
    import dataclasses

    from graphkernel.codegen.backend import SimBackend, render_all
    from graphkernel.codegen.sim.execute import SimLibrary
    from graphkernel.codegen.sim.runner import SimulatorError
    from graphkernel.interpreter import Interpreter

    g, fused, k, s = _many_blocks()
    (r,) = render_all({"k": s})
    src = r.files[f"{s.name}.cpp"]
    assert NEW_LOOP in src and "GetSubBlockIdx() * GetBlockNum()" in src
    if loop == "block_index":
        r = dataclasses.replace(r, files={**r.files, f"{s.name}.cpp": src.replace(NEW_LOOP,
                                                                                 OLD_LOOP)})
    backend = SimBackend(fused, {k.name: s}, library=SimLibrary([r]))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([int(d) for d in v.shape]).astype(v.dtype.np)
             for v in g.inputs}
    if loop == "block_index":
        with pytest.raises(SimulatorError, match="two cores write the same output"):
            Interpreter(fused, kernel_runner=backend).run(feeds)
        return
    got = Interpreter(fused, kernel_runner=backend).run(feeds)
    judged = Evaluator(g, feeds).judge(got)
    assert not judged.bad, judged.reason
    (st,) = backend.stats.values()
    assert st.gm_written == got[0].nbytes  # each output tile written once
    assert st.block_dim == s.tiling.usedCoreNum  # the launch is the tiling's, as before


def test_a_mix_kernel_reads_a_broadcast_operand_in_place():
    """C·Bᵀ of a chunked scan with C shared by the heads of its group and the decay mask
    multiplied in the epilogue: the broadcast is the operand's batch stride 0 (one launch, a
    MIX kernel; no copy of C over the heads), run in the simulator against the reference."""
    from graphkernel.codegen.backend import render_all
    from graphkernel.codegen.traffic import launches
    from graphkernel.interpreter import random_inputs, run_graph

    g = Graph("mix_strided")
    c = g.add_input("c", TensorType((2, 2, 8, 16), "float32"))
    bt = g.add_input("b", TensorType((2, 2, 4, 8, 16), "float32"))
    mask = g.add_input("mask", TensorType((2, 2, 4, 8, 8), "float32"))
    a = g.add_node("Reshape", [c], {"shape": [2, 2, 1, 8, 16]}).output
    a = g.add_node("BroadcastTo", [a], {"shape": [2, 2, 4, 8, 16]}).output
    y = g.add_node("BatchMatMul", [a, bt], {"transpose_b": True}).output
    g.set_outputs([g.add_node("Mul", [y, mask]).output])
    res = graphkernel.compile(g, "", env={})
    assert [e["kind"] for e in launches(res.graph)] == ["mix"]
    (s,) = schedules(res).values()
    assert s.kernel_kind == "mix" and s.pitches is not None and s.a_strides[2] == 0
    (r,) = render_all({"k": s})
    assert "mm.SetOrgShape(" in r.files[f"{s.name}.cpp"]
    feeds = random_inputs(g, 3)
    got, _ = run_sim(res, feeds)
    np.testing.assert_allclose(got[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-5)
