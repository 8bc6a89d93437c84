"""ONNX import: ONNX's own conformance cases, the real CNN topologies it ships, errors."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from graphkernel.errors import FrontendError  # noqa: E402
from graphkernel.frontends.onnx import ImportNote, import_onnx, import_onnx_file  # noqa: E402
from graphkernel.frontends.onnx_conformance import run_conformance  # noqa: E402
from graphkernel.interpreter import Interpreter, random_inputs  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
# ONNX builds its conformance cases once per process (collect_testcases: about 13 s of CPU,
# more than running them): the tests reading them run on one pytest-xdist worker
CONFORMANCE = pytest.mark.xdist_group("onnx_conformance")


@pytest.mark.slow
@CONFORMANCE
def test_node_conformance_at_least_95_percent():
    res = run_conformance()
    failed = [f"{c.name}: {c.reason}" for c in res.cases if c.status == "failed"]
    assert res.count("passed") >= 600, res.summary()
    assert res.pass_rate >= 0.95, "\n".join(failed)


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(LIGHT, "*.onnx"))),
                         ids=lambda p: os.path.basename(p))
def test_light_models_import_and_validate(path):
    notes: list[ImportNote] = []
    g = import_onnx_file(path, notes=notes)
    g.validate()
    assert len(g) > 20
    assert {n.op_type for n in notes} <= {"Softmax", "LRN"}  # everything else is mapped
    assert any(n.op == "Conv2D" for n in g.nodes)


def randomized(name: str, seed: int = 0):
    """The light model with seeded random weights (its own are all 0.02, which makes every
    logit equal) and without its final Softmax, at opset 15 where BatchNormalization's
    inference mode is explicit (onnx.reference's opset-9 BatchNormalization applies its
    default momentum and so uses batch statistics)."""
    m = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in m.graph.initializer}
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = numpy_helper.to_array(inits[n.input[0]])
            fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            arr = (rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32)
            if len(shape) == 1:
                arr = np.abs(arr) + 0.5
            m.graph.initializer.append(numpy_helper.from_array(arr, n.output[0]))
        elif n.op_type == "Softmax":
            m.graph.output[0].name = n.input[0]
        else:
            if n.op_type == "Dropout":
                n.ClearField("attribute")
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    m.opset_import[0].version = 15
    return m


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "squeezenet"])
def test_cnn_matches_onnx_reference(name):
    m = randomized(name)
    g = import_onnx(m)
    feeds = random_inputs(g, seed=1)
    ours = Interpreter(g).run(feeds)[0]
    ref = ReferenceEvaluator(m).run(None, feeds)[0]
    assert ours.shape == ref.shape and ref.std() > 0.1
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_unmapped_node_becomes_opaque_and_runs():
    node = helper.make_node("LRN", ["x"], ["y"], size=3, name="lrn1")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", 1, [1, 4, 3, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    notes: list[ImportNote] = []
    g = import_onnx(m, notes=notes)
    assert [n.op for n in g.nodes] == ["Opaque"] and notes[0].reason.startswith("no mapping")
    x = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(g).run({"x": x})[0],
                               ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=1e-6)


def test_a_matmul_of_a_transposed_operand_reads_it_transposed():
    """MatMul(Cast(Transpose(x, [0, 2, 1])), W) with a Cast to x's own type between (a state-
    space layer's output projection as torch's exporter writes it) is one BatchMatMul reading
    x transposed; a Transpose of other axes stays."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    for perm, folded in (([0, 2, 1], True), ([1, 0, 2], False)):
        nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
                 helper.make_node("Cast", ["t"], ["c"], to=onnx.TensorProto.FLOAT),
                 helper.make_node("MatMul", ["c", "w"], ["y"])]
        shape = [3, 6, 4] if folded else [4, 3, 6]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, shape)],
                                  [helper.make_tensor_value_info("y", 1, None)],
                                  [numpy_helper.from_array(w, "w")])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        g = import_onnx(m)
        live = [n for n in g.nodes if n.op != "Constant" and (n.outputs[0].users or
                                                               g.is_output(n.outputs[0]))]
        (mm,) = [n for n in g.nodes if n.op in ("MatMul", "BatchMatMul")]
        assert mm.attrs.get("transpose_a", False) is folded
        assert any(n.op == "Transpose" for n in live) is not folded
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(Interpreter(g).run({"x": x})[0],
                                   ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)


def test_symbolic_batch_dim_is_kept():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", 1, ["batch size", 8])],
                              [helper.make_tensor_value_info("y", 1, ["batch size", 8])])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert g.inputs[0].type.shape == ("batch_size", 8)
    out = Interpreter(g).run({"x": -np.ones((3, 8), np.float32)})[0]
    assert out.shape == (3, 8) and not out.any()


def test_unsupported_input_dtype_is_a_clear_error():
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.STRING, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [2])])
    with pytest.raises(FrontendError, match="input 'x': element type STRING is not supported"):
        import_onnx(helper.make_model(graph))


def test_unreadable_file(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"not a model")
    with pytest.raises(FrontendError, match="bad.onnx: not a readable ONNX model"):
        import_onnx_file(p)


# ------------------------------------------------------------------- attention
def _attention_model(q_shape, kv_shape, mask=None, **attrs):
    """One ONNX Attention node (opset 23) on float inputs q, k, v (and a mask input)."""
    ins = [helper.make_tensor_value_info("q", onnx.TensorProto.FLOAT, q_shape),
           helper.make_tensor_value_info("k", onnx.TensorProto.FLOAT, kv_shape),
           helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, kv_shape)]
    names = ["q", "k", "v"]
    if mask is not None:
        shape, elem = mask
        ins.append(helper.make_tensor_value_info("m", elem, shape))
        names.append("m")
    node = helper.make_node("Attention", names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node], "attention", ins, [out]),
                              opset_imports=[helper.make_opsetid("", 23)])
    return onnx.shape_inference.infer_shapes(model)


ATTENTION_CASES = {
    "4-D causal": (((2, 4, 8, 16), (2, 4, 8, 16)), None, {"is_causal": 1}),
    "4-D causal, fewer queries": (((2, 4, 5, 16), (2, 4, 8, 16)), None, {"is_causal": 1}),
    "3-D grouped-query, scale": (((2, 8, 64), (2, 8, 32)), None,
                                 {"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.2}),
    "bool mask with a masked row": (((2, 4, 8, 16), (2, 4, 8, 16)),
                                    ((2, 1, 8, 8), onnx.TensorProto.BOOL), {}),
    "additive mask": (((2, 4, 8, 16), (2, 4, 8, 16)), ((1, 4, 8, 8), onnx.TensorProto.FLOAT),
                      {}),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_onnx_attention_is_one_fused_attention_matching_the_reference(case):
    import graphkernel

    (q_shape, kv_shape), mask, attrs = ATTENTION_CASES[case]
    model = _attention_model(q_shape, kv_shape, mask, **attrs)
    g = import_onnx(model)
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal(q_shape).astype(np.float32),
             "k": rng.standard_normal(kv_shape).astype(np.float32),
             "v": rng.standard_normal(kv_shape).astype(np.float32)}
    if mask is not None and mask[1] == onnx.TensorProto.BOOL:
        feeds["m"] = rng.random(mask[0]) > 0.3
        feeds["m"][1, 0, 2] = False  # query 2 of batch 1 sees no key
    elif mask is not None:
        feeds["m"] = rng.standard_normal(mask[0]).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert [n.op for n in res.graph.nodes if n.op == "FusedAttention"] == ["FusedAttention"]
    assert "Opaque" not in {n.op for n in g.nodes}
    got = Interpreter(res.graph).run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_attention_with_a_kv_cache_runs_through_onnx_naming_why():
    model = _attention_model((1, 2, 4, 16), (1, 2, 4, 16))
    node = model.graph.node[0]
    node.input.extend(["", "pk", "pv"])
    model.graph.input.extend([helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT,
                                                            (1, 2, 3, 16)) for n in ("pk", "pv")])
    notes: list[ImportNote] = []
    g = import_onnx(onnx.shape_inference.infer_shapes(model), notes=notes)
    assert [n.op for n in g.nodes] == ["Opaque"]
    assert "past_key/past_value" in notes[0].reason


@pytest.mark.parametrize("extra, why", [
    ({"left_window_size": 2}, "left_window_size"),                 # opset 25: a local window
    ({"right_window_size": 1}, "right_window_size"),
    ("nonpad", "nonpad_kv_seqlen"),                                # opset 24: per-batch lengths
])
def test_onnx_attention_of_a_later_opset_is_not_taken_as_opset_23(extra, why):
    """An Attention input or attribute a later opset added changes the result (keys outside
    a window, keys past each batch's length masked out): taken as opset 23's, the node gave
    other numbers (ONNX's conformance cases: 13 wrong); it runs through ONNX, saying why."""
    model = _attention_model((1, 2, 4, 16), (1, 2, 4, 16))
    node = model.graph.node[0]
    if extra == "nonpad":
        node.input.extend(["", "", "", "n"])
        model.graph.input.append(helper.make_tensor_value_info("n", onnx.TensorProto.INT64,
                                                               (1,)))
    else:
        node.attribute.extend(helper.make_attribute(k, v) for k, v in extra.items())
    notes: list[ImportNote] = []
    g = import_onnx(onnx.shape_inference.infer_shapes(model), notes=notes)
    assert [n.op for n in g.nodes] == ["Opaque"]
    assert why in notes[0].reason


def test_torch_onnx_export_of_attention_is_one_fused_attention():
    """torch.onnx's export of scaled_dot_product_attention: Q and Kᵀ scaled by sqrt(scale),
    the mask as Where(mask, 0, -inf), Softmax and its masked-row guard Where(IsNaN(P), 0,
    P): the attention pass makes it one FusedAttention, that row's zeros included."""
    torch = pytest.importorskip("torch")
    import io

    import graphkernel

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, m):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=gen) for _ in range(3))
    m = torch.rand(2, 1, 8, 8, generator=gen) > 0.2
    m[0, 0, 3] = False
    buf = io.BytesIO()
    torch.onnx.export(Attend(), (q, k, v, m), buf, dynamo=False, opset_version=17)
    model = onnx.load_from_string(buf.getvalue())
    assert {"IsNaN", "Softmax", "Where"} <= {n.op_type for n in model.graph.node}
    g = import_onnx(model)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(n.op == "FusedAttention" for n in res.graph.nodes) == 1
    feeds = {vi.name: t.numpy() for vi, t in zip(model.graph.input, (q, k, v, m), strict=True)}
    got = Interpreter(res.graph).run(feeds)[0]
    want = Attend()(q, k, v, m).numpy()
    assert np.all(want[0, :, 3] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,opset,axes", [("constant", 13, None), ("reflect", 13, None),
                                             ("edge", 18, [2, 3]), ("constant", 18, [-1]),
                                             ("constant", 10, None)])
def test_pad_is_a_pad_op_matching_the_reference(mode, opset, axes):
    """ONNX Pad (pads and value as attributes before opset 11, inputs after; opset 18's
    axes): one Pad op, the reference's result; a zero pad of H and W before a convolution
    ends in the convolution's pads at opt_level 2."""
    import graphkernel

    x_info = helper.make_tensor_value_info("x", 1, [1, 2, 4, 5])
    inits = []
    k = len(axes) if axes else 4
    pads = [0, 0, 1, 2, 0, 0, 2, 1][-2 * k:] if axes is None or len(axes) == 2 else [1, 2]
    if opset < 11:
        pad = helper.make_node("Pad", ["x"], ["p"], mode=mode, pads=pads, value=0.0)
    else:
        inits.append(numpy_helper.from_array(np.array(pads, np.int64), "pads"))
        ins = ["x", "pads", ""]
        if axes:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            ins.append("axes")
        pad = helper.make_node("Pad", ins, ["p"], mode=mode)
    w = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, "w"))
    conv = helper.make_node("Conv", ["p", "w"], ["y"])
    graph = helper.make_graph([pad, conv], "g", [x_info],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    g = import_onnx(m)
    assert "Pad" in [n.op for n in g.nodes]
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(Interpreter(g).run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    np.testing.assert_allclose(Interpreter(res.graph).run({"x": x})[0], want, rtol=1e-5,
                               atol=1e-6)
    if mode == "constant":
        assert "Pad" not in [n.op for n in res.graph.nodes]


def _counting_inference(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = onnx.shape_inference.infer_shapes

    def counted(model, *a, **kw):
        calls.append(1)
        return real(model, *a, **kw)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    return calls


def test_shape_inference_runs_only_for_a_node_imported_as_opaque(monkeypatch):
    """Every node mapped to ops: the model is imported without ONNX shape inference (a copy
    of the whole model, seconds at scale). An unmapped node between mapped ones still gets
    its output's type from inference (the model declares no type for it)."""
    calls = _counting_inference(monkeypatch)
    x = helper.make_tensor_value_info("x", 1, [1, 4, 3, 3])
    y = helper.make_tensor_value_info("y", 1, [1, 4, 3, 3])
    mapped = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])],
        "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    g = import_onnx(mapped)
    assert [n.op for n in g.nodes] == ["ReLU", "Neg"] and calls == []

    unmapped = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("LRN", ["h"], ["l"], size=3),
         helper.make_node("Neg", ["l"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 13)])
    g = import_onnx(unmapped)
    assert [n.op for n in g.nodes] == ["ReLU", "Opaque", "Neg"] and calls == [1]
    assert g.nodes[1].outputs[0].type.shape == (1, 4, 3, 3)
    xv = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(g).run({"x": xv})[0],
                               ReferenceEvaluator(unmapped).run(None, {"x": xv})[0], rtol=1e-6)


@pytest.mark.parametrize("op", ["InstanceNormalization", "BatchNormalization"])
def test_normalisations_of_their_own_statistics_match_the_reference(op):
    """InstanceNormalization (a group norm's export), and BatchNormalization in training mode
    (a weight standardisation's export: the batch's own statistics, the running ones as
    further outputs): mapped to ops, not Opaque, and the reference's results."""
    rng = np.random.default_rng(3)
    c = 4
    x_info = helper.make_tensor_value_info("x", 1, [2, c, 3, 5])
    inits = [numpy_helper.from_array(rng.uniform(0.5, 2, c).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")]
    outs = ["y"]
    if op == "InstanceNormalization":
        node = helper.make_node(op, ["x", "s", "b"], outs, epsilon=1e-3)
    else:
        inits += [numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "m"),
                  numpy_helper.from_array(rng.uniform(0.5, 2, c).astype(np.float32), "v")]
        outs = ["y", "rm", "rv"]
        node = helper.make_node(op, ["x", "s", "b", "m", "v"], outs, epsilon=1e-3,
                                momentum=0.8, training_mode=1)
    graph = helper.make_graph([node], "g", [x_info],
                              [helper.make_tensor_value_info(o, 1, None) for o in outs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    g = import_onnx(m)
    assert "Opaque" not in [n.op for n in g.nodes]
    x = (rng.standard_normal((2, c, 3, 5)) * 3 + 1).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    got = Interpreter(g).run({"x": x})
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@CONFORMANCE
@pytest.mark.parametrize("case", ["test_causal_conv_with_state_silu_expanded",
                                  "test_causal_conv_with_state_with_bias_and_past_state_expanded",
                                  "test_maxpool_1d_default", "test_averagepool_1d_default"])
def test_one_d_convolutions_and_pools_are_modelled(case):
    """A 1-D Conv or pool (an audio front end, a state-space model's causal conv1d exported to
    ONNX) is the 2-D op on a height of 1, not an Opaque node."""
    res = run_conformance(case)
    (c,) = [c for c in res.cases if c.name == case]
    assert c.status == "passed", c.reason


def test_integer_lists_are_read_as_python_ints_whatever_their_form():
    """An attribute's list of ints is taken as it is; arrays (an initializer's int64, a float
    or bool tensor) become the Python ints a per-element ``int()`` gives."""
    from graphkernel.frontends.onnx import _ints

    given = [1, 0, 2]
    out = _ints(given)
    assert out == [1, 0, 2] and out is not given
    for a in (np.array([[3, -1]], dtype=np.int64), np.array([2.7, -2.7], np.float32),
              np.array([True, False]), (4, 5), np.uint64(2**63 + 1)):
        want = [int(v) for v in np.asarray(a).reshape(-1)]
        got = _ints(a)
        assert got == want and all(type(v) is int for v in got)
    assert _ints([1, 2.0]) == [1, 2] and type(_ints([1, 2.0])[1]) is int
    assert _ints(None) == []
