"""Names never become paths, and every write stays inside the folder the user gave."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphkernel.errors import OutputError
from graphkernel.outputs import MAX_FILE_NAME, Folder, file_name
from tests.security.conftest import graph_doc, snapshot, write_json

HOSTILE = ["../../x", "/tmp/abs/x", "a/b\\c", "..", ".", "x" * 300, "模型/../ü", "-rf *",
           "$(touch pwned)", "con.txt."]
CONTROL = ["x\x00y", "\x1b[31mred\x1b[0m", "line\nbreak", "right\u202eleft", "tab\there"]


def two_op_doc(v: str) -> dict:
    """x -> Exp -> Neg with ``v`` in every name field: graph, input, nodes, values, origin."""
    return graph_doc(name=v, inputs=[{"name": f"{v}|in", "shape": [8, 32], "dtype": "float32"}],
                     nodes=[{"name": v, "op": "Exp", "inputs": [f"{v}|in"],
                             "outputs": [f"{v}|e"], "origin": [v, f"{v}|src"]},
                            {"name": f"{v}|neg", "op": "Neg", "inputs": [f"{v}|e"],
                             "outputs": [f"{v}|out"]}],
                     outputs=[f"{v}|out"])


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_in_every_field_write_only_inside_the_output_folder(cli, in_tmp, name):
    f = write_json(in_tmp / "m.json", two_op_doc(name))
    (in_tmp / "A" / "B").mkdir(parents=True)
    before = snapshot(in_tmp)
    rc, out, _ = cli("compile", f, "-o", "A/B/out", "--flags", "--dump_as_text")
    assert rc == 0, out
    new = snapshot(in_tmp) - before
    assert new and all(p.startswith("A/B/out") for p in new), sorted(new)
    compiled = [p for p in new if p.endswith(".compiled.json")]
    assert compiled == [f"A/B/out/{file_name(name)}.compiled.json"]
    assert list((in_tmp / "A/B/out/kernels").glob("*.cpp"))  # a kernel was generated
    # the names themselves are kept, as data, in what was written
    assert json.loads((in_tmp / compiled[0]).read_text())["name"] == name
    rc, _, _ = cli("run", f, "--out", "A/B/o.npz")
    assert rc == 0 and snapshot(in_tmp) - before - new == {"A/B/o.npz"}


@pytest.mark.parametrize("field", ["graph", "input", "node", "value", "origin"])
@pytest.mark.parametrize("bad", CONTROL)
def test_names_with_control_characters_are_refused_and_printed_escaped(cli, in_tmp, field,
                                                                         bad):
    doc = two_op_doc("n")
    if field == "graph":
        doc["name"] = bad
    elif field == "input":
        doc["inputs"][0]["name"] = bad
        doc["nodes"][0]["inputs"] = [bad]
    elif field == "node":
        doc["nodes"][1]["name"] = bad
    elif field == "value":
        doc["nodes"][1]["outputs"] = [bad]
        doc["outputs"] = [bad]
    else:
        doc["nodes"][0]["origin"] = [bad]
    f = write_json(in_tmp / "m.json", doc)
    before = snapshot(in_tmp)
    line = cli.error("compile", f, "-o", "out")
    assert "contains the control character U+" in line
    assert bad.encode("unicode_escape").decode() in line  # shown escaped, never raw
    assert snapshot(in_tmp) == before


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_file_name_is_always_a_plain_distinct_name(a, b):
    fa, fb = file_name(a), file_name(b)
    for f in (fa, fb):
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", f) and len(f) <= MAX_FILE_NAME
        assert f not in (".", "..")
    assert (fa == fb) == (a == b)


def test_folder_refuses_names_that_leave_it(tmp_path):
    folder = Folder(tmp_path / "out")
    for bad in ["../x", "/etc/x", "a/../../x", ".hidden", "", "a\x00b", "kernels/../../x"]:
        with pytest.raises(OutputError, match="is not a safe file name"):
            folder.path(bad)
    assert folder.path("kernels/k.cpp") == tmp_path / "out" / "kernels" / "k.cpp"


def test_symbolic_link_out_of_the_output_folder_is_refused(cli, in_tmp):
    f = write_json(in_tmp / "m.json", two_op_doc("g"))
    outside = in_tmp / "outside"
    outside.mkdir()
    (in_tmp / "out").mkdir()
    (in_tmp / "out" / "kernels").symlink_to(outside)
    line = cli.error("compile", f, "-o", "out")
    assert "would be written outside out" in line and "remove the link" in line
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in (in_tmp / "out").iterdir()) == ["kernels"]  # nothing else


def test_kernel_file_names_are_checked_too(cli, in_tmp, monkeypatch):
    """A generator bug that named a kernel file '../x' could not write outside -o."""
    from graphkernel.codegen import backend

    monkeypatch.setattr(backend, "CORRUPT", [lambda name, files: {
        "../../evil.cpp" if k.endswith(".cpp") else k: v for k, v in files.items()}])
    f = write_json(in_tmp / "m.json", two_op_doc("g"))
    before = snapshot(in_tmp)
    line = cli.error("compile", f, "-o", "A/out")
    assert "'..' is not a safe file name" in line
    assert snapshot(in_tmp) == before  # and the outputs already made were not kept


def test_plugin_pass_names_become_safe_dump_names(cli, in_tmp, clean_registry):
    plugin = in_tmp / "p.py"
    plugin.write_text("from graphkernel.registry import PassResult, register_pass\n"
                      "@register_pass('../../evil/x', stage='simplify', level=1, order=99)\n"
                      "def p(graph, ctx):\n"
                      "    return PassResult(True, 1)\n")
    f = write_json(in_tmp / "m.json", two_op_doc("g"))
    before = snapshot(in_tmp)
    rc, _, err = cli("compile", f, "-o", "out", "--plugin", plugin, "--flags", "--dump_as_text")
    assert rc == 0, err
    new = snapshot(in_tmp) - before
    assert all(p.startswith("out") for p in new)
    dumps = [p for p in new if "evil" in p]
    assert len(dumps) == 1 and re.fullmatch(r"out/\d{4}_simplify_\.\._\.\._evil_x-[0-9a-f]{8}\.txt",
                                            dumps[0]), dumps


@pytest.mark.parametrize("debug_dir", ["/tmp/gk-evil-dumps", "../gk-evil-dumps", "a/../../x"])
def test_a_flags_file_cannot_choose_where_dumps_go(cli, in_tmp, debug_dir):
    (in_tmp / "flags.yaml").write_text(f"dump_as_text: true\ndebug_dir: '{debug_dir}'\n")
    f = write_json(in_tmp / "m.json", two_op_doc("g"))
    line = cli.error("compile", f, "--config", "flags.yaml")
    assert "a flags file may only name a folder inside the current one" in line
    (in_tmp / "flags.yaml").write_text("dump_as_text: true\ndebug_dir: dumps/here\n")
    rc, _, _ = cli("compile", f, "--config", "flags.yaml")
    assert rc == 0 and (in_tmp / "dumps/here/flags.json").is_file()
    # the user's own flags may name any place
    rc, _, _ = cli("compile", f, "--flags", f"--dump_as_text --debug_dir={in_tmp / 'abs'}")
    assert rc == 0 and (in_tmp / "abs/flags.json").is_file()


@pytest.mark.parametrize("data_file", ["../secret.npz", "/etc/secret.npz", "sub/x.npz", ".."])
def test_data_file_is_a_file_next_to_the_graph(cli, in_tmp, data_file):
    f = write_json(in_tmp / "m.json", two_op_doc("g") | {"data_file": data_file})
    assert "must be the name of a file next to the graph file" in cli.error("info", f)


def test_bisect_reproducer_stays_in_the_repro_folder(cli, in_tmp, clean_registry):
    # hostile node names reach the reproducer's files and the skip list, never its paths
    f = write_json(in_tmp / "m.json", graph_doc(
        name="../../evil", inputs=[{"name": "x", "shape": [4, 8], "dtype": "float32"}],
        nodes=[{"name": "../a", "op": "Add", "inputs": ["x", "x"], "outputs": ["a"]},
               {"name": "/abs/b", "op": "Add", "inputs": ["a", "x"], "outputs": ["b"]},
               {"name": "模型", "op": "Exp", "inputs": ["b"], "outputs": ["y"]}]))
    plugin = _faulty(in_tmp)
    before = snapshot(in_tmp)
    rc, out, err = cli("bisect", f, "--plugin", plugin, "--repro-dir", "R/repro",
                       "--report", "R/rep.json")
    assert rc == 0, err
    new = snapshot(in_tmp) - before
    assert {"R/repro/repro.json", "R/repro/repro_inputs.npz", "R/rep.json"} <= new
    assert all(p.startswith("R") for p in new), sorted(new)


def _faulty(tmp):
    """A copy of the bisect example's deliberately wrong pass."""
    src = Path(__file__).parents[2] / "examples" / "faulty_pass.py"
    dst = tmp / "faulty_pass.py"
    dst.write_text(src.read_text())
    return dst
