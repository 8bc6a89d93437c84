"""A graph's data files: .npz members mapped rather than copied, raw data named by offset,
and a compiled graph that references the model's unchanged weights instead of copying them
(`compile -o`), loads back and computes what the graph compiled in memory computes."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

import graphkernel
import graphkernel.api
from graphkernel import Graph, TensorType, outputs
from graphkernel.errors import FormatError
from graphkernel.fileio import NpzFile, source_of
from graphkernel.frontends.json_format import load_graph, save_graph
from graphkernel.interpreter import random_inputs, run_graph
from tests.security.conftest import graph_doc, write_json


def mlp(seed: int = 0, layers: int = 3, width: int = 96) -> Graph:
    """x -> (MatMul w_i + b_i -> GeLU) * layers: weights and biases large enough to be kept
    in the .npz (more than 64 elements)."""
    rng = np.random.default_rng(seed)
    g = Graph("mlp")
    x = g.add_input("x", TensorType(("b", width), "float32"))
    for i in range(layers):
        w = g.const(rng.standard_normal((width, width)).astype(np.float32), name=f"w{i}")
        b = g.const(rng.standard_normal(width).astype(np.float32), name=f"b{i}")
        x = g.add_node("Add", [g.add_node("MatMul", [x, w]).output, b]).output
        x = g.add_node("GeLU", [x], {"approximate": "tanh"}).output
    g.set_outputs([x])
    return g


def saved(tmp_path: Path, g: Graph | None = None, name: str = "m.json") -> Path:
    path = tmp_path / name
    save_graph(g or mlp(), path)
    return path


def weights(g: Graph) -> list[np.ndarray]:
    return [n.attrs["value"] for n in g.nodes if n.op == "Constant" and n.attrs["value"].size > 64]


# ----------------------------------------------------------------------------- loading
def test_npz_members_stored_uncompressed_are_mapped_not_copied(tmp_path):
    g = load_graph(saved(tmp_path))
    ws = weights(g)
    assert ws and all(not w.flags.writeable and source_of(w) is not None for w in ws)
    mm, offset = source_of(ws[0])
    assert mm.path == (tmp_path / "m.npz").resolve()
    assert mm.members[offset][0] == "c0"


def test_compressed_members_are_read_as_before(tmp_path):
    path = saved(tmp_path)
    with np.load(tmp_path / "m.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez_compressed(tmp_path / "m.npz", **arrays)
    g = load_graph(path)
    assert all(source_of(w) is None and w.flags.writeable for w in weights(g))
    feeds = random_inputs(g, 0)
    np.testing.assert_array_equal(run_graph(g, feeds)[0], run_graph(mlp(), feeds)[0])


@pytest.mark.parametrize("kind", ["fortran", "big_endian"])
def test_members_that_cannot_be_views_are_copied_in_native_order(tmp_path, kind):
    arr = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    stored = np.asfortranarray(arr) if kind == "fortran" else arr.astype(">f4")
    np.savez(tmp_path / "d.npz", c=stored)
    doc = graph_doc(inputs=[{"name": "x", "shape": [32, 32], "dtype": "float32"}],
                    nodes=[{"name": "n", "op": "Add", "inputs": ["x", "c"], "outputs": ["y"]}],
                    constants=[{"name": "c", "shape": [32, 32], "dtype": "float32",
                                "key": "c"}], data_file="d.npz")
    g = load_graph(write_json(tmp_path / "m.json", doc))
    c = g.node("c").attrs["value"]
    assert source_of(c) is None and c.dtype == np.float32 and c.flags.c_contiguous
    np.testing.assert_array_equal(c, arr)


def test_a_mapped_member_is_checked_as_a_read_one(tmp_path):
    """A stored member whose .npy header claims more bytes than the member holds, or whose
    declared shape is smaller than it, is refused without a view made of it."""
    good = np.ones(16, np.float32)
    np.savez(tmp_path / "d.npz", big=np.ones(64, np.float32), good=good)
    data = bytearray((tmp_path / "d.npz").read_bytes())
    at = data.index(b"'shape': (16,)")
    data[at:at + 14] = b"'shape': (17,)"
    (tmp_path / "e.npz").write_bytes(bytes(data))
    with NpzFile(tmp_path / "d.npz", mapped=True) as z:
        with pytest.raises(ValueError, match="holds 256 bytes|more than the 64"):
            z.read("big", 64)
        assert source_of(z.read("good", 64)) is not None
    with NpzFile(tmp_path / "e.npz", mapped=True) as z, \
            pytest.raises(ValueError, match="the member holds"):
        z.read("good", 128)


def test_raw_data_files_are_named_by_offset(tmp_path):
    raw = np.arange(48, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(b"\0" * 8 + raw.tobytes())
    np.savez(tmp_path / "d.npz", c=np.full(4, 2, np.float32))
    doc = graph_doc(inputs=[{"name": "x", "shape": [4], "dtype": "float32"}],
                    nodes=[{"name": "n", "op": "Add", "inputs": ["x", "a"], "outputs": ["y"]},
                           {"name": "m", "op": "Mul", "inputs": ["y", "c"], "outputs": ["z"]}],
                    outputs=["z"], data_file=["d.npz", "w.bin"],
                    constants=[{"name": "a", "shape": [4], "dtype": "float32",
                                "file": "w.bin", "offset": 8 + 4 * 10},
                               {"name": "c", "shape": [4], "dtype": "float32", "key": "c"}])
    g = load_graph(write_json(tmp_path / "m.json", doc))
    np.testing.assert_array_equal(g.node("a").attrs["value"], raw[10:14])
    np.testing.assert_array_equal(run_graph(g, {"x": np.zeros(4, np.float32)})[0],
                                  2 * raw[10:14])
    for bad, words in [({"offset": 8 + 4 * 46}, "past the end of 'w.bin'"),
                       ({"file": "nope.bin"}, "is not one of the graph's data files"),
                       ({"file": "w.bin", "offset": None, "key": "c"}, "not an .npz archive")]:
        broken = json.loads(json.dumps(doc))
        broken["constants"][0] |= bad
        with pytest.raises(FormatError, match=words):
            load_graph(write_json(tmp_path / "b.json", broken))


def test_lax_values_go_through_the_model_and_are_refused(tmp_path):
    """A document the one-walk reader does not take as it is (a value a lax model would
    coerce: 1 for a bool) goes through the pydantic model, which is strict and names the
    field."""
    doc = graph_doc(inputs=[{"name": "x", "shape": [4], "dtype": "float32", "mutable": 1}])
    with pytest.raises(FormatError, match=r"inputs\[0\]\.mutable: Input should be a valid "
                       "boolean"):
        load_graph(write_json(tmp_path / "m.json", doc))
    doc["inputs"][0]["mutable"] = True
    assert load_graph(write_json(tmp_path / "m.json", doc)).inputs[0].mutable is True


# ---------------------------------------------------------------------- compile -o
def _compile(tmp_path: Path, model: Path, out: Path, *extra: str) -> None:
    from graphkernel.cli import main

    assert main(["compile", str(model), "-o", str(out), "-q", *extra]) == 0


def _shared_file(out: Path) -> Path:
    doc = json.loads((out / "manifest.json").read_text())
    (name,) = doc["data_sources"]
    return out / name


def test_compile_references_the_models_weights_instead_of_copying_them(tmp_path):
    model = saved(tmp_path)
    _compile(tmp_path, model, tmp_path / "out")
    out = tmp_path / "out"
    shared = _shared_file(out)
    assert shared.stat().st_ino == (tmp_path / "m.npz").stat().st_ino  # a hard link
    doc = json.loads((out / "manifest.json").read_text())
    entry = doc["data_sources"][shared.name]
    assert entry["how"] == "hard link" and entry["source"] == str(tmp_path / "m.npz")
    assert entry["sha256"] == doc["digests"][shared.name] == hashlib.sha256(
        shared.read_bytes()).hexdigest()
    assert shared.name in doc["files"]
    assert not list(out.glob("*.compiled.npz"))  # no weight changed: nothing copied
    compiled = load_graph(next(out.glob("*.compiled.json")))
    assert any(source_of(w) is not None for w in weights(compiled))
    g = load_graph(model)
    feeds = random_inputs(g, 1)
    want = run_graph(graphkernel.compile(g, "", env={}).graph, feeds)
    for a, b in zip(run_graph(compiled, feeds), want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_changed_constants_are_written_and_unchanged_ones_referenced(tmp_path):
    g = mlp()
    loaded = load_graph(saved(tmp_path, g))
    w0 = loaded.node("w0")
    w0.attrs = dict(w0.attrs, value=np.array(w0.attrs["value"]) * 2)  # changed in memory
    files = save_graph(loaded, tmp_path / "out" / "c.json", share_data=True)
    assert [f.name for f in files] == ["c.json", "c.npz", "c.weights.npz"]
    doc = json.loads((tmp_path / "out" / "c.json").read_text())
    assert doc["data_file"] == ["c.npz", "c.weights.npz"]
    by_name = {c["name"]: c for c in doc["constants"]}
    assert by_name["w0"].get("file") is None and by_name["w1"]["file"] == "c.weights.npz"
    back = load_graph(tmp_path / "out" / "c.json")
    np.testing.assert_array_equal(back.node("w0").attrs["value"], w0.attrs["value"])
    np.testing.assert_array_equal(back.node("w1").attrs["value"], g.node("w1").attrs["value"])


def test_a_copy_is_made_where_no_link_can_be(tmp_path, monkeypatch):
    def no_link(*a, **kw):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(outputs.os, "link", no_link)
    model = saved(tmp_path)
    _compile(tmp_path, model, tmp_path / "out")
    shared = _shared_file(tmp_path / "out")
    assert shared.stat().st_ino != (tmp_path / "m.npz").stat().st_ino
    assert shared.read_bytes() == (tmp_path / "m.npz").read_bytes()
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert doc["data_sources"][shared.name]["how"] == "copy"


def test_compiling_again_reads_no_weights_to_digest_them(tmp_path, monkeypatch):
    """The digest of the shared weights is the previous run's, from its manifest, while the
    file is the same unchanged one; and the same link is put in place again (no spare name
    left behind)."""
    model = saved(tmp_path)
    _compile(tmp_path, model, tmp_path / "out")
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    digests = []
    real = outputs.file_sha256
    monkeypatch.setattr(outputs, "file_sha256", lambda *a: digests.append(a) or real(*a))
    monkeypatch.setattr(outputs, "_KNOWN", {})  # (as a new process starts)
    _compile(tmp_path, model, tmp_path / "out", "--flags", "--opt_level=1")
    assert digests == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    os.utime(tmp_path / "m.npz", ns=(1, 1))  # another file now, as far as anyone can tell
    monkeypatch.setattr(outputs, "_KNOWN", {})
    _compile(tmp_path, model, tmp_path / "out")
    assert len(digests) == 1


def test_weights_are_digested_while_the_graph_compiles(tmp_path, monkeypatch):
    """`compile -o` starts digesting the model's weights before the pipeline runs; the
    manifest records the file's true digest, and the file is read to digest it once."""
    model = saved(tmp_path)
    threads, digests = [], []
    real = outputs.file_sha256
    monkeypatch.setattr(outputs, "_KNOWN", {})
    monkeypatch.setattr(outputs, "_PENDING", {})
    monkeypatch.setattr(outputs, "file_sha256",
                        lambda *a: digests.append(threading.current_thread()) or real(*a))
    started = outputs.digest_soon
    monkeypatch.setattr(outputs, "digest_soon", lambda fd: threads.append(fd) or started(fd))
    real_compile = graphkernel.api.compile

    def compile_after_start(*a, **kw):  # the digest is under way when the pipeline starts
        assert len(threads) == 1 and len(outputs._PENDING) == 1
        return real_compile(*a, **kw)

    monkeypatch.setattr(graphkernel.api, "compile", compile_after_start)
    _compile(tmp_path, model, tmp_path / "out")
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    (entry,) = doc["data_sources"].values()
    assert entry["sha256"] == hashlib.sha256((tmp_path / "m.npz").read_bytes()).hexdigest()
    assert len(digests) == 1 and digests[0] is not threading.main_thread()
    assert outputs._PENDING == {}


def test_a_digest_started_early_is_used_only_for_the_same_unchanged_file(tmp_path,
                                                                         monkeypatch):
    """``digest_soon`` then ``share_file``: the same digest as computed on the spot; for a
    file changed in between (another identity), the digest of what it holds now."""
    monkeypatch.setattr(outputs, "_PENDING", {})
    monkeypatch.setattr(outputs, "_KNOWN", {})
    data = tmp_path / "w.bin"
    data.write_bytes(b"a" * 100_000)
    for change in (False, True):
        outputs._PENDING.clear()
        outputs._KNOWN.clear()
        fd = os.open(data, os.O_RDONLY)
        try:
            outputs.digest_soon(fd)
            assert len(outputs._PENDING) == 1
            outputs.digest_soon(fd)  # (once per file)
            assert len(outputs._PENDING) == 1
            next(iter(outputs._PENDING.values())).join()
            if change:
                with open(data, "ab") as f:
                    f.write(b"b")
            out = tmp_path / f"shared_{change}.bin"
            with outputs.transaction():
                outputs.share_file(out, fd, data)
            want = hashlib.sha256(data.read_bytes()).hexdigest()
            assert outputs.shared_as(out).sha256 == want
            assert len(outputs._PENDING) == change  # (the changed file's digest: not used)
        finally:
            os.close(fd)


def test_the_sharing_decision_is_made_once_per_array_and_only_for_that_array(tmp_path):
    """The writer asks of every array whether it is still a view of a model's data file
    twice; the second answer is the first one's (a copy of it), and it is never given for
    another array that happens to take the first one's id."""
    from graphkernel.frontends.json_format import _Sharing

    g = load_graph(saved(tmp_path))
    w = weights(g)[0]
    sharing = _Sharing(tmp_path / "out.json")
    first = sharing.reference(w)
    assert first is not None and first == sharing._reference(w)
    first["key"] = "changed by a caller"
    assert sharing.reference(w) == sharing._reference(w) != first
    other = np.ones(4, np.float32)  # (not in any data file)
    sharing.seen[id(other)] = (w, sharing._reference(w))  # as if ``w`` had had its id
    assert sharing.reference(other) is None


def test_an_attribute_that_cannot_be_saved_names_its_node(tmp_path):
    g = Graph("g")
    x = g.add_input("x", TensorType((4,), "float32"))
    y = g.add_node("ReLU", [x], name="act").output
    g.set_outputs([y])
    g.node("act").attrs["extra"] = {"a": object()}
    with pytest.raises(FormatError, match=r"node 'act' \(ReLU\): attribute value"):
        save_graph(g, tmp_path / "g.json")


def test_cleanup_removes_the_link_and_never_the_models_weights(tmp_path):
    model = saved(tmp_path)
    _compile(tmp_path, model, tmp_path / "out")
    shared = _shared_file(tmp_path / "out")
    other = write_json(tmp_path / "o.json", graph_doc(name="other"))
    _compile(tmp_path, other, tmp_path / "out")
    assert not shared.exists()
    assert (tmp_path / "m.npz").is_file() and load_graph(model) is not None


def test_weights_changed_since_they_were_shared_are_left(tmp_path):
    """The shared file is the model's: a change made to it since (through either name) is
    someone's, and the cleanup leaves it and says so."""
    model = saved(tmp_path)
    _compile(tmp_path, model, tmp_path / "out")
    shared = _shared_file(tmp_path / "out")
    with open(tmp_path / "m.npz", "r+b") as f:  # edited in place: the same file as the link
        f.seek(1000)
        f.write(b"\x01\x02\x03\x04")
    from graphkernel.cli import main

    other = write_json(tmp_path / "o.json", graph_doc(name="other"))
    assert main(["compile", str(other), "-o", str(tmp_path / "out")]) == 0
    assert shared.exists() and (tmp_path / "m.npz").exists()


def test_a_zip_member_name_that_differs_from_its_local_header_is_not_mapped(tmp_path):
    np.savez(tmp_path / "d.npz", c=np.ones(128, np.float32))
    data = bytearray((tmp_path / "d.npz").read_bytes())
    data[30:31] = b"x"  # the local header's copy of the name ("c.npy" -> "x.npy")
    (tmp_path / "d.npz").write_bytes(bytes(data))
    with NpzFile(tmp_path / "d.npz", mapped=True) as z, \
            pytest.raises(ValueError, match="cannot be read"):
        z.read("c", 512)
    assert zipfile.is_zipfile(tmp_path / "d.npz")


def test_the_report_written_is_the_report(tmp_path):
    """report.json (a line per entry, encoded from the report's records as they are) holds
    what ``report.to_dict()`` holds."""
    from graphkernel.dump import to_json

    model = saved(tmp_path)
    _compile(tmp_path, model, tmp_path / "out")
    # (compiled as the command compiles what it loaded: its validate pass trusts the loader)
    res = graphkernel.compile(load_graph(model), "", env={}, copy=False, checked_on_load=True)
    got = json.loads((tmp_path / "out" / "report.json").read_text())
    want = json.loads(to_json(res.report.to_dict()))
    for doc in (got, want):
        doc.pop("seconds")
        for p in doc["passes"]:
            p.pop("seconds")
    assert got == want


# ------------------------------------------------------------------------------ onnx
def _onnx_mlp(tmp_path: Path) -> tuple[Path, Graph]:
    """``mlp()`` as an ONNX model whose weights are external data in one file."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    g = mlp()
    inits, nodes, x = [], [], "x"
    for i in range(3):
        for name in (f"w{i}", f"b{i}"):
            inits.append(numpy_helper.from_array(g.node(name).attrs["value"], name))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Gelu", [f"a{i}"], [f"y{i}"], approximate="tanh")]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["b", 96])], [helper.make_tensor_value_info(
            x, TensorProto.FLOAT, ["b", 96])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    return path, g


def test_onnx_external_data_is_mapped_and_shared(tmp_path):
    from graphkernel.frontends import load_model

    path, g = _onnx_mlp(tmp_path)
    loaded = load_model(path)
    ws = weights(loaded)
    assert len(ws) == 6 and all(source_of(w) is not None for w in ws)
    _compile(tmp_path, path, tmp_path / "out")
    shared = _shared_file(tmp_path / "out")
    assert shared.suffix == ".bin"
    assert shared.stat().st_ino == (tmp_path / "m.onnx.data").stat().st_ino
    compiled = load_graph(next((tmp_path / "out").glob("*.compiled.json")))
    feeds = random_inputs(g, 2)
    want = run_graph(graphkernel.compile(load_model(path), "", env={}).graph, feeds)
    for a, b in zip(run_graph(compiled, feeds), want, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(run_graph(compiled, feeds)[0], run_graph(g, feeds)[0],
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ memory given back after loading
_GLIBC = str(getattr(os, "confstr", lambda _: "")("CS_GNU_LIBC_VERSION") or "").startswith(
    "glibc")


def test_loading_gives_the_parses_memory_back_and_exits_cleanly(tmp_path):
    """A process that loads a JSON graph and an ONNX model (each giving the C heap's free
    pages back) exits with status 0, not a signal; and giving them back lowers the resident
    memory that freed heap blocks held (glibc keeps them otherwise)."""
    import subprocess
    import sys

    path, _ = _onnx_mlp(tmp_path)
    script = f"""
import sys
from graphkernel.fileio import release_freed_memory
from graphkernel.frontends import load_model
g1, g2 = load_model({str(saved(tmp_path))!r}), load_model({str(path)!r})

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

blocks = [bytes(4000) + bytes([i % 256]) for i in range(50000)]  # (~200 MB from the heap)
kept = blocks[::50]  # (a block in use every 200 kB: freeing the rest cannot shrink the heap)
del blocks
before = rss()
release_freed_memory()
print(len(g1.nodes), len(g2.nodes), before - rss())
"""
    env = {**os.environ, "PYTHONPATH": str(Path(graphkernel.__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    n1, n2, freed = map(int, done.stdout.split())
    assert n1 > 0 and n2 > 0
    if _GLIBC and Path("/proc/self/statm").exists():
        assert freed > 100 * 2**20


def test_giving_memory_back_is_a_no_op_without_glibc(monkeypatch):
    from graphkernel import fileio

    def no_glibc(name):
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(fileio.os, "confstr", no_glibc)
    assert fileio._malloc_trim() is False
    monkeypatch.setattr(fileio, "_TRIM", None)
    fileio.release_freed_memory()  # (looks the function up: not there, nothing called)
    assert fileio._TRIM is False
    monkeypatch.setattr(fileio.os, "confstr", lambda name: None)
    assert fileio._malloc_trim() is False
