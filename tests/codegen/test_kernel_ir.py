"""The kernel IR and the one lowering engine: the instruction table names registered ops and
every form has a lowering rule; a vector kernel and a MIX epilogue are lowered by the same
engine into records whose buffers are the kernel's buffer plan, in the order the kernel
allocates them."""

from __future__ import annotations

import re

import pytest

from graphkernel import Graph, TensorType, ops
from graphkernel.codegen import lower as engine
from graphkernel.codegen import targets
from graphkernel.codegen.cube import render as cube_render
from graphkernel.codegen.cube.lower import lower as lower_mix
from graphkernel.codegen.cube.schedule import plan_matmul
from graphkernel.codegen.instructions import FORMS, INSTRUCTIONS, TABLE
from graphkernel.codegen.kernel_ir import Call, Comment, Kind, ScalarCode, text
from graphkernel.codegen.vector.lower import lower as lower_vector
from graphkernel.codegen.vector.render import render
from graphkernel.codegen.vector.schedule import plan
from graphkernel.kernels import build_kernel

SPEC = targets.load("ascend910b")


def test_every_table_op_is_a_registered_op_and_every_form_has_a_rule():
    assert all(ops.exists(i.op) and ops.canonical(i.op) == i.op for i in TABLE)
    assert set(engine.RULES) == set(FORMS) == {i.form for i in TABLE}
    assert len(INSTRUCTIONS) == len(TABLE)  # one entry per op


def _kernel(g: Graph):
    k = build_kernel(g, [n for n in g.nodes if n.op != "Constant"], "k", "test")
    return k


def _softmax_rows() -> Graph:
    g = Graph("v")
    x = g.add_input("x", TensorType((64, 48), "float16"))
    m = g.add_node("ReduceMax", [x], {"axis": [1], "keep_dims": True}).output
    e = g.add_node("Exp", [g.add_node("Sub", [x, m]).output]).output
    s = g.add_node("ReduceSum", [e], {"axis": [1], "keep_dims": True}).output
    g.set_outputs([g.add_node("Div", [e, s]).output])
    return g


def _linear_layernorm() -> Graph:
    g = Graph("m")
    a = g.add_input("a", TensorType((96, 64), "float16"))
    w = g.add_input("w", TensorType((64, 64), "float16"))
    b = g.add_input("b", TensorType((64,), "float16"))
    y = g.add_node("Add", [g.add_node("MatMul", [a, w]).output, b]).output
    mean = g.add_node("ReduceSum", [y], {"axis": [1], "keep_dims": True}).output
    c = g.add_node("Sub", [y, mean]).output
    g.set_outputs([g.add_node("Mul", [c, c]).output])
    return g


def test_a_vector_kernel_is_records_and_its_buffers_are_the_plan():
    s = plan(_kernel(_softmax_rows()), target=SPEC)
    ir = lower_vector(s)
    kinds = {type(i) for i in ir.compute}
    assert Call in kinds and Comment in kinds and kinds <= {Call, Comment, ScalarCode}
    r = render(s)
    assert r.plan.buffers == tuple(ir.buffers)
    src = r.files[f"{s.name}.cpp"]
    assert re.findall(r"pipe_\.InitBuffer\((\w+),", src) == [b.name for b in ir.buffers]
    assert {b.kind for b in ir.buffers} >= {Kind.QUEUE_IN, Kind.QUEUE_OUT, Kind.TILE}
    # every instruction's text is in the kernel, in order
    lines = [line for line in text(ir.compute) if not line.startswith("//")]
    body = src[src.index("void Compute("):]
    at = 0
    for line in lines:
        at = body.index(line, at) + len(line)


def test_a_mix_epilogue_is_lowered_by_the_same_engine():
    g = _linear_layernorm()
    s = plan_matmul(_kernel(g), SPEC)
    ir = lower_mix(s.epilogue, SPEC)
    calls = [c for c in ir.compute if isinstance(c, Call)]
    # the whole-row forms on the kernel's row object, the per-row binary of the bias row
    assert {"R."} == {c.owner for c in calls if c.api in ("RowReduce", "ColOp")}
    assert any(c.each_row and c.count == "bN" for c in calls)
    r = cube_render.render_matmul(s)
    assert r.plan.buffers == tuple(ir.buffers)
    src = r.files[f"{s.name}.cpp"]
    # the template allocates exactly the plan's buffers (it declares them in its own order)
    inits = set(re.findall(r"pipe\.InitBuffer\((?:R\.)?(\w+),", src))
    assert inits == {b.name for b in ir.buffers}


@pytest.mark.parametrize("space", ["vector", "mix"])
def test_the_engine_states_its_choices_per_loop_space(space):
    from graphkernel.codegen.cube.lower import SPACE
    from graphkernel.codegen.vector.lower import space as vector_space

    sp = vector_space(plan(_kernel(_softmax_rows()), target=SPEC)) if space == "vector" \
        else SPACE
    assert sp.pitch == ("t_.ctp" if space == "vector" else "bN")
    assert sp.in_place == sp.scalar_forms == sp.comments == (space == "vector")
