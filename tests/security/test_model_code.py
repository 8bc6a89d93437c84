"""A model file is data: nothing in it may choose code to run. Each hostile Opaque node is
refused with exit 2 before anything it names is loaded, imported or called."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphkernel.errors import GraphKernelError
from graphkernel.frontends.json_format import load_graph
from graphkernel.interpreter import run_graph
from tests.security.conftest import have, opaque_doc, write_json

needs_torch = pytest.mark.skipif(not have("torch"), reason="needs the torch extra")
needs_onnx = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")

PLANTED_C = r"""
#include <cstdio>
__attribute__((constructor)) static void planted() {
    FILE* f = std::fopen(MARKER, "w");
    if (f) { std::fputs("the constructor ran", f); std::fclose(f); }
}
"""


@pytest.fixture
def planted_so(tmp_path):
    """A shared object whose constructor writes a marker file when it is loaded."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    marker = tmp_path / "so_marker"
    src = tmp_path / "planted.cpp"
    src.write_text(PLANTED_C)
    so = tmp_path / "libplanted.so"
    subprocess.run(["g++", "-shared", "-fPIC", f'-DMARKER="{marker}"', str(src), "-o", str(so)],
                   check=True)
    return so, marker


@pytest.fixture
def planted_module(tmp_path, monkeypatch):
    """An importable Python module that writes a marker file when it is imported."""
    marker = tmp_path / "module_marker"
    (tmp_path / "planted_mod.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def test_planted_shared_object_is_never_loaded(cli, in_tmp, planted_so):
    import ctypes

    so, marker = planted_so
    specs = [{"target": "load_library", "args": [str(so)], "kwargs": {}},
             {"target": "ops.load_library", "args": [str(so)], "kwargs": {}},
             {"target": "aten.load_library.default", "args": [str(so)], "kwargs": {}}]
    for i, spec in enumerate(specs):
        f = write_json(in_tmp / f"m{i}.json", opaque_doc("aten", spec))
        # all are refused when the file is loaded: the first two are no operator names, the
        # third names no reviewed operator
        for command in ("run", "verify", "info", "compile"):
            line = cli.error(command, f)
            assert ("is not an ATen operator" in line if i < 2 else
                    "is not one of the ATen operators a model file may run" in line), line
        assert not marker.exists(), spec
    ctypes.CDLL(str(so))  # the planted object works: loading it does write the marker
    assert marker.exists()


@needs_torch
def test_import_module_is_never_called(cli, in_tmp, planted_module):
    f = write_json(in_tmp / "m.json", opaque_doc(
        "aten", {"target": "import_module", "args": ["planted_mod"], "kwargs": {}}))
    assert "'import_module' is not an ATen operator overload" in cli.error("run", f)
    assert "m.json: nodes[0] ('op')" in cli.error("verify", f)
    assert not planted_module.exists()


# (spec, what the file's loader says, what the executor says when the same spec is built in
# memory, where only the structural and tensor-operator checks apply)
HOSTILE_SPECS = [
    # ATen operators that read, create or write the file their string argument names
    ({"target": "aten.from_file.default", "args": ["MARKER", True, 16]},
     "reads or writes files", "reads or writes files"),
    ({"target": "aten.save.default", "args": [{"in": 0}, "MARKER"]}, "a model file may run",
     "does not return tensors"),
    # an operator that prints its (escape-laden) argument to the terminal
    ({"target": "aten._print.default", "args": ["\x1b[31mPWNED"]}, "a model file may run",
     "does not return tensors"),
    # attributes of torch.ops.aten that are not operators
    ({"target": "aten.name.default", "args": []}, "a model file may run",
     "aten.name is not an operator of aten"),
    ({"target": "aten.__class__.mro", "args": []}, "is not an ATen operator overload",
     "is not an ATen operator overload"),
    ({"target": "aten.add.overloads", "args": []}, "a model file may run",
     "has no overload 'overloads'"),
    ({"target": "torch.load.default", "args": ["MARKER"]}, "namespace 'torch' is not accepted",
     "namespace 'torch' is not accepted"),
    ({"target": "aten.add.Tensor", "args": [{"dtype": "load"}]}, "is not an argument",
     "is not an argument"),
    ({"target": "aten.add.Tensor", "args": [{"in": 0}], "fn": "os.system"},
     "unknown spec keys", "unknown spec keys"),
]


@needs_torch
@pytest.mark.parametrize("spec,message,_", HOSTILE_SPECS)
def test_aten_targets_other_than_tensor_operators_are_refused(cli, in_tmp, capsys, spec,
                                                              message, _):
    marker = in_tmp / "marker"
    args = [str(marker) if a == "MARKER" else a for a in spec["args"]]
    f = write_json(in_tmp / "m.json", opaque_doc("aten", {**spec, "args": args,
                                                          "kwargs": spec.get("kwargs", {})}))
    for command in ("run", "verify", "info", "compile"):
        line = cli.error(command, f)
        assert message in line and "'op'" in line, line
    assert not marker.exists()
    assert "PWNED" not in capsys.readouterr().out


@needs_torch
@pytest.mark.parametrize("spec,_,message", HOSTILE_SPECS)
def test_the_executor_refuses_them_in_memory_too(spec, _, message):
    from graphkernel.frontends.opaque import aten_executor

    with pytest.raises(GraphKernelError, match=re.escape(message)):
        aten_executor({**spec, "kwargs": spec.get("kwargs", {})})


def test_fn_from_a_file_is_refused(cli, in_tmp):
    doc = opaque_doc("aten", {"target": "aten.add.Tensor", "args": [], "kwargs": {}})
    doc["nodes"][0]["attrs"]["fn"] = "os.system"
    f = write_json(in_tmp / "m.json", doc)
    assert "'fn' is an in-memory callable; it cannot come from a file" in cli.error("run", f)


def test_unknown_impl_is_refused_at_load(cli, in_tmp):
    f = write_json(in_tmp / "m.json", opaque_doc("python", {"code": "import os"}))
    assert "unknown Opaque impl 'python' (accepted: aten, onnx" in cli.error("info", f)


@needs_torch
def test_a_real_aten_operator_still_runs(in_tmp):
    f = write_json(in_tmp / "m.json", opaque_doc(
        "aten", {"target": "aten.add.Tensor", "args": [{"in": 0}, {"in": 0}],
                 "kwargs": {"alpha": 2}}))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_graph(load_graph(f), [x])[0], x * 3)


@needs_torch
def test_refusal_happens_in_the_executor_too():
    """A spec built in memory (not from a file) meets the same executor checks."""
    from graphkernel.frontends.opaque import aten_executor

    with pytest.raises(GraphKernelError, match="does not return tensors"):
        aten_executor({"target": "aten.save.default", "args": [], "kwargs": {}})


# ---------------------------------------------------------------------- onnx
def _onnx_spec(node) -> dict:
    return {"node": base64.b64encode(node.SerializeToString()).decode(),
            "opsets": {"ai.onnx": 17}}


@needs_onnx
def test_onnx_nodes_run_only_standard_op_types(cli, in_tmp):
    from onnx import helper

    ok = write_json(in_tmp / "ok.json", opaque_doc("onnx", _onnx_spec(
        helper.make_node("Relu", ["x"], ["y"]))))
    x = np.array([-1, 0, 2, -3], np.float32)
    np.testing.assert_array_equal(run_graph(load_graph(ok), [x])[0], np.maximum(x, 0))
    custom = write_json(in_tmp / "custom.json", opaque_doc("onnx", _onnx_spec(
        helper.make_node("Exec", ["x"], ["y"], domain="com.evil"))))
    assert "domain 'com.evil' is not accepted" in cli.error("run", custom)
    unknown = write_json(in_tmp / "unknown.json", opaque_doc("onnx", _onnx_spec(
        helper.make_node("Relu2", ["x"], ["y"]))))
    assert "'Relu2' is not an operator of ONNX domain" in cli.error("run", unknown)


@needs_onnx
def test_onnx_tensors_never_point_at_files(cli, in_tmp):
    from onnx import TensorProto, helper

    t = helper.make_tensor("t", TensorProto.FLOAT, [4], [0.0] * 4)
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../../etc/passwd")
    node = helper.make_node("Constant", [], ["y"], value=t)
    f = write_json(in_tmp / "m.json", opaque_doc("onnx", _onnx_spec(node), n_in=0))
    assert "holds a tensor stored in an external file" in cli.error("run", f)
    sub = helper.make_graph([helper.make_node("Constant", [], ["c"], value=t)], "body", [],
                            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])])
    cond = helper.make_node("If", ["x"], ["y"], then_branch=sub, else_branch=sub)
    f = write_json(in_tmp / "if.json", opaque_doc("onnx", _onnx_spec(cond)))
    assert "external file" in cli.error("run", f)


# ------------------------------------------------------- trust by source (aten)
# What the attacker named: an out-of-bounds heap write, an out-of-bounds read and
# uninitialised memory. Run in a child process: were one of them executed, the child (not
# the test run) would abort, and the tests would fail on its exit status. One child runs
# the command on every file in turn (each in a folder of its own), so that the interpreter
# and graphkernel start once, not once a file.
MEMORY_HAZARDS = [
    {"target": "aten._segment_reduce_backward.default",
     "args": [{"in": 0}, {"in": 0}, {"in": 0}, "sum"],
     "kwargs": {"lengths": [1000000, 1000000]}},
    {"target": "aten.segment_reduce.default", "args": [{"in": 0}, "sum"],
     "kwargs": {"lengths": [1000000], "unsafe": True}},
    {"target": "aten.empty.memory_format", "args": [[4]], "kwargs": {}},
    {"target": "aten.empty_like.default", "args": [{"in": 0}], "kwargs": {}},
    {"target": "aten.as_strided.default", "args": [{"in": 0}, [4], [1000000]], "kwargs": {}},
]
_RUN_EACH = """
import contextlib, io, json, os, sys
from graphkernel.cli import main
results = []
for folder in sys.argv[1:]:
    os.chdir(folder)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["run", os.path.join(folder, "m.json"), "--out", "o.npz"])
        except SystemExit as e:
            rc = e.code
    results.append({"rc": rc, "stderr": err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def hazard_runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """``graphkernel run m.json --out o.npz`` on each MEMORY_HAZARDS file, in one child:
    target -> (its folder, {"rc", "stderr"})."""
    folders = []
    for i, spec in enumerate(MEMORY_HAZARDS):
        folder = tmp_path_factory.mktemp(f"hazard{i}")
        write_json(folder / "m.json", opaque_doc("aten", spec))
        folders.append(folder)
    proc = subprocess.run([sys.executable, "-c", _RUN_EACH, *map(str, folders)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {spec["target"]: (folder, r)
            for spec, folder, r in zip(MEMORY_HAZARDS, folders, results, strict=True)}


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("spec", MEMORY_HAZARDS, ids=[s["target"] for s in MEMORY_HAZARDS])
def test_a_model_file_cannot_name_an_unchecked_aten_operator(hazard_runs, spec):
    folder, r = hazard_runs[spec["target"]]
    errors = [ln for ln in r["stderr"].splitlines() if ln.startswith("graphkernel: error:")]
    assert r["rc"] == 2 and len(errors) == 1, (r["rc"], r["stderr"][-2000:])
    assert "is not one of the ATen operators a model file may run" in errors[0]
    assert not (folder / "o.npz").exists()


@needs_torch
def test_a_graph_built_in_process_runs_any_aten_operator(tmp_path):
    """The same node is code when the program builds it, data when a file holds it."""
    from graphkernel import Graph, TensorType
    from graphkernel.frontends.json_format import save_graph
    from graphkernel.frontends.opaque import FILE_ATEN_OVERLOADS

    target = "aten.zeros_like.default"
    assert target not in FILE_ATEN_OVERLOADS
    g = Graph("g")
    x = g.add_input("x", TensorType((4,), "float32"))
    y = g.add_node("Opaque", [x], {"impl": "aten", "spec": {"target": target,
                                                            "args": [{"in": 0}]},
                                   "out_types": [TensorType((4,), "float32")]}).output
    g.set_outputs([g.add_node("Add", [x, y]).output])
    xs = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_graph(g, [xs])[0], xs)
    save_graph(g, tmp_path / "g.json")
    with pytest.raises(GraphKernelError, match="not one of the ATen operators a model file"):
        load_graph(tmp_path / "g.json")


@needs_torch
def test_every_reviewed_overload_is_a_functional_tensor_operator():
    from graphkernel.frontends.opaque import FILE_ATEN_OVERLOADS, resolve_aten

    assert len(FILE_ATEN_OVERLOADS) > 100
    for target in sorted(FILE_ATEN_OVERLOADS):
        op = resolve_aten(target)  # real, of namespace aten, returning tensors
        schema = op._schema
        written = [a.name for a in schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
        assert not written, (target, written)  # functional: no argument is written
        for bad in ("unsafe", "empty", "storage", "pointer", "from_file", "rand", "bernoulli",
                    "segment"):
            assert bad not in target and all(bad not in a.name for a in schema.arguments), \
                (target, bad)


@needs_torch
def test_the_models_shipped_in_examples_name_only_reviewed_operators():
    from graphkernel.frontends import load_model

    for f in sorted((Path(__file__).parents[2] / "examples" / "models").glob("*.json")):
        load_model(f)  # bert's gather, whisper's convolution: reviewed


@needs_torch
def test_a_reproducer_of_an_in_process_graph_with_any_operator_is_still_written(tmp_path):
    """A bisect reproducer is a file, which may not run the operator an in-process graph
    named: the files are written, and the result says they do not replay (no exception)."""
    from graphkernel import Graph, TensorType
    from graphkernel.bisect import write_repro

    g = Graph("g")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    z = g.add_node("Opaque", [x], {"impl": "aten", "spec": {"target": "aten.zeros_like.default",
                                                            "args": [{"in": 0}]},
                                   "out_types": [TensorType((4, 8), "float32")]}).output
    g.set_outputs([g.add_node("Exp", [g.add_node("Add", [x, z]).output]).output])
    r = write_repro(g, {"x": np.ones((4, 8), np.float32)}, [], "", tmp_path)
    assert (tmp_path / "repro.json").is_file() and (tmp_path / "repro_inputs.npz").is_file()
    assert r.kind == "whole model" and not r.reproduces
