"""A model file is data: nothing in it may choose code to run. Each hostile Opaque node is
refused with exit 2 before anything it names is loaded, imported or called."""

from __future__ import annotations

import base64
import shutil
import subprocess

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
        # the first two are refused when the file is loaded; the third names a plausible
        # operator, so only running it (which resolves the name) refuses it
        for command in ("run", "verify", "info", "compile")[:4 if i < 2 else 2]:
            line = cli.error(command, f)
            assert "is not an ATen operator" in line or "not an operator of aten" in line, line
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


@needs_torch
@pytest.mark.parametrize("spec,message", [
    # ATen operators that read, create or write the file their argument names
    ({"target": "aten.from_file.default", "args": ["MARKER", True, 16]},
     "reads or writes files"),
    ({"target": "aten.save.default", "args": [{"in": 0}, "MARKER"]}, "does not return tensors"),
    # an operator that prints its (escape-laden) argument to the terminal
    ({"target": "aten._print.default", "args": ["\x1b[31mPWNED"]}, "does not return tensors"),
    # attributes of torch.ops.aten that are not operators
    ({"target": "aten.name.default", "args": []}, "aten.name is not an operator of aten"),
    ({"target": "aten.__class__.mro", "args": []}, "is not an ATen operator overload"),
    ({"target": "aten.add.overloads", "args": []}, "has no overload 'overloads'"),
    ({"target": "torch.load.default", "args": ["MARKER"]}, "namespace 'torch' is not accepted"),
    ({"target": "aten.add.Tensor", "args": [{"dtype": "load"}]}, "is not an argument"),
    ({"target": "aten.add.Tensor", "args": [{"in": 0}], "fn": "os.system"},
     "unknown spec keys"),
])
def test_aten_targets_other_than_tensor_operators_are_refused(cli, in_tmp, capsys, spec,
                                                              message):
    marker = in_tmp / "marker"
    args = [str(marker) if a == "MARKER" else a for a in spec["args"]]
    f = write_json(in_tmp / "m.json", opaque_doc("aten", {**spec, "args": args,
                                                          "kwargs": spec.get("kwargs", {})}))
    for command in ("run", "verify"):
        line = cli.error(command, f)
        assert message in line and "'op'" in line, line
    assert not marker.exists()
    assert "PWNED" not in capsys.readouterr().out


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
