"""recompute (level 2) and parallel_fusion (level 3), as the fusion stages decide them (the
codegen pass, which may unfuse what it cannot generate, is off here)."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import Interpreter, random_inputs


def fusion(g, flags: str):
    return graphkernel.compile(g, f"--disable_pass=codegen {flags}")


def check_same(g, res):
    feeds = random_inputs(g, 0)
    for a, b in zip(Interpreter(g, "float64").run(feeds),
                    Interpreter(res.graph, "float64").run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12)


def broadcast_into_two_reductions() -> Graph:
    g = Graph("rc")
    x = g.add_input("x", TensorType((64, 256), "float32"))
    b = g.add_input("b", TensorType((256,), "float32"))
    e = g.add_node("Exp", [g.add_node("BroadcastTo", [b], {"shape": [64, 256]},
                                      name="bcast").output], name="e").output
    s1 = g.add_node("ReduceSum", [g.add_node("Mul", [x, e], name="m1").output], {"axis": [1]},
                    name="s1").output
    s2 = g.add_node("ReduceMax", [g.add_node("Add", [x, e], name="a2").output], {"axis": [0]},
                    name="s2").output
    g.set_outputs([s1, s2])
    return g


def kernels(res):
    return [n for n in res.graph.nodes if n.op == "GraphKernel"]


def test_recompute_duplicates_a_cheap_broadcast_into_its_consumers():
    g = broadcast_into_two_reductions()
    off = fusion(g, "--opt_level=1")
    on = fusion(g, "--opt_level=2")
    check_same(g, on)
    assert len(kernels(off)) == 3 and len(kernels(on)) == 2
    ex_off, ex_on = off.report.extra, on.report.extra
    assert ex_on["gm_bytes_fused"] < ex_off["gm_bytes_fused"]
    rec = next(p for p in on.report.passes if p.name == "recompute")
    assert rec.rewrites == 1 and "recomputed" in rec.notes[0]
    assert all("recompute" in k.attrs["pattern"] for k in kernels(on))
    assert all("bcast" in k.origin for k in kernels(on))  # the duplicated user nodes are named


def test_recompute_can_be_switched_by_flag_and_respects_the_size_limit():
    g = broadcast_into_two_reductions()
    assert len(kernels(fusion(g, "--opt_level=2 --enable_recompute_fusion=false"))) == 3
    assert len(kernels(fusion(g, "--opt_level=1 --enable_recompute_fusion"))) == 2
    res = fusion(g, "--opt_level=2 --composite_op_limit_size=3")
    assert all(sum(m.op != "Constant" for m in k.subgraph.nodes) <= 3 for k in kernels(res))


def test_parallel_fusion_launches_independent_kernels_sharing_an_input_together():
    g = Graph("par")
    x = g.add_input("x", TensorType((64, 256), "float32"))
    s1 = g.add_node("ReduceSum", [g.add_node("Exp", [x], name="e").output], {"axis": [1]},
                    name="s1").output
    # (elementwise beside the reduction: two kernels reducing the same axes of one value
    # join at level 2, in sibling_fusion; parallel fusion takes any two)
    s2 = g.add_node("Mul", [g.add_node("Neg", [x], name="n").output, x], name="s2").output
    g.set_outputs([s1, s2])
    two = fusion(g, "--opt_level=2")
    one = fusion(g, "--opt_level=3")
    check_same(g, one)
    assert len(kernels(two)) == 2 and len(kernels(one)) == 1
    assert kernels(one)[0].attrs["pattern"].startswith("parallel(")
    assert one.report.extra["gm_bytes_fused"] < two.report.extra["gm_bytes_fused"]
    assert len(kernels(fusion(g, "--opt_level=2 --enable_parallel_fusion"))) == 1


def test_parallel_fusion_leaves_apart_kernels_the_code_generator_cannot_join():
    """A reduction of the rows and one of the columns have no common loop space (nor q's
    and k's rotary embedding when k has fewer heads): joined, the code generator would split
    them again, so they stay two launches and nothing falls back."""
    g = Graph("apart")
    x = g.add_input("x", TensorType((64, 256), "float32"))
    s1 = g.add_node("ReduceSum", [g.add_node("Exp", [x]).output], {"axis": [1]}).output
    s2 = g.add_node("ReduceMax", [g.add_node("Neg", [x]).output], {"axis": [0]}).output
    g.set_outputs([s1, s2])
    res = graphkernel.compile(g, "--opt_level=3", env={})
    assert len(kernels(res)) == 2
    assert not res.report.extra["fallbacks"]
    assert not any(k.attrs["pattern"].startswith("parallel(") for k in kernels(res))


def test_parallel_fusion_never_merges_dependent_kernels():
    g = Graph("dep")
    x = g.add_input("x", TensorType((64, 256), "float32"))
    k1 = g.add_node("ReduceSum", [g.add_node("Exp", [x], name="e").output], {"axis": [1],
                                                                          "keep_dims": True},
                    name="s1").output
    mid = g.add_node("CumSum", [k1], {"axis": 0}, name="mid").output   # not fusable
    y = g.add_node("Add", [g.add_node("Neg", [x], name="n").output, mid], name="y").output
    g.set_outputs([g.add_node("ReduceMax", [y], {"axis": [0]}, name="s2").output])
    res = fusion(g, "--opt_level=3")
    res.graph.validate()
    check_same(g, res)
    assert len(kernels(res)) == 2  # the second depends on the first through CumSum


def test_promote_precision_computes_fp16_kernels_in_fp32_and_rounds_at_outputs():
    g = Graph("p16")
    x = g.add_input("x", TensorType((8, 64), "float16"))
    e = g.add_node("Exp", [g.add_node("Mul", [x, g.const(np.float16(0.5))]).output]).output
    s = g.add_node("ReduceSum", [e], {"axis": [1], "keep_dims": True}).output
    g.set_outputs([g.add_node("Div", [e, s]).output])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    (k,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    inner = [n for n in k.subgraph.nodes if n.op not in ("Constant", "Cast")]
    assert all(v.dtype.value == "float32" for n in inner for v in n.outputs)
    assert k.subgraph.outputs[0].dtype.value == "float16"  # rounded once, at the output
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float16)}
    ref = Interpreter(g, "float64").run(feeds)[0]
    promoted = Interpreter(res.graph).run(feeds)[0].astype(np.float64)
    op_by_op = Interpreter(g).run(feeds)[0].astype(np.float64)
    assert np.abs(promoted - ref).max() <= np.abs(op_by_op - ref).max()
    low = graphkernel.compile(g, "--opt_level=2 --enable_low_precision", env={})
    (k,) = [n for n in low.graph.nodes if n.op == "GraphKernel"]
    assert any(v.dtype.value == "float16" for n in k.subgraph.nodes if n.op == "Exp"
               for v in n.outputs)


def scan_read_by_two() -> Graph:
    """A running sum read by two kernels the patterns keep apart (a scan joins a single
    consumer only): exp of it, transposed, and the row's last value minus it."""
    g = Graph("sib")
    x = g.add_input("x", TensorType((16, 2, 32), "float32"))
    t = g.add_node("CumSum", [x], {"axis": -1}, name="cs").output
    e = g.add_node("Transpose", [g.add_node("Exp", [t], name="e").output],
                   {"perm": [1, 0, 2]}, name="te").output
    n = g.add_node("Transpose", [g.add_node("Neg", [t], name="n").output],
                   {"perm": [1, 0, 2]}, name="tn").output
    g.set_outputs([e, n])
    return g


def test_sibling_fusion_joins_two_kernels_reading_one_value_in_one_loop_space():
    g = scan_read_by_two()
    off = fusion(g, "--opt_level=2 --disable_pass=sibling_fusion")
    on = fusion(g, "--opt_level=2")
    check_same(g, on)
    assert len(kernels(on)) == len(kernels(off)) - 1
    joined = [k for k in kernels(on) if k.attrs["pattern"].startswith("parallel(")]
    assert len(joined) == 1 and {"e", "n"} <= set(joined[0].origin)
    assert on.report.extra["gm_bytes_fused"] < off.report.extra["gm_bytes_fused"]
    step = next(p for p in on.report.passes if p.name == "sibling_fusion")
    assert step.rewrites == 1 and "cs" in step.notes[1]
    # generated: the joined kernel is kept, nothing falls back
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra["fallbacks"]
    assert len(kernels(res)) == len(kernels(on))


def test_sibling_fusion_leaves_kernels_of_other_loop_spaces_apart():
    """A reader computing in another shape (a row sum of the running values) is a kernel of
    another loop space: not joined at level 2 (parallel_fusion may, at level 3)."""
    g = Graph("sib2")
    x = g.add_input("x", TensorType((16, 2, 32), "float32"))
    t = g.add_node("CumSum", [x], {"axis": -1}, name="cs").output
    e = g.add_node("Transpose", [g.add_node("Exp", [t], name="e").output],
                   {"perm": [1, 0, 2]}, name="te").output
    s = g.add_node("ReduceMax", [g.add_node("Neg", [t], name="n").output], {"axis": [0]},
                   name="s").output
    g.set_outputs([e, s])
    on = fusion(g, "--opt_level=2")
    assert len(kernels(on)) == len(kernels(fusion(g, "--opt_level=2 "
                                                     "--disable_pass=sibling_fusion")))
    assert not any(k.attrs["pattern"].startswith("parallel(") for k in kernels(on))


def rotated_pair(k_heads: int = 4) -> Graph:
    """Q and K, the two parts of one computed projection [B, S, 4 + k_heads, D] (a Split of
    its heads, as a fused projection's), each rotated by one constant table [S, D]
    broadcast over the heads: two kernels reading parts of one value."""
    g = Graph("rot")
    x = g.add_input("x", TensorType((2, 16, 4 + k_heads, 16), "float32"))
    y = g.add_node("Mul", [x, g.const(np.float32(0.5))], name="proj").output
    rng = np.random.default_rng(0)
    cos = g.const(rng.standard_normal((16, 1, 16)).astype(np.float32))
    sin = g.const(rng.standard_normal((16, 1, 16)).astype(np.float32))
    parts = g.add_node("Split", [y], {"axis": 2, "sizes": [4, k_heads]}, name="qk").outputs
    outs = []
    for x, name in zip(parts, "qk", strict=True):
        turned = g.add_node("Neg", [x], name=f"{name}_neg").output
        outs.append(g.add_node("Add", [g.add_node("Mul", [x, cos]).output,
                                       g.add_node("Mul", [turned, sin]).output],
                               name=f"{name}_rot").output)
    g.set_outputs(outs)
    return g


def unrelated_pair() -> Graph:
    """Two computations on inputs of their own that share only a constant table."""
    g = Graph("two")
    table = g.const(np.random.default_rng(0).standard_normal((16, 1, 16)).astype(np.float32))
    outs = []
    for name in "ab":
        x = g.add_input(name, TensorType((2, 16, 4, 16), "float32"))
        outs.append(g.add_node("Add", [g.add_node("Mul", [x, table]).output,
                                       g.add_node("Neg", [x]).output]).output)
    g.set_outputs(outs)
    return g


def test_sibling_fusion_joins_kernels_reading_parts_of_one_value_in_one_loop_space():
    """Q's and K's rotary kernels in one shape read parts of one projection (a Split's
    outputs; the angle tables broadcast over the heads): one kernel, one launch fewer."""
    g = rotated_pair()
    off = fusion(g, "--opt_level=2 --disable_pass=sibling_fusion")
    on = fusion(g, "--opt_level=2")
    check_same(g, on)
    assert len(kernels(on)) == len(kernels(off)) - 1
    joined = [k for k in kernels(on) if k.attrs["pattern"].startswith("parallel(")]
    assert len(joined) == 1 and {"q_rot", "k_rot"} <= set(joined[0].origin)
    step = next(p for p in on.report.passes if p.name == "sibling_fusion")
    assert step.rewrites == 1
    assert on.report.extra["gm_bytes_fused"] <= off.report.extra["gm_bytes_fused"]


def test_sibling_fusion_leaves_rotations_of_other_head_counts_apart():
    """K with fewer heads than Q (grouped-query attention) is another loop space."""
    on = fusion(rotated_pair(k_heads=2), "--opt_level=2")
    assert not any(k.attrs["pattern"].startswith("parallel(") for k in kernels(on))


def test_sibling_fusion_leaves_computations_sharing_only_a_constant_apart():
    g = unrelated_pair()
    on = fusion(g, "--opt_level=2")
    assert len(kernels(on)) == 2
    assert not any(k.attrs["pattern"].startswith("parallel(") for k in kernels(on))


def fused_projection_parts() -> Graph:
    """A fused QKV projection's result [B, S, 8 heads, D] (computed, so that its parts are
    not graph inputs): Q (4 heads) and K (2) rotated by a table, V (2) copied out by a lone
    slice (the attention operator reads it whole); each part seen through a head view of its
    own, as Dynamo's graphs have them."""
    g = Graph("qkv_parts")
    x = g.add_input("x", TensorType((2, 16, 128), "float32"))
    y = g.add_node("Mul", [x, g.const(np.float32(0.5))]).output
    table = g.const(np.random.default_rng(1).standard_normal((16, 1, 16)).astype(np.float32))
    outs = []
    for name, lo, hi in (("q", 0, 4), ("k", 4, 6), ("v", 6, 8)):
        heads = g.add_node("Reshape", [y], {"shape": [2, 16, 8, 16]}).output  # one view each
        part = g.add_node("StridedSlice", [heads], {"begin": [lo], "end": [hi], "strides": [1],
                                                    "axes": [2]}, name=name).output
        if name != "v":
            part = g.add_node("Add", [g.add_node("Mul", [part, table]).output,
                                      g.add_node("Neg", [part]).output],
                              name=f"{name}_rot").output
        outs.append(part)
    g.set_outputs(outs)
    return g


def test_sibling_fusion_joins_a_lone_slice_to_a_kernel_reading_the_same_projection():
    """V's copy (a lone StridedSlice launch) joins K's rotation, a kernel of its loop space
    reading the same projection through another slice: one launch fewer; Q (4 heads, another
    loop space) stays apart."""
    g = fused_projection_parts()
    off = fusion(g, "--opt_level=2 --disable_pass=sibling_fusion")
    on = fusion(g, "--opt_level=2")
    check_same(g, on)
    launches = lambda res: [n for n in res.graph.nodes  # noqa: E731
                            if n.op not in ("Constant", "Reshape")]
    assert "StridedSlice" in [n.op for n in launches(off)]
    assert "StridedSlice" not in [n.op for n in launches(on)]
    assert len(launches(on)) == len(launches(off)) - 1
    step = next(p for p in on.report.passes if p.name == "sibling_fusion")
    assert any("a slice copied alone" in note for note in step.notes), step.notes
