"""Files written by a child process (``outputs.write_apart``): the compiled graph's JSON is
encoded while the command writes its other files. The same files, digests and errors as
writing them in-process; nothing left behind when either side fails."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from graphkernel import Graph, TensorType, outputs
from graphkernel.errors import FormatError, OutputError
from graphkernel.frontends.json_format import load_graph, save_graph, start_save_graph

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def mlp(seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph("mlp")
    x = g.add_input("x", TensorType(("b", 96), "float32"))
    for i in range(2):
        w = g.const(rng.standard_normal((96, 96)).astype(np.float32), name=f"w{i}")
        x = g.add_node("GeLU", [g.add_node("MatMul", [x, w]).output]).output
    g.set_outputs([x])
    return g


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("share", [False, True])
def test_a_graph_written_apart_is_the_graph_written_here(tmp_path, share):
    model = tmp_path / "m.json"
    save_graph(mlp(), model)
    g = load_graph(model)  # (its weights are views of m.npz: shared when ``share``)
    w0 = g.node("w0")
    w0.attrs = dict(w0.attrs, value=np.array(w0.attrs["value"]) * 2)  # one of its own
    here = save_graph(g, tmp_path / "here" / "c.json", share_data=share)
    job = start_save_graph(g, tmp_path / "apart" / "c.json", share_data=share)
    assert job.job.pid is not None  # (written by a child)
    apart = job.finish()
    assert [p.name for p in apart] == [p.name for p in here]
    assert [p.name for p in here] == ["c.json", "c.npz"] + (["c.weights.npz"] if share else [])
    assert files_of(tmp_path / "apart") == files_of(tmp_path / "here")
    for p in apart:  # the digests recorded for the manifest are those of the files
        assert outputs.digest_written(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    assert job.finish() == apart  # (asked again: the same answer, nothing written twice)


def test_an_error_in_the_child_is_raised_here_and_leaves_nothing(tmp_path):
    g = Graph("g")
    x = g.add_input("x", TensorType((4,), "float32"))
    y = g.add_node("ReLU", [x], name="act").output
    g.set_outputs([y])
    g.node("act").attrs["extra"] = {"a": object()}
    job = start_save_graph(g, tmp_path / "out" / "g.json")
    assert job.job.pid is not None
    with pytest.raises(FormatError, match=r"node 'act' \(ReLU\): attribute value"):
        job.finish()
    assert list((tmp_path / "out").iterdir()) == []


def test_files_apart_wait_for_the_transaction(tmp_path):
    with outputs.transaction():
        job = start_save_graph(mlp(), tmp_path / "c.json")
        done = job.finish()
        assert done and not any(p.exists() for p in done)  # held back until the block ends
    assert all(p.exists() for p in done)


def test_a_failure_while_the_child_writes_removes_its_files(tmp_path):
    with pytest.raises(RuntimeError, match="later writer"):
        with outputs.transaction():
            job = start_save_graph(mlp(), tmp_path / "c.json")
            try:
                raise RuntimeError("a later writer failed")
            finally:
                job.abandon()
    assert list(tmp_path.iterdir()) == []
    job.abandon()  # (again: nothing to do)


def test_the_writer_decides_which_files_are_kept(tmp_path):
    def write(files):
        files[0].write(b"kept")
        return [True, False]

    job = outputs.write_apart([tmp_path / "a.txt", tmp_path / "b.txt"], write)
    assert job.finish() == [tmp_path / "a.txt"]
    assert files_of(tmp_path) == {"a.txt": b"kept"}


def test_a_child_that_dies_is_an_output_error(tmp_path):
    def write(files):
        os._exit(3)  # (as if killed: it says nothing)

    job = outputs.write_apart([tmp_path / "a.txt"], write)
    with pytest.raises(OutputError, match="ended without finishing"):
        job.finish()
    assert list(tmp_path.iterdir()) == []


def test_without_fork_the_files_are_written_here(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "APART", False)
    job = start_save_graph(mlp(), tmp_path / "c.json")
    assert job.job.pid is None and job.job.outcome is not None  # written already
    doc = json.loads(job.finish()[0].read_text())
    assert doc["name"] == "mlp"
