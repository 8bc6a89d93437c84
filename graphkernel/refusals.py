"""Stable codes for the reasons a fusion is refused.

A refusal's reason is a sentence for a person ("kind mismatch: producer ln/sub is
BROADCAST ..."); its code is for a program (``explain --json``, ``report.json``, a CI check
that counts refusals of one kind). Codes never change meaning; a new kind of refusal gets a
new code. Each reason graphkernel writes starts with a fixed phrase, and the table below
maps that phrase to the code (the reasons stay the single source: a code is never written
beside a reason by hand). ``GK999`` is a reason no rule matches (a plugin's pattern may give
any); a test keeps graphkernel's own reasons off it.

``autofuse`` names AutoFuse's own not-fuse reason code for the same refusal, where it has
one (its NFxxxx codes), so that logs of both can be compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    code: str
    name: str
    meaning: str
    pattern: re.Pattern[str]
    autofuse: str = ""


def _r(code: str, name: str, meaning: str, regex: str, autofuse: str = "") -> Refusal:
    return Refusal(code, name, meaning, re.compile(regex), autofuse)


# in the order they are tried (the first match wins)
REFUSALS: tuple[Refusal, ...] = (
    # the flags switched it off
    _r("GK101", "pattern-disabled", "the pattern is turned off by a flag "
       "(disable_fusion_pattern, enable_fusion_pattern_only)", r"^pattern disabled by flag"),
    _r("GK102", "pattern-level", "the pattern's level is above opt_level",
       r"^pattern level \d+ > opt_level"),
    # a node may not join any kernel
    _r("GK111", "not-cluster-op", "the op is not in the cluster list (enable_/disable_"
       "cluster_ops, or an extended fusion that is off)", r"^op \S+ not in the cluster list"),
    _r("GK112", "skip-node", "the node is in the skip list's [ByNodeName]",
       r"^node in skip list"),
    _r("GK113", "skip-type", "the op type is in the skip list's [ByNodeType]",
       r"^op type in skip list"),
    _r("GK114", "dtype", "a dtype the vector unit does not compute (float64, int64)",
       r"^dtype \S+ not supported"),
    _r("GK115", "constant", "a constant is an input of kernels, never a member",
       r"^constant \(an input of kernels"),
    _r("GK116", "not-row-lookup", "a Gather other than a lookup of whole rows of a 2-D "
       "table (the general gather fusion is off below opt_level 3)",
       r"^Gather of other than whole rows"),
    _r("GK117", "split-not-stored", "a Split no vector kernel stores: of the last axis (its "
       "parts are columns of every row; a kernel stores parts by rows), or of a value no "
       "vector kernel computes", r"^Split of (the last axis|a value no vector kernel)"),
    # the pattern's own rules
    _r("GK201", "cycle", "fusing would make the kernel feed itself (a path between the "
       "areas leaves them)", r"^cycle:", "NF1002"),
    _r("GK202", "kind", "a neighbour's kind is not one the pattern takes", r"^kind mismatch:"),
    _r("GK203", "other-consumers", "the producer has consumers outside the fusion",
       r"^producer \S+ has other consumers"),
    _r("GK204", "broadcast-edge", "the edge broadcasts where the pattern needs an injective "
       "one", r"^edge relation:"),
    _r("GK205", "compute-size", "the areas iterate over different element counts",
       r"^compute size mismatch"),
    _r("GK206", "graph-output", "the area is a graph output (it cannot be pushed into its "
       "consumers, unless elementwise work of their shape that they store too)",
       r"^\S+ is a graph output$"),
    _r("GK207", "outside-consumer", "a consumer lies outside the fusable region",
       r"has a consumer outside the fusable region$"),
    _r("GK208", "reduce-axes", "the reductions reduce different shapes or axes",
       r"^the reductions differ in shape or axes"),
    _r("GK209", "generator-layout", "the code generator cannot lay the fused values out "
       "(operands of different shapes, a moved last axis, rows that do not fit)",
       r"(operands of different shapes|moves the last axis|code generator cannot hold the "
       r"rows|broadcast over a middle axis|reduces other than rows of)"),
    _r("GK211", "left-outside", "a consumer a matmul epilogue cannot take stays outside "
       "its kernel (the reason follows)", r"^left outside:"),
    _r("GK212", "product-views", "a matrix product's kernel cannot take the views next to it "
       "into its addressing (a stride or a reader it cannot express; the reason follows)",
       r"^the product cannot address it:"),
    _r("GK210", "epilogue", "a matmul epilogue takes only elementwise work and reductions "
       "along the product's last axis", r"^consumer \S+ (holds|views|reduces|writes)"),
    # caps
    _r("GK301", "op-cap", "the kernel would hold more ops than composite_op_limit_size (the "
       "target's cap)", r"^size limit: \d+ ops > composite_op_limit_size=", "NF1010"),
    _r("GK302", "pattern-cap", "the kernel would exceed the pattern's own size limit "
       "(reduce_fuse_depth, broadcast_fuse_depth)", r"^size limit:"),
    _r("GK303", "input-cap", "the kernel would read more inputs than max_kernel_inputs (the "
       "target's cap)", r"^input limit:", "NF1007"),
    _r("GK304", "peak-memory", "the fusion keeps a tensor alive longer and raises the "
       "estimated peak of live memory by more than peak_memory_growth", r"^peak memory:",
       "NF1003"),
    # bisection
    _r("GK401", "bisect", "bisect_limit refused this rewrite", r"^refused by bisect_limit"),
)
# a kernel the code generator could not generate (codegen fallbacks: their reasons are the
# generator's, one code for all of them)
CODEGEN = Refusal("GK501", "codegen", "the code generator cannot generate the kernel; it is "
                  "split or left unfused (codegen fallback)", re.compile(""))
OTHER = Refusal("GK999", "other", "a reason no rule matches (a plugin's pattern)",
                re.compile(""))
BY_CODE = {r.code: r for r in (*REFUSALS, CODEGEN, OTHER)}
# what any fusion may meet, whatever its pattern (the split model's own checks, the flags)
COMMON = ("GK101", "GK102", "GK201", "GK301", "GK303", "GK304", "GK401")


def classify(reason: str) -> Refusal:
    """The refusal a reason states (``OTHER`` when none matches)."""
    for r in REFUSALS:
        if r.pattern.search(reason):
            return r
    return OTHER


def code(reason: str) -> str:
    return classify(reason).code


def markdown_table() -> str:
    """Every code, as the docs' table."""
    rows = ["| code | name | meaning | AutoFuse |", "|---|---|---|---|"]
    for r in sorted(BY_CODE.values(), key=lambda r: r.code):
        rows.append(f"| `{r.code}` | {r.name} | {r.meaning} | {r.autofuse or '—'} |")
    return "\n".join(rows)
