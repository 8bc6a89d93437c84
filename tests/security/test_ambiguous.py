"""Files that mean two things: a key given twice in a JSON/YAML object, a member named twice
in an .npz, a constant with both inline values and a place in a data file, and field values
of another type that a lax reader would coerce (``"yes"`` for a bool, ``true`` or ``"16"``
for a byte offset). Each is one error line, exit 2, for the graph and for a flags file:
what a file means may not depend on which reader reads it."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from tests.security.conftest import graph_doc, write_json

COMMANDS = ["info", "run", "compile", "verify"]

GRAPH_JSON = ('{"format": "graphkernel/1", "name": "g", %s"inputs": [{"name": "x", "shape": [4], '
              '"dtype": "float32"}], "nodes": [{"name": "n", "op": "Exp", "inputs": ["x"], '
              '"outputs": ["y"]}], "outputs": ["y"]}')


@pytest.mark.parametrize("command", COMMANDS)
def test_a_json_key_given_twice_is_refused(cli, in_tmp, command):
    (in_tmp / "m.json").write_text(GRAPH_JSON % '"name": "h", ')
    line = cli.error(command, in_tmp / "m.json")
    assert "key 'name' is given twice in one object" in line
    assert not (in_tmp / "out").exists()


def test_a_repeated_key_deep_in_a_node_is_refused(cli, in_tmp):
    text = GRAPH_JSON.replace('"op": "Exp"', '"op": "Exp", "op": "Log"') % ""
    (in_tmp / "m.json").write_text(text)
    assert "key 'op' is given twice" in cli.error("run", in_tmp / "m.json")


def test_a_yaml_key_given_twice_is_refused_with_its_line(cli, in_tmp):
    (in_tmp / "m.yaml").write_text(
        "format: graphkernel/1\nname: g\ninputs: [{name: x, shape: [4], dtype: float32}]\n"
        "nodes: [{name: n, op: Exp, inputs: [x], outputs: [y]}]\noutputs: [y]\noutputs: [x]\n")
    line = cli.error("info", in_tmp / "m.yaml")
    assert "m.yaml:6:1" in line and "key 'outputs' is given twice" in line


def test_a_yaml_merge_key_may_still_be_overridden(cli, in_tmp):
    """``<<: *base`` then a key of the base again is YAML's way to override, not a repeat."""
    (in_tmp / "m.yaml").write_text(
        "format: graphkernel/1\nname: g\n"
        "inputs: [&x {name: x, shape: [4], dtype: float32}]\n"
        "nodes: [{name: n, op: Exp, inputs: [x], outputs: [y]}, "
        "{<<: {name: z, op: Exp, inputs: [y], outputs: [w]}, name: m}]\noutputs: [w]\n")
    rc, out, _ = cli("info", in_tmp / "m.yaml")
    assert rc == 0 and "Exp" in out


@pytest.mark.parametrize("suffix,text", [
    (".json", '{"opt_level": 1, "opt_level": 3}'),
    (".yaml", "opt_level: 1\nopt_level: 3\n"),
])
def test_a_flags_file_giving_a_key_twice_is_refused(cli, in_tmp, suffix, text):
    write_json(in_tmp / "m.json", graph_doc())
    (in_tmp / f"f{suffix}").write_text(text)
    line = cli.error("compile", in_tmp / "m.json", "--config", in_tmp / f"f{suffix}")
    assert "key 'opt_level' is given twice" in line


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _const_doc(data_file: str, **const) -> dict:
    return graph_doc(nodes=[{"name": "n", "op": "Mul", "inputs": ["x", "c"], "outputs": ["y"]}],
                     constants=[{"name": "c", "shape": [4], "dtype": "float32", **const}],
                     data_file=data_file)


def test_an_npz_member_named_twice_is_refused(cli, in_tmp):
    """zipfile keeps the last entry of a name, an unzip tool may keep the first."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zipfile warns of the duplicate name it writes)
        with zipfile.ZipFile(in_tmp / "w.npz", "w") as z:
            z.writestr("c.npy", _npy(np.ones(4, np.float32)))
            z.writestr("c.npy", _npy(np.zeros(4, np.float32)))
    f = write_json(in_tmp / "m.json", _const_doc("w.npz", key="c"))
    for command in COMMANDS:
        line = cli.error(command, f)
        assert "member 'c.npy' appears twice in its directory" in line
    np.savez(in_tmp / "x.npz", x=np.ones(4, np.float32))
    with zipfile.ZipFile(in_tmp / "x.npz", "a") as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z.writestr("x.npy", _npy(np.zeros(4, np.float32)))
    line = cli.error("run", write_json(in_tmp / "g.json", graph_doc()), "--inputs",
                     in_tmp / "x.npz")
    assert "member 'x.npy' appears twice" in line


def test_a_constant_with_inline_values_and_a_key_is_refused(cli, in_tmp):
    np.savez(in_tmp / "w.npz", c=np.ones(4, np.float32))
    f = write_json(in_tmp / "m.json", _const_doc("w.npz", key="c", data=[9, 9, 9, 9]))
    assert "give 'data' (inline values) or 'key'/'offset' (in a data file), not both" in \
        cli.error("run", f)


@pytest.mark.parametrize("offset", [True, "4", 4.0])
def test_a_byte_offset_must_be_an_integer(cli, in_tmp, offset):
    """``true`` once read the constant at byte 1: floats made of the wrong bytes."""
    (in_tmp / "w.bin").write_bytes(np.arange(64, dtype=np.float32).tobytes())
    f = write_json(in_tmp / "m.json", _const_doc("w.bin", offset=offset))
    assert "constants[0].offset: Input should be a valid integer" in cli.error("run", f)


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_a_bool_field_must_be_a_bool(cli, in_tmp, value):
    f = write_json(in_tmp / "m.json", graph_doc(inputs=[
        {"name": "x", "shape": [4], "dtype": "float32", "mutable": value}]))
    assert "inputs[0].mutable: Input should be a valid boolean" in cli.error("info", f)


def test_a_flags_file_naming_another_flags_file_is_refused(cli, in_tmp):
    """``path`` in a flags file was ignored without a word; now it says so."""
    write_json(in_tmp / "m.json", graph_doc())
    write_json(in_tmp / "f.json", {"path": "/etc/passwd"})
    assert "key 'path': a flags file may not name another flags file" in \
        cli.error("compile", in_tmp / "m.json", "--config", in_tmp / "f.json")
