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


def test_slice_fuses_into_a_reduction_consumer_but_not_an_opaque_one():
    """A norm of one part of a projection loads its columns in place; a slice a product
    reads stays out (the product is no vector kernel)."""
    b = G()
    x = b.input("x", (4, 8))
    sl = b.op("Slice", x, name="sl", begin=[0, 2], size=[4, 4])
    s = b.op("ReduceSum", b.op("Mul", sl, sl, name="m"), name="s", axis=[1])
    res = fuse(b.out(s), "--enable_fusion_pattern_only=slice,reduce_fwd_depth")
    assert kernels(res) == [{"sl", "m", "s"}]
    b = G()
    x, w = b.input("x", (4, 8)), b.input("w", (4, 3))
    sl = b.op("Slice", x, name="sl", begin=[0, 2], size=[4, 4])
    res = fuse(b.out(b.op("MatMul", sl, w, name="mm")), "--enable_fusion_pattern_only=slice")
    assert kernels(res) == []


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
    assert any("consumer sum writes reduced values" in r for r in reasons(res, "matmul_depth"))


def _norm_after_product(b, n=3, dtype="float32", axis=-1, gpt2=False, bias=True):
    """x·w (+ bias) + residual, then a LayerNorm along ``axis``, read by a second product;
    with ``gpt2`` the residual sum is read by it instead (the next layer's residual)."""
    x = b.input("x", (4, 8), dtype)
    mm = b.op("MatMul", x, b.input("w", (8, n), dtype), name="mm")
    if bias:
        mm = b.op("Add", mm, b.input("bias", (n,), dtype), name="bias")
    s = b.op("Add", mm, b.input("r", (4, n), dtype), name="res")
    mean = b.op("Div", b.op("ReduceSum", s, name="sum", axis=[axis], keep_dims=True),
                b.const(float(n), dtype), name="mean")
    d = b.op("Sub", s, mean, name="d")
    var = b.op("ReduceSum", b.op("Mul", d, d, name="sq"), name="var", axis=[axis],
               keep_dims=True)
    y = b.op("Mul", d, b.op("Rsqrt", b.op("Add", var, b.const(1e-5, dtype), name="eps"),
                             name="inv"), name="y")
    return b.out(y, b.op("MatMul", s if gpt2 else y, b.input("w2", (n, 5), dtype),
                         name="next"))


NORM = {"mm", "bias", "res", "sum", "mean", "d", "sq", "var", "eps", "inv", "y"}


def test_matmul_depth_takes_a_row_reduction_whatever_the_vector_patterns_did():
    """LayerNorm after a product, a residual add between (BERT's shape): the vector patterns,
    which run first, push the residual add into the normalisation; the product's epilogue
    takes that region whole, so the result is the same without them. With a bias, or with the
    residual sum read by the next product too (GPT-2's), the kernel is the same (and writes
    the sum as well)."""
    full = fuse(_norm_after_product(G(), bias=False))
    assert kernels(full) == [NORM - {"bias"}]
    pushed = attempts(full, "elemwise_broadcast_bwd_width", "fused")
    assert pushed and "res" in pushed[0].nodes and "sum" in pushed[0].nodes
    took = attempts(full, "matmul_depth", "fused")
    assert [a.areas[0] for a in took] == ["mm"] and set(took[0].nodes) == NORM - {"bias"}
    assert kernels(fuse(_norm_after_product(G()))) == [NORM]
    gpt2 = fuse(_norm_after_product(G(), gpt2=True))
    assert kernels(gpt2) == [NORM]
    (k,) = [n for n in gpt2.graph.nodes if n.op == "GraphKernel"]
    assert len(k.outputs) == 2
    # without the reduce patterns the bias and residual join the product first: the same
    for off in ("reduce_fwd_depth,reduce_fwd_width", "elemwise_broadcast_fwd_depth,"
                "elemwise_broadcast_fwd_width,reduce_fwd_depth,reduce_fwd_width"):
        assert kernels(fuse(_norm_after_product(G()), f"--disable_fusion_pattern={off}")) \
            == [NORM], off


def test_matmul_depth_refuses_rows_it_cannot_hold_or_other_axes():
    # the product cannot take the norm: it stays alone, and its bias and residual (which
    # broadcast whole rows of what the norm reduces) join the normalisation's vector kernel
    res = fuse(_norm_after_product(G(), n=600))
    assert kernels(res) == [NORM - {"mm"}]
    assert any("a base tile holds whole rows of at most 512 (4-byte operands" in r
               for r in reasons(res, "matmul_depth"))
    fp16 = fuse(_norm_after_product(G(), n=512, dtype="float16"))
    assert len(kernels(fp16)) == 1 and NORM <= kernels(fp16)[0]  # 2-byte: rows up to 1024
    # within L0B, but the generator's epilogue does not fit the UB at 16 rows of 768: the
    # product is alone, the normalisation (with the bias and residual) a vector kernel
    res = fuse(_norm_after_product(G(), n=768, dtype="float16"))
    assert len(kernels(res)) == 1 and "mm" not in kernels(res)[0]
    assert {"sum", "var", "bias", "res"} <= kernels(res)[0]
    assert any(r.startswith("the code generator cannot hold the rows: no base tile holds "
                            "whole rows of N = 768") for r in reasons(res, "matmul_depth"))
    res = fuse(_norm_after_product(G(), axis=0))
    assert any("reduces other axes than the product's last (3)" in r
               for r in reasons(res, "matmul_depth"))


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


def test_transpose_pattern_runs_at_level_2_unless_the_last_axis_moves_too_much():
    """The code generator stores the rows of a transposed computed value, and transposes in
    UB a value whose last axis moves when one Gather moves it whole; a larger one it cannot
    generate, so the pattern refuses it and says why."""
    for perm, shape, fused in (([1, 0, 2], (4, 8, 16), True), ([0, 2, 1], (4, 8, 16), True),
                               ([0, 2, 1], (4, 64, 128), False)):
        b = G()
        x = b.input("x", shape)
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


def test_matmul_depth_takes_the_reductions_that_close_no_cycle():
    """GPT-2's last layer: the residual sum feeds this layer's norm and, through the MLP, the
    final norm's residual add. Joining both would close a cycle through the MLP's product, so
    the first norm joins and the other is left outside, with the reason."""
    b = G()
    x = b.input("x", (4, 8))
    s = b.op("Add", b.op("MatMul", x, b.input("w", (8, 16)), name="mm"), b.input("r", (4, 16)),
             name="res")

    def norm(v, tag):
        mean = b.op("ReduceMax", v, name=f"{tag}_max", axis=[-1], keep_dims=True)
        return b.op("Exp", b.op("Sub", v, mean, name=f"{tag}_sub"), name=f"{tag}_exp")

    y1 = norm(s, "n1")
    z = b.op("MatMul", y1, b.input("w2", (16, 16)), name="mlp")
    res = fuse(b.out(norm(b.op("Add", s, z, name="res2"), "n2")))
    first = next(k for k in kernels(res) if "mm" in k)
    assert {"mm", "res", "n1_max", "n1_sub", "n1_exp"} == first
    assert any(r.startswith("left outside: joined with the others it would close a cycle")
               for r in reasons(res, "matmul_depth"))


def _norm_rotary(rows: tuple[int, ...], heads: tuple[int, ...], stats_too: bool = False):
    """An RMSNorm over the last axis of ``rows``, viewed as ``heads`` (the same last axis, or
    its split into heads), then rotary embedding's ``x*cos + cat(-x2, x1)*sin`` over that
    view's last axis. ``stats_too``: the rotary result is also scaled by the norm's
    statistics (a per-row value, not a normalized row)."""
    b = G()
    x = b.input("x", rows)
    d = heads[-1]
    cos, sin = b.input("cos", (heads[-2], d)), b.input("sin", (heads[-2], d))
    ms = b.op("Mul", b.op("ReduceSum", b.op("Mul", x, x, name="sq"), name="ss", axis=[-1],
                          keep_dims=True), b.const(1.0 / rows[-1]), name="ms")
    r = b.op("Rsqrt", b.op("Add", ms, b.const(1e-6), name="eps"), name="r")
    y = b.op("Reshape", b.op("Mul", x, r, name="xn"), name="v", shape=list(heads))

    def cols(name, a, e):
        return b.op("StridedSlice", y, name=name, begin=[a], end=[e], strides=[1], axes=[-1])

    rot = b.op("Concat", b.op("Neg", cols("hi", d // 2, d), name="neg"), cols("lo", 0, d // 2),
               name="cat", axis=-1)
    out = b.op("Add", b.op("Mul", y, cos, name="yc"), b.op("Mul", rot, sin, name="ys"),
               name="rope")
    if stats_too:
        out = b.op("Mul", out, b.op("Reshape", r, name="rv",
                                     shape=list(heads[:-1]) + [1]), name="scaled")
    return b.out(out)


def test_a_norm_over_the_rotary_rows_joins_the_rotary_kernel():
    """Q/K norms before rotary embedding: a reduction over the same last axis the rotary halves
    are cut from is one kernel with them; a norm over a wider row (the heads not yet split)
    or a rotary step reading the norm's per-row statistics stays out of the rotary kernel."""
    res = fuse(_norm_rotary((2, 16, 4, 16), (2, 16, 4, 16)))
    assert len(kernels(res)) == 1 and {"ss", "xn", "cat", "rope"} <= kernels(res)[0]
    for g in (_norm_rotary((2, 16, 64), (2, 16, 4, 16)),
              _norm_rotary((2, 16, 4, 16), (2, 16, 4, 16), stats_too=True)):
        ks = kernels(fuse(g))
        assert len(ks) >= 2 and not any({"ss", "cat"} <= k for k in ks), ks


def test_matmul_depth_leaves_out_a_consumer_the_epilogue_cannot_run():
    """softplus(x·w + b) (a state-space step size): Log1p and the threshold's Select have no
    epilogue instruction form, so the product stays a cube kernel and the softplus one
    vector kernel, rather than a MIX kernel the code generator would take apart op by op."""
    b = G()
    x = b.input("x", (4, 8))
    mm = b.op("MatMul", x, b.const([[0.5] * 3] * 8), name="mm")
    z = b.op("Add", mm, b.const([1.0, 2.0, 3.0]), name="bias")
    soft = b.op("Log1p", b.op("Exp", z, name="ex"), name="lp")
    g = b.out(b.op("Select", b.op("Greater", z, b.const(20.0), name="gt"), z, soft,
                   name="sp"))
    res = fuse(g)
    assert {"mm"} in kernels(res) or not any("mm" in k for k in kernels(res))
    assert not any("mm" in k and "lp" in k for k in kernels(res))
    assert any("which a matmul epilogue does not run" in r
               for r in reasons(res, "matmul_depth"))
    import graphkernel
    from graphkernel.codegen.traffic import launches

    full = graphkernel.compile(g, "--opt_level=2", env={})
    assert sorted(e["kind"] for e in launches(full.graph)) == ["cube", "vector"]
    assert not full.report.extra.get("fallbacks")


def _selective_scan(b, lead=2, state=8, axis=2):
    """h = Scan(exp(-|x|), u * x) along ``axis`` of [lead, 6, 16, state], the readout
    sum_n h * c with c shared by the channels (axis 1)."""
    shape = (lead, 6, 16, state)
    x, u = b.input("x", shape), b.input("u", shape)
    c = b.input("c", (lead, 1, 16, state))
    decay = b.op("Exp", b.op("Neg", b.op("Abs", x, name="abs"), name="neg"), name="exp")
    h = b.op("Scan", decay, b.op("Mul", u, x, name="bu"), name="scan", axis=axis,
             combine="linear")
    return h, b.op("Mul", h, c, name="hc")


SCAN_FLAGS = ""  # every pattern of opt_level 2


def test_a_scans_readout_joins_the_scans_kernel():
    """sum over the state of h * C reduces exactly the axes after the scanned one: one kernel,
    the history never stored (without the pattern: the scan's kernel and the readout's)."""
    b = G()
    h, hc = _selective_scan(b)
    y = b.op("ReduceSum", hc, name="y", axis=[3], keep_dims=True)
    res = fuse(b.out(y), SCAN_FLAGS)
    assert kernels(res) == [{"abs", "neg", "exp", "bu", "scan", "hc", "y"}]
    assert attempts(res, "scan_readout", "fused")
    res = fuse(b.out(y), "--disable_fusion_pattern=scan_readout")
    assert len(kernels(res)) == 2


def test_a_readout_the_scan_kernel_cannot_hold_is_refused_with_the_reason():
    """Another reader of the history (it would be stored anyway), and a reduction of other
    axes than the scan's rows (the state and the channels: rows of other tiles), stay apart."""
    b = G()
    h, hc = _selective_scan(b)
    y = b.op("ReduceSum", hc, name="y", axis=[3], keep_dims=True)
    res = fuse(b.out(y, b.op("Neg", h, name="other")), SCAN_FLAGS)
    assert any("has other consumers" in r for r in reasons(res, "scan_readout"))
    assert not attempts(res, "scan_readout", "fused")
    b = G()
    h, hc = _selective_scan(b)
    y = b.op("ReduceSum", hc, name="y", axis=[1, 3], keep_dims=True)
    res = fuse(b.out(y), SCAN_FLAGS)
    assert any("reduces other than rows of the scan's tile" in r
               for r in reasons(res, "scan_readout"))
    assert not attempts(res, "scan_readout", "fused")


def test_the_readouts_skip_term_and_gate_join_the_scans_kernel():
    """(y + w * D) * sigmoid(z) on the readout, with w and z one value per row (the shape of
    the ops reading them): the scan's kernel computes and stores it; an operand broadcast
    along the rows (one value per channel) keeps the consumer apart."""
    b = G()
    h, hc = _selective_scan(b)
    y = b.op("Reshape", b.op("ReduceSum", hc, name="y", axis=[3], keep_dims=True), name="y3",
             shape=[2, 6, 16])
    w, z = b.input("w", (2, 6, 16)), b.input("z", (2, 6, 16))
    skip = b.op("Mul", w, b.const(0.5), name="skip")
    out = b.op("Mul", b.op("Add", y, skip, name="add"), b.op("Sigmoid", z, name="gate"),
               name="out")
    res = fuse(b.out(out), SCAN_FLAGS)
    (k,) = kernels(res)
    assert {"scan", "hc", "y", "y3", "skip", "add", "out"} <= k and \
        any(m.startswith("gate") for m in k)
    assert attempts(res, "scan_readout_epilogue", "fused")
    b = G()
    h, hc = _selective_scan(b)
    y = b.op("Reshape", b.op("ReduceSum", hc, name="y", axis=[3], keep_dims=True), name="y3",
             shape=[2, 6, 16])
    d = b.input("d", (6, 1))
    res = fuse(b.out(b.op("Mul", y, d, name="per_channel")), SCAN_FLAGS)
    assert any("not one per row" in r for r in reasons(res, "scan_readout_epilogue"))
    assert len(kernels(res)) == 2

def test_product_views_takes_row_moving_views_around_a_product():
    """A chunked scan's product: x [b, c, l, h, p] moved to [b c h, p, l] (heads before
    positions, the matrix transposed) and the result [b, c, h, l, n] moved back to
    positions before heads: both transposes keep each matrix row whole, so the cube
    kernel reads and writes through them (row pitches, batch offsets); a transpose moving
    the result's last axis stays outside, with the reason."""
    b = G()
    x = b.input("x", (2, 2, 8, 3, 16))
    w = b.input("w", (12, 8, 20))
    t = b.op("Transpose", x, name="t", perm=[0, 1, 3, 4, 2])
    r = b.op("Reshape", t, name="r", shape=[12, 16, 8])
    p = b.op("BatchMatMul", r, w, name="p")
    v = b.op("Reshape", p, name="v", shape=[2, 2, 3, 16, 20])
    back = b.op("Transpose", v, name="back", perm=[0, 1, 3, 2, 4])
    res = fuse(b.out(b.op("Exp", back, name="e")))
    assert {"t", "r", "p", "v", "back"} in kernels(res)
    assert attempts(res, "product_views", "fused")
    b = G()
    a = b.input("a", (2, 3, 8, 16))
    w = b.input("w", (2, 3, 16, 24))
    p = b.op("BatchMatMul", a, w, name="p")
    moved = b.op("Transpose", p, name="moved", perm=[0, 3, 1, 2])
    res = fuse(b.out(b.op("Exp", moved, name="e")))
    assert not any("moved" in k and "p" in k for k in kernels(res))
    assert any("result is written through views moving its last axis" in why
               for why in reasons(res, "product_views"))


def test_a_lone_reshape_read_by_two_kernels_stays_a_view():
    """A view of an input read by a vector kernel and by a product's kernel is not taken
    into the vector kernel (it would store a view of its own input as an output)."""
    b = G()
    x = b.input("x", (2, 16, 16))
    r = b.op("Reshape", x, name="r", shape=[2, 2, 8, 16])
    e = b.op("Exp", b.op("Neg", r, name="n"), name="e")
    w = b.input("w", (2, 2, 16, 8))
    p = b.op("BatchMatMul", r, w, name="p")
    res = fuse(b.out(e, p))
    assert not any("r" in k and "n" in k for k in kernels(res))
