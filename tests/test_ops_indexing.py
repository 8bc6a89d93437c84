"""Range, GatherElements, ScatterElements and TopK: shape inference and numpy references
against torch's arange, gather, scatter/scatter_add and topk."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.errors import GraphKernelError
from graphkernel.interpreter import run_graph

torch = pytest.importorskip("torch")
rng = np.random.default_rng(0)


def run(op, inputs, attrs, n_out=1):
    g = Graph(op)
    ins = [g.add_input(f"i{k}", TensorType(a.shape, str(a.dtype))) for k, a in enumerate(inputs)]
    node = g.add_node(op, ins, attrs)
    g.set_outputs(list(node.outputs))
    g.validate()
    outs = run_graph(g, {f"i{k}": a for k, a in enumerate(inputs)})
    return outs if n_out > 1 else outs[0]


def test_range_static_and_symbolic_lengths():
    g = Graph("r")
    x = g.add_input("x", TensorType(("s", 3), "float32"))
    n = g.add_node("Range", [], {"start": 2, "delta": 3, "length": "s", "dtype": "int64"})
    assert n.output.type == TensorType(("s",), "int64")
    g.set_outputs([n.output, g.add_node("Identity", [x]).output])
    got = run_graph(g, {"x": np.zeros((5, 3), np.float32)})[0]
    np.testing.assert_array_equal(got, torch.arange(2, 17, 3).numpy())
    f = Graph("f")
    m = f.add_node("Range", [], {"start": 0.5, "delta": 0.25, "length": 6, "dtype": "float32"})
    f.set_outputs([m.output])
    np.testing.assert_allclose(run_graph(f, {})[0], torch.arange(0.5, 2.0, 0.25).numpy())


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_matches_torch_gather(axis):
    data = rng.standard_normal((4, 5, 3)).astype(np.float32)
    shape = [3, 4, 2]
    shape[axis] = 6  # indices may be longer along the axis and shorter elsewhere
    idx = rng.integers(-data.shape[axis], data.shape[axis], shape)
    want = torch.gather(torch.from_numpy(data), axis,
                        torch.from_numpy(idx % data.shape[axis])).numpy()
    np.testing.assert_array_equal(run("GatherElements", [data, idx], {"axis": axis}), want)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_matches_torch_scatter(reduction):
    data = rng.standard_normal((4, 6)).astype(np.float32)
    upd = rng.standard_normal((3, 6)).astype(np.float32)
    # distinct targets per column for "none" (torch leaves duplicates unspecified)
    idx = np.stack([rng.permutation(4)[:3] for _ in range(6)], axis=1) if reduction == "none" \
        else rng.integers(0, 4, (3, 6))
    t = torch.from_numpy(data)
    want = (t.scatter(0, torch.from_numpy(idx), torch.from_numpy(upd)) if reduction == "none"
            else t.scatter_add(0, torch.from_numpy(idx), torch.from_numpy(upd))).numpy()
    got = run("ScatterElements", [data, idx, upd], {"axis": 0, "reduction": reduction})
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(largest):
    x = rng.permutation(60).reshape(3, 20).astype(np.float32)  # distinct: one right answer
    vals, idx = run("TopK", [x], {"k": 4, "axis": 1, "largest": largest}, n_out=2)
    tv, ti = torch.topk(torch.from_numpy(x), 4, dim=1, largest=largest)
    np.testing.assert_array_equal(vals, tv.numpy())
    np.testing.assert_array_equal(idx, ti.numpy())


def test_bad_attributes_are_named():
    with pytest.raises(GraphKernelError, match="k=9 exceeds the axis size 4"):
        run("TopK", [np.zeros((2, 4), np.float32)], {"k": 9})
    with pytest.raises(GraphKernelError, match="indices rank 1 != data rank 2"):
        run("GatherElements", [np.zeros((2, 4), np.float32), np.zeros(3, np.int64)], {})
