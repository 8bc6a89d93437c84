"""Product groups: independent products of one left operand run as one kernel (the
matmul_group pass, codegen/cube/group.py). The joined kernel matches the op-by-op run in the
simulator, reads what the products read alone (A once per product) and launches once; what
cannot be joined is not; a group whose products break the Matmul API's object rule fails in
the simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.bisect import Evaluator
from graphkernel.codegen import targets
from graphkernel.codegen.backend import SimBackend, render_all, run_sim, schedules
from graphkernel.codegen.cube.group import GroupSchedule
from graphkernel.codegen.sim.execute import SimLibrary
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.codegen.traffic import launches
from graphkernel.interpreter import Interpreter
from tests.codegen.cases import Case, compile_cases

SPEC = targets.load("ascend910b")
pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)


def _shared_left(m, widths, dtype="float16", epilogue=(), trans=()) -> Graph:
    """Products x·w_i (x: [m, 64]) of the given widths; ``epilogue``: the products given a
    bias and a ReLU (MIX); ``trans``: the products whose weight is stored [n, 64] and read
    transposed."""
    g = Graph("shared_left")
    x = g.add_input("x", TensorType((m, 64), dtype))
    outs = []
    for i, n in enumerate(widths):
        tb = i in trans
        w = g.add_input(f"w{i}", TensorType((n, 64) if tb else (64, n), dtype))
        y = g.add_node("MatMul", [x, w], {"transpose_a": False, "transpose_b": tb}).output
        if i in epilogue:
            b = g.add_input(f"b{i}", TensorType((n,), dtype))
            y = g.add_node("Relu", [g.add_node("Add", [y, b]).output]).output
        outs.append(y)
    g.set_outputs(outs)
    return g


def _shared_right(n, heights, dtype="float32", epilogue=()) -> Graph:
    """Products w_i·xᵀ (x: [n, 64] read transposed, w_i: [m_i, 64]): a weight cut along its
    rows M, each piece by one activation (a state-space layer's ``in_proj`` in the channels-
    first layout); ``epilogue``: the products given a Sigmoid (MIX)."""
    g = Graph("shared_right")
    x = g.add_input("x", TensorType((n, 64), dtype))
    outs = []
    for i, m in enumerate(heights):
        w = g.add_input(f"w{i}", TensorType((m, 64), dtype))
        y = g.add_node("MatMul", [w, x], {"transpose_a": False, "transpose_b": True}).output
        if i in epilogue:
            y = g.add_node("Sigmoid", [y]).output
        outs.append(y)
    g.set_outputs(outs)
    return g


def _weight_grads() -> Graph:
    """Training's weight gradients xᵀ·dQ, xᵀ·dK, xᵀ·dV: one A read transposed."""
    g = Graph("weight_grads")
    x = g.add_input("x", TensorType((96, 64), "float32"))
    outs = []
    for i, n in enumerate((64, 32, 32)):
        d = g.add_input(f"d{i}", TensorType((96, n), "float32"))
        outs.append(g.add_node("MatMul", [x, d], {"transpose_a": True,
                                                  "transpose_b": False}).output)
    g.set_outputs(outs)
    return g


def _shared_input(widths=(32, 8), relu=(1,)) -> Graph:
    """1x1 convolutions of one NCHW input (a projection shortcut and a bottleneck's first
    convolution): products ``W_i[M_i, C] @ x[n][C, H*W]`` of one right operand, the first
    given a bias, those in ``relu`` a ReLU (MIX)."""
    g = Graph("shared_input")
    x = g.add_input("x", TensorType((2, 16, 8, 8), "float32"))
    rng = np.random.default_rng(3)
    outs = []
    for i, m in enumerate(widths):
        ins = [x, g.const(rng.standard_normal((m, 16, 1, 1)).astype(np.float32))]
        if i == 0:
            ins.append(g.const(rng.standard_normal(m).astype(np.float32)))
        y = g.add_node("Conv2D", ins, {"strides": [1, 1], "pads": [0, 0, 0, 0],
                                       "dilations": [1, 1], "group": 1,
                                       "data_format": "NCHW"}).output
        outs.append(g.add_node("Relu", [y]).output if i in relu else y)
    g.set_outputs(outs)
    return g


def _glu(m, n, dtype="float16", up_bias=False) -> Graph:
    """A gated MLP's projections: up = x·wu (with a bias: a MIX product), gate = x·wg, then
    silu(gate) · up on gate's tiles, reading up's result back."""
    g = Graph("glu")
    x = g.add_input("x", TensorType((m, 64), dtype))
    mm = {"transpose_a": False, "transpose_b": False}
    up = g.add_node("MatMul", [x, g.add_input("wu", TensorType((64, n), dtype))], mm).output
    if up_bias:
        up = g.add_node("Add", [up, g.add_input("bu", TensorType((n,), dtype))]).output
    gate = g.add_node("MatMul", [x, g.add_input("wg", TensorType((64, n), dtype))], mm).output
    silu = g.add_node("Mul", [gate, g.add_node("Sigmoid", [gate]).output]).output
    g.set_outputs([g.add_node("Mul", [silu, up]).output])
    return g


CASES = [
    Case("cube", _shared_left(50, (64, 32, 48)), flags=""),
    # the products' tilings differ in their cores (a block beyond one's skips it) and one
    # is MIX: the group is a MIX kernel running a cube product too
    Case("mix_cores", _shared_left(700, (512, 16, 1000), epilogue=(2,), trans=(1,)),
         flags=""),
    Case("bf16_mix_all", _shared_left(40, (96, 80), "bfloat16", epilogue=(0, 1)), flags=""),
    Case("weight_grads", _weight_grads(), flags=""),
    # one right operand: convolutions of one input as products W_i @ x (one cube, one MIX)
    Case("shared_right", _shared_input(), flags=""),
    Case("shared_right_three", _shared_input((32, 8, 24), relu=(0, 2)), flags=""),
    Case("shared_right_activation", _shared_right(48, (96, 96), epilogue=(1,)), flags=""),
    Case("symbolic_m", _shared_left("s0", (64, 32), epilogue=(1,)), flags="",
         dims=[{"s0": 5}, {"s0": 300}]),
    # gate's epilogue reads up's result back: up takes gate's core split (alone they split
    # 3 x 5 and 3 x 6 over the cores)
    Case("read_back", _glu(700, 1000), flags=""),
    Case("read_back_symbolic", _glu("s0", 96, "bfloat16"), flags="",
         dims=[{"s0": 7}, {"s0": 520}]),
]
READ_BACK = {"read_back", "read_back_symbolic"}


@pytest.fixture(scope="module")
def library():
    return compile_cases(CASES)


def _alone(case: Case):
    return graphkernel.compile(case.graph, "--disable_pass=matmul_group", env={})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_group_matches_the_interpreter_and_reads_what_its_products_read(case, library):
    (k,) = [n for n in case.result.graph.nodes if n.op == "GraphKernel"]
    s = schedules(case.result)[k.name]
    assert isinstance(s, GroupSchedule) and not case.result.report.extra["fallbacks"]
    assert len(s.members) == (2 if case.id in READ_BACK else len(case.graph.outputs))
    assert [m.split_of for m in s.members] == ([1, None] if case.id in READ_BACK
                                               else [None] * len(s.members))
    alone = _alone(case)
    assert sum(n.op == "GraphKernel" for n in alone.graph.nodes) == len(s.members)
    for dims in case.dims:
        feeds = case.feeds(dims)
        got, backend = run_sim(case.result, feeds, library=library)
        assert not backend.unscheduled
        judged = Evaluator(case.graph, feeds).judge(got)
        assert not judged.bad, f"{case.id} {dims}: {judged.reason}"
        (st,) = backend.stats.values()
        assert st.launches == 1
        _, apart = run_sim(alone, feeds)
        assert st.gm_written == sum(x.gm_written for x in apart.stats.values())
        assert st.block_dim == max(x.block_dim for x in apart.stats.values())
        if case.id not in READ_BACK:
            assert st.gm_written == sum(a.nbytes for a in got)
            # each product reads what it read as a kernel of its own: A once per product
            assert st.gm_read == sum(x.gm_read for x in apart.stats.values())
        else:  # up's result, written and read back as when the two were kernels of their own
            assert st.gm_written == 2 * got[0].nbytes
            # up runs on gate's tiling: it reads A exactly as gate does
            (gate,) = [x for x in apart.stats.values() if len(x.input_reads) == 3]
            assert st.input_reads[0] == 2 * gate.input_reads[0]


def test_the_traffic_model_counts_the_left_operand_once_per_product(library):
    case = CASES[0]
    (entry,) = [e for e in launches(case.result.graph) if e["kind"] != "vector"]
    x = case.graph.inputs[0]
    alone = [e for e in launches(_alone(case).graph) if e["op"] == "GraphKernel"]
    assert entry["bytes_read"] == sum(e["bytes_read"] for e in alone)
    assert entry["bytes_read"] > sum(e["bytes_read"] for e in alone) - x.type.numel * 2 * 2


def _kernels(g: Graph, flags: str = "") -> list[str]:
    res = graphkernel.compile(g, flags, env={})
    return [n.attrs["pattern"] for n in res.graph.nodes if n.op == "GraphKernel"]


def test_a_product_that_depends_on_another_is_not_joined():
    """y2 = x·(w2 + x·w1): both products read x as A, but the second's B is computed from
    the first's result, so they cannot run in one kernel in either order."""
    g = Graph("dependent")
    x = g.add_input("x", TensorType((64, 64), "float16"))
    w1 = g.add_input("w1", TensorType((64, 64), "float16"))
    y1 = g.add_node("MatMul", [x, w1], {"transpose_a": False, "transpose_b": False}).output
    w2 = g.add_node("Add", [g.add_input("w2", TensorType((64, 64), "float16")), y1]).output
    y2 = g.add_node("MatMul", [x, w2], {"transpose_a": False, "transpose_b": False}).output
    g.set_outputs([y1, y2])
    pats = _kernels(g)
    assert "matmul_group" not in pats and len(pats) >= 2


def test_products_of_one_right_operand_that_depend_on_each_other_are_not_joined():
    """W1 @ x and (W2 + rowsum(W1 @ x)) @ x read one B, but the second's A is computed from
    the first's result: not one kernel. Independent, the same two products are joined."""
    def build(dependent: bool) -> Graph:
        g = Graph("dependent_right")
        x = g.add_input("x", TensorType((2, 16, 64), "float32"))
        w1 = g.add_input("w1", TensorType((8, 16), "float32"))
        w2 = g.add_input("w2", TensorType((8, 16), "float32"))
        y1 = g.add_node("BatchMatMul", [w1, x]).output
        if dependent:
            s = g.add_node("ReduceSum", [y1], {"axis": [0, 2], "keep_dims": False}).output
            s = g.add_node("Reshape", [s], {"shape": [8, 1]}).output
            w2 = g.add_node("Add", [w2, s]).output
        g.set_outputs([y1, g.add_node("BatchMatMul", [w2, x]).output])
        return g

    assert "matmul_group" in _kernels(build(False))
    pats = _kernels(build(True))
    assert "matmul_group" not in pats and len(pats) >= 2


def test_at_opt_level_3_products_of_one_input_are_a_group_not_a_parallel_kernel():
    """At level 3 the horizontal fusion (parallel_fusion, earlier) leaves two kernels that
    each hold a product to the product group: joined, they would be one kernel of two
    products, which the generator refuses and splits again (a fallback)."""
    res = graphkernel.compile(_shared_input(), "--opt_level=3", env={})
    assert not res.report.extra["fallbacks"]
    pats = [n.attrs["pattern"] for n in res.graph.nodes if n.op == "GraphKernel"]
    assert pats == ["matmul_group"]


def test_products_sharing_only_a_constant_right_operand_are_not_joined():
    """x1·W and x2·W (a tied weight, constant): no activation is shared, nothing joins; the
    same products by one activation x as B do join."""
    g = Graph("tied")
    w = g.const(np.ones((64, 32), np.float32))
    outs = []
    for i in range(2):
        x = g.add_input(f"x{i}", TensorType((48, 64), "float32"))
        outs.append(g.add_node("MatMul", [x, w], {"transpose_a": False, "transpose_b": False}
                               ).output)
    g.set_outputs(outs)
    assert "matmul_group" not in _kernels(g)
    assert _kernels(_shared_right(48, (32, 32))) == ["matmul_group"]


def test_a_group_beyond_the_kernel_input_cap_is_not_joined():
    g = _shared_left(50, (64, 32, 48))  # x and three weights: 4 inputs
    assert _kernels(g).count("matmul_group") == 1
    capped = _kernels(g, "--max_kernel_inputs=2")
    assert "matmul_group" not in capped
    three = _kernels(g, "--max_kernel_inputs=3")  # two products fit: x, w0, w1
    assert three.count("matmul_group") == 1 and len(three) == 2


def test_the_flag_and_the_pass_name_turn_it_off():
    g = _shared_left(50, (64, 32, 48))
    assert _kernels(g, "--enable_matmul_group=false") == ["cube"] * 3
    assert _kernels(g, "--disable_pass=matmul_group") == ["cube"] * 3
    assert _kernels(g, "--opt_level=1") == ["cube"] * 3


def _group_kernel(case: Case):
    (k,) = [n for n in case.result.graph.nodes if n.op == "GraphKernel"]
    s = schedules(case.result)[k.name]
    (r,) = render_all({k.name: s})
    return k, s, r


@pytest.mark.parametrize(("wrong", "message"), [
    ("no_end", "never called End|another has not called End"),
    ("all_blocks", "does not cover block"),
    ("own_split", r"which block [0-9]+ \(vector core [01]\) wrote in this launch"),
    ("aiv_index", "its cube core registers Matmul objects at"),
])
def test_a_broken_group_fails_in_the_simulator(wrong, message, library):
    """A group whose first product keeps its Matmul object open (no End() before the next
    product's object is used), whose blocks all run a product with fewer cores in its
    tiling, or whose read-back product keeps its own core split (a block then reads results
    another block wrote, with nothing ordering the two), is refused by the simulator. So is
    the guard that tests the vector core's index (``GetBlockIdx() < usedCoreNum``, which is
    ``block * 2 + sub-block`` on a vector core of a MIX launch and ``block`` on its cube
    core): the cores of one block would reach different registrations and the block hang."""
    case = next(c for c in CASES if c.id == ("read_back" if wrong == "own_split" else
                                             "mix_cores"))
    k, s, r = _group_kernel(case)
    src = r.files[f"{s.name}.cpp"]
    name = f"{s.name}_tiling.cpp"
    if wrong == "own_split":  # up keeps its own core split: blocks read others' results
        host = r.files[name]
        r = dataclasses.replace(r, files={**r.files, name: host.replace(
            "dst.cube = src.cube;", "").replace("dst.coresM = src.coresM;", "").replace(
            "dst.coresN = src.coresN;", "")})
        assert r.files[name] != host
        broken = src + "\n"
    elif wrong == "no_end":
        first = s.members[0].schedule.name
        body = src.index(f"void {first}(")
        end = src.index("    mm.End();\n", body)
        broken = src[:end] + src[end + len("    mm.End();\n"):]
    elif wrong == "aiv_index":
        broken = src.replace("GetBlockIdx() / GetTaskRatio() < t.cube.usedCoreNum",
                             "GetBlockIdx() < t.cube.usedCoreNum")
    else:
        broken = src.replace("t.nc != 0 && GetBlockIdx() / GetTaskRatio() < t.cube.usedCoreNum",
                             "t.nc != 0")
    assert broken != src
    bad = dataclasses.replace(r, files={**r.files, f"{s.name}.cpp": broken})
    backend = SimBackend(case.result.graph, {k.name: s}, library=SimLibrary([bad]))
    feeds = case.feeds({})
    with pytest.raises(SimulatorError, match=message):
        Interpreter(case.result.graph, kernel_runner=backend).run(feeds)


def test_llama_projections_launch_as_one_kernel_per_layer():
    """A LlamaConfig decoder (2 layers, hidden 64, library defaults): each layer's q, k and v
    projections of the normed hidden state are one launch, and its MLP's up and gate
    projections another (gate's epilogue reading up's result back)."""
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import graphkernel.torch as gt

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (2, 8))
    g = gt.export_graph(model, (ids,), name="llama")
    on = graphkernel.compile(g, "", env={})
    off = graphkernel.compile(g, "--disable_pass=matmul_group", env={})
    count = lambda r: sum(n.op == "GraphKernel" for n in r.graph.nodes)  # noqa: E731
    groups = [n for n in on.graph.nodes if n.attrs.get("pattern") == "matmul_group"]
    assert len(groups) == 4  # per layer: q, k, v; up, then gate reading up back
    assert sorted(sum(m.op == "MatMul" for m in k.subgraph.nodes) for k in groups) == [
        2, 2, 3, 3]
    assert count(on) == count(off) - 6
    feeds = {v.name: np.asarray(ids) for v in g.inputs if v.dtype.value == "int64"}
    if len(feeds) == len(g.inputs):
        got, backend = run_sim(on, feeds)
        want = Interpreter(g).run(feeds)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=2e-3, atol=2e-3)


def test_a_group_the_generator_refuses_runs_as_its_products_kernels(monkeypatch, library):
    """When the code generator refuses a group (here: told to), the group falls back to its
    products' own kernels, each with its epilogue, with the reason reported."""
    from graphkernel.codegen import legalize
    from graphkernel.codegen.refusal import Unsupported

    def refuse(kernel, spec):
        raise Unsupported("a refusal for the test")

    monkeypatch.setattr(legalize, "plan_group", refuse)
    case = CASES[1]
    res = graphkernel.compile(case.graph, "", env={})
    ks = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert len(ks) == 3 and not any(k.attrs["pattern"] == "matmul_group" for k in ks)
    (fb,) = res.report.extra["fallbacks"]
    assert fb["reason"] == "a refusal for the test" and "products' kernels" in fb["action"]
    feeds = case.feeds({})
    got, backend = run_sim(res, feeds)
    assert not backend.unscheduled and len(backend.stats) == 3
    assert not Evaluator(case.graph, feeds).judge(got).bad


def _group_of(body: Graph):
    probe = Graph("probe")
    return probe.add_node("GraphKernel", [probe.add_input(v.name, v.type) for v in body.inputs],
                          {"subgraph": body, "pattern": "matmul_group"}, name="g")


@pytest.mark.parametrize(("first", "message"), [
    ("relu", "part with 2 products"),  # not a product's result: one part, two products
    ("twice", "or one read back already"),
    ("row", "other than as a tile of its own product's extent"),
])
def test_what_a_product_cannot_read_back_is_refused(first, message):
    """A product whose epilogue reads another's result from GM: refused when that result is
    computed by an epilogue (only a product's own result is written for a later product), when
    two products read it back (it cannot keep both readers' core splits), or when it is read
    other than tile for tile (a row of it: blocks would read others' parts)."""
    from graphkernel.codegen.cube.group import plan_group
    from graphkernel.codegen.refusal import Unsupported

    b = Graph("body")
    x = b.add_input("x", TensorType((64, 64), "float16"))
    mm = {"transpose_a": False, "transpose_b": False}
    n_up = 1 if first == "row" else 96
    y1 = b.add_node("MatMul", [x, b.add_input("wu", TensorType((64, n_up), "float16"))],
                    mm).output
    if first == "relu":
        y1 = b.add_node("Relu", [y1]).output
    y2 = b.add_node("MatMul", [x, b.add_input("wg", TensorType((64, 96), "float16"))],
                    mm).output
    outs = [y1, b.add_node("Mul", [y2, y1]).output]
    if first == "twice":
        y3 = b.add_node("MatMul", [x, b.add_input("wh", TensorType((64, 96), "float16"))],
                        mm).output
        outs.append(b.add_node("Add", [y3, y1]).output)
    b.set_outputs(outs)
    with pytest.raises(Unsupported, match=message):
        plan_group(_group_of(b), SPEC)
