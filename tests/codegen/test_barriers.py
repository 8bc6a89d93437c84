"""Vector barrier placement (codegen/barriers.py): one barrier before each instruction that
touches a buffer an earlier one wrote (or, for a write, read) since the last barrier."""

from __future__ import annotations

import pytest

from graphkernel.codegen.barriers import BARRIER, access, place, split_args

BUFS = ["wf0", "wf1", "xi0", "yo0", "tr0", "ac0", "wm0", "hh"]


def test_arguments_split_at_top_level_commas_only():
    assert split_args("wf0[i * t_.ctp], CT(1.0f), hh.ReinterpretCast<half>(), "
                      "BinaryRepeatParams(1, 0, 1, 8, 1, 8)") == [
        "wf0[i * t_.ctp]", "CT(1.0f)", "hh.ReinterpretCast<half>()",
        "BinaryRepeatParams(1, 0, 1, 8, 1, 8)"]


@pytest.mark.parametrize("line, written, read, each", [
    ("Add(wf0, xi0, wf1, n);", {"wf0"}, {"xi0", "wf1"}, False),
    ("Erf(wf0, wf0, ht, n);", {"wf0", "ht"}, {"wf0", "ht"}, False),
    ("Cast(hh.ReinterpretCast<half>(), wf0, RoundMode::CAST_RINT, n);", {"hh"}, {"wf0"}, False),
    ("for (uint32_t i = 0; i < rows; ++i) Add(ac0, ac0, xi0[i * t_.ctp], cols);",
     {"ac0"}, {"ac0", "xi0"}, True),
    ("for (uint32_t i = 0; i < rows; ++i) Muls(wf0[i * t_.ctp], tr0, CT(1.0f), cols);",
     {"wf0"}, {"tr0"}, False),
    ("RowReduce<OP_ADD>(wf1, wf0, rows, cols);", {"wf1", "tb", "rw"}, {"wf0"}, False),
])
def test_what_an_instruction_line_writes_and_reads(line, written, read, each):
    w, r, same = access(line, frozenset(BUFS) | {"tb", "rw", "ht"})
    assert (w, r, same) == (written, read, each)


@pytest.mark.parametrize("line", ["// Add op", "Sync<HardEvent::V_S>();", "{",
                                  "float sv0 = s0 * 2.0f;", "ac0.SetValue(0, CT(l + r));"])
def test_lines_that_are_not_vector_instructions(line):
    assert access(line, frozenset(BUFS)) is None


def test_barriers_go_where_a_dependency_is_and_only_there():
    lines = ["Cast(wf0, xi0, RoundMode::CAST_NONE, n);",   # writes wf0
             "Duplicate(wf1, CT(2.0f), n);",                # independent: no barrier
             BARRIER,                                       # dropped, placed again
             "Mul(wf0, wf0, wf1, n);",                      # reads both: a barrier first
             "Exp(yo0, wf0, n);"]                           # reads wf0 written since
    assert place(lines, BUFS) == [lines[0], lines[1], BARRIER, lines[3], BARRIER, lines[4],
                                  BARRIER]


def test_write_after_read_needs_a_barrier_too():
    out = place(["Muls(yo0, wf0, CT(1.0f), n);", "Duplicate(wf0, CT(0.0f), n);"], BUFS)
    assert out[1] == BARRIER and out.count(BARRIER) == 2  # and the trailing one


def test_a_running_sum_over_rows_orders_its_iterations():
    out = place(["for (uint32_t i = 0; i < rows; ++i) Add(ac0, ac0, xi0[i * t_.ctp], cols);"],
                BUFS)
    assert out == ["for (uint32_t i = 0; i < rows; ++i) { Add(ac0, ac0, xi0[i * t_.ctp], "
                   f"cols); {BARRIER} }}"]  # nothing pending after it: no trailing barrier


def test_nothing_to_order_gives_no_barrier():
    assert place(["// nothing", "Sync<HardEvent::S_V>();"], BUFS) == ["// nothing",
                                                                     "Sync<HardEvent::S_V>();"]
