"""A kxk convolution with its epilogue in one MIX kernel: an implicit-GEMM product on the
Matmul API, the im2col panel built by the vector core, the epilogue on the product's tiles.

Per image ``n`` a convolution (NCHW, one group) is the product ``out[n][M, P] = W[M, K] @
col[n][K, P]`` with ``K = C*kh*kw`` (the weights ``[M, C, kh, kw]`` are ``W`` row-major as
they are) and ``P = Ho*Wo``; column ``p`` of ``col`` holds the input window of output pixel
``p`` (zeros where it covers the padding). A vector core takes units (an image and a block of
``Pb`` output pixels) round robin and, for each, builds the block's panel ``col[n][K, p0:p0 +
Pb]`` in a GM workspace of its own, then runs the product on it with the epilogue on each
output tile, as the MIX kernels of ``codegen/cube/schedule.py`` do:

- the panel, a channel at a time: the input rows the block's windows cover are loaded into a
  zeroed UB plane (``Duplicate``, then one ``DataCopyPad`` of the rows, each at the start of a
  row of ``Pp`` elements whose gap holds that row's right padding and the next one's left); a
  ``Gather`` per tap ``(di, dj)`` picks the block's ``Pb`` window elements (a table of byte
  offsets built once per unit, the tap's offset as the Gather's base); the channel's
  ``kh*kw`` panel rows go to the workspace with one copy (MTE3);
- the product: A = the weights in GM, B = the panel in the workspace (``singleCoreM = M``,
  ``singleCoreN = Pb``: one base tile across the block's pixels), C to UB by
  ``GetTensorC``; before the first ``Iterate`` the scalar unit waits for the panel's copies
  (``MTE3_S``: the request to the cube core is the scalar unit's), and the next unit's panel
  is written after ``Iterate`` returned false;
- the epilogue (``codegen/cube/epilogue.py`` over the convolution's output ``[N, M, Ho,
  Wo]`` as ``[N, M, P]``): a bias or batch-norm affine per channel (a column of the tile),
  the activation, a residual of the output's shape (a tile), casts; each output tile is
  written once.

Blocks: on the vector cores of a MIX launch a block's two vector cores are ``GetBlockIdx()``
``= block * GetTaskRatio() + sub-block`` out of ``GetBlockNum() * GetTaskRatio()``; each takes
its own units (its own Matmul requests to the block's cube core) and its own panel in the
workspace. GM traffic: the input rows of each unit (the window's halo rows re-read by the
next unit), the panel written once and read by the cube core, the weights once per unit, the
epilogue's inputs and outputs once (``conv_reads``: the traffic model's count, the
simulator's too).

Refused (the convolution then stays a cube launch of its own): not float32, groups,
dilations, NHWC, symbolic shapes, weights or a bias computed in the kernel, a prologue, an
epilogue the MIX epilogue does not run (a reduction, a row input), and a panel or plane that
does not fit the UB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphkernel.codegen import barriers, targets
from graphkernel.codegen.buffers import BufferPlan, plan
from graphkernel.codegen.cube import epilogue
from graphkernel.codegen.cube.epilogue import Epilogue
from graphkernel.codegen.cube.lower import POOLS, lower
from graphkernel.codegen.cube.tiling import CubeTiling, NoTiling, tile
from graphkernel.codegen.kernel_ir import COL, FULL, Buffer, Kind, Linear, comment_text, text
from graphkernel.codegen.lower import C_TYPE
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.render import Rendered, env, io_entry, target_facts
from graphkernel.codegen.vector.schedule import FULL as WHOLE
from graphkernel.codegen.vector.schedule import KernelIO, kernel_symbol
from graphkernel.codegen.window import is_depthwise
from graphkernel.ir import DType, Node
from graphkernel.symbolic import is_static

PIXEL_BLOCKS = (128, 64, 32, 16)  # output pixels per unit, the widest that fits first
FLOAT = 4


def is_conv_op(n: Node) -> bool:
    """A convolution this module makes a MIX kernel of (a depthwise one is a window kernel)."""
    return n.op == "Conv2D" and not is_depthwise(n)


def is_conv_kernel(kernel: Node) -> bool:
    """Whether ``kernel`` holds a convolution planned by this module."""
    return kernel.op == "GraphKernel" and any(is_conv_op(n) for n in kernel.subgraph.nodes)


@dataclass
class ConvSchedule:
    """A convolution's MIX kernel: its geometry, the pixel block, the panel's UB layout, the
    epilogue and the product's tiling (static shapes)."""

    node: str
    name: str
    conv: Node
    x: int                     # the input among the kernel's inputs
    w: int                     # the weights
    N: int
    C: int
    H: int
    W: int
    M: int                     # output channels (the product's M)
    Ho: int
    Wo: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    Pb: int                    # output pixels per unit (the product's N)
    Pp: int                    # a plane row's pitch in UB (W, then the padding: whole blocks)
    GL: int                    # zeros before the plane's first row (the left padding)
    R: int                     # plane rows a unit loads at most
    epilogue: Epilogue
    target: targets.Target = field(repr=False, compare=False)
    tiling: CubeTiling | None = None
    notes: list[str] = field(default_factory=list)
    kernel_kind: str = "mix"
    variant: None = None
    reduce: bool = False
    L: int = 1

    @property
    def K(self) -> int:
        return self.C * self.kh * self.kw

    @property
    def P(self) -> int:
        return self.Ho * self.Wo

    @property
    def units(self) -> int:
        """Work units: an image and a block of Pb output pixels."""
        return self.N * -(-self.P // self.Pb)

    @property
    def plane(self) -> int:
        """Elements of the UB plane: the guard, then R rows of Pp; at least Pb, the count of
        each Gather from it (a block wider than a small image's rows, a 1x1 convolution on
        7x7 pixels taking 64: the Gather's count may not exceed its source's elements)."""
        return max(self.GL + self.R * self.Pp, self.Pb)

    @property
    def inputs(self) -> list[KernelIO]:
        return [KernelIO(i, v, WHOLE, v.dtype, tuple(v.type.shape))
                for i, v in enumerate(self.conv.graph.inputs)]

    @property
    def outputs(self) -> list[KernelIO]:
        return [KernelIO(j, v, WHOLE, v.dtype, tuple(v.type.shape))
                for j, v in enumerate(self.conv.graph.outputs)]

    @property
    def c_bytes(self) -> int:
        return FLOAT

    def panel_buffers(self) -> list[Buffer]:
        """The UB buffers that build the panel (fixed sizes)."""
        taps = self.kh * self.kw
        return [
            Buffer("bcp", "a channel's input rows, zero padded", Kind.SCRATCH, "float",
                   Linear(fixed=self.plane * FLOAT), str(self.plane * FLOAT), tensor="pl"),
            Buffer("bcs", "a channel's kh*kw panel rows", Kind.SCRATCH, "float",
                   Linear(fixed=taps * self.Pb * FLOAT), str(taps * self.Pb * FLOAT),
                   tensor="st"),
            Buffer("bco", "the block's window offsets (bytes)", Kind.SCRATCH, "uint32_t",
                   Linear(fixed=self.Pb * 4), str(self.Pb * 4), tensor="tb"),
        ]

    def plan(self) -> BufferPlan:
        """The kernel's UB buffers: the epilogue's lowering's and the panel's."""
        p = plan(lower(self.epilogue, self.target), self.target.block_bytes)
        return BufferPlan((*p.buffers, *self.panel_buffers()), p.slack, p.compute)

    def workspace_bytes(self, block_dim: int) -> int:
        """The user workspace: a panel per vector core of the launch (two per block on the
        device: a MIX launch's block has two vector cores)."""
        return 2 * block_dim * self.K * self.Pb * FLOAT


def _geometry(conv: Node) -> dict[str, int]:
    a = conv.attrs
    x, w, y = conv.inputs[0], conv.inputs[1], conv.outputs[0]
    N, C, H, W = (int(d) for d in x.shape)
    M, _, kh, kw = (int(d) for d in w.shape)
    Ho, Wo = (int(d) for d in y.shape[2:])
    sh, sw = a["strides"]
    pt, pl, _, _ = a["pads"]
    return dict(N=N, C=C, H=H, W=W, M=M, Ho=Ho, Wo=Wo, kh=kh, kw=kw, sh=sh, sw=sw, pt=pt,
                pl=pl)


def refusal(conv: Node) -> str | None:
    """Why the convolution ``conv`` has no MIX kernel of this module, or None."""
    a = conv.attrs
    x, w = conv.inputs[0], conv.inputs[1]
    if a["data_format"] != "NCHW":
        return f"{a['data_format']} data (the kernel reads NCHW)"
    if a["group"] != 1:
        return f"{a['group']} groups (one product per group is not generated)"
    if list(a["dilations"]) != [1, 1]:
        return f"dilations {list(a['dilations'])}"
    if x.dtype != DType.float32 or conv.outputs[0].dtype != DType.float32:
        return f"{x.dtype.value} data (the convolution kernels are generated for float32)"
    if not all(is_static(d) for d in (*x.shape, *w.shape, *conv.outputs[0].shape)):
        return "symbolic shapes"
    if len(w.shape) != 4:
        return f"a {len(w.shape) - 2}-D convolution"
    return None


def plan_conv(kernel: Node, spec: targets.Target) -> ConvSchedule:
    """The convolution kernel of ``kernel``, or Unsupported naming what is outside it."""
    body = kernel.subgraph
    convs = [n for n in body.nodes if is_conv_op(n)]
    if len(convs) != 1:
        raise Unsupported(f"{len(convs)} convolutions in one kernel (a convolution kernel runs "
                          "one)", node=convs[1] if len(convs) > 1 else None)
    conv = convs[0]
    why = refusal(conv)
    if why is not None:
        raise Unsupported(f"Conv2D of {why}", node=conv)
    ins, outs = list(body.inputs), list(body.outputs)
    if any(v not in ins for v in conv.inputs):
        raise Unsupported("a convolution whose input, weights or bias are computed in its "
                          "kernel (it reads them from GM)", node=conv)
    if len(conv.inputs) == 3:
        raise Unsupported("a convolution with its bias (the bias is an Add of the epilogue: "
                          "conv_fusion moves it there)", node=conv)
    g = _geometry(conv)
    P = g["Ho"] * g["Wo"]
    steps = [n for n in body.nodes if n is not conv and n.op != "Constant"]
    epi = epilogue.schedule(conv.outputs[0], (g["N"],), g["M"], P, ins, outs, steps)
    if epi.rows:
        raise Unsupported("a reduction in a convolution's epilogue", node=conv)
    if len(epi.batch) != 1 or any(i.layout == epilogue.ROW_IN for i in epi.inputs):
        raise Unsupported("a convolution's epilogue reading rows of pixels or over regrouped "
                          "images (tiles of the output, per-channel columns and scalars "
                          "only)", node=conv)
    blk = spec.block_bytes // FLOAT
    pr = max(0, (g["Wo"] - 1) * g["sw"] + g["kw"] - g["pl"] - g["W"])  # right reach
    Pp = -(-(g["W"] + g["pl"] + pr) // blk) * blk
    GL = -(-g["pl"] // blk) * blk
    notes: list[str] = []
    last = ""
    for Pb in PIXEL_BLOCKS:
        if Pb > -(-P // spec.cube_fractal) * spec.cube_fractal and Pb > spec.cube_fractal:
            continue  # a block wider than the image's pixels
        span = (Pb - 1 + g["Wo"] - 1) // g["Wo"] + 1  # output rows a block touches at most
        R = (min(span, g["Ho"]) - 1) * g["sh"] + g["kh"]
        s = ConvSchedule(kernel.name, kernel_symbol(kernel), conv, ins.index(conv.inputs[0]),
                         ins.index(conv.inputs[1]), Pb=Pb, Pp=Pp, GL=GL, R=R, epilogue=epi,
                         target=spec, notes=notes, **g)
        p = plan(lower(epi, spec), spec.block_bytes)
        b = p.budget()
        panel = sum(int(x.init) for x in s.panel_buffers())
        reserved = b.col * Pb + b.row * 256 + b.fixed + panel
        one = spec.model_copy(update={"aic_cores": 1})  # a unit is one core's block
        try:
            t = tile(s.M, Pb, s.K, FLOAT, FLOAT, FLOAT, one, ub_reserved=reserved,
                     ub_per_elem=b.tile, whole_rows=True)
        except NoTiling as e:
            last = str(e)
            continue
        s.tiling = t
        break
    else:
        raise Unsupported(f"Conv2D {g['kh']}x{g['kw']} of {g['C']} channels: no pixel block "
                          f"fits ({last})", node=conv)
    used = min(spec.aic_cores, s.units)
    s.notes += [
        f"an implicit-GEMM product W[{s.M}, {s.K}] @ col[{s.K}, {s.Pb} pixels] per unit "
        f"({s.units} units): the im2col panel is built by the vector core in a GM workspace "
        f"({s.K * s.Pb * FLOAT} bytes per vector core), written once and read by the cube core",
        f"the input rows a unit's windows cover are read per unit ({s.R} rows at most); the "
        f"weights once per unit",
        f"blocks: {used} cube cores, each vector core takes its own units",
    ]
    return s


def conv_reads(kernel: Node, spec: targets.Target | None = None) -> tuple[int, int] | None:
    """(GM bytes read, GM bytes written) of a convolution kernel, by the traffic model: per
    unit the input rows its windows cover (each channel's) and the weights (one N tile: each
    M tile's panel of A once), the panel written (whole) and read back (its columns in use,
    once when it stays in L1 across the M tiles); the epilogue's
    inputs and outputs once (a column per unit). None when the generator would not make
    it."""
    from graphkernel.flags import DEFAULT_TARGET

    try:
        s = plan_conv(kernel, spec or targets.load(DEFAULT_TARGET))
    except Unsupported:
        return None
    t = s.tiling
    assert t is not None
    read = written = 0
    blocks = -(-s.P // s.Pb)
    for u in range(blocks):
        p0, p1 = u * s.Pb, min(s.P, (u + 1) * s.Pb) - 1
        r0 = p0 // s.Wo * s.sh - s.pt
        r1 = p1 // s.Wo * s.sh - s.pt + s.kh - 1
        rows = max(0, min(r1, s.H - 1) - max(r0, 0) + 1)
        read += s.N * s.C * rows * s.W * FLOAT
    kt = -(-s.K // t.baseK)
    tiles_m = -(-s.M // t.baseM)
    held = t.depthB1 >= kt if t.iterateOrder == 0 else t.depthB1 // kt >= 1
    read += s.units * s.M * s.K * FLOAT  # the weights: each M tile's panel once per unit
    read += s.N * s.K * s.P * FLOAT * (1 if held else tiles_m)  # the panels, read back
    written += s.units * s.K * s.Pb * FLOAT  # ... which the vector core wrote (whole)
    for i in s.epilogue.inputs:
        v = s.inputs[i.index].value
        if i.layout == epilogue.COL_IN:  # a tile's rows of the column, per unit
            read += s.units * s.M * v.dtype.itemsize
        elif i.layout == epilogue.TILE:
            read += v.type.numel * v.dtype.itemsize
        else:  # a scalar: once per core
            read += v.dtype.itemsize * min(s.target.aic_cores, s.units)
    written += sum(o.value.type.numel * o.value.dtype.itemsize for o in s.outputs)
    return read, written


def render_conv(s: ConvSchedule) -> Rendered:
    """The kernel's files (``<name>.cpp``, ``<name>_tiling.h``, ``<name>_tiling.cpp``) and its
    manifest entry."""
    epi = s.epilogue
    ir = lower(epi, s.target)
    bplan = s.plan()
    tensors = {b.tensor for b in bplan.buffers}
    t = s.tiling
    assert t is not None
    fields = t.fields()
    ctx: dict[str, Any] = {
        "s": s, "epi": epi, "node_comment": comment_text(s.node),
        "pool_tiles": ir.pools[POOLS[FULL]], "pool_cols": ir.pools[POOLS[COL]],
        "uses_ht": "ht" in tensors, "uses_hh": "hh" in tensors,
        "body_lines": text(barriers.place(ir.compute)),
        "store_lines": {j: text(st) for j, st in ir.stores.items()},
        "itype": {io.index: C_TYPE[io.dtype] for io in s.inputs if io.dtype in C_TYPE},
        "otype": {io.index: C_TYPE[io.dtype] for io in s.outputs if io.dtype in C_TYPE},
        "sizes": {io.index: io.value.type.numel for io in s.inputs},
        "osizes": {io.index: io.value.type.numel for io in s.outputs},
        "cube": {k: v for k, v in fields.items() if k in CUBE_FIELDS},
        "taps": [(di, dj) for di in range(s.kh) for dj in range(s.kw)],
        "lw": -(-s.W // (s.target.block_bytes // FLOAT)) * (s.target.block_bytes // FLOAT),
        "bound": bplan.budget().bytes(t.baseM, t.baseN),
        **target_facts(s.target), "row_reduce": False,
    }
    jenv = env()
    files = {f"{s.name}.cpp": jenv.get_template("conv_mix.cpp.j2").render(ctx),
             f"{s.name}_tiling.h": jenv.get_template("conv_tiling.h.j2").render(ctx),
             f"{s.name}_tiling.cpp": jenv.get_template("conv_tiling.cpp.j2").render(ctx)}
    manifest: dict[str, Any] = {
        "name": s.name, "node": s.node, "kind": s.kernel_kind,
        "inputs": [io_entry(io) for io in s.inputs],
        "outputs": [io_entry(io) for io in s.outputs],
        "conv": {"kernel": [s.kh, s.kw], "strides": [s.sh, s.sw], "pads": [s.pt, s.pl],
                 "in": [s.N, s.C, s.H, s.W], "out": [s.N, s.M, s.Ho, s.Wo],
                 "pixel_block": s.Pb, "units": s.units},
        "tiling_fields": ["cube (TCubeTiling)", "units", "blockDim"],
        "cube_tiling": fields,
        "block_dim": "min(cube cores, units); each vector core takes its own units",
        "workspace": "a K x Pb panel per vector core (two per block)",
        "tiling_function": f"{s.name}_tiling",
        "sources": sorted(files),
        "notes": list(s.notes),
        "buffers": bplan.describe(),
    }
    return Rendered(s, ir, files, manifest, bplan)


CUBE_FIELDS = ("usedCoreNum", "M", "N", "Ka", "Kb", "singleCoreM", "singleCoreN",
               "singleCoreK", "baseM", "baseN", "baseK", "depthA1", "depthB1", "stepM", "stepN",
               "stepKa", "stepKb", "isBias", "iterateOrder", "transLength")
