"""Syncs and vector barriers (codegen/barriers.py), placed from the kernel IR's reads and
writes: one barrier before each instruction that touches a buffer an earlier one wrote (or,
for a write, read) since the last barrier; the scalar unit's code between syncs."""

from __future__ import annotations

import pytest

from graphkernel.codegen.barriers import place, syncs
from graphkernel.codegen.kernel_ir import (
    TEXT,
    Barrier,
    Call,
    Comment,
    Operand,
    ScalarCode,
    Sync,
    text,
)


def op(t, at="", **kw):
    return Operand(t, at, **kw)


ROW_I = "i * t_.ctp"


@pytest.mark.parametrize("call, written, read", [
    (Call("Add", op("wf0"), (op("xi0"), op("wf1")), "n"), {"wf0"}, {"xi0", "wf1"}),
    (Call("Erf", op("wf0"), (op("wf0"), op("ht", work=True)), "n"), {"wf0", "ht"},
     {"wf0", "ht"}),
    (Call("Cast", op("hh", view="half"), (op("wf0"), "RoundMode::CAST_RINT"), "n"), {"hh"},
     {"wf0"}),
    (Call("Add", op("ac0"), (op("ac0"), op("xi0", ROW_I, by_row=True)), "cols", each_row=True),
     {"ac0"}, {"ac0", "xi0"}),
    (Call("RowReduce", op("wf1"), (op("wf0"), "rows", "cols"), template="<OP_ADD>",
          uses=frozenset({"tb", "rw"})), {"wf1", "tb", "rw"}, {"wf0"}),
])
def test_what_an_instruction_writes_and_reads(call, written, read):
    assert (call.writes, call.reads) == (written, read)


def test_barriers_go_where_a_dependency_is_and_only_there():
    cast = Call("Cast", op("wf0"), (op("xi0"), "RoundMode::CAST_NONE"), "n")  # writes wf0
    dup = Call("Duplicate", op("wf1"), ("CT(2.0f)",), "n")                  # independent
    mul = Call("Mul", op("wf0"), (op("wf0"), op("wf1")), "n")              # reads both
    exp = Call("Exp", op("yo0"), (op("wf0"),), "n")                        # reads wf0 anew
    got = place([cast, dup, Barrier(), mul, exp])  # a barrier given is dropped, placed anew
    assert got == [cast, dup, Barrier(), mul, Barrier(), exp, Barrier()]


def test_write_after_read_needs_a_barrier_too():
    out = place([Call("Muls", op("yo0"), (op("wf0"), "CT(1.0f)"), "n"),
                 Call("Duplicate", op("wf0"), ("CT(0.0f)",), "n")])
    assert isinstance(out[1], Barrier) and sum(isinstance(i, Barrier) for i in out) == 2


def test_a_running_sum_over_rows_orders_its_iterations():
    run = Call("Add", op("ac0"), (op("ac0"), op("xi0", ROW_I, by_row=True)), "cols",
               each_row=True)
    out = place([run])
    assert text(out) == ["for (uint32_t i = 0; i < rows; ++i) { Add(ac0, ac0, "
                         "xi0[i * t_.ctp], cols); PipeBarrier<PIPE_V>(); }"]


def test_a_per_row_call_writing_its_own_row_runs_unordered():
    spread = Call("Muls", op("wf0", ROW_I, by_row=True), (op("tr0"), "CT(1.0f)"), "cols",
                  each_row=True)
    assert place([spread]) == [spread, Barrier()]


def test_nothing_to_order_gives_no_barrier():
    code = [Comment("nothing"), Sync("S", "V")]
    assert place(code) == code


def test_scalar_code_on_ub_runs_between_syncs():
    reduce = Call("ReduceSum", op("red"), (op("xi0", "0 * t_.ctp"), op("rw", work=True)),
                  "cols")
    product = ScalarCode(("product of xi0",), frozenset({"xi0"}), frozenset({"red"}))
    fold = ScalarCode(("fold",), frozenset({"ac0", "red"}), frozenset({"ac0"}))
    out = syncs([reduce, product, fold], loaded=["xi0"])
    # the last of the tile's work: the store waits for what it wrote too
    assert out == [reduce, Sync("V", "S"), Sync("MTE2", "S"), product, fold, Sync("S", "V"),
                   Sync("S", "MTE3")]
    # the scalar unit reads no loaded tile: no wait for the load; a vector op after it
    # orders the store
    assert syncs([reduce, fold, reduce], loaded=["xi0"]) == [reduce, Sync("V", "S"), fold,
                                                             Sync("S", "V"), reduce]


def test_scalar_arithmetic_needs_no_sync():
    sv = ScalarCode(("float sv0 = (2.0f * s0);",))
    assert syncs([sv], loaded=["xi0"]) == [sv]


def test_every_instruction_form_has_a_text_rule():
    forms = {Call, ScalarCode, Sync, Barrier, Comment}
    assert set(TEXT) == forms
    assert text([Call("ColOp", op("w1"), (op("w0"), op("wc0"), "rows"),
                      template="<R.OP_SUB, false>", owner="R."),
                 Call("Duplicate", op("wf0", view="int32_t"), ("(int32_t)5",), "n"),
                 Sync("V", "S"), Comment("Exp x")]) == [
        "R.ColOp<R.OP_SUB, false>(w1, w0, wc0, rows);",
        "Duplicate(wf0.ReinterpretCast<int32_t>(), (int32_t)5, n);",
        "Sync<HardEvent::V_S>();", "// Exp x"]
