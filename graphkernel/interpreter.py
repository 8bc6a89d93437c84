"""numpy execution of any Graph, fused or not.

Semantics are op by op: each op computes (fp16/bf16 widened to fp32) and its
result is rounded to the op's declared output dtype. With ``compute_dtype``
(e.g. float64) every floating value is kept in that precision instead, which
gives the high-precision reference that accuracy checks compare against; with
``round_steps`` too, the inputs of step functions (Floor, comparisons, casts to
integers) are rounded to their declared dtype first.

``Assign`` on a mutable graph input writes back: after ``run`` the new values
are in ``interpreter.state`` (and, with ``write_back=True``, in the caller's
input arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from graphkernel import limits, ops, symbolic
from graphkernel.errors import ExecutionError, GraphKernelError
from graphkernel.ir import DType, Graph, Node, TensorType
from graphkernel.ops import RefContext

_BF16 = DType.bfloat16.np
# (kernel node, its input arrays, its output shapes) -> its output arrays
KernelRunner = Callable[[Node, list[np.ndarray], tuple[tuple[int, ...], ...]], list[np.ndarray]]


# ops whose result jumps where their input crosses a value (an integer, another input): a
# rounding of the input by one unit in the last place can move the result by a whole step
STEP_OPS = frozenset({"Floor", "Ceil", "Round", "Sign", "Equal", "NotEqual", "Less",
                      "LessEqual", "Greater", "GreaterEqual", "FloorMod", "Mod", "FloorDiv",
                      "ArgMax", "ArgMin"})


def is_step(node: Node) -> bool:
    """Whether ``node`` is a step function of its inputs (a Cast to an integer or bool too)."""
    return node.op in STEP_OPS or node.op == "Cast" and not node.outputs[0].dtype.is_float


class Interpreter:
    def __init__(self, graph: Graph, compute_dtype: DType | str | None = None,
                 kernel_runner: KernelRunner | None = None,
                 symbols: Mapping[str, int] | None = None, round_steps: bool = False) -> None:
        """``round_steps`` (with ``compute_dtype``): the floating inputs of a step op are
        first rounded to their declared dtype, as a kernel that keeps the value in a higher
        precision and stores it in its declared type rounds it once."""
        self.graph = graph
        self.round_steps = round_steps
        self.compute_dtype = DType.parse(compute_dtype) if compute_dtype is not None else None
        if self.compute_dtype is not None and not self.compute_dtype.is_float:
            raise ExecutionError(f"compute_dtype must be a float dtype, got {self.compute_dtype}")
        self.kernel_runner = kernel_runner
        self.state: dict[str, np.ndarray] = {}
        self.env: dict[str, int] = {}
        self.symbols = dict(symbols or {})  # already bound (a kernel inherits its caller's)

    # ------------------------------------------------------------------ dtypes
    def _storage(self, dtype: DType) -> np.dtype:
        """The numpy dtype a value of ``dtype`` is held in."""
        if self.compute_dtype is not None and dtype.is_float:
            return self.compute_dtype.np
        return dtype.np

    def _widen(self, arr: np.ndarray) -> np.ndarray:
        """Inputs to a reference: fp16/bf16 computed in fp32 (or in the compute dtype)."""
        if not is_float_array(arr):
            return arr
        if self.compute_dtype is not None:
            return arr.astype(self.compute_dtype.np, copy=False)
        if arr.dtype == np.float16 or arr.dtype == _BF16:
            return arr.astype(np.float32)
        return arr

    # -------------------------------------------------------------------- feeds
    def _bind_inputs(self, feeds: Mapping[str, Any] | Sequence[Any]) -> dict[int, np.ndarray]:
        g = self.graph
        if not isinstance(feeds, Mapping):
            feeds = list(feeds)
            if len(feeds) != len(g.inputs):
                raise ExecutionError(f"graph '{g.name}' takes {len(g.inputs)} inputs, "
                                     f"got {len(feeds)}")
            feeds = {v.name: a for v, a in zip(g.inputs, feeds, strict=True)}
        missing = [v.name for v in g.inputs if v.name not in feeds]
        if missing:
            raise ExecutionError(f"missing input(s) {', '.join(missing)} for graph '{g.name}' "
                                 f"(inputs: {', '.join(v.name for v in g.inputs)})")
        extra = sorted(set(feeds) - {v.name for v in g.inputs})
        if extra:
            raise ExecutionError(f"unknown input(s) {', '.join(extra)} for graph '{g.name}' "
                                 f"(inputs: {', '.join(v.name for v in g.inputs)})")
        env: dict[str, int] = dict(self.symbols)
        values: dict[int, np.ndarray] = {}
        for v in g.inputs:
            arr = np.asarray(feeds[v.name])
            if arr.ndim != v.type.rank:
                raise ExecutionError(f"input '{v.name}': expected {v.type}, got an array of shape "
                                     f"{list(arr.shape)}")
            for dim, actual in zip(v.type.shape, arr.shape, strict=True):
                if not symbolic.bind(dim, actual, env):
                    raise ExecutionError(f"input '{v.name}': expected {v.type}, got shape "
                                         f"{list(arr.shape)} (dim {dim!r} != {actual})")
            if arr.dtype != v.type.dtype.np:
                if not (self.compute_dtype is not None and v.type.dtype.is_float
                        and is_float_array(arr)):
                    raise ExecutionError(f"input '{v.name}': expected dtype {v.type.dtype}, got "
                                         f"{arr.dtype}")
            values[id(v)] = arr.astype(self._storage(v.type.dtype), copy=False)
        self.env = env
        return values

    # ---------------------------------------------------------------------- run
    def run(self, feeds: Mapping[str, Any] | Sequence[Any], write_back: bool = False
            ) -> list[np.ndarray]:
        g = self.graph
        values = self._bind_inputs(feeds)
        nodes = g.nodes
        last_use: dict[int, int] = {}
        for i, n in enumerate(nodes):
            for v in n.inputs:
                last_use[id(v)] = i
        keep = {id(v) for v in g.outputs}
        self.state = {}
        with np.errstate(all="ignore"):
            for i, node in enumerate(nodes):
                args = [values[id(v)] for v in node.inputs]
                results = self._run_node(node, args)
                for v, r in zip(node.outputs, results, strict=True):
                    values[id(v)] = r
                for o, i in ops.get(node.op).writes if node.op != "GraphKernel" else ():
                    ref = node.inputs[i]
                    if ref.is_input and ref.mutable:
                        self.state[ref.name] = results[o]
                for v in node.inputs:
                    if last_use.get(id(v)) == i and id(v) not in keep and not v.is_input:
                        values.pop(id(v), None)
        if write_back and isinstance(feeds, Mapping):
            for name, new in self.state.items():
                target = feeds[name]
                if isinstance(target, np.ndarray):
                    target[...] = new.astype(target.dtype)
        return [values[id(v)] for v in g.outputs]

    def _run_node(self, node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        out_types: list[TensorType] = [v.type for v in node.outputs]
        try:
            shapes = tuple(t.concrete(self.env) for t in out_types)
        except GraphKernelError as e:
            raise ExecutionError(f"node '{node.name}' ({node.op}): {e}") from None
        storage = tuple(self._storage(t.dtype) for t in out_types)
        if node.op == "GraphKernel":
            if self.kernel_runner is not None:
                raw = self.kernel_runner(node, args, shapes)
            else:
                sub = Interpreter(node.subgraph, self.compute_dtype, self.kernel_runner,
                                  self.env, self.round_steps)
                raw = sub.run({v.name: a for v, a in zip(node.subgraph.inputs, args,
                                                         strict=True)})
        else:
            opdef = ops.get(node.op)
            ctx = RefContext(shapes, storage, node.name)
            if self.round_steps and self.compute_dtype is not None and is_step(node):
                args = [a.astype(v.dtype.np) if is_float_array(a) and v.dtype.is_float else a
                        for a, v in zip(args, node.inputs, strict=True)]
            try:
                raw = opdef.reference([self._widen(a) for a in args], node.attrs, ctx)
            except GraphKernelError:
                raise
            except Exception as e:  # a reference failing on these inputs
                raise ExecutionError(f"node '{node.name}' ({node.op}) failed: "
                                     f"{type(e).__name__}: {e}") from e
        if not isinstance(raw, tuple | list):
            raw = (raw,)
        if len(raw) != len(out_types):
            raise ExecutionError(f"node '{node.name}' ({node.op}) produced {len(raw)} results, "
                                 f"expected {len(out_types)}")
        out = []
        for r, shape, dt, t in zip(raw, shapes, storage, out_types, strict=True):
            arr = np.asarray(r)
            if arr.shape != shape:
                raise ExecutionError(f"node '{node.name}' ({node.op}) produced shape "
                                     f"{list(arr.shape)}, its type says {t} = {list(shape)}")
            out.append(arr.astype(dt, copy=False))
        return out


def is_float_array(arr: np.ndarray) -> bool:
    return arr.dtype.kind == "f" or arr.dtype == _BF16


def run_graph(graph: Graph, feeds: Mapping[str, Any] | Sequence[Any],
              compute_dtype: DType | str | None = None) -> list[np.ndarray]:
    """Run ``graph`` on ``feeds`` with the numpy reference semantics."""
    return Interpreter(graph, compute_dtype).run(feeds)


def random_inputs(graph: Graph, seed: int = 0, dims: Mapping[str, int] | None = None
                  ) -> dict[str, np.ndarray]:
    """Seeded random inputs matching the graph's input types (symbols bound by ``dims``,
    default 4). Floats ~ N(0, 1); ints in [0, 8); bools fair coins."""
    rng = np.random.default_rng(seed)
    env: dict[str, int] = {}
    out: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        for d in v.type.shape:
            for s in symbolic.symbols(d):
                env.setdefault(s, (dims or {}).get(s, 4))
        shape = v.type.concrete(env)
        if (problem := limits.numel_problem(shape)) is not None:
            syms = sorted({s for d in v.type.shape for s in symbolic.symbols(d)})
            bound = ", ".join(f"{s}={env[s]}" for s in syms[:4]) + (", ..." if syms[4:] else "")
            raise ExecutionError(f"input {v.name!r}: with {bound}, its {problem}; give smaller "
                                 "sizes for the symbolic dims with --dims")
        dt = v.type.dtype
        if dt.is_float:
            arr = rng.standard_normal(shape).astype(dt.np)
        elif dt is DType.bool:
            arr = rng.integers(0, 2, shape).astype(bool)
        else:
            arr = rng.integers(0, 8, shape).astype(dt.np)
        out[v.name] = arr
    return out
