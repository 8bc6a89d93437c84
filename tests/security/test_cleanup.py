"""Cleaning a reused -o folder removes only what graphkernel wrote there, re-checked when each
file is removed: another local user who can write in -o cannot turn the cleanup into a
deletion outside it, nor make it delete a file they changed. The races are simulated by
acting between graphkernel's steps (a swapped folder, a swapped file, a changed file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphkernel import limits, outdir
from graphkernel.outdir import previous_outputs, remove_stale
from tests.security.conftest import graph_doc, write_json

TWO_KERNELS = graph_doc(inputs=[{"name": "x", "shape": [8, 32], "dtype": "float32"}], nodes=[
    {"name": "e", "op": "Exp", "inputs": ["x"], "outputs": ["a"]},
    {"name": "s", "op": "ReduceSum", "inputs": ["a"], "outputs": ["b"],
     "attrs": {"axis": [-1], "keep_dims": True}},
    {"name": "d", "op": "Div", "inputs": ["a", "b"], "outputs": ["y"]}])
ONE_OP = graph_doc(name="other")


def _first_run(cli, tmp: Path) -> tuple[Path, list[str]]:
    """Compile into tmp/out; return the folder and the kernel sources the manifest lists."""
    rc, _, err = cli("compile", write_json(tmp / "m.json", TWO_KERNELS), "-o", tmp / "out", "-q")
    assert rc == 0, err
    files = json.loads((tmp / "out" / "manifest.json").read_text())["files"]
    kernels = [f for f in files if f.startswith("kernels/") and f.endswith(".cpp")]
    assert kernels
    return tmp / "out", kernels


def _outside(tmp: Path, names: list[str]) -> Path:
    """A folder outside -o holding files of the same names as the kernel sources."""
    victim = tmp / "victim"
    victim.mkdir()
    for name in names:
        (victim / Path(name).name).write_text("not graphkernel's")
    return victim


def test_the_manifest_records_a_digest_of_each_file_written(cli, tmp_path):
    import hashlib

    out, _ = _first_run(cli, tmp_path)
    doc = json.loads((out / "manifest.json").read_text())
    assert set(doc["digests"]) == set(doc["files"]) - {"manifest.json"}
    for name, digest in doc["digests"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest


def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed(cli, tmp_path,
                                                                     monkeypatch):
    """The first round's attack: the manifest's entries are checked before the outputs are
    written, and `kernels` is swapped for a link to another folder before the cleanup."""
    out, kernels = _first_run(cli, tmp_path)
    victim = _outside(tmp_path, kernels)
    real_remove = outdir.remove_stale

    def swap_then_remove(folder, previous, written):
        os.rename(out / "kernels", tmp_path / "moved")
        os.symlink(victim, out / "kernels")
        return real_remove(folder, previous, written)

    monkeypatch.setattr(outdir, "remove_stale", swap_then_remove)
    rc, _, err = cli("compile", write_json(tmp_path / "o.json", ONE_OP), "-o", out, "-q")
    assert rc == 0, err
    assert sorted(p.name for p in victim.iterdir()) == sorted(Path(k).name for k in kernels)
    assert all(p.read_text() == "not graphkernel's" for p in victim.iterdir())


def test_a_folder_swapped_between_the_digest_and_the_unlink_keeps_the_outside(cli, tmp_path):
    out, kernels = _first_run(cli, tmp_path)
    victim = _outside(tmp_path, kernels)
    previous = previous_outputs(out)

    def swap(dir_fd, entry):  # between graphkernel's last check and its unlink
        if entry.endswith(".cpp") and not (out / "kernels").is_symlink():
            os.rename(out / "kernels", tmp_path / "moved")
            os.symlink(victim, out / "kernels")

    outdir.BEFORE_UNLINK.append(swap)
    try:
        done = remove_stale(out, previous, [])
    finally:
        outdir.BEFORE_UNLINK.remove(swap)
    assert all(p.read_text() == "not graphkernel's" for p in victim.iterdir())
    assert len(list(victim.iterdir())) == len(kernels)
    # the file checked was removed from the folder graphkernel had open (now "moved"); the
    # other sources are behind the link now, and are not followed
    moved = sorted(p.name for p in (tmp_path / "moved").glob("*.cpp"))
    assert len(moved) == len(kernels) - 1
    assert [p for p in done.removed if p.suffix == ".cpp"] == [out / k for k in kernels
                                                              if Path(k).name not in moved]


def test_a_file_swapped_for_a_link_after_its_digest_is_left(cli, tmp_path):
    out, kernels = _first_run(cli, tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    previous = [p for p in previous_outputs(out) if p.name == kernels[0]]

    def swap(dir_fd, entry):
        os.unlink(entry, dir_fd=dir_fd)
        os.symlink(target, entry, dir_fd=dir_fd)

    outdir.BEFORE_UNLINK.append(swap)
    try:
        done = remove_stale(out, previous, [])
    finally:
        outdir.BEFORE_UNLINK.remove(swap)
    assert done.removed == [] and done.changed == [out / kernels[0]]
    assert target.read_text() == "keep" and (out / kernels[0]).is_symlink()


def test_a_file_whose_content_changed_is_left_and_named(cli, tmp_path):
    out, kernels = _first_run(cli, tmp_path)
    (out / kernels[0]).write_text("// edited by hand")
    rc, _, err = cli("compile", write_json(tmp_path / "o.json", ONE_OP), "-o", out)
    assert rc == 0, err
    assert (out / kernels[0]).read_text() == "// edited by hand"
    assert f"left {out / kernels[0]}: a file of the previous run whose content changed" in err
    assert not (out / kernels[1]).exists() if len(kernels) > 1 else True


def test_a_manifest_without_digests_removes_nothing(cli, tmp_path):
    out, kernels = _first_run(cli, tmp_path)
    doc = json.loads((out / "manifest.json").read_text())
    del doc["digests"]
    (out / "manifest.json").write_text(json.dumps(doc))
    rc, _, err = cli("compile", write_json(tmp_path / "o.json", ONE_OP), "-o", out)
    assert rc == 0, err
    assert all((out / k).is_file() for k in kernels)
    assert "records no digest of what was written" in err


def test_a_digest_naming_an_outside_file_removes_nothing_outside(cli, tmp_path):
    import hashlib

    out, _ = _first_run(cli, tmp_path)
    (tmp_path / "outside.txt").write_text("keep")
    digest = hashlib.sha256(b"keep").hexdigest()
    (out / "link").symlink_to(tmp_path)
    doc = {"format": outdir.FORMAT, "files": ["../outside.txt", "link/outside.txt"],
           "digests": {"../outside.txt": digest, "link/outside.txt": digest}}
    (out / "manifest.json").write_text(json.dumps(doc))
    previous = [outdir.Previous(n, digest) for n in doc["files"]]  # even if it got through
    assert previous_outputs(out) == []
    assert remove_stale(out, previous, []).removed == []
    assert (tmp_path / "outside.txt").read_text() == "keep"


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "too_large"])
def test_a_manifest_that_cannot_be_read_within_limits_is_ignored(cli, tmp_path, kind,
                                                                 monkeypatch):
    out, kernels = _first_run(cli, tmp_path)
    (out / "manifest.json").unlink()
    if kind == "dev_zero":
        (out / "manifest.json").symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(out / "manifest.json")
    else:
        (out / "manifest.json").write_text(json.dumps({"format": outdir.FORMAT,
                                                       "files": kernels, "pad": "x" * 5000}))
        monkeypatch.setattr(limits, "MAX_MANIFEST_BYTES", 1000)
    assert previous_outputs(out) == []  # and returns at once: nothing blocks or reads forever
