"""concat_sink: branches that end with the same elementwise ops (their own constants) hand a
Concat their raw results and the ops run once below it; the fused result is one kernel."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from tests.codegen.cases import Case, compile_cases
from tests.codegen.test_codegen import check_case
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

R = np.random.default_rng(3)


def branches(channels=(3, 5, 2), shared_relu=True, dtype="float32", extra_use=False):
    """Inception's block tail: per branch x*scale + shift (per-channel constants of its own),
    then max(., 0); the branches concatenated along the channels."""
    g = Graph("inception_tail")
    outs = []
    for k, c in enumerate(channels):
        x = g.add_input(f"x{k}", TensorType((2, c, 4, 6), dtype))
        s = g.const(R.random((c, 1, 1)).astype(dtype))
        b = g.const(R.random((c, 1, 1)).astype(dtype) - 0.5)
        y = g.add_node("Add", [g.add_node("Mul", [x, s], {}).output, b], {}).output
        zero = g.const(np.zeros((), dtype)) if shared_relu else g.const(
            np.full((1, 1, 1), -0.1 * k, dtype))
        outs.append(g.add_node("Maximum", [y, zero], {}).output)
    cat = g.add_node("Concat", outs, {"axis": 1}).output
    g.set_outputs([cat, outs[0]] if extra_use else [cat])
    return g


def test_the_whole_chain_sinks_below_the_concat():
    g = branches()
    h, res = apply_pass("concat_sink", g)
    h.remove_dead()
    assert res.modified and res.rewrites == 3  # Maximum, then Add, then Mul
    assert ops_of(h) == ["Concat", "Mul", "Add", "Maximum"]
    assert_same_results(g, h)


def test_per_branch_constants_of_the_concat_axis_are_joined_in_order():
    g = branches(shared_relu=False)
    h, _ = apply_pass("concat_sink", g)
    h.remove_dead()
    assert ops_of(h) == ["Concat", "Mul", "Add", "Maximum"]
    assert_same_results(g, h)


@pytest.mark.parametrize("why", ["a piece read elsewhere", "different ops", "a variable operand"])
def test_what_does_not_sink(why):
    if why == "a piece read elsewhere":
        g = branches(extra_use=True)  # branch 0's result is also an output: the last op stays
        h, _ = apply_pass("concat_sink", g)
        assert ops_of(h).count("Maximum") == 3
        return
    g = Graph("t")
    x = g.add_input("x", TensorType((2, 3), "float32"))
    y = g.add_input("y", TensorType((2, 3), "float32"))
    a = g.add_node("Exp", [x], {}).output
    b = (g.add_node("Tanh", [y], {}).output if why == "different ops"
         else g.add_node("Add", [y, x], {}).output)
    a = a if why == "different ops" else g.add_node("Add", [x, y], {}).output
    g.set_outputs([g.add_node("Concat", [a, b], {"axis": 0}).output])
    h, res = apply_pass("concat_sink", g)
    assert not res.modified and ops_of(h) == ops_of(g)


CASES = [Case(f"inception-tail-{dt}", branches(dtype=dt), "--opt_level=2", dims=[{}])
         for dt in ("float32", "float16")]


@pytest.mark.sim
def test_the_branches_and_their_concat_are_one_simulated_kernel():
    library = compile_cases(CASES)
    for case in CASES:
        check_case(case, library)
        ex = case.result.report.extra
        assert not ex.get("fallbacks"), ex["fallbacks"]
        assert ex["kernels_fused"] == 1, case.id


def angles(shared=True, steps=1):
    """Rotary angles as a decoder computes them from positions: the position column times
    the frequencies, the product concatenated with itself (``cat(freqs, freqs)``); the cos
    and the sin read it."""
    g = Graph("angles")
    p = g.add_input("p", TensorType((2, steps, 1), "float32"))
    other = p if shared else g.add_input("q", TensorType((2, steps, 1), "float32"))
    inv = g.const((1.0 / 10000 ** (np.arange(8) / 8)).astype(np.float32))
    m = g.add_node("Mul", [p, inv], {}).output
    m2 = m if shared else g.add_node("Mul", [other, inv], {}).output
    c = g.add_node("Concat", [m, m2], {"axis": 2}).output
    g.set_outputs([g.add_node("Cos", [c], {}).output, g.add_node("Sin", [c], {}).output])
    return g


def test_a_shared_operand_broadcast_along_the_axis_is_read_as_it_is():
    """cat(p * f, p * f) -> p * cat(f, f): one product whose cos and sin one kernel takes."""
    g = angles()
    h, res = apply_pass("concat_sink", g)
    h.remove_dead()
    assert res.rewrites == 1 and ops_of(h) == ["Mul", "Cos", "Sin"]
    (mul,) = [n for n in h.nodes if n.op == "Mul"]
    assert mul.inputs[0].name == "p" and tuple(mul.inputs[1].shape) == (1, 1, 16)
    assert_same_results(g, h)


@pytest.mark.parametrize("why", ["two positions", "not broadcast along the axis"])
def test_a_shared_operand_that_does_not_qualify(why):
    if why == "two positions":  # each piece its own variable operand of extent 1: no Concat
        g = angles(shared=False)  # of them would have the pieces' shape
    else:  # the shared operand spans the Concat's axis already: it is no broadcast
        g = Graph("t")
        x = g.add_input("x", TensorType((2, 8), "float32"))
        m = g.add_node("Mul", [x, g.const(np.float32(2.0))], {}).output
        g.set_outputs([g.add_node("Concat", [m, m], {"axis": 1}).output])
    h, res = apply_pass("concat_sink", g)
    if why == "two positions":
        assert not res.modified and ops_of(h) == ops_of(g)
    else:  # (the same product twice: its operand is concatenated, as for any pieces)
        h.remove_dead()
        assert ops_of(h) == ["Concat", "Mul"]
        assert_same_results(g, h)
