"""Vector kernel forms for per-row and per-column values: an int32 index per row read as
floats."""

from __future__ import annotations

import pytest

from tests.codegen.cases import compile_cases, pattern_cases
from tests.codegen.test_codegen import check_case

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)

INT32_ROWS = [c for c in pattern_cases() if c.id.startswith("int32-index-per-row-")]


@pytest.fixture(scope="module")
def library():
    return compile_cases(INT32_ROWS)


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
