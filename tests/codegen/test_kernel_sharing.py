"""Kernels of equal bodies are planned, rendered and built once: the schedule carried over to
an equal kernel must be the one planning that kernel gives, the kernel project must list every
instance against its shared code, and the simulator must run every instance correctly."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import targets
from graphkernel.codegen.backend import run_sim, schedules, shared_kernels, write_project
from graphkernel.codegen.legalize import check
from graphkernel.codegen.vector.render import render
from graphkernel.interpreter import Interpreter
from graphkernel.structure import body_signature


def chains(n: int) -> Graph:
    """``n`` equal chains (scale, a per-row bias, tanh, a row sum; a softmax-like row
    normalisation), each reading its own input, with names of their own: two kernels each
    (the bias is spread along the rows the sum reduces, so it stays out of the sum's)."""
    g = Graph("chains")
    outs = []
    for i in range(n):
        x = g.add_input(f"x{i}", TensorType((16, 64), "float32"))
        h = g.add_node("Mul", [x, g.const(np.float32(0.5))], name=f"c{i}.scale").output
        h = g.add_node("Add", [h, g.const(np.full((16, 1), 0.25, np.float32))],
                          name=f"c{i}.bias").output
        h = g.add_node("Tanh", [h], name=f"c{i}.tanh").output
        s = g.add_node("ReduceSum", [h], {"axis": [1], "keep_dims": True}, name=f"c{i}.sum").output
        outs.append(g.add_node("Div", [h, s], name=f"c{i}.norm").output)
    g.set_outputs(outs)
    return g


@pytest.fixture(scope="module")
def compiled():
    return graphkernel.compile(chains(3), "--opt_level=2", env={})


def test_equal_bodies_share_one_kernel(compiled):
    kernels = [n for n in compiled.graph.nodes if n.op == "GraphKernel"]
    bodies: dict[tuple, list[str]] = {}
    for k in kernels:
        bodies.setdefault(body_signature(k.subgraph), []).append(k.name)
    assert len(kernels) == 6 and sorted(map(len, bodies.values())) == [3, 3]
    # each body's first kernel keeps its code, the others run it
    want = {name: names[0] for names in bodies.values() for name in names[1:]}
    assert shared_kernels(compiled) == want
    assert compiled.report.extra["codegen"]["distinct_kernels"] == 2
    assert compiled.report.extra["codegen"]["kernels"] == 6


def test_carried_over_schedule_is_the_planned_one(compiled):
    """Rendering a kernel's carried-over schedule gives, byte for byte, what planning the
    kernel afresh gives (its own names, symbol and notes included)."""
    spec = targets.load("ascend910b")
    scheds = schedules(compiled)
    for name, owner in shared_kernels(compiled).items():
        node = compiled.graph.node(name)
        mine, fresh = render(scheds[name]), render(check(node, spec))
        assert mine.files == fresh.files
        assert mine.manifest == fresh.manifest
        assert scheds[name].name != scheds[owner].name


def test_body_signature_ignores_names_not_values():
    a, b = chains(1), chains(1)
    b.rename_value(b.inputs[0], "renamed")
    b.rename_value(b.node("c0.tanh").output, "renamed_too")
    sig = [body_signature(g) for g in (a, b)]
    assert sig[0] == sig[1]
    c = chains(1)
    bias = c.node("c0.bias").inputs[1].producer
    bias.attrs["value"] = np.full((16, 1), 0.5, np.float32)  # another constant: another body
    assert body_signature(c) != sig[0]


def test_project_lists_every_instance_against_shared_code(compiled, tmp_path):
    write_project(compiled, tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["format"] == "graphkernel-kernels/2"
    names = sorted(n.name for n in compiled.graph.nodes if n.op == "GraphKernel")
    shared = shared_kernels(compiled)
    assert len(m["kernels"]) == 2
    assert sorted(n for k in m["kernels"] for n in k["instances"]) == names
    assert [i["node"] for i in m["instances"]] == names
    symbol = {i["node"]: i["kernel"] for i in m["instances"]}
    assert all(symbol[k] == symbol[o] for k, o in shared.items())
    assert sorted(p.name for p in (tmp_path / "kernels").glob("*.cpp")) == sorted(
        f"{k['name']}{end}" for k in m["kernels"] for end in (".cpp", "_tiling.cpp"))
    for inst in m["instances"]:  # each instance's own buffers, by its own value names
        sub = compiled.graph.node(inst["node"]).subgraph
        assert [io["name"] for io in inst["inputs"]] == [v.name for v in sub.inputs]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_every_instance_runs_the_shared_code_correctly(compiled):
    rng = np.random.default_rng(1)
    feeds = {v.name: rng.standard_normal((16, 64)).astype(np.float32)
             for v in compiled.graph.inputs}
    got, backend = run_sim(compiled, feeds)
    want = Interpreter(chains(3)).run(feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert len(backend.stats) == 6 and len({st.name for st in backend.stats.values()}) == 2


def test_refusals_carried_over_as_checking_each_kernel_gives(monkeypatch):
    """Equal matmul-epilogue kernels the generator refuses (a Floor is no epilogue op of a
    MIX kernel): the refusal is decided once and the fallbacks (reasons, actions, the
    kernels they leave) are those of checking each. (The matmul_depth pattern leaves a Floor
    out of the epilogue itself; told to take any op, it makes the kernels the generator
    refuses.)"""
    import graphkernel.patterns.matmul as matmul_pattern
    from graphkernel.codegen import legalize

    monkeypatch.setattr(matmul_pattern, "_epilogue_op", lambda n: True)

    def layers() -> Graph:
        g = Graph("mm")
        x = g.add_input("x", TensorType((32, 64), "float32"))
        w = g.const(np.full((64, 64), 0.01, np.float32))
        for i in range(3):
            h = g.add_node("MatMul", [x, w], name=f"l{i}.mm").output
            h = g.add_node("Add", [h, g.const(np.float32(1.0))], name=f"l{i}.add").output
            x = g.add_node("Floor", [h], name=f"l{i}.floor").output
        g.set_outputs([x])
        return g

    checks = []
    real = legalize.check
    monkeypatch.setattr(legalize, "check", lambda k, s: checks.append(k.name) or real(k, s))
    once = graphkernel.compile(layers(), "--opt_level=2", env={})
    n_once = len(checks)
    monkeypatch.setattr(legalize.Refused, "of", staticmethod(lambda kernel, e: None))
    monkeypatch.setattr(legalize, "rebind", lambda s, kernel: None)
    each = graphkernel.compile(layers(), "--opt_level=2", env={})
    assert once.report.extra["fallbacks"] and len(checks) - n_once > n_once
    assert once.report.extra["fallbacks"] == each.report.extra["fallbacks"]
    assert str(once.graph) == str(each.graph)


def test_carried_over_schedule_keeps_columns_of_rows():
    """Two equal rotary embeddings (slices of the last axis put back by a Concat): the
    second kernel's schedule, carried over, renders as planning it afresh does."""
    g = Graph("rotary2")
    cos, sin = (g.add_input(n, TensorType((1, 1, 16, 16), "float32")) for n in ("cos", "sin"))
    outs = []
    for i in range(2):
        x = g.add_input(f"x{i}", TensorType((2, 4, 16, 16), "float32"))
        h = [g.add_node("StridedSlice", [x], {"begin": [b], "end": [e], "strides": [1],
                                              "axes": [3]}).output for b, e in ((0, 8), (8, 16))]
        rot = g.add_node("Concat", [g.add_node("Neg", [h[1]]).output, h[0]], {"axis": -1})
        outs.append(g.add_node("Add", [g.add_node("Mul", [x, cos]).output, g.add_node(
            "Mul", [rot.output, sin]).output]).output)
    g.set_outputs(outs)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra["fallbacks"]
    scheds = schedules(res)
    shared = shared_kernels(res)
    assert len(shared) == 1
    for name in shared:
        mine = render(scheds[name])
        assert mine.files == render(check(res.graph.node(name), targets.load("ascend910b"))).files


def test_carried_over_cube_schedule_is_the_planned_one(monkeypatch):
    """Equal MIX kernels (a product and its epilogue, reading a bias row) are planned once:
    each other instance's carried-over schedule renders as planning it afresh does."""
    from graphkernel.codegen import legalize
    from graphkernel.codegen.cube.render import render_matmul
    from graphkernel.codegen.cube.schedule import MatmulSchedule, plan_matmul

    planned = []
    monkeypatch.setattr(legalize, "plan_matmul",
                        lambda k, spec: planned.append(k.name) or plan_matmul(k, spec))

    g = Graph("products")
    outs = []
    for i in range(3):
        x = g.add_input(f"x{i}", TensorType((32, 64), "float16"))
        w = g.const(np.full((64, 48), 0.01 * (i + 1), np.float16), name=f"p{i}.w")
        b = g.const(np.full(48, 0.5 + i, np.float16), name=f"p{i}.b")
        h = g.add_node("MatMul", [x, w], name=f"p{i}.mm").output
        h = g.add_node("Add", [h, b], name=f"p{i}.bias").output
        outs.append(g.add_node("Tanh", [h], name=f"p{i}.act").output)
    g.set_outputs(outs)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    spec = targets.load("ascend910b")
    scheds = schedules(res)
    shared = shared_kernels(res)
    assert len(shared) == 2 and len(planned) == 1
    for name, owner in shared.items():
        mine = scheds[name]
        assert isinstance(mine, MatmulSchedule) and mine.epilogue is not None
        fresh = check(res.graph.node(name), spec)
        assert render_matmul(mine).files == render_matmul(fresh).files
        assert render_matmul(mine).manifest == render_matmul(fresh).manifest
        assert mine.notes == fresh.notes and mine.name != scheds[owner].name
        assert mine.matmul.graph is res.graph.node(name).subgraph


def test_copy_with_is_dataclass_replace(compiled):
    """The carried-over schedules' copies: what ``dataclasses.replace`` gives, for every
    field changed or kept."""
    from dataclasses import dataclass, field, fields, replace

    from graphkernel.codegen.instance import copy_with

    s = next(iter(schedules(compiled).values()))
    io, other = s.inputs[0], s.outputs[0].value
    assert copy_with(io, value=other, base=3) == replace(io, value=other, base=3)
    assert copy_with(io) == io and copy_with(io) is not io
    moved = copy_with(s, name="renamed", notes=["n"])
    assert moved == replace(s, name="renamed", notes=["n"])
    assert all(getattr(moved, f.name) is getattr(s, f.name) for f in fields(s)
               if f.name not in ("name", "notes"))

    @dataclass
    class Keyword:
        a: int
        b: int = field(default=0, kw_only=True)

    with pytest.raises(TypeError, match="positional init field"):
        copy_with(Keyword(1), a=2)


def test_kernel_symbol_follows_the_body():
    """The symbol hashes the body's text: another constant, another type or another name
    gives another symbol, and the body as it was gives its symbol again."""
    from graphkernel.codegen.vector.schedule import kernel_symbol

    res = graphkernel.compile(chains(2), "--opt_level=2", env={})
    k, other = [n for n in res.graph.nodes if n.op == "GraphKernel"][:2]
    first = kernel_symbol(k)
    assert kernel_symbol(other) != first  # an equal body under other names
    const = next(n for n in k.subgraph.nodes if n.op == "Constant")
    value = const.attrs["value"]
    const.attrs["value"] = value + np.float32(1)
    assert kernel_symbol(k) != first
    const.attrs["value"] = value
    assert kernel_symbol(k) == first
    x = k.subgraph.inputs[0]
    x.type = TensorType(x.type.shape, "float16")
    assert kernel_symbol(k) != first


def test_a_refusal_carries_the_node_and_what_it_names():
    """Whether a refusal holds for a kernel of equal body is read off the refusal's fields:
    the node it stumbled on (by position in the body) and the values it names."""
    from graphkernel.codegen.legalize import Refused
    from graphkernel.codegen.refusal import Unsupported
    from graphkernel.structure import body_signature

    kernels = [n for n in graphkernel.compile(chains(2), "--opt_level=2", env={}).graph.nodes
               if n.op == "GraphKernel"]
    k1, k2 = next((a, b) for a in kernels for b in kernels if a is not b and
                  body_signature(a.subgraph) == body_signature(b.subgraph))
    bad = k1.subgraph.nodes[1]
    r = Refused.of(k1, Unsupported(f"{bad.op} cannot", node=bad))
    assert r is not None and r.at == 1
    with pytest.raises(Unsupported, match="cannot") as e:
        r.raise_for(k2)
    assert e.value.node is k2.subgraph.nodes[1]  # the same place in the other kernel
    # naming a value of the kernel: checked for each kernel, to name its own
    v = bad.outputs[0]
    assert Refused.of(k1, Unsupported(f"{v.name} cannot", node=bad, about=(v,))) is None
    other = next(n for n in chains(1).nodes if n.op != "Constant")
    assert Refused.of(k1, Unsupported("elsewhere", node=other)) is None  # not in the body


def test_carried_over_schedule_keeps_its_readouts_reduced_within_the_tile():
    """Two equal selective-scan layers (Scan along the rows, its readout summed over the
    state): the second kernel's schedule, carried over, names its own readout steps as
    reduced within the tile, and renders as planning it afresh does."""
    g = Graph("scan2")
    shape = (2, 6, 16, 8)
    c = g.add_input("c", TensorType((2, 1, 16, 8), "float32"))
    y = g.add_input("y", TensorType((2, 6, 16, 1), "float32"))
    for i in range(2):
        x = g.add_input(f"x{i}", TensorType(shape, "float32"))
        decay = g.add_node("Exp", [g.add_node("Neg", [g.add_node("Abs", [x]).output]).output])
        h = g.add_node("Scan", [decay.output, g.add_node("Mul", [x, y]).output],
                       {"axis": 2, "combine": "linear"})
        hc = g.add_node("Mul", [h.output, c])
        y = g.add_node("ReduceSum", [hc.output], {"axis": [3], "keep_dims": True}).output
    g.set_outputs([y])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra["fallbacks"]
    scheds = schedules(res)
    shared = [n for n in shared_kernels(res) if scheds[n].row_reduces]
    assert shared
    for name in shared:
        assert scheds[name].row_reduces <= {id(m) for m in scheds[name].steps}
        afresh = check(res.graph.node(name), targets.load("ascend910b"))
        assert render(scheds[name]).files == render(afresh).files
