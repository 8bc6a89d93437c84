"""kxk convolutions with their epilogue as one MIX kernel (codegen/cube/conv.py), run in the
simulator: the numbers against torch's convolution, the GM bytes against the traffic model,
the refusals, and broken kernels the simulator must reject (a panel read before its copies
are complete, a panel rewritten while the cube core reads it, a misaligned window offset)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen import backend
from graphkernel.codegen.backend import run_sim, schedules
from graphkernel.codegen.cube.conv import ConvSchedule, conv_reads
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.codegen.traffic import launches
from graphkernel.textir import format_graph

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
RNG = np.random.default_rng(5)


def _conv(cin, cout, hw, k=(3, 3), stride=1, pads=(1, 1, 1, 1), bias=True, residual=False,
          act="ReLU"):
    """conv (+ bias) (+ a residual input) -> activation, NCHW float32; the graph and the
    torch function computing the same from the inputs."""
    g = Graph("kxk")
    x = g.add_input("x", TensorType((2, cin, *hw), "float32"))
    wv = (RNG.standard_normal((cout, cin, *k)) / np.sqrt(cin * k[0] * k[1])).astype("float32")
    bv = RNG.standard_normal(cout).astype("float32") if bias else None
    ins = [x, g.const(wv)] + ([g.const(bv)] if bias else [])
    y = g.add_node("Conv2D", ins, {"strides": [stride, stride], "pads": list(pads)}).output
    if residual:
        y = g.add_node("Add", [y, g.add_input("r", TensorType(tuple(y.shape), "float32"))]).output
    y = g.add_node(act, [y]).output
    g.set_outputs([y])

    def ref(feeds):
        pt, pl, pb, pr = pads
        xt = torch.nn.functional.pad(torch.from_numpy(feeds["x"]).double(), (pl, pr, pt, pb))
        out = torch.nn.functional.conv2d(xt, torch.from_numpy(wv).double(),
                                         None if bv is None else torch.from_numpy(bv).double(),
                                         stride=stride)
        if residual:
            out = out + torch.from_numpy(feeds["r"]).double()
        return {"ReLU": torch.relu, "Sigmoid": torch.sigmoid}[act](out).numpy()
    return g, ref


CASES = {
    "3x3_bias_relu": _conv(8, 16, (9, 10)),
    "3x3_stride2_residual": _conv(8, 16, (11, 9), stride=2, residual=True),
    "7x7_stem": _conv(3, 24, (20, 18), k=(7, 7), stride=2, pads=(3, 3, 3, 3), bias=False),
    "1x3_many_channels": _conv(40, 48, (6, 30), k=(1, 3), pads=(0, 1, 0, 1),
                               act="Sigmoid"),
    # a pixel block (64) wider than the image's plane rows (7 x 8): a ResNet's last stage
    "1x1_block_wider_than_the_plane": _conv(16, 8, (7, 7), k=(1, 1), pads=(0, 0, 0, 0)),
}
# the kernel without conv_fusion's traffic bound (at these small images the panel moves
# several times the bytes of the convolution and its consumer apart: by default they stay
# apart, test_the_panel_s_bytes_bound_the_fusion below)
KERNEL = "--conv_panel_growth=-1"
FLAGS = {name: KERNEL for name in CASES} | {
    "1x1_block_wider_than_the_plane": f"{KERNEL} --disable_pass=conv_matmul"}


@pytest.fixture(scope="module")
def compiled():
    return {name: graphkernel.compile(g, FLAGS.get(name, ""), env={})
            for name, (g, _) in CASES.items()}


def _feeds(g: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {v.name: rng.standard_normal(tuple(v.shape)).astype(np.float32) for v in g.inputs}


@pytest.mark.parametrize("name", CASES)
def test_a_convolution_and_its_epilogue_are_one_mix_kernel_matching_torch(name, compiled):
    g, ref = CASES[name]
    res = compiled[name]
    assert [k["kind"] for k in launches(res.graph)] == ["mix"]
    (s,) = schedules(res).values()
    assert isinstance(s, ConvSchedule)
    feeds = _feeds(g)
    got, be = run_sim(res, feeds)
    assert not be.unscheduled  # the generated kernel ran, not the reference
    np.testing.assert_allclose(got[0], ref(feeds), rtol=1e-4, atol=1e-5)
    (st,) = be.stats.values()
    (kernel,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    # the traffic model's count is the simulator's: input rows per unit, the panel written
    # and read back, the weights per unit, the epilogue's operands
    assert conv_reads(kernel) == (st.gm_read, st.gm_written)
    assert st.gm_read > sum(v.type.numel * 4 for v in kernel.inputs)  # the panel's bytes


def test_the_units_are_spread_over_the_cores():
    """More units than blocks would take them round robin; each block registers its object
    with the tiling's core count, and a block's panel is its own part of the workspace."""
    g, ref = _conv(4, 8, (40, 40))
    res = graphkernel.compile(g, KERNEL, env={})
    feeds = _feeds(g)
    got, be = run_sim(res, feeds)
    (st,) = be.stats.values()
    assert st.block_dim > 1
    np.testing.assert_allclose(got[0], ref(feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,why", [({"group": 2}, "2 groups"),
                                       ({"dilations": [2, 2]}, "dilations")])
def test_a_convolution_outside_the_kernel_s_model_keeps_its_launches(attrs, why):
    g = Graph("grouped")
    x = g.add_input("x", TensorType((2, 8, 9, 9), "float32"))
    cin = 8 // attrs.get("group", 1)
    w = g.const(RNG.standard_normal((8, cin, 3, 3)).astype("float32"))
    y = g.add_node("Conv2D", [x, w], {"pads": [2, 2, 2, 2], **attrs}).output
    g.set_outputs([g.add_node("ReLU", [y]).output])
    res = graphkernel.compile(g, KERNEL, env={})
    assert sorted(k["kind"] for k in launches(res.graph)) == ["cube", "vector"]
    assert not [a for a in res.analyses.fusion_attempts if a.pattern == "conv_fusion"]
    from graphkernel.codegen.cube.conv import refusal

    (conv,) = [n for n in res.graph.nodes if n.op == "Conv2D"]
    assert why in refusal(conv)


def test_a_reduction_after_the_convolution_is_refused_and_the_graph_kept():
    """A consumer the epilogue cannot run (a mean over the pixels) is refused, and the graph
    is the one compiled without the pass, names included: the convolution with its bias,
    the numbers right."""
    g = Graph("conv_mean")
    x = g.add_input("x", TensorType((2, 4, 8, 8), "float32"))
    w = g.const(RNG.standard_normal((6, 4, 3, 3)).astype("float32"))
    y = g.add_node("Conv2D", [x, w, g.const(RNG.standard_normal(6).astype("float32"))],
                   {"pads": [1, 1, 1, 1]}).output
    s = g.add_node("ReduceSum", [g.add_node("ReLU", [y]).output],
                   {"axis": [2, 3], "keep_dims": False}).output
    g.set_outputs([s])
    res = graphkernel.compile(g, KERNEL, env={})
    assert not [a for a in res.analyses.fusion_attempts if a.pattern == "conv_fusion"]
    convs = [n for n in res.graph.nodes if n.op == "Conv2D"]
    assert len(convs) == 1 and len(convs[0].inputs) == 3
    without = graphkernel.compile(g, "--disable_pass=conv_fusion", env={})
    assert format_graph(res.graph) == format_graph(without.graph)
    feeds = _feeds(g)
    got, _ = run_sim(res, feeds)
    from graphkernel.bisect import Evaluator

    assert not Evaluator(g, feeds).judge(got).bad


def test_a_convolution_whose_panel_costs_more_than_its_launch_stays_apart():
    """The joined kernel writes and reads back the im2col panel (``C*kh*kw`` values per output
    pixel); on a large image that costs more time at the target's HBM rate than the launch it
    saves, and the convolution stays apart (the same graph as without the pass), with the
    reason in the pass's notes. The small image of the same convolution is joined."""
    def graph(hw):
        g = Graph("big")
        x = g.add_input("x", TensorType((1, 32, hw, hw), "float32"))
        w = g.const(RNG.standard_normal((32, 32, 3, 3)).astype("float32"))
        y = g.add_node("Conv2D", [x, w], {"pads": [1, 1, 1, 1]}).output
        g.set_outputs([g.add_node("ReLU", [y]).output])
        return g

    small = graphkernel.compile(graph(8), KERNEL, env={})
    assert sorted(k["kind"] for k in launches(small.graph)) == ["mix"]
    big = graph(128)
    res = graphkernel.compile(big, KERNEL, env={})
    assert sorted(k["kind"] for k in launches(res.graph)) == ["cube", "vector"]
    without = graphkernel.compile(big, "--disable_pass=conv_fusion", env={})
    assert format_graph(res.graph) == format_graph(without.graph)
    rec = next(p for p in res.report.passes if p.name == "conv_fusion")
    assert any("im2col panel moves" in n and "more than the" in n for n in rec.notes)


def _ratio(res) -> float:
    r = res.report.extra
    return r["gm_bytes_fused"] / r["gm_bytes_ideal"]


def test_the_panel_s_bytes_bound_the_fusion():
    """The joined kernel writes and reads back its im2col panel, several times the bytes of the
    convolution and its consumer apart on a small image: beyond ``conv_panel_growth``
    percent (5 by default) more bytes than apart the convolution stays apart (the graph
    compiled without the pass, the reason in the pass's notes) and the model's fused/ideal
    GM bytes stay within 1.05; with the bound off or wide enough, one MIX kernel."""
    g, _ = CASES["3x3_bias_relu"]
    res = graphkernel.compile(g, "", env={})
    assert sorted(k["kind"] for k in launches(res.graph)) == ["cube", "vector"]
    without = graphkernel.compile(g, "--disable_pass=conv_fusion", env={})
    assert format_graph(res.graph) == format_graph(without.graph)
    rec = next(p for p in res.report.passes if p.name == "conv_fusion")
    assert any("more than conv_panel_growth=5%" in n for n in rec.notes), rec.notes
    assert _ratio(res) <= 1.05
    joined = graphkernel.compile(g, KERNEL, env={})
    assert [k["kind"] for k in launches(joined.graph)] == ["mix"]
    assert _ratio(joined) > 1.05
    (kernel,) = [n for n in joined.graph.nodes if n.op == "GraphKernel"]
    read, written = conv_reads(kernel)
    apart = sum(k["bytes_read"] + k["bytes_written"] for k in launches(without.graph))
    growth = 100 * (read + written) // apart - 100  # the percent the panel adds, rounded down
    wide = graphkernel.compile(g, f"--conv_panel_growth={growth}", env={})
    assert [k["kind"] for k in launches(wide.graph)] == ["cube", "vector"]
    wide = graphkernel.compile(g, f"--conv_panel_growth={growth + 1}", env={})
    assert [k["kind"] for k in launches(wide.graph)] == ["mix"]


def test_a_panel_within_the_bound_joins_by_default():
    """A strided 1x1 convolution (kept as a convolution: the product of a strided view needs
    a kernel of its own) reads only the pixels it uses: its panel is a subset of the input,
    and joined with its epilogue the kernel moves fewer bytes than the two apart, so it
    joins under the default bound, matching torch in the simulator."""
    g, ref = _conv(16, 32, (16, 16), k=(1, 1), stride=2, pads=(0, 0, 0, 0))
    res = graphkernel.compile(g, "", env={})
    assert [k["kind"] for k in launches(res.graph)] == ["mix"]
    assert _ratio(res) <= 1.0
    feeds = _feeds(g)
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    np.testing.assert_allclose(got[0], ref(feeds), rtol=1e-4, atol=1e-5)


def _broken(edit, match):
    g, _ = CASES["3x3_bias_relu"]
    res = graphkernel.compile(g, KERNEL, env={})

    def hook(name, files):
        return {f: edit(t) if f.endswith(".cpp") and "tiling" not in f else t
                for f, t in files.items()}

    backend.CORRUPT.append(hook)
    try:
        with pytest.raises(SimulatorError, match=match):
            run_sim(res, _feeds(g))
    finally:
        backend.CORRUPT.remove(hook)


def test_a_panel_read_before_its_copies_are_complete_fails():
    """Without the scalar unit's wait for the panel's MTE3 copies the request to the cube core
    could overtake them: the simulator refuses the Iterate."""
    _broken(lambda t: re.sub(r".*_Sync<HardEvent::MTE3_S>\(pipe\);.*\n", "", t),
            "MTE3_S")


def test_a_panel_rewritten_while_the_cube_core_reads_it_fails():
    """A copy into the panel between two Iterate calls (the next unit's panel built too early)
    is a write under the cube core's reads."""
    _broken(lambda t: t.replace("mm.GetTensorC(c);", "mm.GetTensorC(c);\n"
                                "            DataCopy(gp[0], stg, 8);"),
            "rewritten .* while the cube core reads it")


def test_a_misaligned_window_offset_fails():
    """A tap's base offset off the element size (the plane's guard miscounted by half an
    element) is refused by the Gather, not read across two elements."""
    _broken(lambda t: re.sub(r"(Gather\(stg\[0\], pln, tb, )(\d+)u", r"\g<1>2u", t),
            "not a multiple of 4")


def test_the_trial_kernel_takes_an_outer_value_named_like_its_own():
    """The fusion trial builds the joined kernel apart from the graph: its bias Add's value
    is named ``add``; a residual input of the consumer named ``add`` as well (a torch
    model's first addition) is taken under a fresh name, not refused as a clash (the
    PoolFormer block's convolutions)."""
    g = Graph("named")
    x = g.add_input("x", TensorType((2, 8, 6, 6), "float32"))
    r = g.add_input("add", TensorType((2, 16, 6, 6), "float32"))
    wv = (RNG.standard_normal((16, 8, 3, 3)) / 8).astype("float32")
    bv = RNG.standard_normal(16).astype("float32")
    y = g.add_node("Conv2D", [x, g.const(wv), g.const(bv)],
                   {"strides": [1, 1], "pads": [1, 1, 1, 1]}).output
    y = g.add_node("ReLU", [g.add_node("Add", [y, r]).output]).output
    g.set_outputs([y])
    res = graphkernel.compile(g, KERNEL, env={})
    assert [k["kind"] for k in launches(res.graph)] == ["mix"]
    feeds = _feeds(g)
    got, _ = run_sim(res, feeds)
    conv = torch.nn.functional.conv2d(torch.from_numpy(feeds["x"]).double(),
                                      torch.from_numpy(wv).double(),
                                      torch.from_numpy(bv).double(), padding=1)
    want = torch.relu(conv + torch.from_numpy(feeds["add"]).double()).numpy()
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
