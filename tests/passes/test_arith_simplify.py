"""Each numbered rule: a positive case, a negative case, and preserved results."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.passes.arith_simplify import RULES
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

F = TensorType((3, 4), "float32")


def build(expr):
    g = Graph("t")
    x = g.add_input("x", F)
    y = g.add_input("y", F)
    g.set_outputs([expr(g, x, y)])
    return g


def op(g, name, *ins, **attrs):
    return g.add_node(name, list(ins), attrs).output


def c(g, v, shape=()):
    return g.const(np.full(shape, v, np.float32))


CASES = {
    1: (lambda g, x, y: op(g, "Mul", c(g, 1.0), x), []),
    2: (lambda g, x, y: op(g, "Add", x, c(g, 0.0, (4,))), []),
    3: (lambda g, x, y: op(g, "Sub", x, c(g, 0.0)), []),
    4: (lambda g, x, y: op(g, "Div", x, c(g, 1.0)), []),
    5: (lambda g, x, y: op(g, "Pow", x, c(g, 1.0)), []),
    6: (lambda g, x, y: op(g, "Neg", op(g, "Neg", x)), []),
    8: (lambda g, x, y: op(g, "Abs", op(g, "Abs", x)), ["Abs"]),
    9: (lambda g, x, y: op(g, "Exp", op(g, "Identity", x)), ["Exp"]),
    10: (lambda g, x, y: op(g, "Mul", x, c(g, -1.0)), ["Neg"]),
    11: (lambda g, x, y: op(g, "Pow", x, c(g, 2.0)), ["Mul"]),
    12: (lambda g, x, y: op(g, "Add", x, op(g, "Neg", y)), ["Sub"]),
    13: (lambda g, x, y: op(g, "Sub", x, op(g, "Neg", y)), ["Add"]),
    14: (lambda g, x, y: op(g, "Exp", op(g, "BroadcastTo", x, shape=[3, 4])), ["Exp"]),
    15: (lambda g, x, y: op(g, "Exp", op(g, "Concat", x, axis=0)), ["Exp"]),
}


def test_rule_15_drops_empty_parts():
    """cat(empty, x, y) -> cat(x, y); cat(x, empty) -> x (a decoder's first cache update)."""
    g = build(lambda g, x, y: op(g, "Concat", g.const(np.zeros((3, 0), np.float32)), x, y,
                                 axis=-1))
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert "rule 15 concat_parts: 1" in res.notes
    assert ops_of(h) == ["Concat"] and len(h.outputs[0].producer.inputs) == 2
    assert_same_results(g, h)
    g = build(lambda g, x, y: op(g, "Concat", x, g.const(np.zeros((0, 4), np.float32)), axis=0))
    h, _ = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert ops_of(h) == []
    assert_same_results(g, h)


@pytest.mark.parametrize("number", sorted(CASES))
def test_rule(number):
    expr, remaining = CASES[number]
    g = build(expr)
    h, res = apply_pass("arith_simplify", g)
    h.remove_dead()
    assert res.modified and any(f"rule {number} " in n for n in res.notes), res.notes
    assert ops_of(h) == remaining
    assert_same_results(g, h)


def test_rule_7_not_not():
    g = Graph()
    b = g.add_input("b", TensorType((4,), "bool"))
    g.set_outputs([op(g, "LogicalNot", op(g, "LogicalNot", b))])
    h, res = apply_pass("arith_simplify", g)
    assert "rule 7 not_not: 1" in res.notes
    h.remove_dead()
    assert ops_of(h) == []


def test_every_rule_is_tested():
    assert {r.number for r in RULES} == set(CASES) | {7}


@pytest.mark.parametrize("expr", [
    lambda g, x, y: op(g, "Mul", x, c(g, 1.0, (2, 3, 4))),   # the 1 broadcasts x: keep
    lambda g, x, y: op(g, "Mul", x, g.const(np.array([1, 1, 1, 2], np.float32))),  # not a splat
    lambda g, x, y: op(g, "Sub", c(g, 0.0), x),                # 0 - x is not x
    lambda g, x, y: op(g, "Div", c(g, 1.0), x),                # 1 / x is not x
    lambda g, x, y: op(g, "Exp", op(g, "Log", x)),             # exp(log x): NaN for x < 0
    lambda g, x, y: op(g, "Mul", x, c(g, 0.0)),                # x * 0: NaN/Inf stay NaN
    lambda g, x, y: op(g, "Concat", x, y, axis=0),             # two non-empty parts stay
])
def test_non_rewrites(expr):
    g = build(expr)
    h, res = apply_pass("arith_simplify", g)
    assert not res.modified and ops_of(h) == ops_of(g)
