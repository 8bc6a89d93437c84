"""Bounded input and paths a data file names: decompression within the declared sizes,
external data of exactly the declared size, YAML expansion capped, FIFOs and devices
refused without blocking, no link followed where a data file names a path, and every path
a flags file names confined to the output folder (or refused)."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from graphkernel import limits
from graphkernel.fileio import NpzFile
from tests.security.conftest import graph_doc, have, snapshot, write_json

needs_onnx = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")


def _const_doc(data_file: str, shape=(4,), dtype="float32", key="c") -> dict:
    return graph_doc(inputs=[{"name": "x", "shape": list(shape), "dtype": dtype}],
                     nodes=[{"name": "n", "op": "Add", "inputs": ["x", "c"], "outputs": ["y"]}],
                     constants=[{"name": "c", "shape": list(shape), "dtype": dtype,
                                 "key": key}], data_file=data_file)


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _bomb(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    return path


# ------------------------------------------------------------------------- .npz
def test_a_member_larger_than_its_declared_shape_is_not_decompressed(cli, in_tmp,
                                                                     monkeypatch):
    """64 MB of zeros compress to about 64 KB: the member's size says so before any of it is
    inflated, and the constant declares 4 floats."""
    _bomb(in_tmp / "d.npz", {"c": _npy(np.zeros(16 * 2**20, np.float32))})
    assert (in_tmp / "d.npz").stat().st_size < 200_000
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, name, *a, **kw: opened.append(name) or
                        real_open(self, name, *a, **kw))
    f = write_json(in_tmp / "m.json", _const_doc("d.npz"))
    line = cli.error("info", f)
    assert "array 'c' holds 67,108,992 bytes, more than the 16 its declared shape" in line
    assert opened == []


def test_a_member_whose_directory_entry_lies_is_read_only_to_the_cap(tmp_path):
    """A member that claims a small size in the directory but inflates further is cut at the
    cap (zipfile reads no more than the size it claims), never inflated whole."""
    path = _bomb(tmp_path / "d.npz", {"c": _npy(np.zeros(2**20, np.float32))})
    data = bytearray(path.read_bytes())
    # shrink the uncompressed size recorded in the central directory entry
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24:cd + 28] = (100).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with NpzFile(path) as z, pytest.raises(ValueError, match="array 'c'"):
        z.read("c", 16)


def test_an_archive_directory_above_its_limit_is_refused_before_it_is_read(cli, in_tmp,
                                                                           monkeypatch):
    _bomb(in_tmp / "d.npz", {f"m{i}": _npy(np.ones(1, np.float32)) for i in range(200)}
          | {"c": _npy(np.ones(4, np.float32))})
    monkeypatch.setattr(limits, "MAX_NPZ_DIRECTORY_BYTES", 1000)
    line = cli.error("info", write_json(in_tmp / "m.json", _const_doc("d.npz")))
    assert "its member directory is" in line and "above the limit of 1,000" in line


def test_unused_members_are_never_read(cli, in_tmp, monkeypatch):
    _bomb(in_tmp / "d.npz", {"c": _npy(np.ones(4, np.float32)),
                             "unused": _npy(np.zeros(16 * 2**20, np.float32))})
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, name, *a, **kw: opened.append(getattr(name, "filename",
                                                                           name))
                        or real_open(self, name, *a, **kw))
    f = write_json(in_tmp / "m.json", _const_doc("d.npz"))
    rc, _, err = cli("run", f)
    assert rc == 0, err
    assert opened == ["c.npy"]


def test_a_header_claiming_more_than_the_member_holds_is_refused(tmp_path):
    good = _npy(np.ones(4, np.float32))
    lying = good.replace(b"'shape': (4,)", b"'shape': (8,)")  # 32 bytes said, 16 held
    assert lying != good
    _bomb(tmp_path / "d.npz", {"c": lying})
    with NpzFile(tmp_path / "d.npz") as z, pytest.raises(ValueError, match="the member holds"):
        z.read("c", 64)


@pytest.mark.parametrize("command", ["info", "run"])
def test_a_data_file_that_is_a_link_is_refused(cli, in_tmp, command):
    (in_tmp / "real").mkdir()
    np.savez(in_tmp / "real" / "d.npz", c=np.ones(4, np.float32))
    (in_tmp / "d.npz").symlink_to(in_tmp / "real" / "d.npz")
    f = write_json(in_tmp / "m.json", _const_doc("d.npz"))
    line = cli.error(command, f)
    assert "data_file 'd.npz' cannot be read: is a symbolic link" in line


# ------------------------------------------------------- FIFOs, devices, folders
@pytest.mark.parametrize("what", ["graph", "data_file", "inputs", "config", "skip_list"])
def test_a_fifo_is_refused_without_blocking(cli, in_tmp, what):
    os.mkfifo(in_tmp / "fifo")
    if what == "graph":
        os.rename(in_tmp / "fifo", in_tmp / "m.json")
        args = ["info", in_tmp / "m.json"]
    elif what == "data_file":
        os.rename(in_tmp / "fifo", in_tmp / "d.npz")
        args = ["info", write_json(in_tmp / "m.json", _const_doc("d.npz"))]
    elif what == "inputs":
        args = ["run", write_json(in_tmp / "m.json", graph_doc()), "--inputs", "fifo"]
    elif what == "config":
        args = ["compile", write_json(in_tmp / "m.json", graph_doc()), "--config", "fifo"]
    else:
        args = ["compile", write_json(in_tmp / "m.json", graph_doc()), "--flags",
                "--skip_node_names_cfg=fifo"]
    line = cli.error(*args)
    assert "is a FIFO (named pipe), not a regular file" in line, line


@needs_onnx
def test_an_onnx_model_that_is_a_fifo_is_refused(cli, in_tmp):
    os.mkfifo(in_tmp / "m.onnx")
    assert "is a FIFO (named pipe), not a regular file" in cli.error("info", in_tmp / "m.onnx")


# ------------------------------------------------------------------------ YAML
def test_yaml_aliases_of_long_text_are_capped_by_expanded_size(cli, in_tmp):
    """Few aliases, few values, much text: each of the 1,000 references repeats 100 KB."""
    text = "x" * 100_000
    doc = (f"format: graphkernel/1\nname: &n {text}\n"
           "inputs: [{name: x, shape: [4], dtype: float32}]\n"
           "nodes: [{name: n, op: Exp, inputs: [x], outputs: [y]}]\n"
           "outputs: [y]\nextra: [" + ", ".join(["*n"] * 500) + "]\n")
    (in_tmp / "m.yaml").write_text(doc)
    assert (in_tmp / "m.yaml").stat().st_size < 200_000
    line = cli.error("info", in_tmp / "m.yaml")
    assert f"more than {limits.MAX_YAML_EXPANDED_CHARS:,} characters of text" in line


# ------------------------------------------------------------------------ ONNX
def _onnx_with_external(path: Path, location: str, length: int | None = None,
                        dims=(4,)) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros(dims, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in [("location", location)] + ([("length", str(length))]
                                                    if length is not None else []):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(dims)) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", io_[:1],
                              io_[1:], initializer=[w])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    return path


@needs_onnx
def test_onnx_external_data_is_read_at_its_declared_size_only(cli, in_tmp):
    """A 2 GiB sparse file behind a tensor of 4 floats: 16 bytes are read."""
    with open(in_tmp / "big.bin", "wb") as f:
        f.truncate(2**31)
    f = _onnx_with_external(in_tmp / "m.onnx", "big.bin")
    rc, out, err = cli("run", f)
    assert rc == 0, err
    line = cli.error("run", _onnx_with_external(in_tmp / "l.onnx", "big.bin", length=2**31))
    assert "length 2,147,483,648 differs from the 16 bytes its dims [4] declare" in line
    (in_tmp / "short.bin").write_bytes(b"\0" * 8)
    line = cli.error("run", _onnx_with_external(in_tmp / "s.onnx", "short.bin"))
    assert "holds 8 bytes, fewer than offset 0 + 16 declared" in line


@needs_onnx
@pytest.mark.parametrize("kind", ["link", "fifo", "link_folder", "absolute"])
def test_onnx_external_data_follows_no_link(cli, in_tmp, kind):
    np.ones(4, np.float32).tofile(in_tmp / "w.bin")
    (in_tmp / "sub").mkdir()
    np.ones(4, np.float32).tofile(in_tmp / "sub" / "w.bin")
    if kind == "link":
        (in_tmp / "l.bin").symlink_to(in_tmp / "w.bin")
        location, words = "l.bin", "is a symbolic link"
    elif kind == "fifo":
        os.mkfifo(in_tmp / "l.bin")
        location, words = "l.bin", "is a FIFO (named pipe), not a regular file"
    elif kind == "link_folder":
        (in_tmp / "lsub").symlink_to(in_tmp / "sub")
        location, words = "lsub/w.bin", "'lsub' is not a folder (a symbolic link"
    else:
        location, words = str(in_tmp / "w.bin"), "must be a relative path inside the folder"
    line = cli.error("info", _onnx_with_external(in_tmp / "m.onnx", location))
    assert words in line, line
    rc, _, err = cli("info", _onnx_with_external(in_tmp / "ok.onnx", "sub/w.bin"))
    assert rc == 0, err


@needs_onnx
def test_a_sparse_constant_with_external_data_reads_nothing_from_the_current_folder(
        cli, tmp_path, monkeypatch):
    from onnx import TensorProto, helper

    model_dir, cwd = tmp_path / "model", tmp_path / "cwd"
    model_dir.mkdir()
    cwd.mkdir()
    (cwd / "secret.bin").write_bytes(np.array([7, 7], np.float32).tobytes())
    monkeypatch.chdir(cwd)
    vals = helper.make_tensor("vals", TensorProto.FLOAT, [2], [1.0, 2.0])
    vals.ClearField("float_data")
    vals.data_location = TensorProto.EXTERNAL
    for key, value in [("location", "secret.bin"), ("length", "8")]:
        entry = vals.external_data.add()
        entry.key, entry.value = key, value
    sparse = helper.make_sparse_tensor(vals, helper.make_tensor("i", TensorProto.INT64, [2],
                                                                [0, 1]), [4])
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Constant", [], ["c"], sparse_value=sparse),
                               helper.make_node("Add", ["x", "c"], ["y"])], "g", io_[:1],
                              io_[1:])
    path = model_dir / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    line = cli.error("run", path)
    assert "'secret.bin' cannot be read: No such file or directory" in line  # in model/


# --------------------------------------------------------------- run --out names
def test_run_out_never_writes_a_path_as_a_member_name(cli, in_tmp):
    doc = graph_doc(nodes=[{"name": "n", "op": "Exp", "inputs": ["x"],
                            "outputs": ["../../x"]}], outputs=["../../x"])
    f = write_json(in_tmp / "m.json", doc)
    rc, out, err = cli("run", f, "--out", "o.npz")
    assert rc == 0, err
    names = zipfile.ZipFile(in_tmp / "o.npz").namelist()
    assert len(names) == 1 and "/" not in names[0] and not names[0].startswith(".")
    assert f"'../../x' is stored as '{names[0][:-4]}'" in out


# -------------------------------------------------------------- flags-file paths
MODEL = graph_doc(inputs=[{"name": "x", "shape": [8, 32], "dtype": "float32"}],
                  nodes=[{"name": "e", "op": "Exp", "inputs": ["x"], "outputs": ["y"]}])


def test_a_flags_file_cannot_write_its_project_outside_the_output_folder(cli, in_tmp):
    """keep_codegen_project with debug_dir '.' once overwrote ./manifest.json and
    ./kernels/CMakeLists.txt outside -o."""
    f = write_json(in_tmp / "m.json", MODEL)
    (in_tmp / "manifest.json").write_text("mine")
    for debug_dir, words in [(".", "not '.'"), ("dumps", "inside the output folder (-o/--out "
                                                         "out)")]:
        (in_tmp / "flags.yaml").write_text(f"keep_codegen_project: true\n"
                                           f"debug_dir: '{debug_dir}'\n")
        before = snapshot(in_tmp)
        line = cli.error("compile", f, "-o", "out", "--config", "flags.yaml")
        assert words in line, line
        assert snapshot(in_tmp) == before and (in_tmp / "manifest.json").read_text() == "mine"
    (in_tmp / "flags.yaml").write_text("keep_codegen_project: true\ndebug_dir: out/project\n")
    rc, _, err = cli("compile", f, "-o", "out", "--config", "flags.yaml", "-q")
    assert rc == 0, err
    assert (in_tmp / "out/project/manifest.json").is_file()
    assert (in_tmp / "manifest.json").read_text() == "mine"


def test_a_flags_file_debug_dir_through_a_link_is_refused(cli, in_tmp):
    (in_tmp / "elsewhere").mkdir()
    (in_tmp / "out").mkdir()
    (in_tmp / "out" / "d").symlink_to(in_tmp / "elsewhere")
    (in_tmp / "flags.yaml").write_text("dump_as_text: true\ndebug_dir: out/d/dumps\n")
    line = cli.error("compile", write_json(in_tmp / "m.json", MODEL), "-o", "out",
                     "--config", "flags.yaml")
    assert "out/d is a symbolic link; a path named by a flags file may not go through one" \
        in line
    assert list((in_tmp / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("value,words", [
    ("/etc/passwd", "a flags file may only name a file next to it"),
    ("../skip.ini", "a flags file may only name a file next to it"),
    ("link.ini", "is a symbolic link"),
])
def test_a_flags_file_skip_list_is_a_plain_file_beside_it(cli, in_tmp, value, words):
    (in_tmp / "conf").mkdir()
    (in_tmp / "skip.ini").write_text("[ByNodeName]\nsecret-node-name\n")
    (in_tmp / "conf" / "link.ini").symlink_to(in_tmp / "skip.ini")
    (in_tmp / "conf" / "flags.yaml").write_text(f"skip_node_names_cfg: '{value}'\n")
    line = cli.error("compile", write_json(in_tmp / "m.json", MODEL), "--config",
                     "conf/flags.yaml")
    assert words in line and "secret-node-name" not in line, line


def test_a_flags_file_skip_list_beside_it_is_read(cli, in_tmp):
    (in_tmp / "conf").mkdir()
    (in_tmp / "conf" / "skip.ini").write_text("[ByNodeName]\ne\n")
    (in_tmp / "conf" / "flags.yaml").write_text("skip_node_names_cfg: skip.ini\n")
    rc, out, err = cli("compile", write_json(in_tmp / "m.json", MODEL), "--config",
                       "conf/flags.yaml", "-o", "out", "--json")
    assert rc == 0, err
    assert json.loads((in_tmp / "out" / "report.json").read_text())["flags"][
        "skip_node_names"]["value"] == ["e"]
