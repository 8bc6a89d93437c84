"""Complex tensors as pairs of real ones, for the ``torch.compile`` path.

graphkernel's types are real, and Ascend's vector units compute on real numbers; yet many
models write a rotary embedding as complex arithmetic (``torch.polar`` for the rotations,
``view_as_complex`` of the query's channel pairs, a complex product, ``view_as_real`` back),
as Llama's original code and DeepSeek-V2 do. Rather than run such a graph through torch
whole, each complex tensor of the ATen graph becomes a real tensor of its dtype's precision
with one more axis of size 2 (real part, imaginary part), the layout ``view_as_real`` gives,
and each complex op becomes the real ops of its definition (a product
``(a + bi)(c + di) = (ac - bd) + (ad + bc)i`` on the pairs' halves). ``view_as_complex`` and
``view_as_real`` are then no ops at all: the pair is the tensor they view.

This is a decomposition of the complex ops, not a match of one model's pattern: any graph
made of the ops of ``_RULES`` lowers, whatever computes its operands. A complex op without a
rule leaves the graph as it was (``NotLowered`` names the op; the backend runs the graph
through torch and logs it). Complex graph inputs and outputs (a training forward saving a
complex tensor for its backward) cross the boundary as ``view_as_real`` / ``view_as_complex``
views, so the compiled graph keeps its caller's signature.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

aten = torch.ops.aten


class NotLowered(Exception):
    """A complex op with no real lowering: the graph runs through torch (the message says
    which op)."""


@dataclass
class Lowered:
    """A graph whose complex values are real pairs. ``inputs``/``outputs``: the positions of
    the placeholders and outputs that are complex in the caller's signature (fed as
    ``view_as_real`` of the caller's tensor, returned through ``view_as_complex``)."""

    gm: GraphModule
    example_inputs: list[Any]
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def wrap(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """``run`` (the compiled lowered graph) with the caller's complex signature."""
        ins, outs = set(self.inputs), set(self.outputs)
        if not ins and not outs:
            return run

        def call(*args: Any) -> Any:
            args = tuple(torch.view_as_real(a.resolve_conj()) if i in ins else a
                         for i, a in enumerate(args))
            res = run(*args)
            return type(res)(torch.view_as_complex(r.contiguous()) if i in outs else r
                             for i, r in enumerate(res))

        return call


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, Node) else x


def _is_complex(x: Any) -> bool:
    v = _val(x)
    return isinstance(v, torch.Tensor) and v.is_complex()


def has_complex(gm: GraphModule) -> bool:
    """Whether any value of the graph (an input, an op's result) is a complex tensor."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if any(isinstance(t, torch.Tensor) and t.is_complex()
               for t in (v if isinstance(v, list | tuple) else [v])):
            return True
    return False


def lower_complex(gm: GraphModule, example_inputs: Sequence[Any]) -> Lowered | None:
    """``gm`` with its complex values as real pairs (None when it has none). Raises
    NotLowered, naming the op, when a complex op has no rule here."""
    if not has_complex(gm):
        return None
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([*example_inputs, *vals])
    b = _Builder(Graph(), mode)
    env: dict[Node, Any] = {}
    inputs: list[int] = []
    placeholders = 0
    examples = list(example_inputs)
    with b.ctx():
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                p = b.graph.placeholder(n.name)
                p.meta = dict(n.meta)
                i, placeholders = placeholders, placeholders + 1
                if _is_complex(n):
                    p.meta["val"] = torch.view_as_real(n.meta["val"].resolve_conj())
                    inputs.append(i)
                env[n] = p
            elif n.op == "output":
                outs = n.args[0]
                flat = list(outs) if isinstance(outs, list | tuple) else [outs]
                cplx = [i for i, o in enumerate(flat) if _is_complex(o)]
                mapped = torch.fx.node.map_arg(outs, lambda a: env[a])
                b.graph.output(mapped)
                lowered = _module(gm, b)
                break
            elif n.op == "call_function" and _touches_complex(n):
                rule = _RULES.get(n.target)
                if rule is None:
                    raise NotLowered(f"complex values: {n.target} has no lowering to real "
                                     f"pairs (lowered: {', '.join(sorted(_NAMES))})")
                args = torch.fx.node.map_arg(n.args, lambda a: env[a])
                kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
                env[n] = rule(b, n, args, kwargs)
            else:
                if n.op == "get_attr" and _is_complex(n):
                    raise NotLowered("complex values: a complex constant of the graph")
                env[n] = b.graph.node_copy(n, lambda a: env[a])
        else:
            raise NotLowered("complex values: the graph has no output")  # (GraphModules have)
    for i in inputs:  # (outside the tracing mode: an example may be a real tensor, frozen)
        if i < len(examples) and isinstance(examples[i], torch.Tensor):
            examples[i] = _as_pairs(examples[i])
    return Lowered(lowered, examples, inputs, cplx)


def _module(gm: GraphModule, b: _Builder) -> GraphModule:
    """The lowered graph's module: ``gm``'s attributes, and the constants the rules made."""
    if not b.consts:
        return GraphModule(gm, b.graph)
    root = {n.target: b.consts[n.target] if n.target in b.consts
            else operator.attrgetter(n.target)(gm)
            for n in b.graph.nodes if n.op in ("get_attr", "call_module")}
    return GraphModule(root, b.graph, class_name=type(gm).__name__)


def _as_pairs(t: torch.Tensor) -> torch.Tensor:
    """A complex example input as its real pairs (a fake tensor in its own mode)."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if isinstance(t, FakeTensor):
        with t.fake_mode:
            return torch.view_as_real(t.resolve_conj())
    with unset_fake_temporarily():
        return torch.view_as_real(t.resolve_conj())


def _touches_complex(n: Node) -> bool:
    v = n.meta.get("val")
    outs = v if isinstance(v, list | tuple) else [v]
    if any(isinstance(t, torch.Tensor) and t.is_complex() for t in outs):
        return True
    found = []
    torch.fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(_is_complex(a)) or a)
    return any(found) or any(isinstance(a, complex) for a in n.args)


class _Builder:
    """Adds ATen calls to the new graph, each with its value (run on the graph's fake
    tensors) as the importer reads it."""

    def __init__(self, graph: Graph, mode: Any):
        self.graph, self.mode = graph, mode
        self.consts: dict[str, torch.Tensor] = {}  # get_attr target -> the tensor it reads
        self.real_of: dict[Node, Node] = {}  # a pair made of a real tensor -> that tensor

    def const(self, values: Any, dtype: torch.dtype) -> Node:
        """A constant of the new graph (a ``get_attr`` of the lowered module: a real tensor
        of ``values``, a numpy array), its value a fake tensor of the graph's mode as the
        importer reads values."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        name = f"_complex_lowering_const_{len(self.consts)}"
        with unset_fake_temporarily():  # (made in the tracing mode, it would be fake)
            t = torch.from_numpy(values).to(dtype)
            self.consts[name] = t
            val = self.mode.from_tensor(t) if self.mode is not None else t
        node = self.graph.get_attr(name)
        node.meta["val"] = val
        return node

    def ctx(self) -> Any:
        return self.mode if self.mode is not None else contextlib.nullcontext()

    def call(self, target: Any, *args: Any, **kwargs: Any) -> Node:
        node = self.graph.call_function(target, args, kwargs)
        a, k = torch.fx.node.map_arg((args, kwargs), _val)
        node.meta["val"] = target(*a, **k)
        return node

    # -- parts of a value: (real, imaginary), imaginary None when it is zero
    def re(self, x: Node) -> Node:
        return self.part(x, 0)

    def im(self, x: Node) -> Node:
        return self.part(x, 1)

    def part(self, x: Node, k: int) -> Node:
        """The real (``k`` 0) or imaginary (1) part of a pair: a select of its last axis.
        (Not a step-2 slice of the real tensor a pair views: the vector kernels generate
        strided slices of kernel inputs only, and a rotary's query is computed.)"""
        return self.call(aten.select.int, x, -1, k)

    def pack(self, re: Any, im: Any) -> Node:
        if im is None:
            im = self.call(aten.full_like.default, re, 0.0)
        return self.call(aten.cat.default, [self.call(aten.unsqueeze.default, re, -1),
                                            self.call(aten.unsqueeze.default, im, -1)], -1)

    def bin(self, op: str, a: Any, b: Any) -> Any:
        """``a op b`` on parts: nodes, numbers, or None (zero)."""
        if op == "add":
            if a is None or b is None:
                return b if a is None else a
        elif op == "sub":
            if b is None:
                return a
            if a is None:
                return -b if isinstance(b, numbers.Number) else self.call(aten.neg.default, b)
        elif a is None or b is None:  # mul
            return None
        if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
            return {"add": operator.add, "sub": operator.sub, "mul": operator.mul}[op](a, b)
        target = {"add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor}[op]
        if isinstance(a, numbers.Number):
            if op == "sub":  # a - b = -(b - a)
                return self.call(aten.neg.default, self.call(target, b, a))
            a, b = b, a
        return self.call(target, a, b)


def _parts(b: _Builder, x: Any, orig: Any) -> tuple[Any, Any]:
    """(real, imaginary) of an operand: a pair, a real tensor (imaginary None) or a number."""
    if isinstance(x, complex):
        return x.real, x.imag
    if isinstance(orig, Node) and _is_complex(orig):
        return b.re(x), b.im(x)
    return x, None


def _rank(n: Node) -> int:
    return len(_val(n).shape)


def _dim(d: int, rank: int) -> int:
    """A dim of a complex tensor of ``rank`` as a dim of its pair (the pair axis last)."""
    return d + rank if d < 0 else d


def _pair_of(b: _Builder, x: Any, orig: Any) -> Any:
    """An operand as a pair (a real tensor gets a zero imaginary part)."""
    if isinstance(orig, Node) and _is_complex(orig):
        return x
    return b.pack(x, None)


# ------------------------------------------------------------------ rules
def _identity(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    return args[0]


def _conj(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    return b.pack(b.re(x), b.call(aten.neg.default, b.im(x)))


def _neg(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    return b.call(aten.neg.default, args[0])


def _real(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    return b.re(args[0])


def _imag(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    return b.im(args[0])


def _abs(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    sq = b.call(aten.mul.Tensor, x, x)
    return b.call(aten.sqrt.default, b.call(aten.sum.dim_IntList, sq, [-1]))


def _angle(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    return b.call(aten.atan2.default, b.im(x), b.re(x))


def _polar(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    r, theta = args
    return b.pack(b.call(aten.mul.Tensor, r, b.call(aten.cos.default, theta)),
                  b.call(aten.mul.Tensor, r, b.call(aten.sin.default, theta)))


def _complex(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    return b.pack(args[0], args[1])


def _exp(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    e, im = b.call(aten.exp.default, b.re(x)), b.im(x)
    return b.pack(b.call(aten.mul.Tensor, e, b.call(aten.cos.default, im)),
                  b.call(aten.mul.Tensor, e, b.call(aten.sin.default, im)))


def _scaled_other(b: _Builder, n: Node, y: Any, kwargs: dict) -> Any:
    alpha = kwargs.get("alpha", 1)
    if alpha == 1:
        return y
    if isinstance(y, numbers.Number):
        return y * alpha
    return b.call(aten.mul.Tensor, y, alpha)


def _add_sub(op: str) -> Callable[..., Any]:
    def rule(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
        x, y = args[0], _scaled_other(b, n, args[1], kwargs)
        ox, oy = n.args[0], n.args[1]
        if _is_complex(ox) and _is_complex(oy):  # both pairs: the op on the pairs
            target = aten.add.Tensor if op == "add" else aten.sub.Tensor
            return b.call(target, x, y)
        xr, xi = _parts(b, x, ox)
        yr, yi = _parts(b, y, oy)
        return b.pack(b.bin(op, xr, yr), b.bin(op, xi, yi))
    return rule


def _mul(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x, y = args
    ox, oy = n.args
    cx, cy = _is_complex(ox), _is_complex(oy)
    if cx != cy and not isinstance(x if cy else y, complex):  # a pair times a real value
        pair, other = (x, y) if cx else (y, x)
        if isinstance(other, Node):
            other = b.call(aten.unsqueeze.default, other, -1)
        return b.call(aten.mul.Tensor, pair, other)
    xr, xi = _parts(b, x, ox)
    yr, yi = _parts(b, y, oy)
    re = b.bin("sub", b.bin("mul", xr, yr), b.bin("mul", xi, yi))
    im = b.bin("add", b.bin("mul", xr, yi), b.bin("mul", xi, yr))
    return b.pack(re, im)


def _div(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x, y = args
    ox, oy = n.args
    if not _is_complex(oy) and not isinstance(y, complex):  # a pair over a real value
        if isinstance(y, Node):
            y = b.call(aten.unsqueeze.default, y, -1)
        return b.call(aten.div.Tensor, x, y)
    xr, xi = _parts(b, x, ox)
    yr, yi = _parts(b, y, oy)
    den = b.bin("add", b.bin("mul", yr, yr), b.bin("mul", yi, yi))
    re = b.bin("add", b.bin("mul", xr, yr), b.bin("mul", xi, yi))
    im = b.bin("sub", b.bin("mul", xi, yr), b.bin("mul", xr, yi))

    def over(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, numbers.Number) and isinstance(den, numbers.Number):
            return v / den
        if isinstance(v, numbers.Number):
            return b.call(aten.mul.Tensor, b.call(aten.reciprocal.default, den), v)
        return b.call(aten.div.Tensor, v, den)
    return b.pack(over(re), over(im))


def _to_copy(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x, ox = args[0], n.args[0]
    want = kwargs.get("dtype")
    kw = {k: v for k, v in kwargs.items() if k != "dtype"}
    if _is_complex(ox):
        if want is None or want == _val(ox).dtype:
            return x if not kw else b.call(aten._to_copy.default, x, **kw)
        if want.is_complex:
            return b.call(aten._to_copy.default, x, dtype=want.to_real(), **kw)
        return b.call(aten._to_copy.default, b.re(x), dtype=want, **kw)
    real = want.to_real()  # a real tensor made complex: a zero imaginary part
    src = b.call(aten._to_copy.default, x, dtype=real, **kw)
    out = b.pack(src, None)
    b.real_of[out] = src  # (a transform of it reads the real values: _fft_real)
    return out


def _shape_rule(target: Any) -> Callable[..., Any]:
    """view / reshape / expand: the shape gets the pair axis."""
    def rule(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
        return b.call(target, args[0], [*args[1], 2])
    return rule


def _permute(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    r = _rank(n.args[0])
    return b.call(aten.permute.default, args[0], [_dim(d, r) for d in args[1]] + [r])


def _transpose(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    r = _rank(n.args[0])
    return b.call(aten.transpose.int, args[0], _dim(args[1], r), _dim(args[2], r))


def _t(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    if _rank(n.args[0]) < 2:
        return args[0]
    return b.call(aten.transpose.int, args[0], 0, 1)


def _unsqueeze(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    r = _rank(n.args[0])
    d = args[1]
    return b.call(aten.unsqueeze.default, args[0], d + r + 1 if d < 0 else d)


def _squeeze(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    shape, r = _val(n.args[0]).shape, _rank(n.args[0])
    if n.target == aten.squeeze.default:
        dims = [i for i, s in enumerate(shape) if isinstance(s, int) and s == 1]
    elif n.target == aten.squeeze.dim:
        dims = [_dim(args[1], r)]
    else:
        dims = [_dim(d, r) for d in args[1]]
    return b.call(aten.squeeze.dims, args[0], dims) if dims else args[0]


def _dim_first(target: Any) -> Callable[..., Any]:
    """slice / select (a dim, then their own arguments)."""
    def rule(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
        d = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        return b.call(target, args[0], _dim(d, _rank(n.args[0])), *args[2:])
    return rule


def _cat(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    parts = [_pair_of(b, x, o) for x, o in zip(args[0], n.args[0], strict=True)]
    d = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return b.call(aten.cat.default, parts, _dim(d, _rank(n)))


def _reduce(target: Any) -> Callable[..., Any]:
    """sum / mean over dims (all of them when none are given)."""
    def rule(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
        r = _rank(n.args[0])
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = list(range(r)) if not dims else [_dim(d, r) for d in dims]
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        return b.call(target, args[0], dims, keep)
    return rule


def _index(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    return b.call(aten.index.Tensor, args[0], list(args[1]))


def _where(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    cond = b.call(aten.unsqueeze.default, args[0], -1)
    x = _pair_of(b, args[1], n.args[1])
    y = _pair_of(b, args[2], n.args[2])
    return b.call(aten.where.self, cond, x, y)


# A discrete Fourier transform as products with its matrix. ``_fft_c2c`` (``torch.fft.fft``,
# ``fftn`` of a complex or a real tensor made complex) and ``_fft_r2c`` (``rfft``, and
# ``fftn`` of a real tensor) compute, along each dim d of size N,
#     X[k] = sum_n x[n] * exp(-+ 2 pi i k n / N)
# (the sign by ``forward``), scaled by ``normalization`` (0: none, 1: 1/sqrt(n), 2: 1/n, n
# the product of the sizes transformed). That sum is the transform's definition; an FFT
# computes the same sum factored. Along one dim, the pairs (re, im) of x, interleaved on a
# last axis of 2N, times one real (2N, 2N) matrix give X's pairs interleaved likewise:
#     X_re[k] = sum_n x_re[n] C[n, k] + s x_im[n] S[n, k]
#     X_im[k] = sum_n x_im[n] C[n, k] - s x_re[n] S[n, k]
# C = cos(2 pi k n / N), S = sin(2 pi k n / N), s = 1 forward, -1 inverse; the angles taken
# from (k n mod N) in float64 and rounded once to the pairs' dtype; the transforms along
# several dims are applied one after the other (the n-dimensional DFT is separable). A real
# input (``_fft_r2c``) has no imaginary rows: an (N, 2K) matrix, K = N // 2 + 1 columns when
# one-sided (the last dim of ``dim`` only, as torch keeps it). One matrix product per dim
# (a cube kernel) in place of an op graphkernel has no kernel for; the matrix is 4 (2N)^2
# bytes, so sizes above DFT_MAX points are not lowered (the graph runs through torch).
DFT_MAX = 512


def _dft_matrix(n: int, cols: int, forward: bool, real_in: bool, scale: float) -> Any:
    """The interleaved real matrix (float64, numpy) of an n-point DFT keeping ``cols``
    outputs: (2n, 2 cols) for pairs in, (n, 2 cols) for a real input."""
    import numpy as np

    k = np.arange(cols)
    idx = np.arange(n)
    ang = 2 * np.pi * ((idx[:, None] * k[None, :]) % n) / n
    c, sn = np.cos(ang) * scale, np.sin(ang) * scale
    sgn = 1.0 if forward else -1.0
    if real_in:
        m = np.empty((n, 2 * cols))
        m[:, 0::2], m[:, 1::2] = c, -sgn * sn
    else:
        m = np.empty((2 * n, 2 * cols))
        m[0::2, 0::2], m[1::2, 0::2] = c, sgn * sn
        m[0::2, 1::2], m[1::2, 1::2] = -sgn * sn, c
    return m


def _fft_scale(sizes: list[int], normalization: int) -> list[float]:
    """Each dim's share of the normalization (their product the transform's scale)."""
    if normalization == 0:
        return [1.0] * len(sizes)
    if normalization == 1:
        return [1.0 / float(s) ** 0.5 for s in sizes]
    if normalization == 2:
        return [1.0 / float(s) for s in sizes]
    raise NotLowered(f"complex values: an FFT's normalization {normalization!r} (known: 0, "
                     "1, 2)")


def _dft_along(b: _Builder, x: Node, d: int, rank: int, n: int, cols: int, forward: bool,
               real_in: bool, scale: float) -> Node:
    """The DFT along dim ``d`` of ``x``: pairs (rank ``rank`` + the pair axis), or a real
    tensor of rank ``rank`` with ``real_in``; the result pairs, ``cols`` long on ``d``."""
    dtype = _val(x).dtype
    last = rank - 1
    if d != last:  # the transformed dim just before the pair axis (or last when real)
        x = b.call(aten.transpose.int, x, d, last)
    shape = list(_val(x).shape)
    lead = shape[:last]
    flat = b.call(aten.reshape.default, x, [-1, n if real_in else 2 * n])
    m = b.const(_dft_matrix(n, cols, forward, real_in, scale), dtype)
    y = b.call(aten.mm.default, flat, m)
    y = b.call(aten.reshape.default, y, [*lead, cols, 2])
    if d != last:
        y = b.call(aten.transpose.int, y, d, last)
    return y


def _fft_dims(n: Node, dims: Sequence[int]) -> tuple[int, list[int], list[int]]:
    """(rank, dims made non-negative, their sizes) of an FFT's input; NotLowered when a
    size is symbolic or above DFT_MAX."""
    shape = _val(n.args[0]).shape
    rank = len(shape)
    ds = [d + rank if d < 0 else d for d in dims]
    sizes = []
    for d in ds:
        size = shape[d]
        if not isinstance(size, int):
            raise NotLowered(f"complex values: an FFT over a symbolic size ({size}) (its "
                             "matrix is built for one size)")
        if size > DFT_MAX:
            raise NotLowered(f"complex values: an FFT over {size} points (a DFT matrix "
                             f"product is lowered up to {DFT_MAX})")
        sizes.append(size)
    return rank, ds, sizes


def _dft_rows(b: _Builder, x: Node, d: int, rank: int, n: int, forward: bool,
              scale: float) -> Node:
    """The DFT along dim ``d`` of a real tensor ``x`` (of ``rank``, ``d`` not its last), as
    the matrix on the left of a batched product that reads ``x`` as it lies (the rows of
    the real parts, then of the imaginary parts, planar), the pair axis moved last."""
    import numpy as np

    shape = list(_val(x).shape)
    lead, rest = math.prod(shape[:d]), math.prod(shape[d + 1:])
    m = _dft_matrix(n, n, forward, True, scale)  # (n, 2n): re, im columns interleaved
    left = np.concatenate([m[:, 0::2].T, m[:, 1::2].T])  # (2n, n)
    mat = b.call(aten.expand.default, b.const(np.ascontiguousarray(left), _val(x).dtype),
                 [lead, 2 * n, n])
    y = b.call(aten.bmm.default, mat, b.call(aten.reshape.default, x, [lead, n, rest]))
    y = b.call(aten.reshape.default, y, [*shape[:d], 2, n, *shape[d + 1:]])
    return b.call(aten.permute.default, y, [i for i in range(rank + 1) if i != d] + [d])


def _fft_real(b: _Builder, x: Node, rank: int, ds: list[int], sizes: list[int],
              scales: list[float], forward: bool, last: int) -> Node:
    """The transform of a real tensor ``x`` along ``ds`` (``last`` outputs kept on the last
    of them): a dim that is not ``x``'s last first, while the values are real (a product
    from the left, no transpose in), else the last of ``ds`` (real rows times an (N, 2K)
    matrix); then the others on the pairs."""
    first = next((j for j, d in enumerate(ds[:-1]) if d != rank - 1), None)
    if first is None:
        y = _dft_along(b, x, ds[-1], rank, sizes[-1], last, forward, True, scales[-1])
        todo = list(range(len(ds) - 1))
    else:
        y = _dft_rows(b, x, ds[first], rank, sizes[first], forward, scales[first])
        todo = [j for j in range(len(ds)) if j != first]
    for j in todo:
        cols = last if j == len(ds) - 1 else sizes[j]
        y = _dft_along(b, y, ds[j], rank, sizes[j], cols, forward, False, scales[j])
    return y


def _fft_c2c(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x, dims, normalization, forward = args[:4]
    rank, ds, sizes = _fft_dims(n, dims)
    scales = _fft_scale(sizes, normalization)
    if x in b.real_of:  # a real tensor made complex: its imaginary part is zero
        return _fft_real(b, b.real_of[x], rank, ds, sizes, scales, bool(forward), sizes[-1])
    for d, size, scale in zip(ds, sizes, scales, strict=True):
        x = _dft_along(b, x, d, rank, size, size, bool(forward), False, scale)
    return x


def _fft_r2c(b: _Builder, n: Node, args: tuple, kwargs: dict) -> Any:
    x, dims, normalization, onesided = args[:4]
    rank, ds, sizes = _fft_dims(n, dims)
    last = sizes[-1] // 2 + 1 if onesided else sizes[-1]
    return _fft_real(b, x, rank, ds, sizes, _fft_scale(sizes, normalization), True, last)


_RULES: dict[Any, Callable[..., Any]] = {
    aten.view_as_complex.default: _identity,
    aten.view_as_real.default: _identity,
    aten.clone.default: _identity,
    aten.alias.default: _identity,
    aten.detach.default: _identity,
    aten.lift_fresh_copy.default: _identity,
    aten.resolve_conj.default: _identity,
    aten.resolve_neg.default: _identity,
    aten._conj.default: _conj,
    aten.conj_physical.default: _conj,
    aten.conj.default: _conj,
    aten.neg.default: _neg,
    aten.real.default: _real,
    aten.imag.default: _imag,
    aten.abs.default: _abs,
    aten.angle.default: _angle,
    aten.polar.default: _polar,
    aten.complex.default: _complex,
    aten.exp.default: _exp,
    aten.add.Tensor: _add_sub("add"),
    aten.sub.Tensor: _add_sub("sub"),
    aten.mul.Tensor: _mul,
    aten.mul.Scalar: _mul,
    aten.div.Tensor: _div,
    aten._to_copy.default: _to_copy,
    aten.view.default: _shape_rule(aten.view.default),
    aten._unsafe_view.default: _shape_rule(aten.view.default),
    aten.reshape.default: _shape_rule(aten.reshape.default),
    aten.expand.default: _shape_rule(aten.expand.default),
    aten.permute.default: _permute,
    aten.transpose.int: _transpose,
    aten.t.default: _t,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.default: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.slice.Tensor: _dim_first(aten.slice.Tensor),
    aten.select.int: _dim_first(aten.select.int),
    aten.cat.default: _cat,
    aten.sum.dim_IntList: _reduce(aten.sum.dim_IntList),
    aten.mean.dim: _reduce(aten.mean.dim),
    aten.index.Tensor: _index,
    aten.where.self: _where,
    aten._fft_c2c.default: _fft_c2c,
    aten._fft_r2c.default: _fft_r2c,
}
_NAMES = {str(k).removeprefix("aten.") for k in _RULES}
