"""A seeded generator of random valid graphs (NNSmith-style), and the differential checks
that run them.

Random DAGs over the registry's ops with consistent shapes and dtypes: broadcasting
binaries, reductions over random axes, reshapes, transposes, slices, casts, selects,
composite ops, matmuls, multi-consumer values and several outputs; and the shapes code
generation finds hard: reshapes of broadcasts, chains of BroadcastTo, concats of one-element
and mixed-length operands, independent kernels sharing an input (horizontal fusion), fp16
reductions long enough to be split (row chunks, two stages, phases), symbolic dims, chains
of views, and views of computed values (transposes, channel shuffles, concats).

    python -m tests.fuzz.generator --seeds 0:1000                 # compiled vs original graph
    python -m tests.fuzz.generator --sim --opt-level 3 --seeds 0:2000   # generated kernels

``--sim`` prints each failing seed and a table of failures by kind.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel import Graph, TensorType, Value

UNARY = ["Abs", "Neg", "Exp", "Tanh", "Sin", "Floor", "Sign", "Sigmoid", "ReLU", "GeLU",
         "Square", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Maximum", "Minimum", "Div"]
DIMS = [1, 2, 3, 4, 5, 8]
# sizes a symbolic dim takes at run time (1 too: a symbol may turn out to broadcast-like)
SYM_SIZES = [1, 3, 5, 8, 17, 33]


def _static(d: Any) -> bool:
    return isinstance(d, int)


class Gen:
    def __init__(self, seed: int, max_ops: int = 24) -> None:
        self.r = random.Random(seed)
        self.seed = seed
        self.g = Graph(f"fuzz_{seed}")
        self.values: list[Value] = []
        self.outputs: list[Value] = []  # values that must stay outputs (horizontal branches)
        self.max_ops = max_ops
        self.dtype = "float16" if self.r.random() < 0.2 else "float32"
        # one graph in five has a symbolic dim in its first input
        self.dims: dict[str, int] = {}
        if self.r.random() < 0.2:
            self.dims["s0"] = self.r.choice(SYM_SIZES)

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

    def new_input(self, shape: Sequence[Any], dtype: Any) -> Value:
        v = self.g.add_input(f"in{len(self.g.inputs)}", TensorType(tuple(shape), dtype))
        self.values.append(v)
        return v

    def const_like(self, x: Value, shape: tuple[Any, ...]) -> Value:
        shape = tuple(d if _static(d) else 1 for d in shape)  # constants are static
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
        if roll < 0.75 or not all(_static(d) or d in self.dims for d in shape):
            return self.const_like(x, tuple(shape))
        return self.g.add_input(f"in{len(self.g.inputs)}", TensorType(tuple(shape), x.dtype))

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
        return self.node("Reshape", [x], {"shape": [-1, 1]})

    def regroup(self, x: Value) -> Value:
        """Reshape merging two neighbouring axes or splitting an even one (a view that
        changes the row length the schedule sees)."""
        shape = list(x.shape)
        merge = [i for i in range(len(shape) - 1) if _static(shape[i]) and _static(shape[i + 1])]
        split = [i for i, d in enumerate(shape) if _static(d) and d % 2 == 0 and d > 2]
        if merge and (not split or self.r.random() < 0.5):
            i = self.r.choice(merge)
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        elif split:
            i = self.r.choice(split)
            shape[i:i + 1] = [2, shape[i] // 2]
        else:
            return self.reshape(x)
        if sum(1 for d in shape if not _static(d)) > 1:
            return self.reshape(x)
        return self.node("Reshape", [x], {"shape": [d if _static(d) else -1 for d in shape]})

    def transpose(self, x: Value) -> Value:
        perm = list(range(x.type.rank))
        self.r.shuffle(perm)
        return self.node("Transpose", [x], {"perm": perm})

    def slice(self, x: Value) -> Value:
        begin, size = [], []
        for d in x.shape:
            if not _static(d):  # only the whole of a symbolic axis can be taken
                begin.append(0)
                size.append(-1)
                continue
            b = self.r.randint(0, d - 1)
            begin.append(b)
            size.append(self.r.randint(1, d - b))
        return self.node("Slice", [x], {"begin": begin, "size": size})

    def strided(self, x: Value) -> Value:
        axes = [i for i, d in enumerate(x.shape) if _static(d) and d > 1]
        if not axes:
            return self.slice(x)
        ax = self.r.choice(axes)
        step = self.r.choice([2, 3])
        return self.node("StridedSlice", [x], {"begin": [self.r.randint(0, 1)],
                                               "end": [x.shape[ax]], "strides": [step],
                                               "axes": [ax]})

    def views(self, x: Value) -> Value:
        """Two or three views in a row, most often of a graph input (inputs are read
        through strided views; views of computed values take other paths)."""
        if self.r.random() < 0.6:
            ins = [v for v in self.g.inputs if v.dtype.is_float and v.type.rank]
            x = self.r.choice(ins) if ins else x
        for _ in range(self.r.randint(2, 3)):
            step = self.r.choice([self.transpose, self.slice, self.strided, self.regroup,
                                  self.reshape])
            x = step(x)
            if x.type.rank == 0:
                x = self.node("Reshape", [x], {"shape": [1]})
        return self.node(self.r.choice(["Exp", "Neg", "Abs"]), [x])

    def broadcast(self, x: Value) -> Value:
        shape = [self.r.choice([2, 3]) if d == 1 else d for d in x.shape]
        if self.r.random() < 0.3:
            shape = [2] + shape
        return self.node("BroadcastTo", [x], {"shape": shape})

    def broadcast_reshape(self, x: Value) -> Value:
        """A broadcast whose result is reshaped (flattened, regrouped or given a unit
        axis), then used: the broadcast pattern seen through a view."""
        if 1 not in x.shape and self.r.random() < 0.7:
            x = self.node("ExpandDims", [x], {"axis": [self.r.randint(0, x.type.rank)]})
        b = self.broadcast(x)
        roll = self.r.random()
        if roll < 0.3:
            v = self.node("Reshape", [b], {"shape": [-1]})
        elif roll < 0.8:
            v = self.regroup(b)
        else:
            v = self.node("ExpandDims", [b], {"axis": [0]})
        return self.binary(v) if self.r.random() < 0.6 else self.unary(v)

    def broadcast_chain(self, x: Value) -> Value:
        """BroadcastTo of BroadcastTo (of a value with unit axes): the second expands what
        the first left, and may add leading axes."""
        if 1 not in x.shape:
            x = self.node("ExpandDims", [x], {"axis": [self.r.randint(0, x.type.rank)]})
        s1 = [self.r.choice([2, 3]) if d == 1 and self.r.random() < 0.5 else d
              for d in x.shape]
        if self.r.random() < 0.5:
            s1 = [1] + s1
        b1 = self.node("BroadcastTo", [x], {"shape": s1})
        s2 = [self.r.choice([2, 4]) if d == 1 else d for d in s1]
        if self.r.random() < 0.4:
            s2 = [self.r.choice([2, 3])] + s2
        b2 = self.node("BroadcastTo", [b1], {"shape": s2})
        return self.binary(b2) if self.r.random() < 0.5 else self.unary(b2)

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
        if not _static(k):
            return self.softmax(x)
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

    def one_element(self, x: Value) -> Value:
        """A [1]-shaped value derived from x (a reduction, a slice or a constant)."""
        roll = self.r.random()
        if roll < 0.4:
            s = self.node("ReduceMax" if roll < 0.2 else "ReduceSum", [x],
                          {"axis": list(range(x.type.rank)), "keep_dims": False})
            return self.node("Reshape", [s], {"shape": [1]})
        if roll < 0.7 and all(_static(d) for d in x.shape):
            flat = self.node("Reshape", [x], {"shape": [-1]})
            return self.node("Slice", [flat], {"begin": [0], "size": [1]})
        if roll < 0.85:
            return self.const_like(x, (1,))
        return self.g.add_input(f"in{len(self.g.inputs)}", TensorType((1,), x.dtype))

    def concat_mixed(self, x: Value) -> Value:
        """Concat of one-element operands, or of operands of different lengths along the
        axis (slices of x, new inputs, constants)."""
        if self.r.random() < 0.4:
            parts = [self.one_element(x) for _ in range(self.r.randint(2, 4))]
            if self.r.random() < 0.5 and all(_static(d) for d in x.shape):  # a longer one
                parts.insert(self.r.randrange(len(parts) + 1),
                             self.node("Reshape", [x], {"shape": [-1]}))
            return self.node("Concat", parts, {"axis": 0})
        axes = [i for i, d in enumerate(x.shape) if _static(d)]
        if not axes:
            return self.concat(x)
        ax = self.r.choice(axes)
        parts = [x]
        for _ in range(self.r.randint(1, 3)):
            shape = list(x.shape)
            shape[ax] = self.r.choice([1, 2, 3, 5])
            roll = self.r.random()
            if roll < 0.4 and x.shape[ax] > 1:
                size = [-1 if not _static(d) else d for d in x.shape]
                size[ax] = self.r.randint(1, x.shape[ax] - 1)
                part = self.node("Slice", [x], {"begin": [0] * x.type.rank, "size": size})
            elif roll < 0.7 and all(_static(d) or d in self.dims for d in shape):
                part = self.g.add_input(f"in{len(self.g.inputs)}", TensorType(tuple(shape),
                                                                              x.dtype))
            elif all(_static(d) for d in shape):
                part = self.const_like(x, tuple(shape))
            else:
                part = self.node("Neg", [x])
            parts.insert(self.r.randrange(len(parts) + 1), part)
        return self.node("Concat", parts, {"axis": ax - x.type.rank
                                           if self.r.random() < 0.5 else ax})

    def horizontal(self, x: Value) -> Value:
        """Independent kernels that share x: each branch ends in a reduction over its own
        axes (so no vertical fusion joins them) and is a graph output; parallel_fusion may
        launch them together."""
        last = x
        for _ in range(self.r.randint(2, 3)):
            v = self.unary(x) if self.r.random() < 0.7 else self.binary(x)
            if x.type.rank and self.r.random() < 0.8:
                v = self.reduce(v)
            self.outputs.append(v)
            last = v
        return last

    def split_reduction(self, x: Value) -> Value:
        """A fp16 reduction long enough to be split: a whole-tensor reduction with work for
        every core (two stages), rows too long for the UB (row chunks), or a softmax over
        such rows (phase kernels). A new fp16 input feeds it; the small result joins the
        graph through a cast to the graph's dtype."""
        kind = self.r.choice(["whole", "long_rows", "softmax"])
        if kind == "whole":
            shape: tuple[int, ...] = (self.r.choice([64, 96]), self.r.choice([1024, 1040]))
        else:
            shape = (self.r.choice([1, 2, 3]), self.r.choice([70001, 98304]))
        v = self.new_input(shape, "float16")
        v = self.node(self.r.choice(["Exp", "Abs", "Neg", "Tanh", "Identity"]), [v])
        if self.r.random() < 0.5:
            v = self.node("Mul", [v, self.const_like(v, ())])
        if kind == "softmax":
            v = self.node("Softmax", [v], {"axis": -1})
            v = self.node("ReduceMax", [v], {"axis": [-1], "keep_dims": True})
        else:
            op = self.r.choice(["ReduceSum", "ReduceMax", "ReduceMean", "ReduceMin"])
            axes = [0, 1] if kind == "whole" else [-1]
            v = self.node(op, [v], {"axis": axes, "keep_dims": self.r.random() < 0.5})
        if self.dtype != "float16":
            v = self.node("Cast", [v], {"dtype": self.dtype})
        self.outputs.append(v)
        return v

    def matmul(self, x: Value) -> Value:
        if not _static(x.shape[-1]):
            return self.unary(x)
        flat = x if x.type.rank == 2 else self.node("Reshape", [x], {"shape": [-1, x.shape[-1]]})
        w = self.const_like(flat, (flat.shape[-1], self.r.choice(DIMS)))
        return self.node("MatMul", [flat, w])

    def computed_views(self) -> Value | None:
        """Views of computed values (drawn from a random stream of their own and joined as one
        more output, so every seed's other ops are the ones it always had): a transpose of a
        computed value keeping its last axis, a channel shuffle (Reshape -> Transpose ->
        Reshape), a Concat of pieces of different lengths ending with one shared op, or of
        new inputs, followed by elementwise ops, or a computed value rotated as rotary
        embedding does: sliced in two along the last axis, one piece negated, concatenated
        back the other way round (of the first columns only, the rest passed through)."""
        r = random.Random(self.seed * 7919 + 1)
        if r.random() < 0.6:
            return None
        ins = [v for v in self.g.inputs if v.dtype.is_float and v.type.rank >= 2]
        if not ins:
            return None
        x = r.choice(ins)
        n = lambda op, vs, **a: self.g.add_node(op, vs, a).outputs[0]  # noqa: E731
        y = n(r.choice(["Exp", "Neg", "Abs", "Tanh"]), [x])
        kind = r.choice(["transpose", "shuffle", "concat_sunk", "concat_inputs", "rotate"])
        shape = list(x.shape)
        if kind == "rotate":
            return self._rotate(r, x)
        if kind == "transpose":
            perm = list(range(len(shape) - 1))
            r.shuffle(perm)
            return n("Mul", [n("Transpose", [y], perm=perm + [len(shape) - 1]), n("Sigmoid", [
                n("Transpose", [x], perm=perm + [len(shape) - 1])])])
        if kind == "shuffle":
            c = next((i for i, d in enumerate(shape[:-1]) if _static(d) and d % 2 == 0
                      and d > 2), None)
            if c is None:
                return n("Neg", [y])
            split = shape[:c] + [2, shape[c] // 2] + shape[c + 1:]
            split = [d if _static(d) else -1 for d in split]
            t = n("Transpose", [n("Reshape", [y], shape=split)],
                  perm=list(range(c)) + [c + 1, c] + list(range(c + 2, len(split))))
            return n("Reshape", [t], shape=[d if _static(d) else -1 for d in shape])
        axes = [i for i, d in enumerate(shape) if _static(d)]
        if not axes:
            return n("Neg", [y])
        ax = r.choice(axes)
        parts = []
        for _ in range(r.randint(2, 3)):
            part = list(shape)
            part[ax] = r.choice([1, 2, 3, 5])
            parts.append(self.g.add_input(f"in{len(self.g.inputs)}",
                                          TensorType(tuple(part), x.dtype)))
        if kind == "concat_sunk":
            op = r.choice(["Exp", "Neg", "Abs"])
            parts = [n(op, [p]) for p in parts]
        cat = n("Concat", parts, axis=ax)
        return n("Add", [n("Relu", [cat]), n("Exp", [cat])]) if r.random() < 0.5 else \
            n("Tanh", [cat])

    def _rotate(self, r: random.Random, x: Value) -> Value:
        """``y*z + cat(-y[..., c:w], y[..., :c], y[..., w:]) * z`` for ``y = op(z)`` and a
        new input ``z`` of x's leading axes and a last axis of 16 to 32 (rotary embedding's
        ``rotate_half`` over the first ``w`` columns): cut points mostly on 8 columns (a UB
        block of fp32, what the code generator copies), sometimes anywhere."""
        n = lambda op, vs, **a: self.g.add_node(op, vs, a).outputs[0]  # noqa: E731
        d = r.choice([16, 24, 32])
        z = self.g.add_input(f"in{len(self.g.inputs)}",
                             TensorType(tuple(x.shape[:-1]) + (d,), x.dtype))
        y = n(r.choice(["Exp", "Neg", "Tanh"]), [z])
        aligned = r.random() < 0.7
        w = d if r.random() < 0.6 else r.choice(range(8, d, 8)) if aligned else \
            r.randint(2, d - 1)
        c = r.choice(range(8, w, 8)) if aligned and w >= 16 else r.randint(1, w - 1)

        def cols(a: int, b: int) -> Value:
            return n("StridedSlice", [y], begin=[a], end=[b], strides=[1], axes=[-1])

        pieces = [n(r.choice(["Neg", "Abs"]), [cols(c, w)]), cols(0, c)]
        if w < d:
            pieces.append(cols(w, d))
        rot = n("Concat", pieces, axis=-1)
        return n("Add", [n("Mul", [y, z]), n("Mul", [rot, z])])

    def build(self) -> Graph:
        n_in = self.r.randint(1, 3)
        base: tuple[Any, ...] = self.shape()
        if self.dims:
            i = self.r.randrange(len(base))
            base = base[:i] + ("s0",) + base[i + 1:]
        for i in range(n_in):
            shape = base if i == 0 or self.r.random() < 0.6 else self.shape()
            self.values.append(self.g.add_input(f"in{i}", TensorType(shape, self.dtype)))
        menu: list[tuple[float, Callable[[Value], Value]]] = [
            (4, self.unary), (5, self.binary), (2, self.reduce), (1.5, self.reshape),
            (0.8, self.transpose), (0.8, self.slice), (0.8, self.broadcast), (0.8, self.select),
            (0.5, self.cast), (0.6, self.softmax), (0.4, self.layernorm), (0.4, self.matmul),
            (1.0, self.barrier), (0.4, self.concat), (0.6, self.broadcast_reshape),
            (0.5, self.broadcast_chain), (0.6, self.concat_mixed), (0.5, self.horizontal),
            (0.6, self.views), (0.4, self.regroup), (0.3, self.strided)]
        weights = [w for w, _ in menu]
        if self.r.random() < 0.08:  # rare: big arrays make the run slower
            self.split_reduction(self.values[0])
        for _ in range(self.r.randint(3, self.max_ops)):
            fn = self.r.choices([f for _, f in menu], weights)[0]
            x = self.pick()
            if x.type.rank == 0 and fn not in (self.unary, self.binary):
                x = self.node("Reshape", [x], {"shape": [1]})
            fn(x)
        outs = [self.values[-1]]
        outs += [v for v in self.outputs if all(v is not o for o in outs)]
        unused = [v for v in self.values if not v.uses and all(v is not o for o in outs)]
        outs += self.r.sample(unused, min(len(unused), self.r.randint(0, 2)))
        extra = self.computed_views()
        self.g.set_outputs(outs + ([extra] if extra is not None else []))
        self.g.remove_dead()
        self.g.validate()
        return self.g


@dataclass
class Case:
    """One fuzz case: a graph, the flags it is compiled under, and its inputs' sizes."""

    seed: int
    graph: Graph
    flags: str
    dims: dict[str, int] = field(default_factory=dict)

    def inputs(self) -> dict[str, np.ndarray]:
        from graphkernel.interpreter import random_inputs

        return random_inputs(self.graph, self.seed, self.dims)


def random_graph(seed: int, max_ops: int = 24) -> Graph:
    return Gen(seed, max_ops).build()


def random_case(seed: int, opt_level: int | None = None, max_ops: int = 24) -> Case:
    gen = Gen(seed, max_ops)
    g = gen.build()
    return Case(seed, g, random_flags(seed, opt_level), dict(gen.dims))


def random_flags(seed: int, opt_level: int | None = None) -> str:
    """opt_level (seed % 4 unless given) and a random subset of patterns/passes switched
    off, features switched on, and low precision inside kernels."""
    from graphkernel.patterns.base import all_patterns

    r = random.Random(seed * 7919 + 1)
    parts = [f"--opt_level={seed % 4 if opt_level is None else opt_level}"]
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
    if r.random() < 0.15:  # horizontal fusion below its level too
        parts.append("--enable_parallel_fusion")
    return " ".join(parts)


def check(seed: int) -> str | None:
    """Compile the seed's graph under the seed's flags; return a problem, or None."""
    import graphkernel
    from graphkernel.interpreter import Interpreter
    from graphkernel.verify import compare

    case = random_case(seed)
    g, flags = case.graph, case.flags
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
    feeds = case.inputs()
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


# ------------------------------------------------------------ simulator runs
# Failure kinds, in the order the table prints them. A simulator error is a kernel breaking
# a rule of the hardware model; a crash is any other exception on the way (compile, render,
# g++, launch); a mismatch is a run that finished with outputs verify calls bad.
KINDS = ("sim: out of bounds", "sim: sync", "sim: budget", "sim: other rule", "crash",
         "mismatch")
_SIM_KEYWORDS = (
    ("sim: out of bounds", ("out of bounds", "overruns")),
    ("sim: sync", ("sync", "pipe", "hardevent", "setflag", "waitflag")),
    ("sim: budget", ("ub overflow", "fits the unified buffer", "no free buffer")),
)


def classify_sim_error(message: str) -> str:
    """The kind of a simulator error, from its message."""
    low = message.lower()
    for kind, words in _SIM_KEYWORDS:
        if any(w in low for w in words):
            return kind
    return "sim: other rule"


@dataclass
class Failure:
    seed: int
    kind: str
    flags: str
    message: str

    def line(self) -> str:
        return f"seed {self.seed} [{self.kind}] flags {self.flags!r}: {self.message}"


def _crash(case: Case, where: str, e: BaseException) -> Failure:
    return Failure(case.seed, "crash", case.flags, f"{where}: {type(e).__name__}: {e}")


def _build(rendered: list) -> Any:
    from graphkernel.codegen.sim.execute import SimLibrary

    return SimLibrary(rendered)


def check_sim(seeds: Sequence[int] | range, opt_level: int | None = None, chunk: int = 40,
              workers: int | None = None, max_ops: int = 24) -> dict[int, Failure]:
    """Compile each seed's graph under its flags (``opt_level`` forced when given), build
    the generated kernels (``chunk`` graphs per simulator library, libraries built in
    parallel), and run the compiled graphs through them: the outputs must match the op-by-op
    run of the original graph as verify judges them (accuracy.md). Returns the failures by
    seed."""
    import graphkernel
    from graphkernel.bisect import Evaluator
    from graphkernel.codegen.backend import render_all, run_sim, schedules
    from graphkernel.codegen.sim.runner import SimulatorError

    failures: dict[int, Failure] = {}
    compiled: list[tuple[Case, Any, list]] = []
    for seed in seeds:
        case = random_case(seed, opt_level, max_ops)
        try:
            res = graphkernel.compile(case.graph, case.flags, env={})
        except Exception as e:  # noqa: BLE001 - a fuzzer lists every failing seed
            failures[seed] = _crash(case, "compile", e)
            continue
        try:
            rendered = render_all(schedules(res))
        except Exception as e:  # noqa: BLE001
            failures[seed] = _crash(case, "render", e)
            continue
        compiled.append((case, res, rendered))
    groups = [compiled[i:i + chunk] for i in range(0, len(compiled), chunk)]

    def build_group(group: list) -> list:
        """One library per group; when it does not compile, one per case, so only the
        cases whose kernels do not compile are lost."""
        try:
            lib = _build([r for _, _, rs in group for r in rs])
            return [(c, res, lib) for c, res, _ in group]
        except SimulatorError:
            out = []
            for c, res, rs in group:
                try:
                    out.append((c, res, _build(rs)))
                except SimulatorError as e:
                    out.append((c, res, e))
            return out

    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:  # g++ runs in parallel
        built = [x for part in pool.map(build_group, groups) for x in part]
    for case, res, lib in built:
        if isinstance(lib, Exception):
            failures[case.seed] = _crash(case, "g++", lib)
            continue
        feeds = case.inputs()
        try:
            got, _ = run_sim(res, feeds, library=lib)
        except SimulatorError as e:
            failures[case.seed] = Failure(case.seed, classify_sim_error(str(e)), case.flags,
                                          str(e))
            continue
        except Exception as e:  # noqa: BLE001
            failures[case.seed] = _crash(case, "run", e)
            continue
        j = Evaluator(case.graph, feeds).judge(got)  # as verify judges
        if j.bad:
            failures[case.seed] = Failure(case.seed, "mismatch", case.flags, j.reason)
    return failures


def table(rows: Sequence[tuple[str, int, dict[int, Failure]]]) -> str:
    """Failures by kind, one row per opt level: (label, graphs, failures)."""
    heads = ["opt_level", "graphs", "passed", *KINDS]
    widths = [max(len(h), 9) for h in heads]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    for label, n, fails in rows:
        counts = [sum(1 for f in fails.values() if f.kind == k) for k in KINDS]
        cells = [label, str(n), str(n - len(fails)), *map(str, counts)]
        lines.append("  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    return "\n".join(lines)


def _seed_range(text: str) -> range:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a range a:b, e.g. 0:2000") from None
    return range(a, b)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        levels = []
    if not levels or any(not 0 <= x <= 3 for x in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0..3 or a comma list, e.g. 1,3")
    return levels


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="differential fuzzing of the pipeline")
    ap.add_argument("--seeds", type=_seed_range, default=range(0, 300), help="range a:b")
    ap.add_argument("--sim", action="store_true",
                    help="run the compiled graphs through their generated kernels (simulator)")
    ap.add_argument("--opt-level", type=_levels, default=None,
                    help="0..3, or a comma list (default: seed %% 4)")
    ap.add_argument("--chunk", type=int, default=40, help="graphs per simulator library")
    args = ap.parse_args(argv)
    seeds = args.seeds
    if args.sim:
        levels: list[int | None] = [None] if args.opt_level is None else args.opt_level
        rows = []
        for level in levels:
            t0 = time.perf_counter()
            fails = check_sim(seeds, level, chunk=args.chunk)
            for f in sorted(fails.values(), key=lambda f: f.seed):
                print(f.line(), flush=True)
            label = "seed % 4" if level is None else str(level)
            print(f"opt_level {label}: {len(seeds)} graphs in {time.perf_counter() - t0:.0f} s",
                  flush=True)
            rows.append((label, len(seeds), fails))
        print(table(rows))
        return 1 if any(fails for _, _, fails in rows) else 0
    bad = 0
    for seed in seeds:
        try:
            problem = check(seed)
        except Exception as e:  # report and continue: a fuzzer lists every failing seed
            problem = f"{type(e).__name__}: {e}"
        if problem:
            bad += 1
            print(f"seed {seed}: {problem}")
    print(f"{len(seeds) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
