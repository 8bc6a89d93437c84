"""Every ONNX op graphkernel maps, with hostile attributes and static inputs (empty lists,
out-of-range axes, 2^40, NaN, infinity, zero steps, wrong element types): importing the
model is exit 0 or one error line with exit 2, never a traceback. A node whose attributes
its handler cannot read is left to ONNX's own operator (an Opaque node), which says what is
wrong when it runs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.security.conftest import have

pytestmark = pytest.mark.skipif(not have("onnx"), reason="needs the onnx extra")

ATTRS = ["axis", "axes", "perm", "keepdims", "shape", "allowzero", "start", "end", "k",
         "largest", "alpha", "beta", "epsilon", "transA", "transB", "mode", "pads", "to",
         "split", "num_outputs", "kernel_shape", "strides", "dilations", "group", "auto_pad",
         "ceil_mode", "blocksize", "equation", "batch_dims", "reduction", "p", "min", "max",
         "upper", "output_padding", "approximate", "exclusive", "reverse", "direction"]
INTS = [-9, -3, -1, 0, 1, 2, 3, 5, 2**31, 2**62, -2**62]
LISTS = [-9, -1, 0, 1, 2, 3, 7, 2**40, -2**40]
FLOATS = [0.0, -1.0, 2.5, 1e30, float("nan"), float("inf")]


def _attr(rng: random.Random, name: str):
    if name == "equation":
        return rng.choice(["ij,jk->ik", "...", "a", "ii->i", "ab,bc->", ""])
    if name in ("mode", "auto_pad", "approximate", "reduction", "direction"):
        return rng.choice(["constant", "reflect", "edge", "SAME_UPPER", "VALID", "tanh", "", "x"])
    if name in ("perm", "axes", "pads", "kernel_shape", "strides", "dilations", "split",
                "shape", "output_padding"):
        return [rng.choice(LISTS) for _ in range(rng.randint(0, 5))]
    if name in ("alpha", "beta", "epsilon", "p", "min", "max"):
        return rng.choice(FLOATS)
    return rng.choice(INTS)


def _initializer(rng: random.Random, name: str):
    from onnx import TensorProto, helper, numpy_helper

    dt = rng.choice([TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL,
                     TensorProto.FLOAT16, TensorProto.UINT8])
    shape = [rng.choice([0, 1, 2, 3, 4]) for _ in range(rng.randint(0, 3))]
    n = int(np.prod(shape)) if shape else 1
    np_dt = helper.tensor_dtype_to_np_dtype(dt)
    if np.issubdtype(np_dt, np.floating):
        vals = np.array([rng.choice(FLOATS) for _ in range(n)], np.float64)
    else:
        vals = np.array([rng.choice([-5, -1, 0, 1, 2, 3, 7, 127]) for _ in range(n)])
    with np.errstate(all="ignore"):
        return numpy_helper.from_array(vals.astype(np_dt).reshape(shape), name)


def _model(rng: random.Random, op: str):
    from onnx import AttributeProto, TensorProto, helper

    n_in, n_out = rng.randint(1, 4), rng.randint(1, 2)
    inputs = ["x"] + [f"i{j}" for j in range(1, n_in)]
    attrs = {a: _attr(rng, a) for a in rng.sample(ATTRS, rng.randint(0, 3))}
    x_shape = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(0, 4))]
    x_type = rng.choice([TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL])
    node = helper.make_node(op, inputs, [f"y{j}" for j in range(n_out)])
    node.attribute.extend(helper.make_attribute(k, v, attr_type=AttributeProto.INTS)
                          if v == [] else helper.make_attribute(k, v)
                          for k, v in attrs.items())
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, x_shape)],
                          [helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, [1])
                           for j in range(n_out)],
                          initializer=[_initializer(rng, f"i{j}") for j in range(1, n_in)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid(
        "", rng.choice([11, 13, 17, 18]))])


@pytest.mark.parametrize("seed", range(4))
def test_mapped_onnx_ops_with_hostile_attributes_import_or_are_refused(cli, in_tmp, seed):
    from graphkernel.frontends.onnx import HANDLERS

    rng = random.Random(seed)
    ops = sorted(HANDLERS)
    rng.shuffle(ops)
    for op in ops[:60]:
        (in_tmp / "m.onnx").write_bytes(_model(rng, op).SerializeToString())
        rc, _, err = cli("info", in_tmp / "m.onnx")
        assert rc in (0, 2), (op, rc, err)
        if rc == 2:
            assert len([ln for ln in err.splitlines() if ln.startswith("graphkernel: error:")]) \
                == 1, (op, err)


def test_a_node_its_handler_cannot_read_is_left_to_onnx(cli, in_tmp):
    """A OneHot whose depth is an empty tensor once escaped as an IndexError: it imports as
    ONNX's own operator, and running it is one error line naming the node."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("OneHot", ["i", "d", "v"], ["y"])], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        initializer=[helper.make_tensor("d", TensorProto.INT64, [0], []),
                     helper.make_tensor("v", TensorProto.FLOAT, [2], [0, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (in_tmp / "m.onnx").write_bytes(m.SerializeToString())
    rc, out, _ = cli("info", in_tmp / "m.onnx")
    assert rc == 0 and "OneHot x1" in out
    assert "node 'onehot_0' (Opaque) failed" in cli.error("run", in_tmp / "m.onnx")
