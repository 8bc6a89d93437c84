"""Every output path is checked before any work (exit 2, one line naming the option and the
path, nothing written), and a command's outputs appear all together or not at all."""

from __future__ import annotations

import os

import pytest

from graphkernel import outputs
from graphkernel.errors import OutputError
from tests.security.conftest import graph_doc, have, snapshot, write_json

needs_onnx = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")

# (command, option as printed, args before the path)
OPTIONS = [
    ("run", "--out", ["--out"], "file"),
    ("compile", "-o/--out", ["-o"], "dir"),
    ("compile", "--export-onnx", ["--export-onnx"], "file"),
    ("compile", "--html", ["--html"], "file"),
    ("bisect", "--report", ["--report"], "file"),
    ("bisect", "--repro-dir", ["--repro-dir"], "dir"),
]
# a path that cannot be written, for root too: below a regular file; a NUL byte; a folder
# where a file is wanted and a file where a folder is wanted
BAD = {"under_a_file": "plain.txt/sub/x", "nul": "a\0b", "empty": "",
       "wrong_kind": None}


@pytest.mark.parametrize("command,option,args,kind", OPTIONS, ids=[o[1] + "@" + o[0]
                                                                    for o in OPTIONS])
@pytest.mark.parametrize("bad", list(BAD))
def test_an_unwritable_output_path_is_refused_before_any_work(cli, in_tmp, command, option,
                                                              args, kind, bad):
    model = write_json(in_tmp / "m.json", graph_doc())
    (in_tmp / "plain.txt").write_text("a file")
    (in_tmp / "folder").mkdir()
    path = BAD[bad] if bad != "wrong_kind" else ("plain.txt" if kind == "dir" else "folder")
    before = snapshot(in_tmp)
    line = cli.error(command, model, *args, path)
    assert option in line, line
    if bad == "under_a_file":
        assert "plain.txt/sub/x" in line and "plain.txt is a file, not a folder" in line
    elif bad == "nul":
        assert "a\\x00b" in line and "cannot contain a NUL byte" in line
    assert snapshot(in_tmp) == before


def test_outputs_are_checked_before_the_model_is_read(cli, in_tmp):
    # the model file is broken too: the output path is named first, so one run shows it
    (in_tmp / "plain.txt").write_text("a file")
    (in_tmp / "m.json").write_text("{")
    assert "--html" in cli.error("compile", "m.json", "-o", "out", "--html", "plain.txt/r.html")
    assert not (in_tmp / "out").exists()


class _FailingFile:
    """A file object that writes half its data and then reports a full disk."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        raise OSError(28, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _fail_writes_of(monkeypatch, suffix):
    """Make every temporary file written for a name holding ``suffix`` fail half-way;
    return the real ``os.fdopen``."""
    real = os.fdopen

    def fdopen(fd, mode="r", *a, **kw):
        f = real(fd, mode, *a, **kw)
        name = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else ""
        return _FailingFile(f) if ".tmp" in name and suffix in name else f

    monkeypatch.setattr(os, "fdopen", fdopen)
    return real


@pytest.mark.parametrize("failing", ["manifest.json", ".html", ".compiled.json"])
def test_compile_outputs_appear_all_together_or_not_at_all(cli, in_tmp, monkeypatch, failing):
    """A full disk while writing one output (the last, the first, one in the middle) leaves
    none of them: not a half-filled -o folder, not a truncated page."""
    model = write_json(in_tmp / "m.json", graph_doc())
    before = snapshot(in_tmp)
    real = _fail_writes_of(monkeypatch, failing)
    line = cli.error("compile", model, "-o", "A/out", "--html", "B/r.html")
    assert "No space left on device" in line
    assert snapshot(in_tmp) == before  # the folders made for the outputs are gone too
    monkeypatch.setattr(os, "fdopen", real)
    rc, _, err = cli("compile", model, "-o", "A/out", "--html", "B/r.html")
    assert rc == 0, err
    assert (in_tmp / "B/r.html").is_file() and (in_tmp / "A/out/manifest.json").is_file()


@needs_onnx
def test_a_failed_onnx_export_leaves_nothing(cli, in_tmp, monkeypatch):
    model = write_json(in_tmp / "m.json", graph_doc())
    (in_tmp / "old.onnx").write_bytes(b"the previous export")
    _fail_writes_of(monkeypatch, ".onnx")
    before = snapshot(in_tmp)
    line = cli.error("compile", model, "--export-onnx", "old.onnx")
    assert "old.onnx: cannot be written (No space left on device)" in line
    assert snapshot(in_tmp) == before
    assert (in_tmp / "old.onnx").read_bytes() == b"the previous export"  # untouched


def test_write_file_replaces_a_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    target.write_text("old")
    _fail_writes_of(monkeypatch, "f.txt")
    with pytest.raises(OutputError, match="No space left on device"):
        outputs.write_file(target, b"new contents")
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["f.txt"]


def test_with_json_a_refused_output_path_leaves_stdout_empty(cli, in_tmp):
    model = write_json(in_tmp / "m.json", graph_doc())
    (in_tmp / "plain.txt").write_text("a file")
    rc, out, err = cli("compile", model, "--json", "-o", "plain.txt")
    assert rc == 2 and out == "" and "-o/--out plain.txt: is a file, not a folder" in err
