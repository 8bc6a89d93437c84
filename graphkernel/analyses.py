"""What passes hand on: the analyses one pass gives later passes and the caller, the records
of single passes, and the figures they add to the compile's report, all typed.

``Analyses`` (``CompileResult.analyses``) holds each analysis under a field named for what it
holds, written by one pass; ``AttentionMatch`` and ``LayoutChoice`` are the records of the
attention and channels_last passes. ``ReportFigures`` are the report's figures beyond the
per-pass table (GM traffic and modeled time unfused and fused, fallbacks, phases,
SuperKernels, what codegen made): a pass sets the fields it computes; a figure no pass set
is left out of the report; a plugin's pass adds its own under ``more``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from graphkernel.runlog import AttemptLog

if TYPE_CHECKING:  # the analyses' types belong to the passes that compute them
    from graphkernel.codegen.superkernel import Group
    from graphkernel.codegen.vector.schedule import Schedule
    from graphkernel.passes.cluster import ClusterInfo


@dataclass
class AttentionMatch:
    """One attention candidate (a softmax between two products) and what became of it."""

    product: str  # the Q·Kᵀ product (or the ·V product when refused before finding it)
    nodes: list[str]  # the pattern's nodes
    verdict: str  # "fused" or "refused"
    reason: str  # when fused: layout, heads and mask; when refused: why
    op: str = ""  # the FusedAttention node made


@dataclass
class LayoutChoice:
    """The layout a convolution next to a layout permute runs in, and why."""

    conv: str  # the convolution as the graph named it before the pass
    layout: str  # "NHWC" (switched) or "NCHW" (kept)
    reason: str


@dataclass
class ConvProduct:
    """A 1x1 convolution and whether it became a matrix product of its channels, and why."""

    conv: str  # the convolution as the graph named it before the pass
    verdict: str  # "product" or "kept"
    reason: str


@dataclass
class Analyses:
    """What a pass hands to later passes and to the caller (``CompileResult.analyses``), each
    field named for what it holds and written by one pass. ``invalidate`` resets fields to
    their empty value: a pass that recomputes an analysis starts from nothing."""

    cluster: ClusterInfo | None = None  # cluster: regions and why nodes are not fusable
    attention: list[AttentionMatch] = field(default_factory=list)  # attention: candidates
    layouts: list[LayoutChoice] = field(default_factory=list)  # channels_last: conv layouts
    conv_products: list[ConvProduct] = field(default_factory=list)  # conv_matmul: 1x1 convs
    fusion_attempts: AttemptLog = field(default_factory=AttemptLog)  # split: every candidate
    kernel_counter: int = 0  # the last kernel number given (split, parallel_fusion, codegen)
    super_kernel_scopes: list[str] | None = None  # super_kernel: None when it did not run
    super_kernels: list[Group] = field(default_factory=list)  # codegen: SuperKernel groups
    codegen: dict[str, Schedule] = field(default_factory=dict)  # codegen: kernel -> schedule
    codegen_shared: dict[str, str] = field(default_factory=dict)  # kernel -> first of its body

    def invalidate(self, *names: str) -> None:
        fresh = Analyses()
        for name in names:
            setattr(self, name, getattr(fresh, name))


@dataclass(slots=True)
class ReportFigures:
    """The compile report's figures, each set by the pass that computes it (None: not
    computed in this compile; left out of the report)."""

    # cluster (or, when no fusion ran, the report at the end): the graph before fusion
    gm_bytes_unfused: int | None = None
    kernels_unfused: int | None = None
    gm_bytes_ideal: int | None = None   # every fusable region one kernel, no size limits
    kernels_ideal: int | None = None
    modeled_us_unfused: float | None = None
    # codegen: what it could not generate, kernels split into phases or stages, SuperKernels
    fallbacks: list[dict[str, Any]] | None = None
    phases: list[dict[str, Any]] | None = None
    super_kernels: list[dict[str, Any]] | None = None
    super_kernel_summary: dict[str, Any] | None = None
    codegen: dict[str, Any] | None = None
    # the end of the run (split.traffic_summary): the compiled graph
    gm_bytes_fused: int | None = None
    kernels_fused: int | None = None
    traffic_model: str | None = None
    kernels: list[dict[str, Any]] | None = None
    externs: list[dict[str, Any]] | None = None
    modeled_us_fused: float | None = None
    modeled_us_by_kind: dict[str, float] | None = None
    target: str | None = None
    cost_model: str | None = None
    fusion_decisions: dict[str, int] | None = None
    # the compile (api): how many refusals of each stable code (graphkernel.refusals)
    refusals: dict[str, int] | None = None
    more: dict[str, Any] = field(default_factory=dict)  # a plugin pass's own figures

    def as_dict(self) -> dict[str, Any]:
        """The figures set, by name, as the report lists them (``more`` merged in)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "more" and getattr(self, f.name) is not None}
        return out | self.more
