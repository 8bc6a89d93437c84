"""Graphs for the code generator's tests, compiled together so that one g++ run builds every
kernel (the simulator's compiles are the slow part)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import render_all, schedules
from graphkernel.codegen.sim.execute import SimLibrary

UNARY = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Rsqrt", "Reciprocal", "Erf", "Tanh", "Relu",
         "Sigmoid", "Floor", "Ceil", "Trunc", "Round", "Sign", "Erfc", "Sin", "Cos", "Tan",
         "Asin", "Acos", "Atan", "Expm1", "Log1p"]
UNIT = {"Asin", "Acos"}  # inputs in (-1, 1)
COMPARE = ["Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual"]
BOOL_RESULT = ["IsNan", "IsInf", "IsFinite", "Greater-alone", "Equal-alone"]  # stored as bytes
LOGICAL = ["LogicalNot", "LogicalAnd", "LogicalOr"]  # bool inputs and outputs
POSITIVE = {"Log", "Sqrt", "Rsqrt", "Reciprocal"}
BINARY = ["Add", "Sub", "Mul", "Div", "Maximum", "Minimum", "FloorDiv", "FloorMod", "Mod",
          "Atan2", "Pow"]
# composites the generator rewrites (codegen/vector/decompose.py): inputs that reach their
# edge cases: half-integers over divisors with exact quotients, and rounded multiples of any
# divisor (the quotient rounds onto the integer above the true one; fmod/floor_divide are
# exact)
QUOTIENTS = {"FloorDiv", "FloorMod", "Mod"}
SMALL_TOO = {"Expm1", "Log1p"}  # magnitudes down to 1e-7, where the naive forms lose digits
# the ops checked elementwise (the rewritten composites, and Power with a tensor exponent)
STRICT = QUOTIENTS | SMALL_TOO | {"Atan2", "Pow"}
REDUCE = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"]
ANY = ["ElemAny"]  # a float32 [1]: 1.0 when any element is nonzero
BITWISE = ["BitwiseAnd", "BitwiseOr"]  # int32 words (every bit) and bools
# aligned, unaligned, smaller than one core's share, larger than one UB tile
SHAPES = {"aligned": (64, 128), "unaligned": (7, 33), "small": (3, 5), "large": (300, 1000)}
DTYPES = ["float32", "float16", "bfloat16"]


@dataclass
class Case:
    id: str
    graph: Graph
    flags: str = "--enable_single_node_fusion"
    feeds_for: Callable[[dict[str, int]], dict[str, np.ndarray]] | None = None
    dims: list[dict[str, int]] = field(default_factory=lambda: [{}])
    result: object = None

    def feeds(self, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
        if self.feeds_for is not None:
            return self.feeds_for(dims)
        rng = np.random.default_rng(seed)
        out = {}
        for v in self.graph.inputs:
            shape = [d if isinstance(d, int) else dims[d] for d in v.shape]
            a = rng.standard_normal(shape)
            if self.id.split("-")[0] in POSITIVE or "positive" in self.id:
                a = np.abs(a) + 0.5
            op = self.id.split("-")[0]
            if op in UNIT:
                a = np.tanh(a)
            if op == "ReduceProd":  # factors near 1: long rows neither overflow nor vanish
                a = 1.0 + 0.01 * a
            if op in SMALL_TOO:
                a = a * 10.0 ** rng.uniform(-7, 0.5, a.shape)
                a = np.maximum(a, -0.95) if op == "Log1p" else a
            if op in QUOTIENTS:
                a = (np.rint(a * 8) / 2 if v.name == "x" else
                     rng.choice([-3.0, -2.0, -1.5, -0.5, 0.5, 1.5, 2.0, 3.0], a.shape))
            if op == "Pow" and v.name == "y":  # integer exponents (negative bases) and others
                a = np.where(rng.random(a.shape) < 0.5, np.rint(a * 2), a)
            if op == "Atan2":  # the axes and the four quadrants
                a.reshape(-1)[::9] = 0.0
            if self.id.startswith("Is"):  # some NaN and infinities to find
                a.reshape(-1)[::7] = np.nan
                a.reshape(-1)[::5] = np.inf
                a.reshape(-1)[::11] = -np.inf
            if v.dtype.value == "bool":
                out[v.name] = a > 0
                continue
            if v.dtype.value == "int32":  # every bit pattern
                out[v.name] = rng.integers(-2**31, 2**31, shape).astype(np.int32)
                continue
            out[v.name] = a.astype(v.dtype.np)
        if op in QUOTIENTS:  # every 3rd: any divisor, the dividend its rounded multiple
            x, y = out["x"].reshape(-1), out["y"].reshape(-1)
            y[::3] = rng.standard_normal(y[::3].shape)
            x[::3] = y[::3] * rng.integers(-300, 300, x[::3].shape).astype(x.dtype)
        return out


def _single(op: str, shape, dtype: str) -> Graph:
    g = Graph(f"{op}_{dtype}")
    x = g.add_input("x", TensorType(shape, dtype))
    if op in BINARY or op in BITWISE:
        y = g.add_input("y", TensorType(shape, dtype))
        out = g.add_node(op, [x, y], name="op").output
    elif op in BOOL_RESULT:
        name = op.split("-")[0]
        ins = [x] if name.startswith("Is") else [x, g.add_input("y", TensorType(shape, dtype))]
        out = g.add_node(name, ins, name="op").output
    elif op in LOGICAL:
        g = Graph(op)
        ins = [g.add_input(f"b{i}", TensorType(shape, "bool"))
               for i in range(1 if op == "LogicalNot" else 2)]
        out = g.add_node(op, ins, name="op").output
    elif op in COMPARE:  # a comparison is a bit mask inside a kernel: it feeds a Select
        y = g.add_input("y", TensorType(shape, dtype))
        r = g.add_node("Round", [y]).output  # equal elements for Equal/NotEqual
        c = g.add_node(op, [g.add_node("Round", [x]).output, r], name="op").output
        out = g.add_node("Select", [c, x, y]).output
    elif op in REDUCE:
        out = g.add_node(op, [x], {"axis": [len(shape) - 1], "keep_dims": True},
                         name="op").output
    else:
        out = g.add_node(op, [x], name="op").output
    g.set_outputs([out])
    return g


def single_op_cases() -> list[Case]:
    cases = []
    for op in UNARY + BINARY + REDUCE + ANY + COMPARE + BOOL_RESULT + LOGICAL:
        for sname, shape in SHAPES.items():
            for dt in DTYPES:
                if sname == "large" and dt != "float32" and op not in ("Add", "Exp", "ReduceSum"):
                    continue  # large tiles in low precision: a few ops suffice
                cases.append(Case(f"{op}-{sname}-{dt}", _single(op, shape, dt)))
    for op in BITWISE:
        for sname, shape in SHAPES.items():
            for dt in ("int32", "bool"):
                cases.append(Case(f"{op}-{sname}-{dt}", _single(op, shape, dt)))
    return cases


def _masked_rows(dims: dict[str, int]) -> dict[str, np.ndarray]:
    """Scores [4, 3, 6] with keys masked out (-inf) above the diagonal and row 1 of batch 2
    masked out entirely."""
    x = np.random.default_rng(0).standard_normal((4, 3, 6)).astype(np.float32)
    x[:, np.arange(6)[None, :] > np.arange(3)[:, None]] = -np.inf
    x[2, 1] = -np.inf
    return {"x": x}


def _half_roundings(dims: dict[str, int]) -> dict[str, np.ndarray]:
    """fp16 values of every kind rounding meets: ties, fractions, integers beyond 2048 (every
    half there is integral), the largest half, infinities, NaN, signed zeros."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((9, 70)) * 10.0 ** rng.uniform(-1, 4.8, (9, 70))).clip(
        -65504, 65504)
    x.reshape(-1)[:14] = [0.5, 1.5, 2.5, -0.5, -2.5, 65504, -65504, np.inf, -np.inf, np.nan,
                          0.0, -0.0, 2049.0, 1023.75]
    return {"x": x.astype(np.float16)}


def _g(name: str, inputs: dict[str, tuple], dtype: str = "float32"):
    g = Graph(name)
    return g, {k: g.add_input(k, TensorType(s, dtype)) for k, s in inputs.items()}


def pattern_cases() -> list[Case]:
    cases = []

    def add(case_id, g, *outs, flags="--opt_level=2", dims=None, feeds_for=None):
        g.set_outputs(list(outs))
        cases.append(Case(case_id, g, flags, feeds_for, dims=dims or [{}]))

    g, v = _g("chain", {"x": (33, 70), "y": (33, 70)})
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    e = n("Mul", [n("Exp", [v["x"]]), n("Add", [v["x"], v["y"]])])
    add("elementwise-chain", g, n("Tanh", [e]))

    g, v = _g("bits", {"x": (5, 3, 77), "y": (5, 3, 77)}, "int32")  # a constant keeps all bits
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    m = g.const(np.int32(-0x7F00FF01), "int32")
    r = n("Reshape", [n("BitwiseAnd", [v["x"], m])], shape=[15, 77])
    add("bitwise-int32-chain", g, n("BitwiseOr", [r, n("Reshape", [v["y"]], shape=[15, 77])]),
        n("BitwiseAnd", [v["x"], v["y"]]))
    for bshape, tag in (((8, 16), "outer"), ((4, 1, 16), "middle"), ((4, 8, 1), "last"),
                        ((1, 8, 1), "middle-only"), ((1,), "scalar")):
        g, v = _g(f"bcast_{tag}", {"x": (4, 8, 16), "b": bshape})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        add(f"broadcast-{tag}", g, n("Exp", [n("Sub", [v["x"], v["b"]])]))
    for keep in (True, False):
        g, v = _g(f"reduce_last_{keep}", {"x": (6, 10, 37)})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        s = n("ReduceSum", [n("Mul", [v["x"], v["x"]])], axis=[2], keep_dims=keep)
        add(f"reduce-last-keep{keep}", g, s, n("ReduceMax", [v["x"]], axis=[1, 2],
                                               keep_dims=keep))
    # reductions over leading axes: a core owns whole columns and accumulates every row
    for shape, axes, keep in (((37, 70), [0], True), ((4, 6, 33), [0, 1], False),
                              ((300, 1000), [0], True)):
        g, v = _g(f"reduce_lead_{len(axes)}", {"x": shape, "b": shape[len(axes):]})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        s = n("ReduceSum", [n("Exp", [n("Sub", [v["x"], v["b"]])])], axis=axes, keep_dims=keep)
        mean = n("Mul", [s, g.const(np.float32(1.0 / np.prod(shape[:len(axes)])))])
        add(f"reduce-leading-{'x'.join(map(str, shape))}", g, mean,
            n("ReduceMin", [v["x"]], axis=axes, keep_dims=keep))
    # rows longer than one UB: each row is reduced chunk by chunk into its totals
    for dt in ("float32", "float16"):
        g, v = _g(f"long_rows_{dt}", {"x": (5, 70001)}, dt)
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        e = n("Exp", [n("Mul", [v["x"], g.const(np.dtype(dt).type(0.01))])])
        s = n("ReduceSum", [e], axis=[1], keep_dims=True)
        add(f"reduce-row-larger-than-ub-{dt}", g, n("Mul", [s, g.const(np.dtype(dt).type(1e-4))]),
            n("ReduceMax", [v["x"]], axis=[1]), n("Neg", [e]))
    # a second pass over rows too long for the UB, or over a leading axis: phase kernels
    for dt in ("float32", "float16"):
        g, v = _g(f"softmax_long_{dt}", {"x": (3, 70001)}, dt)
        add(f"phases-softmax-long-row-{dt}", g,
            g.add_node("Softmax", [v["x"]], {"axis": -1}).output)
    # attention's guard of a fully masked row (torch's math path): a per-row "any" negated
    # is a column of bools; the softmax of such a row is replaced by zeros
    g, v = _g("masked_row_guard", {"x": (4, 3, 6)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    kept = n("LogicalNot", [n("Equal", [v["x"], g.const(np.float32(-np.inf))])])
    dead = n("LogicalNot", [n("ReduceMax", [kept], axis=[2], keep_dims=True)])
    zeros = g.const(np.zeros((4, 3, 6), np.float32))
    add("masked-row-guard", g, n("Select", [dead, zeros, n("Softmax", [v["x"]], axis=-1)]),
        feeds_for=_masked_rows)
    # (4100 rows: more than a block tile holds, which a softmax over fewer rows runs as)
    g, v = _g("softmax_leading", {"x": (4100, 2, 33)})
    add("phases-softmax-leading-axis", g, g.add_node("Softmax", [v["x"]], {"axis": 0}).output)
    g, v = _g("layernorm_long", {"x": (4, 70001), "w": (70001,), "b": (70001,)})
    add("phases-layernorm-long-row", g,
        g.add_node("LayerNorm", [v["x"], v["w"], v["b"]], {}).outputs[0])
    # the same with a symbolic row: the run-time shape picks whole rows or chunks (tiling key)
    g, v = _g("long_rows_symbolic", {"x": ("b", "n")})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    e = n("Exp", [n("Mul", [v["x"], g.const(np.float32(0.01))])])
    add("reduce-row-symbolic-length", g,
        n("Mul", [n("ReduceSum", [e], axis=[1], keep_dims=True), g.const(np.float32(1e-4))]),
        n("ReduceMax", [v["x"]], axis=[1]), n("Neg", [e]),
        dims=[{"b": 3, "n": 50}, {"b": 5, "n": 70001}, {"b": 47, "n": 1000}])
    # sizes the host reads back from derived symbols and products (symbolic.py): a length
    # n + 1 sliced to n (a padded convolution's output), and a reduction along n read out of
    # an input flattened to b*n (n as the quotient by b, another input's dim)
    def symbolic_feeds(g):
        def feeds(dims):
            rng = np.random.default_rng(1)
            return {v.name: rng.standard_normal(v.type.concrete(dims)).astype(np.float32)
                    for v in g.inputs}
        return feeds

    g, v = _g("derived_length", {"x": (2, 16, "n__p1_d1")})
    s = g.add_node("StridedSlice", [v["x"]], {"begin": [0], "end": [-1], "axes": [2]}).output
    add("derived-length-slice", g, g.add_node("Tanh", [s]).output,
        dims=[{"n": 7}, {"n": 40}, {"n": 1000}], feeds_for=symbolic_feeds(g))
    g, v = _g("product_rows", {"y": ("b", 8), "x": ("b*n", 8)})  # b bound first
    r = g.add_node("Reshape", [v["x"]], {"shape": ["b", "n", 8]}).output
    r = g.add_node("ReduceSum", [r], {"axis": [1]}).output
    add("product-dim-reduce", g, g.add_node("Add", [r, v["y"]]).output,
        dims=[{"b": 3, "n": 5}, {"b": 4, "n": 33}], feeds_for=symbolic_feeds(g))
    # an outer difference x[None, :] - x[:, None] (T5's relative positions): the one input
    # is a row and a column of the loop space, bound twice (a load each)
    for length in (40, "n"):
        g, v = _g("outer_difference", {"x": (length,)})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        d = n("Sub", [n("ExpandDims", [v["x"]], axis=[0]), n("ExpandDims", [v["x"]], axis=[1])])
        up = n("Select", [n("Greater", [d, g.const(np.float32(0))]), g.const(np.float32(16)),
                          g.const(np.float32(0))])
        add(f"outer-difference-{'symbolic' if length == 'n' else 'static'}", g, up, n("Abs", [d]),
            dims=[{"n": 7}, {"n": 40}, {"n": 300}] if length == "n" else None,
            feeds_for=symbolic_feeds(g) if length == "n" else None)
    for op, extra in (("LayerNorm", {"w": (96,), "b": (96,)}), ("RMSNorm", {"w": (96,)})):
        for dt in ("float32", "float16"):
            g, v = _g(f"{op}_{dt}", {"x": (5, 9, 96), **extra}, dt)
            out = g.add_node(op, list(v.values()), {}).outputs[0]
            add(f"{op}-{dt}", g, out)
    for dt in ("float32", "float16"):
        g, v = _g(f"softmax_{dt}", {"x": (2, 4, 7, 50)}, dt)
        add(f"Softmax-{dt}", g, g.add_node("Softmax", [v["x"]], {"axis": -1}).output)
    g, v = _g("bias_gelu", {"x": (24, 200), "b": (200,)})
    add("bias-gelu", g, g.add_node("GeLU", [g.add_node("Add", [v["x"], v["b"]]).output],
                                   {"approximate": "tanh"}).output)
    # where(x > c, x, b) with a broadcast row b, and Select against a scalar
    g, v = _g("where", {"x": (20, 48), "b": (48,)})
    c = g.add_node("Greater", [v["x"], g.const(np.float32(0.25))]).output
    w = g.add_node("Select", [c, v["x"], v["b"]]).output
    add("select-broadcast", g, w, g.add_node("Select", [c, w, g.const(np.float32(-1))]).output)
    # an outer-axis transpose of an input: a strided load
    g, v = _g("transpose", {"x": (6, 5, 40), "y": (5, 6, 40)})
    t = g.add_node("Transpose", [v["x"]], {"perm": [1, 0, 2]}).output
    add("transpose-outer-axes", g, g.add_node("Mul", [t, v["y"]]).output,
        flags="--opt_level=3 --enable_single_node_fusion")
    # attention's head split: reshape then transpose of an input, one strided view
    g, v = _g("heads", {"x": (2, 16, 64), "y": (2, 4, 16, 16)})
    r = g.add_node("Reshape", [v["x"]], {"shape": [2, 16, 4, 16]}).output
    t = g.add_node("Transpose", [r], {"perm": [0, 2, 1, 3]}).output
    add("reshape-transpose-heads", g, g.add_node("Add", [t, v["y"]]).output,
        flags="--opt_level=3 --enable_single_node_fusion")
    # a reduction over separate runs of axes (BatchNorm's statistics over N, H, W): the last
    # run in one pass, the others in the next
    for dt, keep in (("float32", True), ("float16", False)):
        g, v = _g(f"bn_stats_{dt}", {"x": (4, 8, 6, 5)}, dt)
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        add(f"reduce-separate-runs-{dt}", g,
            n("ReduceSum", [n("Mul", [v["x"], v["x"]])], axis=[0, 2, 3], keep_dims=keep),
            n("ReduceMax", [v["x"]], axis=[0, 2, 3], keep_dims=keep))
    # everything reduced to one value: partials on every core, then their combination
    for op, dt in (("ReduceSum", "float32"), ("ReduceMax", "float16")):
        g, v = _g(f"whole_{op}", {"x": (300, 1000)}, dt)
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        e = n("Exp", [n("Mul", [v["x"], g.const(np.dtype(dt).type(0.001))])])
        add(f"two-stages-{op}-{dt}", g, n(op, [e], axis=None, keep_dims=False), n("Neg", [e]))
    # Concat as a kernel's output: each operand stored to its blocks of the output
    for shape, axis, dt in (((1, 16, 9, 9), 1, "float32"), ((2, 6, 5, 7), 1, "float32"),
                            ((2, 6, 5, 7), 3, "float32"), (("b", 16, 33), 1, "float32"),
                            ((1, 16, 9, 9), 1, "float16")):
        g, v = _g("concat", {"a": shape, "b": shape}, dt)
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        c = n("Concat", [n("Maximum", [v["a"], g.const(np.dtype(dt).type(0))]),
                         n("Exp", [v["b"]]), n("Neg", [v["a"]])], axis=axis)
        add(f"concat-{'x'.join(map(str, shape))}-axis{axis}-{dt}", g, c, flags="--opt_level=3",
            dims=[{"b": 1}, {"b": 7}] if "b" in shape else None)
    # Pow by a constant exponent
    g, v = _g("pow", {"x": (9, 50)})
    ax = g.add_node("Add", [g.add_node("Abs", [v["x"]]).output, g.const(np.float32(0.5))]).output
    add("pow-constant-exponents", g, g.add_node("Pow", [ax, g.const(np.float32(3))]).output,
        g.add_node("Pow", [ax, g.const(np.float32(-0.5))]).output,
        g.add_node("Pow", [ax, g.const(np.float32(1.7))]).output,
        g.add_node("Pow", [ax, g.const(np.float32(11))]).output,  # Power, scalar exponent
        g.add_node("Pow", [ax, g.const(np.float32(0))]).output)
    # a Cast to fp16 in the middle of an fp32 kernel rounds there (and only there)
    g, v = _g("cast_mid", {"x": (9, 70)})
    h = g.add_node("Cast", [g.add_node("Exp", [v["x"]]).output], {"dtype": "float16"}).output
    back = g.add_node("Cast", [h], {"dtype": "float32"}).output
    add("cast-fp16-in-the-middle", g, g.add_node("Mul", [back, v["x"]]).output,
        flags="--opt_level=2 --disable_pass=cast_elim")
    g, v = _g("reshape_mid", {"x": (6, 40), "y": (2, 3, 40)})
    r = g.add_node("Reshape", [g.add_node("Exp", [v["x"]]).output], {"shape": [2, 3, 40]}).output
    add("reshape-in-middle", g, g.add_node("Add", [r, v["y"]]).output)
    # slices as strided loads: last axis (rotary halves), a middle axis, a step of 2
    for tag, attrs, shape in (
            ("last-axis", {"begin": [8], "end": [16], "axes": [3]}, (2, 4, 16, 16)),
            ("middle-axis", {"begin": [1], "end": [3], "axes": [1]}, (2, 4, 16, 16)),
            ("step-2", {"begin": [0], "end": [16], "strides": [2], "axes": [2]}, (3, 5, 16, 8))):
        g, v = _g(f"slice_{tag}", {"x": shape})
        s = g.add_node("StridedSlice", [v["x"]], attrs).output
        add(f"slice-{tag}", g, g.add_node("Neg", [g.add_node("Exp", [s]).output]).output,
            flags="--opt_level=2 --enable_single_node_fusion")
    # grouped-query attention's repeat of k/v heads: a broadcast over a middle axis, as data
    g, v = _g("repeat_kv", {"x": (2, 2, 16, 16)})
    e = g.add_node("ExpandDims", [v["x"]], {"axis": [2]}).output
    b = g.add_node("BroadcastTo", [e], {"shape": [2, 2, 3, 16, 16]}).output
    r = g.add_node("Reshape", [b], {"shape": [12, 16, 16]}).output
    add("repeat-kv", g, g.add_node("Mul", [r, g.const(np.float32(0.5))]).output)
    # bools broadcast into a kernel (a row, a value per row, one value) and stored from it:
    # in a fp32 kernel their bytes pass through half (the vector unit casts bytes to half only)
    for tag, bshape in (("row", (1, 70)), ("col", (33, 1)), ("scalar", ())):
        for dt, flags in (("float32", ""), ("float16", " --enable_low_precision")):
            g = Graph(f"bool_{tag}_{dt}")
            a = g.add_input("a", TensorType((33, 70), "bool"))
            b = g.add_input("b", TensorType(bshape, "bool"))
            x = g.add_input("x", TensorType((33, 70), dt))
            both = g.add_node("LogicalAnd", [a, b]).output
            add(f"bool-broadcast-{tag}-{dt}", g, g.add_node("Select", [both, x, g.const(
                np.array(0.5, dt), dt)]).output, g.add_node("LogicalNot", [both]).output,
                flags="--opt_level=2" + flags)
    # rounding in a kernel computing in fp16 (the vector unit has no half -> half Cast)
    g, v = _g("round_half", {"x": (9, 70)}, "float16")
    neg = g.add_node("Neg", [v["x"]]).output
    add("roundings-in-fp16", g, *(g.add_node(op, [neg]).output
                                  for op in ("Floor", "Ceil", "Trunc", "Round")),
        flags="--opt_level=2 --enable_low_precision", feeds_for=_half_roundings)
    # scans down the rows: a state-space model's selective scan (decays exp(-|x|) in (0, 1],
    # the linear recurrence, a gate after it), prefix sums and maxima over leading axes
    for dtype, lead in (("float32", 2), ("float16", 2), ("float32", "b")):
        g, v = _g("sscan", {"x": (lead, 40, 24), "u": (lead, 40, 24)}, dtype)
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        decay = n("Exp", [n("Neg", [n("Abs", [v["x"]])])])
        h = n("Scan", [decay, n("Mul", [v["u"], v["x"]])], axis=1, combine="linear")
        add(f"scan-linear-{dtype}-{lead}", g, n("Mul", [h, v["u"]]),
            dims=[{"b": 1}, {"b": 5}] if lead == "b" else None)
    # the scan's result stored through a transpose that keeps the last axis (a Mamba layer
    # hands h to its readout per token)
    g, v = _g("scan_store", {"x": (2, 6, 16, 8), "u": (2, 6, 16, 8)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    h = n("Scan", [n("Exp", [n("Neg", [n("Abs", [v["x"]])])]), v["u"]], axis=2,
          combine="linear")
    add("scan-transposed-store", g, n("Transpose", [h], perm=[0, 2, 1, 3]))
    # a selective scan's readout in the scan's kernel (scan_readout): the history h summed
    # over the state with C (per batch, step and state, shared by the channels), one value
    # per row of the scan's tile; rows of 8, of 20 (padded to the block), a symbolic batch,
    # a maximum over the state, and the readout's skip term and gate in the kernel too
    # (scan_readout_epilogue: per-row operands of the 3-D shape, a scalar)
    for lead, state, red, tail in ((2, 8, "ReduceSum", False), (3, 20, "ReduceSum", True),
                                   ("b", 16, "ReduceSum", True), (2, 8, "ReduceMax", False)):
        g, v = _g("scan_readout", {"x": (lead, 6, 16, state), "u": (lead, 6, 16, state),
                                   "c": (lead, 1, 16, state),
                                   **({"w": (lead, 6, 16), "z": (lead, 6, 16)} if tail else {})})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        h = n("Scan", [n("Exp", [n("Neg", [n("Abs", [v["x"]])])]), n("Mul", [v["u"], v["x"]])],
              axis=2, combine="linear")
        y = n(red, [n("Mul", [h, v["c"]])], axis=[3], keep_dims=True)
        if tail:
            y = n("Reshape", [y], shape=[lead if lead != "b" else "b", 6, 16])
            skip = n("Mul", [v["w"], g.const(np.float32(0.5))])
            y = n("Mul", [n("Add", [y, skip]), n("Sigmoid", [v["z"]])])
        add(f"scan-readout-{red}-{lead}x{state}{'-gated' if tail else ''}", g, y,
            dims=[{"b": 1}, {"b": 3}] if lead == "b" else None)
    for combine, shape, axis in (("add", (300, 33), 0), ("max", (3, 7, 5), 1),
                                 ("mul", (4, 50), 1), ("min", (16, 2, 8, 16), 0)):
        g, v = _g("scan", {"x": shape})
        x = v["x"] if combine != "mul" else g.add_node(
            "Add", [g.add_node("Mul", [v["x"], g.const(np.float32(0.01))]).output,
                    g.const(np.float32(1.0))]).output  # factors near 1
        add(f"scan-{combine}-{'x'.join(map(str, shape))}", g,
            g.add_node("Scan", [x], {"axis": axis, "combine": combine}).output,
            flags="--opt_level=2 --enable_single_node_fusion")
    # embedding lookups: a table's rows loaded by index (negative ones count from the end)
    # into the kernel that adds the position table and normalizes the rows; int64 or int32
    # indices, the rows also stored for another reader (a decoder's residual)
    def lookup_feeds(g, rows):
        def feeds(dims):
            rng = np.random.default_rng(4)
            out = {}
            for v in g.inputs:
                shape = v.type.concrete(dims)
                out[v.name] = (rng.integers(-rows, rows, shape).astype(v.dtype.np)
                               if v.name == "ids" else
                               rng.standard_normal(shape).astype(np.float32))
            return out
        return feeds

    g = Graph("lookup_norm")
    ids = g.add_input("ids", TensorType((2, 16), "int64"))
    v = {k: g.add_input(k, TensorType(s, "float32"))
         for k, s in (("table", (50, 64)), ("pos", (16, 64)), ("w", (64,)), ("b", (64,)))}
    e = g.add_node("Gather", [v["table"], ids], {"axis": 0}).output
    s = g.add_node("Add", [e, v["pos"]]).output
    add("embedding-lookup-layernorm", g,
        g.add_node("LayerNorm", [s, v["w"], v["b"]], {"epsilon": 1e-5}).outputs[0],
        feeds_for=lookup_feeds(g, 50))
    g = Graph("lookup_rms")
    ids = g.add_input("ids", TensorType(("b", 24), "int32"))
    v = {k: g.add_input(k, TensorType(s, "float32")) for k, s in (("table", (40, 48)),
                                                                 ("w", (48,)))}
    e = g.add_node("Gather", [v["table"], ids], {"axis": 0}).output
    add("embedding-lookup-rmsnorm-dynamic", g, g.add_node("RMSNorm", [e, v["w"]], {}).outputs[0],
        e, dims=[{"b": 1}, {"b": 5}], feeds_for=lookup_feeds(g, 40))
    # rotary tables from the int64 positions a KV-cache step is given: the positions
    # converted on loading (int64 -> float32 rounds to nearest), scaled, cos and sin
    g = Graph("rotary_tables")
    pos = g.add_input("ids", TensorType((2, 9, 1), "int64"))
    f = g.add_node("Cast", [pos], {"dtype": "float32"}).output
    a = g.add_node("Mul", [f, g.const((0.5 ** np.arange(16)).astype(np.float32))]).output
    add("rotary-tables-int64-positions", g, g.add_node("Cos", [a]).output,
        g.add_node("Sin", [a]).output, feeds_for=lookup_feeds(g, 2 ** 25))
    # a grouped QKV projection's parts (a Split of the heads' axis) stored by the kernel
    # computing the value they are cut from
    g, v = _g("split_parts", {"x": (2, "s", 2, 4, 16), "c": (16,)})
    y = g.add_node("Mul", [g.add_node("Exp", [v["x"]]).output, v["c"]]).output
    add("split-parts-dynamic", g,
        *g.add_node("Split", [y], {"axis": 3, "sizes": [2, 1, 1]}).outputs,
        dims=[{"s": 1}, {"s": 9}], feeds_for=symbolic_feeds(g))
    # transposes moving the last axis, done in UB by a Gather (the kernel one tile): of a
    # value the kernel computes and stores, and of an input the kernel reads
    g, v = _g("ub_transpose_store", {"x": (2, 16, 8), "w": (8,)})
    y = g.add_node("Reshape", [g.add_node("Mul", [v["x"], v["w"]]).output],
                   {"shape": [2, 2, 8, 8]}).output
    add("ub-transpose-store", g, g.add_node("Transpose", [y], {"perm": [0, 3, 1, 2]}).output)
    g, v = _g("ub_transpose_load", {"x": (3, 6, 5), "y": (3, 5, 6)})
    t = g.add_node("Transpose", [v["x"]], {"perm": [0, 2, 1]}).output
    add("ub-transpose-load", g, g.add_node("Mul", [g.add_node("Exp", [t]).output, v["y"]]).output)
    # ... beside a LayerNorm over the rows: an input moved channels-last then normalised, and
    # a patch merge (a transpose keeping the channels, read merged as rows of 4 C) normalised
    ln = {"begin_norm_axis": -1, "begin_params_axis": -1, "epsilon": 1e-5}
    g, v = _g("ub_transpose_norm", {"x": (2, 16, 4, 4), "w": (16,)})
    t = g.add_node("Transpose", [v["x"]], {"perm": [0, 2, 3, 1]}).output
    add("ub-transpose-norm", g, g.add_node("LayerNorm", [t, v["w"], v["w"]], ln).outputs[0])
    g, v = _g("ub_transpose_merge_norm", {"x": (2, 8, 8, 8), "w": (32,)})
    y = g.add_node("Reshape", [v["x"]], {"shape": [2, 4, 2, 4, 2, 8]}).output
    y = g.add_node("Transpose", [y], {"perm": [0, 1, 3, 4, 2, 5]}).output
    y = g.add_node("Reshape", [y], {"shape": [2, 4, 4, 32]}).output
    add("ub-transpose-merge-norm", g,
        g.add_node("LayerNorm", [y, v["w"], v["w"]], ln).outputs[0])
    # dynamic shapes: one kernel for every b
    g, v = _g("dyn", {"x": ("b", 33), "w": (33,)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    add("dynamic-layernorm-like", g,
        n("Mul", [n("Sub", [v["x"], n("ReduceMax", [v["x"]], axis=[1], keep_dims=True)]), v["w"]]),
        dims=[{"b": 1}, {"b": 7}, {"b": 47}, {"b": 500}])
    g, v = _g("dyn_flat", {"x": ("b", 16, 3)})
    add("dynamic-elementwise", g, g.add_node("Exp", [g.add_node("Neg", [v["x"]]).output]).output,
        dims=[{"b": 1}, {"b": 5}, {"b": 1000}])
    # two halves of one input in one kernel (a gate/up product's silu(gate) * up): each half
    # bound to an input of its own, loaded as a strided view of the one buffer
    g, v = _g("gate_up", {"x": (33, 140)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    gate = n("StridedSlice", [v["x"]], begin=[0], end=[70], strides=[1], axes=[1])
    up = n("StridedSlice", [v["x"]], begin=[70], end=[140], strides=[1], axes=[1])
    add("gate-up-halves", g, n("Mul", [n("Mul", [gate, n("Sigmoid", [gate])]), up]))
    # an interleaved gate/up product (GPT-OSS's experts: gate the even columns, up the odd
    # ones, each clamped): each a strided load of every second element of the one buffer
    g, v = _g("gate_up_pairs", {"x": (33, 140)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    gate = n("Minimum", [n("StridedSlice", [v["x"]], begin=[0], end=[140], strides=[2],
                           axes=[1]), g.const(np.float32(0.5))])
    up = n("StridedSlice", [v["x"]], begin=[1], end=[140], strides=[2], axes=[1])
    up = n("Maximum", [n("Minimum", [up, g.const(np.float32(0.5))]), g.const(np.float32(-0.5))])
    add("gate-up-interleaved", g, n("Mul", [n("Add", [up, g.const(np.float32(1.0))]),
                                            n("Mul", [gate, n("Sigmoid", [gate])])]))
    # a slice of the last axis viewed with a head axis of one and scaled by a per-position
    # table (a latent attention's shared rotary key): the view is the slice's strided view
    g, v = _g("rope_part", {"x": (2, 16, 48), "c": (1, 1, 16, 16)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    r = n("Reshape", [n("StridedSlice", [v["x"]], begin=[32], end=[48], strides=[1],
                        axes=[2])], shape=[2, 1, 16, 16])
    add("head-view-of-a-slice-part", g, n("Exp", [n("Mul", [r, v["c"]])]))
    # a router picking two of 6 experts one by one (PhiMoE's, after moe_routing): each
    # pick's max and lowest expert holding it, the next pick's scores masked by it, each
    # pick's softmax of the scores near its max read at it; row reductions read by several
    # others, one kernel
    g, v = _g("router_picks", {"x": (37, 6)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    x = v["x"]
    iota, ninf = g.const(np.arange(6, dtype=np.float32)), g.const(np.float32(-np.inf))
    row = dict(axis=[1], keep_dims=True)
    scores, picked = x, []
    for _ in range(2):
        holds = n("Equal", [scores, n("ReduceMax", [scores], **row)])
        first = n("ReduceMin", [n("Select", [holds, iota, g.const(np.float32(6))])], **row)
        hot = n("Equal", [iota, first])
        top = n("ReduceMax", [scores], **row)
        rel = n("Div", [n("Sub", [top, x]), n("Maximum", [n("Abs", [x]), top])])
        near = n("Select", [n("Greater", [rel, g.const(np.float32(0.02))]), ninf, scores])
        e = n("Exp", [n("Sub", [near, n("ReduceMax", [near], **row)])])
        p = n("Div", [e, n("ReduceSum", [e], **row)])
        picked.append(n("ReduceSum", [n("Select", [hot, p, g.const(np.float32(0))])], **row))
        scores = n("Select", [hot, ninf, scores])
    add("router-picks-one-by-one", g, *picked)

    # a projection's first 128 of 160 columns viewed as 8 heads of 16 (a reshape after the
    # slice: the reshape splits the strided view's last axis), times a per-head step size
    g, v = _g("sliced_heads", {"y": (2, 16, 160), "dt": (2, 16, 8, 1)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    x = n("StridedSlice", [v["y"]], begin=[0], end=[128], strides=[1], axes=[2])
    add("slice-then-head-split", g, n("Mul", [n("Reshape", [x], shape=[2, 16, 8, 16]),
                                              v["dt"]]),
        flags="--opt_level=2 --disable_pass=reshape_elim")
    # the same part read by two kernels a product separates (the gate before the product,
    # the skip term after it): loaded in place by both (passes/recompute.py)
    g, v = _g("part_in_place", {"y": (2, 16, 160), "dt": (2, 16, 8, 1),
                                "w": (2, 16, 16, 16)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    u = n("Exp", [v["y"]])
    x = n("Reshape", [n("StridedSlice", [u], begin=[0], end=[128], strides=[1], axes=[2])],
          shape=[2, 16, 8, 16])
    p = n("BatchMatMul", [n("Mul", [x, v["dt"]]), v["w"]])
    d = g.const(np.linspace(0.5, 1.5, 8, dtype=np.float32).reshape(8, 1))
    skip = n("Add", [n("Tanh", [n("ReduceSum", [p], axis=[1], keep_dims=True)]),
                     n("Mul", [x, d])])
    rest = n("Neg", [n("StridedSlice", [u], begin=[128], end=[160], strides=[1], axes=[2])])
    add("slice-read-in-place-by-two-kernels", g, skip, rest)
    # rotary on [B, S, N, D] heads, the result also stored head-transposed to [B, N, S, D]
    # (a key cache returned beside the attention's BSND read): one kernel, two outputs, the
    # second through a strided store of its rows
    g, v = _g("rotary_bnsd", {"x": (2, 16, 2, 16), "c": (1, 16, 1, 16), "s": (1, 16, 1, 16)})
    n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
    x = v["x"]
    half = n("Concat", [n("Neg", [n("StridedSlice", [x], begin=[8], end=[16], strides=[1],
                                    axes=[3])]),
                        n("StridedSlice", [x], begin=[0], end=[8], strides=[1], axes=[3])],
             axis=3)
    rot = n("Add", [n("Mul", [x, v["c"]]), n("Mul", [half, v["s"]])])
    add("rotary-stored-head-transposed", g, rot, n("Transpose", [rot], perm=[0, 2, 1, 3]))
    # a reduction over middle axes broadcast back in one kernel over the rows: ConvNeXt-V2's
    # global response norm on [N, H, W, C] (sums of squares over H, W; their square roots'
    # mean over C in the final steps, a whole row of C per column tile; then a second pass
    # over the block's rows), odd sizes and a block of several row tiles included
    for shape in ((2, 4, 4, 32), (3, 5, 7, 37), (1, 3, 3, 7), (2, 40, 40, 96)):
        tag = "x".join(map(str, shape))
        g, v = _g(f"grn_{tag}", {"x": shape, "gamma": (1, 1, 1, shape[-1]),
                                 "beta": (1, 1, 1, shape[-1])})
        add(f"middle-reduce-back-grn-{tag}", g, _grn(g, v["x"], v["gamma"], v["beta"]))
    # a float16 input cast to float32 on loading, in both passes; the result stored as float16
    g = Graph("grn_fp16_in")
    x = g.add_input("x", TensorType((2, 6, 5, 40), "float16"))
    gamma, beta = (g.add_input(k, TensorType((1, 1, 1, 40), "float32")) for k in ("gamma", "beta"))
    y = _grn(g, g.add_node("Cast", [x], {"dtype": "float32"}).output, gamma, beta)
    add("middle-reduce-back-grn-fp16-input", g,
        g.add_node("Cast", [y], {"dtype": "float16"}).output)
    # the same form without a reduction of the reduced row: x minus its mean over the middle
    # axis (column tiles split over the cores), and over the leading axis (one block)
    for shape, axes in (((3, 20, 300), [1]), ((45, 70), [0])):
        tag = "x".join(map(str, shape))
        g, v = _g(f"mid_back_{tag}", {"x": shape, "w": (shape[-1],)})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        m = n("ReduceMean", [n("Mul", [v["x"], v["w"]])], axis=axes, keep_dims=True)
        add(f"middle-reduce-back-sub-{tag}", g, n("Exp", [n("Sub", [v["x"], m])]))
    # an int32 index per row (an ArgMax's expert) read as floats, compared with a row of
    # expert ids: one value per row cast to float32 on loading, a one-hot mask weighting the
    # scores (a top-1 router's dispatch), odd sizes included
    for rows, experts in ((32, 4), (37, 5), (300, 8)):
        g = Graph(f"int32_per_row_{rows}x{experts}")
        ids = g.add_input("ids", TensorType((rows,), "int32"))
        scores = g.add_input("scores", TensorType((rows, experts), "float32"))
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        col = n("ExpandDims", [n("Cast", [ids], dtype="float32")], axis=[1])
        hit = n("Equal", [col, g.const(np.arange(experts, dtype=np.float32))])
        one = n("Select", [hit, g.const(np.float32(1)), g.const(np.float32(0))])
        add(f"int32-index-per-row-{rows}x{experts}", g, n("Mul", [one, scores]),
            feeds_for=lookup_feeds(g, experts))
    # LayerNorm over the channels of [B, C, L] after a residual add (a 1x1-convolution
    # model's norm): one kernel whose row tile holds every row of a block, the variance's
    # reduction of the mean broadcast back complete within the tile; odd sizes, a block of
    # many column tiles and one of more rows than a column tile of 8 holds across cores
    for shape in ((2, 64, 16), (3, 37, 300), (2, 5, 7), (1, 200, 70)):
        tag = "x".join(map(str, shape))
        g, v = _g(f"block_norm_{tag}", {"x": shape, "r": shape})
        n = lambda op, ins, g=g, **a: g.add_node(op, ins, a).output  # noqa: E731
        h = n("Add", [v["x"], v["r"]])
        count = g.const(np.float32(shape[1]))
        d = n("Sub", [h, n("Div", [n("ReduceSum", [h], axis=[1], keep_dims=True), count])])
        var = n("Div", [n("ReduceSum", [n("Mul", [d, d])], axis=[1], keep_dims=True), count])
        add(f"block-tile-channel-norm-{tag}", g,
            n("Mul", [d, n("Rsqrt", [n("Add", [var, g.const(np.float32(1e-5))])])]))
    return cases


def _grn(g: Graph, x, gamma, beta):
    """``gamma * (x * Nx) + beta + x`` with ``Nx = Gx / (mean(Gx, C) + 1e-6)``, ``Gx`` the
    L2 norm of ``x`` ([N, H, W, C]) over H, W (ConvNeXt-V2's GRN, channels last)."""
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    gx = n("Sqrt", [n("ReduceSum", [n("Mul", [x, x])], axis=[1, 2], keep_dims=True)])
    mean = n("ReduceMean", [gx], axis=[3], keep_dims=True)
    eps = g.const(np.asarray(1e-6, x.dtype.value), x.dtype.value)
    nx = n("Div", [gx, n("Add", [mean, eps])])
    return n("Add", [n("Add", [n("Mul", [gamma, n("Mul", [x, nx])]), beta]), x])


def compile_cases(cases: list[Case]) -> SimLibrary:
    """Compile every case; one simulator library holds all their kernels."""
    rendered = []
    for c in cases:
        c.result = graphkernel.compile(c.graph, c.flags, env={})
        rendered += render_all(schedules(c.result))
    return SimLibrary(rendered)


def sim_ok(res, g, seed: int = 0) -> None:
    """The compiled ``res`` of ``g`` run in the simulator on seeded normal float32 inputs:
    every kernel scheduled, and the outputs judged against the reference interpreter's."""
    from graphkernel.bisect import Evaluator
    from graphkernel.codegen.backend import run_sim

    rng = np.random.default_rng(seed)
    feeds = {v.name: rng.standard_normal(tuple(v.shape)).astype(np.float32)
             for v in g.inputs}
    got, be = run_sim(res, feeds)
    assert not be.unscheduled
    judged = Evaluator(g, feeds).judge(got)
    assert not judged.bad, judged.reason
