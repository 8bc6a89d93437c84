import numpy as np

from tests.patterns.conftest import G, attempts, fuse, kernels, reasons


def test_reduce_fwd_depth_pulls_elementwise_producers_up_to_the_limit():
    b = G()
    x = b.input("x", (4, 8))
    v = x
    for i in range(3):
        v = b.op("Exp", v, name=f"e{i}")
    s = b.op("ReduceSum", v, name="s", axis=[1])
    only = "--enable_fusion_pattern_only=reduce_fwd_depth"
    assert kernels(fuse(b.out(s), only)) == [{"e0", "e1", "e2", "s"}]
    res = fuse(b.out(s), f"{only} --reduce_fuse_depth=3")
    assert kernels(res) == [{"e1", "e2", "s"}]
    assert "size limit: 4 ops > reduce_fwd_depth limit 3" in reasons(res, "reduce_fwd_depth")


def test_reduce_does_not_pull_a_broadcast_producer():
    """A producer that broadcasts a value itself (a BroadcastTo, or one of its own values
    into a larger one) would be computed again for every reduced row."""
    b = G()
    x, y = b.input("x", (4, 8)), b.input("y", (4, 1))
    bt = b.op("BroadcastTo", y, name="bt", shape=[4, 8])
    res = fuse(b.out(b.op("ReduceSum", b.op("Mul", x, bt, name="m"), name="s", axis=[1])),
               "--enable_fusion_pattern_only=reduce_fwd_depth,elemwise_broadcast_bwd_depth")
    assert {"bt", "m", "s"} not in kernels(res)
    assert any("a broadcast producer is not pulled into a reduce" in r
               for r in reasons(res, "reduce_fwd_depth"))


def test_reduce_pulls_a_producer_whose_broadcasts_are_loads():
    """``h * c`` with ``c`` read from outside and broadcast over the middle axis (a
    state-space layer's ``C`` times its states before the sum over the state): the kernel
    loads ``c`` with stride 0, nothing is computed twice, so the sum pulls the product in."""
    b = G()
    h, c = b.input("h", (4, 6, 8)), b.input("c", (4, 1, 8))
    m = b.op("Mul", h, b.op("Exp", c, name="e"), name="m")
    res = fuse(b.out(b.op("ReduceSum", m, name="s", axis=[2])),
               "--enable_fusion_pattern_only=reduce_fwd_depth")
    assert kernels(res) == [{"m", "s"}]


def test_reduce_bwd_joins_a_row_wise_normalization():
    b = G()
    x = b.input("x", (4, 8))
    m = b.op("ReduceMax", x, name="m", axis=[1], keep_dims=True)
    d = b.op("Sub", x, m, name="d")
    res = fuse(b.out(d), "--enable_fusion_pattern_only=reduce_bwd")
    assert kernels(res) == [{"m", "d"}]


def test_reduce_bwd_needs_the_same_reduction():
    b = G()
    x = b.input("x", (4, 8))
    m = b.op("ReduceMax", x, name="m", axis=[1], keep_dims=True)
    d = b.op("Sub", x, m, name="d")
    s = b.op("ReduceSum", d, name="s", axis=[0], keep_dims=True)    # another axis
    res = fuse(b.out(s), "--enable_fusion_pattern_only=elemwise_broadcast_fwd_depth,reduce_bwd")
    assert "the reductions differ in shape or axes" in reasons(res, "reduce_bwd")


def test_reduce_fwd_width():
    b = G()
    x, y = b.input("x", (4, 8)), b.input("y", (4, 8))
    s = b.op("ReduceSum", b.op("Add", b.op("Exp", x, name="p1"), b.op("Neg", y, name="p2"),
                               name="add"), name="s", axis=[1])
    res = fuse(b.out(s), "--enable_fusion_pattern_only=reduce_fwd_width")
    assert kernels(res) == [{"p1", "p2", "add", "s"}]  # retried on the grown area
    assert attempts(res, "reduce_fwd_width", "fused")



def test_reduce_output_takes_the_elementwise_work_on_the_reduced_values():
    """A global average pool: the sum over H and W and its division into a mean (then more
    work on the mean) are one kernel; without the pattern the reduction's consumer is a
    kernel of its own."""
    b = G()
    x = b.input("x", (2, 8, 4, 4))
    s = b.op("ReduceSum", b.op("Abs", x, name="r"), name="s", axis=[2, 3], keep_dims=True)
    m = b.op("Exp", b.op("Mul", s, b.const(0.0625), name="m"), name="g")
    only = "--enable_fusion_pattern_only=reduce_fwd_depth,elemwise_broadcast_fwd_depth"
    assert kernels(fuse(b.out(m), only + ",reduce_output")) == [{"r", "s", "m", "g"}]
    assert kernels(fuse(b.out(m), only)) == [{"r", "s"}, {"m", "g"}]


def test_reduce_output_refuses_a_consumer_that_broadcasts_the_reduced_values_back():
    """x * gate(pool(x)) (squeeze-and-excitation's scale) computes over x's extent, not the
    pooled values'."""
    b = G()
    x = b.input("x", (2, 8, 4, 4))
    s = b.op("ReduceSum", x, name="s", axis=[2, 3], keep_dims=True)
    res = fuse(b.out(b.op("Mul", x, s, name="m")), "--enable_fusion_pattern_only=reduce_output")
    assert kernels(res) == []
    assert any("kind mismatch: consumer" in r for r in reasons(res, "reduce_output"))


def test_reduce_output_leaves_what_the_vector_kernels_cannot_place():
    """A reduced value scaled by a per-channel input, or a mean subtracted from the values it
    was taken of (a training batch norm): the consumer stays outside the reduction."""
    b = G()
    x = b.input("x", (2, 8, 4, 4))
    s = b.op("ReduceSum", x, name="s", axis=[2, 3], keep_dims=True)
    g = b.op("Mul", s, b.input("gamma", (2, 8, 1, 1)), name="g")
    res = fuse(b.out(g), "--enable_fusion_pattern_only=reduce_output")
    assert kernels(res) == []
    assert any("reads gamma beside the reduced values" in r for r in reasons(res, "reduce_output"))
    b = G()
    x = b.input("x", (2, 8, 4, 4))
    mean = b.op("Mul", b.op("ReduceSum", x, name="s", axis=[2, 3], keep_dims=True),
                b.const(0.0625), name="mean")
    res = fuse(b.out(b.op("Sub", x, mean, name="centred")),
               "--enable_fusion_pattern_only=reduce_output")
    assert {"s", "mean"} not in kernels(res)
    assert any("is read by vector work" in r for r in reasons(res, "reduce_output"))


def test_reduce_output_keeps_the_rounding_of_a_half_precision_sum():
    """A float16 sum cast up: in one kernel the sum would stay float32 (no rounding, no
    overflow where the graph has them), so the cast stays outside."""
    b = G()
    x = b.input("x", (3, 700), "float16")
    s = b.op("ReduceSum", x, name="s", axis=[1])
    res = fuse(b.out(b.op("Cast", s, name="up", dtype="float32")),
               "--enable_fusion_pattern_only=reduce_output")
    assert kernels(res) == []
    assert any("reads reduced values of float16" in r for r in reasons(res, "reduce_output"))



def _picks(b, rows, experts):
    """Two experts picked one by one from router scores [rows, E] (a product's result, as
    PhiMoE's router computes them after moe_routing): each pick a max and the lowest expert
    holding it (a one-hot mask that masks the next pick's scores), each pick's weight a
    softmax of the scores near its max read at it; every reduction along the experts, several
    read by several others. Returns the two weights and the scores."""
    x = b.op("MatMul", b.input("h", (rows, 8)), b.input("wt", (8, experts)), name="router")
    iota, none = b.const(np.arange(experts)), b.const(float(experts))
    ninf = b.const(-np.inf)
    scores, outs = x, []
    for j in range(2):
        m = b.op("ReduceMax", scores, name=f"m{j}", axis=[1], keep_dims=True)
        holds = b.op("Equal", scores, m, name=f"holds{j}")
        first = b.op("ReduceMin", b.op("Select", holds, iota, none, name=f"at{j}"),
                     name=f"first{j}", axis=[1], keep_dims=True)
        hot = b.op("Equal", iota, first, name=f"hot{j}")
        top = b.op("ReduceMax", scores, name=f"top{j}", axis=[1], keep_dims=True)
        factor = b.op("Maximum", b.op("Abs", x, name=f"abs{j}"), top, name=f"factor{j}")
        rel = b.op("Div", b.op("Sub", top, x, name=f"gap{j}"), factor, name=f"rel{j}")
        near = b.op("Select", b.op("Greater", rel, b.const(0.02), name=f"far{j}"), ninf,
                    scores, name=f"near{j}")
        e = b.op("Exp", b.op("Sub", near, b.op("ReduceMax", near, name=f"sm{j}", axis=[1],
                                               keep_dims=True), name=f"d{j}"), name=f"e{j}")
        p = b.op("Div", e, b.op("ReduceSum", e, name=f"z{j}", axis=[1], keep_dims=True),
                 name=f"p{j}")
        outs.append(b.op("ReduceSum", b.op("Select", hot, p, b.const(0.0), name=f"pa{j}"),
                         name=f"w{j}", axis=[1], keep_dims=True))
        if j == 0:
            scores = b.op("Select", hot, ninf, scores, name="rest")
    return (*outs, x)


def test_reduce_rows_joins_row_reductions_read_by_several_into_one_kernel():
    b = G()
    w1, w2, _ = _picks(b, 16, 4)
    res = fuse(b.out(w1, w2))
    # the product is a kernel of its own (its epilogue takes no comparison); the picks one
    assert [k for k in kernels(res) if "m0" in k] == [k for k in kernels(res) if "m1" in k]
    assert len(kernels(res)) == 1 and "router" not in kernels(res)[0], kernels(res)
    assert attempts(res, "reduce_rows", "fused")
    # without it, each pick is a kernel of its own
    assert len(kernels(fuse(b.g, "--disable_fusion_pattern=reduce_rows"))) == 2


def test_reduce_rows_refuses_rows_too_long_and_other_axes():
    b = G()
    w1, w2, _ = _picks(b, 4, 4096)
    res = fuse(b.out(w1, w2))
    assert len(kernels(res)) == 2
    assert any("cannot hold the rows of 4096" in r for r in reasons(res, "reduce_rows"))

    b = G()
    w1, w2, x = _picks(b, 16, 4)
    # a column sum of the scores times the first pick's weight: a reduction of another axis
    col = b.op("ReduceSum", b.op("Mul", x, w1, name="xw"), name="col", axis=[0],
               keep_dims=True)
    res = fuse(b.out(col, w2))
    assert not any("col" in k and "m1" in k for k in kernels(res)), kernels(res)
    assert "the reductions differ in shape or axes" in reasons(res, "reduce_rows")


def _grn(shape=(2, 5, 7, 24), dtype="float32", tile_read=False, weighted=False):
    """ConvNeXt-V2's global response norm on ``shape`` ([N, H, W, C]): the sums of squares
    over H, W (``s``), their square roots (``g``), the mean over C (``m``), ``Nx`` (``nx``)
    and ``gamma * (x * Nx) + beta + x``. ``tile_read``: the last add reads the squares
    instead of ``x`` (a full-size value of the reduction's area); ``weighted``: the norms
    scaled by a per-channel input before the mean."""
    b = G()
    C = shape[-1]
    x = b.input("x", shape, dtype)
    gamma, beta = b.input("gamma", (1, 1, 1, C), dtype), b.input("beta", (1, 1, 1, C), dtype)
    sq = b.op("Mul", x, x, name="sq")
    g = b.op("Sqrt", b.op("ReduceSum", sq, name="s", axis=[1, 2], keep_dims=True), name="g")
    if weighted:
        g = b.op("Mul", g, b.input("w", (1, 1, 1, C), dtype), name="gw")
    m = b.op("Mul", b.op("ReduceSum", g, name="m", axis=[3], keep_dims=True),
             b.const(1.0 / C, dtype), name="mean")
    nx = b.op("Div", g, b.op("Add", m, b.const(1e-6, dtype), name="d"), name="nx")
    y = b.op("Add", b.op("Add", b.op("Mul", gamma, b.op("Mul", x, nx, name="xn"), name="gy"),
                         beta, name="yb"), sq if tile_read else x, name="y")
    return b.out(y)


GRN_NODES = {"sq", "s", "g", "m", "mean", "d", "nx", "xn", "gy", "yb", "y"}


def test_broadcast_back_takes_a_global_response_norm_whole():
    """The reduction over H, W, the work on its [N, 1, 1, C] result (a mean over C
    included) and the scale-and-add broadcasting Nx back over H, W: one kernel, whatever
    the batch (with N = 1 the areas lie differently: the square roots are read by two)."""
    for shape in ((2, 5, 7, 24), (1, 4, 4, 16), (3, 2, 9, 7)):
        res = fuse(_grn(shape))
        assert kernels(res) == [GRN_NODES], (shape, kernels(res))
        assert attempts(res, "reduce_broadcast_back", "fused"), shape
    # without the pattern: the reduction, the work on its result, the broadcast back
    res = fuse(_grn(), "--disable_fusion_pattern=reduce_broadcast_back")
    assert len(kernels(res)) == 3


def test_broadcast_back_refuses_what_the_second_pass_cannot_have():
    """Reduced values of float16 (a kernel would not round them), a per-channel input
    beside the reduced values, rows too long to reduce whole in UB: each refused with the
    reason (GK209: the generator's layout)."""
    from graphkernel.refusals import code

    cases = [(_grn(dtype="float16"), "reads reduced values of float16"),
             (_grn(weighted=True), "reads w beside the reduced values"),
             (_grn((1, 2, 2, 8192)), "cannot hold the rows of 8192 reduced values whole")]
    for graph, why in cases:
        res = fuse(graph)
        assert GRN_NODES not in kernels(res) and not attempts(res, "reduce_broadcast_back",
                                                               "fused"), why
        got = [r for r in reasons(res, "reduce_broadcast_back") if why in r]
        assert got, (why, reasons(res, "reduce_broadcast_back"))
        assert code(got[0]) == "GK209", got[0]


def test_broadcast_back_reads_a_value_of_other_readers_from_outside():
    """The squares read by the reduction and by the broadcast-back work: computed before the
    kernel (the reduction does not pull in a producer read elsewhere, a single op is no
    kernel here), which reads them in both of its passes."""
    res = fuse(_grn(tile_read=True))
    assert kernels(res) == [GRN_NODES - {"sq"}]


def test_broadcast_back_needs_the_reduced_values_read_by_nothing_else():
    """Nx also returned (read outside the region): the web is not taken."""
    g = _grn()
    nx = next(n for n in g.nodes if n.name == "nx").outputs[0]
    g.set_outputs([*g.outputs, nx])
    res = fuse(g)
    assert not attempts(res, "reduce_broadcast_back", "fused")
    assert any("has a consumer outside the fusable region" in r
               for r in reasons(res, "reduce_broadcast_back"))


def test_broadcast_back_refuses_work_apart_from_the_reduced_values():
    """The broadcast-back area also scales x by a constant before adding (work of the first
    pass's shape not computed from the reduced values): the web is not taken, GK209."""
    from graphkernel.refusals import code

    b = G()
    x = b.input("x", (2, 6, 5, 8))
    t = b.op("Tanh", b.op("ReduceSum", x, name="s", axis=[1], keep_dims=True), name="t")
    res = fuse(b.out(b.op("Add", t, b.op("Mul", x, b.const(0.5), name="xd"), name="y")))
    assert not attempts(res, "reduce_broadcast_back", "fused")
    (why,) = [r for r in reasons(res, "reduce_broadcast_back") if "apart from" in r]
    assert "computes xd apart from the reduced values" in why and code(why) == "GK209"


def _channel_norm(shape=(2, 64, 16), shared_count=True, weight=False):
    """LayerNorm over axis 1 of ``shape`` ([B, C, L]: a 1x1-convolution model's channels), as
    a permute -> LayerNorm -> permute leaves it once the permutes are gone: the element count
    a Reshape of a one-element Constant (``shared_count``) read by both means, or a scalar
    Constant."""
    b = G()
    C = shape[1]
    x = b.input("x", shape)
    count = b.const([float(C)])
    if shared_count:
        count = b.op("Reshape", count, name="count", shape=[1, 1, 1])
    s1 = b.op("ReduceSum", x, name="s1", axis=[1], keep_dims=True)
    d = b.op("Sub", x, b.op("Div", s1, count, name="mean"), name="d")
    s2 = b.op("ReduceSum", b.op("Mul", d, d, name="sq"), name="s2", axis=[1], keep_dims=True)
    var = b.op("Div", s2, count, name="var")
    r = b.op("Rsqrt", b.op("Add", var, b.const(1e-5), name="ve"), name="r")
    y = b.op("Mul", d, r, name="y")
    if weight:  # a per-channel scale read beside the rows
        y = b.op("Mul", y, b.input("w", (1, C, 1)), name="yw")
    return b.out(y)


CHANNEL_NORM_NODES = {"s1", "mean", "d", "sq", "s2", "var", "ve", "r", "y"}


def test_reduce_columns_makes_a_channel_norm_one_kernel():
    """LayerNorm over axis 1 of [B, C, L]: the variance's reduction pulls in the mean's
    kernel (its result broadcast back, squared and reduced again over the same rows): one
    kernel at several sizes; without the pattern, two (with one block, B = 1, the
    leading-axis patterns already make it one)."""
    for shape in ((2, 64, 16), (4, 24, 40), (3, 7, 5), (2, 96, 33)):
        res = fuse(_channel_norm(shape))
        got = [k - {"count"} for k in kernels(res)]
        assert got == [CHANNEL_NORM_NODES], (shape, got)
        assert attempts(res, "reduce_columns", "fused"), shape
    assert len(kernels(fuse(_channel_norm(), "--disable_fusion_pattern=reduce_columns"))) == 2


def test_reduce_columns_refuses_what_a_block_tile_cannot_hold():
    """A per-channel input read beside the rows (one value per row of each block, not
    placed in a kernel over blocks of rows) and blocks of more rows than one tile can hold
    in UB: each refused with the reason, the norm left in two kernels over the rows."""
    from graphkernel.refusals import code

    cases = [(_channel_norm(weight=True), "computes or reads other than values of the "
                                          "reduction's shape", "GK202"),
             (_channel_norm((2, 4096, 8)), "cannot hold the rows of a block (4096)", "GK209")]
    for graph, why, gk in cases:
        res = fuse(graph)
        assert not attempts(res, "reduce_columns", "fused"), why
        got = [r for r in reasons(res, "reduce_columns") if why in r]
        assert got, (why, reasons(res, "reduce_columns"))
        assert code(got[0]) == gk, got[0]


def test_broadcast_back_reads_a_scalar_constant_through_a_view():
    """The mean's divisor a one-element Constant seen through a Reshape shared by both
    means (SqueezeBERT's channel LayerNorm once its permutes are gone): a scalar like the
    Constant itself, so each reduction over the channels takes the work on its result and
    the work broadcasting it back, as with a plain scalar Constant."""
    want = [{"s1", "mean", "d"}, {"sq", "s2", "var", "ve", "r", "y"}]
    for shape in ((2, 64, 16), (4, 24, 40), (3, 7, 5)):
        for shared in (True, False):
            res = fuse(_channel_norm(shape, shared), "--disable_fusion_pattern=reduce_columns")
            assert kernels(res) == want, (shape, shared, kernels(res))
            assert not [r for r in reasons(res, "reduce_broadcast_back")
                        if "reads count beside the reduced values" in r]
