"""The buffer plan: one list of a kernel's UB buffers that the tiling budget sums, the
template allocates and the simulator holds the launch to."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.codegen import targets
from graphkernel.codegen.buffers import Linear
from graphkernel.codegen.legalize import check
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.codegen.vector.render import render
from graphkernel.kernels import build_kernel


def _kernel(build, *inputs: tuple[str, tuple, str]):
    g = Graph("k")
    xs = [g.add_input(n, TensorType(shape, dt)) for n, shape, dt in inputs]
    g.set_outputs(build(g, *xs))
    g2 = g.copy()
    k = build_kernel(g2, [m for m in g2.nodes if m.op != "Constant"], "one", "test")
    return g, g2, k


def _op(g, op, ins, **a):
    return g.add_node(op, ins, a).output


def _softmax(g, x):
    e = _op(g, "Exp", [_op(g, "Sub", [x, _op(g, "ReduceMax", [x], axis=[1], keep_dims=True)])])
    return [_op(g, "Div", [e, _op(g, "ReduceSum", [e], axis=[1], keep_dims=True)])]


def _bias_compare(g, x, b):  # a broadcast fp16 row, a comparison's bit mask, a Select
    y = _op(g, "Add", [x, _op(g, "Cast", [b], dtype="float32")])
    return [_op(g, "Select", [_op(g, "Greater", [y, x]), y, x])]


KERNELS = {
    "softmax": (_softmax, ("x", (300, 40), "float32")),
    "bias_compare": (_bias_compare, ("x", (64, 96), "float32"), ("b", (96,), "float16")),
}


def _schedule(name: str):
    build, *inputs = KERNELS[name]
    g, g2, k = _kernel(build, *inputs)
    return g, g2, k, check(k, targets.load("ascend910b"))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_template_allocates_exactly_the_plan(name):
    *_, s = _schedule(name)
    r = render(s)
    src = r.files[f"{s.name}.cpp"]
    inits = re.findall(r"pipe_\.InitBuffer\((\w+),", src)
    assert inits == [b.name for b in r.plan.buffers]
    for b in r.plan.buffers:  # declared once, as a queue or a scratch buffer
        kind = "TQue<QuePosition::" if b.is_queue else "TBuf<TPosition::"
        assert len(re.findall(rf"{re.escape(kind)}\w+(, \d+)?> {b.name};", src)) == 1
    for b in r.plan.scratch:
        assert f"{b.local} = {b.name}.Get<{b.ctype}>()" in src
    # the tiling function's budget is the plan's sum, term by term
    ub = r.plan.budget()
    tiling = r.files[f"{s.name}_tiling.cpp"]
    assert (f"{ub.tile}ull * rt * ctp + {ub.col}ull * ctp + {ub.row}ull * rt + "
            f"{ub.fixed}ull") in tiling
    assert [b["name"] for b in r.manifest["buffers"]] == inits


def test_each_kind_of_buffer_is_counted_where_the_kernel_needs_it():
    *_, soft = _schedule("softmax")
    *_, mixed = _schedule("bias_compare")
    names = lambda s: {b.name for b in render(s).plan.buffers}  # noqa: E731
    assert {"bred", "brw", "btb"} <= names(soft)             # whole-row reductions
    r = next(io.index for io in mixed.inputs if io.kind == "row")
    x = next(io.index for io in mixed.inputs if io.kind == "full")
    assert {f"bri{r}", f"bsi{r}"} <= names(mixed)            # an fp16 row: staged, then cast
    assert any(n.startswith("bwm") for n in names(mixed))    # the comparison's mask
    assert not any(n.startswith(("bsi", "bwm")) for n in names(soft))  # fp32, no compare
    assert not {"bred", "brw"} & names(mixed)                # no reduction
    p = render(mixed).plan
    row = next(b for b in p.buffers if b.name == f"bri{r}")
    assert row.size == Linear(col=4) and not row.is_queue and row.in_finish
    q = next(b for b in p.buffers if b.name == f"qi{x}")
    assert q.depth == 2 and q.bound == Linear(tile=8)  # double-buffered fp32 tiles
    total = p.slack
    for b in p.buffers:
        total = total + b.size * b.depth
    assert p.budget() == total


@pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_launch_uses_what_the_plan_bounds_and_not_much_less(name):
    from graphkernel.codegen.backend import SimBackend
    from graphkernel.interpreter import Interpreter

    g, g2, k, s = _schedule(name)
    backend = SimBackend(g2, {k.name: s})
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(tuple(v.shape)).astype(v.dtype.np) for v in g.inputs}
    Interpreter(g2, kernel_runner=backend).run(feeds)
    (st,) = backend.stats.values()
    p = render(s).plan
    bound = p.budget().bytes(st.tiling["rt"], st.tiling["ctp"])
    # what the plan over-counts: its slack, a block per column buffer, the masks at 8x
    masks = sum(b.size.bytes(st.tiling["rt"], st.tiling["ctp"])
                for b in p.buffers if b.name.startswith("bwm"))
    loose = p.slack.fixed + sum(b.size.fixed * b.depth for b in p.buffers) + masks
    assert bound - loose <= st.ub_peak <= bound


@pytest.mark.sim
def test_a_buffer_the_plan_leaves_out_fails_the_launch(monkeypatch):
    """A template that allocates what the plan does not count would let the tiling choose
    a tile the device cannot hold: the simulator refuses the launch."""
    from graphkernel.codegen.backend import SimBackend
    from graphkernel.codegen.vector import render as ascendc
    from graphkernel.interpreter import Interpreter

    real = ascendc.render

    def short(s, node_comment=None):
        r = real(s, node_comment)
        p = dataclasses.replace(r.plan, buffers=tuple(b for b in r.plan.buffers
                                                      if b.name != "qi0"))
        return dataclasses.replace(r, plan=p)

    g, g2, k, s = _schedule("softmax")
    monkeypatch.setattr("graphkernel.codegen.backend.render", short)
    backend = SimBackend(g2, {k.name: s})
    feeds = {"x": np.ones((300, 40), np.float32)}
    with pytest.raises(SimulatorError, match="buffer plan allows"):
        Interpreter(g2, kernel_runner=backend).run(feeds)
