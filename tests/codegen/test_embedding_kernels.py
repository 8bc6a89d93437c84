"""The kernels a transformer's embeddings make, generated and run in the simulator.

A float value cast to int32 as a kernel output: the store truncates it toward zero (torch's
float -> int), so indices computed in floats (position ids from a running count of tokens)
leave the kernel that computes them instead of a Cast kernel of their own. Token embeddings
plus a position table shared by the batch, then LayerNorm: the table repeats whole rows of
what the norm reduces, so the sum and the norm are one kernel. The token embeddings
themselves (a Gather of whole rows of the weight by the token ids) are loaded by that kernel:
the scalar unit reads each row's index, clamps it into the table, and copies the row."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import backend as codegen_backend
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.interpreter import Interpreter
from graphkernel.refusals import classify

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def _position_ids(shape=(2, 80)) -> Graph:
    """The running count of non-padding tokens times the mask, plus an offset, to int32 (as
    a roberta-like encoder numbers its positions)."""
    g = Graph("positions")
    x = g.add_input("x", TensorType(shape, "float32"))
    run = g.add_node("Scan", [x], {"axis": 1, "combine": "add"}).output
    pos = g.add_node("Mul", [run, x]).output
    off = g.add_node("Add", [pos, g.const(np.float32(-2.5), "float32")]).output
    ids = g.add_node("Cast", [off], {"dtype": "int32"}, name="ids").output
    g.set_outputs([ids])
    return g


def test_a_cast_to_int32_is_stored_by_the_kernel_that_computes_it():
    g = _position_ids()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    (kernel,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert "Cast" in [m.op for m in kernel.subgraph.nodes]
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    rng = np.random.default_rng(0)
    x = (rng.uniform(0, 1, (2, 80)) < 0.8).astype(np.float32) * rng.uniform(0.5, 1.5, (2, 80))
    x = x.astype(np.float32)
    feeds = {"x": x}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    want = Interpreter(g).run(feeds)
    assert got[0].dtype == np.int32
    assert (want[0] < 0).any() and (want[0] > 0).any()  # both sides of zero truncated
    np.testing.assert_array_equal(got[0], want[0])  # toward zero: -2.5 -> -2, 3.7 -> 3


def test_an_int32_cast_read_inside_the_kernel_is_not_a_store():
    """int32 words carry no arithmetic in UB: a Cast whose result the kernel goes on to use
    (here added to) is refused with the op named, not stored."""
    g = Graph("ints")
    x = g.add_input("x", TensorType((8, 64), "float32"))
    ids = g.add_node("Cast", [g.add_node("Exp", [x]).output], {"dtype": "int32"}).output
    g.set_outputs([g.add_node("Add", [ids, ids], name="int_add").output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    reasons = " ".join(f["reason"] for f in res.report.extra.get("fallbacks", []))
    assert "int32" in reasons, res.report.extra
    feeds = {"x": np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)}
    np.testing.assert_array_equal(Interpreter(res.graph).run(feeds)[0],
                                  Interpreter(g).run(feeds)[0])


def _embedding_layer_norm(table_shape=(1, 16, 64)) -> Graph:
    g = Graph("embeddings")
    x = g.add_input("x", TensorType((2, 16, 64), "float32"))
    t = g.add_input("t", TensorType(table_shape, "float32"))
    w = g.add_input("w", TensorType((64,), "float32"))
    s = g.add_node("Add", [x, t], name="sum").output
    g.set_outputs([g.add_node("LayerNorm", [s, w, w], {"epsilon": 1e-5},
                              name="norm").outputs[0]])
    return g


def test_a_position_table_and_the_layer_norm_after_it_are_one_kernel():
    g = _embedding_layer_norm()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    rng = np.random.default_rng(2)
    feeds = {k: rng.standard_normal(v).astype(np.float32)
             for k, v in (("x", (2, 16, 64)), ("t", (1, 16, 64)), ("w", (64,)))}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=2e-5, atol=2e-5)


def test_a_per_row_value_added_before_the_norm_stays_apart():
    """A value broadcast along the axis the norm reduces is added before the norm's own
    kernel (the norm's sum would read it once per element of the row)."""
    res = graphkernel.compile(_embedding_layer_norm((2, 16, 1)), "--opt_level=2", env={})
    (kernel,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert "sum" in [n.name for n in res.graph.nodes]  # outside the norm's kernel
    assert "sum" not in [m.name for m in kernel.subgraph.nodes]


def _pooled_token() -> Graph:
    """A text encoder's pooled token as CLIP picks it: the first position of the end token
    (ArgMax of a 0/1 mask, int64), wrapped when negative (``i < 0 ? i + n : i``), offset by
    its row's first token, indexing the flattened hidden states."""
    g = Graph("pooled")
    mask = g.add_input("mask", TensorType((4, 16), "float32"))
    hidden = g.add_input("hidden", TensorType((64, 8), "float32"))
    i = g.add_node("ArgMax", [mask], {"axis": 1}).output
    wrap = g.add_node("Select", [g.add_node("Less", [i, g.const(np.int64(0))]).output,
                                 g.add_node("Add", [i, g.const(np.int64(16))]).output,
                                 i]).output
    at = g.add_node("Add", [wrap, g.const(np.arange(0, 64, 16, dtype=np.int64))]).output
    g.set_outputs([g.add_node("Gather", [hidden, at], {"axis": 0}).output])
    return g


def test_an_argmax_index_is_loaded_widened_and_wrapped_in_one_kernel():
    """The ArgMax returns int32 (the only reader is the index arithmetic), one kernel loads
    it as floats, wraps and offsets it and stores the int32 index the Gather reads: three
    launches (ArgMax, the kernel, the Gather) where each int64 op was one (six)."""
    g = _pooled_token()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == [
        "ArgMax", "GraphKernel", "Gather"]
    (kernel,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert kernel.inputs[0].dtype.value == "int32" and kernel.outputs[0].dtype.value == "int32"
    rng = np.random.default_rng(3)
    mask = (rng.uniform(size=(4, 16)) < 0.2).astype(np.float32)
    feeds = {"mask": mask, "hidden": rng.standard_normal((64, 8)).astype(np.float32)}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    np.testing.assert_array_equal(got[0], Interpreter(g).run(feeds)[0])


def _lookup_norm(ids_dtype="int64", rows=50, norm="LayerNorm", axis=0) -> Graph:
    """Token embeddings as a transformer's first layer reads them: rows of a weight (a
    constant, as frozen for inference) picked by the ids, a position table added, the rows
    normalized."""
    g = Graph("lookup")
    ids = g.add_input("ids", TensorType((2, 16), ids_dtype))
    pos = g.add_input("pos", TensorType((16, 64), "float32"))
    w = g.add_input("w", TensorType((64,), "float32"))
    shape = (rows, 64) if axis == 0 else (64, rows)
    table = g.const(np.random.default_rng(5).standard_normal(shape).astype(np.float32))
    e = g.add_node("Gather", [table, ids], {"axis": axis}, name="lookup").output
    if axis == 1:  # [64, 2, 16]: the ids' positions to the front, the rows last
        e = g.add_node("Transpose", [e], {"perm": [1, 2, 0]}).output
    s = g.add_node("Add", [e, pos], name="sum").output
    args = [s, w, w] if norm == "LayerNorm" else [s, w]
    g.set_outputs([g.add_node(norm, args, {"epsilon": 1e-5}, name="norm").outputs[0]])
    return g


def _lookup_feeds(ids_dtype="int64", rows=50, seed=6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, rows, (2, 16)).astype(ids_dtype)
    ids[0, :3] = (-1, -rows, rows - 1)  # counted from the end, the first and the last row
    return {"ids": ids, "pos": rng.standard_normal((16, 64)).astype(np.float32),
            "w": rng.standard_normal(64).astype(np.float32)}


@pytest.mark.parametrize("ids_dtype,norm", [("int64", "LayerNorm"), ("int32", "RMSNorm")])
def test_an_embedding_lookup_is_loaded_by_the_kernel_that_normalizes_its_rows(ids_dtype, norm):
    g = _lookup_norm(ids_dtype, norm=norm)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    (kernel,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert {"lookup", "sum"} <= {m.name for m in kernel.subgraph.nodes}
    feeds = _lookup_feeds(ids_dtype)
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    (st,) = backend.stats.values()
    assert st.scalar >= 32  # the scalar unit reads each row's index
    item = np.dtype(ids_dtype).itemsize  # the 32 rows used of 50, each index once
    assert {32 * 64 * 4, 32 * item} <= set(st.input_reads), st.input_reads
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=2e-5, atol=2e-5)


def test_a_lookup_of_other_than_whole_rows_stays_apart():
    """A Gather along the table's last axis picks columns, not rows: it is no lookup the
    kernels load, and stays an op of its own (with the reason)."""
    res = graphkernel.compile(_lookup_norm(axis=1), "--opt_level=2", env={})
    assert "Gather" in [n.op for n in res.graph.nodes]
    whys = [w for w in res.analyses.cluster.reasons.values() if "Gather of other" in w]
    assert whys and {classify(w).code for w in whys} == {"GK116"}


def test_a_lookup_read_by_a_reduction_over_the_tokens_stays_apart():
    """A sum over the sequence (mean pooling of the embeddings) reduces across the table's
    rows, not along them: the lookup pattern refuses it with the reason."""
    g = Graph("pool")
    ids = g.add_input("ids", TensorType((2, 16), "int64"))
    table = g.const(np.random.default_rng(7).standard_normal((50, 64)).astype(np.float32))
    e = g.add_node("Gather", [table, ids], {"axis": 0}, name="lookup").output
    g.set_outputs([g.add_node("ReduceSum", [g.add_node("Exp", [e]).output],
                              {"axis": [1]}).output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert "Gather" in [n.op for n in res.graph.nodes]
    refused = [a.reason for a in res.analyses.fusion_attempts
               if a.pattern == "lookup" and a.verdict == "rejected"]
    assert any("reduces other than rows of 64" in r for r in refused), refused
    assert {classify(r).code for r in refused} == {"GK209"}
    feeds = {"ids": np.random.default_rng(8).integers(0, 50, (2, 16))}
    np.testing.assert_allclose(Interpreter(res.graph).run(feeds)[0],
                               Interpreter(g).run(feeds)[0], rtol=1e-5)


def test_an_index_outside_the_table_is_clamped_and_unclamped_the_simulator_catches_it():
    """torch raises on an index outside the table; the kernel never reads outside it: the
    index is clamped to the first or last row. The same kernel without the clamp reads past
    the table's end, which the simulator reports as an out-of-bounds GM access."""
    g = _lookup_norm()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    feeds = _lookup_feeds()
    feeds["ids"][1, :2] = (50, 10**6)  # past the end: read as the last row
    got, _ = run_sim(res, feeds)
    clamped = dict(feeds, ids=np.clip(feeds["ids"], -50, 49))
    np.testing.assert_allclose(got[0], Interpreter(g).run(clamped)[0], rtol=2e-5, atol=2e-5)

    def unclamped(name, files):
        out = {f: "\n".join(line for line in t.split("\n") if "clamped:" not in line)
               for f, t in files.items()}
        assert out != files  # the clamp was there to drop
        return out

    codegen_backend.CORRUPT.append(unclamped)
    try:
        with pytest.raises(SimulatorError, match="out of bounds"):
            run_sim(graphkernel.compile(g, "--opt_level=2", env={}), feeds)
    finally:
        codegen_backend.CORRUPT.remove(unclamped)


def test_token_and_position_rows_are_loaded_by_one_kernel():
    """Two lookups into one sum (token rows by id, position rows by a computed int32 id, as
    an encoder numbering its positions from the mask), then the norm: one kernel loading
    both tables' rows, each by its own index."""
    g = Graph("two_lookups")
    ids = g.add_input("ids", TensorType((2, 16), "int64"))
    pos = g.add_input("pos", TensorType((2, 16), "int32"))
    w = g.add_input("w", TensorType((64,), "float32"))
    rng = np.random.default_rng(9)
    tok = g.const(rng.standard_normal((50, 64)).astype(np.float32))
    ptab = g.const(rng.standard_normal((20, 64)).astype(np.float32))
    e = g.add_node("Add", [g.add_node("Gather", [tok, ids], {"axis": 0}).output,
                           g.add_node("Gather", [ptab, pos], {"axis": 0}).output]).output
    g.set_outputs([g.add_node("LayerNorm", [e, w, w], {"epsilon": 1e-5}).outputs[0]])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["GraphKernel"]
    feeds = {"ids": rng.integers(0, 50, (2, 16)), "pos": rng.integers(0, 20, (2, 16)).astype(
        np.int32), "w": rng.standard_normal(64).astype(np.float32)}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=2e-5, atol=2e-5)


def test_a_lookup_by_a_broadcast_index_stays_apart_and_nothing_falls_back():
    """Token-type ids as an exported BERT passes them, one row [1, S] broadcast over the
    batch: the kernel reads each row's index from GM, and a broadcast is no array there, so
    that lookup stays an op (the token lookup joins the norm's kernel; no codegen
    fallback)."""
    g = Graph("types")
    ids = g.add_input("ids", TensorType((2, 16), "int64"))
    types = g.add_input("types", TensorType((1, 16), "int64"))
    w = g.add_input("w", TensorType((64,), "float32"))
    rng = np.random.default_rng(10)
    tok = g.const(rng.standard_normal((50, 64)).astype(np.float32))
    ttab = g.const(rng.standard_normal((2, 64)).astype(np.float32))
    wide = g.add_node("BroadcastTo", [types], {"shape": [2, 16]}).output
    e = g.add_node("Add", [g.add_node("Gather", [tok, ids], {"axis": 0}).output,
                           g.add_node("Gather", [ttab, wide], {"axis": 0},
                                      name="type_lookup").output]).output
    g.set_outputs([g.add_node("LayerNorm", [e, w, w], {"epsilon": 1e-5}).outputs[0]])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert "type_lookup" in [n.name for n in res.graph.nodes]
    (kernel,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert "Gather" in [m.op for m in kernel.subgraph.nodes]
    feeds = {"ids": rng.integers(0, 50, (2, 16)), "types": rng.integers(0, 2, (1, 16)),
             "w": rng.standard_normal(64).astype(np.float32)}
    got, _ = run_sim(res, feeds)
    np.testing.assert_allclose(got[0], Interpreter(g).run(feeds)[0], rtol=2e-5, atol=2e-5)


def _rotary(positions="int64", steps=1, kv_heads=2, half=8) -> Graph:
    """A decoder's rotary embedding of Q and K from the positions it is given (a KV-cache
    step's): angles = positions x frequencies, concatenated with themselves, their cos and
    sin as tables [B, 1, S, D] read by the rotation of each head."""
    g = Graph("rotary")
    pos = g.add_input("pos", TensorType((2, steps), positions))
    inv = g.const((1.0 / 10000 ** (np.arange(half) / half)).astype(np.float32))
    p = g.add_node("ExpandDims", [pos], {"axis": [2]}).output
    f = g.add_node("Cast", [p], {"dtype": "float32"}).output
    m = g.add_node("Mul", [f, inv]).output
    c = g.add_node("Concat", [m, m], {"axis": 2}).output
    cos, sin = (g.add_node("ExpandDims", [g.add_node(op, [c]).output], {"axis": [1]}).output
                for op in ("Cos", "Sin"))
    outs = []
    for name, heads in (("q", 4), ("k", kv_heads)):
        x = g.add_input(name, TensorType((2, heads, steps, 2 * half), "float32"))
        lo = g.add_node("StridedSlice", [x], {"begin": [0], "end": [half], "strides": [1],
                                             "axes": [3]}).output
        hi = g.add_node("StridedSlice", [x], {"begin": [half], "end": [2 * half],
                                             "strides": [1], "axes": [3]}).output
        rot = g.add_node("Concat", [g.add_node("Neg", [hi]).output, lo], {"axis": 3}).output
        outs.append(g.add_node("Add", [g.add_node("Mul", [x, cos]).output,
                                       g.add_node("Mul", [rot, sin]).output]).output)
    g.set_outputs(outs)
    return g


@pytest.mark.parametrize("steps", [1, 8])
def test_rotary_tables_from_int64_positions_are_one_kernel(steps):
    """The kernel loads the int64 positions (a Cast on loading, rounding as the device's
    int64 -> float32 cast must) and computes both tables; each rotation reads them as
    tables (recomputed there, they would be values smaller than the rotation's loop space:
    no layout holds them). Three launches where there were six."""
    g = _rotary(steps=steps)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    kernels = [n for n in res.graph.nodes if n.op != "Constant" and n.op not in (
        "Reshape", "ExpandDims")]
    assert [n.op for n in kernels] == ["GraphKernel"] * 3, [n.op for n in kernels]
    tables = next(k for k in kernels if k.inputs[0].dtype.value == "int64")
    assert {"Cast", "Cos", "Sin"} <= {m.op for m in tables.subgraph.nodes}
    rng = np.random.default_rng(7)
    feeds = {"pos": np.array([[5, 2**24 + 1] * 4, [0, 63] * 4], np.int64)[:, :steps],
             "q": rng.standard_normal((2, 4, steps, 16)).astype(np.float32),
             "k": rng.standard_normal((2, 2, steps, 16)).astype(np.float32)}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    for a, b in zip(got, Interpreter(g).run(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6)


def test_int64_data_a_kernel_would_compute_on_stays_out():
    """A kernel loads int64 data only to convert it to float32: an int64 Cast to half, or
    int64 arithmetic, is no kernel's (GK114)."""
    g = Graph("ints")
    pos = g.add_input("pos", TensorType((2, 8), "int64"))
    h = g.add_node("Cast", [pos], {"dtype": "float16"}, name="to_half").output
    n = g.add_node("Add", [pos, g.const(np.int64(3))], name="shift").output
    f = g.add_node("Cast", [n], {"dtype": "float32"}, name="to_float").output
    g.set_outputs([g.add_node("Mul", [h, h]).output, g.add_node("Exp", [f]).output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    inside = {m.name for k in res.graph.nodes if k.op == "GraphKernel"
              for m in k.subgraph.nodes}
    assert "to_half" not in inside and "shift" not in inside
    assert "to_float" in inside  # (it loads the Add's int64 result)
    feeds = {"pos": np.arange(16, dtype=np.int64).reshape(2, 8) - 5}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    for a, b in zip(got, Interpreter(g).run(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_int64_values_a_reader_broadcasts_over_rows_are_converted_apart():
    """int64 values compared with every bin of a histogram (a row of them broadcast over the
    bins' rows): the kernel converts int64 only as tiles or one value per row, so the Cast
    stays a launch of its own and the comparisons stay one kernel, with no fallback."""
    g = Graph("bins")
    ids = g.add_input("ids", TensorType((1, 20), "int64"))
    f = g.add_node("Cast", [ids], {"dtype": "float32"}, name="to_float").output
    edges = g.const(np.arange(6, dtype=np.float32).reshape(6, 1))
    hit = g.add_node("Less", [f, edges]).output
    g.set_outputs([g.add_node("Select", [hit, g.const(np.float32(1.0)),
                                         g.const(np.float32(0.0))]).output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    inside = {m.name for k in res.graph.nodes if k.op == "GraphKernel"
              for m in k.subgraph.nodes}
    assert "to_float" not in inside and inside
    feeds = {"ids": np.arange(20, dtype=np.int64).reshape(1, 20) % 7}
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled, backend.unscheduled
    np.testing.assert_array_equal(got[0], Interpreter(g).run(feeds)[0])
