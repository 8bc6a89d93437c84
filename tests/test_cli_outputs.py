"""What the CLI writes: with --json exactly one JSON document on stdout (everything else on
stderr) for every command that has --json; a reused -o folder loses only the files its
previous manifest lists."""

from __future__ import annotations

import json
import os

import pytest

from graphkernel.cli import build_parser, main
from graphkernel.outdir import previous_outputs

EX = "examples/attention_softmax.json"


def strict_json(text: str):
    """One JSON document and nothing else (no NaN/Infinity either)."""
    def no_constants(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=no_constants)


def json_commands() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {name for name, p in sub.choices.items()
            if any("--json" in a.option_strings for a in p._actions)}


def argv_for(command: str, tmp_path) -> list[str]:
    """A realistic run of each command (its human text and notes must not reach stdout)."""
    noisy = tmp_path / "noisy_plugin.py"
    noisy.write_text("print('a plugin printing on import')\n")
    plugin = ["--plugin", str(noisy)]
    return {
        "info": ["info", EX],
        "ops": ["ops"],
        "flags": ["flags", "--flags", "--opt_level=3", *plugin],
        "passes": ["passes", *plugin],
        "compile": ["compile", EX, "-o", str(tmp_path / "out"), "--html",
                    str(tmp_path / "r.html"), "--flags", "--print_bisect", *plugin],
        "explain": ["explain", EX, *plugin],
        "expand": ["expand", "examples/mlp_gelu.json", *plugin],
        "verify": ["verify", "examples/mlp_gelu.json", *plugin],
        "bisect": ["bisect", "examples/mlp_gelu.json", *plugin],
        "patterns": ["patterns", *plugin],
        "realcheck": ["realcheck", str(tmp_path / "out")],  # a project compile -o wrote
        "run": ["run", "examples/mlp_gelu.json", "--out", str(tmp_path / "o.npz")],
    }[command]


def test_every_json_command_is_covered():
    assert json_commands() == {"info", "ops", "flags", "passes", "compile", "explain", "expand",
                               "verify", "bisect", "patterns", "run", "realcheck"}


@pytest.mark.parametrize("command", sorted(json_commands()))
def test_json_output_is_exactly_one_document(command, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOFUSE_FLAGS", "--opt_level=2 --opt_level=2")  # a warning, on stderr
    if command == "ops":
        monkeypatch.delenv("AUTOFUSE_FLAGS")
    if command == "realcheck":
        from graphkernel.codegen.realcheck import find_headers

        if find_headers() is None:
            pytest.skip("no Ascend C headers (GRAPHKERNEL_ASCEND_HEADERS or ASCEND_HOME_PATH)")
        assert main(["compile", "examples/mlp_gelu.json", "-o", str(tmp_path / "out")]) == 0
        capsys.readouterr()
    assert main([*argv_for(command, tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    doc = strict_json(out)
    assert isinstance(doc, dict | list) and doc
    if "--plugin" in argv_for(command, tmp_path):
        assert "a plugin printing on import" in err
    if command == "compile":
        assert "BISECT: running (1)" in err and "wrote" in err
        assert "manifest.json" in " ".join(doc["written"])
    if command == "verify":
        assert doc["match"] is True
    if command == "bisect":
        assert doc["mismatch"] is False
    if command == "run":
        assert doc["outputs"][0]["name"] == "gelu_half" and doc["wrote"].endswith("o.npz")
    if command == "realcheck":
        assert doc["summary"]["kernels"] == 1 and all(r["ok"] for r in doc["results"])


def test_json_survives_non_finite_metrics(capsys):
    from graphkernel.cli import _emit_json

    class Args:
        stdout = None

    _emit_json(Args(), {"rmse": [float("nan"), float("inf")], "cos": -float("inf")})
    assert strict_json(capsys.readouterr().out) == {"rmse": ["nan", "inf"], "cos": "-inf"}


# ------------------------------------------------------------------ reused -o folders
def test_a_reused_folder_loses_only_the_previous_runs_files(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", EX, "-o", str(out), "--flags", "--dump_as_text"]) == 0
    first = json.loads((out / "manifest.json").read_text())["files"]
    assert any(f.startswith("kernels/") for f in first) and "report.json" in first
    assert any(f.endswith("_split_split.txt") for f in first)  # the dumps are listed too
    assert sorted(first) == sorted(str(p.relative_to(out)) for p in out.rglob("*")
                                   if p.is_file())
    (out / "notes.txt").write_text("mine")
    (out / "kernels" / "my_kernel.cpp").write_text("mine")
    capsys.readouterr()
    assert main(["compile", "examples/layernorm_residual.json", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    second = json.loads((out / "manifest.json").read_text())["files"]
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted(second + ["notes.txt", "kernels/my_kernel.cpp"])
    removed = set(first) - set(second)
    assert removed and f"removed {len(removed)} files of the previous run" in err
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("entry", ["../outside.txt", "/etc/hostname", "kernels/../../outside.txt",
                                   "link/victim.txt", "sub", "", 7, None])
def test_a_hostile_manifest_cannot_make_it_delete_anything_else(tmp_path, entry):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("keep")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "victim.txt").write_text("keep")
    os.symlink(tmp_path / "elsewhere", out / "link")
    (out / "report.json").write_text("{}")
    (out / "manifest.json").write_text(json.dumps({"format": "graphkernel-kernels/1",
                                                   "files": [entry]}))
    assert previous_outputs(out) == []


def test_no_manifest_no_cleaning(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"not": "graphkernel\'s"}')
    (out / "x.cpp").write_text("mine")
    assert main(["compile", EX, "-o", str(out)]) == 0
    assert (out / "x.cpp").read_text() == "mine" and "removed" not in capsys.readouterr().err
