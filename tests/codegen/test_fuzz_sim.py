"""The fuzzer's graphs through code generation and the simulator (120 seeds, one library)."""

from __future__ import annotations

import shutil

import pytest

from tests.fuzz.generator import check_sim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def test_fuzzed_graphs_run_through_generated_kernels_match():
    problems = check_sim(range(0, 120))
    assert not problems, problems
