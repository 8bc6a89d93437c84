"""docs/security.md and the README's "Bad input" section state the limits the code enforces."""

from __future__ import annotations

from pathlib import Path

from graphkernel import limits
from graphkernel.outputs import MAX_FILE_NAME

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "security.md").read_text()
README = (ROOT / "README.md").read_text()


def test_the_limits_table_states_the_enforced_values():
    table = DOC[DOC.index("## Limits"):DOC.index("## Exit status")]
    assert f"| {limits.MAX_GRAPH_FILE_BYTES // 2**20} MiB" in table
    assert f"| {limits.MAX_FLAGS_FILE_BYTES // 2**20} MiB;" in table
    assert f"| {limits.MAX_DEPTH} levels |" in table
    assert f"| {limits.MAX_YAML_ALIASES:,} references" in table
    assert f"at most {limits.MAX_YAML_VALUES:,} values" in table
    assert limits.MAX_DIM == 2**31 - 1 and "0 … 2³¹−1" in table
    assert limits.MAX_NUMEL == 2**40 and "| 2⁴⁰ |" in table
    assert f"| {limits.MAX_FLAG_STRING // 2**10} KiB |" in table
    assert f"| {limits.MAX_FLAG_VALUE:,} characters |" in table
    assert f"| {limits.MAX_INT_DIGITS} digits |" in table
    assert f"at most {MAX_FILE_NAME} characters" in DOC
    assert limits.MAX_ONNX_FILE_BYTES == 2**31 and "| an `.onnx` file | 2 GiB" in table
    assert f"manifest.json` | {limits.MAX_MANIFEST_BYTES // 2**20} MiB" in table
    assert f"{limits.MAX_YAML_EXPANDED_CHARS:,} characters of text" in table
    assert f"directory | {limits.MAX_NPZ_DIRECTORY_BYTES // 2**20} MiB" in table
    assert f"of at most {limits.MAX_DIM_FACTORS} factors" in table
    assert f"| the rank of a tensor | {limits.MAX_RANK} dims |" in table


def test_the_trust_model_is_stated_by_source():
    head = DOC[:DOC.index("## Model files are data")]
    for words in ["torch.compile", "the Python API", "**code**", "**data**", "a flags file",
                  "a model file"]:
        assert words in head, words
    for words in ["FILE_ATEN_OVERLOADS", "functional", "uninitialised", "symbolic link",
                  "SHA-256", "0700", "/proc/self/fd"]:
        assert words in DOC, words


def test_the_readme_says_what_each_bad_input_gets():
    section = README[README.index("## Bad input"):README.index("## System requirements")]
    assert "(docs/security.md)" in section
    for words in ["exit 2", "exit 1", "exit 3", "--export-onnx", "alias bomb",
                  "torch.ops.load_library", "nothing written"]:
        assert words in section, words
