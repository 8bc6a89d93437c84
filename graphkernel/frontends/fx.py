"""torch.fx import: an ATen-level GraphModule (torch.export, or Dynamo + AOT with the core
ATen decompositions) becomes a Graph.

Each mapped ATen overload has a handler in ``ATEN``; dtypes follow torch's promotion as
recorded in each node's FakeTensor (``meta["val"]``). Anything else becomes an Opaque node
that calls the ATen op itself (``impl="aten"``); ``Fallback aten.<op>: <reason>`` is logged
once per op type.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel import symbolic
from graphkernel.errors import FrontendError, GraphKernelError, ShapeError
from graphkernel.ir import DType, Graph, TensorType, Value
from graphkernel.ops import swaps_last_two
from graphkernel.symbolic import Dim

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
    # (np.ascontiguousarray would turn a 0-d array into shape (1,)); a read-only array (a
    # constant of the graph) is copied: torch may write the tensor it hands out
    ok = a.flags.c_contiguous and a.flags.writeable
    return torch.from_numpy(a if ok else a.copy())


_MONOMIAL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\*[A-Za-z0-9_]+)*|\d+(\*[A-Za-z_][A-Za-z0-9_]*)+")
# ops whose spatial sizes graphkernel models only as static numbers (opdefs/nn.py)
_STATIC_SPATIAL = {"aten.convolution.default"}


def _dim(d: Any) -> int | str:
    """A size from a FakeTensor: an int, or a SymInt that is a product of symbols, some of
    them derived (``floor((s0 - 10)/5)``: graphkernel/symbolic.py)."""
    if isinstance(d, int):
        return d
    expr = _settled(d)
    text = str(expr).replace(" ", "")
    if text.isdigit():  # a symbol specialised to its value (see specialize_unmodelled)
        return int(text)
    if _MONOMIAL.fullmatch(text):
        return text
    got = _sym_dim(expr)
    if got is None:
        raise FrontendError(f"symbolic size {d} is not a product of symbols and floor-divided "
                            "offsets of one; graphkernel models sizes such as 's0', '4*s0' "
                            "or '(s0 - 10)//5 + 1' (mark fewer dims dynamic)")
    return got


def _settled(d: Any) -> Any:
    """A SymInt's expression as its shape environment simplifies it under the guards taken
    so far (``64 - Max(0, 64 - s0)`` is ``s0`` once ``s0 <= 64`` is guarded; ``s0`` is
    ``8*s0x8`` once its remainder by 8 is guarded to be 0: see ``_settle_congruences``)."""
    env = getattr(d.node, "shape_env", None)
    if env is None:
        return d.node.expr
    expr = d.node.expr
    multiples = _MULTIPLES.get(env)
    if multiples and expr.free_symbols & multiples.keys():
        expr = expr.xreplace(multiples)
    if not _min_max(expr):  # (simplify may respell a floor division)
        return expr
    expr = env.simplify(expr)
    settled = {}
    for atom in _min_max(expr):
        a, b = atom.args
        r = env.bound_sympy(a - b)  # the range of a - b under the guards' ranges
        if r.lower >= 0 or r.upper <= 0:
            a_wins = (r.lower >= 0) == (type(atom).__name__ == "Max")
            settled[atom] = a if a_wins else b
    return env.simplify(expr.xreplace(settled)) if settled else expr


def _min_max(expr: Any) -> list[Any]:
    """The two-argument ``Max``/``Min`` of one symbol in a size expression."""
    import sympy

    return [a for a in sympy.preorder_traversal(expr) if type(a).__name__ in ("Max", "Min")
            and len(a.args) == 2 and len(a.free_symbols) == 1]


class SymOffset:
    """A size argument graphkernel's dims cannot spell (``L - s0``: a slice's start that
    counts back from a static end); only the handlers that check it against their output
    size take it (``_slice``), any other use makes the op run through torch."""

    def __init__(self, expr: Any) -> None:
        self.expr = expr

    def __repr__(self) -> str:
        return f"SymOffset({self.expr})"


def _sym_dim(expr: Any) -> int | str | None:
    """A sympy size expression as a graphkernel dim, or None when it is not one."""
    got = _sym_dim_parts(expr)
    return got if got is not None else _floor_form_dim(expr)


def _sym_dim_parts(expr: Any) -> int | str | None:
    """``_sym_dim`` of a symbol, a constant offset, floor division or product of such."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    try:
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, sympy.Symbol):
            return str(expr)
        if isinstance(expr, sympy.Add):
            consts = [a for a in expr.args if isinstance(a, sympy.Integer)]
            terms = [a for a in expr.args if not isinstance(a, sympy.Integer)]
            inner = _sym_dim(terms[0]) if len(terms) == 1 else None
            return None if inner is None else symbolic.floor_affine(inner, int(sum(consts)))
        if isinstance(expr, FloorDiv) and isinstance(expr.args[1], sympy.Integer):
            inner = _sym_dim(expr.args[0])
            return None if inner is None else symbolic.floor_affine(inner, 0, int(expr.args[1]))
        if isinstance(expr, sympy.Mul):
            out: int | str = 1
            for a in expr.args:
                part = _sym_dim(a)
                if part is None:
                    return None
                out = symbolic.mul(out, part)
            return out
    except ShapeError:
        return None
    return None


# A size in one symbol ``s`` with floor divisions and remainders by constants (a length padded
# to a multiple of a chunk: ``s + Mod(8 - Mod(s, 8), 8)``, its chunk count ``that // 8``) as a
# linear form: {key: coefficient}, the key ``None`` for the constant and ``(a, d)`` for
# ``floor((s + a) / d)`` (``(0, 1)`` is ``s``). The rewrites below are identities over the
# integers, so the form equals the expression for every length, not only the example's.
_Floor = dict[Any, int]


def _floor_form(expr: Any, sym: Any) -> _Floor | None:
    import sympy
    from torch.utils._sympy import functions as F

    def add(a: _Floor, b: _Floor, k: int = 1) -> _Floor:
        out = dict(a)
        for key, c in b.items():
            out[key] = out.get(key, 0) + k * c
        return {key: c for key, c in out.items() if c}

    if isinstance(expr, sympy.Integer):
        return {None: int(expr)} if int(expr) else {}
    if expr == sym:
        return {(0, 1): 1}
    if isinstance(expr, sympy.Add | sympy.Mul):
        parts = [_floor_form(a, sym) for a in expr.args]
        if any(p is None for p in parts):
            return None
        if isinstance(expr, sympy.Add):
            out: _Floor = {}
            for p in parts:
                out = add(out, p)
            return out
        consts = [p for p in parts if set(p) <= {None}]
        if len(parts) - len(consts) > 1:
            return None  # a product of two terms in s: not linear
        k = 1
        for p in consts:
            k *= p.get(None, 0)
        rest = [p for p in parts if not set(p) <= {None}] or [{None: 1}]
        return {key: k * c for key, c in rest[0].items() if k * c}
    if type(expr) in (F.FloorDiv, F.Mod, F.PythonMod, F.CeilDiv) and len(expr.args) == 2:
        num, den = (_floor_form(a, sym) for a in expr.args)
        if num is None or den is None:
            return None
        n = den.get(None, 0) if set(den) <= {None} else None
        if n is None:
            # ``k*X // X`` (a chunk's length from a padded length and its chunk count): k
            # for every X != 0, and a size torch divided by is not 0
            ks = {num.get(key, 0) / c for key, c in den.items()}
            k = ks.pop() if len(ks) == 1 and not set(num) - set(den) else None
            ok = type(expr) is F.FloorDiv and k is not None and k == int(k)
            return ({None: int(k)} if int(k) else {}) if ok else None
        if n <= 0:
            return None
        if type(expr) is F.CeilDiv:  # ceil(x / n) = -floor(-x / n)
            q = _floor_div(add({}, num, -1), n)
            return None if q is None else add({}, q, -1)
        q = _floor_div(num, n)
        if q is None or type(expr) is F.FloorDiv:
            return q
        return add(num, q, -n)  # x mod n = x - n*floor(x / n) (sizes: x >= 0)
    return None


def _floor_div(num: _Floor, n: int) -> _Floor | None:
    """``floor(num / n)`` as a linear form: the multiples of ``n`` come out whole and at most
    one term of coefficient +-1 (mod n) is left inside, which composes with its own floor
    (``floor((floor((s + a)/d) + b)/n) = floor((s + a + b*d)/(d*n))``)."""
    out: _Floor = {}
    inner: tuple[Any, int] | None = None
    const = num.get(None, 0)
    for key, c in num.items():
        if key is None:
            continue
        r = 1 if (c - 1) % n == 0 else -1 if (c + 1) % n == 0 else 0
        if c % n and (r == 0 or inner is not None):
            return None
        if c % n == 0:
            r = 0
        if r:
            inner = (key, r)
        if (c - r) // n:
            out[key] = out.get(key, 0) + (c - r) // n
    q0, r0 = divmod(const, n)
    if q0:
        out[None] = q0
    if inner is None:
        return {k: c for k, c in out.items() if c}
    (a, d), sign = inner
    if sign > 0:  # floor((X + r0) / n)
        key, coef = (a + r0 * d, d * n), 1
    else:  # floor((r0 - X) / n) = -floor((X - r0 + n - 1) / n)
        key, coef = (a + (n - 1 - r0) * d, d * n), -1
    if key[1] == 1:  # floor(s + a) is s + a
        out[(0, 1)] = out.get((0, 1), 0) + coef
        out[None] = out.get(None, 0) + coef * key[0]
    else:
        out[key] = out.get(key, 0) + coef
    return {k: c for k, c in out.items() if c}


def _floor_form_dim(expr: Any) -> int | str | None:
    """A size with floor divisions and remainders of one symbol by constants as a dim:
    ``k*floor((s + a)/d) + b`` (b a multiple of k) is ``k*<derived symbol>``."""
    syms = list(getattr(expr, "free_symbols", ()))
    if len(syms) != 1:
        return None
    form = _floor_form(expr, syms[0])
    if form is None:
        return None
    b = form.pop(None, 0)
    if not form:
        return b if b >= 0 else None
    if len(form) != 1:
        return None
    (a, d), k = next(iter(form.items()))
    if k < 1 or b % k:
        return None
    try:
        return symbolic.mul(k, symbolic.floor_affine(symbolic.floor_affine(str(syms[0]), a, d),
                                                     b // k))
    except ShapeError:
        return None


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
        """A tensor operand in ``dtype`` (Python scalars become constants; a symbolic size
        read as a number, ``x + s0`` as a KV cache's length is, the size's value as
        ``aten.full`` makes it: fed as an input, or counted)."""
        if isinstance(x, Value):
            return self.cast(x, dtype)
        if isinstance(x, str):
            return _size_of(self, x, TensorType((), dtype))
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


_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "true_divide": "Div",
           "maximum": "Maximum", "minimum": "Minimum", "pow": "Pow", "atan2": "Atan2",
           "remainder": "FloorMod", "fmod": "Mod", "eq": "Equal", "ne": "NotEqual",
           "gt": "Greater", "ge": "GreaterEqual", "lt": "Less", "le": "LessEqual",
           "logical_and": "LogicalAnd",
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
            t = torch_dtype(torch.promote_types(_to_t(ta), _to_t(tb)), c.name)
        else:
            t = ta or tb
            other = b if ta else a
            if (t.is_int or t == DType.bool) and isinstance(other, float):
                return DType.float32
            if t == DType.bool and isinstance(other, int) and not isinstance(other, bool):
                return DType.int64  # torch's promotion: a bool tensor and an int scalar
        if t == DType.bool and op not in ("Equal", "NotEqual"):
            # ordered comparisons take numbers: False < True as 0 < 1, exactly
            return DType.int8
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


@aten("aten.clamp.Tensor")
def _clamp_tensor(c: Ctx):
    # tensor bounds: max with the lower, then min with the upper (torch's order: an upper
    # bound below the lower wins), broadcast as torch does
    dt = c.out_type.dtype
    x, lo, hi = c.cast(c.arg(0), dt), c.argkw(1, "min"), c.argkw(2, "max")
    if lo is not None:
        x = c.emit("Maximum", [x, c.tensor(lo, dt)])
    if hi is not None:
        x = c.emit("Minimum", [x, c.tensor(hi, dt)])
    return x


@aten("aten.max.dim")
def _max_dim(c: Ctx):
    # the largest value along dim and its first index: a TopK of one (NaN the largest,
    # ties to the lower index, as torch.max)
    x, dim, keep = c.arg(0), c.argkw(1, "dim"), bool(c.argkw(2, "keepdim", False))
    if x.type.rank == 0 or x.dtype == DType.bool:
        raise Unmapped("max of a scalar or of booleans")
    v, i = c.emit_multi("TopK", [x], {"k": 1, "axis": dim, "largest": True})
    if keep:
        return [v, i]
    sq = {"axis": [dim % x.type.rank]}
    return [c.emit("Squeeze", [v], sq), c.emit("Squeeze", [i], sq)]


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


def _variance(c: Ctx):
    """(variance, mean kept as a reduced axis of 1, axes, keepdim) of a ``*.correction``
    overload: the sum of squared deviations from the mean over the axes (every axis when
    none is named) divided by N - correction (torch's default correction 1, Bessel's; N <=
    correction divides by 0 as torch does: inf, or nan for no deviation)."""
    x = c.arg(0)
    axes = _dims(c, 1) or list(range(x.type.rank))
    axes = sorted(a % x.type.rank for a in axes)
    keep = bool(c.kw("keepdim", False))
    corr = c.kw("correction", 1)
    corr = 1 if corr is None else corr
    n = 1
    for a in axes:
        if not isinstance(x.shape[a], int):
            raise Unmapped("symbolic reduced dims")
        n *= x.shape[a]
    mean_k = c.emit("ReduceMean", [x], {"axis": axes, "keep_dims": True})
    d = c.emit("Sub", [x, mean_k])
    ss = c.emit("ReduceSum", [c.emit("Mul", [d, d])], {"axis": axes, "keep_dims": keep})
    var = c.emit("Div", [ss, c.const(max(n - corr, 0), x.dtype)])
    return var, mean_k, axes, keep


@aten("aten.var_mean.correction")
def _var_mean(c: Ctx):
    var, mean_k, axes, keep = _variance(c)
    mean = mean_k if keep else c.emit("Squeeze", [mean_k], {"axis": axes})
    return [var, mean]


@aten("aten.var.correction", "aten.std.correction")
def _var_std(c: Ctx):
    """``torch.var`` / ``torch.std`` (and ``Tensor.var``/``std``, ``unbiased=`` being a
    correction of 1 or 0): the variance as ``var_mean``'s, its square root for ``std``."""
    var = _variance(c)[0]
    return c.emit("Sqrt", [var]) if str(c.node.target) == "aten.std.correction" else var


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
    if x.type.rank == 0:  # torch takes dim 0 or -1 of a scalar: nothing to squeeze
        return c.emit("Identity", [x])
    keep = [d % x.type.rank for d in dims if x.shape[d] == 1]
    return c.emit("Squeeze", [x], {"axis": keep}) if keep else c.emit("Identity", [x])


@aten("aten.slice.Tensor")
def _slice(c: Ctx):
    x = c.arg(0)
    dim, start, end, step = c.arg(1, 0), c.arg(2), c.arg(3), c.arg(4, 1)
    dim %= x.type.rank
    start = 0 if start is None else start
    n = c.out_type.shape[dim]
    if isinstance(start, SymOffset):
        if step == 1 and symbolic.eq(n, x.shape[dim]):
            return c.emit("Identity", [x])  # as long as its input: the whole axis
        return _slice_last(c, x, dim, start, n)
    if isinstance(x.shape[dim], str) and isinstance(start, int) and isinstance(end, int) \
            and isinstance(n, int) and 0 <= start and end - start == n and step == 1:
        # rows [start, end) of a symbolic axis (torch's output size says it is that long)
        idx = c.const(np.arange(start, end, dtype=np.int64), DType.int64)
        return c.emit("Gather", [x, idx], {"axis": dim})
    if isinstance(start, str) or isinstance(end, str):
        if n == x.shape[dim] and start == 0 and step == 1:
            return c.emit("Identity", [x])  # the whole axis, up to its symbolic size
        if isinstance(start, str) or step != 1 or (isinstance(start, int) and start < 0):
            raise Unmapped("slice with a symbolic start or stride")
        # x[start:s] of a longer axis: the rows a symbolic-length range picks
        idx = c.emit("Range", [], {"start": start, "length": n, "dtype": DType.int64})
        return c.emit("Gather", [x, idx], {"axis": dim})
    end = INT64_MAX if end is None else min(end, INT64_MAX)
    return c.emit("StridedSlice", [x], {"begin": [start], "end": [end], "strides": [step],
                                        "axes": [dim]})


def _slice_last(c: Ctx, x: Value, dim: int, start: SymOffset, n: Any) -> Value:
    """``x[L - n:]`` or ``x[-n:]`` of a static axis of length ``L`` with a symbolic ``n``
    (MPT's alibi table sliced to the sequence): the rows ``L - n + arange(n)``, gathered.
    A SymOffset start is made only for step-1 slices to a static axis' end
    (``_slices_to_end``); here the start must be exactly ``L - n`` or ``-n``, checked on the
    expressions."""
    import sympy

    length = x.shape[dim]
    out = _settled(c.node.meta["val"].shape[dim])
    # ``x[-n:]`` (a negative start counts from the end) is the same rows as ``x[L - n:]``
    if not isinstance(n, str) or (sympy.simplify(start.expr - (length - out)) != 0
                                  and sympy.simplify(start.expr + out) != 0):
        raise Unmapped(f"slice from {start.expr} of an axis of {length}")
    rows = c.emit("Range", [], {"start": 0, "length": n, "dtype": DType.int64})
    count = _size_value(c, n, TensorType((), DType.int64))
    first = c.emit("Sub", [c.const(length, DType.int64), count])
    idx = c.emit("Add", [rows, first])
    return c.emit("Gather", [x, idx], {"axis": dim})


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
    fed = _size_vector_input(c)
    if fed is not None:
        return fed
    xs = [v for v in c.arg(0) if not (v.type.rank == 1 and v.shape[0] == 0)]
    dt = c.out_type.dtype
    return c.emit("Concat", [c.cast(v, dt) for v in xs], {"axis": c.arg(1, 0)})


_POOLS_2D = frozenset({"aten.max_pool2d_with_indices.default", "aten.max_pool2d.default",
                       "aten.avg_pool2d.default"})


def _readers_pad(c: Ctx, x: Value, pad: list[int], value) -> bool:
    """Whether the readers of a non-negative constant pad take it as padding of their own,
    so that it is one Pad op: a zero pad only convolutions read (TensorFlow's SAME padding;
    arith_simplify folds it into their pads), or a pad of height and width a 2-D pool alone
    reads (window_fusion makes it the window kernel's padding)."""
    users = c.node.users
    if not users or min(pad, default=0) < 0:
        return False
    if value == 0 and all(u.target is torch.ops.aten.convolution.default for u in users):
        return True
    return x.type.rank == 4 and len(pad) == 4 and len(users) == 1 and \
        str(next(iter(users)).target) in _POOLS_2D


@aten("aten.constant_pad_nd.default")
def _constant_pad(c: Ctx):
    # pad = (before, after) per axis from the last one back: a negative amount slices the
    # axis, a positive one concatenates a block of the fill value on that side
    x, pad, value = c.arg(0), list(c.arg(1)), c.arg(2, 0)
    if len(pad) % 2 == 0 and any(isinstance(p, SymOffset) for p in pad):
        return _pad_symbolic(c, x, pad, value)
    if len(pad) % 2 or len(pad) // 2 > x.type.rank or not all(isinstance(p, int) for p in pad):
        raise Unmapped("padding other than static amounts per axis")
    if _readers_pad(c, x, pad, value):
        return c.emit("Pad", [x], {"pads": _torch_pads(x, pad), "value": float(value)})
    for k in range(len(pad) // 2):
        axis, lo, hi = x.type.rank - 1 - k, pad[2 * k], pad[2 * k + 1]
        if lo < 0 or hi < 0:
            d = x.shape[axis]
            if not isinstance(d, int):
                raise Unmapped("negative padding of a symbolic dim")
            x = c.emit("StridedSlice", [x], {"begin": [max(-lo, 0)], "end": [d - max(-hi, 0)],
                                             "axes": [axis]})
        parts = []
        for amount, side in ((lo, 0), (hi, 1)):
            if amount > 0:
                shape = list(x.shape)
                shape[axis] = amount
                parts.append((side, c.emit("BroadcastTo", [c.const(value, x.dtype)],
                                           {"shape": shape})))
        if parts:
            x = c.emit("Concat", [p for side, p in parts if side == 0] + [x]
                       + [p for side, p in parts if side == 1], {"axis": axis})
    return x


def _pad_symbolic(c: Ctx, x: Value, pad: list[Any], value: Any) -> Value:
    """A pad whose amount after an axis is a size expression that is no dim (a length padded
    up to a multiple of a chunk: ``(8 - L % 8) % 8``) while the padded length is one
    (``8*ceil(L/8)``): the padded rows gathered from ``x`` with their index clamped to its
    last row, and the fill value where the index is past its length. The amount is checked
    against the output's size (padded = length + amount, as linear forms)."""
    val = c.node.meta["val"]
    src = c.node.args[0].meta["val"]
    for k in range(len(pad) // 2):
        axis, lo, hi = x.type.rank - 1 - k, pad[2 * k], pad[2 * k + 1]
        if not isinstance(hi, SymOffset):
            if not (lo == 0 and hi == 0):
                raise Unmapped("a symbolic pad with a static one on another axis")
            continue
        if lo != 0:
            raise Unmapped("a symbolic pad before an axis")
        n_in, n_out = x.shape[axis], c.out_type.shape[axis]
        diff = _settled(val.shape[axis]) - _settled(src.shape[axis]) - hi.expr
        syms = list(diff.free_symbols)
        if isinstance(n_out, int) or len(syms) > 1 or (syms and _floor_form(diff, syms[0]) != {})\
                or (not syms and diff != 0):
            raise Unmapped(f"pad by {hi.expr} to a length of {n_out}")
        length = _size_value(c, n_in, TensorType((), DType.int64)) \
            if isinstance(n_in, str) else c.const(n_in, DType.int64)
        rows = c.emit("Range", [], {"start": 0, "length": n_out, "dtype": DType.int64})
        last = c.emit("Sub", [length, c.const(1, DType.int64)])
        taken = c.emit("Gather", [x, c.emit("Minimum", [rows, last])], {"axis": axis})
        inside = c.emit("Less", [rows, length])
        at = [1] * x.type.rank
        at[axis] = -1
        inside = c.emit("Reshape", [inside], {"shape": at})
        x = c.emit("Where", [inside, taken, c.const(value, x.dtype)])
    return x


def _pad_amount(n: Any) -> bool:
    """Whether the FX node ``n`` is a scalar size in one symbol with floor divisions and
    remainders (``(8 - L % 8) % 8``) read only as the amount after an axis of constant pads
    (``_pad_symbolic``) or by other such scalars, which needs no specialisation."""
    val = n.meta.get("val")
    if not isinstance(val, torch.SymInt):
        return False
    expr = _settled(val)
    syms = list(expr.free_symbols)
    if len(syms) != 1 or _floor_form(expr, syms[0]) is None:
        return False
    return bool(n.users) and all(
        (str(u.target) == "aten.constant_pad_nd.default" and len(u.args) > 1
         and u.args[0] is not n and all(p is not n for p in u.args[1][0::2])
         and not any(a is n for a in u.args[2:]) and _pads_to_a_dim(u, n))
        or _pad_amount(u) or _is_dim(u) for u in n.users)


def _pads_to_a_dim(u: Any, amount: Any) -> bool:
    """Whether every axis the pad ``u`` pads by the scalar ``amount`` gets a length that is a
    symbolic dim equal to its length plus the amount (what ``_pad_symbolic`` takes)."""
    src, out = u.args[0].meta.get("val"), u.meta.get("val")
    if src is None or out is None:
        return False
    pads = list(u.args[1])
    for k in range(len(pads) // 2):
        if pads[2 * k + 1] is not amount:
            continue
        axis = out.dim() - 1 - k
        n_out, n_in = out.shape[axis], src.shape[axis]
        if not isinstance(n_out, torch.SymInt) or not _is_dim_value(n_out):
            return False
        diff = _settled(n_out) - (_settled(n_in) if isinstance(n_in, torch.SymInt) else n_in) \
            - _settled(amount.meta["val"])
        syms = list(getattr(diff, "free_symbols", ()))
        if len(syms) > 1 or (syms and _floor_form(diff, syms[0]) != {}) \
                or (not syms and diff != 0):
            return False
    return True


def _is_dim_value(d: Any) -> bool:
    try:
        return isinstance(_dim(d), str)
    except FrontendError:
        return False


def _is_dim(n: Any) -> bool:
    """Whether the FX node ``n`` is a scalar size graphkernel names as a dim (its value is
    taken from its own expression, not from the scalars it was computed from)."""
    val = n.meta.get("val")
    if not isinstance(val, torch.SymInt):
        return False
    try:
        _dim(val)
    except FrontendError:
        return False
    return True


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
    if dim % x.type.rank == x.type.rank - 1 and x.type.rank >= 4 and len(sizes) > 1:
        # each head's row cut into its q, k and v columns (GPT-NeoX's fused projection seen
        # as [B, S, N, 3D]): views the rotary and attention kernels read as columns, not a
        # launch that copies every part (a flat projection's parts, head-split after the
        # cut, stay one Split)
        out, at = [], 0
        for n in sizes:
            out.append(c.emit("StridedSlice", [x], {"begin": [at], "end": [at + n],
                                                    "strides": [1], "axes": [dim]}))
            at += n
        return out
    return c.emit_multi("Split", [x], {"axis": dim, "sizes": sizes})


@aten("aten.embedding.default")
def _embedding(c: Ctx):
    return c.emit("Gather", [c.arg(0), c.arg(1)], {"axis": 0})


_LAYOUT_KEEPING = ("Identity", "BroadcastTo", "Reshape")


def _untransposed(c: Ctx, v: Value) -> Value | None:
    """``v`` rebuilt without a swap of its last two axes, when it is such a swap (a weight's
    ``t()``, a key's ``transpose(-1, -2)``), possibly behind copies, expands and reshapes of the
    leading axes; the matmul then reads the source with its transpose flag set instead."""
    chain = []
    while v.producer is not None and v.producer.op in _LAYOUT_KEEPING:
        src = v.producer.inputs[0]
        if v.producer.op != "Identity" and (src.type.rank < 2 or
                                             tuple(src.shape[-2:]) != tuple(v.shape[-2:])):
            return None
        chain.append(v.producer)
        v = src
    p = v.producer
    if p is None or p.op != "Transpose" or not swaps_last_two(p):
        return None
    out = p.inputs[0]
    for node in reversed(chain):
        if node.op == "Identity":
            continue
        shape = list(node.attrs["shape"])
        shape[-2:] = shape[-1], shape[-2]
        out = c.emit(node.op, [out], {"shape": shape})
    return out


def _matmul(c: Ctx, op: str, a: Value, b: Value) -> Value:
    attrs = {}
    for key, v in (("transpose_a", a), ("transpose_b", b)):
        src = _untransposed(c, v)
        if src is not None:
            attrs[key] = True
            a, b = (src, b) if key == "transpose_a" else (a, src)
    return c.emit(op, [a, b], attrs)


@aten("aten.mm.default")
def _mm(c: Ctx):
    return _matmul(c, "MatMul", c.arg(0), c.arg(1))


@aten("aten.bmm.default")
def _bmm(c: Ctx):
    return _matmul(c, "BatchMatMul", c.arg(0), c.arg(1))


@aten("aten.addmm.default")
def _addmm(c: Ctx):
    bias, a, b = c.arg(0), c.arg(1), c.arg(2)
    beta, alpha = c.kw("beta", 1), c.kw("alpha", 1)
    y = _matmul(c, "MatMul", a, b)
    if alpha != 1:
        y = c.emit("Mul", [y, c.const(alpha, y.dtype)])
    if beta != 1:
        bias = c.emit("Mul", [bias, c.const(beta, bias.dtype)])
    return c.emit("Add", [y, bias])


@aten("aten.convolution.default")
def _conv(c: Ctx):
    x, w, b, stride, pad, dil, transposed, _, groups = (c.arg(i) for i in range(9))
    if transposed or x.type.rank not in (3, 4):
        raise Unmapped("only 1-D and 2-D non-transposed convolutions are modeled")
    one_d = x.type.rank == 3
    stride, pad, dil = (_spatial(v, x.type.rank - 2) for v in (stride, pad, dil))
    if one_d:  # a 1-D convolution is a 2-D one over a height of 1
        x = c.emit("ExpandDims", [x], {"axis": [2]})
        w = c.emit("ExpandDims", [w], {"axis": [2]})
        stride, pad, dil = [1, *stride], [0, *pad], [1, *dil]
    ins = [x, w] + ([b] if b is not None else [])
    y = c.emit("Conv2D", ins, {"strides": list(stride), "dilations": list(dil),
                               "pads": [pad[0], pad[1], pad[0], pad[1]], "group": groups})
    return c.emit("Squeeze", [y], {"axis": [2]}) if one_d else y


def _spatial(v: Any, r: int) -> list[int]:
    """A convolution's stride, padding or dilation for ``r`` spatial axes (PyTorch passes a
    single value for all of them, as ``padding="valid"`` does)."""
    v = [v] if isinstance(v, int) else list(v)
    if len(v) == 1:
        v = v * r
    if len(v) != r:
        raise Unmapped(f"convolution arguments {v} for {r} spatial axes")
    return v


@aten("aten.convolution_backward.default")
def _conv_backward(c: Ctx):
    gy, x, w, _, stride, pad, dil, transposed, _, groups, mask = (c.arg(i) for i in range(11))
    if transposed or x.type.rank not in (3, 4):
        raise Unmapped("only 1-D and 2-D non-transposed convolutions are modeled")
    if not (x.type.is_static and gy.type.is_static):
        raise Unmapped("a convolution's gradient with symbolic sizes")
    one_d = x.type.rank == 3
    stride, pad, dil = (_spatial(v, x.type.rank - 2) for v in (stride, pad, dil))
    if one_d:  # as the forward: a 2-D convolution over a height of 1
        gy, x, w = (c.emit("ExpandDims", [v], {"axis": [2]}) for v in (gy, x, w))
        stride, pad, dil = [1, *stride], [0, *pad], [1, *dil]
    attrs = {"strides": list(stride), "pads": [pad[0], pad[1], pad[0], pad[1]],
             "dilations": list(dil), "group": groups}
    outs: list[Value | None] = [None, None, None]
    if mask[0]:
        outs[0] = c.emit("Conv2DBackpropInput", [gy, w], {**attrs, "input_size": list(x.shape)})
    if mask[1]:
        outs[1] = c.emit("Conv2DBackpropFilter", [gy, x],
                         {**attrs, "filter_size": list(w.shape)})
    if one_d:
        outs[:2] = [o if o is None else c.emit("Squeeze", [o], {"axis": [2]}) for o in outs[:2]]
    if mask[2]:
        outs[2] = c.emit("ReduceSum", [gy], {"axis": [0, 2, 3], "keep_dims": False})
    return outs


@aten("aten._weight_norm_interface_backward.default")
def _weight_norm_backward(c: Ctx):
    dw, v, g, norms, dim = (c.arg(i) for i in range(5))
    return c.emit_multi("WeightNormGrad", [dw, v, g, norms], {"dim": dim})


@aten("aten.full.default", "aten.scalar_tensor.default")
def _full(c: Ctx):
    t = c.out_type
    value = c.arg(1) if "full" in str(c.node.target) else c.arg(0)
    if isinstance(value, str):  # a symbolic size as a number (torch.tensor(x.size(-1)))
        return _size_of(c, value, t)
    if isinstance(value, Value):
        raise Unmapped("a fill value computed at run time")
    if not t.is_static:  # one scalar broadcast to the symbolic shape
        return c.emit("BroadcastTo", [c.const(value, t.dtype)], {"shape": list(t.shape)})
    return c.const(np.full(t.shape, value), t.dtype)


_SIZES_IN = "<sizes fed as inputs>"  # a key of the import's env: size -> its graph input


def _size_of(c: Ctx, dim: str, t: TensorType) -> Value:
    """A tensor of type ``t`` filled with the value of the symbolic size ``dim``: fed as an
    input when the caller feeds sizes (``_size_input``), else counted (``_size_value``)."""
    fed = c.env.get(_SIZES_IN)
    return _size_input(c, fed, dim, t) if fed is not None else _size_value(c, dim, t)


def _size_input(c: Ctx, fed: dict, dim: str, t: TensorType) -> Value:
    """A tensor of type ``t`` filled with the value of the symbolic size ``dim``, read from a
    scalar graph input that the caller feeds with that value (``import_fx_module(sizes_in=
    True)``: the torch backend, whose runner holds every symbol's value when it is called).
    The value is exact: torch converts the Python int to ``t``'s dtype as numpy does. On the
    device the host holds the sizes (they are in every kernel's tiling data); the scalar
    crosses as an input, with no kernel computing it."""
    key = (dim, t.dtype)
    if key not in fed:
        label = re.sub(r"\W+", "_", str(dim)).strip("_")
        fed[key] = c.g.add_input(c.g.fresh_name(f"size_{label}"), TensorType((), t.dtype))
    v = fed[key]
    return c.emit("BroadcastTo", [v], {"shape": list(t.shape)}) if t.shape else v


SizeSums = tuple[tuple[Dim, ...], ...]  # element i of a vector: the sum of the dims of entry i
_SIZE_CASTS = ("aten._to_copy.default", "prims.convert_element_type.default")


def _size_sums(env: dict, a: Any) -> SizeSums | None:
    """The elements of a 0-d or 1-d integer tensor that the program computes from sizes
    alone, each as the dims it sums: a size read as a number (``scalar_tensor(s0)``,
    ``full([1], s0)``), viewed as one element (``unsqueeze``), cast to another integer type,
    concatenated, or summed running (``cumsum``: a mixture of experts' offsets of the row
    groups from its experts' token counts). None for anything else."""
    if not isinstance(a, torch.fx.Node):
        return None
    val = a.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() > 1 or val.dtype == torch.bool or \
            val.dtype.is_floating_point or val.dtype.is_complex:
        return None
    t, args = str(a.target), a.args
    if t in ("aten.scalar_tensor.default", "aten.full.default"):
        v = args[0] if t == "aten.scalar_tensor.default" else args[1]
        d = env.get(v) if isinstance(v, torch.fx.Node) else v
        ok = isinstance(d, int | str) and not isinstance(d, bool) and val.numel() == 1
        return ((d,),) if ok else None
    if t == "aten.unsqueeze.default" or t in _SIZE_CASTS:
        return _size_sums(env, args[0])
    if t == "aten.cat.default" and (args[1] if len(args) > 1 else 0) in (0, -1):
        parts = [_size_sums(env, x) for x in args[0]]
        return None if any(p is None for p in parts) else tuple(e for p in parts for e in p)
    if t == "aten.cumsum.default" and val.dim() == 1 and args[1] in (0, -1):
        inner = _size_sums(env, args[0])
        if inner is None:
            return None
        return tuple(tuple(d for e in inner[:i + 1] for d in e) for i in range(len(inner)))
    return None


def _size_vector_input(c: Ctx) -> Value | None:
    """A vector computed from symbolic sizes alone (``_size_sums``) as one graph input that
    the caller feeds with its values (``import_fx_module(sizes_in=True)``), as a size read as
    a number is: the host holds every size, so the few additions are the host's, not a
    Concat's and a CumSum's launches. None when the value is not such a vector, holds no
    symbolic size (constants fold it), or sizes are not fed."""
    fed = c.env.get(_SIZES_IN)
    t = c.out_type
    if fed is None or t is None or t.rank != 1:
        return None
    sums = _size_sums(c.env, c.node)
    if sums is None or not any(isinstance(d, str) for e in sums for d in e):
        return None
    key = (sums, t.dtype)
    if key not in fed:
        fed[key] = c.g.add_input(c.g.fresh_name("size_sums"), TensorType((len(sums),), t.dtype))
    return fed[key]


def fed_size(spec: Any, bound: dict[str, int]) -> Any:
    """The value of a fed size (``FxImport.sizes``) with the symbols ``bound``: a size's, or
    a vector's (``SizeSums``: each element the sum of its dims)."""
    if isinstance(spec, tuple):
        return [sum(symbolic.evaluate(d, bound) for d in e) for e in spec]
    return symbolic.evaluate(spec, bound)


def _size_value(c: Ctx, dim: str, t: TensorType) -> Value:
    """A tensor of type ``t`` filled with the value of the symbolic size ``dim``: the count of
    ``dim`` ones (in float32, exact below 2^24, for a float32 result; else in int32, exact
    below 2^31, converted to ``t``'s dtype as torch converts the Python int). The IR has no
    op reading a symbol's value; this is one small reduction that fuses with its readers."""
    acc = DType.float32 if t.dtype == DType.float32 else DType.int32
    ones = c.emit("BroadcastTo", [c.const(1, acc)], {"shape": [dim]})
    n = c.emit("ReduceSum", [ones], {"axis": [0], "keep_dims": False})
    if t.dtype != acc:
        n = c.emit("Cast", [n], {"dtype": t.dtype})
    return c.emit("BroadcastTo", [n], {"shape": list(t.shape)}) if t.shape else n


@aten("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(c: Ctx):
    t = c.out_type
    args = [c.arg(i) for i in range(len(c.node.args))]
    start, end, step = (0, args[0], 1) if len(args) == 1 else \
        (args[0], args[1], args[2] if len(args) > 2 else 1)
    if t.is_static and all(isinstance(a, int | float) for a in (start, end, step)):
        return c.const(np.arange(start, end, step), t.dtype)
    if not all(isinstance(a, int | float) for a in (start, step)):
        raise Unmapped("arange with a symbolic start or step")
    # the length is the output's (symbolic) size, which torch derived from the bounds
    return c.emit("Range", [], {"start": start, "delta": step, "length": t.shape[0],
                                "dtype": t.dtype})


@aten("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default")
def _like(c: Ctx):
    x, t = c.arg(0), c.out_type
    name = str(c.node.target)
    value = 0 if "zeros" in name else 1 if "ones" in name else c.arg(1)
    return c.emit("BroadcastTo", [c.const(value, t.dtype)], {"shape": list(x.shape)})


# --------------------------------------------------------- index-driven ops
@aten("aten.gather.default")
def _gather(c: Ctx):
    return c.emit("GatherElements", [c.arg(0), c.arg(2)], {"axis": c.arg(1)})


@aten("aten.index_select.default")
def _index_select(c: Ctx):
    return c.emit("Gather", [c.arg(0), c.arg(2)], {"axis": c.arg(1)})


@aten("aten.index.Tensor")
def _index(c: Ctx):
    x, idx = c.arg(0), c.arg(1)
    used = [i for i, v in enumerate(idx) if v is not None]
    if any(idx[i].dtype == DType.bool for i in used):
        raise Unmapped("indexing with a mask (the result's size depends on the data)")
    if len(used) == 1:
        return c.emit("Gather", [x, idx[used[0]]], {"axis": used[0]})
    if used != list(range(used[0], used[-1] + 1)):
        raise Unmapped("index tensors on axes that are not next to each other")
    outer = _outer_indices(idx, used)
    if outer is not None:  # x[:, :, ih[:, None], iw]: a Gather along each axis in turn
        for axis, v in outer:
            x = c.emit("Gather", [x, c.emit("Reshape", [v], {"shape": [-1]})], {"axis": axis})
        return x
    return _multi_index(c, x, used, [idx[i] for i in used])


def _outer_indices(idx: list, used: list[int]) -> list[tuple[int, Value]] | None:
    """The index tensors of consecutive axes k..k+m-1 when each one varies along its own
    axis of the broadcast result only (reflection and replication pads, nearest upsampling):
    [(axis, index tensor)], else None."""
    m = len(used)
    if m < 2 or used != list(range(used[0], used[0] + m)):
        return None
    for j, i in enumerate(used):
        v = idx[i]
        if v.dtype == DType.bool or v.type.rank > m:
            return None
        shape = [1] * (m - v.type.rank) + list(v.shape)
        if any(d != 1 for a, d in enumerate(shape) if a != j):
            return None
    return [(i, idx[i]) for i in used]


def _iota(v: Value, length: Any) -> bool:
    """Whether ``v`` is 0, 1, ..., length - 1 (``arange`` over a whole axis)."""
    n = v.producer
    return (n is not None and n.op == "Range" and v.type.rank == 1 and n.attrs["start"] == 0
            and n.attrs.get("delta", 1) == 1 and symbolic.eq(v.shape[0], length))


def _multi_index(c: Ctx, x: Value, axes: list[int], idx: list[Value]) -> Value:
    """``x[..., i_0, ..., i_m, ...]`` with index tensors on consecutive axes, numpy's rule
    (the indices broadcast to one shape B, which replaces those axes). One row per batch,
    ``x[arange(B), j]`` (a pooled token: CLIP's end of text), is GatherElements along the
    second axis; anything else is one Gather of the axes merged, by the linear index
    ``sum(i_k * stride_k)`` (index arithmetic that folds into a constant when the indices
    are constants)."""
    first, t = axes[0], c.out_type
    lens = [x.shape[a] for a in axes]
    if len(idx) == 2 and idx[0].type.rank == 1 and _iota(idx[0], lens[0]) \
            and tuple(idx[1].shape) == tuple(idx[0].shape):
        # out[.., b, ..] = x[.., b, j[b], ..]: GatherElements over the second indexed axis
        shape = list(x.shape)
        shape[first + 1] = 1
        at = [1] * len(shape)
        at[first] = lens[0]
        j = c.emit("Reshape", [c.cast(idx[1], DType.int64)], {"shape": at})
        j = c.emit("BroadcastTo", [j], {"shape": shape})
        out = c.emit("GatherElements", [x, j], {"axis": first + 1})
        return c.emit("Squeeze", [out], {"axis": [first + 1]})
    if any(not isinstance(d, int) for d in lens):
        return _symbolic_outer_index(c, x, axes, idx)
    flat, stride = _linear_index(c, idx, lens)
    merged = [*x.shape[:first], stride, *x.shape[axes[-1] + 1:]]
    x = c.emit("Reshape", [x], {"shape": merged})
    out = c.emit("Gather", [x, flat], {"axis": first})
    return out if tuple(out.shape) == tuple(t.shape) else c.emit("Reshape", [out],
                                                                  {"shape": list(t.shape)})


def _linear_index(c: Ctx, idx: list[Value], lens: list[int]) -> tuple[Value, int]:
    """(the index into consecutive axes of static lengths ``lens`` merged into one,
    ``sum(i_k * stride_k)`` of the index tensors broadcast together, the merged length)."""
    flat: Value | None = None
    stride = 1
    for k in reversed(range(len(lens))):
        i = c.cast(idx[k], DType.int64)  # negative indices count from the end of their axis
        i = c.emit("Select", [c.emit("Less", [i, c.const(0, DType.int64)]),
                              c.emit("Add", [i, c.const(lens[k], DType.int64)]), i])
        term = i if stride == 1 else c.emit("Mul", [i, c.const(stride, DType.int64)])
        flat = term if flat is None else c.emit("Add", [term, flat])
        stride *= lens[k]
    assert flat is not None
    return flat, stride


def _symbolic_outer_index(c: Ctx, x: Value, axes: list[int], idx: list[Value]) -> Value:
    """``x[..., i_0, ..., i_m, ...]`` into axes of which some are symbolic, when each index
    tensor varies along one axis of the indices' broadcast shape B at most, those axes in the
    order of the indexed ones (``mask[b[:, None, None, None], j[None, None, None, :]]``: a
    padding mask expanded to the attention's (batch, 1, 1, keys)). Then ``out[.., b, ..]`` is
    ``x[.., i_0[b_p0], .., i_m[b_pm], ..]``: a Gather along each indexed axis in turn by that
    tensor's entries, the axes of B that no index varies along inserted by a Reshape, exactly
    the elements the merged-axis Gather would read, with no stride (a symbolic product) to
    compute. An index that is ``0 .. n-1`` over its whole axis (an ``arange`` through views)
    gathers nothing. Else Unmapped: the merged axis' linear index would need the symbolic
    strides as values."""
    t = c.out_type
    b = symbolic.broadcast_shapes(*(v.shape for v in idx))
    where = []
    for v in idx:
        shape = [1] * (len(b) - v.type.rank) + list(v.shape)
        varying = [a for a, d in enumerate(shape) if d != 1]
        if len(varying) > 1:
            raise Unmapped("several index tensors into symbolic axes, one of them varying "
                           "along more than one axis of their broadcast shape")
        where.append(varying[0] if varying else None)
    placed = [p for p in where if p is not None]
    if placed != sorted(set(placed)):
        raise Unmapped("several index tensors into symbolic axes, not in the order of the "
                       "axes they index")
    for axis, v in zip(axes, idx, strict=True):
        n = symbolic.numel(v.shape)
        if symbolic.eq(n, x.shape[axis]) and _whole_iota(v, n):
            continue  # x[.., arange(n), ..] along an axis of n: x itself
        x = c.emit("Gather", [x, c.emit("Reshape", [v], {"shape": [n]})], {"axis": axis})
    return x if tuple(x.shape) == tuple(t.shape) else c.emit("Reshape", [x],
                                                            {"shape": list(t.shape)})


_ORDER_VIEWS = ("ExpandDims", "Squeeze", "Reshape")


def _whole_iota(v: Value, n: Any) -> bool:
    """Whether the elements of ``v``, in order, are 0, 1, ..., n - 1: a Range from 0 by 1 of
    length n seen through views that keep the order and count of its elements (ExpandDims,
    Squeeze, Reshape, a StridedSlice that keeps every element, an integer Cast, + 0)."""
    while True:
        p = v.producer
        if p is None:
            return False
        if p.op == "Range":
            return _iota(v, n)
        if p.op == "Add":  # + 0 (an offset of none: the keys' positions past no cache)
            rest = [u for u in p.inputs if not _zero_scalar(u)]
            if len(rest) != 1 or tuple(rest[0].shape) != tuple(v.shape):
                return False
            v = rest[0]
            continue
        keeps = p.op in _ORDER_VIEWS or p.op == "Cast" and p.attrs["dtype"] in (DType.int32,
                                                                           DType.int64) \
            or p.op == "StridedSlice" and tuple(p.inputs[0].shape) == tuple(v.shape) \
            and all(s == 1 for s in p.attrs.get("strides") or [1])
        if not keeps or not symbolic.eq(symbolic.numel(p.inputs[0].shape), n):
            return False
        v = p.inputs[0]


def _zero_scalar(v: Value) -> bool:
    p = v.producer
    return p is not None and p.op == "Constant" and np.size(p.attrs["value"]) == 1 \
        and not np.any(p.attrs["value"])


@aten("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default",
      "aten.scatter.reduce", "aten.scatter.value_reduce")
def _scatter(c: Ctx):
    x, dim, idx, src = c.arg(0), c.arg(1), c.arg(2), c.arg(3)
    reduce = c.argkw(4, "reduce") or ("add" if "scatter_add" in str(c.node.target) else None)
    if reduce not in (None, "add", "sum"):
        raise Unmapped(f"scatter with reduce={reduce!r}")
    if not isinstance(src, Value):  # scatter.value: one scalar for every index
        src = c.emit("BroadcastTo", [c.const(src, x.dtype)], {"shape": list(idx.shape)})
    return c.emit("ScatterElements", [x, idx, c.cast(src, x.dtype)],
                  {"axis": dim, "reduction": "add" if reduce else "none"})


@aten("aten.index_put.default")
def _index_put(c: Ctx):
    # x[..., idx, ...] = values (or += with accumulate) along the one indexed axis k, as a
    # ScatterElements whose indices repeat each index over the other axes; embedding's
    # backward is one (k = 0), a gather's along a later axis another
    # x[..., i_0, ..., i_m, ...] = values with index tensors on consecutive axes of static
    # lengths (col2im's scatter of patches, ``F.fold``): those axes merged into one, indexed
    # by the linear index sum(i_k * stride_k) (as a gather reads them), the same elements
    # written, then x's shape again
    x, idx, values = c.arg(0), c.arg(1), c.arg(2)
    accumulate = c.argkw(3, "accumulate", False)
    used = [i for i, v in enumerate(idx) if v is not None]
    if used == [0] and idx[0].dtype == DType.bool:
        return _masked_put(c, x, idx[0], values, accumulate)
    if not used or any(idx[i].dtype == DType.bool for i in used):
        raise Unmapped("index_put with a mask")
    shape_in = list(x.shape)
    if len(used) > 1:
        lens = [x.shape[a] for a in used]
        if used != list(range(used[0], used[-1] + 1)) or \
                any(not isinstance(d, int) for d in lens):
            raise Unmapped("index_put with index tensors on axes that are not next to each "
                           "other or not of static lengths")
        rows, merged = _linear_index(c, [idx[i] for i in used], lens)
        x = c.emit("Reshape", [x], {"shape": [*shape_in[:used[0]], merged,
                                              *shape_in[used[-1] + 1:]]})
        k = used[0]
    else:
        k, rows = used[0], idx[used[0]]
    before, after = list(x.shape[:k]), list(x.shape[k + 1:])
    if not isinstance(values, Value):
        values = c.const(values, x.dtype)
    values = c.cast(values, x.dtype)
    full = [*before, *rows.shape, *after]
    if tuple(values.shape) != tuple(full):
        values = c.emit("BroadcastTo", [values], {"shape": full})
    if rows.type.rank != 1:  # several index axes: one entry per index, in order
        rows = c.emit("Reshape", [rows], {"shape": [-1]})
        values = c.emit("Reshape", [values], {"shape": [*before, rows.shape[0], *after]})
    shape = [*before, rows.shape[0], *after]
    rows = c.emit("Reshape", [rows], {"shape": [1] * k + [shape[k]] + [1] * len(after)})
    rows = c.emit("BroadcastTo", [rows], {"shape": shape})
    out = c.emit("ScatterElements", [x, rows, values],
                 {"axis": k, "reduction": "add" if accumulate else "none"})
    if tuple(out.shape) != tuple(shape_in):
        out = c.emit("Reshape", [out], {"shape": shape_in})
    return out


def _masked_put(c: Ctx, x: Value, mask: Value, values: Any, accumulate: bool) -> Value:
    """``x[mask] = v`` (``+=`` with accumulate) of one value ``v`` (a number, a tensor of one
    element), the mask over x's leading axes: every element the mask selects gets v (v
    added), as ``masked_fill`` does: a Select of v and x by the mask, its trailing axes
    broadcast (an attention's padding positions filled in a Longformer). Masks whose count
    decides the shape of the values written (a tensor of values, one per True) are not."""
    one = not isinstance(values, Value) or symbolic.numel(values.shape) == 1
    if not one or tuple(mask.shape) != tuple(x.shape[:mask.type.rank]):
        raise Unmapped("index_put with a mask and a tensor of values (one per selected "
                       "element: their number depends on the data)")
    if isinstance(values, Value):
        values = c.emit("Reshape", [c.cast(values, x.dtype)], {"shape": []})
    else:
        values = c.const(values, x.dtype)
    m = mask
    if mask.type.rank < x.type.rank:
        m = c.emit("Reshape", [mask], {"shape": [*mask.shape,
                                                 *[1] * (x.type.rank - mask.type.rank)]})
    if accumulate:
        return c.emit("Add", [x, c.emit("Select", [m, values, c.const(0, x.dtype)])])
    return c.emit("Select", [m, values, x])


def as_strided_reads(node: Any) -> np.ndarray | str:
    """For an ``as_strided(x, size, stride, offset)`` node: the row-major index in x of the
    element each output position reads (the storage position ``offset + sum(i_k *
    stride_k)`` matched against where the traced x's elements lie: its sizes, strides and
    storage offset), or why that cannot be known here: symbolic sizes or strides, or a read
    of memory outside x's elements (of the larger tensor x is a view of, which the op's
    input does not carry: such a graph runs through torch, see ``torch_backend``)."""
    spec = _traced_strides(node.args[0])
    size, stride = node.args[1], node.args[2]
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
    if spec is None or not all(isinstance(v, int) for v in [*size, *stride]) \
            or not isinstance(offset, int | None):
        return "as_strided over symbolic sizes, strides or offset"
    shape, strides, base = spec

    def positions(start: int, sz: list[int], st: list[int]) -> np.ndarray:
        pos = np.full(sz, start, dtype=np.int64)
        for k, (n, step) in enumerate(zip(sz, st, strict=True)):
            pos += (np.arange(n, dtype=np.int64) * step).reshape(
                [-1 if j == k else 1 for j in range(len(sz))])
        return pos

    held = positions(base, shape, strides).reshape(-1)  # storage position of each element
    read = positions(base if offset is None else offset, list(size), list(stride))
    order = np.argsort(held, kind="stable")
    at = np.searchsorted(held[order], read)
    at = np.minimum(at, held.size - 1)
    if read.size and (held.size == 0 or np.any(held[order][at] != read)):
        return "as_strided reads memory outside its input's elements (of the tensor it views)"
    return order[at]


@aten("aten.as_strided.default")
def _as_strided(c: Ctx):
    """``as_strided(x, size, stride, offset)``: x's elements at storage positions ``offset
    + sum(i_k * stride_k)``, which depend on where the traced x lay in memory, not only on
    its values: one Gather from x flattened at the constant indices of the elements lying
    there (``as_strided_reads``; Longformer's overlapping chunks of a transposed view)."""
    idx = as_strided_reads(c.node)
    if isinstance(idx, str):
        raise Unmapped(idx)
    x = c.arg(0)
    flat = c.emit("Reshape", [x], {"shape": [int(np.prod(x.shape, dtype=np.int64))]})
    return c.emit("Gather", [flat, c.const(idx, DType.int64)], {"axis": 0})


@aten("aten.unfold.default")
def _unfold(c: Ctx):
    """``x.unfold(dim, size, step)``: window ``i`` of ``size`` elements along ``dim``,
    starting at ``i * step``, as a new last axis (PatchTST's patches of each channel):
    ``out[..., i, ..., j] = x[..., i * step + j, ...]``. One Gather along ``dim`` of the
    constant rows ``i * step + j`` (windows in order, each window's elements in order), that
    axis split into (windows, size) and the size axis moved last: the same elements, exact.
    A symbolic axis (the window count depends on it) is not mapped."""
    x = c.arg(0)
    rank = x.type.rank
    dim, size, step = c.arg(1) % max(rank, 1), c.arg(2), c.arg(3)
    length = x.shape[dim] if rank else 1
    if not all(isinstance(v, int) for v in (length, size, step)) or step <= 0 or size < 0 \
            or size > length:
        raise Unmapped("unfold of a symbolic axis or with a symbolic window")
    if rank == 0:  # a 0-d tensor unfolds to one window of its value
        return c.emit("Reshape", [x], {"shape": [size]})
    count = (length - size) // step + 1
    rows = (np.arange(count, dtype=np.int64)[:, None] * step
            + np.arange(size, dtype=np.int64)[None, :]).reshape(-1)
    taken = c.emit("Gather", [x, c.const(rows, DType.int64)], {"axis": dim})
    shape = [*x.shape[:dim], count, size, *x.shape[dim + 1:]]
    split = c.emit("Reshape", [taken], {"shape": shape})
    perm = [*range(dim + 1), *range(dim + 2, rank + 1), dim + 1]
    return c.emit("Transpose", [split], {"perm": perm})


@aten("aten.linalg_solve_triangular.default")
def _solve_triangular(c: Ctx):
    """``linalg.solve_triangular(L, X, upper=False, left=True, unitriangular=True)``: one
    TriSolve (forward substitution, the rows in sequence; ``opdefs/trisolve.py``). Other
    flags, float64 or operands that broadcast against each other stay an ATen call, with the
    reason."""
    upper, left = c.kw("upper", None), c.kw("left", True)
    unit = c.kw("unitriangular", False)
    if upper is not False or left is not True or unit is not True:
        raise Unmapped(f"solve_triangular with upper={upper}, left={left}, unitriangular="
                       f"{unit} (forward substitution takes upper=False, left=True, "
                       "unitriangular=True)")
    L, X = c.arg(0), c.arg(1)
    t = c.out_type
    if t is None or t.dtype not in (DType.float32, DType.float16, DType.bfloat16) or \
            L.dtype != X.dtype or X.dtype != t.dtype:
        raise Unmapped(f"solve_triangular of {L.dtype.value} and {X.dtype.value}")
    if len(L.shape) != len(X.shape) or tuple(L.shape[:-2]) != tuple(X.shape[:-2]) or \
            L.shape[-1] != X.shape[-2] or L.shape[-1] != L.shape[-2]:
        raise Unmapped(f"solve_triangular of shapes {list(L.shape)} and {list(X.shape)} "
                       "(batch axes that broadcast)")
    return c.emit("TriSolve", [L, X], {"form": "solve"})


@aten("aten.cumsum.default")
def _cumsum(c: Ctx):
    src = c.node.args[0]
    if isinstance(src, torch.fx.Node) and str(src.target) == "aten.histc.default":
        # a histogram's running count (a mixture of experts' group ends): bin b's entry is
        # the count of the elements below bin b's upper edge, one reduction, no scan
        with contextlib.suppress(Unmapped):
            return _histogram(c, src, cumulative=True, count_dtype=c.out_type.dtype)
    fed = _size_vector_input(c)
    if fed is not None:
        return fed
    x = c.cast(c.arg(0), c.out_type.dtype)
    return c.emit("CumSum", [x], {"axis": c.arg(1)})


def _histogram(c: Ctx, node: Any, cumulative: bool = False,
               count_dtype: DType | None = None) -> Value:
    """``torch.histc`` (of the FX ``node``) as comparisons with its bin edges and one sum:
    an element counts in bin b when ``edge[b] <= x < edge[b+1]`` (the last bin also takes
    ``x == max``), the edges being torch's own (``linspace(min, max, bins + 1)`` in the
    input's dtype, which is how its histc bins an element); NaN and values outside
    ``[min, max]`` count nowhere. ``cumulative``: the running count over the bins instead
    (the count below each bin's upper edge), cast to ``count_dtype``. A range taken from
    the data (``min == max``) or a comparison table too large to be worth it is declined."""
    x = c.env[node.args[0]]
    bins = node.args[1] if len(node.args) > 1 else node.kwargs.get("bins", 100)
    lo = node.args[2] if len(node.args) > 2 else node.kwargs.get("min", 0)
    hi = node.args[3] if len(node.args) > 3 else node.kwargs.get("max", 0)
    tdt = {DType.float16: torch.float16, DType.float32: torch.float32,
           DType.float64: torch.float64}.get(x.dtype)
    if not (isinstance(bins, int) and isinstance(lo, int | float) and isinstance(hi, int | float)
            and bins > 0 and lo < hi and tdt is not None and x.type.is_static):
        raise Unmapped("histc over the data's own range, or not a static float16/32/64 tensor")
    n = int(np.prod(x.shape, dtype=np.int64))
    if n * bins > MAX_HISTOGRAM_TABLE:
        raise Unmapped(f"histc of {n} elements into {bins} bins (comparison table above "
                       f"{MAX_HISTOGRAM_TABLE})")
    edges = torch.linspace(float(lo), float(hi), bins + 1, dtype=tdt).numpy()
    upper = edges[1:].copy()  # x <= max for the last bin: below the next value up
    upper[-1] = np.nextafter(upper[-1], np.inf, dtype=upper.dtype)
    row = c.emit("Reshape", [x], {"shape": [1, n]})  # a row per bin: row reductions
    below = c.emit("Less", [row, c.const(upper.reshape(bins, 1), x.dtype)])
    low = np.full(bins, edges[0]) if cumulative else edges[:-1]  # (a table as large)
    above = c.emit("GreaterEqual", [row, c.const(low.reshape(bins, 1), x.dtype)])
    inside = c.emit("LogicalAnd", [above, below])
    # counted in float32 (exact up to the table's size; the vector unit selects floats)
    ones = c.emit("Select", [inside, c.const(1, DType.float32), c.const(0, DType.float32)])
    counts = c.emit("ReduceSum", [ones], {"axis": [1], "keep_dims": False})
    return c.cast(counts, count_dtype or x.dtype)


MAX_HISTOGRAM_TABLE = 1 << 24  # elements x bins compared


@aten("aten.histc.default")
def _histc(c: Ctx):
    return _histogram(c, c.node)


@aten("aten.sort.default", "aten.sort.stable")
def _sort(c: Ctx):
    # a sort along one axis is a TopK of the whole axis: values and indices in order. Ties:
    # in their original order (TopK's "first") when the sort is stable; torch's default
    # sort is not (on the CPU, from a few dozen elements on), so its order is torch's own
    # ("torch.sort": eager's result, computed by torch; opdefs/indexing.py)
    x = c.arg(0)
    stable = False
    if str(c.node.target).endswith(".stable"):
        dim, descending = c.kw("dim", -1), c.kw("descending", False)
        stable = bool(c.kw("stable", False))
    else:
        dim, descending = c.argkw(1, "dim", -1), c.argkw(2, "descending", False)
    if x.type.rank == 0 or x.dtype == DType.bool or not isinstance(x.shape[dim], int):
        raise Unmapped("sort of a scalar, of booleans or along a symbolic axis")
    return c.emit_multi("TopK", [x], {"k": x.shape[dim], "axis": dim,
                                      "largest": bool(descending),
                                      "ties": "first" if stable else "torch.sort"})


@aten("aten.any.default", "aten.any.dim", "aten.any.dims", "aten.all.default",
      "aten.all.dim", "aten.all.dims")
def _any_all(c: Ctx):
    # any: the max of x != 0 over the axes; all: the min
    name = str(c.node.target)
    x = c.cast(c.arg(0), DType.bool)
    axes = None if name.endswith(".default") else _dims(c, 1)
    keep = bool(c.argkw(2, "keepdim", False))
    op = "ReduceMax" if ".any." in name else "ReduceMin"
    return c.emit(op, [x], {"axis": axes or None, "keep_dims": keep})


@aten("aten.argmax.default", "aten.argmin.default")
def _argmax(c: Ctx):
    x, dim, keep = c.arg(0), c.argkw(1, "dim"), bool(c.argkw(2, "keepdim", False))
    if dim is None:  # over the flattened tensor
        x, dim = c.emit("Reshape", [x], {"shape": [-1]}), 0
        if keep:
            raise Unmapped("argmax over every dim with keepdim")
    op = "ArgMax" if "argmax" in str(c.node.target) else "ArgMin"
    return c.emit(op, [x], {"axis": dim, "keep_dims": keep, "dtype": DType.int64})


@aten("aten.topk.default")
def _topk(c: Ctx):
    x, k, dim = c.arg(0), c.arg(1), c.argkw(2, "dim", -1)
    largest, ordered = c.argkw(3, "largest", True), c.argkw(4, "sorted", True)
    if not isinstance(k, int):
        raise Unmapped("topk with a symbolic k")
    # ties (equal values around the k-th, or among the k) as eager breaks them: torch's own
    # choice and, unsorted, its order ("torch.topk": computed by torch, as Inductor calls
    # aten.topk; opdefs/indexing.py)
    return c.emit_multi("TopK", [x], {"k": k, "axis": dim, "largest": bool(largest),
                                      "ties": "torch.topk", "sorted": bool(ordered)})


# Mixture of experts: a product per group of rows with its expert's weights. torch's own
# ``_grouped_mm`` (a 2-D input, 3-D weights, the groups' running row counts) and
# transformers' ``grouped_mm_fallback`` (its MoE layers' default where torch's does not
# apply: the CPU, float32) have one contract, graphkernel/opdefs/experts.py; the second is
# the program's own op, whose body (a loop over ``offs.tolist()``) no trace can see into, so
# it is recognised by that contract rather than run opaque. Its backward likewise.
@aten("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")
def _grouped_mm(c: Ctx):
    x, w, offs = c.arg(0), c.arg(1), c.argkw(2, "offs")
    if not isinstance(offs, Value) or x.type.rank != 2 or w.type.rank != 3 or \
            c.argkw(3, "bias") is not None or x.dtype != w.dtype:
        raise Unmapped("grouped products other than rows [S, K] by stacked weights [E, K, N]")
    return c.emit("GroupedMatMul", [x, w, offs])


@aten("transformers.grouped_mm_fallback_backward.default")
def _grouped_mm_backward(c: Ctx):
    x, w, offs, dy = c.arg(0), c.arg(1), c.arg(2), c.arg(3)
    if x.type.rank != 2 or w.type.rank != 3 or dy.type.rank != 2:
        raise Unmapped("grouped products other than rows [S, K] by stacked weights [E, K, N]")
    wt = c.emit("Transpose", [w], {"perm": [0, 2, 1]})
    return [c.emit("GroupedMatMul", [dy, wt, offs]),
            c.emit("GroupedMatMulWeightGrad", [x, dy, offs])]


@aten("aten.tril.default", "aten.triu.default")
def _tril(c: Ctx):
    # keep x[..., i, j] where j - i <= k (tril) or j - i >= k (triu)
    x, k = c.arg(0), c.arg(1, 0)
    rows, cols = x.shape[-2], x.shape[-1]

    def seq(n):
        if isinstance(n, int):
            return c.const(np.arange(n), DType.int64)
        return c.emit("Range", [], {"length": n, "dtype": DType.int64})

    i = c.emit("ExpandDims", [seq(rows)], {"axis": [1]})
    diff = c.emit("Sub", [seq(cols), i])  # [rows, cols]: j - i
    op = "LessEqual" if "tril" in str(c.node.target) else "GreaterEqual"
    keep = c.emit(op, [diff, c.const(k, DType.int64)])
    return c.emit("Select", [keep, x, c.const(0, x.dtype)])


@aten("aten.repeat.default")
def _repeat(c: Ctx):
    x, reps = c.arg(0), list(c.arg(1))
    if all(isinstance(r, int) for r in reps):
        return c.emit("Tile", [x], {"multiples": reps})
    # a symbolic count (BLOOM repeats its alibi slopes by the batch): tiling an axis r times
    # is a new axis in front of it broadcast to r, then merged with it
    shape = [1] * (len(reps) - x.type.rank) + list(x.shape)
    split, wide = [], []
    for r, d in zip(reps, shape, strict=True):
        split += [1, d] if isinstance(r, str) else [d]
        wide += [r, d] if isinstance(r, str) else [d]
    x = c.emit("Reshape", [x], {"shape": split})
    x = c.emit("BroadcastTo", [x], {"shape": wide})
    merged = [o if isinstance(r, str) else d
              for r, d, o in zip(reps, shape, c.out_type.shape, strict=True)]
    x = c.emit("Reshape", [x], {"shape": merged})
    rest = [1 if isinstance(r, str) else r for r in reps]
    return x if all(r == 1 for r in rest) else c.emit("Tile", [x], {"multiples": rest})


@aten("aten.bitwise_not.default")
def _bitwise_not(c: Ctx):
    x = c.arg(0)
    if x.dtype == DType.bool:
        return c.emit("LogicalNot", [x])
    return c.emit("Sub", [c.emit("Neg", [x]), c.const(1, x.dtype)])  # ~x = -x - 1


@aten("aten.linalg_vector_norm.default")
def _vector_norm(c: Ctx):
    x, ordv = c.arg(0), c.arg(1, 2)
    axes, keep = _dims(c, 2), bool(c.argkw(3, "keepdim", False))
    x = c.cast(x, c.out_type.dtype)
    attrs = {"axis": axes or None, "keep_dims": keep}
    if ordv == 2:
        return c.emit("Sqrt", [c.emit("ReduceSum", [c.emit("Mul", [x, x])], attrs)])
    if ordv == 1:
        return c.emit("ReduceSum", [c.emit("Abs", [x])], attrs)
    if ordv == float("inf"):
        return c.emit("ReduceMax", [c.emit("Abs", [x])], attrs)
    raise Unmapped(f"vector norm of order {ordv}")


@aten("aten.native_group_norm.default")
def _group_norm(c: Ctx):
    # LayerNorm over each group's [C/G, *spatial] block, then the per-channel affine
    x, w, b, n, ch, _, groups, eps = (c.arg(i) for i in range(8))
    grouped = c.emit("Reshape", [x], {"shape": [n, groups, -1]})
    ones = c.const(np.ones(1), x.dtype)
    zeros = c.const(np.zeros(1), x.dtype)
    y, mean, var = c.emit_multi("LayerNorm", [grouped, c.emit("BroadcastTo", [ones], {
        "shape": [grouped.shape[2]]}), c.emit("BroadcastTo", [zeros], {
            "shape": [grouped.shape[2]]})], {"begin_norm_axis": 2, "begin_params_axis": 2,
                                             "epsilon": float(eps)})
    y = c.emit("Reshape", [y], {"shape": list(x.shape)})
    per_channel = [ch] + [1] * (x.type.rank - 2)
    if w is not None:
        y = c.emit("Mul", [y, c.emit("Reshape", [w], {"shape": per_channel})])
    if b is not None:
        y = c.emit("Add", [y, c.emit("Reshape", [b], {"shape": per_channel})])
    rstd = c.emit("Rsqrt", [c.emit("Add", [var, c.const(eps, var.dtype)])])
    sq = {"axis": [2]}
    return [y, c.emit("Squeeze", [mean], sq), c.emit("Squeeze", [rstd], sq)]


@aten("aten.slice_scatter.default")
def _slice_scatter(c: Ctx):
    # the input with src in place of x[start:end] along dim: a Concat of the three parts
    x, src = c.arg(0), c.arg(1)
    dim, start, end, step = (c.argkw(i, k, d) for i, k, d in
                             ((2, "dim", 0), (3, "start", None), (4, "end", None),
                              (5, "step", 1)))
    dim %= x.type.rank
    size = x.shape[dim]
    if not isinstance(size, int) or isinstance(start, str) or isinstance(end, str) or \
            not isinstance(step, int) or step < 1:
        raise Unmapped("slice_scatter with a symbolic size or bound")
    if step != 1:  # every step-th place from start: src scattered to those places
        places = np.arange(*slice(start, end, step).indices(size), dtype=np.int64)
        if not src.type.is_static or src.shape[dim] != len(places):
            raise Unmapped("slice_scatter with a stride and a symbolic size")
        idx = np.broadcast_to(places.reshape([-1 if i == dim else 1
                                              for i in range(x.type.rank)]), src.shape)
        idx = c.const(np.ascontiguousarray(idx), DType.int64)  # (a table: no launch)
        return c.emit("ScatterElements", [x, idx, c.cast(src, x.dtype)],
                      {"axis": dim, "reduction": "none"})
    start, end, _ = slice(start, end).indices(size)
    end = max(start, end)
    parts = []
    if start > 0:
        parts.append(c.emit("StridedSlice", [x], {"begin": [0], "end": [start], "axes": [dim]}))
    parts.append(c.cast(src, x.dtype))
    if end < size:
        parts.append(c.emit("StridedSlice", [x], {"begin": [end], "end": [size],
                                                  "axes": [dim]}))
    return parts[0] if len(parts) == 1 else c.emit("Concat", parts, {"axis": dim})


@aten("aten.flip.default")
def _flip(c: Ctx):
    # each flipped axis read backwards: a Gather of its places in reverse
    x = c.arg(0)
    for d in c.arg(1):
        d %= x.type.rank
        if not isinstance(x.shape[d], int):
            raise Unmapped("flip along a symbolic axis")
    for d in c.arg(1):
        d %= x.type.rank
        rev = c.const(np.arange(x.shape[d] - 1, -1, -1, dtype=np.int64), DType.int64)
        x = c.emit("Gather", [x, rev], {"axis": d})
    return x


@aten("aten.copy.default")
def _copy(c: Ctx):
    # copy(dst, src) is src in dst's dtype and shape (functionalized in-place copy)
    dst, src = c.arg(0), c.arg(1)
    v = c.cast(src, dst.dtype) if isinstance(src, Value) else c.const(src, dst.dtype)
    if tuple(v.shape) == tuple(dst.shape):
        return c.emit("Identity", [v])
    return c.emit("BroadcastTo", [v], {"shape": list(dst.shape)})


@aten("aten.new_empty_strided.default", "aten.empty_strided.default",
      "aten.empty.memory_format", "aten.new_zeros.default", "aten.new_ones.default",
      "aten.new_full.default")
def _new_filled(c: Ctx):
    # empty memory may hold anything: zeros are as good as any content
    t = c.out_type
    name = str(c.node.target)
    value = 1 if "ones" in name else c.arg(2) if "new_full" in name else 0
    if isinstance(value, Value | str):
        raise Unmapped("a fill value computed at run time")
    if t.is_static:
        return c.const(np.full(t.shape, value), t.dtype)
    return c.emit("BroadcastTo", [c.const(value, t.dtype)], {"shape": list(t.shape)})


@aten("aten.native_dropout.default")
def _dropout(c: Ctx):
    x, p, train = c.arg(0), c.arg(1), c.arg(2)
    if train and p > 0:
        raise Unmapped("dropout draws random numbers: it runs through torch so that the "
                       "random stream is torch's")
    mask = c.emit("BroadcastTo", [c.const(True, DType.bool)], {"shape": list(x.shape)})
    return [c.emit("Identity", [x]), mask]


# --------------------------------------------------------------- attention
# scaled_dot_product_attention and its fused overloads: one FusedAttention forward and one
# FusedAttentionGrad backward, or their exact decompositions (graphkernel/frontends/sdpa.py)
def _no_dropout(p: Any) -> None:
    if p:
        raise Unmapped(f"attention with dropout_p={p} draws random numbers: it runs through "
                       "torch (torch's random stream, and its own backward)")


def _attention_spec(c: Ctx, q: Value, k: Value, v: Value, mask: Any, causal: Any,
                    scale: Any) -> Any:
    from graphkernel.frontends.sdpa import Spec

    if not (isinstance(scale, float | int) or scale is None) or isinstance(causal, Value):
        raise Unmapped("a scale or causal flag computed at run time")
    for x in (q, k, v):
        if x.type.rank != 4:
            raise Unmapped(f"attention operands of rank {x.type.rank} (4 expected)")
        if not isinstance(x.shape[-1], int):
            raise Unmapped(f"a symbolic head size {x.shape[-1]!r}")
    return Spec(q, k, v, mask, None if scale is None else float(scale), bool(causal))


def _builder(c: Ctx) -> Any:
    from graphkernel.frontends.sdpa import Builder

    return Builder(c.g, c.name, (c.name,))


def _attend(c: Ctx, spec: Any, stats: bool) -> tuple[Value, Value | None]:
    from graphkernel.frontends.sdpa import forward

    out, lse, why = forward(_builder(c), spec, stats)
    if why is not None:
        log.info("%s (%s): the exact decomposition, not one fused attention: %s", c.name,
                 c.node.target, why)
    return out, lse


def _used(c: Ctx, i: int) -> bool:
    """Whether output ``i`` of the node is read (a getitem of it has users)."""
    return any(u.target is operator.getitem and u.args[1] == i and u.users
               for u in c.node.users)


def _like_meta(c: Ctx, i: int) -> Any:
    """Output ``i`` as the node's metadata has it, for the outputs attention does not compute
    (sequence offsets, dropout seeds: zeros; sizes: their values)."""
    val = c.node.meta["val"][i]
    if val is None or isinstance(val, int | torch.SymInt):
        return None if val is None else _dim(val)
    if val.dtype not in _TORCH_DTYPES:
        return None  # (a CUDA random state of uint64: nothing reads it without dropout)
    t = TensorType(tuple(_dim(d) for d in val.shape), torch_dtype(val.dtype, c.name))
    if t.is_static:
        return c.const(np.zeros(t.shape), t.dtype)
    return c.emit("BroadcastTo", [c.const(0, t.dtype)], {"shape": list(t.shape)})


def _lse_as(c: Ctx, lse: Value | None, i: int) -> Value | None:
    """Our logsumexp [B, N, L] in the shape output ``i`` has: padded with zeros to a
    multiple of 32 queries (the efficient kernel's) or with a trailing 1 (cuDNN's)."""
    val = c.node.meta["val"][i]
    want = tuple(_dim(d) for d in val.shape)
    if lse is None or want[2] == 0:
        return _like_meta(c, i)
    if len(want) == 4:
        return c.emit("ExpandDims", [lse], {"axis": [3]})
    pad = symbolic.canon(want[2]) != symbolic.canon(lse.shape[2])
    if pad and isinstance(want[2], int) and isinstance(lse.shape[2], int):
        zeros = c.emit("BroadcastTo", [c.const(0, DType.float32)],
                       {"shape": [*lse.shape[:2], want[2] - lse.shape[2]]})
        return c.emit("Concat", [lse, zeros], {"axis": 2})
    if pad:
        raise Unmapped("a padded logsumexp of a symbolic length")
    return lse


@aten("aten.scaled_dot_product_attention.default")
def _sdpa(c: Ctx):
    q, k, v = c.arg(0), c.arg(1), c.arg(2)
    mask, p, causal = c.argkw(3, "attn_mask"), c.argkw(4, "dropout_p", 0.0), \
        c.argkw(5, "is_causal", False)
    _no_dropout(p)
    rank = q.type.rank
    if rank == 3:  # [B, L, E]: one head
        q, k, v = (c.emit("ExpandDims", [x], {"axis": [1]}) for x in (q, k, v))
        if mask is not None and mask.type.rank == 3:
            mask = c.emit("ExpandDims", [mask], {"axis": [1]})
    out, _ = _attend(c, _attention_spec(c, q, k, v, mask, causal, c.kw("scale")), False)
    return c.emit("Squeeze", [out], {"axis": [1]}) if rank == 3 else out


@aten("aten._scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_cpu(c: Ctx):
    _no_dropout(c.argkw(3, "dropout_p", 0.0))
    spec = _attention_spec(c, c.arg(0), c.arg(1), c.arg(2), c.kw("attn_mask"),
                           c.argkw(4, "is_causal", False), c.kw("scale"))
    out, lse = _attend(c, spec, _used(c, 1))
    return [out, lse]


@aten("aten._scaled_dot_product_flash_attention.default")
def _sdpa_flash(c: Ctx):
    _no_dropout(c.argkw(3, "dropout_p", 0.0))
    spec = _attention_spec(c, c.arg(0), c.arg(1), c.arg(2), None,
                           c.argkw(4, "is_causal", False), c.kw("scale"))
    out, lse = _attend(c, spec, _used(c, 1))
    return [out, lse, *(_like_meta(c, i) for i in range(2, 9))]


@aten("aten._scaled_dot_product_efficient_attention.default",
      "aten._scaled_dot_product_cudnn_attention.default")
def _sdpa_biased(c: Ctx):
    _no_dropout(c.argkw(5, "dropout_p", 0.0))
    spec = _attention_spec(c, c.arg(0), c.arg(1), c.arg(2), c.arg(3),
                           c.argkw(6, "is_causal", False), c.kw("scale"))
    out, lse = _attend(c, spec, bool(c.arg(4)) and _used(c, 1))
    n = len(c.node.meta["val"])
    return [out, _lse_as(c, lse, 1), *(_like_meta(c, i) for i in range(2, n))]


def _attention_grad(c: Ctx, spec: Any, dy: Value, out: Value, lse: Value) -> list[Value]:
    from graphkernel.frontends.sdpa import backward

    grads, why = backward(_builder(c), spec, dy, out, lse)
    if why is not None:
        log.info("%s (%s): the exact decomposition, not one fused attention gradient: %s",
                 c.name, c.node.target, why)
    return grads


def _lse_back(c: Ctx, lse: Value, length: Any) -> Value:
    """A logsumexp input as [B, N, L] (cuDNN's trailing 1 or the efficient kernel's padding
    dropped)."""
    if lse.type.rank == 4:
        return c.emit("Squeeze", [lse], {"axis": [3]})
    if symbolic.canon(lse.shape[2]) != symbolic.canon(length):
        if not isinstance(length, int):
            raise Unmapped("a padded logsumexp of a symbolic length")
        return c.emit("StridedSlice", [lse], {"begin": [0], "end": [length], "axes": [2]})
    return lse


@aten("aten._scaled_dot_product_flash_attention_for_cpu_backward.default")
def _sdpa_cpu_backward(c: Ctx):
    _no_dropout(c.arg(6))
    spec = _attention_spec(c, c.arg(1), c.arg(2), c.arg(3), c.kw("attn_mask"), c.arg(7),
                           c.kw("scale"))
    return _attention_grad(c, spec, c.arg(0), c.arg(4), c.arg(5))


@aten("aten._scaled_dot_product_flash_attention_backward.default")
def _sdpa_flash_backward(c: Ctx):
    _no_dropout(c.arg(10))
    spec = _attention_spec(c, c.arg(1), c.arg(2), c.arg(3), None, c.arg(11), c.kw("scale"))
    return _attention_grad(c, spec, c.arg(0), c.arg(4), c.arg(5))


@aten("aten._scaled_dot_product_efficient_attention_backward.default")
def _sdpa_efficient_backward(c: Ctx):
    _no_dropout(c.arg(9))
    if c.arg(10)[3]:
        raise Unmapped("the attention bias's gradient runs through torch")
    q = c.arg(1)
    spec = _attention_spec(c, q, c.arg(2), c.arg(3), c.arg(4), c.argkw(11, "is_causal", False),
                           c.kw("scale"))
    lse = _lse_back(c, c.arg(6), q.shape[2])
    return [*_attention_grad(c, spec, c.arg(0), c.arg(5), lse), None]


@aten("aten._scaled_dot_product_cudnn_attention_backward.default")
def _sdpa_cudnn_backward(c: Ctx):
    _no_dropout(c.arg(13))
    q = c.arg(1)
    spec = _attention_spec(c, q, c.arg(2), c.arg(3), c.arg(8), c.arg(14), c.kw("scale"))
    return _attention_grad(c, spec, c.arg(0), c.arg(4), _lse_back(c, c.arg(5), q.shape[2]))


# ------------------------------------------------- batch norm, pools, padding
def _affine(c: Ctx, x: Value, w: Value | None, b: Value | None) -> tuple[Value, Value]:
    """A batch norm's scale and bias: ones and zeros when the norm has no affine."""
    n = x.shape[1]
    if not isinstance(n, int):
        raise Unmapped("a batch norm over a symbolic channel count")
    w = w if w is not None else c.const(np.ones(n), x.dtype)
    b = b if b is not None else c.const(np.zeros(n), x.dtype)
    return c.cast(w, x.dtype), c.cast(b, x.dtype)


def _unused(c: Ctx, *outputs: int) -> bool:
    """Whether the node's outputs at these positions are read by nobody."""
    import operator as op

    return all(u.target is op.getitem and u.args[1] not in outputs for u in c.node.users)


@aten("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_eval(c: Ctx):
    x, w, b, mean, var, _, eps = (c.arg(i) for i in range(7))
    if not _unused(c, 1, 2):
        raise Unmapped("an inference batch norm whose (empty) saved statistics are read")
    w, b = _affine(c, x, w, b)
    y = c.emit("BatchNorm", [x, w, b, c.cast(mean, x.dtype), c.cast(var, x.dtype)],
               {"epsilon": float(eps)})
    return [y, None, None]


@aten("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.default",
      "aten._native_batch_norm_legit.no_stats", "aten.native_batch_norm.default")
def _batch_norm(c: Ctx):
    target = str(c.node.target)
    x, w, b = c.arg(0), c.arg(1), c.arg(2)
    stats = [] if target.endswith("no_stats") else [c.arg(3), c.arg(4)]
    training, momentum, eps = (c.arg(len(stats) + i) for i in (3, 4, 5))
    w, b = _affine(c, x, w, b)
    if not training:  # native_batch_norm in eval mode: the running statistics
        if not _unused(c, 1, 2):
            raise Unmapped("an inference batch norm whose (empty) saved statistics are read")
        return [c.emit("BatchNorm", [x, w, b, *(c.cast(s, x.dtype) for s in stats)],
                       {"epsilon": float(eps)}), None, None]
    if target == "aten._native_batch_norm_legit.default" or (
            target == "aten.native_batch_norm.default" and stats[0] is not None):
        raise Unmapped("a training batch norm updating its running statistics in place")
    stats = [s for s in stats if s is not None]
    outs = c.emit_multi("BatchNormTraining", [x, w, b, *(c.cast(s, x.dtype) for s in stats)],
                        {"epsilon": float(eps), "momentum": float(momentum)})
    return outs


@aten("aten.native_batch_norm_backward.default")
def _batch_norm_backward(c: Ctx):
    dy, x, w, rmean, rvar, smean, srstd, train, eps, mask = (c.arg(i) for i in range(10))
    w, _ = _affine(c, x, w, None)
    if train:
        dx, dw, db = c.emit_multi("BatchNormGrad", [dy, x, w, smean, srstd],
                                  {"epsilon": float(eps)})
    else:  # the running statistics are constants of the forward: y = x alpha + beta
        shape = [-1] + [1] * (x.type.rank - 2)
        axes = [0] + list(range(2, x.type.rank))
        rstd = c.emit("Div", [c.const(1.0, x.dtype),
                              c.emit("Sqrt", [c.emit("Add", [rvar, c.const(eps, x.dtype)])])])
        dx = c.emit("Mul", [dy, c.emit("Reshape", [c.emit("Mul", [w, rstd])],
                                       {"shape": shape})])
        xhat = c.emit("Mul", [c.emit("Sub", [x, c.emit("Reshape", [rmean], {"shape": shape})]),
                              c.emit("Reshape", [rstd], {"shape": shape})])
        dw = c.emit("ReduceSum", [c.emit("Mul", [dy, xhat])], {"axis": axes})
        db = c.emit("ReduceSum", [dy], {"axis": axes})
    return [o if m else None for o, m in zip((dx, dw, db), mask, strict=True)]


def _spatial_args(c: Ctx, x: Value, first: int, dil: bool = True):
    """(kernel, strides, pads [begins, ends], dilations) of a pool's arguments, PyTorch's
    single values broadcast over the spatial axes."""
    r = x.type.rank - 2

    def full(v, default):
        v = default if v is None or (isinstance(v, list) and not v) else v
        v = [v] if isinstance(v, int) else list(v)
        return v * r if len(v) == 1 else v

    k = full(c.arg(first), None)
    s = full(c.arg(first + 1), k)
    p = full(c.arg(first + 2, 0), 0)
    d = full(c.arg(first + 3, 1), 1) if dil else [1] * r
    if any(len(v) != r for v in (k, s, p, d)):
        raise Unmapped(f"pool arguments for {r} spatial axes")
    return k, s, p + p, d


def _pool_attrs(c: Ctx, x: Value, first: int, dil: bool, ceil_at: int) -> dict:
    k, s, p, d = _spatial_args(c, x, first, dil)
    return {"kernel_size": k, "strides": s, "pads": p, "dilations": d,
            "ceil_mode": bool(c.arg(ceil_at, False))}


@aten("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
      "aten.max_pool2d.default", "aten.max_pool3d.default")
def _max_pool(c: Ctx):
    x = c.arg(0)
    attrs = _pool_attrs(c, x, 1, True, 5)
    y = c.emit("MaxPool", [x], attrs)
    if "with_indices" not in str(c.node.target):
        return y
    idx = None if _unused(c, 1) else c.emit("MaxPoolArgmax", [x], attrs)
    return [y, idx]


@aten("aten.max_pool2d_with_indices_backward.default",
      "aten.max_pool3d_with_indices_backward.default")
def _max_pool_backward(c: Ctx):
    dy, x, idx = c.arg(0), c.arg(1), c.arg(7)
    return c.emit("MaxPoolGrad", [dy, idx], {"input_size": list(x.shape[2:])})


def _avg_attrs(c: Ctx, x: Value, first: int) -> dict:
    attrs = _pool_attrs(c, x, first, False, first + 3)  # (dilations: ones)
    divisor = c.arg(first + 5)
    return attrs | {"count_include_pad": bool(c.arg(first + 4, True)),
                    "divisor": int(divisor) if divisor else 0}


@aten("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(c: Ctx):
    x = c.cast(c.arg(0), c.out_type.dtype)
    attrs = _avg_attrs(c, x, 1)
    if _whole_window(x, attrs):
        return _global_mean(c, x)
    return c.emit("AvgPool", [x], attrs)


@aten("aten.avg_pool2d_backward.default", "aten.avg_pool3d_backward.default")
def _avg_pool_backward(c: Ctx):
    dy, x = c.arg(0), c.arg(1)
    attrs = _avg_attrs(c, x, 2)
    if _whole_window(x, attrs):
        return _global_mean_grad(c, dy, x)
    return c.emit("AvgPoolGrad", [dy], attrs | {"input_size": list(x.shape[2:])})


def _whole_window(x: Value, attrs: dict) -> bool:
    """Whether an average pool is one window over the whole (static) plane, no padding and
    no fixed divisor: a mean over the spatial axes (EfficientNet's pooler: a kernel as large
    as the last width, ceil mode)."""
    sp = x.shape[2:]
    return (not attrs["divisor"] and not any(attrs["pads"])
            and all(isinstance(d, int) and k >= d for d, k in zip(sp, attrs["kernel_size"],
                                                                   strict=True)))


def _global_mean(c: Ctx, x: Value) -> Value:
    """A global average pool as the reduction it is (as torch's own decomposition of an
    adaptive pool to 1x1 is: aten.mean over H and W)."""
    return c.emit("ReduceMean", [x], {"axis": list(range(2, x.type.rank)), "keep_dims": True})


def _global_mean_grad(c: Ctx, dy: Value, x: Value) -> Value:
    """dx of a global mean: dy / (the plane's size) at every element."""
    n = 1
    for d in x.shape[2:]:
        n *= d
    scaled = c.emit("Mul", [dy, c.const(1.0 / n, dy.dtype)])
    return c.emit("BroadcastTo", [scaled], {"shape": list(x.shape)})


def _adaptive_sizes(c: Ctx, x: Value) -> list[int]:
    out = c.arg(1)
    r = x.type.rank - 2
    out = [out] * r if isinstance(out, int) else list(out)
    return [x.shape[2 + i] if o is None else o for i, o in enumerate(out)]


def _batched(c: Ctx, *vals: Value) -> tuple[bool, list[Value]]:
    """A pooling overload's tensors with a batch axis. PyTorch also takes an unbatched input
    (``[C, *spatial]``: one axis more than the spatial ones its name counts); it is pooled as
    a batch of one, and ``_unbatched`` takes that axis off the results again."""
    spatial = int(re.search(r"pool(\d)d", str(c.node.target)).group(1))
    if vals[0].type.rank != spatial + 1:
        return False, list(vals)
    return True, [c.emit("ExpandDims", [v], {"axis": [0]}) for v in vals]


def _unbatched(c: Ctx, unbatched: bool, y: Value | None) -> Value | None:
    return c.emit("Squeeze", [y], {"axis": [0]}) if unbatched and y is not None else y


@aten("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default",
      "aten.adaptive_avg_pool1d.default")
def _adaptive_avg(c: Ctx):
    unbatched, (x,) = _batched(c, c.arg(0))
    out = _adaptive_sizes(c, x)
    if all(o == 1 for o in out):
        return _unbatched(c, unbatched, _global_mean(c, x))
    return _unbatched(c, unbatched, c.emit("AdaptiveAvgPool", [x], {"output_size": out}))


@aten("aten._adaptive_avg_pool2d_backward.default", "aten._adaptive_avg_pool3d_backward.default")
def _adaptive_avg_backward(c: Ctx):
    unbatched, (dy, x) = _batched(c, c.arg(0), c.arg(1))
    if all(o == 1 for o in dy.shape[2:]) and all(isinstance(d, int) for d in x.shape[2:]):
        return _unbatched(c, unbatched, _global_mean_grad(c, dy, x))
    return _unbatched(c, unbatched, c.emit("AdaptiveAvgPoolGrad", [dy],
                                           {"input_size": list(x.shape[2:])}))


@aten("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def _adaptive_max(c: Ctx):
    unbatched, (x,) = _batched(c, c.arg(0))
    attrs = {"output_size": _adaptive_sizes(c, x)}
    y = c.emit("AdaptiveMaxPool", [x], attrs)
    idx = None if _unused(c, 1) else c.emit("AdaptiveMaxPoolArgmax", [x], attrs)
    return [_unbatched(c, unbatched, y), _unbatched(c, unbatched, idx)]


@aten("aten.adaptive_max_pool2d_backward.default", "aten.adaptive_max_pool3d_backward.default")
def _adaptive_max_backward(c: Ctx):
    unbatched, (dy, x, idx) = _batched(c, c.arg(0), c.arg(1), c.arg(2))
    return _unbatched(c, unbatched, c.emit("MaxPoolGrad", [dy, idx],
                                           {"input_size": list(x.shape[2:])}))


def _torch_pads(x: Value, pad: list) -> list[int]:
    """PyTorch's pad list (last axis first: (begin, end) pairs) as [begins..., ends...]."""
    r = x.type.rank
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return begins + ends


_PAD_MODES = {"reflection": "reflect", "replication": "edge"}


@aten(*(f"aten.{m}_pad{d}d.default" for m in _PAD_MODES for d in (1, 2, 3)))
def _mode_pad(c: Ctx):
    x, pad = c.arg(0), list(c.arg(1))
    mode = _PAD_MODES[str(c.node.target).split(".")[1].split("_")[0]]
    return c.emit("Pad", [x], {"pads": _torch_pads(x, pad), "mode": mode})


@aten(*(f"aten.{m}_pad{d}d_backward.default" for m in _PAD_MODES for d in (1, 2, 3)))
def _mode_pad_backward(c: Ctx):
    dy, x, pad = c.arg(0), c.arg(1), list(c.arg(2))
    mode = _PAD_MODES[str(c.node.target).split(".")[1].split("_")[0]]
    return c.emit("PadGrad", [dy], {"pads": _torch_pads(x, pad), "mode": mode})


@aten("aten.hardtanh.default")
def _hardtanh(c: Ctx):
    return c.emit("ClampScalar", [c.arg(0)], {"min": float(c.arg(1, -1.0)),
                                               "max": float(c.arg(2, 1.0))})


@aten("aten.hardtanh_backward.default")
def _hardtanh_backward(c: Ctx):
    dy, x, lo, hi = c.arg(0), c.arg(1), c.arg(2), c.arg(3)
    inside = c.emit("LogicalAnd", [c.emit("Greater", [x, c.const(lo, x.dtype)]),
                                   c.emit("Less", [x, c.const(hi, x.dtype)])])
    return c.emit("Select", [inside, dy, c.const(0, dy.dtype)])


@aten("aten.empty_permuted.default")
def _empty_permuted(c: Ctx):
    t = c.out_type  # empty memory may hold anything: zeros are as good as any content
    if t.is_static:
        return c.const(np.zeros(t.shape), t.dtype)
    return c.emit("BroadcastTo", [c.const(0, t.dtype)], {"shape": list(t.shape)})


# ---------------------------------------------------------------- fallback
def _node_arg(a: Any, inputs: list[Any], env: dict) -> int | None:
    """A node an op run through torch takes as an argument: its size when it is a size that
    is known, else None once it is appended to ``inputs`` (a tensor); a symbolic size is
    refused."""
    v = env[a]
    if isinstance(v, int):
        return v
    if not isinstance(v, Value):
        raise FrontendError(f"'{a.name}' is the symbolic size {v!r}: an op that graphkernel "
                            "runs through torch cannot take a symbolic size (mark fewer "
                            "dims dynamic)")
    inputs.append(a)
    return None


def _encode(a: Any, inputs: list[Any], env: dict) -> Any:
    if isinstance(a, torch.fx.Node):
        size = _node_arg(a, inputs, env)
        return size if size is not None else {"in": len(inputs) - 1}
    if isinstance(a, list | tuple):
        return [_encode(x, inputs, env) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device | torch.layout | torch.memory_format):
        return None
    if isinstance(a, bool | int | float | str) or a is None:
        return a
    raise Unmapped(f"argument of type {type(a).__name__}")


def _seeded(node: Any) -> bool:
    """Whether the ATen op draws from torch's random stream (its ``nondeterministic_seeded``
    tag: dropout, rand, bernoulli ...)."""
    tags = getattr(node.target, "tags", ())
    return torch is not None and torch.Tag.nondeterministic_seeded in tags


class _In:
    """An input tensor's place in a ``TorchCall``'s arguments."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __repr__(self) -> str:
        return f"<input {self.i}>"


def _template(a: Any, inputs: list[Any], env: dict) -> Any:
    """A node's argument with its tensors replaced by their input slots; every other value
    (dtypes, devices, operators, strings, numbers) is kept as the program passed it."""
    if isinstance(a, torch.fx.Node):
        size = _node_arg(a, inputs, env)
        return size if size is not None else _In(len(inputs) - 1)
    if isinstance(a, list | tuple):
        return [_template(x, inputs, env) for x in a]
    if isinstance(a, dict):
        return {k: _template(x, inputs, env) for k, x in a.items()}
    return a


def _fill(a: Any, ts: list[Any]) -> Any:
    if isinstance(a, _In):
        return ts[a.i]
    if isinstance(a, list):
        return [_fill(x, ts) for x in a]
    if isinstance(a, dict):
        return {k: _fill(x, ts) for k, x in a.items()}
    return a


class TorchCall:
    """How an Opaque node of an in-process graph runs: the operator object the program's
    graph called (an ATen overload, or a custom op of any namespace: a library's such as
    ``transformers``', ``torchvision``'s, or the program's own ``torch.library`` op), on the
    node's inputs. The graph is the program's code, so it may call what the program called;
    a model file never gets one (``fn`` cannot come from a file)."""

    def __init__(self, op: Any, args: list[Any], kwargs: dict[str, Any],
                 layouts: list[list[int] | None] | None = None) -> None:
        self.op, self.args, self.kwargs = op, args, kwargs
        # per input: the order of its axes in memory (outermost first) when the traced
        # program's tensor was not row-major, else None (see ``_memory_order``)
        self.layouts = layouts or []

    def __call__(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        ts = [to_torch(x) for x in xs]
        for i, order in enumerate(self.layouts[:len(ts)]):
            if order is not None and ts[i].dim() == len(order):
                # the program's layout again: a copy whose axes lie in memory as they did
                inverse = sorted(range(len(order)), key=order.__getitem__)
                ts[i] = ts[i].permute(order).contiguous().permute(inverse)
        out = self.op(*_fill(self.args, ts), **_fill(self.kwargs, ts))
        outs = out if isinstance(out, list | tuple) else [out]
        return [to_numpy(o) for o in outs if o is not None]

    def __repr__(self) -> str:
        return f"TorchCall({self.op})"


def _memory_order(node: Any) -> list[int] | None:
    """The order in memory (outermost axis first) of the tensor torch makes ``like`` the
    traced value of ``node`` (``torch.empty_like``, whose strides follow the input's), or None
    when that is row-major or not known.

    An op drawing random numbers fills its output in memory order: dropout on a transposed
    tensor (``x.permute(1, 0, 2)`` of a projection) draws its mask for the elements in the
    order they lie in memory, not in the logical order; fed a row-major copy, it would put
    the same draws on other elements, unlike the program."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    try:  # symbolic sizes by their hints, which add no guard: the order of the axes in
        # memory is the program's (its transposes), not the sizes' (Dynamo makes a size
        # symbolic only above 1, so no symbolic axis ties with another)
        shape, stride = ([optimization_hint(d) for d in ds] for ds in (val.shape, val.stride()))
    except Exception:  # noqa: BLE001 - no hint: the input is fed as it comes
        return None
    like = torch.empty_like(torch.empty_strided(shape, stride, device="meta")).stride()
    # outermost first; among equal strides (axes of size 1) the logical order
    order = sorted(range(len(shape)), key=lambda d: (-like[d], d))
    return None if order == list(range(len(shape))) else order


# ops whose result depends on where their input's elements lie in memory, not only on its
# values: ``as_strided`` reads the storage under its input by the strides it is given. Fed a
# row-major copy, it would read other elements than the program's tensor (a Longformer's
# overlapping chunks taken by ``as_strided`` from a view of transposed heads): one its
# handler cannot lower (``as_strided_reads``) is never an Opaque op; its graph runs through
# torch.
READS_MEMORY = frozenset({"aten.as_strided.default"})


def _traced_strides(node: Any) -> tuple[list[int], list[int], int] | None:
    """The traced value of ``node``: (sizes, strides, storage offset), or None when they
    are symbolic or the tensor is empty."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.numel() == 0:
        return None
    try:
        return ([int(d) for d in val.shape], [int(d) for d in val.stride()],
                int(val.storage_offset()))
    except (TypeError, ValueError):  # a symbolic size, stride or offset
        return None


def _opaque(g: Graph, node: Any, env: dict, reason: str, after: Value | None = None) -> Any:
    """``node`` as an Opaque node calling the op itself (``TorchCall``). ``after``: a value
    the node must run after (the previous random op's output: see ``import_fx_module``); an
    extra input the op's arguments do not name. Its ``spec`` (what a saved graph names) is
    the ATen-style description where the arguments have one, else empty: such a graph
    cannot be saved."""
    target = str(node.target)
    if target in READS_MEMORY:  # (fed its values alone, it would read other elements)
        raise FrontendError(f"{target}: {reason}")
    if target not in _LOGGED:
        _LOGGED.add(target)
        log.warning("Fallback %s: %s", target, reason)
    inputs: list[Any] = []
    args = _template(list(node.args), inputs, env)
    kwargs = {k: _template(v, inputs, env) for k, v in node.kwargs.items()}
    try:
        named: list[Any] = []
        spec = {"target": target, "args": _encode(list(node.args), named, env),
                "kwargs": {k: _encode(v, named, env) for k, v in node.kwargs.items()}}
    except Unmapped:  # an argument a file cannot name (an operator, an object)
        spec = {}
    # a random op draws in its input's memory order: it gets the program's layout
    layouts = [_memory_order(i) for i in inputs] if _seeded(node) else None
    val = node.meta.get("val")
    vals = val if isinstance(val, list | tuple) else [val]
    out_types = [TensorType(tuple(_dim(d) for d in v.shape), torch_dtype(v.dtype, node.name))
                 for v in vals if v is not None]
    if not out_types:
        raise FrontendError(f"node '{node.name}' ({target}) has no tensor output metadata")
    n = g.add_node("Opaque", [env[i] for i in inputs] + ([after] if after is not None else []),
                   {"impl": "aten", "spec": spec, "out_types": out_types, "label": target,
                    "fn": TorchCall(node.target, args, kwargs, layouts)},
                   name=g.fresh_name(node.name))
    if not isinstance(val, list | tuple):
        return n.outputs[0]
    outs = iter(n.outputs)  # outputs the op does not produce (None in its schema) stay None
    return [None if v is None else next(outs) for v in vals]


# ------------------------------------------------------------------ import
def _unmapped_why(node: Any) -> str:
    """Why an op without a handler runs through torch, for the log."""
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        op = node.args[0] if node.args else "an op"
        return f"{op}, a custom op that writes its inputs ({target.name()}), runs through torch"
    ns = getattr(target, "namespace", None)
    if ns is not None and ns not in ("aten", "prims"):
        return f"an op of namespace {ns!r} (a custom op the program called) runs through torch"
    return f"no mapping for {target}"


# ATen ops left to torch on purpose, with the reason the log gives
UNMAPPED_WHY = {
    "aten.nonzero.default": "the output size depends on the data",
}


@dataclass
class FxImport:
    """An imported FX graph and how its call signature maps onto the Graph.

    ``inputs`` has one entry per FX placeholder: the index of the graph input it feeds, or
    the symbolic dim it carries (a SymInt argument), or None (an argument graphkernel does not
    need). ``outputs`` has one entry per FX output: ``("value", i)`` (graph output i),
    ``("dim", d)`` (a size, evaluated once the symbols are bound) or ``("none", None)``
    (AOT autograd's None gradients)."""

    graph: Graph
    inputs: list[int | str | None] = field(default_factory=list)
    outputs: list[tuple[str, Any]] = field(default_factory=list)
    # graph input index -> the size whose value it holds (``import_fx_module(sizes_in=True)``:
    # the caller feeds each the value of its size once the symbols are bound)
    sizes: dict[int, Any] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)  # ATen op -> why it is Opaque
    bugs: dict[str, str] = field(default_factory=dict)  # op -> its handler's failure


def specialize_unmodelled(gm: Any) -> list[str]:
    """Specialise (with a guard, as Inductor does for sizes it cannot keep symbolic) every
    symbol that graphkernel cannot carry: one that takes part in a size that is not a product
    of symbols (a convolution's output length ``(s0 - 4)//4``) or in a convolution's spatial
    sizes. Dynamo then recompiles only when such a size changes; the others stay symbolic.
    Returns the specialised symbols (for the log)."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    def syms(v: Any) -> list[Any]:
        if isinstance(v, torch.SymInt):
            return [v]
        shape = getattr(v, "shape", None)
        return [d for d in shape if isinstance(d, torch.SymInt)] if shape is not None else []

    def scan() -> tuple[dict[str, Any], set[str], set[str]]:
        """(symbol -> a SymInt that is exactly it, symbols of sizes that are not products of
        symbols, symbols of convolutions' spatial sizes), with the guards so far applied."""
        free: dict[str, Any] = {}
        odd: set[str] = set()
        spatial: set[str] = set()
        back = {str(q): str(x) for table in _MULTIPLES.values() for x, w in table.items()
                for q in w.free_symbols}
        for n in gm.graph.nodes:
            counts_back = _counts_back(n) or _pad_amount(n)
            for d in syms(n.meta.get("val")):
                expr = _settled(d)
                # (a symbol written as a multiple, n*sNxn, is named and specialised as the
                # guards' own symbol, through its SymInt)
                names = {back.get(str(x), str(x)) for x in expr.free_symbols}
                if isinstance(d.node.expr, sympy.Symbol):
                    free.setdefault(str(d.node.expr), d)
                elif len(names) == 1 and str(expr) in names:
                    free.setdefault(str(expr), d)
                text = str(expr).replace(" ", "")
                if not text.isdigit() and not _MONOMIAL.fullmatch(text) \
                        and _sym_dim(expr) is None and not counts_back:
                    odd |= names
            odd |= _unequal_view(n)
            if n.op == "call_function" and str(n.target) in _STATIC_SPATIAL and n.args:
                x = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
                # 2-D and 3-D ones: a 1-D convolution's length is a derived symbol
                sides = tuple(x.shape)[2:] if x is not None else ()
                for d in (sides if len(sides) > 1 else ()):
                    if isinstance(d, torch.SymInt):
                        spatial |= {str(s) for s in d.node.expr.free_symbols}
        return free, odd, spatial

    import sympy

    _unify_attention_lengths(gm)
    _settle_min_max(gm)
    for what in _settle_congruences(gm):
        log.info("%s under Dynamo's guards (a size padded to a multiple of it)", what)
    done: list[str] = []
    while True:  # one symbol at a time, scanning again: a guard may make other sizes products
        free, odd, spatial = scan()
        # convolutions' spatial sizes first: with them fixed, a size such as s0*s1**2 (batch
        # times a squared image side) is a product again and the batch can stay symbolic
        todo = sorted((spatial & free.keys()) - set(done)) or sorted((odd & free.keys())
                                                                     - set(done))
        if not todo:
            return done
        guard_int(free[todo[0]])
        done.append(todo[0])


_VIEWS = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"}


def _unequal_view(n: Any) -> set[str]:
    """The symbols of a view whose input and output sizes, as graphkernel's dims, do not
    have the same number of elements (Dynamo took a size that is 1 for the example as 1, a
    chunk count ``ceil(L/8)`` under a guard, while graphkernel keeps the expression): such a
    view is only valid for the lengths of the guard, so they are specialised."""
    if n.op != "call_function" or str(n.target) not in _VIEWS or not n.args \
            or not isinstance(n.args[0], torch.fx.Node):
        return set()
    src, out = n.args[0].meta.get("val"), n.meta.get("val")
    if src is None or out is None or not hasattr(src, "shape") or not hasattr(out, "shape"):
        return set()
    sizes = n.args[1] if len(n.args) > 1 and isinstance(n.args[1], list | tuple) else ()
    try:
        a = symbolic.numel([_dim(d) for d in src.shape])
        b = symbolic.numel([_dim(d) for d in out.shape])
        # a size argument other than the output's size (``[B, L, -1]`` taken as ``[B, 8*ceil(L/8),
        # 128]`` under a guard that L is a multiple of 8)
        args = [_dim(x.meta.get("val")) if isinstance(x, torch.fx.Node) else x for x in sizes]
        same = len(args) != len(out.shape) or all(
            x == -1 or (isinstance(x, int | str) and symbolic.eq(x, _dim(d)))
            for x, d in zip(args, out.shape, strict=True))
    except (FrontendError, ShapeError, TypeError):
        return set()
    if symbolic.eq(a, b) and same:
        return set()
    return {str(x) for d in (*src.shape, *out.shape) if isinstance(d, torch.SymInt)
            for x in d.node.expr.free_symbols}


# shape environment -> {symbol: n * a fresh symbol} for each symbol its guards hold to be a
# multiple of n (see ``_settle_congruences``)
_MULTIPLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _written() -> set[Any]:
    """The fresh symbols of ``_settle_congruences`` (``q`` of a length ``8*q``)."""
    return {q for table in _MULTIPLES.values() for w in table.values() for q in w.free_symbols}


def _settle_congruences(gm: Any) -> list[str]:
    """Write each symbol ``s`` that Dynamo's guards hold to be a multiple of ``n`` as ``n``
    times a fresh symbol ``s`` x ``n`` (``s0`` -> ``8*s0x8``), for ``_settled``. Mamba-2
    pads the length to a multiple of its chunk, ``L + Mod(8 - Mod(L, 8), 8)``, and branches
    on that padding being 0: Dynamo guards ``Mod(8 - Mod(L, 8), 8) <= 0`` and the graph
    then views the padded length ``8*ceil(L/8)`` as ``L``, equal only under that guard. A
    remainder ``m`` by a constant ``n`` of one symbol that the guards hold to be 0 (asked of
    the shape environment, which adds no guard), and that is 0 for one residue of the
    symbol modulo ``n`` alone (``m`` is a function of the residue: evaluated for each),
    makes the symbol that residue's multiples; for residue 0, ``n`` times a symbol, a size
    graphkernel's dims spell (``8*ceil(8*q/8)`` is ``8*q``). Exact for every size the guards
    admit; no guard is added, so Dynamo recompiles no more than it would. Returns the
    symbols so written (for the log)."""
    import sympy
    from torch.utils._sympy import functions as F

    found: dict[Any, dict[Any, int]] = {}  # env -> {symbol: modulus}
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        sizes = [v] if isinstance(v, torch.SymInt) else \
            [d for d in getattr(v, "shape", ()) if isinstance(d, torch.SymInt)]
        for d in sizes:
            env = getattr(d.node, "shape_env", None)
            if env is None:
                continue
            for m in sympy.preorder_traversal(d.node.expr):
                if type(m) not in (F.Mod, F.PythonMod) or len(m.free_symbols) != 1 \
                        or not isinstance(m.args[1], sympy.Integer) or int(m.args[1]) < 2:
                    continue
                (s,), mod = tuple(m.free_symbols), int(m.args[1])
                if found.get(env, {}).get(s, 1) % mod == 0:
                    continue
                try:
                    zero = env._maybe_evaluate_static(sympy.Eq(m, 0)) or \
                        env._maybe_evaluate_static(sympy.Le(m, 0))
                except Exception:  # noqa: BLE001 - a form the environment cannot decide
                    zero = None
                if zero is not sympy.true:
                    continue
                # the residues of s modulo mod for which m is 0 (m depends on the residue
                # alone: checked at two multiples apart)
                zeros = set()
                for r in range(mod):
                    vals = {m.xreplace({s: r + mod * k}) for k in (3, 17)}
                    if len(vals) != 1 or not all(x.is_Integer for x in vals):
                        zeros = None
                        break
                    if vals == {sympy.Integer(0)}:
                        zeros.add(r)
                if zeros != {0}:
                    continue
                mine = found.setdefault(env, {})
                mine[s] = math.lcm(mine.get(s, 1), mod)
    done = []
    for env, mods in found.items():
        table = _MULTIPLES.setdefault(env, {})
        for s, mod in mods.items():
            q = sympy.Symbol(f"{s}x{mod}", integer=True, positive=True)
            table[s] = mod * q
            done.append(f"{s} = {mod}*{q}")
    return done


def _settle_min_max(gm: Any) -> None:
    """Guard, for each ``Max``/``Min`` of one symbol in a size or size argument, the branch
    the example sizes take (as Dynamo guards a Python ``if`` on a size): MPT slices its
    alibi table from ``max(0, L - s)``, which under ``s <= L`` is ``L - s``. Dynamo
    recompiles if a later call takes the other branch."""
    import sympy

    for n in gm.graph.nodes:
        v = n.meta.get("val")
        sizes = [v] if isinstance(v, torch.SymInt) else \
            [d for d in getattr(v, "shape", ()) if isinstance(d, torch.SymInt)]
        for d in sizes:
            env = d.node.shape_env
            for atom in _min_max(_settled(d)):
                a, b = atom.args
                vals = getattr(env, "backed_var_to_val", None) or env.var_to_val
                va, vb = (x.xreplace(vals) for x in (a, b))
                if not (va.is_number and vb.is_number):
                    continue
                env.evaluate_expr(sympy.Ge(a, b) if va >= vb else sympy.Ge(b, a))


def _counts_back(n: Any) -> bool:
    """Whether the FX node ``n`` is a scalar size ``L - s`` (one symbol, coefficient -1)
    read only as the start of slices or by other such scalars: a slice of a static axis
    from its end (see ``_slice_last``), which needs no specialisation."""
    import sympy

    val = n.meta.get("val")
    if not isinstance(val, torch.SymInt):
        return False
    expr = _settled(val)
    syms_ = list(expr.free_symbols)
    # a size that divides by its symbol (a view's ``numel // s0``) is not ``L - s``, and
    # setting the symbol to 0 in it would divide by zero
    if len(syms_) != 1 or not expr.is_polynomial(syms_[0]):
        return False
    # (coefficient -1, or a negative multiple: ``-8*q`` for a length the guards hold to be a
    # multiple of 8)
    slope = sympy.expand(expr - expr.subs(syms_[0], 0)) / syms_[0]
    if not (slope.is_Integer and (slope == -1 or (slope < 0 and syms_[0] in _written()))):
        return False
    return bool(n.users) and all(_slices_to_end(u, n) or _counts_back(u) for u in n.users)


def _slices_to_end(u: Any, start: Any) -> bool:
    """Whether FX node ``u`` is a step-1 slice from ``start`` to the end of a static axis."""
    if str(u.target) != "aten.slice.Tensor" or len(u.args) < 3 or u.args[2] is not start \
            or start in u.args[3:]:
        return False
    x = u.args[0].meta.get("val") if isinstance(u.args[0], torch.fx.Node) else None
    if x is None:
        return False
    length = x.shape[u.args[1]]
    end = u.args[3] if len(u.args) > 3 else None
    step = u.args[4] if len(u.args) > 4 else 1
    if isinstance(length, torch.SymInt) and step == 1 and isinstance(end, int) \
            and end >= INT64_MAX and isinstance(start.meta.get("val"), torch.SymInt):
        # ``x[..., -L:]`` of an axis of length L: the whole axis
        return _settled(start.meta["val"]) + _settled(length) == 0
    return isinstance(length, int) and step == 1 and (
        end is None or (isinstance(end, int) and end >= length))


def _unify_attention_lengths(gm: Any) -> None:
    """Guard equal the sizes attention requires equal but Dynamo left as distinct symbols (a
    KV cache's keys and values, two inputs of ``s0`` and ``s1`` positions: torch's CPU
    kernel checks them only when it runs), so that the sizes are one symbol graphkernel can
    take as one attention; Dynamo recompiles if a later call breaks the guard (where eager
    would raise). Only sizes whose example values are equal are guarded. A symbolic head
    size or head count (q, k and v given as inputs under ``dynamic=True``) is specialised:
    the scale and the operator need them as numbers."""
    from torch.fx.experimental.symbolic_shapes import guard_bool, guard_int

    for n in gm.graph.nodes:
        if n.op != "call_function" or "scaled_dot_product" not in str(n.target) \
                or "backward" in str(n.target) or len(n.args) < 3:
            continue
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                for a in n.args[:3]]
        if any(v is None or v.dim() < 2 for v in vals):
            continue
        for x in vals:  # the head size, and the heads of [B, N, S, D] operands
            for d in (x.shape[-1], x.shape[1]) if x.dim() == 4 else (x.shape[-1],):
                if isinstance(d, torch.SymInt):
                    guard_int(d)
        k, v = vals[1:]
        for a, b in zip(k.shape[:-1], v.shape[:-1], strict=False):
            if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) \
                    and str(a) != str(b) and a.node.hint == b.node.hint:
                guard_bool(a == b)


def import_fx(gm: Any, example_inputs: Sequence[Any] | None = None,
              name: str = "fx_graph") -> Graph:
    """Import an ATen-level ``torch.fx.GraphModule`` (placeholders become graph inputs)."""
    return import_fx_module(gm, example_inputs, name).graph


def import_fx_module(gm: Any, example_inputs: Sequence[Any] | None = None,
                     name: str = "fx_graph",
                     constants: dict[int, np.ndarray] | None = None,
                     strict: bool = True, sizes_in: bool = False) -> FxImport:
    """Import an ATen-level ``torch.fx.GraphModule`` with its call signature; the
    placeholders numbered in ``constants`` become Constant nodes (frozen parameters).
    Without ``strict``, a handler that fails unexpectedly (a bug) is logged with its
    traceback and its op runs through torch (``FxImport.bugs``); with it, the error is
    raised. With ``sizes_in``, a symbolic size the program reads as a number
    (``scalar_tensor(s0)``, ``torch.tensor(x.size(0))``) becomes a scalar graph input that
    the caller feeds with the size's value (``FxImport.sizes``: a caller that binds the
    symbols when it runs the graph, the torch backend); without it (a graph exported to be
    run by others), the value is counted on the device (``_size_value``)."""
    if torch is None:
        raise FrontendError("importing FX graphs needs torch: pip install 'graphkernel[torch]'")
    g = Graph(name)
    res = FxImport(g)
    env: dict[Any, Any] = {}
    if sizes_in:
        env[_SIZES_IN] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = list(example_inputs) if example_inputs is not None else [None] * len(placeholders)
    constants = constants or {}
    for i, (n, ex) in enumerate(zip(placeholders, examples, strict=False)):
        if i in constants:
            env[n] = g.add_node("Constant", [], {"value": constants[i]},
                                name=g.fresh_name(n.name)).output
            res.inputs.append(None)
            continue
        if isinstance(ex, torch.Tensor):
            t = TensorType(tuple(_dim(d) for d in ex.shape), torch_dtype(ex.dtype, n.name))
        else:
            t = meta_type(n, n.name)
        if t is None:
            val = n.meta.get("val", ex)
            env[n] = _dim(val) if isinstance(val, int | torch.SymInt) else val
            res.inputs.append(env[n] if isinstance(env[n], str) else None)
            continue
        env[n] = g.add_input(n.name, t)
        res.inputs.append(len(g.inputs) - 1)
    flat: list[Any] = []
    token: Value | None = None  # the last op that drew random numbers
    for n in gm.graph.nodes:
        if n.op in ("placeholder",):
            continue
        if n.op == "get_attr":
            env[n] = g.add_node("Constant", [], {"value": to_numpy(getattr(gm, n.target))},
                                name=g.fresh_name(n.name)).output
            continue
        if n.op == "output":
            flat = list(n.args[0]) if isinstance(n.args[0], list | tuple) else [n.args[0]]
            continue
        if n.target is operator.getitem:
            env[n] = env[n.args[0]][n.args[1]]
            continue
        if not n.users and n.meta.get("val") is None:
            continue  # checks such as aten._assert_tensor_metadata: no value, no users
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt):
            # size arithmetic (sym_size, s0 * 5 ...) becomes a symbolic dim; a start counted
            # back from a static end (see _counts_back) an offset
            env[n] = SymOffset(_settled(val)) if _counts_back(n) or _pad_amount(n) \
                else _dim(val)
            continue
        handler = ATEN.get(str(n.target))
        reason = UNMAPPED_WHY.get(str(n.target)) or _unmapped_why(n)
        if handler is not None:
            mark = len(g)
            try:
                env[n] = handler(Ctx(g, n, env))
                continue
            except (Unmapped, GraphKernelError) as e:
                reason = str(e)
            except Exception as e:  # a handler's bug: the op runs through torch instead
                if strict:
                    raise
                reason = (f"bug in graphkernel's import of {n.target}: {type(e).__name__}: "
                          f"{e}")
                res.bugs[str(n.target)] = reason
                log.error("%s (node %s); the op runs through torch", reason, n.name,
                          exc_info=True)
            for node in reversed(g.nodes[mark:]):
                if not any(v.uses for v in node.outputs):
                    g.erase_node(node)
        res.fallbacks.setdefault(str(n.target), reason)
        # ops drawing random numbers run in the program's order (the stream is shared):
        # each reads the previous one's first output, so no pass can reorder them
        seeded = _seeded(n)
        env[n] = _opaque(g, n, env, reason, token if seeded else None)
        if seeded:
            first = env[n][0] if isinstance(env[n], list) else env[n]
            token = first if isinstance(first, Value) else token
    final: list[Value] = []
    for a in flat:
        v = env[a] if isinstance(a, torch.fx.Node) else a
        if v is None:
            res.outputs.append(("none", None))
        elif isinstance(v, int | str) and not isinstance(v, bool):
            res.outputs.append(("dim", v))
        elif not isinstance(v, Value):
            raise FrontendError(f"graph output {v!r} is not a tensor")
        else:
            if v.is_input or any(v is o for o in final):
                v = g.add_node("Identity", [v], name=g.fresh_name(f"{v.name}_out")).output
            res.outputs.append(("value", len(final)))
            final.append(v)
    g.set_outputs(final)
    g.remove_dead()
    fed = env.get(_SIZES_IN, {})
    for v in fed.values():  # (sizes read only by a vector fed whole: see _size_vector_input)
        if v in g.inputs and not v.uses and not g.is_output(v):
            g.remove_input(v)
    for (dim, _), v in fed.items():
        if v in g.inputs:
            res.sizes[g.inputs.index(v)] = dim
    return res
