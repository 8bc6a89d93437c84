"""Malformed models that once escaped as a traceback or as "a bug in graphkernel" (exit 3):
each is one error line naming what is wrong and what is accepted, exit 2, for every
command that reads the model."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import limits
from tests.security.conftest import graph_doc, have, write_json

needs_onnx = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")
COMMANDS = ["info", "run", "compile", "verify", "explain", "expand"]
SCALAR = [{"name": "x", "shape": [], "dtype": "float32"}]


def _one(op, inputs, attrs=None, outputs=("y",), inputs_doc=None):
    return graph_doc(inputs=inputs_doc, nodes=[{"name": "n", "op": op, "inputs": inputs,
                                                "outputs": list(outputs),
                                                "attrs": attrs or {}}],
                     outputs=list(outputs))


def _int_input(dtype):
    return [{"name": "x", "shape": [4], "dtype": dtype}]


# (case id, graph document, words the error line holds)
CASES = [
    ("topk_lists_fewer_outputs", _one("TopK", ["x"], {"k": 2}),
     "the op has 2 outputs, but 1 output names are given"),
    ("bias_add_of_a_scalar", _one("BiasAdd", ["x", "x"], inputs_doc=SCALAR),
     "a 0-d (scalar) input has no channel axis"),
    ("bias_add_grad_of_a_scalar", _one("BiasAddGrad", ["x"], inputs_doc=SCALAR),
     "a 0-d (scalar) input has no channel axis"),
    ("concat_of_scalars", _one("Concat", ["x", "x"], {"axis": 0}, inputs_doc=SCALAR),
     "a 0-d (scalar) input has no axis 0"),
    ("split_of_a_scalar", _one("Split", ["x"], {"axis": 0, "sizes": [1]}, inputs_doc=SCALAR),
     "a 0-d (scalar) input has no axis 0"),
    ("repeat_interleave_of_a_scalar", _one("RepeatInterleaveInt", ["x"],
                                           {"repeats": 2, "axis": 0}, inputs_doc=SCALAR),
     "a 0-d (scalar) input has no axis 0"),
    ("topk_of_a_scalar", _one("TopK", ["x"], {"k": 1, "axis": -1}, ("v", "i"),
                              inputs_doc=SCALAR), "a 0-d (scalar) input has no axis -1"),
    ("gather_from_a_scalar", _one("Gather", ["x", "i"], {"axis": 0}, inputs_doc=SCALAR + [
        {"name": "i", "shape": [2], "dtype": "int32"}]), "a 0-d (scalar) input has no axis 0"),
    ("strided_slice_of_a_scalar", _one("StridedSlice", ["x"], {"begin": [0], "end": [1]},
                                       inputs_doc=SCALAR), "a 0-d (scalar) input has no axis 0"),
    ("rms_norm_of_a_scalar", _one("RMSNorm", ["x", "x"], outputs=("y", "r"), inputs_doc=SCALAR),
     "a 0-d (scalar) input has no axis -1"),
    ("softmax_over_no_axis", _one("Softmax", ["x"], {"axis": []}),
     "axis [] names no axis to normalize over"),
    ("clamp_int_with_inf", _one("ClampScalar", ["x"], {"min": 0.0, "max": float("inf")},
                                inputs_doc=_int_input("int32")),
     "attribute 'max' inf is not a value of the input's dtype int32"),
    ("clamp_int8_below_its_range", _one("ClampScalar", ["x"], {"min": -1e30},
                                        inputs_doc=_int_input("int8")),
     "attribute 'min' -1e+30 is not a value of the input's dtype int8 (accepted: a number "
     "in -128..127)"),
    ("fill_int_with_inf", _one("FillV2", ["x"], {"value": float("inf")},
                               inputs_doc=_int_input("int8")),
     "attribute 'value' inf is not a value of the input's dtype int8"),
    ("fill_int_with_nan", _one("FillV2", ["x"], {"value": float("nan")},
                               inputs_doc=_int_input("int64")),
     "attribute 'value' nan is not a value of the input's dtype int64"),
    ("dim_of_20000_symbols", graph_doc(inputs=[{"name": "x", "shape": ["*".join(
        f"s{i}" for i in range(20_000))], "dtype": "float32"}]),
     f"is a product of 20,000 factors, above the limit of {limits.MAX_DIM_FACTORS}"),
    ("rank_above_the_limit", graph_doc(inputs=[{"name": "x", "shape": [1] * 300,
                                                "dtype": "float32"}]),
     f"rank 300 is above the limit of {limits.MAX_RANK} dims"),
]


@pytest.mark.parametrize("doc,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", COMMANDS)
def test_malformed_graph_is_one_clear_error(cli, in_tmp, command, doc, words):
    f = write_json(in_tmp / "m.json", doc)
    line = cli.error(command, f)
    assert words in line, line


def test_a_symbolic_size_estimate_saturates_instead_of_overflowing(cli, in_tmp):
    """16 dims of 16 symbols each: within the file limits, 256 symbols in all, whose size
    estimate (32 per symbol) would pass a float's range; the compile works."""
    shape = ["*".join(f"s{j}_{i}" for i in range(16)) for j in range(16)]
    f = write_json(in_tmp / "m.json", graph_doc(inputs=[{"name": "x", "shape": shape,
                                                         "dtype": "float32"}]))
    rc, _, err = cli("compile", f, "-o", "out", "-q")
    assert rc == 0, err
    line = cli.error("run", f)  # random inputs at 4 per symbol: 4**256 elements
    assert f"above the limit of {limits.MAX_NUMEL:,}" in line and "--dims" in line, line


def test_squeezing_a_scalar_keeps_it(cli, in_tmp):
    f = write_json(in_tmp / "m.json", _one("Squeeze", ["x"], {"axis": [0]}, inputs_doc=SCALAR))
    for command in COMMANDS:
        rc, _, err = cli(command, f)
        assert rc == 0, (command, err)


# ------------------------------------------------------------------ data files
def _with_data(in_tmp, name, write):
    write(in_tmp / name)
    return write_json(in_tmp / "m.json", graph_doc(
        nodes=[{"name": "n", "op": "Add", "inputs": ["x", "c"], "outputs": ["y"]}],
        constants=[{"name": "c", "shape": [4], "dtype": "float32", "key": "c"}],
        data_file=name))


DATA_FILES = [
    ("npy", "d.npy", lambda p: np.save(p, np.ones(4, np.float32)), "not an .npz archive"),
    ("structured", "d.npz", lambda p: np.savez(p, c=np.zeros(4, [("a", "f4"), ("b", "i4")])),
     "has dtype [('a', '<f4'), ('b', '<i4')]; an array of numbers or bools is accepted"),
    ("string", "d.npz", lambda p: np.savez(p, c=np.array(list("abcd"))),
     "has dtype <U1; an array of numbers or bools is accepted"),
    ("other_dtype", "d.npz", lambda p: np.savez(p, c=np.ones(4, np.complex64)),
     "holds complex64, the graph declares float32"),
    ("too_few_values", "d.npz", lambda p: np.savez(p, c=np.ones(3, np.float32)),
     "shape [4] needs 4 values, got 3"),
]


@pytest.mark.parametrize("name,write,words", [d[1:] for d in DATA_FILES],
                         ids=[d[0] for d in DATA_FILES])
@pytest.mark.parametrize("command", ["info", "run", "compile"])
def test_a_data_file_of_the_wrong_kind_is_one_clear_error(cli, in_tmp, command, name, write,
                                                          words):
    f = _with_data(in_tmp, name, write)
    line = cli.error(command, f)
    assert words in line and "m.json" in line, line


# ------------------------------------------------------------------------ onnx
def _onnx_model(path, nodes, initializers=()):
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]
    graph = helper.make_graph(nodes, "g", ins, outs, initializer=list(initializers))
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    return path


def _short_tensor(name):
    from onnx import TensorProto, helper

    t = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
    t.ClearField("float_data")
    t.raw_data = b"\0" * 8  # 2 of the 4 floats its dims declare
    return t


@needs_onnx
@pytest.mark.parametrize("command", ["info", "run", "compile"])
def test_onnx_constant_whose_raw_data_is_short_of_its_shape(cli, in_tmp, command):
    from onnx import helper

    f = _onnx_model(in_tmp / "m.onnx", [helper.make_node("Constant", [], ["c"],
                                                         value=_short_tensor("c")),
                                        helper.make_node("Add", ["x", "c"], ["y"])])
    assert "value: raw data holds 8 bytes, its dims [4] need 16" in cli.error(command, f)
    g = _onnx_model(in_tmp / "i.onnx", [helper.make_node("Add", ["x", "w"], ["y"])],
                    [_short_tensor("w")])
    assert "initializer 'w': raw data holds 8 bytes" in cli.error(command, g)


@needs_onnx
@pytest.mark.parametrize("command", ["info", "run", "compile"])
def test_onnx_constant_of_shape_with_a_two_element_value(cli, in_tmp, command):
    from onnx import TensorProto, helper

    f = _onnx_model(in_tmp / "m.onnx", [
        helper.make_node("Constant", [], ["s"],
                         value=helper.make_tensor("s", TensorProto.INT64, [1], [4])),
        helper.make_node("ConstantOfShape", ["s"], ["c"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])),
        helper.make_node("Add", ["x", "c"], ["y"])])
    assert "value holds 2 elements; it must hold exactly one" in cli.error(command, f)
