"""Views of computed values inside generated kernels (transposes, reshapes, concats), each
case one kernel with no fallback, run in the simulator against the op-by-op run; and the
index maps of codegen/vector/views.py against numpy's own strides."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.vector import views
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.schedule import plan
from graphkernel.explain import explain
from graphkernel.kernels import build_kernel
from tests.codegen.cases import Case, _g, compile_cases
from tests.codegen.test_codegen import check_case


def _n(g):
    return lambda op, ins, **a: g.add_node(op, ins, a).output


def view_cases() -> list[Case]:
    cases = []

    def add(case_id, g, *outs, flags="--opt_level=3", dims=None):
        g.set_outputs(list(outs))
        cases.append(Case(case_id, g, flags, dims=dims or [{}]))

    # ShuffleNet's channel shuffle after a BatchNorm and Relu: Reshape -> Transpose -> Reshape
    for lvl in (2, 3):
        g, v = _g(f"shuffle{lvl}", {"x": (2, 12, 5, 7), "s": (12, 1, 1), "b": (12, 1, 1)})
        n = _n(g)
        y = n("Relu", [n("Add", [n("Mul", [v["x"], v["s"]]), v["b"]])])
        t = n("Transpose", [n("Reshape", [y], shape=[2, 3, 4, 5, 7])], perm=[0, 2, 1, 3, 4])
        add(f"channel-shuffle-opt{lvl}", g, n("Reshape", [t], shape=[2, 12, 5, 7]),
            flags=f"--opt_level={lvl}")
    # attention's head merge of a computed value: [B, H, S, D] -> [B, S, H, D] -> [B, S, H*D]
    for dt in ("float32", "float16"):
        g, v = _g(f"merge_{dt}", {"x": ("b", 4, 16, 8)}, dt)
        n = _n(g)
        t = n("Transpose", [n("Mul", [n("Exp", [v["x"]]), v["x"]])], perm=[0, 2, 1, 3])
        add(f"head-merge-{dt}", g, n("Reshape", [t], shape=["b", 16, 32]),
            dims=[{"b": 1}, {"b": 3}])
    # DenseNet/Inception: a Concat of three inputs of different channel counts, loaded piece
    # by piece into one tile, then a per-channel BatchNorm and Relu; the Concat is stored too
    for dt, shapes in (("float32", ((2, 8, 5, 7), (2, 4, 5, 7), (2, 3, 5, 7))),
                       ("float16", ((1, 40, 6, 6), (1, 12, 6, 6), (1, 5, 6, 6))),
                       ("float32", (("b", 8, 33), ("b", 3, 33), ("b", 1, 33)))):
        ins = {f"x{k}": sh for k, sh in enumerate(shapes)}
        c = sum(sh[1] for sh in shapes)
        g, v = _g(f"concat3_{dt}", {**ins, "s": (c, 1, 1) if len(shapes[0]) == 4 else (c, 1)},
                  dt)
        n = _n(g)
        cat = n("Concat", [v[k] for k in ins], axis=1)
        y = n("Relu", [n("Mul", [cat, v["s"]])])
        tag = "x".join(map(str, shapes[0]))
        add(f"concat-3-channel-counts-{tag}-{dt}", g, y, cat,
            dims=[{"b": 1}, {"b": 5}] if "b" in shapes[0] else None)
    # Inception: every branch ends with the same ops (x + 0.1, Relu) before the Concat; they
    # run once after it, on the tile loaded piece by piece
    g, v = _g("concat_sunk", {"a": (1, 3, 6, 10), "b": (1, 5, 6, 10), "c": (1, 8, 6, 10)})
    n = _n(g)
    pieces = [n("Relu", [n("Add", [v[k], g.const(np.float32(0.1))])]) for k in "abc"]
    add("concat-of-branches-ending-alike", g, n("Concat", pieces, axis=1), flags="--opt_level=2")
    cases += rotary_cases()
    return cases


def rotary(name: str, dt: str = "float32", heads: int = 4, rot: int = 16, d: int = 16,
           repeat: int = 1, split: bool = True, batch="2", bsnd: bool = False,
           norm: str | None = None):
    """LLaMA's rotary embedding of q or k: the head split of a projection ``[B*S, H*D]``
    (Reshape, Transpose to ``[B, H, S, D]``), then ``x*cos + rotate_half(x)*sin`` over the
    first ``rot`` columns (the rest passed through, concatenated back), with
    ``rotate_half(x) = cat(-x[..., h:], x[..., :h])``; ``repeat``: grouped-query attention's
    repeat of the k heads after it. ``split=False``: x is ``[B, H, S, D]`` already;
    ``bsnd``: x is ``[B, S, H, D]`` and the tables are read as ``[1, S, 1, rot]`` (reshapes of
    the ``[1, 1, S, rot]`` inputs, as the head layout pass leaves them); ``norm``: a
    ``LayerNorm`` or ``RMSNorm`` over the head dimension first, with random parameters (the
    Q/K norms of Qwen3, OLMo 2, Persimmon)."""
    S = 16
    B = int(batch) if batch.isdigit() else batch
    x_shape = (2 * S, heads * d) if split else (B, S, heads, d) if bsnd else (B, heads, S, d)
    params = {"w": (d,), "b": (d,)} if norm == "LayerNorm" else {"w": (d,)} if norm else {}
    g, v = _g(name, {"x": x_shape, "cos": (1, 1, S, rot), "sin": (1, 1, S, rot), **params},
              dt)
    n = _n(g)
    if bsnd:
        for t in ("cos", "sin"):
            v[t] = n("Reshape", [v[t]], shape=[1, S, 1, rot])

    def cols(x, a, b):
        return n("StridedSlice", [x], begin=[a], end=[b], strides=[1], axes=[3])

    x = v["x"]
    if split:
        x = n("Transpose", [n("Reshape", [x], shape=[2, S, heads, d])], perm=[0, 2, 1, 3])
    if norm:
        x = g.add_node(norm, [x] + [v[k] for k in params], {}).outputs[0]
    xr = x if rot == d else cols(x, 0, rot)
    half = rot // 2
    rotated = n("Concat", [n("Neg", [cols(xr, half, 2**62)]), cols(xr, 0, half)], axis=-1)
    y = n("Add", [n("Mul", [xr, v["cos"]]), n("Mul", [rotated, v["sin"]])])
    if rot != d:
        y = n("Concat", [y, cols(x, rot, 2**62)], axis=-1)
    if repeat > 1:
        y = n("BroadcastTo", [n("ExpandDims", [y], axis=[2])], shape=[2, heads, repeat, S, d])
        y = n("Reshape", [y], shape=[2 * heads * repeat, S, d])
    g.set_outputs([y])
    return g


def rotary_cases() -> list[Case]:
    cases = []
    for dt in ("float32", "float16"):
        cases.append(Case(f"rotary-full-{dt}", rotary(f"rot_{dt}", dt), "--opt_level=2"))
        cases.append(Case(f"rotary-partial-{dt}", rotary(f"rotp_{dt}", dt, rot=32, d=64),
                          "--opt_level=2"))
        cases.append(Case(f"rotary-gqa-repeat-{dt}", rotary(f"rotk_{dt}", dt, heads=2,
                                                            repeat=3 if dt == "float16" else 2),
                          "--opt_level=3"))
    # narrow heads: rotary halves of 4 columns (16 bytes into a row) and a partial rotary
    # of 4 of 16 columns, copied by the scalar unit; a partial rotary in BSND, its tables
    # read through reshapes
    cases.append(Case("rotary-narrow-halves", rotary("rot_narrow", rot=8, d=8),
                      "--opt_level=2"))
    cases.append(Case("rotary-partial-narrow", rotary("rotp_narrow", rot=4, d=16),
                      "--opt_level=2"))
    cases.append(Case("rotary-partial-bsnd-tables-through-views",
                      rotary("rotp_bsnd", rot=32, d=64, split=False, bsnd=True),
                      "--opt_level=2"))
    # Q/K norms over the head dimension, then rotary embedding: the norm's rows are the rows
    # the rotary halves are cut from (full and partial rotary, heads last or not)
    for norm, dt, kw in (("RMSNorm", "float32", {}), ("RMSNorm", "float16", {"bsnd": True}),
                         ("LayerNorm", "float32", {"rot": 32, "d": 64, "bsnd": True}),
                         ("LayerNorm", "float16", {"rot": 8, "d": 16}),
                         ("RMSNorm", "float32", {"batch": "b"})):
        tag = "-".join(f"{k}{w}" for k, w in kw.items())
        cases.append(Case(f"norm-rotary-{norm}-{dt}-{tag}".rstrip("-"),
                          rotary(f"nrot_{norm}_{dt}_{tag}", dt, split=False, norm=norm, **kw),
                          "--opt_level=2", dims=[{"b": 1}, {"b": 3}] if kw.get("batch") else
                          [{}]))
    # v: the head split and the repeat of its heads, no computing step at all
    g, v = _g("v_repeat", {"x": (32, 32)})
    n = _n(g)
    t = n("Transpose", [n("Reshape", [v["x"]], shape=[2, 16, 2, 16])], perm=[0, 2, 1, 3])
    t = n("BroadcastTo", [n("ExpandDims", [t], axis=[2])], shape=[2, 2, 2, 16, 16])
    g.set_outputs([n("Reshape", [t], shape=[8, 16, 16])])
    cases.append(Case("gqa-head-split-and-repeat", g, "--opt_level=2"))
    cases.append(Case("rotary-no-head-split-symbolic-batch",
                      rotary("rot_b", split=False, batch="b"), "--opt_level=2",
                      dims=[{"b": 1}, {"b": 3}]))
    return cases


CASES = view_cases()


@pytest.fixture(scope="module")
def library():
    return compile_cases(CASES)


@pytest.mark.sim
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_view_of_a_computed_value_is_fused_into_one_kernel(case, library):
    runs = check_case(case, library)
    ex = case.result.report.extra
    assert not ex.get("fallbacks"), ex["fallbacks"]
    assert ex["kernels_fused"] == 1, "the whole graph is one kernel"
    assert all(len(b.stats) == 1 for b in runs)


def test_a_transpose_of_the_last_axis_beyond_one_gather_is_refused_naming_why():
    """A value too large for the in-UB transpose (one Gather moves at most 255 repeats):
    explain shows the pattern's refusal; a kernel built anyway falls back with the
    schedule's reason."""
    g, v = _g("last", {"x": (128, 256)})
    n = _n(g)
    g.set_outputs([n("Transpose", [n("Exp", [v["x"]])], perm=[1, 0])])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    rows = explain(res, None)["candidates"]
    assert any(r["pattern"] == "transpose" and r["verdict"] != "fused"
               and "moves the last axis" in r["reason"] for r in rows), rows
    kernel = g.copy()
    node = build_kernel(kernel, list(kernel.nodes), "k", "test")
    with pytest.raises(Unsupported, match="moves its last axis"):
        plan(node)


@pytest.mark.parametrize("shape,perm,to", [
    ((2, 12, 5, 7), None, (2, 3, 4, 5, 7)),
    ((2, 3, 4, 5, 7), (0, 2, 1, 3, 4), (2, 12, 35)),
    ((4, 16, 8), (1, 0, 2), (16, 32)),
    ((1, 6, 1, 4), (2, 1, 0, 3), (6, 4)),
])
def test_index_maps_place_every_element_where_numpy_puts_it(shape, perm, to):
    """A value viewed through a transpose and a reshape and stored contiguously: the map over
    the value says where each element lands; numpy's result says where it must."""
    x = np.arange(int(np.prod(shape))).reshape(shape)
    t = x.transpose(perm) if perm else x
    out = np.ascontiguousarray(t).reshape(to)
    strides = views.contiguous(tuple(to))
    strides = views.reshape_map(tuple(t.shape), tuple(to), strides)
    if perm:  # back through the transpose: input axis perm[k] has the output's axis k stride
        back = [0] * len(perm)
        for k, p in enumerate(perm):
            back[p] = strides[k]
        strides = tuple(back)
    flat = out.reshape(-1)
    for idx in np.ndindex(*shape):
        assert flat[sum(i * s for i, s in zip(idx, strides, strict=True))] == x[idx]


def test_a_reshape_that_merges_axes_the_map_keeps_apart_has_no_map():
    # [3, 4] transposed to [4, 3] then flattened: no affine map over a [12] source
    assert views.reshape_map((12,), (4, 3), (1, 4)) is None
    assert views.reshape_map((12,), (4, 3), (3, 1)) == (1,)


@pytest.mark.parametrize("attrs,op,want", [
    ({"begin": [0], "end": [8], "strides": [1], "axes": [3]}, "StridedSlice", (0, 8)),
    ({"begin": [8], "end": [2**62], "strides": [1], "axes": [-1]}, "StridedSlice", (8, 8)),
    ({"begin": [0, 4], "end": [2**62, 12], "strides": [1, 1], "axes": [0, 3]}, "StridedSlice",
     (4, 8)),
    ({"begin": [0, 0, 0, 2], "size": [-1, -1, -1, 6]}, "Slice", (2, 6)),
    ({"begin": [0], "end": [8], "strides": [2], "axes": [3]}, "StridedSlice", None),
    ({"begin": [1], "end": [3], "strides": [1], "axes": [2]}, "StridedSlice", None),
])
def test_a_slice_of_the_last_axis_is_a_run_of_columns(attrs, op, want):
    g, v = _g("cols", {"x": (2, 3, 4, 16)})
    node = g.add_node(op, [v["x"]], attrs)
    assert views.column_slice(node) == want


def test_a_concat_of_columns_off_the_ub_block_is_one_kernel_copied_by_the_scalar_unit():
    """Halves of 4 fp32 columns start 16 bytes into a row, where no vector instruction can
    start: the Concat's pieces are copied element by element by the scalar unit (the
    simulator runs it: ``rotary-narrow-halves``), waited for by the vector unit and by the
    store; pieces on a UB block keep the masked vector copy."""
    g = rotary("rot_narrow", rot=8, d=8)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert res.report.extra["kernels_fused"] == 1
    kernel = g.copy()
    node = build_kernel(kernel, list(kernel.nodes), "k", "test")
    ir = lower(plan(node))
    text = str(ir)
    assert "GetValue" in text and "ColsCopy" not in text
    wide = rotary("rot_wide", rot=16, d=16).copy()
    node = build_kernel(wide, list(wide.nodes), "k", "test")
    text = str(lower(plan(node)))
    assert "ColsCopy" in text and "GetValue" not in text


def test_a_concat_tile_broadcast_over_a_later_axis_is_refused():
    """A Concat of inputs loaded piece by piece is read by row index of the loop space; when
    a BroadcastTo after it makes the loop space larger than the Concat, its rows are not the
    loop's rows (reading them so runs past the inputs' buffers), so the schedule refuses."""
    g, v = _g("catb", {"a": (3, 3, 8, 4), "b": (3, 1, 8, 4)})
    n = _n(g)
    cat = n("ExpandDims", [n("Concat", [v["a"], v["b"]], axis=1)], axis=[4])
    y = n("Reshape", [n("BroadcastTo", [cat], shape=[3, 4, 8, 4, 3])], shape=[3, 32, 4, 3])
    g.set_outputs([n("Sigmoid", [y])])
    kernel = g.copy()
    node = build_kernel(kernel, list(kernel.nodes), "k", "test")
    with pytest.raises(Unsupported, match="Concat loaded as a tile is a broadcast"):
        plan(node)



def test_a_norm_and_its_rotary_are_one_kernel_of_whole_rows():
    """The kernel of a Q/K norm and its rotary embedding reduces each row and slices its
    columns: rows of the head dimension, held whole."""
    res = graphkernel.compile(rotary("nrot_rows", split=False, norm="RMSNorm"), "--opt_level=2",
                              env={})
    (k,) = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    s = plan(k)
    assert s.reduce and s.cols and s.L == 16 and s.whole_rows



@pytest.mark.sim
def test_a_norm_over_rows_too_long_for_one_kernel_with_its_rotary_stays_apart():
    """Whole rows of a norm and its rotary work must fit the UB together (the rotary's
    columns are offsets into whole rows); over longer rows the norm is a kernel of its own
    (its rows reduced chunk by chunk if need be) and the rotary another, both run in the
    simulator against the reference."""
    case = Case("norm-rotary-long-rows", rotary("nrot_long", split=False, norm="RMSNorm",
                                                rot=3584, d=3584, heads=1, batch="1"),
                "--opt_level=2")
    library = compile_cases([case])
    (backend,) = check_case(case, library)
    ex = case.result.report.extra
    assert not ex.get("fallbacks") and not ex.get("phases") and ex["kernels_fused"] == 2
    assert len(backend.stats) == 2
