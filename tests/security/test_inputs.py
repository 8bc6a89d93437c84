"""Malformed and oversized model and flags files: each gets one error line naming what is wrong
and what would be accepted, exit 2, no traceback, and nothing is read without limit."""

from __future__ import annotations

import pytest

from graphkernel import limits
from tests.security.conftest import graph_doc, have, write_json

needs_onnx = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


def _input(shape):
    return [{"name": "x", "shape": shape, "dtype": "float32"}]


# (file name, content, words the error line must hold)
BAD_MODELS = [
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested more than 64 deep"),
    ("deep_obj.json", '{"a":' * 5_000 + "1" + "}" * 5_000, "nested more than 64 deep"),
    ("huge_dim.json", graph_doc(inputs=_input([2**62])),
     f"dim 4611686018427387904 is outside 0..{limits.MAX_DIM}"),
    ("negative_dim.json", graph_doc(inputs=_input([-3])), "dim -3 is outside"),
    ("superscript_dim.json", graph_doc(inputs=_input(["²"])),
     "is not a symbol ([A-Za-z_][A-Za-z0-9_]*"),
    ("bool_dim.json", graph_doc(inputs=_input([True])), "must be an int or a symbol"),
    ("too_many_elements.json", graph_doc(inputs=_input([2**31 - 1, 2**31 - 1])),
     "above the limit of"),
    ("nul_name.json", graph_doc(name="a\0b"), "control character U+0000"),
    ("nul_node.json", graph_doc(nodes=[{"name": "n\0", "op": "Exp", "inputs": ["x"],
                                        "outputs": ["y"]}]), "control character U+0000"),
    ("escape_name.json", graph_doc(name="\x1b[2J\x1b[31mred"), "control character U+001B"),
    ("bidi_name.json", graph_doc(name="abc\u202edef"), "control character U+202E"),
    ("no_nodes.json", graph_doc(nodes=[], outputs=["x"]), "the graph has no nodes"),
    ("no_outputs.json", graph_doc(outputs=[]), "the graph has no outputs"),
    ("keep_dims_string.json", graph_doc(nodes=[
        {"name": "n", "op": "ReduceSum", "inputs": ["x"], "outputs": ["y"],
         "attrs": {"axis": [0], "keep_dims": "yes"}}]), "keep_dims: expected bool, got 'yes'"),
    ("keep_dims_int.json", graph_doc(nodes=[
        {"name": "n", "op": "ReduceSum", "inputs": ["x"], "outputs": ["y"],
         "attrs": {"axis": [0], "keep_dims": 1}}]), "keep_dims: expected bool"),
    ("axis_string.json", graph_doc(nodes=[
        {"name": "n", "op": "ReduceSum", "inputs": ["x"], "outputs": ["y"],
         "attrs": {"axis": "a"}}]), "attrs.axis: expected list[int] | None, got 'a'"),
    ("bomb.yaml", ALIAS_BOMB, "an alias bomb is refused"),
    ("python_tag.yaml", "!!python/object/apply:os.system ['touch pwned']\n", "python_tag.yaml"),
    ("empty.json", "", "empty.json"),
    ("not_utf8.json", b"\xff\xfe\x00{", "not_utf8.json"),
]


@pytest.mark.parametrize("name,content,words", BAD_MODELS, ids=[b[0] for b in BAD_MODELS])
@pytest.mark.parametrize("command", ["run", "compile"])
def test_bad_model_file_is_one_clear_error(cli, in_tmp, name, content, words, command):
    path = in_tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        write_json(path, content)
    line = cli.error(command, path)
    assert words in line, line
    assert not (in_tmp / "pwned").exists()
    assert sorted(p.name for p in in_tmp.iterdir()) == [name]  # nothing written


def test_terminal_escapes_in_an_error_are_printed_escaped(cli, in_tmp):
    f = write_json(in_tmp / "m.json", graph_doc(name="\x1b]0;owned\x07title"))
    line = cli.error("info", f)
    assert "\\x1b]0;owned\\x07title" in line  # visible, and inert


def test_a_graph_file_above_the_size_limit_is_not_read(cli, in_tmp, monkeypatch):
    monkeypatch.setattr(limits, "MAX_GRAPH_FILE_BYTES", 1000)
    f = write_json(in_tmp / "big.json", graph_doc(pad="x" * 2000))
    assert "larger than the 1,000-byte limit" in cli.error("info", f)


@needs_onnx
@pytest.mark.parametrize("content", [b"", b"\x00" * 64, b"not a protobuf at all \xff\xff"])
def test_a_broken_onnx_file_is_refused(cli, in_tmp, content):
    (in_tmp / "m.onnx").write_bytes(content)
    line = cli.error("run", in_tmp / "m.onnx")
    assert "m.onnx" in line
    if not content:
        assert "the file is empty (0 bytes)" in line


@pytest.mark.parametrize("option", ["--config", "--flags=--path="])
def test_a_flags_file_that_never_ends_is_refused_unread(cli, in_tmp, option):
    f = write_json(in_tmp / "m.json", graph_doc())
    args = [option, "/dev/zero"] if option == "--config" else [option + "/dev/zero"]
    line = cli.error("compile", f, *args)
    assert "is a device, not a regular file" in line


@pytest.mark.parametrize("option", ["--config", "--flags=--path="])
def test_a_flags_file_above_its_limit_is_read_only_to_the_limit(cli, in_tmp, option,
                                                               monkeypatch):
    monkeypatch.setattr(limits, "MAX_FLAGS_FILE_BYTES", 1000)
    f = write_json(in_tmp / "m.json", graph_doc())
    (in_tmp / "big.yaml").write_text("opt_level: 2\n" + "# padding\n" * 200)
    args = [option, "big.yaml"] if option == "--config" else [option + "big.yaml"]
    assert "larger than the 1,000-byte limit" in cli.error("compile", f, *args)


def test_a_flags_file_alias_bomb_is_refused(cli, in_tmp):
    (in_tmp / "flags.yaml").write_text(ALIAS_BOMB)
    f = write_json(in_tmp / "m.json", graph_doc())
    assert "an alias bomb is refused" in cli.error("compile", f, "--config", "flags.yaml")


def test_a_flags_file_cannot_build_python_objects(cli, in_tmp):
    (in_tmp / "flags.yaml").write_text("opt_level: !!python/object/apply:os.system "
                                       "['touch pwned']\n")
    f = write_json(in_tmp / "m.json", graph_doc())
    cli.error("compile", f, "--config", "flags.yaml")
    assert not (in_tmp / "pwned").exists()


@pytest.mark.parametrize("flags,words", [
    ("--opt_level=" + "9" * 5000, "5,000 characters long, above the limit of 4,096"),
    ("--bisect_limit=" + "9" * 100, "bisect_limit"),
    ("--enable_pass=" + "x" * 5000, "above the limit of 4,096"),
    ("--opt_level=\x1b[31m2", "--opt_level"),
], ids=["5000_digits", "100_digits", "long_list", "escape"])
def test_oversized_and_malformed_flag_values(cli, in_tmp, flags, words):
    f = write_json(in_tmp / "m.json", graph_doc())
    line = cli.error("compile", f, "--flags", flags)
    assert words in line and len(line) < 600, line


def test_an_oversized_flag_string_is_refused(cli, in_tmp, monkeypatch):
    f = write_json(in_tmp / "m.json", graph_doc())
    monkeypatch.setenv("AUTOFUSE_FLAGS", "--dump_as_text " * 10_000)
    line = cli.error("compile", f)
    assert "AUTOFUSE_FLAGS" in line and f"{limits.MAX_FLAG_STRING:,}" in line, line


@pytest.mark.parametrize("dims,words", [
    ("batch=" + "9" * 5000, "expected NAME=INT"),
    ("batch=4294967296", f"above the limit of {limits.MAX_DIM}"),
    ("b²=4", "expected NAME=INT"),
], ids=["5000_digits", "above_max", "superscript"])
def test_bad_dims_values(cli, in_tmp, dims, words):
    f = write_json(in_tmp / "m.json", graph_doc(inputs=_input(["batch"])))
    line = cli.error("run", f, "--dims", dims)
    assert words in line and len(line) < 600, line


@needs_onnx
def test_onnx_external_data_outside_the_model_folder_is_refused(cli, in_tmp):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    (in_tmp / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    (in_tmp / "models").mkdir()
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in [("location", "../secret.bin"), ("length", "16")]:
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", io[:1],
                              io[1:], initializer=[w])
    path = in_tmp / "models" / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    line = cli.error("info", path)
    assert "points outside the directory" in line
