"""torch.fx import: an ATen-level GraphModule (torch.export, or Dynamo + AOT with the core
ATen decompositions) becomes a Graph.

Each mapped ATen overload has a handler in ``ATEN``; dtypes follow torch's promotion as
recorded in each node's FakeTensor (``meta["val"]``). Anything else becomes an Opaque node
that calls the ATen op itself (``impl="aten"``); ``Fallback aten.<op>: <reason>`` is logged
once per op type.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphkernel.errors import FrontendError, GraphKernelError
from graphkernel.ir import DType, Graph, TensorType, Value

log = logging.getLogger("graphkernel.fx")
_LOGGED: set[str] = set()
INT64_MAX = 2**63 - 1

try:
    import torch
except ImportError:  # pragma: no cover - only without the torch extra
    torch = None

_TORCH_DTYPES: dict[Any, DType] = {}
if torch is not None:
    _TORCH_DTYPES = {torch.float16: DType.float16, torch.bfloat16: DType.bfloat16,
                     torch.float32: DType.float32, torch.float64: DType.float64,
                     torch.int8: DType.int8, torch.int16: DType.int16, torch.int32: DType.int32,
                     torch.int64: DType.int64, torch.uint8: DType.uint8, torch.bool: DType.bool}


def torch_dtype(dt: Any, where: str) -> DType:
    if dt in _TORCH_DTYPES:
        return _TORCH_DTYPES[dt]
    raise FrontendError(f"{where}: torch dtype {dt} is not supported (accepted: "
                        + ", ".join(str(k).replace("torch.", "") for k in _TORCH_DTYPES) + ")")


def to_numpy(t: Any) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.detach().float().cpu().numpy().astype(DType.bfloat16.np)
    return t.detach().cpu().numpy()


def to_torch(a: np.ndarray) -> Any:
    a = np.asarray(a)
    if a.dtype == DType.bfloat16.np:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    # (np.ascontiguousarray would turn a 0-d array into shape (1,))
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy())


def _dim(d: Any) -> int | str:
    """A size from a FakeTensor: an int, or a SymInt that is a product of symbols."""
    if isinstance(d, int):
        return d
    text = str(d).replace(" ", "")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\*[A-Za-z0-9_]+)*|\d+(\*[A-Za-z_][A-Za-z0-9_]*)+",
                        text):
        raise FrontendError(f"symbolic size {d} is not a product of symbols; graphkernel "
                            "models sizes such as 's0' or '4*s0' (mark fewer dims dynamic)")
    return text


def meta_type(node: Any, where: str) -> TensorType | None:
    val = node.meta.get("val")
    if val is None or not hasattr(val, "shape"):
        return None
    return TensorType(tuple(_dim(d) for d in val.shape), torch_dtype(val.dtype, where))


# --------------------------------------------------------------------- context
class Ctx:
    def __init__(self, graph: Graph, node: Any, env: dict) -> None:
        self.g = graph
        self.node = node
        self.env = env
        self.name = node.name

    def arg(self, i: int, default: Any = None) -> Any:
        args = self.node.args
        if i < len(args):
            return self._value(args[i])
        return default

    def kw(self, key: str, default: Any = None) -> Any:
        return self._value(self.node.kwargs[key]) if key in self.node.kwargs else default

    def argkw(self, i: int, key: str, default: Any = None) -> Any:
        if i < len(self.node.args):
            return self._value(self.node.args[i])
        return self.kw(key, default)

    def _value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, list | tuple):
            return [self._value(x) for x in a]
        if isinstance(a, torch.SymInt):
            return _dim(a)
        return a

    @property
    def out_type(self) -> TensorType | None:
        return meta_type(self.node, self.name)

    def emit(self, op: str, inputs: list[Value], attrs: dict | None = None) -> Value:
        n = self.g.add_node(op, inputs, attrs or {}, name=self.g.fresh_name(self.name),
                            origin=(self.name,))
        return n.outputs[0] if len(n.outputs) == 1 else n.outputs

    def emit_multi(self, op: str, inputs: list[Value], attrs: dict) -> list[Value]:
        return list(self.g.add_node(op, inputs, attrs, name=self.g.fresh_name(self.name),
                                    origin=(self.name,)).outputs)

    def const(self, value: Any, dtype: DType) -> Value:
        return self.g.add_node("Constant", [], {"value": np.asarray(value, dtype.np)},
                               name=self.g.fresh_name(f"{self.name}_c"), origin=(self.name,)
                               ).output

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if v.dtype == dtype else self.emit("Cast", [v], {"dtype": dtype})

    def tensor(self, x: Any, dtype: DType) -> Value:
        """A tensor operand in ``dtype`` (Python scalars become constants)."""
        if isinstance(x, Value):
            return self.cast(x, dtype)
        return self.const(x, dtype)


Handler = Callable[[Ctx], Any]
ATEN: dict[str, Handler] = {}


def aten(*names: str):
    def deco(fn: Handler) -> Handler:
        for n in names:
            ATEN[n] = fn
        return fn

    return deco


class Unmapped(Exception):
    """A handler declines a node; it runs as an Opaque ATen call instead."""


# ------------------------------------------------------------- elementwise
_UNARY = {"neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "rsqrt": "Rsqrt", "tanh": "Tanh", "erf": "Erf", "sigmoid": "Sigmoid", "relu": "ReLU",
          "silu": "SiLU", "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos",
          "floor": "Floor", "ceil": "Ceil", "sign": "Sign", "log1p": "Log1p", "expm1": "Expm1",
          "logical_not": "LogicalNot", "trunc": "Trunc", "round": "Round", "erfc": "Erfc",
          "clone": "Identity", "alias": "Identity", "detach": "Identity",
          "lift_fresh_copy": "Identity", "isnan": "IsNan", "isinf": "IsInf"}


@aten(*(f"aten.{k}.default" for k in _UNARY))
def _unary(c: Ctx):
    op = _UNARY[str(c.node.target).split(".")[1]]
    t = c.out_type
    x = c.arg(0)
    if t is not None and t.dtype != DType.bool and op not in ("IsNan", "IsInf"):
        x = c.cast(x, t.dtype)
    return c.emit(op, [x])


_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Maximum",
           "minimum": "Minimum", "pow": "Pow", "atan2": "Atan2", "remainder": "FloorMod",
           "fmod": "Mod", "eq": "Equal", "ne": "NotEqual", "gt": "Greater", "ge": "GreaterEqual",
           "lt": "Less", "le": "LessEqual", "logical_and": "LogicalAnd",
           "logical_or": "LogicalOr", "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr"}
_COMPARE = {"Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual"}


def _operand_dtype(c: Ctx, a: Any, b: Any, op: str) -> DType:
    """The dtype both operands are computed in (torch's promotion, from the fake tensors)."""
    if op in _COMPARE or op in ("LogicalAnd", "LogicalOr"):
        ta = a.dtype if isinstance(a, Value) else None
        tb = b.dtype if isinstance(b, Value) else None
        if op in ("LogicalAnd", "LogicalOr"):
            return DType.bool
        if ta and tb:
            return torch_dtype(torch.promote_types(_to_t(ta), _to_t(tb)), c.name)
        t = ta or tb
        other = b if ta else a
        if t.is_int and isinstance(other, float):
            return DType.float32
        return t
    return c.out_type.dtype


def _to_t(d: DType) -> Any:
    return next(k for k, v in _TORCH_DTYPES.items() if v is d)


@aten(*(f"aten.{k}.{o}" for k in _BINARY for o in ("Tensor", "Scalar", "default",
                                                     "Tensor_Tensor", "Tensor_Scalar")))
def _binary(c: Ctx):
    name = str(c.node.target).split(".")[1]
    op = _BINARY[name]
    a, b = c.arg(0), c.arg(1)
    dt = _operand_dtype(c, a, b, op)
    alpha = c.kw("alpha", 1)
    if op in ("Add", "Sub") and alpha != 1:
        b = c.emit("Mul", [c.tensor(b, dt), c.const(alpha, dt)])
    if op == "Div" and dt.is_int:  # true division of ints gives a float in torch
        raise Unmapped("integer true division")
    return c.emit(op, [c.tensor(a, dt), c.tensor(b, dt)])


@aten("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(c: Ctx):
    dt = c.out_type.dtype
    b = c.tensor(c.arg(0), dt)
    a = c.tensor(c.arg(1), dt)
    alpha = c.kw("alpha", 1)
    if alpha != 1:
        b = c.emit("Mul", [b, c.const(alpha, dt)])
    return c.emit("Sub", [a, b])


@aten("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(c: Ctx):
    dt = c.out_type.dtype
    a, b = c.tensor(c.arg(0), dt), c.tensor(c.arg(1), dt)
    mode = c.kw("rounding_mode")
    if mode is None:
        return c.emit("Div", [a, b])
    if mode == "floor":
        return c.emit("FloorDiv", [a, b]) if dt.is_int else c.emit("Floor", [c.emit("Div", [a, b])])
    if dt.is_int:
        return c.emit("Div", [a, b])  # graphkernel's int Div truncates
    return c.emit("Trunc", [c.emit("Div", [a, b])])


@aten("aten.gelu.default")
def _gelu(c: Ctx):
    return c.emit("GeLU", [c.arg(0)], {"approximate": c.kw("approximate", "none")})


@aten("aten.leaky_relu.default")
def _leaky(c: Ctx):
    return c.emit("LeakyReLU", [c.arg(0)], {"alpha": float(c.arg(1, 0.01))})


@aten("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp(c: Ctx):
    name = str(c.node.target)
    lo = c.arg(1) if "clamp_max" not in name else None
    hi = c.arg(2) if name == "aten.clamp.default" else (c.arg(1) if "clamp_max" in name else None)
    if isinstance(lo, Value) or isinstance(hi, Value):
        raise Unmapped("tensor bounds")
    return c.emit("ClampScalar", [c.arg(0)], {"min": lo, "max": hi})


@aten("aten.where.self")
def _where(c: Ctx):
    dt = c.out_type.dtype
    return c.emit("Select", [c.arg(0), c.tensor(c.arg(1), dt), c.tensor(c.arg(2), dt)])


@aten("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(c: Ctx):
    x = c.arg(0)
    return c.emit("Select", [c.arg(1), c.tensor(c.arg(2), x.dtype), x])


@aten("aten._to_copy.default", "prims.convert_element_type.default")
def _to_copy(c: Ctx):
    return c.cast(c.arg(0), c.out_type.dtype) if c.arg(0).dtype != c.out_type.dtype else \
        c.emit("Identity", [c.arg(0)])


# -------------------------------------------------------------- reductions
def _dims(c: Ctx, i: int) -> list[int] | None:
    d = c.arg(i)
    if d is None:
        return None
    return [d] if isinstance(d, int) else list(d)


@aten("aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default",
      "aten.amax.default", "aten.amin.default", "aten.prod.dim_int")
def _reduce(c: Ctx):
    name = str(c.node.target)
    x = c.arg(0)
    op = {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax", "amin": "ReduceMin",
          "prod": "ReduceProd"}[name.split(".")[1]]
    # sum.default / mean.default reduce everything; the others name their dims (prod: one int)
    axes = None if name in ("aten.sum.default", "aten.mean.default") else _dims(c, 1)
    keep = bool(c.arg(2, False)) if len(c.node.args) > 2 else bool(c.kw("keepdim", False))
    dt = c.out_type.dtype
    x = c.cast(x, dt)
    return c.emit(op, [x], {"axis": axes or None, "keep_dims": keep})


@aten("aten.var_mean.correction")
def _var_mean(c: Ctx):
    x = c.arg(0)
    axes = _dims(c, 1) or list(range(x.type.rank))
    keep = bool(c.kw("keepdim", False))
    corr = c.kw("correction", 1)
    n = 1
    for a in axes:
        if not isinstance(x.shape[a], int):
            raise Unmapped("symbolic reduced dims")
        n *= x.shape[a]
    mean_k = c.emit("ReduceMean", [x], {"axis": axes, "keep_dims": True})
    d = c.emit("Sub", [x, mean_k])
    ss = c.emit("ReduceSum", [c.emit("Mul", [d, d])], {"axis": axes, "keep_dims": keep})
    var = c.emit("Div", [ss, c.const(max(n - corr, 0), x.dtype)])
    mean = mean_k if keep else c.emit("Squeeze", [mean_k], {"axis": axes})
    return [var, mean]


@aten("aten.native_layer_norm.default")
def _layer_norm(c: Ctx):
    x, shape, w, b, eps = (c.arg(i) for i in range(5))
    k = len(shape)
    begin = x.type.rank - k
    pshape = list(x.shape[begin:])
    w = w if w is not None else c.const(np.ones(pshape), x.dtype)
    b = b if b is not None else c.const(np.zeros(pshape), x.dtype)
    y, mean, var = c.emit_multi("LayerNorm", [x, w, b], {"begin_norm_axis": begin,
                                                         "begin_params_axis": begin,
                                                         "epsilon": float(eps)})
    rstd = c.emit("Rsqrt", [c.emit("Add", [var, c.const(eps, var.dtype)])])
    return [y, mean, rstd]


@aten("aten._softmax.default", "aten._log_softmax.default")
def _softmax(c: Ctx):
    op = "LogSoftmax" if "log_softmax" in str(c.node.target) else "Softmax"
    x = c.cast(c.arg(0), c.out_type.dtype)
    return c.emit(op, [x], {"axis": c.arg(1)})


# ------------------------------------------------------------------ shapes
@aten("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(c: Ctx):
    return c.emit("Reshape", [c.arg(0)], {"shape": list(c.arg(1))})


@aten("aten.expand.default")
def _expand(c: Ctx):
    return c.emit("BroadcastTo", [c.arg(0)], {"shape": list(c.arg(1))})


@aten("aten.permute.default")
def _permute(c: Ctx):
    x = c.arg(0)
    return c.emit("Transpose", [x], {"perm": [d % x.type.rank for d in c.arg(1)]})


@aten("aten.transpose.int")
def _transpose(c: Ctx):
    x = c.arg(0)
    r = x.type.rank
    perm = list(range(r))
    a, b = c.arg(1) % r, c.arg(2) % r
    perm[a], perm[b] = perm[b], perm[a]
    return c.emit("Transpose", [x], {"perm": perm})


@aten("aten.t.default")
def _t(c: Ctx):
    x = c.arg(0)
    return c.emit("Transpose", [x], {"perm": [1, 0]}) if x.type.rank == 2 else \
        c.emit("Identity", [x])


@aten("aten.unsqueeze.default")
def _unsqueeze(c: Ctx):
    return c.emit("ExpandDims", [c.arg(0)], {"axis": [c.arg(1)]})


@aten("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(c: Ctx):
    x = c.arg(0)
    dims = c.arg(1)
    if dims is None:
        return c.emit("Squeeze", [x], {"axis": None})
    dims = [dims] if isinstance(dims, int) else list(dims)
    keep = [d % x.type.rank for d in dims if x.shape[d] == 1]
    return c.emit("Squeeze", [x], {"axis": keep}) if keep else c.emit("Identity", [x])


@aten("aten.slice.Tensor")
def _slice(c: Ctx):
    x = c.arg(0)
    dim, start, end, step = c.arg(1, 0), c.arg(2), c.arg(3), c.arg(4, 1)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else min(end, INT64_MAX)
    return c.emit("StridedSlice", [x], {"begin": [start], "end": [end], "strides": [step],
                                        "axes": [dim]})


@aten("aten.select.int")
def _select(c: Ctx):
    x, dim, idx = c.arg(0), c.arg(1), c.arg(2)
    d = x.shape[dim]
    if idx < 0:
        if not isinstance(d, int):
            raise Unmapped("negative index into a symbolic dim")
        idx += d
    s = c.emit("StridedSlice", [x], {"begin": [idx], "end": [idx + 1], "axes": [dim]})
    return c.emit("Squeeze", [s], {"axis": [dim % x.type.rank]})


@aten("aten.cat.default")
def _cat(c: Ctx):
    xs = [v for v in c.arg(0) if not (v.type.rank == 1 and v.shape[0] == 0)]
    dt = c.out_type.dtype
    return c.emit("Concat", [c.cast(v, dt) for v in xs], {"axis": c.arg(1, 0)})


@aten("aten.split.Tensor", "aten.split_with_sizes.default")
def _split(c: Ctx):
    x, size, dim = c.arg(0), c.arg(1), c.arg(2, 0)
    d = x.shape[dim]
    if isinstance(size, int):
        if not isinstance(d, int):
            raise Unmapped("split of a symbolic dim")
        sizes = [min(size, d - i) for i in range(0, d, size)]
    else:
        sizes = list(size)
    return c.emit_multi("Split", [x], {"axis": dim, "sizes": sizes})


@aten("aten.embedding.default")
def _embedding(c: Ctx):
    return c.emit("Gather", [c.arg(0), c.arg(1)], {"axis": 0})


@aten("aten.mm.default")
def _mm(c: Ctx):
    return c.emit("MatMul", [c.arg(0), c.arg(1)])


@aten("aten.bmm.default")
def _bmm(c: Ctx):
    return c.emit("BatchMatMul", [c.arg(0), c.arg(1)])


@aten("aten.addmm.default")
def _addmm(c: Ctx):
    bias, a, b = c.arg(0), c.arg(1), c.arg(2)
    beta, alpha = c.kw("beta", 1), c.kw("alpha", 1)
    y = c.emit("MatMul", [a, b])
    if alpha != 1:
        y = c.emit("Mul", [y, c.const(alpha, y.dtype)])
    if beta != 1:
        bias = c.emit("Mul", [bias, c.const(beta, bias.dtype)])
    return c.emit("Add", [y, bias])


@aten("aten.convolution.default")
def _conv(c: Ctx):
    x, w, b, stride, pad, dil, transposed, _, groups = (c.arg(i) for i in range(9))
    if transposed or x.type.rank != 4:
        raise Unmapped("only 2-D, non-transposed convolution is modeled")
    ins = [x, w] + ([b] if b is not None else [])
    return c.emit("Conv2D", ins, {"strides": list(stride), "dilations": list(dil),
                                  "pads": [pad[0], pad[1], pad[0], pad[1]], "group": groups})


@aten("aten.full.default", "aten.scalar_tensor.default")
def _full(c: Ctx):
    t = c.out_type
    if not t.is_static:
        raise Unmapped("symbolic shape")
    value = c.arg(1) if "full" in str(c.node.target) else c.arg(0)
    return c.const(np.full(t.shape, value), t.dtype)


@aten("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(c: Ctx):
    t = c.out_type
    args = [c.arg(i) for i in range(len(c.node.args))]
    if not t.is_static or not all(isinstance(a, int | float) for a in args):
        raise Unmapped("arange with symbolic bounds")
    start, end, step = (0, args[0], 1) if len(args) == 1 else \
        (args[0], args[1], args[2] if len(args) > 2 else 1)
    return c.const(np.arange(start, end, step), t.dtype)


@aten("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default")
def _like(c: Ctx):
    x, t = c.arg(0), c.out_type
    name = str(c.node.target)
    value = 0 if "zeros" in name else 1 if "ones" in name else c.arg(1)
    return c.emit("BroadcastTo", [c.const(value, t.dtype)], {"shape": list(x.shape)})


# ---------------------------------------------------------------- fallback
def _encode(a: Any, inputs: list[Any]) -> Any:
    if isinstance(a, torch.fx.Node):
        inputs.append(a)
        return {"in": len(inputs) - 1}
    if isinstance(a, list | tuple):
        return [_encode(x, inputs) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device | torch.layout | torch.memory_format):
        return None
    if isinstance(a, bool | int | float | str) or a is None:
        return a
    raise Unmapped(f"argument of type {type(a).__name__}")


def _opaque(g: Graph, node: Any, env: dict, reason: str) -> Any:
    target = str(node.target)
    if target not in _LOGGED:
        _LOGGED.add(target)
        log.warning("Fallback %s: %s", target, reason)
    inputs: list[Any] = []
    spec = {"target": target, "args": _encode(list(node.args), inputs),
            "kwargs": {k: _encode(v, inputs) for k, v in node.kwargs.items()}}
    val = node.meta.get("val")
    vals = val if isinstance(val, list | tuple) else [val]
    out_types = [TensorType(tuple(_dim(d) for d in v.shape), torch_dtype(v.dtype, node.name))
                 for v in vals if v is not None]
    if not out_types:
        raise FrontendError(f"node '{node.name}' ({target}) has no tensor output metadata")
    n = g.add_node("Opaque", [env[i] for i in inputs],
                   {"impl": "aten", "spec": spec, "out_types": out_types, "label": target},
                   name=g.fresh_name(node.name))
    return n.outputs[0] if not isinstance(val, list | tuple) else list(n.outputs)


# ------------------------------------------------------------------ import
def import_fx(gm: Any, example_inputs: Sequence[Any] | None = None,
              name: str = "fx_graph", extras: list | None = None) -> Graph:
    """Import an ATen-level ``torch.fx.GraphModule`` (placeholders become graph inputs).

    AOT autograd's forward graph may also return sizes (SymInts saved for the backward) and
    Nones: with ``extras`` given they are left out of the graph's outputs and listed there as
    (position, size or None); without it a size output is an error."""
    if torch is None:
        raise FrontendError("importing FX graphs needs torch: pip install 'graphkernel[torch]'")
    g = Graph(name)
    env: dict[Any, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = list(example_inputs) if example_inputs is not None else [None] * len(placeholders)
    for n, ex in zip(placeholders, examples, strict=False):
        if isinstance(ex, torch.Tensor):
            t = TensorType(tuple(_dim(d) for d in ex.shape), torch_dtype(ex.dtype, n.name))
        else:
            t = meta_type(n, n.name)
        if t is None:
            env[n] = _dim(n.meta.get("val", ex))  # a SymInt size argument
            continue
        env[n] = g.add_input(n.name, t)
    outputs: list[Value] = []
    for n in gm.graph.nodes:
        if n.op in ("placeholder",):
            continue
        if n.op == "get_attr":
            env[n] = g.add_node("Constant", [], {"value": to_numpy(getattr(gm, n.target))},
                                name=g.fresh_name(n.name)).output
            continue
        if n.op == "output":
            flat = n.args[0] if isinstance(n.args[0], list | tuple) else [n.args[0]]
            for i, a in enumerate(flat):
                v = env[a] if a in env else a
                if extras is not None and (v is None or isinstance(v, int | str)):
                    extras.append((i, v))
                elif v is not None:
                    outputs.append(v)
            continue
        if n.target is operator.getitem:
            env[n] = env[n.args[0]][n.args[1]]
            continue
        if not n.users and n.meta.get("val") is None:
            continue  # checks such as aten._assert_tensor_metadata: no value, no users
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt):
            env[n] = _dim(val)  # size arithmetic (sym_size, s0 * 5 ...) becomes a symbolic dim
            continue
        handler = ATEN.get(str(n.target))
        reason = f"no mapping for {n.target}"
        if handler is not None:
            mark = len(g)
            try:
                env[n] = handler(Ctx(g, n, env))
                continue
            except (Unmapped, GraphKernelError) as e:
                reason = str(e)
                for node in reversed(g.nodes[mark:]):
                    if not any(v.uses for v in node.outputs):
                        g.erase_node(node)
        env[n] = _opaque(g, n, env, reason)
    final = []
    for v in outputs:
        if not isinstance(v, Value):
            raise FrontendError(f"graph output {v!r} is not a tensor")
        if v.is_input or any(v is o for o in final):
            v = g.add_node("Identity", [v], name=g.fresh_name(f"{v.name}_out")).output
        final.append(v)
    g.set_outputs(final)
    g.remove_dead()
    return g
