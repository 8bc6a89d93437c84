"""Indices moved by data movement (BigBird's random-block plan: per-row index inputs
concatenated, widened to int64, broadcast over the batch, sliced and broadcast again for
each gather and scatter that reads them) are one Gather per index value handed out, in
the inputs' own integer type: each broadcast, slice and widening Cast of integers is a
launch of its own (no vector kernel computes integers but bitwise ops), and the gathers
and scatters read index values, not their type."""

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.errors import ExecutionError
from graphkernel.interpreter import run_graph
from tests.passes.conftest import apply_pass, ops_of


def _slice(g, x, begin, end, axes):
    return g.add_node("StridedSlice", [x], {"begin": begin, "end": end,
                                            "strides": [1] * len(axes), "axes": axes}).output


def block_plan(rows: int = 3, windows: int = 4, rand: int = 1, batch: int = 2,
               heads: int = 3, blocks: int = 6, block: int = 2, d: int = 4,
               wide: str = "int64") -> Graph:
    """Random blocks of keys gathered by a plan given per head as inputs (int32 [windows,
    rand] each), as BigBird's ``torch_gather_b2`` and ``_create_rand_mask_from_inputs``
    read it: concatenated, widened, broadcast over the batch, then broadcast over each
    block's rows and columns for a GatherElements, and its first and last window sliced
    and broadcast for two ScatterElements."""
    g = Graph("block_plan")
    parts = [g.add_input(f"plan{h}", TensorType((windows, rand), "int32"))
             for h in range(heads)]
    keys = g.add_input("keys", TensorType((batch, heads, blocks, block, d), "float32"))
    probs = g.add_input("probs", TensorType((batch, heads, 2, blocks, block), "float32"))
    upd = g.add_input("upd", TensorType((batch, heads, 2, rand, block), "float32"))
    cat = g.add_node("Concat", parts, {"axis": 0}).output
    plan = g.add_node("Reshape", [cat], {"shape": [heads, windows, rand]}).output
    plan = g.add_node("Cast", [plan], {"dtype": wide}).output
    plan = g.add_node("ExpandDims", [plan], {"axis": [0]}).output
    plan = g.add_node("BroadcastTo", [plan], {"shape": [batch, heads, windows, rand]}).output
    flat = g.add_node("Reshape", [plan], {"shape": [batch, heads, windows * rand, 1, 1]}).output
    idx = g.add_node("BroadcastTo", [flat], {"shape": [batch, heads, windows * rand, block,
                                                       d]}).output
    got = g.add_node("GatherElements", [keys, idx], {"axis": 2}).output
    outs = [g.add_node("Exp", [got]).output]
    for w in (0, windows - 1):
        one = _slice(g, plan, [w], [w + 1], [2])  # [batch, heads, 1, rand]
        one = g.add_node("ExpandDims", [one], {"axis": [4]}).output
        one = g.add_node("BroadcastTo", [one], {"shape": [batch, heads, 2, rand, block]}
                         ).output
        one = g.add_node("Transpose", [one], {"perm": [0, 1, 2, 4, 3]}).output
        one = g.add_node("Transpose", [one], {"perm": [0, 1, 2, 4, 3]}).output
        outs.append(g.add_node("ScatterElements", [probs, one, upd],
                               {"axis": 3, "reduction": "none"}).output)
    g.set_outputs(outs)
    return g


def feeds(g: Graph, seed: int = 0, high: int | None = None) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for v in g.inputs:
        if v.dtype.is_int:
            out[v.name] = rng.integers(0, high or 6, v.type.shape).astype(v.dtype.np)
        else:
            out[v.name] = rng.standard_normal(v.type.shape).astype(v.dtype.np)
    return out


def test_an_index_plan_widened_and_broadcast_is_one_gather_per_index_value():
    g = block_plan()
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    ops = ops_of(h)
    # one Concat of the plan's inputs, one Gather per index value read: the GatherElements'
    # and each ScatterElements'; no broadcast, slice, transpose or Cast of integers is left
    assert ops.count("Gather") == 3 and ops.count("Concat") == 1, ops
    assert not {"BroadcastTo", "StridedSlice", "Transpose", "Cast"} & set(ops), ops
    for n in h.nodes:
        if n.op in ("GatherElements", "ScatterElements"):
            assert n.inputs[1].dtype == graphkernel.DType.int32  # gathered as given
    for seed in range(3):
        f = feeds(g, seed)
        for a, b in zip(run_graph(g, f), run_graph(h, f), strict=True):
            np.testing.assert_array_equal(a, b)


def test_negative_and_out_of_range_indices_behave_as_before():
    """Moved, not computed: a negative index still counts from the end, and one past the
    blocks still raises in the gather that reads it (torch raises there too)."""
    g = block_plan()
    h, _ = apply_pass("movement_gather", g)
    f = feeds(g)
    f["plan1"][0, 0] = -1
    for a, b in zip(run_graph(g, f), run_graph(h, f), strict=True):
        np.testing.assert_array_equal(a, b)
    f["plan2"][1, 0] = 6
    for graph in (g, h):
        try:
            run_graph(graph, f)
        except ExecutionError as e:
            assert "out of bounds" in str(e)
            continue
        raise AssertionError(f"{graph.name}: an index past the blocks did not raise")


def test_a_widened_index_read_as_data_is_kept_with_the_reason():
    """An index value read as data (here a graph output, int64 as the model wrote it) must
    keep its type: the region is left as it is and the log says why."""
    g = block_plan()
    (bcast,) = [n for n in g.nodes if n.op == "BroadcastTo" and n.outputs[0].type.shape ==
                (2, 3, 4, 1)]
    g.set_outputs(list(g.outputs) + [bcast.outputs[0]])
    from graphkernel.api import load_config
    from graphkernel.codegen import targets
    from graphkernel.pipeline import BisectCounter, PassContext
    from graphkernel.registry import PASSES

    cfg = load_config("", env={})
    ctx = PassContext(cfg, BisectCounter(cfg.bisect_limit), lambda m: None,
                      targets.load(cfg.target))
    ctx.current_pass = "movement_gather"
    res = PASSES["movement_gather"].fn(g.copy(), ctx)
    assert res.rewrites == 0
    assert any("read as other than indices" in m for m in ctx.notes), ctx.notes


def test_a_narrowing_cast_is_not_movement():
    """Indices cast to a narrower type (int64 to int32, int32 to int8) or to floats may
    change values: such a Cast is work and ends the region; a widening one moves."""
    import graphkernel.passes.movement_gather as mg

    for src, dst, moves in (("int32", "int64", True), ("uint8", "int32", True),
                            ("int64", "int32", False), ("int32", "int8", False),
                            ("int32", "float32", False), ("float32", "int32", False)):
        g = Graph("cast")
        x = g.add_input("x", TensorType((4, 2), src))
        c = g.add_node("Cast", [x], {"dtype": dst})
        g.set_outputs([c.output])
        assert mg._moves(c) is moves, (src, dst)


def test_launches_through_the_pipeline():
    """At opt_level 2 the plan's broadcasts, slices and Cast (lone integer launches: 8,
    the Concat of the plan's inputs among them) are 4: the Concat and one Gather per index
    value; the same results."""
    g = block_plan()
    before = graphkernel.compile(g, "--opt_level=2 --disable_pass=movement_gather", env={})
    after = graphkernel.compile(g, "--opt_level=2", env={})
    from graphkernel.codegen.traffic import launches

    ints = [[e["op"] for e in launches(r.graph) if e["op"] not in (
        "GatherElements", "ScatterElements", "Exp", "GraphKernel")] for r in (before, after)]
    assert sorted(ints[0]) == sorted(["Concat", "Cast", *["BroadcastTo"] * 4,
                                      *["StridedSlice"] * 2]), ints[0]
    assert sorted(ints[1]) == ["Concat", "Gather", "Gather", "Gather"], ints[1]
    f = feeds(g, 1)
    for a, b in zip(run_graph(g, f), run_graph(after.graph, f), strict=True):
        np.testing.assert_array_equal(a, b)


def scattered(reduction: str = "none") -> Graph:
    """``slice_scatter`` as the torch frontend records it: rows of a slice placed into a
    zeroed buffer by a ScatterElements at constant positions, then concatenated with
    another slice: every element moved or a constant."""
    g = Graph("scattered")
    x = g.add_input("x", TensorType((2, 6, 4), "float32"))
    part = _slice(g, x, [1], [4], [1])  # [2, 3, 4]
    pos = np.broadcast_to(np.array([2, 4, 5]).reshape(1, 3, 1), (2, 3, 4)).astype(np.int64)
    buf = g.add_node("ScatterElements", [g.const(np.zeros((2, 8, 4), np.float32)),
                                         g.const(pos), part],
                     {"axis": 1, "reduction": reduction}).output
    cat = g.add_node("Concat", [buf, _slice(g, x, [0], [2], [1])], {"axis": 1}).output
    g.set_outputs([g.add_node("Exp", [cat]).output])
    return g


def test_a_scatter_at_constant_positions_is_movement():
    g = scattered()
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    h.remove_dead()
    ops = ops_of(h)
    assert "ScatterElements" not in ops and "StridedSlice" not in ops, ops
    assert ops.count("Gather") == 1 and ops.count("Select") == 1, ops  # zeros: a constant
    for seed in range(3):
        f = feeds(g, seed)
        for a, b in zip(run_graph(g, f), run_graph(h, f), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_scatter_that_adds_is_work():
    _, res = apply_pass("movement_gather", scattered("add"))
    assert res.rewrites == 0


def positions(as_index: bool) -> Graph:
    g = Graph("positions")
    p = g.add_input("p", TensorType((1, 8), "int64"))
    b = g.add_node("BroadcastTo", [p], {"shape": [3, 8]}).output
    lo, hi = _slice(g, b, [0], [4], [1]), _slice(g, b, [4], [8], [1])
    if not as_index:
        f = g.add_node("Cast", [g.add_node("Add", [lo, hi]).output], {"dtype": "float32"})
        g.set_outputs([g.add_node("Exp", [f.output]).output])
        return g
    t = g.add_input("t", TensorType((3, 4, 5), "float32"))
    idx = [g.add_node("BroadcastTo", [g.add_node("ExpandDims", [s], {"axis": [2]}).output],
                      {"shape": [3, 4, 5]}).output for s in (lo, hi)]
    g.set_outputs([g.add_node("GatherElements", [t, i], {"axis": 1}).output for i in idx])
    return g


def test_integers_read_as_data_count_as_the_patterns_leave_them():
    """Position ids broadcast and sliced, then read as data (a Cast to floats in a
    kernel): the integer ops may join that kernel, so only the slices count (2: below what
    a rewrite must save) and nothing is rewritten; read as indices, they are."""
    _, res = apply_pass("movement_gather", positions(as_index=False))
    assert res.rewrites == 0, res.notes
    g = positions(as_index=True)
    h, res = apply_pass("movement_gather", g)
    assert res.rewrites == 1, res.notes
    f = feeds(g, 0, high=4)
    for a, b in zip(run_graph(g, f), run_graph(h, f), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_rewritten_plan_runs_in_the_simulator():
    """The compiled graph (its kernels in the simulator, the gathers and scatters through
    their references) gives the interpreter's values on the original graph."""
    from graphkernel.codegen.backend import run_sim

    g = block_plan()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    f = feeds(g, 2)
    got, _ = run_sim(res, f)
    for a, b in zip(run_graph(g, f), got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=0)
