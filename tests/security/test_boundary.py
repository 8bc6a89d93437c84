"""Inputs that once escaped as a traceback at a file boundary: a NUL byte in a path that is
read, an encrypted .npz member, and ONNX nodes whose static operands describe no tensor
(a Reshape copying a dim past the input's rank, a Range of step 0 or of 10^13 elements,
which was allocated while the model loaded)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.security.conftest import graph_doc, have, write_json

needs_onnx = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")


@pytest.mark.parametrize("argv", [
    ["compile", "{m}", "--config", "a\0b.json"],
    ["compile", "{m}", "--flags", "--path=a\0b.json"],
    ["compile", "{m}", "--flags", "--skip_node_names_cfg=a\0b"],
    ["run", "{m}", "--inputs", "a\0b.npz"],
    ["verify", "{m}", "--inputs", "a\0b.npz"],
    ["info", "a\0b.json"],
    ["run", "a\0b.yaml"],
    ["compile", "a\0b.onnx"],
], ids=["config", "path", "skip_list", "run_inputs", "verify_inputs", "model_json",
        "model_yaml", "model_onnx"])
def test_a_nul_byte_in_a_path_read_is_one_error(cli, in_tmp, argv):
    m = write_json(in_tmp / "m.json", graph_doc())
    line = cli.error(*[a.replace("{m}", str(m)) for a in argv])
    assert "a path cannot contain a NUL byte" in line
    assert "\0" not in line and "\\x00" in line


def _encrypted_npz(path: Path, member: str) -> Path:
    """A stored member with the 'encrypted' bit set in both its headers (zipfile then asks
    for a password and raises RuntimeError)."""
    np.savez(path, **{member: np.ones(4, np.float32)})
    data = bytearray(path.read_bytes())
    data[6] |= 1  # the local header's flag bits
    central = data.index(b"PK\x01\x02")
    data[central + 8] |= 1  # the directory entry's
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as z:
        assert z.infolist()[0].flag_bits & 1
    return path


def test_an_encrypted_npz_member_is_one_error(cli, in_tmp):
    _encrypted_npz(in_tmp / "w.npz", "c")
    f = write_json(in_tmp / "m.json", graph_doc(
        nodes=[{"name": "n", "op": "Mul", "inputs": ["x", "c"], "outputs": ["y"]}],
        constants=[{"name": "c", "shape": [4], "dtype": "float32", "key": "c"}],
        data_file="w.npz"))
    for command in ("info", "run", "compile"):
        assert "array 'c' is encrypted" in cli.error(command, f)
    _encrypted_npz(in_tmp / "x.npz", "x")
    assert "array 'x' is encrypted" in cli.error("run", write_json(in_tmp / "g.json",
                                                                   graph_doc()),
                                                 "--inputs", in_tmp / "x.npz")


def _onnx(path: Path, nodes, inits, inputs=True, out_shape=(4,)) -> Path:
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])] if inputs else []
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))]
    g = helper.make_graph(nodes, "g", ins, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(m.SerializeToString())
    return path


@needs_onnx
def test_an_onnx_reshape_copying_a_dim_past_the_rank_is_one_error(cli, in_tmp):
    from onnx import TensorProto, helper

    f = _onnx(in_tmp / "m.onnx", [helper.make_node("Reshape", ["x", "s"], ["y"])],
              [helper.make_tensor("s", TensorProto.INT64, [3], [2, 2, 0])])
    for command in ("info", "run", "compile"):
        assert "(Reshape): shape [2, 2, 0] copies a dim (0) past the input's rank 1" in \
            cli.error(command, f)


@needs_onnx
@pytest.mark.parametrize("start,limit,delta", [(0, 10, 0), (0, 1e13, 1), (0, float("inf"), 1),
                                               (0, float("nan"), 1)],
                         ids=["step_0", "1e13_elements", "to_inf", "to_nan"])
def test_an_onnx_range_without_a_length_is_one_error(cli, in_tmp, start, limit, delta):
    from onnx import TensorProto, helper

    f = _onnx(in_tmp / "m.onnx", [helper.make_node("Range", ["a", "b", "c"], ["y"])],
              [helper.make_tensor(n, TensorProto.FLOAT, [], [v])
               for n, v in zip("abc", (start, limit, delta), strict=True)], inputs=False,
              out_shape=("n",))
    for command in ("info", "compile"):
        assert "(Range): start" in cli.error(command, f)
        assert "do not give a length in 0..2147483647" in cli.error(command, f)


@needs_onnx
def test_an_onnx_range_of_a_valid_length_still_imports(cli, in_tmp):
    from onnx import TensorProto, helper

    f = _onnx(in_tmp / "m.onnx", [helper.make_node("Range", ["a", "b", "c"], ["y"])],
              [helper.make_tensor(n, TensorProto.FLOAT, [], [v])
               for n, v in zip("abc", (0, 4, 1), strict=True)], inputs=False)
    rc, out, _ = cli("run", f)
    assert rc == 0 and "y: float32[4]" in out


@pytest.mark.parametrize("shape", [[1_000_000, 1_000_000], ["*".join(f"s{i}" for i in range(16)),
                                                            4]], ids=["static_4TB", "16_symbols"])
def test_compile_o_of_a_legal_but_huge_model_makes_no_data(cli, in_tmp, shape):
    """A kernel's CPU driver data were made (random inputs, a reference run) before their
    size was compared with the limit: a legal 10^12-element input ended `compile -o` as
    "out of memory"."""
    f = write_json(in_tmp / "m.json", graph_doc(
        inputs=[{"name": "x", "shape": shape, "dtype": "float32"}],
        nodes=[{"name": "n", "op": "Exp", "inputs": ["x"], "outputs": ["t"]},
               {"name": "m", "op": "Abs", "inputs": ["t"], "outputs": ["y"]}]))
    rc, _, err = cli("compile", f, "-o", in_tmp / "out", "-q")
    assert rc == 0, err
    (driver,) = (in_tmp / "out" / "kernels" / "cpu").glob("*_cpu.cpp")
    manifest = (in_tmp / "out" / "manifest.json").read_text()
    assert "no data: " in manifest and "exceed 67108864" in manifest
    assert not [p for p in (in_tmp / "out" / "kernels").rglob("*.bin")]


def _aten_doc(target: str, args: list) -> dict:
    return graph_doc(nodes=[{"name": "op", "op": "Opaque", "inputs": ["x"], "outputs": ["y"],
                             "attrs": {"impl": "aten", "spec": {"target": target, "args": args},
                                       "out_types": [{"shape": [4], "dtype": "float32"}]}}])


@pytest.mark.skipif(not have("torch"), reason="needs torch")
@pytest.mark.parametrize("repeats,shape", [([4], [16]), ([2**20, 2**18], [1048576, 1048576])],
                         ids=["16_elements", "4_TiB"])
def test_an_aten_node_whose_output_is_not_its_declared_type_never_runs(cli, in_tmp, repeats,
                                                                        shape):
    """A file declaring 4 elements once made aten.repeat fill whatever its repeats said
    (gigabytes, if they fit) before the shape was compared: the operator runs on torch's
    meta device first, which allocates nothing."""
    f = write_json(in_tmp / "m.json", _aten_doc("aten.repeat.default", [{"in": 0}, repeats]))
    line = cli.error("run", f)
    assert f"output 0 would have shape {shape} (found before running it), its type says [4]" \
        in line


@pytest.mark.skipif(not have("torch"), reason="needs torch")
def test_an_aten_node_of_its_declared_type_still_runs(cli, in_tmp):
    f = write_json(in_tmp / "m.json", _aten_doc("aten.repeat.default", [{"in": 0}, [1]]))
    rc, out, _ = cli("run", f)
    assert rc == 0 and "y: float32[4]" in out


def test_an_unknown_input_dtype_names_its_field_once(cli, in_tmp):
    """The message once read "m.json: inputs[0]: m.json: inputs[0].dtype: ..."."""
    f = write_json(in_tmp / "m.json", graph_doc(inputs=[{"name": "x", "shape": [4],
                                                         "dtype": "object"}]))
    line = cli.error("info", f)
    assert line.count("m.json") == 1 and "inputs[0].dtype: unknown dtype 'object'" in line


def test_a_symbolic_dim_given_two_sizes_is_refused(cli, in_tmp):
    f = write_json(in_tmp / "m.json", graph_doc(inputs=[{"name": "x", "shape": ["b", 4],
                                                         "dtype": "float32"}]))
    assert "--dims b is given twice (3 and 4)" in cli.error("run", f, "--dims", "b=3,b=4")
    rc, out, _ = cli("run", f, "--dims", "b=3,b=3")
    assert rc == 0 and "float32[3, 4]" in out
