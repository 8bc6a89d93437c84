"""The fuzzer's graphs through code generation and the simulator (120 seeds, one library)."""

from __future__ import annotations

import pytest

from tests.fuzz.generator import check_sim

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def test_fuzzed_graphs_run_through_generated_kernels_match():
    problems = check_sim(range(0, 120))
    assert not problems, problems
