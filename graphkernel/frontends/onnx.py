"""ONNX import: ONNX nodes become registered ops; the rest become Opaque nodes.

Each ONNX op type with a mapping has one handler in ``HANDLERS`` (opset
differences such as axes-as-attribute vs axes-as-input are handled there).
A node without a handler, or whose handler declines it (``Unsupported``), is
imported as an ``Opaque`` node executed by ``onnx.reference``; the reason is
kept in ``graph_import_notes``. Initializers become constants.
"""

from __future__ import annotations

import base64
import functools
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphkernel import fileio, limits, symbolic
from graphkernel.errors import FrontendError, GraphKernelError
from graphkernel.fileio import FileTooLarge, NotRegularFile, open_beneath, read_bounded
from graphkernel.ir import DType, Graph, TensorType, Value
from graphkernel.ops import swaps_last_two

try:
    import onnx
    from onnx import numpy_helper
except ImportError:  # pragma: no cover - exercised only without the extra
    onnx = None

INT_MAX = 2**63 - 1

# ONNX TensorProto element types graphkernel models.
_ONNX_DTYPES = {1: DType.float32, 2: DType.uint8, 3: DType.int8, 5: DType.int16,
                6: DType.int32, 7: DType.int64, 9: DType.bool, 10: DType.float16,
                11: DType.float64, 16: DType.bfloat16}


def _require_onnx() -> None:
    if onnx is None:
        raise FrontendError("importing ONNX models needs the onnx package: "
                            "pip install 'graphkernel[onnx]'")


def onnx_dtype(code: int, where: str) -> DType:
    if code in _ONNX_DTYPES:
        return _ONNX_DTYPES[code]
    name = onnx.TensorProto.DataType.Name(code) if onnx else str(code)
    raise FrontendError(f"{where}: element type {name} is not supported (accepted: "
                        + ", ".join(sorted({d.value for d in _ONNX_DTYPES.values()})) + ")")


class Unsupported(Exception):
    """A handler declines a node; it becomes an Opaque node with this reason."""


# ------------------------------------------------------------------ context
@dataclass
class NodeCtx:
    """What a handler sees: the node, its inputs as Values, and a graph to emit into."""

    graph: Graph
    node: Any
    inputs: list[Value | None]
    attrs: dict[str, Any]
    opset: int
    name: str
    emitted: list[str] = field(default_factory=list)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> Value:
        if i >= len(self.inputs) or self.inputs[i] is None:
            raise Unsupported(f"input {i} is missing")
        return self.inputs[i]

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def const(self, i: int) -> np.ndarray | None:
        """The value of input i when it is a constant, else None."""
        if not self.has_input(i):
            return None
        v = self.inputs[i]
        if v.producer is not None and v.producer.op == "Constant":
            return v.producer.attrs["value"]
        return None

    def static(self, i: int, what: str) -> np.ndarray:
        val = self.const(i)
        if val is None:
            raise Unsupported(f"{what} (input {i}) must be a constant")
        return val

    def emit(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None) -> Value:
        n = self.graph.add_node(op, inputs, attrs or {},
                                name=self.graph.fresh_name(f"{self.name}/{op.lower()}"),
                                origin=(self.name,))
        self.emitted.append(n.name)
        folded = _fold_small(self.graph, n)
        if folded is not None:
            self.emitted.append(folded.producer.name)
            return folded
        return n.outputs[0] if len(n.outputs) == 1 else n.outputs

    def emit_multi(self, op: str, inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
        n = self.graph.add_node(op, inputs, attrs,
                                name=self.graph.fresh_name(f"{self.name}/{op.lower()}"),
                                origin=(self.name,))
        self.emitted.append(n.name)
        return list(n.outputs)

    def constant(self, value: Any, dtype: DType | None = None) -> Value:
        arr = np.asarray(value, dtype=dtype.np if dtype else None)
        return self.emit("Constant", [], {"value": arr})

    def scalar_like(self, value: float, like: Value) -> Value:
        return self.constant(np.asarray(value, dtype=like.dtype.np))


FOLD_LIMIT = 1024  # elements: shape arithmetic is folded at import, weights math is not


def _fold_small(g: Graph, n: Any) -> Value | None:
    """Evaluate a single-output node whose inputs are all small constants (the shape
    arithmetic exported models are full of), so later nodes see static attributes."""
    if n.op in ("Constant", "Opaque") or len(n.outputs) != 1 or not n.inputs:
        return None
    if not all(v.producer is not None and v.producer.op == "Constant" for v in n.inputs):
        return None
    out = n.outputs[0]
    if not out.type.is_static or out.type.numel > FOLD_LIMIT:
        return None
    if any(v.type.numel > FOLD_LIMIT for v in n.inputs):
        return None
    from graphkernel.interpreter import Interpreter

    sub = Graph("fold")
    vals = [sub.const(v.producer.attrs["value"]) for v in n.inputs]
    sub.set_outputs([sub.add_node(n.op, vals, n.attrs).output])
    value = Interpreter(sub).run({})[0]
    c = g.add_node("Constant", [], {"value": value}, name=g.fresh_name(n.name + "/folded"),
                   origin=n.origin)
    g.replace_all_uses(out, c.output)
    g.erase_node(n)
    return c.output


Handler = Callable[[NodeCtx], list[Value] | Value]
HANDLERS: dict[str, Handler] = {}


def handles(*op_types: str):
    def deco(fn: Handler) -> Handler:
        for t in op_types:
            HANDLERS[t] = fn
        return fn

    return deco


def mapped_op_types() -> list[str]:
    return sorted(HANDLERS)


# ------------------------------------------------------------- elementwise
_UNARY = {"Abs": "Abs", "Neg": "Neg", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
          "Reciprocal": "Reciprocal", "Sin": "Sin", "Cos": "Cos", "Tan": "Tan", "Asin": "Asin",
          "Acos": "Acos", "Atan": "Atan", "Tanh": "Tanh", "Erf": "Erf", "Floor": "Floor",
          "Ceil": "Ceil", "Round": "Round", "Sign": "Sign", "IsNaN": "IsNan", "Not": "LogicalNot",
          "Identity": "Identity"}
_BINARY = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Equal": "Equal",
           "Greater": "Greater", "GreaterOrEqual": "GreaterEqual", "Less": "Less",
           "LessOrEqual": "LessEqual", "And": "LogicalAnd", "Or": "LogicalOr", "Xor": "NotEqual",
           "BitwiseAnd": "BitwiseAnd", "BitwiseOr": "BitwiseOr"}


@handles(*_UNARY)
def _unary(c: NodeCtx):
    return c.emit(_UNARY[c.node.op_type], [c.input(0)])


@handles(*_BINARY)
def _binary(c: NodeCtx):
    return c.emit(_BINARY[c.node.op_type], [c.input(0), c.input(1)])


@handles("Relu")
def _relu(c: NodeCtx):
    return c.emit("ReLU", [c.input(0)])


_ACTIVATIONS = {"Sigmoid": "Sigmoid", "HardSwish": "HSwish", "Sinh": "Sinh", "Cosh": "Cosh",
                "Asinh": "Asinh", "Acosh": "Acosh"}


@handles(*_ACTIVATIONS)
def _activation(c: NodeCtx):
    return c.emit(_ACTIVATIONS[c.node.op_type], [c.input(0)])


@handles("Gelu")
def _gelu(c: NodeCtx):
    approx = c.attr("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    return c.emit("GeLU", [c.input(0)], {"approximate": approx})


@handles("LeakyRelu")
def _leaky_relu(c: NodeCtx):
    return c.emit("LeakyReLU", [c.input(0)], {"alpha": c.attr("alpha", 0.01)})


@handles("Elu")
def _elu(c: NodeCtx):
    return c.emit("Elu", [c.input(0)], {"alpha": c.attr("alpha", 1.0)})


@handles("Softplus")
def _softplus(c: NodeCtx):
    return c.emit("Softplus", [c.input(0)])


@handles("Swish")
def _swish(c: NodeCtx):
    x = c.input(0)
    alpha = c.attr("alpha", 1.0)
    if alpha == 1.0:
        return c.emit("SiLU", [x])
    return c.emit("Mul", [x, c.emit("Sigmoid", [c.emit("Mul", [x, c.scalar_like(alpha, x)])])])


@handles("HardSigmoid")
def _hard_sigmoid(c: NodeCtx):
    x = c.input(0)
    alpha, beta = c.attr("alpha", 0.2), c.attr("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return c.emit("HSigmoid", [x])
    # max(0, min(1, alpha x + beta))
    y = c.emit("Add", [c.emit("Mul", [x, c.scalar_like(alpha, x)]), c.scalar_like(beta, x)])
    return c.emit("Maximum", [c.emit("Minimum", [y, c.scalar_like(1, x)]), c.scalar_like(0, x)])


@handles("Shrink")
def _shrink(c: NodeCtx):
    x = c.input(0)
    bias, lambd = c.attr("bias", 0.0), c.attr("lambd", 0.5)
    if bias == 0.0:
        return c.emit("HShrink", [x], {"lambd": lambd})
    # x < -lambd ? x + bias : (x > lambd ? x - bias : 0)
    hi = c.emit("Select", [c.emit("Greater", [x, c.scalar_like(lambd, x)]),
                           c.emit("Sub", [x, c.scalar_like(bias, x)]), c.scalar_like(0, x)])
    return c.emit("Select", [c.emit("Less", [x, c.scalar_like(-lambd, x)]),
                             c.emit("Add", [x, c.scalar_like(bias, x)]), hi])


def _softmax_axis(c: NodeCtx, rank: int) -> int | list[int]:
    if c.opset < 13:  # the input is coerced to 2-D at axis: normalize over all trailing dims
        axis = c.attr("axis", 1)
        axis = axis + rank if axis < 0 else axis
        return list(range(axis, rank))
    return c.attr("axis", -1)


@handles("Softmax", "LogSoftmax")
def _softmax(c: NodeCtx):
    x = c.input(0)
    return c.emit(c.node.op_type, [x], {"axis": _softmax_axis(c, x.type.rank)})


# Attention's attributes as of opset 23; the output modes only matter for outputs refused below
ATTENTION_ATTRS = frozenset({"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode",
                             "scale", "softcap", "softmax_precision"})


@handles("Attention")
def _attention(c: NodeCtx):
    """ONNX's Attention (opset 23, without a KV cache): one FusedAttention, or the exact
    decomposition with the reason (graphkernel/frontends/sdpa.py). Q, K, V are [B, N, S, D],
    or [B, S, N·D] with ``q_num_heads``/``kv_num_heads`` (split into heads here, merged
    again after; the attention pass then reads them in place). Without past keys its
    ``is_causal`` keeps key j <= query i, torch's top-left alignment; a row with no key left
    gives zeros, as the operator documents."""
    from graphkernel.frontends.sdpa import Builder, Spec, forward

    if c.has_input(4) or c.has_input(5):
        raise Unsupported("past_key/past_value (a KV cache) are not modeled")
    if any(c.has_input(i) for i in range(6, len(c.node.input))):
        raise Unsupported("nonpad_kv_seqlen (opset 24: keys past each batch's length masked) "
                          "is not modeled")
    unknown = sorted({a.name for a in c.node.attribute} - ATTENTION_ATTRS)
    if unknown:  # (a later opset's attribute: ignoring it would give another result)
        raise Unsupported(f"attribute(s) {', '.join(unknown)} not modeled (accepted: "
                          f"{', '.join(sorted(ATTENTION_ATTRS))})")
    if c.attr("softcap", 0.0):
        raise Unsupported(f"softcap={c.attr('softcap')} is not modeled")
    if any(c.node.output[1:]):
        raise Unsupported("present_key/present_value/qk_matmul_output are not modeled")
    q, k, v = c.input(0), c.input(1), c.input(2)
    rank = q.type.rank
    heads = (c.attr("q_num_heads"), c.attr("kv_num_heads"))
    if rank == 3:
        if None in heads:
            raise Unsupported("3-D Q, K, V need q_num_heads and kv_num_heads")
        q, k, v = (_heads_of(c, x, n) for x, n in ((q, heads[0]), (k, heads[1]),
                                                     (v, heads[1])))
    elif rank != 4:
        raise Unsupported(f"Q of rank {rank} (accepted: 3 or 4)")
    mask = c.input(3) if c.has_input(3) else None
    spec = Spec(q, k, v, mask, c.attr("scale"), bool(c.attr("is_causal", 0)))
    with c.graph.recording() as added:
        try:
            out, _, _ = forward(Builder(c.graph, c.name, (c.name,)), spec)
        finally:  # (undone with the handler's other nodes when it fails)
            c.emitted += [n.name for n in added]
    if rank == 3:
        b, n, s, d = out.shape
        out = c.emit("Transpose", [out], {"perm": [0, 2, 1, 3]})
        out = c.emit("Reshape", [out], {"shape": [b, s, symbolic.mul(n, d)]})
    return out


def _heads_of(c: NodeCtx, x: Value, n: int) -> Value:
    """[B, S, N·D] as [B, N, S, D]."""
    b, s, h = x.shape
    if not isinstance(h, int) or h % n:
        raise Unsupported(f"hidden size {h!r} is not a multiple of {n} heads")
    x = c.emit("Reshape", [x], {"shape": [b, s, n, h // n]})
    return c.emit("Transpose", [x], {"perm": [0, 2, 1, 3]})


@handles("LayerNormalization")
def _layer_norm(c: NodeCtx):
    x, scale = c.input(0), c.input(1)
    axis = c.attr("axis", -1)
    axis = axis + x.type.rank if axis < 0 else axis
    eps = c.attr("epsilon", 1e-5)
    pshape = list(x.shape[axis:])
    if list(scale.shape) != pshape:
        scale = c.emit("BroadcastTo", [scale], {"shape": pshape})
    bias = c.input(2) if c.has_input(2) else c.emit("BroadcastTo", [c.scalar_like(0, x)],
                                                    {"shape": pshape})
    if list(bias.shape) != pshape:
        bias = c.emit("BroadcastTo", [bias], {"shape": pshape})
    y, mean, var = c.emit_multi("LayerNorm", [x, scale, bias], {
        "begin_norm_axis": axis, "begin_params_axis": axis, "epsilon": eps})
    outs = [y]
    if len(c.node.output) > 1:
        outs.append(mean)
    if len(c.node.output) > 2:
        outs.append(c.emit("Rsqrt", [c.emit("Add", [var, c.scalar_like(eps, var)])]))
    return outs


@handles("RMSNormalization")
def _rms_norm(c: NodeCtx):
    x, scale = c.input(0), c.input(1)
    axis = c.attr("axis", -1)
    axis = axis + x.type.rank if axis < 0 else axis
    pshape = list(x.shape[axis:])
    if list(scale.shape) != pshape:
        scale = c.emit("BroadcastTo", [scale], {"shape": pshape})
    y, _ = c.emit_multi("RMSNorm", [x, scale], {"epsilon": c.attr("epsilon", 1e-5), "axis": axis})
    return y


@handles("IsInf")
def _isinf(c: NodeCtx):
    x = c.input(0)
    inf = c.emit("IsInf", [x])
    pos, neg = c.attr("detect_positive", 1), c.attr("detect_negative", 1)
    if pos and neg:
        return inf
    if not pos and not neg:
        return c.emit("LogicalAnd", [inf, c.constant(False)])
    side = c.emit("Greater" if pos else "Less", [x, c.scalar_like(0, x)])
    return c.emit("LogicalAnd", [inf, side])


@handles("Mod")
def _mod(c: NodeCtx):
    return c.emit("Mod" if c.attr("fmod", 0) else "FloorMod", [c.input(0), c.input(1)])


@handles("Pow")
def _pow(c: NodeCtx):
    x, y = c.input(0), c.input(1)
    if y.dtype != x.dtype:
        y = c.emit("Cast", [y], {"dtype": x.dtype})
    return c.emit("Pow", [x, y])


@handles("Max", "Min")
def _variadic(c: NodeCtx):
    op = {"Max": "Maximum", "Min": "Minimum"}[c.node.op_type]
    vals = [c.input(i) for i in range(len(c.inputs))]
    acc = vals[0]
    for v in vals[1:]:
        acc = c.emit(op, [acc, v])
    return acc if len(vals) > 1 else c.emit("Identity", [acc])


@handles("Sum", "Mean")
def _sum_mean(c: NodeCtx):
    vals = [c.input(i) for i in range(len(c.inputs))]
    acc = c.emit("AddN", vals) if len(vals) > 1 else c.emit("Identity", vals)
    if c.node.op_type == "Mean" and len(vals) > 1:
        acc = c.emit("Div", [acc, c.scalar_like(len(vals), acc)])
    return acc


@handles("Where")
def _where(c: NodeCtx):
    return c.emit("Select", [c.input(0), c.input(1), c.input(2)])


@handles("Cast")
def _cast(c: NodeCtx):
    return c.emit("Cast", [c.input(0)], {"dtype": onnx_dtype(c.attr("to"), c.name)})


@handles("CastLike")
def _cast_like(c: NodeCtx):
    return c.emit("Cast", [c.input(0)], {"dtype": c.input(1).dtype})


@handles("Clip")
def _clip(c: NodeCtx):
    x = c.input(0)
    if c.opset < 11:
        lo, hi = c.attr("min"), c.attr("max")
        lo_v = c.scalar_like(lo, x) if lo is not None else None
        hi_v = c.scalar_like(hi, x) if hi is not None else None
    else:
        lo_v = c.input(1) if c.has_input(1) else None
        hi_v = c.input(2) if c.has_input(2) else None
    lo_c = None if lo_v is None else _scalar_const(lo_v)
    hi_c = None if hi_v is None else _scalar_const(hi_v)
    if (lo_v is None or lo_c is not None) and (hi_v is None or hi_c is not None) and \
            (lo_v is not None or hi_v is not None):
        return c.emit("ClampScalar", [x], {"min": lo_c, "max": hi_c})
    if lo_v is not None:
        x = c.emit("Maximum", [x, lo_v])
    if hi_v is not None:
        x = c.emit("Minimum", [x, hi_v])
    if lo_v is None and hi_v is None:
        x = c.emit("Identity", [x])
    return x


def _scalar_const(v: Value) -> float | None:
    p = v.producer
    if p is not None and p.op == "Constant" and p.attrs["value"].size == 1:
        return float(p.attrs["value"].reshape(-1)[0])
    return None


# ------------------------------------------------------------------- shapes
def _ints(a: np.ndarray | list | None) -> list[int]:
    """``a`` as a list of Python ints (an attribute's list of ints as it is: most are)."""
    if a is None:
        return []
    if type(a) is list and all(type(v) is int for v in a):
        return list(a)
    return [int(v) for v in np.asarray(a).reshape(-1).tolist()]


@handles("Reshape")
def _reshape(c: NodeCtx):
    x = c.input(0)
    shape = _ints(c.attr("shape")) if c.opset < 5 else _ints(c.static(1, "shape"))
    if not c.attr("allowzero", 0):
        if any(d == 0 and i >= x.type.rank for i, d in enumerate(shape)):
            raise BadModel(f"node '{c.name}' (Reshape): shape {shape} copies a dim (0) past "
                           f"the input's rank {x.type.rank}")
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return c.emit("Reshape", [x], {"shape": shape})


@handles("Flatten")
def _flatten(c: NodeCtx):
    x = c.input(0)
    axis = c.attr("axis", 1)
    axis = axis + x.type.rank if axis < 0 else axis
    return c.emit("Reshape", [x], {"shape": [symbolic.numel(x.shape[:axis]),
                                             symbolic.numel(x.shape[axis:])]})


def _axes(c: NodeCtx, attr_until: int, idx: int = 1) -> list[int] | None:
    if c.opset < attr_until:
        a = c.attr("axes")
        return None if a is None else _ints(a)
    if not c.has_input(idx):
        return None
    return _ints(c.static(idx, "axes"))


@handles("Unsqueeze")
def _unsqueeze(c: NodeCtx):
    return c.emit("ExpandDims", [c.input(0)], {"axis": _axes(c, 13) or []})


@handles("Squeeze")
def _squeeze(c: NodeCtx):
    return c.emit("Squeeze", [c.input(0)], {"axis": _axes(c, 13)})


@handles("Transpose")
def _transpose(c: NodeCtx):
    x = c.input(0)
    perm = c.attr("perm")
    r = x.type.rank
    # torch's exporter writes axes counted from the end (perm [0, -2, -1, 1]), which the
    # runtimes read as numpy does; the op checks that the result is a permutation
    return c.emit("Transpose", [x], {"perm": [p % r if -r <= p < 0 else p for p in _ints(perm)]
                                     if perm is not None else list(range(r))[::-1]})


@handles("Tile")
def _tile(c: NodeCtx):
    x = c.input(0)
    reps = _ints(c.static(1, "repeats"))
    if len(reps) != x.type.rank:
        raise Unsupported(f"Tile: {len(reps)} repeats for rank {x.type.rank}")
    if all(r == 1 for r in reps):
        return c.emit("Identity", [x])
    return c.emit("Tile", [x], {"multiples": reps})


@handles("Trilu")
def _trilu(c: NodeCtx):
    """The upper (or lower) triangle from diagonal k, the rest 0: a Select with a constant mask
    of the last two (static) axes, exact for every value (x * mask would make inf * 0 NaN)."""
    x = c.input(0)
    if x.type.rank < 2 or not all(isinstance(d, int) for d in x.shape[-2:]):
        raise Unsupported("Trilu needs rank >= 2 and static last two axes")
    k = int(np.asarray(c.static(1, "k")).reshape(-1)[0]) if c.has_input(1) else 0
    rows, cols = x.shape[-2:]
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    keep = (j - i >= k) if c.attr("upper", 1) else (j - i <= k)
    zero = c.constant(np.zeros((), dtype=x.dtype.np))
    return c.emit("Select", [c.constant(keep), x, zero])


@handles("Expand")
def _expand(c: NodeCtx):
    x = c.input(0)
    shape = symbolic.broadcast_shapes(x.shape, _ints(c.static(1, "shape")))
    return c.emit("BroadcastTo", [x], {"shape": list(shape)})


@handles("Slice")
def _slice(c: NodeCtx):
    x = c.input(0)
    if c.opset < 10:
        starts, ends, axes = _ints(c.attr("starts")), _ints(c.attr("ends")), c.attr("axes")
        steps = None
    else:
        starts, ends = _ints(c.static(1, "starts")), _ints(c.static(2, "ends"))
        axes = c.static(3, "axes") if c.has_input(3) else None
        steps = c.static(4, "steps") if c.has_input(4) else None
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    return c.emit("StridedSlice", [x], {"begin": starts, "end": ends, "strides": steps,
                                        "axes": axes})


@handles("Concat")
def _concat(c: NodeCtx):
    return c.emit("Concat", [c.input(i) for i in range(len(c.inputs))], {"axis": c.attr("axis")})


@handles("Split")
def _split(c: NodeCtx):
    x = c.input(0)
    axis = c.attr("axis", 0)
    n_out = len(c.node.output)
    sizes = _ints(c.attr("split")) if c.opset < 13 else (
        _ints(c.static(1, "split")) if c.has_input(1) else [])
    if not sizes:
        dim = x.shape[axis]
        if not isinstance(dim, int):
            raise Unsupported("equal split of a symbolic axis")
        n = c.attr("num_outputs", n_out)
        chunk = -(-dim // n)
        sizes = [min(chunk, dim - i * chunk) for i in range(n)]
    return c.emit_multi("Split", [x], {"axis": axis, "sizes": sizes})


@handles("Gather")
def _gather(c: NodeCtx):
    return c.emit("Gather", [c.input(0), c.input(1)], {"axis": c.attr("axis", 0)})


@handles("OneHot")
def _one_hot(c: NodeCtx):
    idx = c.input(0)
    if not idx.dtype.is_int:
        idx = c.emit("Cast", [idx], {"dtype": DType.int64})
    depth = int(np.asarray(c.static(1, "depth")).reshape(-1)[0])
    values = np.asarray(c.static(2, "values")).reshape(-1)
    return c.emit("OneHot", [idx], {"depth": depth, "off_value": float(values[0]),
                                    "on_value": float(values[1]), "axis": c.attr("axis", -1),
                                    "dtype": DType.parse(values.dtype)})


@handles("CumSum")
def _cumsum(c: NodeCtx):
    axis = int(np.asarray(c.static(1, "axis")).reshape(-1)[0])
    return c.emit("CumSum", [c.input(0)], {"axis": axis, "exclusive": bool(c.attr("exclusive", 0)),
                                           "reverse": bool(c.attr("reverse", 0))})


@handles("Dropout")
def _dropout(c: NodeCtx):
    if c.attr("training_mode", 0) or (c.has_input(2) and c.const(2) is None):
        raise Unsupported("training-mode dropout")
    if c.has_input(2) and bool(np.asarray(c.const(2))):
        raise Unsupported("training-mode dropout")
    y = c.emit("Identity", [c.input(0)])
    if len(c.node.output) > 1 and c.node.output[1]:
        mask = c.emit("BroadcastTo", [c.constant(True)], {"shape": list(y.shape)})
        return [y, mask]
    return y


@handles("Constant")
def _constant(c: NodeCtx):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in c.attrs:
            val = c.attrs[key]
            if key == "value":
                onnx_dtype(val.data_type, c.name)
                arr = tensor_array(val, f"node '{c.name}' (Constant): value")
            elif key.startswith("value_float"):
                arr = np.asarray(val, dtype=np.float32)
            else:
                arr = np.asarray(val, dtype=np.int64)
            return c.constant(arr)
    raise Unsupported("only tensor, float(s) and int(s) constants are modeled")


@handles("ConstantOfShape")
def _constant_of_shape(c: NodeCtx):
    shape = _ints(c.static(0, "shape"))
    val = c.attr("value")
    arr = np.float32(0)
    if val is not None:
        onnx_dtype(val.data_type, c.name)
        arr = tensor_array(val, f"node '{c.name}' (ConstantOfShape): value")
        if arr.size != 1:
            raise BadModel(f"node '{c.name}' (ConstantOfShape): value holds {arr.size} "
                           "elements; it must hold exactly one")
        arr = arr.reshape(())
    scalar = c.constant(np.asarray(arr))
    return c.emit("BroadcastTo", [scalar], {"shape": shape})


@handles("Shape")
def _shape(c: NodeCtx):
    x = c.input(0)
    dims = list(x.shape)[slice(c.attr("start", 0), c.attr("end"))]
    if not all(isinstance(d, int) for d in dims):
        raise Unsupported("Shape of a symbolic dim")
    return c.constant(np.asarray(dims, dtype=np.int64))


@handles("Size")
def _size(c: NodeCtx):
    n = c.input(0).type.numel
    if not isinstance(n, int):
        raise Unsupported("Size of a symbolic shape")
    return c.constant(np.asarray(n, dtype=np.int64))


@handles("Range")
def _range(c: NodeCtx):
    start, limit, delta = (np.asarray(c.static(i, "range bounds")).item() for i in range(3))
    dtype = c.input(0).dtype
    span = (limit - start) / delta if delta != 0 else math.nan
    if not math.isfinite(span) or span > limits.MAX_DIM:
        raise BadModel(f"node '{c.name}' (Range): start {start}, limit {limit}, delta {delta} "
                       f"do not give a length in 0..{limits.MAX_DIM}")
    n = max(int(np.ceil(span)), 0)
    return c.constant(np.asarray(start + np.arange(n) * delta, dtype=dtype.np))


# --------------------------------------------------------------- reductions
_REDUCE_AXES_INPUT_FROM = {"ReduceSum": 13}  # the other Reduce* take axes as input from 18


@handles("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean", "ReduceSumSquare",
         "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
def _reduce(c: NodeCtx):
    x = c.input(0)
    op = c.node.op_type
    axes = _axes(c, _REDUCE_AXES_INPUT_FROM.get(op, 18))
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            return c.emit("Identity", [x])
        axes = list(range(x.type.rank))
    keep = bool(c.attr("keepdims", 1))

    def red(kind: str, v: Value) -> Value:
        return c.emit(kind, [v], {"axis": axes, "keep_dims": keep})

    if op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
        return red(op, x)
    if op == "ReduceMean":
        return red("ReduceMean", x)
    if op == "ReduceSumSquare":
        return red("ReduceSum", c.emit("Mul", [x, x]))
    if op == "ReduceL1":
        return red("ReduceSum", c.emit("Abs", [x]))
    if op == "ReduceL2":
        return c.emit("Sqrt", [red("ReduceSum", c.emit("Mul", [x, x]))])
    if op == "ReduceLogSum":
        return c.emit("Log", [red("ReduceSum", x)])
    # ReduceLogSumExp, stabilized: m + log(sum(exp(x - m)))
    m = c.emit("ReduceMax", [x], {"axis": axes, "keep_dims": True})
    m = c.emit("Select", [c.emit("IsFinite", [m]), m, c.scalar_like(0, x)])
    s = c.emit("ReduceSum", [c.emit("Exp", [c.emit("Sub", [x, m])])],
               {"axis": axes, "keep_dims": keep})
    m_out = m if keep else c.emit("Squeeze", [m], {"axis": axes})
    return c.emit("Add", [c.emit("Log", [s]), m_out])


@handles("ArgMax", "ArgMin")
def _arg(c: NodeCtx):
    return c.emit(c.node.op_type, [c.input(0)], {
        "axis": c.attr("axis", 0), "keep_dims": bool(c.attr("keepdims", 1)),
        "select_last_index": bool(c.attr("select_last_index", 0)), "dtype": DType.int64})


@handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: NodeCtx):
    x = c.input(0)
    axes = list(range(2, x.type.rank))
    if c.node.op_type == "GlobalMaxPool":
        return c.emit("ReduceMax", [x], {"axis": axes, "keep_dims": True})
    return c.emit("ReduceMean", [x], {"axis": axes, "keep_dims": True})


# ----------------------------------------------------------------- matmul/nn
@handles("MatMul")
def _matmul(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    if a.type.rank == 2 and b.type.rank == 2:
        return c.emit("MatMul", [a, b])
    squeeze = []
    if a.type.rank == 1:
        a = c.emit("ExpandDims", [a], {"axis": [0]})
        squeeze.append(-2)
    if b.type.rank == 1:
        b = c.emit("ExpandDims", [b], {"axis": [1]})
        squeeze.append(-1)
    attrs = {}
    if a.type.rank > 2 and b.type.rank >= 2:
        src = _swapped(a)
        if src is not None:  # A moved by its last two axes: the cube reads it transposed
            a, attrs = src, {"transpose_a": True}
    y = c.emit("BatchMatMul", [a, b], attrs) if (a.type.rank > 2 or b.type.rank > 2) else \
        c.emit("MatMul", [a, b])
    if squeeze:
        y = c.emit("Squeeze", [y], {"axis": [s + y.type.rank for s in squeeze]})
    return y


def _swapped(v):
    """The operand of a Transpose of the last two axes that ``v`` is (through Casts to its
    own type, which change nothing: an exporter's ``Cast`` of a float32 to float32), or
    None. ``MatMul(Transpose(x), W)`` is then ``BatchMatMul(x, W, transpose_a=True)``:
    every output element the same dot product over the same K, as the torch frontend folds
    ``x.transpose(-1, -2) @ W``."""
    while v.producer is not None and v.producer.op == "Cast" and \
            v.producer.inputs[0].dtype == v.dtype:
        v = v.producer.inputs[0]
    p = v.producer
    if p is None or p.op != "Transpose" or len(p.attrs["perm"]) < 3 or not swaps_last_two(p):
        return None
    return p.inputs[0]


@handles("Einsum")
def _einsum(c: NodeCtx):
    from graphkernel.frontends.einsum import EinsumUnsupported, lower_einsum

    eq = c.attr("equation")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    values = [c.input(i) for i in range(len(c.node.input))]
    try:
        return lower_einsum(eq, values, lambda op, ins, attrs: c.emit(op, ins, attrs))
    except EinsumUnsupported as e:
        raise Unsupported(f"Einsum {eq!r}: {e}") from None


@handles("Gemm")
def _gemm(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    alpha, beta = c.attr("alpha", 1.0), c.attr("beta", 1.0)
    y = c.emit("MatMul", [a, b], {"transpose_a": bool(c.attr("transA", 0)),
                                  "transpose_b": bool(c.attr("transB", 0))})
    if alpha != 1.0:
        y = c.emit("Mul", [y, c.scalar_like(alpha, y)])
    if c.has_input(2):
        bias = c.input(2)
        if beta != 1.0:
            bias = c.emit("Mul", [bias, c.scalar_like(beta, bias)])
        y = c.emit("Add", [y, bias])
    return y


def _explicit_pads(c: NodeCtx, spatial: list, kernel: list[int], strides: list[int],
                   dilations: list[int], ceil: bool = False) -> list[int]:
    """ONNX pads [x1_begin, x2_begin, x1_end, x2_end] from pads or auto_pad."""
    auto = c.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = _ints(c.attr("pads")) or [0] * (2 * len(kernel))
        return pads
    if auto == "VALID":
        return [0] * (2 * len(kernel))
    begins, ends = [], []
    for d, k, s, dil in zip(spatial, kernel, strides, dilations, strict=True):
        if not isinstance(d, int):
            raise Unsupported("auto_pad on symbolic spatial dims")
        out = -(-d // s)
        total = max((out - 1) * s + (k - 1) * dil + 1 - d, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def _as_2d(c: NodeCtx, x: Value, kernel: list[int], strides: list[int], dil: list[int],
           pads: list[int]) -> tuple[Value, list[int], list[int], list[int], list[int]]:
    """A 1-D window op's input [N, C, W] as the 2-D op's [N, C, 1, W] (a view), with its
    window, strides, dilations and pads of height 1 (what torch's conv1d/pool1d compute)."""
    x = c.emit("ExpandDims", [x], {"axis": [2]})
    return x, [1, *kernel], [1, *strides], [1, *dil], [0, pads[0], 0, pads[1]]


@handles("Conv")
def _conv(c: NodeCtx):
    x, w = c.input(0), c.input(1)
    if x.type.rank not in (3, 4):
        raise Unsupported(f"{x.type.rank - 2}-D convolution (1-D and 2-D are modeled)")
    one_d = x.type.rank == 3
    kernel = _ints(c.attr("kernel_shape")) or list(w.shape[2:])
    strides = _ints(c.attr("strides")) or [1] * len(kernel)
    dil = _ints(c.attr("dilations")) or [1] * len(kernel)
    pads = _explicit_pads(c, list(x.shape[2:]), kernel, strides, dil)
    if one_d:
        x, kernel, strides, dil, pads = _as_2d(c, x, kernel, strides, dil, pads)
        w = c.emit("ExpandDims", [w], {"axis": [2]})
    inputs = [x, w] + ([c.input(2)] if c.has_input(2) else [])
    y = c.emit("Conv2D", inputs, {"strides": strides, "dilations": dil,
                                  "pads": [pads[0], pads[1], pads[2], pads[3]],
                                  "group": c.attr("group", 1)})
    return c.emit("Squeeze", [y], {"axis": [2]}) if one_d else y


@handles("Pad")
def _pad(c: NodeCtx):
    x = c.input(0)
    mode = c.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise Unsupported(f"Pad mode {mode!r} (accepted: constant, reflect, edge, wrap)")
    if c.opset < 11:
        pads, value = _ints(c.attr("pads")), float(c.attr("value", 0.0))
    else:
        pads = _ints(c.static(1, "pads"))
        value = float(np.asarray(c.static(2, "constant_value")).reshape(-1)[0]) \
            if c.has_input(2) else 0.0
    r = x.type.rank
    if c.has_input(3):  # opset 18: the pads of these axes only
        axes = [a % r for a in _ints(c.static(3, "axes"))]
        full = [0] * (2 * r)
        for j, a in enumerate(axes):
            full[a], full[r + a] = pads[j], pads[len(axes) + j]
        pads = full
    if len(pads) != 2 * r:
        raise Unsupported(f"Pad: {len(pads)} pads for rank {r} ({2 * r} expected)")
    if not any(pads):
        return c.emit("Identity", [x])
    return c.emit("Pad", [x], {"pads": pads, "mode": mode, "value": value})


@handles("MaxPool", "AveragePool")
def _pool(c: NodeCtx):
    x = c.input(0)
    if x.type.rank not in (3, 4):
        raise Unsupported(f"{x.type.rank - 2}-D pooling (1-D and 2-D are modeled)")
    if len([o for o in c.node.output if o]) > 1:
        raise Unsupported("MaxPool with an indices output")
    one_d = x.type.rank == 3
    kernel = _ints(c.attr("kernel_shape"))
    strides = _ints(c.attr("strides")) or [1] * len(kernel)
    dil = _ints(c.attr("dilations")) or [1] * len(kernel)
    pads = _explicit_pads(c, list(x.shape[2:]), kernel, strides, dil)
    if one_d:
        x, kernel, strides, dil, pads = _as_2d(c, x, kernel, strides, dil, pads)
    attrs = {"kernel_size": kernel, "strides": strides, "pads": pads, "dilations": dil,
             "ceil_mode": bool(c.attr("ceil_mode", 0))}
    if c.node.op_type == "AveragePool":
        attrs["count_include_pad"] = bool(c.attr("count_include_pad", 0))
        y = c.emit("AvgPool", [x], attrs)
    else:
        y = c.emit("MaxPool", [x], attrs)
    return c.emit("Squeeze", [y], {"axis": [2]}) if one_d else y


def _channel_norm(c: NodeCtx, x: Value, axes: list[int], eps: float
                  ) -> tuple[Value, Value, Value]:
    """(x normalised over ``axes`` by its own mean and population variance, the mean, the
    variance), the statistics kept as dims of 1."""
    mean = c.emit("ReduceMean", [x], {"axis": axes, "keep_dims": True})
    d = c.emit("Sub", [x, mean])
    var = c.emit("ReduceMean", [c.emit("Mul", [d, d])], {"axis": axes, "keep_dims": True})
    inv = c.emit("Rsqrt", [c.emit("Add", [var, c.scalar_like(eps, var)])])
    return c.emit("Mul", [d, inv]), mean, var


def _per_channel(c: NodeCtx, v: Value, x: Value) -> Value:
    """A [C] parameter as [C, 1, ...] against x [N, C, ...], in x's type."""
    v = c.emit("Reshape", [v], {"shape": [-1] + [1] * (x.type.rank - 2)})
    return c.emit("Cast", [v], {"dtype": x.dtype}) if v.dtype != x.dtype else v


@handles("InstanceNormalization")
def _instance_norm(c: NodeCtx):
    """Each (image, channel) normalised over its spatial axes, then scale and bias per
    channel (a group norm exports as one on [N, groups, -1] with unit scale and no bias)."""
    x = c.input(0)
    if x.type.rank < 3:
        raise Unsupported(f"InstanceNormalization of rank {x.type.rank} (at least 3)")
    y, _, _ = _channel_norm(c, x, list(range(2, x.type.rank)), c.attr("epsilon", 1e-5))
    return c.emit("Add", [c.emit("Mul", [y, _per_channel(c, c.input(1), x)]),
                          _per_channel(c, c.input(2), x)])


def _training_batch_norm(c: NodeCtx):
    """training_mode=1: normalised by the batch's own statistics (every axis but the
    channels, population variance); the running statistics, when asked for, are
    ``input * momentum + batch * (1 - momentum)`` (a weight standardisation exports this way:
    its outputs are constants, folded)."""
    x, scale, bias, mean, var = (c.input(i) for i in range(5))
    if x.type.rank < 2:
        raise Unsupported(f"BatchNormalization of rank {x.type.rank} (at least 2)")
    axes = [0, *range(2, x.type.rank)]
    y, bm, bv = _channel_norm(c, x, axes, c.attr("epsilon", 1e-5))
    outs = [c.emit("Add", [c.emit("Mul", [y, _per_channel(c, scale, x)]),
                           _per_channel(c, bias, x)])]
    m = c.attr("momentum", 0.9)
    for run, batch in ((mean, bm), (var, bv)):
        if len(outs) < len(c.node.output):
            flat = c.emit("Reshape", [batch], {"shape": [-1]})
            if flat.dtype != run.dtype:
                flat = c.emit("Cast", [flat], {"dtype": run.dtype})
            outs.append(c.emit("Add", [c.emit("Mul", [run, c.scalar_like(m, run)]),
                                       c.emit("Mul", [flat, c.scalar_like(1 - m, flat)])]))
    return outs


@handles("BatchNormalization")
def _batch_norm(c: NodeCtx):
    """Inference form: y = x * (scale * rsqrt(var + eps)) + (bias - mean * scale * rsqrt(...)).
    Training mode: ``_training_batch_norm``."""
    if c.attr("training_mode", 0):
        return _training_batch_norm(c)
    if len([o for o in c.node.output if o]) > 1:
        raise Unsupported("BatchNormalization with running statistics out of inference mode")
    x, scale, bias, mean, var = (c.input(i) for i in range(5))
    eps = c.attr("epsilon", 1e-5)
    inv = c.emit("Rsqrt", [c.emit("Add", [var, c.scalar_like(eps, var)])])
    a = c.emit("Mul", [scale, inv])
    b = c.emit("Sub", [bias, c.emit("Mul", [mean, a])])
    chan = [-1] + [1] * (x.type.rank - 2)
    a = c.emit("Reshape", [a], {"shape": chan})
    b = c.emit("Reshape", [b], {"shape": chan})
    if a.dtype != x.dtype:
        a = c.emit("Cast", [a], {"dtype": x.dtype})
        b = c.emit("Cast", [b], {"dtype": x.dtype})
    return c.emit("Add", [c.emit("Mul", [x, a]), b])


# ------------------------------------------------------------------ import
_SYM_BAD = re.compile(r"[^A-Za-z0-9_]")


def _value_type(vi: Any, where: str, unknown: list[int]) -> TensorType:
    t = vi.type
    if not t.HasField("tensor_type"):
        raise FrontendError(f"{where}: only tensor values are supported (got "
                            f"{t.WhichOneof('value')})")
    tt = t.tensor_type
    dtype = onnx_dtype(tt.elem_type, where)
    if not tt.HasField("shape"):
        raise FrontendError(f"{where}: the rank is unknown; graphkernel needs ranked tensors")
    dims: list[Any] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            sym = _SYM_BAD.sub("_", d.dim_param)
            dims.append(sym if not sym[0].isdigit() else "s_" + sym)
        else:
            unknown[0] += 1
            dims.append(f"unk{unknown[0]}")
    return TensorType(tuple(dims), dtype)


@dataclass
class ImportNote:
    node: str
    op_type: str
    reason: str


def import_onnx(model: Any, name: str | None = None,
                specialize: Mapping[str, np.ndarray] | None = None,
                notes: list[ImportNote] | None = None,
                external: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Import an ``onnx.ModelProto``. ``specialize`` turns the named graph inputs into
    constants (for attribute-like inputs such as a Reshape's shape). ``external``: the
    values of initializers whose data is still external, by name (``load_external_data``
    read them)."""
    _require_onnx()
    specialize = dict(specialize or {})
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    opset = opsets.get("ai.onnx", 1)
    gp = model.graph
    vinfo = _ValueInfos(model)
    g = Graph(name or gp.name or "onnx_graph")
    values: dict[str, Value] = {}
    unknown = [0]
    inits = {t.name: t for t in gp.initializer}
    for t in gp.initializer:
        onnx_dtype(t.data_type, f"initializer '{t.name}'")
        arr = external.get(t.name) if external and _is_external(t) else None
        if arr is None:
            arr = tensor_array(t, f"initializer '{t.name}'")
        values[t.name] = g.add_node("Constant", [], {"value": arr}, name=g.fresh_name(t.name),
                                    output_names=[t.name]).output
    for vi in gp.input:
        if vi.name in inits:
            continue
        if vi.name in specialize:
            arr = np.asarray(specialize[vi.name])
            values[vi.name] = g.add_node("Constant", [], {"value": arr},
                                         name=g.fresh_name(vi.name), output_names=[vi.name]).output
            continue
        values[vi.name] = g.add_input(vi.name, _value_type(vi, f"input '{vi.name}'", unknown))
    for idx, node in enumerate(gp.node):
        nname = node.name or f"{node.op_type.lower()}_{idx}"
        nname = g.fresh_name(nname)
        ins: list[Value | None] = []
        for i in node.input:  # (a protobuf field: read once)
            if not i:
                ins.append(None)
                continue
            v = values.get(i)
            if v is None:
                raise FrontendError(f"node '{nname}' ({node.op_type}): input {i!r} is not defined "
                                    "by any earlier node, initializer or graph input")
            ins.append(v)
        onames = list(node.output)
        outs = _import_node(g, node, nname, ins, opset, opsets, vinfo, unknown, notes, onames)
        for oname, v in zip(onames, outs, strict=False):
            if not oname:
                continue
            if v.name != oname and not g.has_value(oname) and v.producer is not None \
                    and v.producer.name.startswith(nname):
                g.rename_value(v, oname)
            values[oname] = v
    outputs = []
    for vi in gp.output:
        if vi.name not in values:
            raise FrontendError(f"graph output {vi.name!r} is not produced by any node")
        v = values[vi.name]
        if v.is_input or any(v is o for o in outputs):
            v = g.add_node("Identity", [v], name=g.fresh_name(vi.name + "/identity")).output
        outputs.append(v)
    g.set_outputs(outputs)
    g.remove_dead()
    return g


class _ValueInfos:
    """The value infos of a model's graph by name, ONNX shape inference's where it runs, made
    on first use: only a node imported as Opaque reads them, and inference copies the whole
    model and takes seconds on a large one, in vain when every node maps to ops."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.infos: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self.infos is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model, data_prop=True)
            except Exception:  # shape inference is a help for Opaque nodes, not a requirement
                inferred = self.model
            gp = inferred.graph
            self.infos = {vi.name: vi for vi in [*gp.value_info, *gp.output, *gp.input]}
        return self.infos

    def __contains__(self, name: str) -> bool:
        return name in self._get()

    def __getitem__(self, name: str) -> Any:
        return self._get()[name]


def _import_node(g: Graph, node: Any, nname: str, ins: list[Value | None], opset: int,
                 opsets: dict[str, int], vinfo: _ValueInfos, unknown: list[int],
                 notes: list[ImportNote] | None, onames: list[str] | None = None
                 ) -> list[Value]:
    """The values standing for ``node``'s outputs (``onames``: their names, when the caller
    has read them), through its handler or else as an Opaque node."""
    onames = list(node.output) if onames is None else onames
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    reason = f"no mapping for {node.domain or 'ai.onnx'}.{node.op_type}"
    if (node.domain or "ai.onnx") == "ai.onnx" and node.op_type in HANDLERS:
        ctx = NodeCtx(g, node, ins, attrs, opset, nname)
        try:
            out = HANDLERS[node.op_type](ctx)
            outs = out if isinstance(out, list) else [out]
            if len(outs) < len(onames) and len(outs) < len([o for o in onames if o]):
                raise Unsupported(f"only {len(outs)} of the outputs are modeled")
            return outs
        except BadModel:
            raise
        except (Unsupported, GraphKernelError) as e:
            reason = str(e)
            _rollback(g, ctx.emitted)
        except (IndexError, KeyError, ValueError, TypeError, ArithmeticError) as e:
            # attributes or static inputs the handler cannot read (an empty list where it
            # takes the first value, a step of 0, ...): the node is left to ONNX's own
            # operator (an Opaque node), which checks it when it runs and says what is wrong
            reason = (f"its attributes or static inputs are not the form graphkernel maps "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            _rollback(g, ctx.emitted)
    if notes is not None:
        notes.append(ImportNote(nname, node.op_type, reason))
    return _opaque(g, node, nname, ins, opsets, vinfo, unknown, reason)


def _rollback(g: Graph, emitted: list[str]) -> None:
    for name in reversed(emitted):
        if g.has_node(name):
            n = g.node(name)
            if not any(v.uses for v in n.outputs):
                g.erase_node(n)


def _opaque(g: Graph, node: Any, nname: str, ins: list[Value | None], opsets: dict[str, int],
            vinfo: _ValueInfos, unknown: list[int], reason: str) -> list[Value]:
    out_types = []
    for o in node.output:
        if not o:
            continue
        if o not in vinfo:
            raise FrontendError(f"node '{nname}' ({node.op_type}) is not modeled ({reason}) and "
                                f"ONNX shape inference gives no type for its output {o!r}")
        out_types.append(_value_type(vinfo[o], f"node '{nname}' output {o!r}", unknown))
    spec = {"node": base64.b64encode(node.SerializeToString()).decode(),
            "opsets": {k: v for k, v in sorted(opsets.items())}}
    n = g.add_node("Opaque", [v for v in ins if v is not None],
                   {"impl": "onnx", "spec": spec, "out_types": out_types,
                    "label": f"{node.domain + '.' if node.domain else ''}{node.op_type}"},
                   name=nname, output_names=[g.fresh_name(o) for o in node.output if o])
    return list(n.outputs)


def import_onnx_file(path: str | Path, **kw: Any) -> Graph:
    """Import an .onnx file. It is data from someone else: an empty file, a model without
    nodes or outputs, and names or dims outside ``graphkernel.limits`` are errors; external
    data is read by ``load_external_data`` (inside the model's folder, no links, exactly the
    declared size)."""
    _require_onnx()
    path = Path(path)
    try:
        data = read_bounded(path, limits.MAX_ONNX_FILE_BYTES)
    except FileNotFoundError:
        raise FrontendError(f"{path}: no such file") from None
    except FileTooLarge as e:
        raise FrontendError(f"{path}: {e}") from None
    except OSError as e:
        raise FrontendError(f"{path}: cannot be read: {e.strerror or e}") from None
    if not data:
        raise FrontendError(f"{path}: the file is empty (0 bytes), not an ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:
        raise FrontendError(f"{path}: not a readable ONNX model: {e}") from None
    del data
    external = load_external_data(model, path.parent, str(path))
    if not model.graph.node or not model.graph.output:
        missing = "nodes" if model.graph.output else "outputs"
        raise FrontendError(f"{path}: the model has no {missing}; an ONNX model needs a graph "
                            "with nodes and outputs")
    from graphkernel.pipeline import collector_paused

    try:
        with collector_paused():  # (a graph of many small objects: nothing to collect)
            g = import_onnx(model, name=kw.pop("name", path.stem), external=external, **kw)
    except GraphKernelError as e:
        raise type(e)(f"{path}: {e}") from None
    del model
    fileio.release_freed_memory()  # (the model's protobuf messages, freed now)
    if (problem := limits.check_graph(g)) is not None:
        raise FrontendError(f"{path}: {problem}")
    return g


class BadModel(FrontendError):
    """The model itself is malformed (not merely beyond graphkernel's mapping): an error,
    never a reason to import the node as an Opaque one."""


def tensor_array(t: Any, where: str) -> np.ndarray:
    """A TensorProto's values, after checking that its data fills its dims exactly (a raw
    buffer short of them, or typed values of the wrong count, is a malformed model)."""
    if _is_external(t):
        raise BadModel(f"{where}: its data is in an external file; load the model from its "
                       "file (graphkernel reads external data only from the model's folder)")
    need = tensor_nbytes(t, where)
    if t.HasField("raw_data") and len(t.raw_data) != need:
        raise BadModel(f"{where}: raw data holds {len(t.raw_data):,} bytes, its dims "
                       f"{list(t.dims)} need {need:,}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise BadModel(f"{where}: its data does not fill its dims {list(t.dims)} "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if arr.shape != tuple(t.dims):
        raise BadModel(f"{where}: its data has shape {list(arr.shape)}, its dims say "
                       f"{list(t.dims)}")
    return arr


# ------------------------------------------------------------- external data
def _tensors(graph: Any) -> Any:
    """Every TensorProto of ``graph``: initializers, sparse initializers, node attributes,
    and those of its subgraphs."""
    yield from graph.initializer
    yield from _other_tensors(graph)


def _other_tensors(graph: Any) -> Any:
    """``_tensors`` but the graph's own initializers."""
    for sp in graph.sparse_initializer:
        yield from (sp.values, sp.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: Any) -> Any:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        for sp in ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + \
                list(attr.sparse_tensors):
            yield from (sp.values, sp.indices)
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            yield from _tensors(sub)


def _is_external(t: Any) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data) > 0


def tensor_nbytes(t: Any, where: str) -> int:
    """The bytes a tensor's dims and element type need (4-bit types are packed two to a
    byte); a tensor of strings has no fixed size and is refused where a size is needed."""
    if any(d < 0 for d in t.dims):
        raise FrontendError(f"{where}: negative dims {list(t.dims)}")
    n = 1
    for d in t.dims:
        n *= d
    if (p := limits.numel_problem(tuple(t.dims))) is not None:
        raise FrontendError(f"{where}: {p}")
    if t.data_type in _packed_types():
        return (n + 1) // 2
    if t.data_type == onnx.TensorProto.STRING:
        raise FrontendError(f"{where}: a tensor of strings has no fixed size")
    try:
        return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        raise FrontendError(f"{where}: unknown element type {t.data_type}") from None


@functools.cache
def _packed_types() -> frozenset[int]:
    """ONNX element types of 4 bits, two to a byte."""
    return frozenset(getattr(onnx.TensorProto, k) for k in ("INT4", "UINT4", "FLOAT4E2M1")
                     if hasattr(onnx.TensorProto, k))


def load_external_data(model: Any, folder: Path, shown: str) -> dict[str, np.ndarray]:
    """Read every tensor's external data: a relative path inside the model's folder, opened
    without following any symbolic link; its ``length`` (when given) and the bytes read both
    equal the size the tensor's dims and type declare; nothing else of the file is read.

    The graph's initializers (a model's weights) are not read but memory-mapped: returned by
    name as read-only views of their file (``fileio.MappedData``), their tensors left as
    they are (shape inference has no use for the values of weights); every other tensor gets
    its bytes as ``raw_data``, as though they had been stored inside the model."""
    names = [t.name for t in model.graph.initializer]
    mappable = len(set(names)) == len(names) and sys.byteorder == "little"
    tensors = [(t, mappable) for t in model.graph.initializer]
    tensors += [(t, False) for t in _other_tensors(model.graph)]
    for f in model.functions:
        for node in f.node:
            tensors += [(t, False) for t in _node_tensors(node)]
    files: dict[str, Any] = {}  # location -> the open file (each opened once)
    maps: dict[str, fileio.MappedData | None] = {}
    out: dict[str, np.ndarray] = {}
    try:
        for t, as_view in tensors:
            if not _is_external(t):
                continue
            where = f"{shown}: tensor {t.name!r}: external data"
            info = {e.key: e.value for e in t.external_data}
            location = info.get("location", "")
            need = tensor_nbytes(t, f"{shown}: tensor {t.name!r}")
            offset = _external_int(info, "offset", 0, where)
            length = _external_int(info, "length", need, where)
            if length != need:
                raise FrontendError(f"{where}: length {length:,} differs from the {need:,} "
                                    f"bytes its dims {list(t.dims)} declare")
            dtype = _VIEWABLE.get(t.data_type) if as_view else None
            try:
                f = files.get(location)
                if f is None:
                    f = files[location] = open_beneath(folder, location)
                size = os.fstat(f.fileno()).st_size
                if offset + need > size:
                    raise FrontendError(f"{where}: {location!r} holds {size:,} bytes, fewer "
                                        f"than offset {offset:,} + {need:,} declared")
                if dtype is not None and location not in maps:
                    maps[location] = fileio.map_file(f, folder / location)
                if dtype is None:
                    raw = os.pread(f.fileno(), need, offset)
            except NotRegularFile as e:
                raise FrontendError(f"{where}: location {location!r} {e.strerror} (it points "
                                    "outside the directory of the model or is not a plain file "
                                    "in it)") from None
            except OSError as e:
                raise FrontendError(f"{where}: {location!r} cannot be read: {e.strerror or e}"
                                    ) from None
            if dtype is not None:
                mm = maps[location]
                shape = tuple(t.dims)
                out[t.name] = np.zeros(shape, dtype) if need == 0 or mm is None else \
                    fileio.mapped_view(mm, offset, need, dtype, shape)
                continue
            if len(raw) != need:
                raise FrontendError(f"{where}: {location!r} ended after {len(raw):,} of "
                                    f"{need:,} bytes")
            t.raw_data = raw
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    finally:
        for f in files.values():
            f.close()
    return out


# ONNX element types whose raw little-endian bytes are the numpy array's (bool: one byte
# each, as ONNX stores it), and so can be viewed where they lie
_VIEWABLE = {code: np.dtype(dt.np) for code, dt in _ONNX_DTYPES.items()}


def _external_int(info: dict[str, str], key: str, default: int, where: str) -> int:
    raw = info.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > limits.MAX_INT_DIGITS:
        raise FrontendError(f"{where}: {key} {raw[:40]!r} is not a byte count")
    return int(raw)


def static_input_names(model: Any) -> list[str]:
    """Graph inputs that feed attribute-like ONNX inputs (shapes, axes, slice bounds, …)."""
    slots = {"Reshape": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4}, "Unsqueeze": {1},
             "Squeeze": {1}, "Split": {1}, "OneHot": {1, 2}, "CumSum": {1},
             "ConstantOfShape": {0}, "Range": {0, 1, 2}, "ReduceSum": {1}, "ReduceMax": {1},
             "ReduceMin": {1}, "ReduceProd": {1}, "ReduceMean": {1}, "ReduceSumSquare": {1},
             "ReduceL1": {1}, "ReduceL2": {1}, "ReduceLogSum": {1}, "ReduceLogSumExp": {1},
             "Clip": set(), "Dropout": {1, 2}}
    inputs = {vi.name for vi in model.graph.input}
    out = []
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in inputs and i in slots.get(node.op_type, set()) and name not in out:
                out.append(name)
    return out
