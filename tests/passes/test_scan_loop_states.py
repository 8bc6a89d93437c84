"""scan_loop's loop: a recurrence unrolled step by step whose step carries several states
(RWKV's numerator, denominator and running maximum) becomes one Scan running the step body
(``combine="loop"``) from the first step that does the common work; steps that differ, and
steps that reduce across the carried row, are left unrolled with the reason logged."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.api import load_config
from graphkernel.codegen import targets
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.pipeline import BisectCounter, PassContext
from graphkernel.registry import PASSES
from tests.passes.conftest import apply_pass, assert_same_results, ops_of

B, L, H = 2, 8, 16


def _op(g: Graph, op: str, *xs, **attrs):
    return g.add_node(op, list(xs), attrs).output


def _at(g: Graph, x, t: int):
    s = _op(g, "StridedSlice", x, begin=[t], end=[t + 1], strides=[1], axes=[1])
    return _op(g, "Squeeze", s, axis=[1])


def _wkv(steps: int = L, three: bool = False, odd: int | None = None,
         reduce_row: bool = False) -> Graph:
    """The WKV recurrence as transformers' CPU loop runs it: a numerator, a denominator and a
    running maximum from (0, 0, -1e38), one output row per step, stacked. ``three``: the
    decay added to the key instead of to the maximum (three states carried, not four);
    ``odd``: that step adds where the others subtract; ``reduce_row``: the maximum is the
    row's largest value (a step that reduces across the carried row)."""
    g = Graph("wkv")
    k = g.add_input("k", TensorType((B, steps, H), "float32"))
    v = g.add_input("v", TensorType((B, steps, H), "float32"))
    u = g.add_input("u", TensorType((H,), "float32"))
    w = g.add_input("w", TensorType((H,), "float32"))
    num = g.const(np.zeros((B, H), np.float32))
    den = g.const(np.zeros((B, H), np.float32))
    mx = g.const(np.full((B, H), -1e38, np.float32))
    rows = []
    for t in range(steps):
        kt, vt = _at(g, k, t), _at(g, v, t)
        ku = _op(g, "Add", kt, u)
        mo = _op(g, "Maximum", mx, ku)
        e1 = _op(g, "Exp", _op(g, "Sub", mx, mo))
        e2 = _op(g, "Exp", _op(g, "Add" if t == odd else "Sub", ku, mo))
        out = _op(g, "Div", _op(g, "Add", _op(g, "Mul", e1, num), _op(g, "Mul", e2, vt)),
                  _op(g, "Add", _op(g, "Mul", e1, den), e2))
        rows.append(_op(g, "ExpandDims", out, axis=[1]))
        if three:
            mw, kw = mx, _op(g, "Sub", kt, _op(g, "Neg", w))
        else:
            mw, kw = _op(g, "Add", mx, w), kt
        ms = _op(g, "Maximum", mw, kw)
        if reduce_row:
            ms = _op(g, "Add", ms, _op(g, "ReduceMax", ms, axis=[-1], keep_dims=True))
        e1 = _op(g, "Exp", _op(g, "Sub", mw, ms))
        e2 = _op(g, "Exp", _op(g, "Sub", kw, ms))
        num = _op(g, "Add", _op(g, "Mul", e1, num), _op(g, "Mul", e2, vt))
        den = _op(g, "Add", _op(g, "Mul", e1, den), e2)
        mx = ms
    g.set_outputs([_op(g, "Concat", *rows, axis=1)])
    return g


def _gated(steps: int = L) -> Graph:
    """Two states of another body: h = a_t * h + x_t from 1 (from 0 it would be a linear
    Scan of its own) and its running maximum m = max(m, h); each step writes h - m."""
    g = Graph("gated")
    a = g.add_input("a", TensorType((B, steps, H), "float32"))
    x = g.add_input("x", TensorType((B, steps, H), "float32"))
    h = g.const(np.ones((B, H), np.float32))
    m = g.const(np.full((B, H), -np.inf, np.float32))
    rows = []
    for t in range(steps):
        h = _op(g, "Add", _op(g, "Mul", _at(g, a, t), h), _at(g, x, t))
        m = _op(g, "Maximum", m, h)
        rows.append(_op(g, "ExpandDims", _op(g, "Sub", h, m), axis=[1]))
    g.set_outputs([_op(g, "Concat", *rows, axis=1)])
    return g


def _loops(g: Graph) -> list:
    return [n for n in g.nodes if n.op == "Scan" and n.attrs["combine"] == "loop"]


def _scan_kernel(res) -> bool:
    from graphkernel.codegen.traffic import launches

    return any("Scan" in (e.get("op_list") or []) for e in launches(res.graph))


def _wkv_cache_constant() -> Graph:
    """The first step's running maximum read as a column of a constant cache (a model's
    state cache before anything is written: each state's column of one value), sliced and
    added to before the step reads it."""
    g = _wkv()
    cache = g.const(np.stack([np.zeros((B, H), np.float32),
                              np.full((B, H), -1e38, np.float32)], axis=2))
    col = _op(g, "Squeeze", _op(g, "StridedSlice", cache, begin=[1], end=[2], strides=[1],
                                axes=[2]), axis=[2])
    col = _op(g, "Add", col, g.const(np.float32(-1e37)))
    first_max = next(n for n in g.nodes if n.op == "Maximum")
    mx = first_max.inputs[0]
    for n, i in list(mx.uses):  # every read of the initial maximum
        g.replace_input(n, i, col)
    return g


def _run(g: Graph) -> tuple[Graph, list[str], list[str]]:
    """scan_loop once on a copy: the graph, its notes and what it logged."""
    g = g.copy()
    cfg = load_config("", env={})
    ctx = PassContext(cfg, BisectCounter(cfg.bisect_limit), lambda m: None,
                      targets.load(cfg.target))
    ctx.current_pass = "scan_loop"
    res = PASSES["scan_loop"].fn(g, ctx)
    g.validate()
    return g, res.notes, ctx.notes


@pytest.mark.parametrize("graph, states, ops", [
    (_wkv(), 4, 23),                # the maximum plus the decay carried as well
    (_wkv(three=True), 3, 23),      # the decay on the key: three states
    (_gated(), 2, 4),               # another body
])
def test_a_recurrence_carrying_several_states_becomes_one_loop(graph, states, ops):
    h, res = apply_pass("scan_loop", graph)
    (loop,) = _loops(h)
    assert len(loop.attrs["states"]) == states and len(loop.attrs["body"]) == ops
    # the first step reads the constant initial states: its own work is the loop's first
    # (no operand holds the states), the loop the whole sequence, no Concat left
    assert loop.attrs["first"] and len(loop.attrs["first_states"]) == states
    assert list(loop.outputs[0].shape) == [B, L, H] and loop.attrs["axis"] == 1
    assert "Concat" not in ops_of(h)
    # one step's work, not L: the unrolled steps after the first are gone
    assert ops_of(h).count("Exp") <= 4 and ops_of(h).count("Maximum") <= 2
    assert_same_results(graph, h)  # the same ops in the same order: equal to the bit


def test_the_loop_is_the_reference_step_by_step():
    """The Scan's reference against the loop written out in numpy."""
    g, _, _ = _run(_gated())
    assert len(_loops(g)) == 1
    feeds = random_inputs(g, 0)
    a, x = (feeds[k] for k in ("a", "x"))
    h, m, want = np.ones((B, H), np.float32), np.full((B, H), -np.inf, np.float32), []
    for t in range(L):
        h = a[:, t] * h + x[:, t]
        m = np.maximum(m, h)
        want.append(h - m)
    np.testing.assert_array_equal(run_graph(g, feeds)[0], np.stack(want, axis=1))


def test_steps_that_differ_keep_the_steps_before_them_unrolled():
    g, notes, _ = _run(_wkv(odd=3))
    (loop,) = _loops(g)
    # steps 4..7, from the states step 3 left (the first position of four operands)
    assert list(loop.outputs[0].shape) == [B, L - 4, H] and not loop.attrs["first"]
    (cat,) = [n for n in g.nodes if n.op == "Concat"]
    assert len(cat.inputs) == 5 and cat.inputs[4] is loop.outputs[0]
    assert "steps 4..7" in notes[-1]
    assert_same_results(_wkv(odd=3), g)


def test_a_last_step_that_differs_is_refused_with_the_reason():
    g, notes, log = _run(_wkv(odd=L - 1))
    assert not _loops(g) and not notes
    assert any("the last step does not do the work" in m for m in log), log


def test_a_step_that_reduces_across_the_carried_row_is_refused_with_the_reason():
    g, notes, log = _run(_wkv(reduce_row=True))
    assert not _loops(g) and ops_of(g).count("ReduceMax") == L
    assert any("ReduceMax" in m and "not elementwise" in m for m in log), log


def test_two_steps_are_left_alone():
    g, notes, _ = _run(_wkv(steps=2))
    assert not _loops(g)


def test_the_loop_kernel_is_one_launch_in_the_pipeline():
    from graphkernel.codegen.traffic import launches

    g = _wkv()
    on = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=scan_loop", env={})
    assert not on.report.extra["fallbacks"]
    kinds = [e["op"] for e in launches(on.graph)]
    # the first step, the loop's kernel, the rows stacked; unrolled: a launch every few steps
    assert len(kinds) <= 4 < len(launches(off.graph)), kinds


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.parametrize("graph", [_wkv, _gated, _wkv_cache_constant])
def test_the_loop_kernel_runs_in_the_simulator(graph):
    """The kernel running the step body down its rows (states in rows of UB, the barriers
    between the row ops) matches the numpy reference in the simulator."""
    from graphkernel.codegen.backend import run_sim

    g = graph()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert _scan_kernel(res) and not res.report.extra["fallbacks"]
    feeds = random_inputs(g, 0)
    sim, backend = run_sim(res, feeds)
    assert not backend.unscheduled
    np.testing.assert_allclose(sim[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.sim
@pytest.mark.slow
def test_a_loop_longer_than_a_tile_carries_its_states_across_tiles():
    """1000 steps of 16 columns: the rows are split into tiles, the states carried from one
    tile to the next in the kernel's rows."""
    from graphkernel.codegen.backend import run_sim

    g = _gated(steps=1000)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert _scan_kernel(res) and not res.report.extra["fallbacks"]
    feeds = random_inputs(g, 1)
    feeds["a"] = (feeds["a"] * 0.5).astype(np.float32)
    sim, _ = run_sim(res, feeds)
    np.testing.assert_allclose(sim[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-5)


def _wkv_loop(time_decay, time_first, key, value):
    """transformers' ``rwkv_linear_attention_cpu`` as users run it: a Python loop over the
    sequence writing one output row per step (``_wkv_steps`` from zero states, the running
    max at -1e38)."""
    import torch

    zero = torch.zeros_like(key[:, 0])
    return _wkv_steps(-torch.exp(time_decay), time_first, key, value,
                      [zero, zero, zero - 1e38])


def test_a_compiled_wkv_loop_is_a_few_launches():
    """Through torch.compile: Dynamo unrolls the loop, the row writes become a Concat, the
    steps after the first one loop kernel; unrolled, the steps split into a launch every
    two or three steps at the target's fusion caps."""
    import torch

    import graphkernel.torch as gt

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(32, generator=gen), torch.randn(32, generator=gen),
            torch.randn(2, 16, 32, generator=gen), torch.randn(2, 16, 32, generator=gen))
    counts = {}
    for flags in ("", "--disable_pass=scan_loop"):
        torch._dynamo.reset()
        gt.reset_stats()
        with torch.no_grad():
            got = torch.compile(_wkv_loop, backend="graphkernel",
                                options={"flags": flags})(*args)
            want = _wkv_loop(*args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        s = gt.stats()
        assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
        counts[flags] = sum(s["launches"].values())
    assert counts[""] <= 6 and counts["--disable_pass=scan_loop"] >= 8, counts


def test_a_first_step_reading_a_cache_column_stays_before_the_loop():
    """Initial states read as a column of a larger tensor (a model's state cache): the first
    step stays (its values are the loop's states), the loop takes the steps after it."""
    g = _wkv()
    cache = g.add_input("cache", TensorType((B, H, 2), "float32"))
    col = _op(g, "Squeeze", _op(g, "StridedSlice", cache, begin=[1], end=[2], strides=[1],
                                axes=[2]), axis=[2])
    first_max = next(n for n in g.nodes if n.op == "Maximum")
    g.replace_input(first_max, 0, col)
    h, notes, log = _run(g)
    (loop,) = _loops(h)
    assert not loop.attrs["first"] and list(loop.outputs[0].shape) == [B, L - 1, H]
    assert any("first step stays apart" in m and "part of a larger tensor" in m
               for m in log), log
    assert_same_results(g, h)


def test_a_first_step_reading_a_constant_cache_column_runs_inside_the_loop():
    """A column of a constant (and work on it) is a constant: folded to a compact row, the
    first step is the loop's own first step, no Concat and no slice of the cache left."""
    g = _wkv_cache_constant()
    h, notes, _ = _run(g)
    (loop,) = _loops(h)
    assert loop.attrs["first"] and list(loop.outputs[0].shape) == [B, L, H]
    assert "Concat" not in ops_of(h)
    todo = list(loop.inputs)  # no operand reads the cache: its column a compact constant
    while todo:
        p = todo.pop().producer
        if p is not None:
            assert p.op not in ("StridedSlice", "Squeeze"), p
            todo += p.inputs
    assert "steps 0..7" in notes[-1] or "steps 1..7" in notes[-1], notes
    assert_same_results(g, h)  # the same ops on the same values: equal to the bit


def _wkv_layers(time_decay, time_first, key, value):
    """Two layers of the WKV loop reading and writing their states in a state cache, a
    column per layer (transformers' RWKV with ``use_cache``): layer 1's initial states are
    columns of the cache that layer 0 did not write."""
    import torch

    b, _, c = key.shape
    cache = [torch.zeros(b, c, 2), torch.zeros(b, c, 2), torch.zeros(b, c, 2) - 1e38]
    x = key
    for layer in range(2):
        num, den, mx = (s[:, :, layer] for s in cache)
        states = [num, den, mx]
        out = _wkv_steps(-torch.exp(time_decay), time_first, x, value, states)
        for s, new in zip(cache, states, strict=True):
            s[:, :, layer] = new
        x = torch.tanh(out)
    return x


def _wkv_steps(time_decay, time_first, key, value, states):
    """``_wkv_loop`` from the given states, left in ``states`` at the end."""
    import torch

    num, den, mx = states
    output = torch.zeros_like(key)
    for t in range(key.shape[1]):
        k, v = key[:, t], value[:, t]
        m = torch.maximum(mx, k + time_first)
        e1, e2 = torch.exp(mx - m), torch.exp(k + time_first - m)
        output[:, t] = (e1 * num + e2 * v) / (e1 * den + e2)
        m = torch.maximum(mx + time_decay, k)
        e1, e2 = torch.exp(mx + time_decay - m), torch.exp(k - m)
        num, den, mx = e1 * num + e2 * v, e1 * den + e2, m
    states[:] = num, den, mx
    return output


def test_a_layer_reading_its_states_from_a_cache_is_one_loop_kernel():
    """Through torch.compile: layer 1 reads its initial states as columns of the cache
    (slices of the cache before layer 0's writes, constants): folded to compact rows, its
    first step runs inside its loop, no kernel of its own and no Concat."""
    import torch

    import graphkernel.torch as gt

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(32, generator=gen), torch.randn(32, generator=gen),
            torch.randn(2, 12, 32, generator=gen), torch.randn(2, 12, 32, generator=gen))
    torch._dynamo.reset()
    gt.reset_stats()
    with torch.no_grad():
        got = torch.compile(_wkv_layers, backend="graphkernel")(*args)
        want = _wkv_layers(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
    # each layer's loop and the work around it; layer 1's first step apart, and the Concat
    # of its row with the loop's, would be two launches more
    assert sum(s["launches"].values()) <= 5, s


def test_steps_whose_values_are_read_elsewhere_are_refused():
    """A step's value read outside the steps (what a training graph saves for its backward
    pass) keeps the unrolled steps alive: a loop beside them would only add work."""
    g = _wkv()
    exps = [n.outputs[0] for n in g.nodes if n.op == "Exp"]
    g.set_outputs([*g.outputs, exps[len(exps) // 2]])
    h, notes, log = _run(g)
    assert not _loops(h) and any("read outside the steps" in m for m in log), log
