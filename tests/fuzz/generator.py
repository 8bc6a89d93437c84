"""A seeded generator of random valid graphs (NNSmith-style).

Random DAGs over the registry's ops with consistent shapes and dtypes: broadcasting
binaries, reductions over random axes, reshapes, transposes, slices, casts, selects,
composite ops, matmuls, multi-consumer values and several outputs.

    python -m tests.fuzz.generator --seeds 0:1000      # run the differential check
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable

import numpy as np

from graphkernel import Graph, TensorType, Value

UNARY = ["Abs", "Neg", "Exp", "Tanh", "Sin", "Floor", "Sign", "Sigmoid", "ReLU", "GeLU",
         "Square", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Maximum", "Minimum", "Div"]
DIMS = [1, 2, 3, 4, 5, 8]


class Gen:
    def __init__(self, seed: int, max_ops: int = 24) -> None:
        self.r = random.Random(seed)
        self.seed = seed
        self.g = Graph(f"fuzz_{seed}")
        self.values: list[Value] = []
        self.max_ops = max_ops
        self.dtype = "float16" if self.r.random() < 0.2 else "float32"

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = self.r.randint(1, 4) if rank is None else rank
        return tuple(self.r.choice(DIMS) for _ in range(rank))

    def pick(self) -> Value:
        # prefer recent values, but reuse old ones too (multi-consumer values)
        pool = [v for v in self.values if v.dtype.is_float]
        k = len(pool)
        i = min(int(self.r.expovariate(0.4)), k - 1)
        return pool[k - 1 - i]

    def node(self, op: str, ins: list[Value], attrs: dict | None = None) -> Value:
        v = self.g.add_node(op, ins, attrs or {}).outputs[0]
        self.values.append(v)
        return v

    def const_like(self, x: Value, shape: tuple[int, ...]) -> Value:
        arr = np.asarray(self.r.uniform(0.5, 2.0) if not shape else
                         np.random.default_rng(self.r.randrange(2**31)).uniform(0.5, 2.0, shape))
        return self.g.const(arr.astype(x.dtype.np))

    def broadcast_partner(self, x: Value) -> Value:
        """A value (existing, new input or constant) broadcast-compatible with x."""
        shape = list(x.shape)
        for i in range(len(shape)):
            if self.r.random() < 0.3:
                shape[i] = 1
        shape = shape[self.r.randint(0, len(shape)):] if self.r.random() < 0.3 else shape
        same = [v for v in self.values if v.shape == tuple(shape) and v.dtype == x.dtype
                and v is not x]
        roll = self.r.random()
        if same and roll < 0.5:
            return self.r.choice(same)
        if roll < 0.75:
            return self.const_like(x, tuple(shape))
        v = self.g.add_input(f"in{len(self.g.inputs)}", TensorType(tuple(shape), x.dtype))
        return v

    # ------------------------------------------------------------- ops
    def unary(self, x: Value) -> Value:
        op = self.r.choice(UNARY)
        if op == "GeLU":
            return self.node(op, [x], {"approximate": self.r.choice(["none", "tanh"])})
        return self.node(op, [x])

    def binary(self, x: Value) -> Value:
        op = self.r.choice(BINARY)
        y = self.broadcast_partner(x)
        if op == "Div":  # keep the denominator away from 0
            y = self.node("Add", [self.node("Abs", [y]), self.const_like(x, ())])
        a, b = (x, y) if self.r.random() < 0.7 else (y, x)
        return self.node(op, [a, b])

    def reduce(self, x: Value) -> Value:
        axes = sorted(self.r.sample(range(x.type.rank), self.r.randint(1, x.type.rank)))
        if self.r.random() < 0.5:
            axes = [a - x.type.rank for a in axes]  # negative axes too
        op = self.r.choice(["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"])
        return self.node(op, [x], {"axis": axes, "keep_dims": self.r.random() < 0.6})

    def reshape(self, x: Value) -> Value:
        choice = self.r.random()
        if choice < 0.4:
            return self.node("Reshape", [x], {"shape": [-1]})
        if choice < 0.7:
            return self.node("ExpandDims", [x], {"axis": [self.r.randint(-x.type.rank - 1,
                                                                          x.type.rank)]})
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if ones:
            return self.node("Squeeze", [x], {"axis": [self.r.choice(ones)]})
        n = int(np.prod(x.shape))
        return self.node("Reshape", [x], {"shape": [n, 1] if n > 1 else [1]})

    def transpose(self, x: Value) -> Value:
        perm = list(range(x.type.rank))
        self.r.shuffle(perm)
        return self.node("Transpose", [x], {"perm": perm})

    def slice(self, x: Value) -> Value:
        begin, size = [], []
        for d in x.shape:
            b = self.r.randint(0, d - 1)
            begin.append(b)
            size.append(self.r.randint(1, d - b))
        return self.node("Slice", [x], {"begin": begin, "size": size})

    def broadcast(self, x: Value) -> Value:
        shape = [self.r.choice([2, 3]) if d == 1 else d for d in x.shape]
        if self.r.random() < 0.3:
            shape = [2] + shape
        return self.node("BroadcastTo", [x], {"shape": shape})

    def select(self, x: Value) -> Value:
        y = self.broadcast_partner(x)
        cond = self.node("Greater", [x, self.const_like(x, ())])
        return self.node("Select", [cond, x, y])

    def cast(self, x: Value) -> Value:
        mid = "float16" if x.dtype.value == "float32" else "float32"
        return self.node("Cast", [self.node("Cast", [x], {"dtype": mid})],
                         {"dtype": x.dtype.value})

    def softmax(self, x: Value) -> Value:
        op = self.r.choice(["Softmax", "LogSoftmax"])
        return self.node(op, [x], {"axis": self.r.randrange(-x.type.rank, x.type.rank)})

    def layernorm(self, x: Value) -> Value:
        k = x.shape[-1]
        gamma = self.const_like(x, (k,))
        beta = self.const_like(x, (k,))
        v = self.g.add_node("LayerNorm", [x, gamma, beta]).outputs[0]
        self.values.append(v)
        return v

    def barrier(self, x: Value) -> Value:
        """An op outside the cluster list, so paths leave and re-enter fusable regions."""
        if self.r.random() < 0.5:
            return self.node("CumSum", [x], {"axis": self.r.randrange(x.type.rank)})
        y = self.node("Cast", [self.node("ArgMax", [x], {"axis": -1, "keep_dims": True})],
                      {"dtype": x.dtype.value})
        return y

    def concat(self, x: Value) -> Value:
        return self.node("Concat", [x, self.node("Neg", [x])], {"axis": -1})

    def matmul(self, x: Value) -> Value:
        flat = x if x.type.rank == 2 else self.node("Reshape", [x], {"shape": [-1, x.shape[-1]]})
        w = self.const_like(flat, (flat.shape[-1], self.r.choice(DIMS)))
        return self.node("MatMul", [flat, w])

    def build(self) -> Graph:
        n_in = self.r.randint(1, 3)
        base = self.shape()
        for i in range(n_in):
            shape = base if i == 0 or self.r.random() < 0.6 else self.shape()
            self.values.append(self.g.add_input(f"in{i}", TensorType(shape, self.dtype)))
        menu: list[tuple[float, Callable[[Value], Value]]] = [
            (4, self.unary), (5, self.binary), (2, self.reduce), (1.5, self.reshape),
            (0.8, self.transpose), (0.8, self.slice), (0.8, self.broadcast), (0.8, self.select),
            (0.5, self.cast), (0.6, self.softmax), (0.4, self.layernorm), (0.4, self.matmul),
            (1.0, self.barrier), (0.4, self.concat)]
        weights = [w for w, _ in menu]
        for _ in range(self.r.randint(3, self.max_ops)):
            fn = self.r.choices([f for _, f in menu], weights)[0]
            x = self.pick()
            if x.type.rank == 0 and fn not in (self.unary, self.binary):
                x = self.node("Reshape", [x], {"shape": [1]})
            fn(x)
        outs = [self.values[-1]]
        unused = [v for v in self.values if not v.uses and v is not self.values[-1]]
        outs += self.r.sample(unused, min(len(unused), self.r.randint(0, 2)))
        self.g.set_outputs(outs)
        self.g.remove_dead()
        self.g.validate()
        return self.g


def random_graph(seed: int, max_ops: int = 24) -> Graph:
    return Gen(seed, max_ops).build()


def random_flags(seed: int) -> str:
    """opt_level 0..3 and a random subset of patterns/passes switched off."""
    from graphkernel.patterns.base import all_patterns

    r = random.Random(seed * 7919 + 1)
    parts = [f"--opt_level={seed % 4}"]
    pats = [p.name for p in all_patterns()]
    if r.random() < 0.5:
        parts.append("--disable_fusion_pattern=" + ",".join(r.sample(pats, r.randint(1, 4))))
    if r.random() < 0.3:
        parts.append("--disable_pass=" + ",".join(r.sample(
            ["cse", "arith_simplify", "constant_fold", "reshape_elim", "dce"], 2)))
    if r.random() < 0.3:
        parts.append(f"--composite_op_limit_size={r.randint(2, 12)}")
    if r.random() < 0.2:
        parts.append("--enable_single_node_fusion")
    if r.random() < 0.2:
        parts.append("--disable_cluster_ops=" + ",".join(r.sample(["Exp", "Mul", "Add",
                                                                    "ReduceSum", "Tanh"], 2)))
    if r.random() < 0.25:  # fp16 graphs keep fp16 inside their kernels
        parts.append("--enable_low_precision")
    return " ".join(parts)


def check(seed: int) -> str | None:
    """Compile the seed's graph under the seed's flags; return a problem, or None."""
    import graphkernel
    from graphkernel.interpreter import Interpreter, random_inputs
    from graphkernel.verify import compare

    g = random_graph(seed)
    flags = random_flags(seed)
    res = graphkernel.compile(g, flags, env={})
    out = res.graph
    out.validate()  # acyclic, typed, use-lists right
    limit = res.config.composite_op_limit_size
    for n in out.nodes:
        if n.op == "GraphKernel":
            # promote_precision adds boundary casts after fusion: the limit counts the rest
            ops = [m for m in n.subgraph.nodes if m.op not in ("Constant", "Cast")]
            if len(ops) > limit:
                return f"kernel {n.name} has {len(ops)} ops > limit {limit}"
    feeds = random_inputs(g, seed)
    want = Interpreter(g, "float64").run(feeds)
    got = Interpreter(out, "float64").run(feeds)
    native = None
    for i, (a, w, v) in enumerate(zip(got, want, g.outputs, strict=True)):
        # float64 execution separates bugs from rounding; what remains is constants held in
        # the graph's dtype, so the graph dtype's accuracy.md tolerance applies
        m = compare(a, w, v.dtype, name=f"out{i}")
        if m.passed:
            continue
        # constant_fold rounds a folded constant to the graph's dtype, which the float64 run
        # of the original does not: then the graphs must agree in their own precision
        if native is None:
            native = (Interpreter(g).run(feeds), Interpreter(out).run(feeds))
        m2 = compare(native[1][i], native[0][i], v.dtype, name=f"out{i}")
        if not m2.passed:
            return f"flags {flags!r}: {m.line()} / in {v.dtype}: {m2.line()}"
    return None


def check_sim(seeds: range) -> dict[int, str]:
    """Compile each seed's graph under its flags, build every generated kernel in one
    simulator library, and run the compiled graphs through them: the outputs must match the
    op-by-op run of the original graph (accuracy.md). Returns {seed: problem}."""
    import graphkernel
    from graphkernel.bisect import Evaluator
    from graphkernel.codegen.backend import render_all, run_sim, schedules
    from graphkernel.codegen.sim.execute import SimLibrary
    from graphkernel.interpreter import random_inputs

    compiled, rendered, problems = {}, [], {}
    for seed in seeds:
        g = random_graph(seed)
        try:
            res = graphkernel.compile(g, random_flags(seed), env={})
        except Exception as e:  # noqa: BLE001 - a fuzzer lists every failing seed
            problems[seed] = f"compile: {type(e).__name__}: {e}"
            continue
        compiled[seed] = (g, res)
        rendered += render_all(schedules(res))
    lib = SimLibrary(rendered)
    for seed, (g, res) in compiled.items():
        feeds = random_inputs(g, seed)
        try:
            got, _ = run_sim(res, feeds, library=lib)
        except Exception as e:  # noqa: BLE001
            problems[seed] = f"sim: {type(e).__name__}: {e}"
            continue
        j = Evaluator(g, feeds).judge(got)  # as verify judges
        if j.bad:
            problems[seed] = f"flags {random_flags(seed)!r}: {j.reason}"
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description="differential fuzzing of the pipeline")
    ap.add_argument("--seeds", default="0:300", help="range a:b")
    ap.add_argument("--sim", action="store_true",
                    help="run the compiled graphs through their generated kernels (simulator)")
    args = ap.parse_args()
    a, b = (int(x) for x in args.seeds.split(":"))
    if args.sim:
        problems = check_sim(range(a, b))
        for seed, p in sorted(problems.items()):
            print(f"seed {seed}: {p}")
        print(f"{b - a - len(problems)} passed, {len(problems)} failed")
        return 1 if problems else 0
    bad = 0
    for seed in range(a, b):
        try:
            problem = check(seed)
        except Exception as e:  # report and continue: a fuzzer lists every failing seed
            problem = f"{type(e).__name__}: {e}"
        if problem:
            bad += 1
            print(f"seed {seed}: {problem}")
    print(f"{b - a - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
