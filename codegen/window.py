"""Window kernels: a 2-D max or average pool, or a depthwise convolution (NCHW, or NHWC:
``_plan_nhwc``, a pixel a row of channels), computed in the
vector unit, with a ReLU before a max pool and the elementwise work on the result fused into
the same kernel.

A core takes whole (N*C) planes, one at a time. The input plane is read from GM once: a
``Duplicate`` of the pad value (the lowest float for a max, else 0), then one ``DataCopyPad``
of its rows, each at the start of a row of ``P`` elements whose gap after the W columns is
that row's right padding and the next row's left. Each column tap ``dj`` needs a copy whose
column ``j`` holds the padded input's column ``j + dj``: a vector instruction's operands
start on a 32-byte UB block, so a shift by one element cannot be an offset into one copy,
while a shift by whole rows can. The shifted copies are made in UB: ``Brcb`` spreads a chunk
of the loaded copy one element per 32-byte block, where a shift by k elements is a shift by
k whole blocks, and ``BlockReduceMax`` takes each block (8 equal values) back to one element
in the shifted copy (exact). An output row is then ``kh * kw``
whole-row instructions: ``Max``; or ``Add``, then a ``Div`` by the window's element counts
(a row of counts built once per core times the row's count); or, for a depthwise
convolution, ``Muls`` by each tap's weight and ``Add`` (the plane's channel's weights and
bias are scalars read from GM). With a column stride the rows are computed at full column
resolution and every stride-th column is picked by the scalar unit (a ``GatherMask`` would
do it in the vector unit; not generated). A ReLU or a clamp by constants before a max pool
runs on the loaded copy and its padding before the shifted copies are made (it is
non-decreasing: it commutes with the max and keeps the padding the smallest value). A
constant pad of the pool's input (BiT's stem pads by zeros before a max pool without
padding of its own) is the kernel's padding, by the pad's value. The epilogue's
instructions follow on each output row: its operands
are the pooled row, rows of inputs of the output's shape (loaded per plane), the pool's
input itself when the pool keeps the plane's size (PoolFormer's ``pool(x) - x``: the
loaded copy's rows), per-channel inputs (one value per plane, read from GM) and scalar
constants; a view of a result (``[N, C, H*W]``) is the same rows.

What is refused (the reason goes to the fusion log; the op then stays an op of its own):
other than float32, not 2-D, a dilation, a left padding too wide for one chunk's Brcb,
symbolic shapes (but for a channels-last convolution of images of one row: ``_plan_band``,
bands of output pixels with their halo, N and L read by the host tiling at run time), a
plane whose copies do not fit the UB (a band of rows with its halo is not
generated), epilogue ops other than the table's, and operands of other shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel import symbolic
from graphkernel.codegen.buffers import BufferPlan
from graphkernel.codegen.kernel_ir import Buffer, Kind, Linear, comment_text
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.render import Rendered, ValueIO, env, io_entry
from graphkernel.codegen.targets import Target
from graphkernel.codegen.vector.schedule import kernel_symbol
from graphkernel.errors import ShapeError
from graphkernel.ir import DType, Node, Value
from graphkernel.ops import RESHAPE_OPS

WINDOW_OPS = frozenset({"MaxPool", "AvgPool"})
# epilogue op -> (tile∘tile call, tile∘scalar call); Sub and Div by a scalar are Adds/Muls
BINARY = {"Add": ("Add", "Adds"), "Sub": ("Sub", "Adds"), "Mul": ("Mul", "Muls"),
          "Div": ("Div", "Muls"), "Maximum": ("Max", "Maxs"), "Minimum": ("Min", "Mins")}
UNARY = {"ReLU": "Relu", "Abs": "Abs", "Exp": "Exp", "Sqrt": "Sqrt", "Log": "Ln",
         "Rsqrt": "Rsqrt", "Reciprocal": "Reciprocal"}
WITH_TMP = {"Sigmoid": "Sigmoid", "Tanh": "Tanh", "Erf": "Erf"}  # the math library's, scratch
LOWEST = "-3.40282347e+38f"  # a max pool's padding (the lowest float32)


def is_depthwise(n: Node) -> bool:
    """A convolution of each channel by its own window (group = channels = outputs): in
    NCHW a per-plane stencil like a pool; in NHWC (channels last) a stencil of whole pixel
    rows of C channels."""
    if n.op != "Conv2D" or n.attrs["data_format"] not in ("NCHW", "NHWC"):
        return False
    c = n.inputs[0].shape[1 if n.attrs["data_format"] == "NCHW" else 3]
    m = n.inputs[1].shape[0]
    return isinstance(c, int) and c == m == n.attrs["group"] and n.inputs[1].shape[1] == 1


def is_window_op(n: Node) -> bool:
    """A pool or a depthwise convolution: what a window kernel computes."""
    return n.op in WINDOW_OPS or is_depthwise(n)


def is_window_kernel(kernel: Node) -> bool:
    """Whether ``kernel`` holds a pool or a depthwise convolution: a window kernel (this
    module), not a vector or cube one."""
    return kernel.op == "GraphKernel" and any(is_window_op(n) for n in kernel.subgraph.nodes)


@dataclass
class WindowSchedule:
    """What a window kernel computes and how: the pool's geometry and the epilogue's steps,
    each a C++ statement on one output row."""

    name: str
    node: str
    inputs: list[ValueIO]     # kind: plane (the pool's output shape, or its input), channel, scalar
    outputs: list[ValueIO]
    target: Target
    mode: str                  # "max", "avg" or "dw" (a depthwise convolution)
    planes: int                # N * C
    channels: int
    H: int
    W: int
    Ho: int
    Wo: int
    kh: int
    kw: int
    sh: int
    pt: int
    pl: int
    Hp: int                    # rows of a copy: the padded input's rows
    Wa: int                    # an output row's pitch in UB (elements: whole blocks)
    P: int                     # a copy's row pitch: W columns, then the padding (whole blocks)
    GL: int                    # padding elements before the loaded copy (whole blocks)
    GR: int                    # ... and after it
    F: int                     # elements of a copy made per Brcb (a chunk of the plane)
    bases: list[int]           # per column tap: where its copy starts in the copies' buffer
    pool_input: int            # the pool's input among the kernel's inputs
    counts: list[float] | None  # an average's element counts along a row (None: a max)
    row_counts: list[float] | None  # ... and down the rows
    sw: int = 1                # the column stride
    Wf: int = 0                # a row's columns at full resolution ((Wo - 1) * sw + 1)
    Waf: int = 0               # ... and its pitch
    pre: list[str] = field(default_factory=list)  # with a column stride: full-resolution rows
    bias: str = ""             # a depthwise convolution's bias (a per-plane scalar)
    fill: str | None = None    # the padding's value from a folded constant pad (C++ literal)
    tmp: bool = False          # the math library's scratch is used
    prologue: list[tuple[str, str]] = field(default_factory=list)  # (call, scalar) on copies
    prologue_nodes: set[int] = field(default_factory=set)
    steps: list[str] = field(default_factory=list)  # statements on output row i
    scalars: list[str] = field(default_factory=list)  # per-plane scalars read from GM
    rows: int = 0              # one-row scratch values
    notes: list[str] = field(default_factory=list)
    kernel_kind: str = "vector"
    variant: None = None
    nhwc: bool = False         # a channels-last depthwise convolution: a row is a pixel's C
    Cp: int = 0                # (NHWC) a pixel row's pitch in UB (whole blocks)
    Wp: int = 0                # (NHWC) pixels of a padded image row in UB
    parts: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # output ->
    # (split source, first column, columns): a Split's part, written from its source's rows
    splits: int = 0            # (NHWC) values split into parts: a plane buffer each
    band: int = 0              # (NHWC, a symbolic length) output pixels of a band: a work unit
    x_dims: tuple[int, int] = (0, 0)  # (band) where N and W of the input are in ``shapes``
    grow: int = 0              # (band) output pixels of an image less its input pixels

    @property
    def row_len(self) -> int:
        """The elements of one computed row: an output row (NCHW), a pixel's channels
        (NHWC)."""
        return self.channels if self.nhwc else self.Wo

    @property
    def shifts(self) -> list[int]:
        """Per column tap dj: its copy's shift against the loaded one (column j of the copy
        is the loaded row's column j + dj - pl)."""
        return [dj - self.pl for dj in range(self.kw)]

    @property
    def loaded(self) -> int:
        """The loaded copy's elements with its guards: the rows of the padded plane, one
        block of padding (or more) before and after."""
        return self.GL + self.Hp * self.P + self.GR

    @property
    def made(self) -> list[tuple[int, int]]:
        """(base, shift) of each copy the vector unit makes from the loaded one."""
        return [(b, sh) for b, sh in zip(self.bases, self.shifts) if sh]

    @property
    def pad_value(self) -> str:
        if self.fill is not None:
            return self.fill
        return LOWEST if self.mode == "max" else "0.0f"

    @property
    def what(self) -> str:
        return {"max": "max pool", "avg": "average pool"}.get(self.mode, "depthwise convolution")


def plan_window(kernel: Node, target: Target) -> WindowSchedule:
    """The window kernel's schedule, or Unsupported with the reason."""
    sub = kernel.subgraph
    pools = [n for n in sub.nodes if is_window_op(n)]
    if len(pools) != 1:
        raise Unsupported("a window kernel holds one pool or depthwise convolution",
                          node=pools[1])
    pool = pools[0]
    if pool.op == "Conv2D" and pool.attrs["data_format"] == "NHWC":
        return _plan_nhwc(kernel, pool, target)
    x = pool.inputs[0]
    a = dict(pool.attrs)
    conv = pool.op == "Conv2D"
    if conv:  # [C, 1, kh, kw] weights, a [C] bias: read from GM, one plane's at a time
        a["kernel_size"] = list(pool.inputs[1].shape[2:])
        if any(v not in sub.inputs for v in pool.inputs[1:]):
            raise Unsupported("a depthwise convolution whose weights or bias are computed in "
                              "the kernel", node=pool)
    if x.dtype != DType.float32 or pool.outputs[0].dtype != DType.float32:
        raise Unsupported(f"{pool.op} of {x.dtype.value}: window kernels are generated for "
                          "float32", node=pool)
    if len(a["kernel_size"]) != 2:
        raise Unsupported(f"{pool.op} over {len(a['kernel_size'])} axes: window kernels are "
                          "2-D", node=pool)
    batch = x.shape[0]  # a symbolic batch: planes counted at run time (``_symbolic_batch``)
    if not all(isinstance(d, int) for d in (*x.shape[1:], *pool.outputs[0].shape[1:])) or \
            (not isinstance(batch, int) and batch != pool.outputs[0].shape[0]):
        raise Unsupported(f"{pool.op} of a symbolic shape {list(x.shape)}", node=pool)
    prologue, pro_nodes, fill = [], set(), None
    while x not in sub.inputs:  # monotone work on a max pool's input (a ReLU) runs on its copies
        p = x.producer
        if p.op == "Pad" and fill is None and not conv and len(x.users) == 1:  # its padding
            a, fill = _pad_fold(pool, p, a), _fill(p)
            pro_nodes.add(id(p))
            x = p.inputs[0]
            continue
        if fill is not None:
            raise Unsupported(f"{pool.op} of a padded value computed in the kernel by {p.op} "
                              "(a folded pad's input is read as it is)", node=p)
        call = _monotone(p)
        if pool.op != "MaxPool" or call is None or len(x.users) != 1:
            raise Unsupported(f"{pool.op} of a value computed in the kernel by {p.op} (a "
                              "window kernel takes a ReLU or a clamp by constants before a "
                              "max pool)", node=p)
        prologue.insert(0, call)
        pro_nodes.add(id(p))
        x = next(v for v in p.inputs if v.producer is None or v.producer.op != "Constant")
    if (prologue or fill is not None) and len(x.users) != 1:
        raise Unsupported(f"{pool.op}: its input {x.name} before the ReLU, clamp or pad is "
                          "read by other work of the kernel as well", node=pool, about=(x,))
    shape = x.shape
    if list(a["dilations"]) != [1, 1]:
        raise Unsupported(f"{pool.op} with dilations {a['dilations']}", node=pool)
    kh, kw = a["kernel_size"]
    sh, sw = a["strides"]
    pt, pl, pb, pr = a["pads"]
    N, C, H, W = shape
    Ho, Wo = pool.outputs[0].shape[2:]
    if not isinstance(N, int):
        _symbolic_batch(sub, N)
    blk = target.block_bytes // 4
    Wa = -(-Wo // blk) * blk
    Wf = (Wo - 1) * sw + 1  # a row at full column resolution (every column a window starts)
    Waf = -(-Wf // blk) * blk
    Hp = max(H + pt + pb, (Ho - 1) * sh + kh)
    # a loaded row is W columns, then a gap of padding: the right padding of its taps (up to
    # column Wf + kw - 2 of the padded row) and the left padding of the next row's
    P = -(-(W + max(pl, Wf + kw - 1 - pl - W, 0)) // blk) * blk
    GL, GR = -(-pl // blk) * blk, -(-max(kw - 1 - pl, 0) // blk) * blk
    counts = row_counts = None
    if conv and not all(isinstance(d, int) for d in pool.inputs[1].shape):
        raise Unsupported("a depthwise convolution of symbolic weights", node=pool)
    if pool.op == "AvgPool":
        if a["divisor"]:
            counts, row_counts = [float(a["divisor"])] * Wo, [1.0] * Ho
        else:
            inc = a["count_include_pad"]
            counts = _counts(W, Wo, kw, sw, pl, pr, inc, a["ceil_mode"])
            row_counts = _counts(H, Ho, kh, sh, pt, pb, inc, a["ceil_mode"])
    ins = [ValueIO(i, v, "plane") for i, v in enumerate(sub.inputs)]
    s = WindowSchedule(kernel_symbol(kernel), kernel.name, ins,
                       [ValueIO(i, v, "plane") for i, v in enumerate(sub.outputs)], target,
                       {"MaxPool": "max", "AvgPool": "avg"}.get(pool.op, "dw"),
                       symbolic.mul(N, C), C, H,
                       W, Ho, Wo, kh,
                       kw, sh, pt, pl, Hp, Wa, P, GL, GR, 0, [], sub.inputs.index(x), counts,
                       row_counts, sw=sw, Wf=Wf, Waf=Waf, fill=fill)
    s.prologue, s.prologue_nodes = prologue, pro_nodes
    s.bases = _bases(s)
    if conv:
        wi = sub.inputs.index(pool.inputs[1])
        s.inputs[wi].kind = "weights"
        s.scalars += [f"const float k{t} = gi{wi}.GetValue(c * {kh * kw} + {t});"
                      for t in range(kh * kw)]
        if len(pool.inputs) == 3:
            bi = sub.inputs.index(pool.inputs[2])
            s.inputs[bi].kind = "channel"
            s.scalars.append(f"const float b{bi} = gi{bi}.GetValue(c);")
            s.bias = f"b{bi}"
    _epilogue(s, kernel, pool)
    need = 0
    for F in (256, 64, 8):  # a smaller chunk of the plane per Brcb when the UB is short
        s.F = min(F, Hp * P)
        if (s.F + GL + GR) // 8 > 255 and s.made:  # (a Brcb takes at most 255 repeats)
            continue
        need = _plan(s).budget().bytes(1, Wa)
        if need <= target.ub_bytes:
            break
    if not need:
        raise Unsupported(f"{pool.op} padded by {pl} columns: a Brcb of the padding around "
                          "a chunk of the plane would take more than 255 repeats", node=pool)
    if need > target.ub_bytes:
        raise Unsupported(f"{pool.op}: a plane's {kw} shifted copies ({Hp} rows of {P}) and "
                          f"the kernel's rows need {need} bytes of UB, the target has "
                          f"{target.ub_bytes} (a band of rows with its halo is not generated)",
                          node=pool)
    if sw > 1:
        s.notes.append(f"a column stride of {sw}: each pooled row is computed at full column "
                       f"resolution, then every {sw}th column picked by the scalar unit "
                       f"({Ho * Wo} GetValue/SetValue pairs per plane)")
    if s.made:
        s.notes.append(f"input {s.pool_input} is read once; its {len(s.made)} copies shifted "
                       "by a column tap are made in UB: Brcb spreads each element over a "
                       "32-byte block, so a shift by one element is a shift by one block, and "
                       "BlockReduceMax takes the blocks back to one element each")
    s.notes = [n for n in s.notes if n]
    return s


def _symbolic_batch(sub, N: str) -> None:
    """Unsupported unless every input and output of the kernel is static but for a leading
    ``N`` (the batch under ``dynamic=True``; the planes ``N * C`` are then the work units the
    host counts from the pool input's first dim), or one per channel, or static."""
    for v in [*sub.inputs, *sub.outputs]:
        if all(isinstance(d, int) for d in v.shape):
            continue
        if v.shape[0] != N or not all(isinstance(d, int) for d in v.shape[1:]):
            raise Unsupported(f"{v.name} {list(v.shape)}: a window kernel over a symbolic batch "
                              f"takes values of a leading {symbolic.pretty(N)} only",
                              about=(v,))


def _plan_nhwc(kernel: Node, pool: Node, target: Target) -> WindowSchedule:
    """A channels-last (NHWC) depthwise convolution's schedule, or Unsupported. A core
    takes whole images, one at a time: the image is loaded once into a zeroed padded copy,
    each pixel a row of C channels at a pitch of whole blocks, so every tap of an output
    pixel is a whole row at a whole-row offset (no shifted copies are made), multiplied by
    the tap's row of per-channel weights (the weights, read once per core, are laid out a
    row per tap by the scalar unit) and summed; the bias is a row too. The epilogue runs on
    each output pixel's row; a Split of the result along the channels writes its parts as
    the kernel's outputs, each a column range of the rows (starting on a 32-byte block)."""
    sub = kernel.subgraph
    x, wv = pool.inputs[0], pool.inputs[1]
    if any(v not in sub.inputs for v in pool.inputs):
        raise Unsupported("a channels-last depthwise convolution of a value computed in the "
                          "kernel (its input, weights and bias are read as they are)",
                          node=pool)
    if x.dtype != DType.float32 or pool.outputs[0].dtype != DType.float32 or \
            wv.dtype != DType.float32:
        raise Unsupported(f"Conv2D of {x.dtype.value}: window kernels are generated for "
                          "float32", node=pool)
    if not all(isinstance(d, int) for d in (*x.shape, *wv.shape, *pool.outputs[0].shape)):
        return _plan_band(kernel, pool, target)
    a = pool.attrs
    if list(a["dilations"]) != [1, 1]:
        raise Unsupported(f"Conv2D with dilations {a['dilations']}", node=pool)
    kh, kw = wv.shape[2:]
    sh, sw = a["strides"]
    pt, pl, pb, pr = a["pads"]
    N, H, W, C = x.shape
    Ho, Wo = pool.outputs[0].shape[1:3]
    blk = target.block_bytes // 4
    Cp = -(-C // blk) * blk
    Wp = max(W + pl + pr, (Wo - 1) * sw + kw)
    Hp = max(H + pt + pb, (Ho - 1) * sh + kh)
    if max(W, Ho * Wo) > 4095:
        raise Unsupported(f"Conv2D of {W} pixels a row, {Ho * Wo} an image: a DataCopyPad "
                          "moves at most 4095 rows", node=pool)
    ins = [ValueIO(i, v, "plane") for i, v in enumerate(sub.inputs)]
    s = WindowSchedule(kernel_symbol(kernel), kernel.name, ins,
                       [ValueIO(i, v, "plane") for i, v in enumerate(sub.outputs)], target,
                       "dw", N, C, H, W, Ho, Wo, kh, kw, sh, pt, pl, Hp, Cp, Wp * Cp, 0, 0,
                       0, [], sub.inputs.index(x), None, None, sw=sw, nhwc=True, Cp=Cp,
                       Wp=Wp)
    s.inputs[sub.inputs.index(wv)].kind = "weights"
    if len(pool.inputs) == 3:
        s.inputs[sub.inputs.index(pool.inputs[2])].kind = "channel"
        s.bias = "bs"
    _epilogue(s, kernel, pool)
    need = _plan(s).budget().bytes(1, s.Wa)
    if need > target.ub_bytes:
        raise Unsupported(f"Conv2D: an image's padded copy ({Hp}x{Wp} pixels of {Cp}) and "
                          f"the kernel's planes need {need} bytes of UB, the target has "
                          f"{target.ub_bytes} (a band of rows with its halo is not generated)",
                          node=pool)
    s.notes.append(f"channels last: each pixel a row of {C} channels (pitch {Cp}); input "
                   f"{s.pool_input} is read once into a zero-padded copy, each of the "
                   f"{kh * kw} taps of an output pixel a whole row of it times the tap's "
                   "row of weights (laid out per tap once per core by the scalar unit)")
    if s.parts:
        s.notes.append(f"{len(s.parts)} outputs are a Split's parts: column ranges of the "
                       "split value's rows, written from them")
    return s


def _plan_band(kernel: Node, pool: Node, target: Target) -> WindowSchedule:
    """A channels-last depthwise convolution over a symbolic length (a causal 1-D
    convolution of ``[N, 1, L, C]`` images under ``dynamic=True``): the work units are bands
    of ``band`` output pixels of an image, ``N * ceil(Lo / band)`` of them, which the host
    tiling computes from the actual N and L (``band`` at most the largest that fits the UB,
    smaller when that leaves cores idle). A band loads its input pixels with the halo of
    ``kw - 1`` pixels into a zeroed copy (the padding and the image's ends stay zero), so
    every tap of an output pixel is a whole row of the copy, as in the whole-image form."""
    sub = kernel.subgraph
    x, wv, out = pool.inputs[0], pool.inputs[1], pool.outputs[0]
    a = pool.attrs
    N, H, W, C = x.shape
    Ho, Wo = out.shape[1:3]
    kh, kw = wv.shape[2:]
    pt, pl, pb, pr = a["pads"]
    if not all(isinstance(d, int) for d in (H, C, Ho, *wv.shape)) or H != 1 or Ho != 1 or \
            kh != 1 or pt or pb:
        raise Unsupported(f"Conv2D of a symbolic shape {list(x.shape)} (over a symbolic size "
                          "a window kernel takes images of one row: a 1-D convolution along "
                          "the length, in bands of output pixels)", node=pool)
    if list(a["strides"]) != [1, 1] or list(a["dilations"]) != [1, 1]:
        raise Unsupported(f"Conv2D with strides {list(a['strides'])}, dilations "
                          f"{list(a['dilations'])} over a symbolic length", node=pool)
    try:
        same = symbolic.eq(symbolic.floor_affine(W, pl + pr - kw + 1), Wo)
    except ShapeError:
        same = False
    if not same:
        raise Unsupported(f"Conv2D of {symbolic.pretty(W)} pixels to "
                          f"{symbolic.pretty(Wo)}: not the padded length's windows", node=pool)
    blk = target.block_bytes // 4
    Cp = -(-C // blk) * blk
    ins = [ValueIO(i, v, "plane") for i, v in enumerate(sub.inputs)]
    xi = sub.inputs.index(x)
    off = sum(len(v.shape) for v in sub.inputs[:xi])
    s = WindowSchedule(kernel_symbol(kernel), kernel.name, ins,
                       [ValueIO(i, v, "plane") for i, v in enumerate(sub.outputs)], target,
                       "dw", N, C, H, W, Ho, Wo, kh, kw, 1, 0, pl, 1, Cp, 0, 0, 0, 0, [], xi,
                       None, None, nhwc=True, Cp=Cp, x_dims=(off, off + 2),
                       grow=pl + pr - kw + 1, band=1)  # (the band's size: below)
    s.inputs[sub.inputs.index(wv)].kind = "weights"
    if len(pool.inputs) == 3:
        s.inputs[sub.inputs.index(pool.inputs[2])].kind = "channel"
        s.bias = "bs"
    _epilogue(s, kernel, pool)
    # the largest band that fits (the plan is linear in it), a DataCopyPad's rows at most
    lo, hi = 0, 4095 - (kw - 1)
    while lo < hi:
        s.band = (lo + hi + 1) // 2
        if _plan(s).budget().bytes(1, Cp) <= target.ub_bytes:
            lo = s.band
        else:
            hi = s.band - 1
    if lo < 1:
        raise Unsupported(f"Conv2D: one output pixel of {C} channels with its {kw - 1} "
                          "halo pixels and the kernel's rows do not fit the UB", node=pool)
    s.band = lo
    s.Wp = lo + kw - 1
    s.notes.append(f"a symbolic length: bands of at most {lo} output pixels of {C} channels "
                   f"(pitch {Cp}) per work unit, each loading its input pixels with a halo of "
                   f"{kw - 1} into a zeroed copy; the host computes the bands from the actual "
                   "N and L")
    if s.parts:
        s.notes.append(f"{len(s.parts)} outputs are a Split's parts: column ranges of the "
                       "split value's rows, written from them")
    return s


def _pool_steps_nhwc(s: WindowSchedule, dst: str, body: list[str]) -> None:
    """Output pixel i (a row of C channels) of a channels-last depthwise convolution into
    ``dst``: each tap's input row times the tap's weights, summed, then the bias."""
    C, Cp = s.channels, s.Cp
    body.append("const uint32_t q = i;" if s.band else
                f"const uint32_t q = (i / {s.Wo}) * {s.sh * s.Wp} + (i % {s.Wo}) * {s.sw};")
    taps = [(f"x[(q + {di * s.Wp + dj}) * {Cp}]", f"wt[{(di * s.kw + dj) * Cp}]")
            for di in range(s.kh) for dj in range(s.kw)]
    body += [f"Mul({dst}, {taps[0][0]}, {taps[0][1]}, {C});", "PipeBarrier<PIPE_V>();"]
    for tap, wrow in taps[1:]:
        body += [f"Mul(tp, {tap}, {wrow}, {C});", "PipeBarrier<PIPE_V>();",
                 f"Add({dst}, {dst}, tp, {C});", "PipeBarrier<PIPE_V>();"]
    if s.bias:
        body += [f"Add({dst}, {dst}, bs, {C});", "PipeBarrier<PIPE_V>();"]


def _split_parts(s: WindowSchedule, n: Node, expr: dict, kind: dict, outs: dict,
                 split_src: dict, sub) -> None:
    """A Split of computed rows along the channels (NHWC): each part is a kernel output
    written from the split value's rows (a column range starting on a 32-byte block)."""
    v = n.inputs[0]
    src = expr.get(id(v), "")
    axis = n.attrs["axis"] % len(v.shape)
    if kind.get(id(v)) != "row" or not src.startswith("sp") or axis != len(v.shape) - 1 \
            or v.shape[-1] != s.channels:
        raise Unsupported(f"a Split of {v.name} {list(v.shape)} along axis {n.attrs['axis']}"
                          f" (a window kernel splits its rows of {s.channels} channels)",
                          node=n, about=(v,))
    j = int(src[2:src.index("[")])
    blk = s.target.block_bytes // 4
    inside = {id(m) for m in sub.nodes}
    c0 = 0
    for part, size in zip(n.outputs, n.attrs["sizes"]):
        if id(part) not in outs or any(id(u) in inside for u in part.users):
            raise Unsupported(f"Split part {part.name} is read in the kernel (a window "
                              "kernel writes a Split's parts as its outputs only)", node=n,
                              about=(part,))
        if c0 % blk or not size:
            raise Unsupported(f"Split part {part.name} starts at channel {c0}, not on a "
                              "32-byte block" if size else f"Split part {part.name} is empty",
                              node=n, about=(part,))
        s.parts[outs[id(part)]] = (j, c0, size)
        expr[id(part)], kind[id(part)] = f"sp{j}[{c0}]", "part"
        c0 += size


def _bases(s: WindowSchedule) -> list[int]:
    """Per column tap: where its copy of the padded plane starts in the copies' buffer. The
    unshifted tap's copy is the loaded one (after its guard); the others follow it."""
    out, nxt = [], s.loaded
    for sh in s.shifts:
        if sh == 0:
            out.append(s.GL)
        else:
            out.append(nxt)
            nxt += s.Hp * s.P
    return out


def window_reads(kernel: Node, target: Target | None = None) -> dict[int, int] | None:
    """GM bytes a window kernel reads of each input, by the input's id (the traffic model's
    count, the simulator's too): the pool's (or depthwise convolution's) input once (its
    shifted copies are made in UB); a per-channel value (the
    convolution's weights and bias, an epilogue's channel operand) or a scalar once per
    plane (the scalar unit reads it per plane); a plane input once. None when the generator
    would not make the kernel."""
    from graphkernel.codegen import targets
    from graphkernel.flags import DEFAULT_TARGET

    try:
        s = plan_window(kernel, target or targets.load(DEFAULT_TARGET))
    except Unsupported:
        return None
    if s.band or not isinstance(s.planes, int):  # (sizes known at run time: the traffic
        return None  # model counts what the kernel moves)
    item = 4  # (float32: the generator's only type)
    out = {}
    cores = min(s.planes, (target or targets.load(DEFAULT_TARGET)).aiv_cores)
    for io in s.inputs:
        v = io.value
        if s.nhwc and io.kind in ("weights", "channel"):  # once per core
            out[id(v)] = cores * v.type.numel * item
        elif io.index == s.pool_input:
            out[id(v)] = s.planes * s.H * s.W * (s.channels if s.nhwc else 1) * item
        elif io.kind == "weights":
            out[id(v)] = s.planes * s.kh * s.kw * item
        elif io.kind in ("channel", "scalar"):
            out[id(v)] = s.planes * item
        else:
            out[id(v)] = v.type.numel * item
    return out


def _pad_fold(pool: Node, pad: Node, attrs: dict) -> dict:
    """The pool's attributes with the constant ``pad`` of its input as its own padding, or
    Unsupported. A window kernel pads by one value, so the pool itself pads nothing: a max
    pool's padding (the lowest float) and the pad's value would differ, and an average
    pool's padding is not counted where the pad's elements are. An average pool of a padded
    input counts the pad's elements as its own (count_include_pad); its pad value must be 0
    (a window kernel's sum adds its padding as zeros)."""
    pa = pad.attrs
    p = list(pa["pads"])
    if pa["mode"] != "constant" or len(p) != 8 or any(v < 0 for v in p) or \
            p[0] or p[1] or p[4] or p[5]:
        raise Unsupported(f"{pool.op} of a {pa['mode']} pad {p} (a window kernel folds a "
                          "constant pad of height and width, no crop)", node=pad)
    if any(attrs["pads"]):
        raise Unsupported(f"{pool.op} with pads {list(attrs['pads'])} of its own after a "
                          f"constant pad (the window kernel pads by one value)", node=pad)
    if pool.op == "AvgPool" and float(pa["value"]) != 0.0:
        raise Unsupported(f"AvgPool of a pad by {pa['value']} (an average's padding adds 0)",
                          node=pad)
    if pad.outputs[0].dtype != DType.float32:
        raise Unsupported(f"a pad of {pad.outputs[0].dtype.value}", node=pad)
    out = dict(attrs) | {"pads": [p[2], p[3], p[6], p[7]]}
    if pool.op == "AvgPool":
        out["count_include_pad"] = True
    return out


def _fill(pad: Node) -> str:
    """A constant pad's value as a C++ float literal (-inf as the lowest float: a max of it
    and any float is that float either way)."""
    v = float(pad.attrs["value"])
    if np.isnan(v) or v == np.inf:
        raise Unsupported(f"a pad by {v} before a pool", node=pad)
    return LOWEST if v == -np.inf else f"{float(np.float32(v))!r}f"


def _counts(size: int, out: int, k: int, s: int, p0: int, p1: int, include: bool,
            ceil: bool) -> list[float]:
    """Each window's elements along one axis: inside the input, or inside the padded input
    with count_include_pad (never the ceil-mode overhang)."""
    lo, hi = (-p0, size + p1) if include else (0, size)
    del ceil  # (the overhang lies past size + p1: clipped by hi either way)
    return [float(min(o * s - p0 + k, hi) - max(o * s - p0, lo)) for o in range(out)]


def _epilogue(s: WindowSchedule, kernel: Node, pool: Node) -> None:
    """The statements of the epilogue on output row i, and each input's kind."""
    sub = kernel.subgraph
    out_shape = tuple(pool.outputs[0].shape)
    C = s.channels
    outs = {id(v): k for k, v in enumerate(sub.outputs)}
    expr: dict[int, str] = {}  # value -> a C++ row (LocalTensor) or scalar expression
    kind: dict[int, str] = {}  # value -> "row" or "scalar"
    x = s.inputs[s.pool_input].value
    same = not s.prologue and s.fill is None and tuple(x.shape) == out_shape and \
        s.sh == 1 and s.sw == 1 and s.kh > s.pt and s.kw > s.pl and not s.nhwc
    for io in s.inputs:
        v = io.value
        if io.kind in ("weights", "channel") and s.mode == "dw":
            continue  # (the convolution's weights and bias: read per plane above)
        if io.index == s.pool_input:
            if same:  # the loaded copy's rows
                expr[id(v)] = f"x[{s.GL} + ({s.pt} + i) * {s.P}]"
                kind[id(v)] = "row"
            continue
        if tuple(v.shape) == out_shape:
            expr[id(v)], kind[id(v)] = f"a{io.index}[i * {s.Wa}]", "row"
        elif not s.nhwc and _channel(v, C):  # (channels last: a channel value is a row)
            io.kind = "channel"
            s.scalars.append(f"const float c{io.index} = gi{io.index}.GetValue(c);")
            expr[id(v)], kind[id(v)] = f"c{io.index}", "scalar"
        elif v.type.numel == 1:
            io.kind = "scalar"
            s.scalars.append(f"const float c{io.index} = gi{io.index}.GetValue(0);")
            expr[id(v)], kind[id(v)] = f"c{io.index}", "scalar"
        else:
            raise Unsupported(f"input {v.name} {list(v.shape)} is neither a plane, a channel "
                              f"value nor a scalar of the pool's output {list(out_shape)}",
                              about=(v,))
    if s.pool_input in [io.index for io in s.inputs] and \
            any(io.value is x and id(x) not in expr for io in s.inputs) and \
            any(u is not pool and id(u) not in s.prologue_nodes for u in x.users):
        raise Unsupported(f"the pool's input {x.name} is read by the epilogue but is not a "
                          "plane of the output's shape", node=pool, about=(x,))
    scratch = 0
    split_src: dict[int, int] = {}  # a value split into parts -> its plane buffer
    for n in sub.nodes:
        if n.op == "Split" and s.nhwc:
            v = n.inputs[0]
            while v.producer is not None and v.producer.op in RESHAPE_OPS and \
                    v.producer in sub.nodes and v.producer is not pool and \
                    v.producer.inputs[0].type.numel == v.type.numel:
                v = v.producer.inputs[0]  # (a view of a computed row: that row's buffer)
            split_src.setdefault(id(v), len(split_src))
    s.splits = len(split_src)

    def row_of(v: Value) -> str:
        nonlocal scratch
        if id(v) in split_src:
            return f"sp{split_src[id(v)]}[i * {s.Wa}]"
        if id(v) in outs:
            return f"o{outs[id(v)]}[i * {s.Wa}]"
        scratch += 1
        return f"w[{(scratch - 1) * s.Wa}]"

    body = s.steps
    for n in sub.nodes:
        if n.op == "Constant":
            val = np.asarray(n.attrs["value"]).reshape(-1)[0]
            expr[id(n.outputs[0])], kind[id(n.outputs[0])] = f"{float(val)!r}f", "scalar"
            continue
        if id(n) in s.prologue_nodes:
            continue  # (run on the copies)
        if n is pool and s.nhwc:
            dst = row_of(n.outputs[0])
            _pool_steps_nhwc(s, dst, body)
            expr[id(n.outputs[0])], kind[id(n.outputs[0])] = dst, "row"
            continue
        if n.op == "Split" and s.nhwc:
            _split_parts(s, n, expr, kind, outs, split_src, sub)
            continue
        if n is pool:
            dst = row_of(n.outputs[0])
            if s.sw == 1:
                _pool_steps(s, dst, body, s.Wo)
            else:  # full-resolution rows (pf), every sw-th column picked into pc
                _pool_steps(s, f"pf[i * {s.Waf}]", s.pre, s.Wf)
                pooled = f"pc[i * {s.Wa}]"
                if s.mode == "avg":
                    body += [f"Muls(cnt, rw, rh[i], {s.Wo});", "PipeBarrier<PIPE_V>();",
                             f"Div({dst}, {pooled}, cnt, {s.Wo});", "PipeBarrier<PIPE_V>();"]
                else:
                    body += [f"Muls({dst}, {pooled}, 1.0f, {s.Wo});", "PipeBarrier<PIPE_V>();"]
            expr[id(n.outputs[0])], kind[id(n.outputs[0])] = dst, "row"
            continue
        if any(id(v) not in expr for v in n.inputs):
            missing = next(v for v in n.inputs if id(v) not in expr)
            raise Unsupported(f"{n.op} reads {missing.name}, which a window kernel cannot "
                              "place", node=n, about=(missing,))
        if n.op in RESHAPE_OPS and kind[id(n.inputs[0])] == "scalar":
            expr[id(n.outputs[0])], kind[id(n.outputs[0])] = expr[id(n.inputs[0])], "scalar"
            continue
        if n.op in RESHAPE_OPS and n.outputs[0].type.numel == n.inputs[0].type.numel and \
                n.outputs[0].dtype == DType.float32:  # a view of the planes' contiguous data
            src = expr[id(n.inputs[0])]
            if id(n.outputs[0]) in outs:  # stored: copied into its output's rows
                dst = row_of(n.outputs[0])
                body += [f"Muls({dst}, {src}, 1.0f, {s.row_len});",
                         "PipeBarrier<PIPE_V>();"]
                src = dst
            expr[id(n.outputs[0])], kind[id(n.outputs[0])] = src, "row"
            continue
        if n.outputs[0].dtype != DType.float32 or not (
                tuple(n.outputs[0].shape) == out_shape or _on_rows(n, kind, out_shape)):
            raise Unsupported(f"{n.op} {list(n.outputs[0].shape)} is not float32 work on the "
                              f"pool's output {list(out_shape)}", node=n)
        dst = row_of(n.outputs[0])
        srcs = [expr[id(v)] for v in n.inputs]
        kinds = [kind[id(v)] for v in n.inputs]
        cnt = s.row_len
        if n.op in UNARY and kinds == ["row"]:
            body.append(f"{UNARY[n.op]}({dst}, {srcs[0]}, {cnt});")
        elif n.op == "Neg" and kinds == ["row"]:
            body.append(f"Muls({dst}, {srcs[0]}, -1.0f, {cnt});")
        elif n.op in WITH_TMP and kinds == ["row"]:
            s.tmp = True
            body.append(f"{WITH_TMP[n.op]}({dst}, {srcs[0]}, ht, {cnt});")
        elif n.op in BINARY and kinds == ["row", "row"]:
            body.append(f"{BINARY[n.op][0]}({dst}, {srcs[0]}, {srcs[1]}, {cnt});")
        elif n.op in BINARY and "row" in kinds:
            r, c = (srcs[0], srcs[1]) if kinds[0] == "row" else (srcs[1], srcs[0])
            first = kinds[0] == "row"
            if n.op == "Sub" and first:
                body.append(f"Adds({dst}, {r}, -({c}), {cnt});")
            elif n.op == "Sub":  # s - x: (-x) + s
                body += [f"Muls({dst}, {r}, -1.0f, {cnt});", "PipeBarrier<PIPE_V>();",
                         f"Adds({dst}, {dst}, {c}, {cnt});"]
            elif n.op == "Div" and first:
                body.append(f"Muls({dst}, {r}, 1.0f / ({c}), {cnt});")
            elif n.op == "Div":
                raise Unsupported("a scalar divided by a row in a window kernel", node=n)
            else:
                body.append(f"{BINARY[n.op][1]}({dst}, {r}, {c}, {cnt});")
        else:
            raise Unsupported(f"{n.op} is not among a window kernel's epilogue ops "
                              f"({', '.join(sorted({*BINARY, *UNARY, *WITH_TMP, 'Neg'}))} on rows)",
                              node=n)
        body.append("PipeBarrier<PIPE_V>();")
        expr[id(n.outputs[0])], kind[id(n.outputs[0])] = dst, "row"
    for k, v in enumerate(sub.outputs):
        if k in s.parts:
            continue
        if kind.get(id(v)) != "row" or expr[id(v)] != f"o{k}[i * {s.Wa}]":
            raise Unsupported(f"output {v.name} is not a row the kernel computes", about=(v,))
    s.rows = scratch


def _on_rows(n: Node, kind: dict[int, str], out_shape: tuple) -> bool:
    """Whether ``n`` works on a view of the output's planes (a squeezed ``[N, C, W]`` of a
    1-D convolution's ``[N, C, 1, W]``): every operand a computed row of the output's element
    count, or one number, so that nothing broadcasts and the rows are the output's rows in
    the same order (a per-channel operand is placed against the output's own shape only)."""
    count = symbolic.numel(out_shape)
    if not symbolic.eq(n.outputs[0].type.numel, count):
        return False
    return all((kind.get(id(v)) == "row" and symbolic.eq(v.type.numel, count))
               or v.type.numel == 1 for v in n.inputs)


def _monotone(n: Node) -> tuple[str, str] | None:
    """(tensor-with-scalar call, scalar) of a non-decreasing op of one value and a scalar
    constant (Relu, Maximum, Minimum): such an op commutes with a max, and maps the pool's
    padding (the lowest float) to a value no larger than any it maps an element to, so it may
    run on the padded copies."""
    if n.op == "ReLU":
        return "Maxs", "0.0f"
    if n.op not in ("Maximum", "Minimum") or len(n.inputs) != 2:
        return None
    consts = [v for v in n.inputs if v.producer is not None and v.producer.op == "Constant"
              and v.type.numel == 1]
    if len(consts) != 1 or n.outputs[0].dtype != DType.float32:
        return None
    val = float(np.asarray(consts[0].producer.attrs["value"]).reshape(-1)[0])
    if not np.isfinite(val):
        return None
    return ("Maxs" if n.op == "Maximum" else "Mins"), f"{val!r}f"


def _channel(v: Value, C: int) -> bool:
    """A value of one element per channel, broadcast over N, H and W ([C, 1, 1], ...)."""
    shape = [d for d in v.shape]
    if v.type.numel != C or C == 1:
        return False
    while len(shape) < 4:
        shape.insert(0, 1)
    return len(shape) == 4 and shape[1] == C


def _pool_steps(s: WindowSchedule, dst: str, body: list[str], cols: int) -> None:
    """Output row i of the pool (``cols`` columns) into ``dst``: the window's taps combined,
    an average divided by its counts (with a column stride: after the columns are picked)."""
    taps = [f"x[{s.bases[dj]} + (i * {s.sh} + {di}) * {s.P}]"
            for di in range(s.kh) for dj in range(s.kw)]
    if s.mode == "dw":  # sum of weight * tap, then the bias
        body += [f"Muls({dst}, {taps[0]}, k0, {cols});", "PipeBarrier<PIPE_V>();"]
        for t, tap in enumerate(taps[1:], 1):
            body += [f"Muls(tp, {tap}, k{t}, {cols});", "PipeBarrier<PIPE_V>();",
                     f"Add({dst}, {dst}, tp, {cols});", "PipeBarrier<PIPE_V>();"]
        if s.bias:
            body += [f"Adds({dst}, {dst}, {s.bias}, {cols});", "PipeBarrier<PIPE_V>();"]
        return
    call = "Max" if s.mode == "max" else "Add"
    if len(taps) == 1:
        body += [f"Muls({dst}, {taps[0]}, 1.0f, {cols});", "PipeBarrier<PIPE_V>();"]
    else:
        body += [f"{call}({dst}, {taps[0]}, {taps[1]}, {cols});", "PipeBarrier<PIPE_V>();"]
        for t in taps[2:]:
            body += [f"{call}({dst}, {dst}, {t}, {cols});", "PipeBarrier<PIPE_V>();"]
    if s.mode == "avg" and s.sw == 1:
        body += [f"Muls(cnt, rw, rh[i], {s.Wo});", "PipeBarrier<PIPE_V>();",
                 f"Div({dst}, {dst}, cnt, {s.Wo});", "PipeBarrier<PIPE_V>();"]


def _plan_nhwc_buffers(s: WindowSchedule) -> BufferPlan:
    """A channels-last window kernel's UB buffers (fixed sizes: an image's pixel rows)."""
    blk = s.target.block_bytes
    plane = (s.band or s.Ho * s.Wo) * s.Cp * 4
    copy = (s.band + s.kw - 1 if s.band else s.Hp * s.Wp) * s.Cp * 4
    T = s.kh * s.kw
    raw = -(-s.channels * T * 4 // blk) * blk

    def fixed(name, role, kind, n, tensor):
        return Buffer(name, role, kind, "float", Linear(fixed=n), str(n), tensor=tensor)

    bufs = [fixed("qx", "the image, loaded into its zero-padded copy", Kind.QUEUE_IN, copy,
                  "x"),
            fixed("bwr", "the weights as read (a row of taps per channel)", Kind.SCRATCH, raw,
                  "wr"),
            fixed("bwt", "the weights, a row of channels per tap", Kind.SCRATCH,
                  T * s.Cp * 4, "wt")]
    if s.bias:
        bufs.append(fixed("bbs", "the bias, a row of channels", Kind.SCRATCH, s.Cp * 4, "bs"))
    bufs += [fixed(f"qi{io.index}", f"input {io.index}'s image", Kind.QUEUE_IN, plane,
                   f"a{io.index}")
             for io in s.inputs if io.kind == "plane" and io.index != s.pool_input]
    bufs += [fixed(f"qo{io.index}", f"output {io.index}'s image", Kind.QUEUE_OUT, plane,
                   f"o{io.index}") for io in s.outputs if io.index not in s.parts]
    bufs += [fixed(f"qs{j}", f"split value {j}'s image (its parts are written from it)",
                   Kind.QUEUE_OUT, plane, f"sp{j}") for j in range(s.splits)]
    if s.rows:
        bufs.append(fixed("bw", "the epilogue's values, a row each", Kind.ROW,
                          s.rows * s.Cp * 4, "w"))
    bufs.append(fixed("bt", "a tap times its weights, a row", Kind.ROW, s.Cp * 4, "tp"))
    if s.tmp:
        bufs.append(fixed("bht", "the math library's temporary space, a row", Kind.SCRATCH,
                          s.Cp * 4, "ht"))
    return BufferPlan(tuple(bufs), Linear(fixed=blk), "float")


def _plan(s: WindowSchedule) -> BufferPlan:
    """The kernel's UB buffers (fixed sizes: a plane's rows)."""
    if s.nhwc:
        return _plan_nhwc_buffers(s)
    blk = s.target.block_bytes
    plane = s.Ho * s.Wa * 4
    copies = (s.loaded + len(s.made) * s.Hp * s.P) * 4
    bufs = [Buffer("qx", f"the pool's input plane, loaded, and {len(s.made)} copies shifted "
                   "by a column tap", Kind.QUEUE_IN, "float", Linear(fixed=copies),
                   str(copies), tensor="x")]
    if s.made:
        spread = (s.GL + s.F + s.GR) * 8 * 4
        bufs.append(Buffer("be", "a chunk of the loaded copy, each element spread over a block",
                           Kind.SCRATCH, "float", Linear(fixed=spread), str(spread),
                           tensor="e"))
    if s.sw > 1:
        full = s.Ho * s.Waf * 4
        bufs += [Buffer("bf", "the pooled rows at full column resolution", Kind.TILE, "float",
                        Linear(fixed=full), str(full), tensor="pf"),
                 Buffer("bp", "the pooled rows, every column-stride-th column", Kind.TILE,
                        "float", Linear(fixed=plane), str(plane), tensor="pc")]
    bufs += [Buffer(f"qi{io.index}", f"input {io.index}'s plane", Kind.QUEUE_IN, "float",
                    Linear(fixed=plane), str(plane), tensor=f"a{io.index}")
             for io in s.inputs if io.kind == "plane" and io.index != s.pool_input]
    bufs += [Buffer(f"qo{io.index}", f"output {io.index}'s plane", Kind.QUEUE_OUT, "float",
                    Linear(fixed=plane), str(plane), tensor=f"o{io.index}") for io in s.outputs]
    if s.rows:
        bufs.append(Buffer("bw", "the epilogue's values, a row each", Kind.ROW, "float",
                           Linear(fixed=s.rows * s.Wa * 4), str(s.rows * s.Wa * 4),
                           tensor="w"))
    if s.mode == "dw":
        row = (s.Waf if s.sw > 1 else s.Wa) * 4
        bufs.append(Buffer("bt", "a tap times its weight, a row", Kind.ROW, "float",
                           Linear(fixed=row), str(row), tensor="tp"))
    if s.tmp:
        bufs.append(Buffer("bht", "the math library's temporary space, a row", Kind.SCRATCH,
                           "float", Linear(fixed=s.Wa * 4), str(s.Wa * 4), tensor="ht"))
    if s.mode == "avg":
        bufs.append(Buffer("bc", "the window's element counts along a row, and a row's",
                           Kind.ROW, "float", Linear(fixed=2 * s.Wa * 4), str(2 * s.Wa * 4),
                           tensor="rwc"))
    return BufferPlan(tuple(bufs), Linear(fixed=blk), "float")


def _gm_size(s: WindowSchedule, numel) -> Any:
    """A GM buffer's elements: a number, or over a symbolic batch a C expression of the
    tiling's planes (``t.M``, N * C)."""
    if isinstance(numel, int):
        return numel
    coef, _ = symbolic.parse_dim(numel)
    return f"t.M / {s.channels}ull * {coef}ull"


def _batch_dim(s: WindowSchedule) -> int:
    """Where the pool input's first dim (the batch) is in the host's ``shapes``."""
    return sum(len(io.shape) for io in s.inputs[:s.pool_input])


def render_window(s: WindowSchedule) -> Rendered:
    """The kernel's files (``<name>.cpp``, ``<name>_tiling.h``, ``<name>_tiling.cpp``) and its
    manifest entry."""
    bplan = _plan(s)
    edges = []
    if s.counts is not None:
        common = max(set(s.counts), key=s.counts.count)
        edges = [(j, c) for j, c in enumerate(s.counts) if c != common]
    else:
        common = 0.0
    ctx: dict[str, Any] = {
        "s": s, "plan": bplan, "node_comment": comment_text(s.node),
        "plane_inputs": [io for io in s.inputs if io.kind == "plane"
                         and io.index != s.pool_input],
        "common": f"{common!r}f", "edges": [(j, f"{c!r}f") for j, c in edges],
        "row_counts": ", ".join(f"{c!r}f" for c in (s.row_counts or [])),
        "sizes": {io.index: _gm_size(s, io.value.type.numel) for io in [*s.inputs]},
        "osizes": {io.index: _gm_size(s, io.value.type.numel) for io in s.outputs},
        "planes_c": f"{s.planes}ull" if isinstance(s.planes, int) else
        f"(uint64_t)shapes[{_batch_dim(s)}] * {s.channels}ull",
        "blk": s.target.block_bytes,
        "lw": 0 if s.band else -(-s.W // 8) * 8,  # a loaded row's columns with DataCopyPad's
        # right padding
    }
    jenv = env()
    if s.nhwc:
        ctx["plane_inputs"] = [io for io in s.inputs if io.kind == "plane"
                               and io.index != s.pool_input]
        ctx["weights"] = next(io.index for io in s.inputs if io.kind == "weights")
        ctx["bias_in"] = next((io.index for io in s.inputs if io.kind == "channel"), None)
        ctx["full_outputs"] = [io for io in s.outputs if io.index not in s.parts]
        ctx["parts"] = [(k, j, c0, n, (s.Cp - -(-n // 8) * 8) // 8)
                        for k, (j, c0, n) in sorted(s.parts.items())]
    template = "window_nhwc.cpp.j2" if s.nhwc else "window.cpp.j2"
    tiling = "window_tiling"
    if s.band:  # GM sizes from the tiling's N and L; a part's sizes too
        template, tiling = "window_band.cpp.j2", "window_band_tiling"
        ctx["static"] = {io.index: io.value.type.numel for io in s.inputs
                         if io.kind in ("weights", "channel")}
        ctx["budget"] = bplan.budget().bytes(1, s.Cp)
    files = {f"{s.name}.cpp": jenv.get_template(template).render(ctx),
             f"{s.name}_tiling.h": jenv.get_template(f"{tiling}.h.j2").render(ctx),
             f"{s.name}_tiling.cpp": jenv.get_template(f"{tiling}.cpp.j2").render(ctx)}
    manifest = {
        "name": s.name, "node": s.node, "kind": s.kernel_kind,
        "inputs": [io_entry(io) for io in s.inputs],
        "outputs": [io_entry(io) for io in s.outputs],
        "window": {"op": s.mode, "kernel": [s.kh, s.kw], "strides": [s.sh, s.sw],
                   "plane": [s.H, s.W], "out": [s.Ho, s.Wo], "planes": s.planes},
        "tiling_fields": ["M", "L", "rt", "ct", "ctp", "nColTiles", "units", "blockDim",
                          "key", "nBatch"],
        "block_dim": "min(vector cores, planes)",
        "tiling_function": f"{s.name}_tiling",
        "sources": sorted(files),
        "notes": list(s.notes),
        "buffers": bplan.describe(),
    }
    return Rendered(s, None, files, manifest, bplan)
