import numpy as np

from tests.patterns.conftest import G, attempts, fuse, kernels, reasons

FWD_D = "elemwise_broadcast_fwd_depth"
BWD_W = "elemwise_broadcast_bwd_width"
ONLY_FWD = "--enable_fusion_pattern_only=elemwise_broadcast_fwd_depth"


def chain():
    b = G()
    x = b.input("x", (4, 8))
    e = b.op("Exp", x, name="e")
    n = b.op("Neg", e, name="n")
    return b.out(b.op("Abs", n, name="a"))


def test_fwd_depth_fuses_a_chain():
    res = fuse(chain(), ONLY_FWD)
    assert kernels(res) == [{"e", "n", "a"}]
    assert len(attempts(res, FWD_D, "fused")) == 2


def test_fwd_depth_needs_the_only_consumer():
    b = G()
    x = b.input("x", (4, 8))
    e = b.op("Exp", x, name="e")
    n = b.op("Neg", e, name="n")
    res = fuse(b.out(n, b.op("Abs", e, name="a")), ONLY_FWD)
    assert kernels(res) == []
    assert "producer e has other consumers" in reasons(res, FWD_D)


def test_fwd_depth_rejects_a_broadcast_edge_and_a_size_mismatch():
    b = G()
    x = b.input("x", (4, 8))
    y = b.input("y", (4, 1))
    small = b.op("Exp", y, name="small")           # [4,1] feeds a [4,8] op: BROADCAST edge
    big = b.op("Add", small, x, name="big")
    res = fuse(b.out(big), ONLY_FWD)
    assert kernels(res) == []
    assert any(r.startswith("edge relation: small -> big is BROADCAST")
               for r in reasons(res, FWD_D))


def test_fwd_depth_rejects_a_reduce_producer():
    b = G()
    x = b.input("x", (4, 8))
    s = b.op("ReduceSum", x, name="s", axis=[1], keep_dims=True)
    res = fuse(b.out(b.op("Exp", s, name="e")), ONLY_FWD)
    assert kernels(res) == []
    assert "kind mismatch: producer s is REDUCE (needs <= BROADCAST)" in reasons(res, FWD_D)


def test_fwd_width_pulls_every_qualifying_producer():
    b = G()
    x, y = b.input("x", (4, 8)), b.input("y", (4, 8))
    p1, p2 = b.op("Exp", x, name="p1"), b.op("Neg", y, name="p2")
    res = fuse(b.out(b.op("Add", p1, p2, name="add")),
               "--enable_fusion_pattern_only=elemwise_broadcast_fwd_width")
    assert kernels(res) == [{"p1", "p2", "add"}]


def test_bwd_width_pushes_into_all_consumers_of_equal_size():
    b = G()
    x = b.input("x", (4, 8))
    e = b.op("Exp", x, name="e")
    s1 = b.op("ReduceSum", e, name="s1", axis=[1])
    s2 = b.op("ReduceMax", e, name="s2", axis=[1])
    res = fuse(b.out(s1, s2), f"--enable_fusion_pattern_only={BWD_W}")
    assert kernels(res) == [{"e", "s1", "s2"}]


def test_bwd_rejects_graph_outputs_and_size_mismatch():
    b = G()
    x = b.input("x", (4, 8))
    e = b.op("Exp", x, name="e")
    s1 = b.op("ReduceSum", e, name="s1", axis=[1])
    t = b.op("Neg", b.op("Reshape", e, name="r", shape=[32]), name="t")
    res = fuse(b.out(s1, t, e), f"--enable_fusion_pattern_only={BWD_W}")
    assert kernels(res) == []
    assert "e is a graph output" in reasons(res, BWD_W)


def test_bwd_into_a_reduce_needs_an_elementwise_area():
    b = G()
    x, y = b.input("x", (4, 8)), b.input("y", (4, 1))
    bc = b.op("Add", x, y, name="bc")                # a BROADCAST area
    s1 = b.op("ReduceSum", bc, name="s1", axis=[1])
    s2 = b.op("ReduceSum", bc, name="s2", axis=[0])
    res = fuse(b.out(s1, s2), f"--enable_fusion_pattern_only={BWD_W}")
    assert kernels(res) == []
    assert any("takes only an ELEMWISE area" in r for r in reasons(res, BWD_W))


def test_bwd_width_cycle_is_refused():
    """a -> c1 -> y -> c2 and a -> c2: pushing a into c1 and c2 would trap y in a cycle."""
    b = G()
    x = b.input("x", (4, 8))
    a = b.op("Exp", x, name="a")
    c1 = b.op("Neg", a, name="c1")
    y = b.op("CumSum", c1, name="y", axis=1)          # not fusable: outside every kernel
    c2 = b.op("Add", a, y, name="c2")
    res = fuse(b.out(c1, c2), f"--enable_fusion_pattern_only={BWD_W}")
    for k in kernels(res):
        assert not {"c1", "c2"} <= k


def test_bwd_size_limit():
    b = G()
    x = b.input("x", (4, 8))
    v = x
    for i in range(4):
        v = b.op("Exp", v, name=f"e{i}")
    s1 = b.op("ReduceSum", v, name="s1", axis=[1])
    s2 = b.op("ReduceMax", v, name="s2", axis=[1])
    res = fuse(b.out(s1, s2), "--enable_fusion_pattern_only=elemwise_broadcast_fwd_depth,"
                              f"{BWD_W} --broadcast_fuse_depth=3")
    assert "size limit: 4 ops > broadcast_fuse_depth=3" in reasons(res, BWD_W)


def test_disabling_removes_exactly_its_fusions():
    on = fuse(chain())
    off = fuse(chain(), f"--disable_fusion_pattern={FWD_D}")
    assert attempts(on, FWD_D, "fused") and not attempts(off, FWD_D, "fused")
    assert [a.reason for a in attempts(off, FWD_D)] == [
        f"pattern disabled by flag --disable_fusion_pattern={FWD_D}"]
    off_all = fuse(chain(), "--disable_fusion_pattern=elemwise_broadcast*")
    assert not any(a.pattern.startswith("elemwise_broadcast") and a.verdict == "fused"
                   for a in off_all.analyses.fusion_attempts)


def test_bwd_width_needs_consumers_of_equal_compute_size():
    b = G()
    x, y = b.input("x", (4, 8)), b.input("y", (2, 4, 8))
    a = b.op("Exp", x, name="a")
    c1 = b.op("Neg", a, name="c1")            # 32 elements
    c2 = b.op("Mul", a, y, name="c2")         # 64 elements
    res = fuse(b.out(c1, c2), f"--enable_fusion_pattern_only={BWD_W}")
    assert kernels(res) == []
    assert any(r.startswith("compute size mismatch among consumers") for r in reasons(res, BWD_W))


def _embedding_norm(table_shape, axis):
    """Token embeddings plus a table broadcast over the batch, normalised over ``axis`` (a
    LayerNorm's first half: the mean and the centred values)."""
    b = G()
    x, t = b.input("x", (2, 16, 64)), b.input("t", table_shape)
    e = b.op("Add", x, t, name="e")                   # a BROADCAST area
    s = b.op("ReduceSum", e, name="s", axis=[axis], keep_dims=True)
    d = b.op("Sub", e, b.op("Mul", s, b.const(1 / 64), name="m"), name="d")
    return b.out(d)


def test_bwd_into_a_reduce_takes_a_broadcast_of_whole_rows():
    res = fuse(_embedding_norm((1, 16, 64), 2))
    assert kernels(res) == [{"e", "s", "m", "d"}]
    assert attempts(res, BWD_W, "fused")


def test_bwd_into_a_reduce_refuses_a_broadcast_along_the_reduced_axis():
    # a per-row value spread over the row the reduction sums, and a reduction over the
    # batch axis the table is broadcast along: neither repeats whole rows
    for shape, axis in (((2, 16, 1), 2), ((1, 16, 64), 0)):
        res = fuse(_embedding_norm(shape, axis))
        assert not any({"e", "s"} <= k for k in kernels(res)), (shape, axis)
        assert any("takes only an ELEMWISE area" in r for r in reasons(res, BWD_W))


def _rms_times(c_shape):
    """An RMS scale computed from ``c`` and broadcast into ``h * c`` of ``[4, 6, 8]``."""
    b = G()
    h, c = b.input("h", (4, 6, 8)), b.input("c", c_shape)
    n = b.op("Mul", b.op("Rsqrt", c, name="r"), b.const(2.0), name="n")
    return b.out(b.op("Mul", h, n, name="m"))


def test_bwd_does_not_push_a_computed_value_into_a_middle_axis_broadcast():
    """``[4, 1, 8]`` into ``[4, 6, 8]``: a computed value that varies along the rows'
    columns and their blocks but not the rows between -- the vector kernels cannot place it
    (they split such a kernel op by op); a per-row ``[4, 6, 1]`` or per-column ``[1, 1, 8]``
    one joins its consumer."""
    only = "--enable_fusion_pattern_only=elemwise_broadcast_fwd_depth,elemwise_broadcast_bwd_depth"
    res = fuse(_rms_times((4, 1, 8)), only)
    assert {"r", "n", "m"} not in kernels(res)
    assert any("broadcast over a middle axis" in r
               for r in reasons(res, "elemwise_broadcast_bwd_depth"))
    for shape in ((4, 6, 1), (1, 1, 8)):
        assert {"r", "n", "m"} in kernels(fuse(_rms_times(shape), only))


def test_bwd_size_limit_counts_the_ops_that_compute():
    """A view in the chain (a convolution's result squeezed before its activation) computes
    nothing: three ops and a Squeeze are within broadcast_fuse_depth=3, four ops are not."""
    for n_ops, fused in ((3, True), (4, False)):
        b = G()
        x = b.input("x", (4, 1, 8))
        v = b.op("Squeeze", x, name="sq", axis=[1])
        for i in range(n_ops):
            v = b.op("Exp", v, name=f"e{i}")
        s1 = b.op("ReduceSum", v, name="s1", axis=[1])
        s2 = b.op("ReduceMax", v, name="s2", axis=[1])
        res = fuse(b.out(s1, s2), "--enable_fusion_pattern_only=elemwise_broadcast_fwd_depth,"
                                  f"{BWD_W} --broadcast_fuse_depth=3")
        assert bool(attempts(res, BWD_W, "fused")) == fused, reasons(res, BWD_W)
        if not fused:
            assert f"size limit: {n_ops} ops > broadcast_fuse_depth=3" in reasons(res, BWD_W)


def _residual_norm(read_outside: bool = False):
    """``h = a + b`` leaving the graph (a residual sum before a graph break) and normalised
    there (RMSNorm with a weight); with ``read_outside``, h also read by an op the region
    cannot take (a TopK)."""
    from graphkernel import Graph, TensorType

    g = Graph()
    a = g.add_input("a", TensorType((4, 16, 64), "float32"))
    b = g.add_input("b", TensorType((4, 16, 64), "float32"))
    w = g.add_input("w", TensorType((64,), "float32"))
    h = g.add_node("Add", [a, b]).output
    sq = g.add_node("Mul", [h, h]).output
    ms = g.add_node("ReduceMean", [sq], {"axis": [-1], "keep_dims": True}).output
    r = g.add_node("Rsqrt", [g.add_node("Add", [ms, g.const(np.float32(1e-6))]).output]).output
    y = g.add_node("Mul", [g.add_node("Mul", [h, r]).output, w]).output
    outs = [h, y]
    if read_outside:
        outs.append(g.add_node("TopK", [h], {"k": 2, "axis": -1}).outputs[0])
    g.set_outputs(outs)
    return g


def test_a_residual_sum_that_leaves_the_graph_joins_its_norm():
    """The sum is a graph output and its norm's input: one kernel computes it, stores it and
    normalises it (two launches before: the sum alone, then the norm reading it back);
    simulated outputs as the reference."""
    import graphkernel
    from graphkernel.codegen.backend import run_sim
    from graphkernel.interpreter import run_graph
    from graphkernel.torch import launch_counts

    g = _residual_norm()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 1, launch_counts(res.graph)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs}
    outs, _ = run_sim(res, feeds)
    got = outs if isinstance(outs, list) else list(outs.values())
    for o, want in zip(got, run_graph(g, feeds), strict=True):
        np.testing.assert_allclose(np.asarray(o), want, rtol=1e-5, atol=1e-6)


def test_a_residual_sum_read_outside_the_region_stays_apart():
    """Read also by an op no kernel takes: the sum stays a launch of its own, as before."""
    import graphkernel
    from graphkernel.torch import launch_counts

    res = graphkernel.compile(_residual_norm(read_outside=True), "--opt_level=2", env={})
    kernels = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    (norm,) = [k for k in kernels if "Rsqrt" in {m.op for m in k.subgraph.nodes}]
    assert [m.op for m in norm.subgraph.nodes].count("Add") == 1  # (its epsilon's only)
    assert sum(launch_counts(res.graph).values()) == 3, launch_counts(res.graph)
