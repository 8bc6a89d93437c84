"""Convolutional networks' kernels through the default pipeline, run in the simulator: a 1x1
convolution as a product with its per-channel affine, activation and residual add in the
product's tile (one MIX kernel), a global average pool with its mean as one reduction
kernel, and a squeeze-and-excitation block as the pool, two MIX products and the scale."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen.backend import run_sim, schedules
from graphkernel.codegen.cube.schedule import MatmulSchedule
from graphkernel.codegen.traffic import launches
from tests.codegen.cases import Case, compile_cases

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
RNG = np.random.default_rng(11)


def _conv1x1(dtype: str, cin: int, cout: int, hw=(6, 7), scale_input=False, residual=False):
    """conv 1x1 (+ bias) -> per-channel scale -> (+ x) -> ReLU6, in NCHW (a scale that is an
    input stays out of the weights: a column of the product in its epilogue)."""
    g = Graph("c")
    x = g.add_input("x", TensorType((2, cin, *hw), dtype))
    w = g.const((RNG.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(dtype))
    y = g.add_node("Conv2D", [x, w, g.const(RNG.standard_normal(cout).astype(dtype))]).output
    scale = (g.add_input("scale", TensorType((cout, 1, 1), dtype)) if scale_input
             else g.const(RNG.uniform(0.5, 2, (cout, 1, 1)).astype(dtype)))
    y = g.add_node("Mul", [y, scale]).output
    if residual:
        y = g.add_node("Add", [y, x]).output
    y = g.add_node("Minimum", [g.add_node("Maximum", [y, g.const(np.array(0, dtype))]).output,
                               g.const(np.array(6, dtype))]).output
    g.set_outputs([y])
    return g


def _pool():
    """ReLU, then the mean over H and W (a global average pool) and a sigmoid gate."""
    g = Graph("p")
    x = g.add_input("x", TensorType((2, 24, 5, 6), "float32"))
    s = g.add_node("ReduceSum", [g.add_node("Abs", [x]).output], {"axis": [2, 3],
                                                                  "keep_dims": True}).output
    m = g.add_node("Mul", [s, g.const(np.array(1 / 30, np.float32))]).output
    g.set_outputs([g.add_node("Sigmoid", [m]).output])
    return g


CASES = [
    Case("conv1x1_folded_fp32", _conv1x1("float32", 16, 24), flags=""),
    Case("conv1x1_residual_fp16", _conv1x1("float16", 16, 16, scale_input=True,
                                           residual=True), flags=""),
    Case("conv1x1_wide_bf16", _conv1x1("bfloat16", 32, 40, hw=(20, 21), scale_input=True),
         flags=""),
]
POOL = Case("global_average_pool", _pool(), flags="")


def _norm_then_pool():
    """A group norm of one group (the statistics over C, H and W of each image), then the mean
    over H and W: the fusion puts both in one kernel, whose reductions have rows of different
    lengths (C*H*W and H*W)."""
    g = Graph("np")
    x = g.add_input("x", TensorType((2, 8, 4, 5), "float32"))
    flat = g.add_node("Reshape", [x], {"shape": [2, 160]}).output
    inv = g.const(np.array(1 / 160, np.float32))

    def mean(v):
        s = g.add_node("ReduceSum", [v], {"axis": [1], "keep_dims": True}).output
        return g.add_node("Mul", [s, inv]).output

    d = g.add_node("Sub", [flat, mean(flat)]).output
    var = mean(g.add_node("Mul", [d, d]).output)
    r = g.add_node("Rsqrt", [g.add_node("Add", [var, g.const(np.array(1e-5, np.float32))])
                             .output]).output
    y = g.add_node("Reshape", [g.add_node("Mul", [d, r]).output], {"shape": [2, 8, 4, 5]})
    p = g.add_node("ReduceSum", [y.output], {"axis": [2, 3], "keep_dims": True}).output
    g.set_outputs([g.add_node("Mul", [p, g.const(np.array(1 / 20, np.float32))]).output])
    return g


NORM_POOL = Case("norm_then_pool", _norm_then_pool(), flags="")


def _squeeze_excite(c=16, r=4, gate="Sigmoid"):
    """Squeeze-and-excitation: the mean over H and W, a 1x1 convolution to r channels with
    its bias and ReLU, one back to c with its bias and gate, the gate times the input."""
    g = Graph("se")
    x = g.add_input("x", TensorType((2, c, 5, 6), "float32"))
    s = g.add_node("ReduceSum", [x], {"axis": [2, 3], "keep_dims": True}).output
    m = g.add_node("Mul", [s, g.const(np.array(1 / 30, np.float32))]).output

    def conv(v, cin, cout):
        w = g.const((RNG.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype("float32"))
        b = g.const(RNG.standard_normal(cout).astype("float32"))
        return g.add_node("Conv2D", [v, w, b]).output

    h = g.add_node("ReLU", [conv(m, c, r)]).output
    e = g.add_node(gate, [conv(h, r, c)]).output
    g.set_outputs([g.add_node("Mul", [x, e]).output])
    return g


SE = [Case("squeeze_excite", _squeeze_excite(), flags=""),
      Case("squeeze_excite_hardsigmoid", _squeeze_excite(gate="HSigmoid"), flags="")]


@pytest.fixture(scope="module")
def library():
    return compile_cases([*CASES, POOL, NORM_POOL, *SE])


def _check(case, library):
    feeds = case.feeds({})
    got, backend = run_sim(case.result, feeds, library=library)
    assert not backend.unscheduled
    judged = Evaluator(case.graph, feeds).judge(got)
    assert not judged.bad, f"{case.id}: {judged.reason}"
    return backend


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_one_by_one_convolution_block_is_one_mix_kernel(case, library):
    kernels = [n for n in case.result.graph.nodes if n.op == "GraphKernel"]
    assert len(kernels) == 1 and not case.result.report.extra["fallbacks"]
    s = schedules(case.result)[kernels[0].name]
    assert isinstance(s, MatmulSchedule) and s.kernel_kind == "mix"
    assert "col" in {i.layout for i in s.epilogue.inputs}  # the per-channel operands
    _check(case, library)


def test_a_global_average_pool_is_one_reduction_kernel(library):
    kernels = [n for n in POOL.result.graph.nodes if n.op == "GraphKernel"]
    assert len(kernels) == 1 and not POOL.result.report.extra["fallbacks"]
    assert {n.op for n in kernels[0].subgraph.nodes} >= {"ReduceSum", "Mul", "Exp"}
    _check(POOL, library)


def test_reductions_of_two_row_lengths_split_in_two_kernels(library):
    """The fusion keeps the pool's reduction (rows of H*W) apart from the norm's (rows of
    C*H*W): the whole norm, then the pool with its mean, and nothing left for the code
    generator to split (before: the norm's first sum a launch of its own, and a split)."""
    assert not NORM_POOL.result.report.extra["fallbacks"]
    kernels = [n for n in NORM_POOL.result.graph.nodes
               if n.op not in ("Constant", "Reshape")]
    assert [n.op for n in kernels] == ["GraphKernel", "GraphKernel"]
    assert [m.op for m in kernels[0].subgraph.nodes].count("ReduceSum") == 2
    assert {n.op for n in kernels[1].subgraph.nodes} - {"Constant"} == {"ReduceSum", "Mul"}
    _check(NORM_POOL, library)


@pytest.mark.parametrize("case", SE, ids=[c.id for c in SE])
def test_squeeze_and_excitation_is_two_mix_products_and_the_scale(case, library):
    """The convolutions on the pooled channels are products of the images' rows, each with
    its bias and activation (ReLU; the gate) in its tile; the pool is taken into the first
    product's weight (pool_into_product: the weight repeated over the 30 pixels costs less
    than the pool's launch); the gate times the input is the one vector kernel after them
    (three launches; four with the pool a kernel of its own, five before)."""
    res = case.result
    assert [k["kind"] for k in launches(res.graph)] == ["mix", "mix", "vector"]
    assert not res.report.extra["fallbacks"]
    _check(case, library)
