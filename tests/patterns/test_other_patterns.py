from tests.patterns.conftest import G, attempts, fuse, kernels, reasons


def test_reshape_joins_its_lower_kind_neighbour():
    b = G()
    x = b.input("x", (4, 8))
    e = b.op("Exp", x, name="e")
    r = b.op("Reshape", e, name="r", shape=[32])
    res = fuse(b.out(b.op("ReduceSum", r, name="s", axis=[0])),
               "--enable_fusion_pattern_only=reshape")
    assert kernels(res) == [{"e", "r"}]  # the producer (ELEMWISE) is lower than the reduce


def test_isolate_reshape_joins_a_fused_consumer():
    b = G()
    x = b.input("x", (4, 8))
    r = b.op("Reshape", x, name="r", shape=[32])
    e = b.op("Exp", r, name="e")
    res = fuse(b.out(b.op("Neg", e, name="n"), r),
               "--enable_fusion_pattern_only=elemwise_broadcast_fwd_depth,isolate_reshape")
    assert kernels(res) == [{"r", "e", "n"}]


def test_slice_fuses_into_elementwise_consumers():
    b = G()
    x = b.input("x", (4, 8))
    sl = b.op("Slice", x, name="sl", begin=[0, 2], size=[4, 4])
    res = fuse(b.out(b.op("Exp", sl, name="e")), "--enable_fusion_pattern_only=slice")
    assert kernels(res) == [{"sl", "e"}]
    res = fuse(b.out(b.op("Exp", sl, name="e2"), sl), "--enable_fusion_pattern_only=slice")
    assert "sl is a graph output" in reasons(res, "slice")


def test_elemany_addn():
    b = G()
    x = b.input("x", (4, 8))
    bad = b.op("LogicalNot", b.op("IsFinite", x, name="fin"), name="nf")
    res = fuse(b.out(b.op("ElemAny", b.op("Cast", bad, name="c", dtype="float32"), name="any")),
               "--enable_fusion_pattern_only=elemany_addn")
    assert any("any" in k for k in kernels(res))


def test_matmul_depth_grows_the_epilogue_and_stops_at_a_reduction():
    b = G()
    x = b.input("x", (4, 8))
    w = b.const([[0.5] * 3] * 8)
    mm = b.op("MatMul", x, w, name="mm")
    res = fuse(b.out(b.op("Add", mm, b.const([1.0, 2.0, 3.0]), name="bias")),
               "--enable_fusion_pattern_only=matmul_depth")
    assert kernels(res) == [{"mm", "bias"}]
    # the product read by two consumers (x * exp(x), SiLU's shape), then a residual add
    mm2 = b.op("MatMul", x, w, name="mm2")
    act = b.op("Mul", mm2, b.op("Exp", mm2, name="e"), name="act")
    res = fuse(b.out(b.op("Add", act, b.input("r", (4, 3)), name="res")),
               "--enable_fusion_pattern_only=matmul_depth")
    assert kernels(res) == [{"mm2", "e", "act", "res"}]
    mm3 = b.op("MatMul", x, w, name="mm3")
    res = fuse(b.out(b.op("ReduceSum", b.op("Exp", mm3, name="ex"), name="sum", axis=[1])),
               "--enable_fusion_pattern_only=matmul_depth")
    assert kernels(res) == [{"mm3", "ex"}]
    assert "kind mismatch: consumer sum is REDUCE" in reasons(res, "matmul_depth")


def test_gather_pattern_runs_at_level_3_only():
    b = G()
    x, i = b.input("x", (4, 8)), b.const([0, 2, 1], "int32")
    g = b.out(b.op("Gather", b.op("Exp", x, name="e"), i, name="ga", axis=0))
    res2 = fuse(g, "--opt_level=2")
    assert not attempts(res2, "gather", "fused")
    assert any(a.reason == "pattern level 3 > opt_level 2"
               for a in res2.analyses.fusion_attempts if a.pattern == "gather")
    assert attempts(fuse(g, "--opt_level=3"), "gather", "fused")
    assert attempts(fuse(g, "--opt_level=2 --autofuse_enable_pass=gather"), "gather", "fused")


def test_concat_pattern_runs_at_level_2_where_the_generator_takes_it():
    """Pieces of different shapes are pulled in only when one op ends every operand (it runs
    once after the Concat); otherwise explain says why."""
    for second, fused in (("Exp", True), ("Neg", False)):
        b = G()
        x, y = b.input("x", (4, 8)), b.input("y", (2, 8))
        c = b.op("Concat", b.op("Exp", x, name="e"), b.op(second, y, name="m"), name="c",
                 axis=0)
        g = b.out(c)
        res = fuse(g, "--opt_level=2")
        assert bool(attempts(res, "concat", "fused")) == fused
        if not fused:
            assert any("not computed by the same elementwise ops" in a.reason
                       for a in res.analyses.fusion_attempts if a.pattern == "concat")
    assert not attempts(fuse(g, "--opt_level=1"), "concat", "fused")


def test_transpose_pattern_runs_at_level_2_unless_the_last_axis_moves():
    """The code generator stores the rows of a transposed computed value; a transpose of the
    last axis it cannot generate, so the pattern refuses it and says why."""
    for perm, fused in (([1, 0, 2], True), ([0, 2, 1], False)):
        b = G()
        x = b.input("x", (4, 8, 16))
        g = b.out(b.op("Transpose", b.op("Exp", x, name="e"), name="t", perm=perm))
        res = fuse(g, "--opt_level=2")
        assert bool(attempts(res, "transpose", "fused")) == fused
        if not fused:
            assert any("moves the last axis" in a.reason for a in res.analyses.fusion_attempts
                       if a.pattern == "transpose")
    assert not attempts(fuse(g, "--opt_level=1"), "transpose", "fused")


def test_composite_op_limit_size():
    b = G()
    x = b.input("x", (4, 8))
    v = x
    for i in range(6):
        v = b.op("Exp", v, name=f"e{i}")
    res = fuse(b.out(v), "--composite_op_limit_size=4")
    assert all(len(k) <= 4 for k in kernels(res))
    assert any("size limit" in a.reason for a in res.analyses.fusion_attempts)
    assert kernels(fuse(b.out(v), "--max_fusion_size=0")) == []  # AutoFuse: 0 disables fusion
