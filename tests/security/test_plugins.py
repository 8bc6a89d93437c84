"""A plugin is code and runs as code; when it fails, the message blames the plugin (its file,
its pass, the exception), not graphkernel."""

from __future__ import annotations

import pytest

from tests.security.conftest import graph_doc, write_json

PASS = ("from graphkernel.registry import PassResult, register_pass\n"
        "@register_pass({name!r}, stage='simplify', level=1, order=99)\n"
        "def p(graph, ctx):\n"
        "{body}")


def _plugin(folder, file, name, body="    return PassResult(False, 0)\n"):
    path = folder / file
    path.write_text(PASS.format(name=name, body=body))
    return path


@pytest.fixture
def model(in_tmp):
    return write_json(in_tmp / "m.json", graph_doc())


def test_a_plugin_taking_a_built_in_pass_name_names_both(cli, model, in_tmp, clean_registry):
    p = _plugin(in_tmp, "mine.py", "cse")
    line = cli.error("compile", model, "--plugin", p)
    assert "pass 'cse' is registered twice" in line
    assert "cse.py:" in line and f"{p}:2" in line and "give one of them another name" in line


def test_two_plugins_taking_one_name_name_both_files(cli, model, in_tmp, clean_registry):
    a, b = _plugin(in_tmp, "a.py", "shared"), _plugin(in_tmp, "b.py", "shared")
    line = cli.error("compile", model, "--plugin", a, "--plugin", b)
    assert f"by {a}:2 and by {b}:2" in line


def test_an_exception_in_a_plugin_pass_is_the_plugins(cli, model, in_tmp, clean_registry):
    p = _plugin(in_tmp, "crash.py", "my_crash",
                "    return helper()\ndef helper():\n    raise ZeroDivisionError('plugin math')\n")
    line = cli.error("compile", model, "--plugin", p, code=1)
    assert f"plugin {p}: pass my_crash (simplify) failed: ZeroDivisionError: plugin math" in line
    assert f"raised at {p}:6" in line and "--disable_pass=my_crash" in line
    assert "bug in graphkernel" not in line


def test_a_plugin_pass_breaking_the_contract_is_the_plugins(cli, model, in_tmp, clean_registry):
    p = _plugin(in_tmp, "wrong.py", "my_wrong", "    return 3\n")
    line = cli.error("compile", model, "--plugin", p, code=1)
    assert f"plugin {p}: pass my_wrong returned int, expected PassResult" in line


def test_a_plugin_failing_to_load_is_named(cli, model, in_tmp, clean_registry):
    p = in_tmp / "broken.py"
    p.write_text("import graphkernel\nraise RuntimeError('cannot start')\n")
    line = cli.error("compile", model, "--plugin", p, code=1)
    assert f"--plugin {p}: the plugin failed while loading at {p}:2" in line
    assert "RuntimeError: cannot start" in line


def test_a_missing_plugin_file_is_bad_input(cli, model, in_tmp):
    assert "--plugin nope.py: no such file" in cli.error("compile", model, "--plugin", "nope.py")
