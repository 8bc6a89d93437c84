"""Bounded integer arithmetic (position ids from a mask) runs in float32, exactly; unbounded
integers stay integers."""

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import run_graph
from graphkernel.torch import launch_counts
from tests.passes.conftest import apply_pass, ops_of

PAD = 1


def position_ids(seq: int | str = 16) -> Graph:
    """RoBERTa's ``cumsum(ne(ids, pad).int(), 1).type_as(mask) * mask + pad`` (int64 as
    torch traces it), the ids indexing a table of position embeddings."""
    g = Graph()
    ids = g.add_input("ids", TensorType((2, seq), "int64"))
    table = g.const(np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32))
    mask = g.add_node("NotEqual", [ids, g.const(np.int64(PAD))]).output
    m32 = g.add_node("Cast", [mask], {"dtype": "int32"}).output
    m64 = g.add_node("Cast", [m32], {"dtype": "int64"}).output
    run = g.add_node("CumSum", [m64], {"axis": 1}).output
    r32 = g.add_node("Cast", [run], {"dtype": "int32"}).output
    kept = g.add_node("Mul", [r32, m32]).output
    k64 = g.add_node("Cast", [kept], {"dtype": "int64"}).output
    pos = g.add_node("Add", [k64, g.const(np.int64(PAD))]).output
    g.set_outputs([g.add_node("Gather", [table, pos], {"axis": 0}).output])
    return g


def feeds(seq: int = 16) -> dict:
    ids = np.random.default_rng(1).integers(0, 30, (2, seq)).astype(np.int64)
    ids[:, -3:] = PAD  # padding at the end, and inside
    ids[0, 4] = PAD
    return {"ids": ids}


def test_position_ids_from_a_mask_run_in_float32_and_index_with_int32():
    g = position_ids()
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 2  # the region, and the mask's comparison of the ids (below)
    h.remove_dead()  # (the integer ops left for dce)
    assert not [n for n in h.nodes if n.op != "NotEqual" and any(
        v.dtype.value == "int64" for v in n.outputs) and n.op != "Constant"], ops_of(h)
    gather = h.outputs[0].producer
    assert gather.inputs[1].dtype.value == "int32" and gather.inputs[1].producer.op == "Cast"
    np.testing.assert_array_equal(run_graph(h, feeds())[0], run_graph(g, feeds())[0])


def test_through_the_pipeline_the_ids_are_one_kernel_between_the_mask_and_the_gather():
    """8 integer ops were 8 launches (no int64 in the vector unit); now one kernel (the
    mask, the ids converted to float32 on loading and compared with the pad id; select,
    scan, mul, add and the index's cast to int32, stored by it)."""
    g = position_ids()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert launch_counts(res.graph)["vector"] == 2, launch_counts(res.graph)  # + the Gather
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=small_ints", env={})
    assert launch_counts(off.graph)["vector"] == 9
    np.testing.assert_array_equal(run_graph(res.graph, feeds())[0], run_graph(g, feeds())[0])
    from graphkernel.codegen.backend import run_sim

    (got,), _ = run_sim(res, feeds())  # the ids converted and compared in the kernel
    np.testing.assert_array_equal(np.asarray(got), run_graph(g, feeds())[0])


def test_integers_without_bounds_stay_integers():
    """A graph input's ids plus one may be any int64; a CumSum along a symbolic axis may
    grow past 2**24: neither is rewritten."""
    g = Graph()
    ids = g.add_input("ids", TensorType((2, 16), "int64"))
    shifted = g.add_node("Add", [ids, g.const(np.int64(1))]).output
    g.set_outputs([g.add_node("Mul", [shifted, shifted]).output])
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 0 and ops_of(h) == ["Add", "Mul"]
    h, res = apply_pass("small_ints", position_ids("s"))
    assert res.rewrites == 1 and "comparison" in res.summary  # (the mask's: exact, below)
    assert [n.outputs[0].dtype.value for n in h.nodes if n.op == "CumSum"] == ["int64"]


def test_a_sum_that_may_pass_2_to_the_24_stays_an_integer():
    """A cumsum of 0/1 values over 2**25 positions bounds nothing float32 holds exactly."""
    g = Graph()
    b = g.add_input("b", TensorType((1, 2 ** 25), "bool"))
    i64 = g.add_node("Cast", [b], {"dtype": "int64"}).output
    g.set_outputs([g.add_node("CumSum", [i64], {"axis": 1}).output])
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 0 and ops_of(h) == ["Cast", "CumSum"]


def test_an_int8_sum_that_wraps_stays_an_integer():
    """int8 arithmetic past 127 wraps around; float32 would not: not rewritten."""
    g = Graph()
    b = g.add_input("b", TensorType((2, 200), "bool"))
    i8 = g.add_node("Cast", [b], {"dtype": "int8"}).output
    i64 = g.add_node("Cast", [g.add_node("CumSum", [i8], {"axis": 1}).output],
                     {"dtype": "int64"}).output
    g.set_outputs([g.add_node("Add", [i64, g.const(np.int64(1))]).output])
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 0


def _wrapped_argmax(n: int | str = 16, also_out: bool = False) -> Graph:
    """``i = argmax(mask, 1); i = i < 0 ? i + n : i; i + row offsets`` indexing rows."""
    g = Graph()
    mask = g.add_input("mask", TensorType((4, n), "float32"))
    table = g.const(np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32))
    i = g.add_node("ArgMax", [mask], {"axis": 1}).output
    wrap = g.add_node("Select", [g.add_node("Less", [i, g.const(np.int64(0))]).output,
                                 g.add_node("Add", [i, g.const(np.int64(16))]).output,
                                 i]).output
    at = g.add_node("Add", [wrap, g.const(np.arange(0, 64, 16, dtype=np.int64))]).output
    g.set_outputs([g.add_node("Gather", [table, at], {"axis": 0}).output,
                   *([i] if also_out else [])])
    return g


def test_an_argmax_index_wrapped_and_offset_runs_in_float32():
    g = _wrapped_argmax()
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 1
    h.remove_dead()
    assert ops_of(h) == ["ArgMax", "Cast", "Less", "Add", "Select", "Add", "Cast", "Gather"]
    (argmax,) = [n for n in h.nodes if n.op == "ArgMax"]
    assert argmax.outputs[0].dtype.value == "int32"  # (read by the region alone)
    assert [n.outputs[0].dtype.value for n in h.nodes if n.op in ("Less", "Select")] == [
        "bool", "float32"]
    mask = (np.random.default_rng(2).uniform(size=(4, 16)) < 0.2).astype(np.float32)
    np.testing.assert_array_equal(run_graph(h, {"mask": mask})[0],
                                  run_graph(g, {"mask": mask})[0])


def test_an_argmax_read_elsewhere_keeps_its_type_and_a_symbolic_axis_is_unbounded():
    h, res = apply_pass("small_ints", _wrapped_argmax(also_out=True))
    assert res.rewrites == 1 and h.outputs[1].dtype.value == "int64"
    assert h.outputs[1].producer.op == "ArgMax"
    h, res = apply_pass("small_ints", _wrapped_argmax("s0"))
    # the index's sign test alone, exact in float32 for any int64; its arithmetic stays int64
    assert res.rewrites == 1 and "comparison" in res.summary
    assert [n.outputs[0].dtype.value for n in h.nodes if n.op == "Add"] == ["int64", "int64"]


def _scattered_counts(update: float) -> Graph:
    """``zeros.scatter(1, topk_ids, u).long().sum(0)``: counts when u is 1."""
    g = Graph()
    logits = g.add_input("logits", TensorType((16, 8), "float32"))
    _, ids = g.add_node("TopK", [logits], {"k": 2, "axis": 1}).outputs
    ups = g.add_node("BroadcastTo", [g.const(np.float32(update))], {"shape": [16, 2]}).output
    sc = g.add_node("ScatterElements", [g.const(np.zeros((16, 8), np.float32)), ids, ups],
                    {"axis": 1}).output
    wide = g.add_node("Cast", [sc], {"dtype": "int64"}).output
    g.set_outputs([g.add_node("ReduceSum", [wide], {"axis": [0], "keep_dims": False}).output])
    return g


def test_the_sum_of_an_integral_float_cast_to_int64_runs_in_float32():
    """The scatter of ones into zeros holds 0 and 1 only: its ``.long()`` truncates nothing
    and the sum over 16 rows stays within 16: summed in float32, cast to int64 once."""
    g = _scattered_counts(1.0)
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 1
    h.remove_dead()
    (s,) = [n for n in h.nodes if n.op == "ReduceSum"]
    assert s.outputs[0].dtype.value == "float32"
    f = {"logits": np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)}
    np.testing.assert_array_equal(run_graph(h, f)[0], run_graph(g, f)[0])


def test_a_float_with_fractions_cast_to_int64_stays_integer():
    """Updates of 0.5: the ``.long()`` truncates, so the sum is left in int64."""
    _, res = apply_pass("small_ints", _scattered_counts(0.5))
    assert res.rewrites == 0


def _expert_hits(top: int = 5, op: str = "Equal") -> Graph:
    """DBRX's expert mask after a graph break: ``one_hot(ids, E).permute(2, 1, 0)`` of int64
    ids that are a graph input (their range unknown), as int64, and ``mask.sum((-1, -2)) >
    0``; ``top``: the largest constant compared with (``arange(top)``)."""
    g = Graph()
    ids = g.add_input("ids", TensorType((32, 2), "int64"))
    col = g.add_node("ExpandDims", [ids], {"axis": [-1]}).output
    hit = g.add_node(op, [col, g.const(np.arange(top - 5, top, dtype=np.int64))]).output
    mask = g.add_node("Cast", [hit], {"dtype": "int64"}).output
    moved = g.add_node("Transpose", [mask], {"perm": [2, 1, 0]}).output
    total = g.add_node("ReduceSum", [moved], {"axis": [-1, -2], "keep_dims": False}).output
    g.set_outputs([g.add_node("Greater", [total, g.const(np.int64(0))]).output, moved])
    return g


def _wild_ids() -> dict:
    """Ids of every kind an int64 holds: the experts, and values float32 cannot hold (2**24
    + 1 rounds to 2**24, 2**40, negative ones)."""
    ids = np.random.default_rng(4).integers(0, 5, (32, 2)).astype(np.int64)
    ids[:6, 0] = [2 ** 24 + 1, 2 ** 40, -(2 ** 24) - 1, -3, 2 ** 62, 2 ** 24 - 1]
    return {"ids": ids}


def test_int64_ids_compared_with_small_constants_are_compared_in_float32():
    """The ids' range is unknown (a graph input), so no region takes them; compared with
    constants below 2**24 in magnitude, the comparison is exact in float32 for every int64
    (values at or above 2**24 convert to floats at or above it), so it reads the ids
    converted: the vector unit's int64 -> float32 Cast."""
    g = _expert_hits()
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 2 and "1 comparison" in res.summary, res.summary
    h.remove_dead()
    (eq,) = [n for n in h.nodes if n.op == "Equal"]
    assert [x.dtype.value for x in eq.inputs] == ["float32", "float32"]
    assert eq.inputs[0].producer.op == "Cast"
    for want, got in zip(run_graph(g, _wild_ids()), run_graph(h, _wild_ids()), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_comparison_with_a_constant_of_2_to_the_24_stays_in_int64():
    """2**24 + 1 converts to 2**24: compared with a constant of 2**24 it would be equal."""
    for op in ("Equal", "Less"):
        h, res = apply_pass("small_ints", _expert_hits(top=2 ** 24 + 1, op=op))
        assert "comparison" not in res.summary
        assert [x.dtype.value for n in h.nodes if n.op == op for x in n.inputs] == [
            "int64", "int64"]


def test_the_expert_mask_is_one_kernel_fewer_and_exact_in_the_simulator():
    """The Equal of the int64 ids ran alone (no int64 in the vector unit): now the kernel
    that selects and transposes the mask converts and compares them itself; the outputs,
    simulated, equal the interpreter's on ids float32 cannot hold."""
    from graphkernel.codegen.backend import run_sim

    g = _expert_hits()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=small_ints", env={})
    assert sum(launch_counts(res.graph).values()) == 4, launch_counts(res.graph)
    assert sum(launch_counts(off.graph).values()) > 4, launch_counts(off.graph)
    got, _ = run_sim(res, _wild_ids())
    for want, x in zip(run_graph(g, _wild_ids()), got, strict=True):
        np.testing.assert_array_equal(np.asarray(x), want)


def relative_positions(n: int | str = "n", square: bool = True) -> Graph:
    """T5's relative positions and the bidirectional half of its buckets, as torch traces them
    under ``dynamic=True``: ``arange(L)[None, :] - arange(L)[:, None]``, ``(rel > 0) * 16``,
    ``abs(rel)``, ``abs < 8`` and ``abs`` in float32 (the log-spaced buckets' input); with
    ``square`` False the positions are only shifted (``arange(L) + 3``, an [L] value)."""
    g = Graph()
    x = g.add_input("x", TensorType((n,), "float32"))  # (binds the symbol)
    pos = g.add_node("Range", [], {"length": n, "dtype": "int64"}).output
    if not square:
        y = g.add_node("Add", [pos, g.const(np.int64(3))]).output
        g.set_outputs([g.add_node("Add", [x, g.add_node("Cast", [y], {"dtype": "float32"})
                                          .output]).output])
        return g
    col = g.add_node("ExpandDims", [pos], {"axis": [1]}).output
    row = g.add_node("ExpandDims", [pos], {"axis": [0]}).output
    rel = g.add_node("Sub", [row, col]).output
    up = g.add_node("Cast", [g.add_node("Greater", [rel, g.const(np.int64(0))]).output],
                    {"dtype": "int64"}).output
    half = g.add_node("Mul", [up, g.const(np.int64(16))]).output
    dist = g.add_node("Abs", [rel]).output
    small = g.add_node("Less", [dist, g.const(np.int64(8))]).output
    far = g.add_node("Cast", [dist], {"dtype": "float32"}).output
    g.set_outputs([half, small, g.add_node("Add", [far, x]).output])
    return g


def test_a_range_over_a_symbolic_length_squared_in_a_value_runs_in_float32():
    """[L, L] values bound L by 2**20 (2**40 elements at most): the positions, their outer
    difference, its sign and its absolute value are float32 (the Range made in float32, the
    float32 cast of |rel| the region's own value); the results are those of int64."""
    from graphkernel.passes.small_ints import symbol_bounds

    g = relative_positions()
    assert symbol_bounds(g) == {"n": 2 ** 20}
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    (r,) = [n for n in h.nodes if n.op == "Range"]
    assert r.outputs[0].dtype.value == "float32"
    assert not any(n.op in ("Sub", "Abs") and n.outputs[0].dtype.value == "int64"
                   for n in h.nodes), ops_of(h)
    assert h.outputs[2].producer.inputs[0].producer.op == "Abs"  # (no cast back and forth)
    for n in (5, 33):
        f = {"x": np.random.default_rng(n).standard_normal(n).astype(np.float32)}
        for a, b in zip(run_graph(h, f), run_graph(g, f),
                        strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_a_symbolic_length_no_square_value_bounds_stays_int64():
    """An [L] value bounds L by 2**40 only: arange(L) + 3 may pass 2**24 and stays int64."""
    from graphkernel.passes.small_ints import symbol_bounds

    g = relative_positions(square=False)
    assert symbol_bounds(g) == {}
    h, res = apply_pass("small_ints", g)
    assert res.rewrites == 0
    assert [n for n in h.nodes if n.op == "Range"][0].outputs[0].dtype.value == "int64"


def test_a_broadcast_square_bounds_nothing():
    """A BroadcastTo to [L, L] is torch's ``expand``: a view of an [L] value, no L * L
    elements in memory, so no bound."""
    from graphkernel.passes.small_ints import symbol_bounds

    g = Graph()
    x = g.add_input("x", TensorType(("n",), "float32"))
    e = g.add_node("ExpandDims", [x], {"axis": [0]}).output
    g.set_outputs([g.add_node("BroadcastTo", [e], {"shape": ["n", "n"]}).output])
    assert symbol_bounds(g) == {}
    g2 = Graph()
    x = g2.add_input("x", TensorType(("n", "m"), "float32"))
    g2.set_outputs([g2.add_node("Neg", [x]).output])
    assert symbol_bounds(g2) == {}  # (two symbols: m may be 0)
