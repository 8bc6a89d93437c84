"""The anchors' flag keys: every key AutoFuse (``AUTOFUSE_FLAGS``, ``AUTOFUSE_DFX_FLAGS``) and
MindSpore's graph-kernel flags (``MS_DEV_GRAPH_KERNEL_FLAGS``) parse, what it means there, and
what graphkernel does with it.

graphkernel is driven by the anchors' own flag strings, copied from their documentation, so
no key either anchor knows may be an error here. Each one is, by its ``verdict``:

- ``honoured``: graphkernel reads it under the same name with the same meaning;
- ``mapped``: graphkernel turns it into its own key(s) (``to``);
- ``no effect``: accepted (its value still checked) with a one-line warning saying why it
  changes nothing here.

``differs`` says where graphkernel's reading departs from the anchor's even so. The tables
here are data: ``graphkernel flags --anchors`` prints them, ``graphkernel flags --from``
applies them to a string, and the docs' verdict table is generated from them.

The facts come from AutoFuse's documentation of its control points and its flag parser (the
string is split on ``;`` only, an item is ``--key=value`` with exactly one ``=``, unknown keys
are ignored), and from MindSpore's ``graph_kernel_flags`` (the string is split on spaces,
``--key`` alone means true, a repeated key keeps its first value, unknown keys are warned
about and ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

AUTOFUSE = "AUTOFUSE_FLAGS"
AUTOFUSE_DFX = "AUTOFUSE_DFX_FLAGS"
MINDSPORE = "MindSpore"
ANCHORS = {"autofuse": (AUTOFUSE, AUTOFUSE_DFX), "mindspore": (MINDSPORE,)}

HONOURED, MAPPED, NO_EFFECT = "honoured", "mapped", "no effect"


@dataclass(frozen=True)
class AnchorKey:
    """One key an anchor parses. ``kind``/``lo``/``hi``/``choices`` describe the values it
    accepts (a no-effect key's value is still checked, so a typo is still an error)."""

    name: str
    anchors: tuple[str, ...]
    meaning: str       # what it does in the anchor, with the anchor's default
    verdict: str       # honoured | mapped | no effect
    graphkernel: str   # what it becomes here, or why it changes nothing
    differs: str = ""  # where graphkernel's reading departs from the anchor's
    kind: str = "bool"  # bool | int | str | list | choice (for no-effect keys)
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    power_of_two: bool = False


def _k(name: str, anchors: tuple[str, ...], meaning: str, verdict: str, graphkernel: str,
       differs: str = "", **spec) -> tuple[str, AnchorKey]:
    return name, AnchorKey(name, anchors, meaning, verdict, graphkernel, differs, **spec)


AF, DFX, MS = (AUTOFUSE,), (AUTOFUSE_DFX,), (MINDSPORE,)
NO_DEVICE = "graphkernel runs no kernel on a device while compiling"
AKG = "graphkernel generates Ascend C, not AKG kernels"

KEYS: dict[str, AnchorKey] = dict([
    # ---------------------------------------------------------------- AUTOFUSE_FLAGS
    _k("enable_autofuse", AF, "turn automatic fusion on (default false: nothing fuses, and "
       "every other AUTOFUSE_FLAGS key is void)", MAPPED,
       "false -> opt_level=0; true keeps the opt_level (2 by default)",
       "graphkernel fuses by default; AutoFuse fuses nothing unless this is true, and with it "
       "unset ignores its other keys (graphkernel still reads them)"),
    _k("autofuse_enable_pass", AF, "turn on the extended fusions listed (reduce, concat, "
       "slice, split, gather, transpose, matmul, conv); each is off unless listed", MAPPED,
       "enable_fusion_pattern (the patterns of each name); with AutoFuse's vocabulary the "
       "names not listed are turned off",
       "conv has no fusion in graphkernel (accepted, no effect); a name in both "
       "lists of one string is an error (AutoFuse warns and turns it off)"),
    _k("autofuse_disable_pass", AF, "turn off the extended fusions listed", MAPPED,
       "disable_fusion_pattern and disable_cluster_ops (the patterns and ops of each name)",
       "AutoFuse reads it only next to autofuse_enable_pass; graphkernel always applies it"),
    _k("autofuse_enhance_precision_blacklist", AF, "AscIR op types whose fused graphs are not "
       "promoted to fp32: a fused graph stays in low precision only when every op in it is "
       "listed (`all`: every op; Sum, Mean and Prod are always promoted)", MAPPED,
       "precision_blacklist_kernels (AutoFuse's names Le, Sum, ... read as graphkernel's "
       "LessEqual, ReduceSum, ...)",
       "graphkernel's own precision_blacklist works per op: a listed op computes in low "
       "precision inside a kernel that is otherwise promoted"),
    _k("recomputation_threshold", AF, "0..255, default 1: a single-output node with more "
       "users than this is materialized instead of recomputed in them", MAPPED,
       "recompute_max_consumers (the recompute pass copies a cheap producer into at most "
       "this many consumer kernels)",
       "AutoFuse counts every user of the node; graphkernel counts the consumer kernels the "
       "recompute pass would copy it into; AutoFuse's default 1 applies only when given"),
    _k("max_fusion_size", AF, "most original nodes in one fused node (default 64; 0: no "
       "fusion)", MAPPED, "composite_op_limit_size (0: no fusion)"),
    _k("autofuse_enable_pgo", AF, "profile-guided tiling: sample tilings on the board and "
       "keep the fastest (default false)", NO_EFFECT, NO_DEVICE + " (its tiling is computed "
       "from the shapes, see docs/codegen.md)"),
    _k("experimental_enable_jit_executor_v2", AF, "split the graph where symbols cannot be "
       "derived and compile the parts one after another (default false)", NO_EFFECT,
       "graphkernel compiles symbolic shapes whole; it never splits a graph for them"),
    # ------------------------------------------------------------ AUTOFUSE_DFX_FLAGS
    _k("codegen_compile_debug", DFX, "keep the generated kernel, tiling, CMake project and the "
       "schedule dumps (default false)", MAPPED, "keep_codegen_project (the kernel project "
       "with the dumps in debug_dir)"),
    _k("debug_dir", DFX, "where codegen_compile_debug writes its dumps (default: the current "
       "folder)", HONOURED, "debug_dir",
       "graphkernel's default is ./graph_kernel_dump (MindSpore's folder), used by "
       "dump_as_text as well as codegen_compile_debug"),
    _k("skip_node_names_cfg", DFX, ".ini file whose [ByNodeName]/[ByNodeType] entries are "
       "never fused", MAPPED, "skip_node_names and skip_node_types",
       "a malformed file is an error here; AutoFuse ignores it"),
    _k("disable_lifting", DFX, "keep fused nodes that lifting would roll back into their "
       "original ops, such as single-op fused nodes (default false)", MAPPED,
       "enable_single_node_fusion (a lone vector op still becomes a generated kernel)"),
    _k("replace_kernel", DFX, "a folder of hand-edited kernel and tiling sources used in "
       "place of the generated ones", HONOURED, "replace_kernel",
       "a replacement is accepted only after the simulator built and ran it and its results "
       "matched the kernel's reference"),
    _k("subgraph_recover", DFX, "write the fused subgraphs back out as graphs (default "
       "false)", MAPPED, "dump_kernel_graphs (each kernel's body as a graphkernel graph "
       "file in debug_dir, runnable with `graphkernel run`)"),
    _k("autofuse_att_algorithm", DFX, "auto-tiling solver: AxesReorder (default) or the "
       "experimental HighPerf", NO_EFFECT, "graphkernel's tiler has one algorithm (docs/"
       "codegen.md)", kind="choice", choices=("AxesReorder", "HighPerf")),
    _k("att_accuracy_level", DFX, "auto-tiling solve precision: 1 (default) high, 0 low",
       NO_EFFECT, "graphkernel's tiler solves exactly", kind="int", lo=0, hi=1),
    _k("att_enable_small_shape_strategy", DFX, "auto-tiling strategy for small shapes",
       NO_EFFECT, "graphkernel's tiler has no separate small-shape strategy"),
    _k("att_enable_multicore_ub_tradeoff", DFX, "let att_ub_threshold and "
       "att_corenum_threshold steer the tiling (default false)", NO_EFFECT,
       "graphkernel's tiler does not trade core count against UB use"),
    _k("att_ub_threshold", DFX, "0..100, default 20: lowest UB use (%) of a tiling",
       NO_EFFECT, "graphkernel's tiler does not trade core count against UB use",
       kind="int", lo=0, hi=100),
    _k("att_corenum_threshold", DFX, "0..100, default 40: lowest core use (%) of a tiling",
       NO_EFFECT, "graphkernel's tiler does not trade core count against UB use",
       kind="int", lo=0, hi=100),
    _k("att_profiling", DFX, "profile the auto-tiling solver itself (default false)",
       NO_EFFECT, "graphkernel's per-pass times cover its tiler (`graphkernel compile` "
       "prints them)"),
    _k("autofuse_enable_tiling_cache", DFX, "cache auto-tiling solutions", NO_EFFECT,
       "graphkernel's tiling is computed at run time from the shapes, with nothing to "
       "cache"),
    _k("autofuse_pgo_algo", DFX, "PGO search: core_select (default) or pruning", NO_EFFECT,
       NO_DEVICE, kind="choice", choices=("core_select", "pruning")),
    _k("autofuse_pgo_step_max", DFX, "PGO pruning step, a power of two in 2..1024 (default "
       "16)", NO_EFFECT, NO_DEVICE, kind="int", lo=2, hi=1024, power_of_two=True),
    _k("autofuse_pgo_topn", DFX, "tilings PGO tries (default 5; 0: all)", NO_EFFECT,
       NO_DEVICE, kind="int", lo=0),
    # ---------------------------------------------------------------- MindSpore
    _k("opt_level", MS, "0..3: fusion off, basic, default (2), experimental", HONOURED,
       "opt_level", "MindSpore clamps a level above 3 to 3 with a warning; graphkernel "
       "refuses it"),
    _k("dump_as_text", MS, "dump the fusion's IR as text", HONOURED, "dump_as_text"),
    _k("enable_stitch_fusion", MS, "stitch a reduction and its consumer through a workspace "
       "(on at opt_level 3)", NO_EFFECT, "graphkernel has no stitch fusion"),
    _k("enable_recompute_fusion", MS, "recompute cheap producers in their consumers (on from "
       "opt_level 2)", HONOURED, "enable_recompute_fusion"),
    _k("enable_parallel_fusion", MS, "fuse independent kernels into one launch (on at "
       "opt_level 3)", HONOURED, "enable_parallel_fusion"),
    _k("enable_horizontal_fusion", MS, "horizontal fusion (default false)", MAPPED,
       "enable_parallel_fusion", "graphkernel has one horizontal fusion, the parallel "
       "fusion pass"),
    _k("enable_auto_tensor_inplace", MS, "let kernels write in place", NO_EFFECT,
       "graphkernel kernels write only their own outputs"),
    _k("enable_dynamic_batch", MS, "AKG kernels with a dynamic batch size", NO_EFFECT, AKG),
    _k("enable_low_precision", MS, "compute fp16 inside fused kernels", HONOURED,
       "enable_low_precision"),
    _k("enable_csr_fusion", MS, "fuse CSR sparse ops", NO_EFFECT,
       "graphkernel has no sparse ops"),
    _k("enable_debug_mode", MS, "graph-kernel debug mode", NO_EFFECT,
       "graphkernel's checks are always on"),
    _k("enable_lite_conv_tuning", MS, "MindSpore Lite convolution tuning", NO_EFFECT, AKG),
    _k("enable_vectorization", MS, "AKG vectorization (default true)", NO_EFFECT, AKG),
    _k("enable_dynamic_shape_fusion", MS, "fuse ops with dynamic shapes (default false)",
       NO_EFFECT, "graphkernel always fuses symbolic shapes"),
    _k("enable_parallel_op_combine", MS, "combine parallel ops of one kind", NO_EFFECT,
       "graphkernel has no op combining pass"),
    _k("disable_matmul_post_fusion", MS, "do not fuse a matmul with the work on its result "
       "(default false)", MAPPED, "disable_fusion_pattern=matmul_depth"),
    _k("enable_allreduce_prologue_fusion", MS, "fuse the work before an AllReduce into it "
       "(default true)", NO_EFFECT, "graphkernel has no collective ops"),
    _k("enable_allreduce_epilogue_fusion", MS, "fuse the work after an AllReduce into it "
       "(default true)", NO_EFFECT, "graphkernel has no collective ops"),
    _k("exact_precision_mode", MS, "keep simplification exact in floating point", NO_EFFECT,
       "graphkernel's arithmetic simplification is always exact (its rules never change a "
       "result); false does not allow inexact rules"),
    _k("reduce_fuse_depth", MS, "most ops fused with a reduction (10 on Ascend)", HONOURED,
       "reduce_fuse_depth", "MindSpore reads a negative value as its default; graphkernel "
       "refuses it"),
    _k("online_tuning", MS, "AKG online tuning level 0..3", NO_EFFECT, AKG, kind="int",
       lo=0, hi=3),
    _k("cpu_refer_thread_num", MS, "threads of the CPU tuning reference (default 8)",
       NO_EFFECT, AKG, kind="int", lo=0),
    _k("fusion_ops_level", MS, "expand and cluster AKG's ops by level (0 on Ascend)",
       NO_EFFECT, "graphkernel's op lists are chosen with enable_/disable_cluster_ops and "
       "*_expand_ops", kind="int", lo=0, hi=2),
    _k("parallel_ops_level", MS, "how parallel fusion analyses memory (0 or 1)", NO_EFFECT,
       "graphkernel's parallel fusion has one analysis", kind="int", lo=0, hi=1),
    _k("recompute_increment_threshold", MS, "recompute's memory increment bound (bytes)",
       NO_EFFECT, "graphkernel's recompute is judged by GM bytes saved; see "
       "peak_memory_growth for the memory guard", kind="int"),
    _k("recompute_peak_threshold", MS, "recompute's memory peak bound (bytes)", NO_EFFECT,
       "graphkernel's recompute is judged by GM bytes saved; see peak_memory_growth for the "
       "memory guard", kind="int"),
    _k("composite_op_limit_size", MS, "most ops in one fused kernel (default 200)", HONOURED,
       "composite_op_limit_size", "graphkernel's default is the target's cap (64, "
       "AutoFuse's max_fusion_size)"),
    _k("repository_path", MS, "AKG's operator repository file", NO_EFFECT, AKG, kind="str"),
    _k("target_os", MS, "CPU cross-compilation: operating system", NO_EFFECT,
       "graphkernel targets Ascend only (see target)", kind="str"),
    _k("cpu_arch", MS, "CPU cross-compilation: architecture", NO_EFFECT,
       "graphkernel targets Ascend only (see target)", kind="str"),
    _k("cpu_feature", MS, "CPU cross-compilation: instruction set", NO_EFFECT,
       "graphkernel targets Ascend only (see target)", kind="str"),
    _k("cpu_type", MS, "CPU cross-compilation: processor", NO_EFFECT,
       "graphkernel targets Ascend only (see target)", kind="str"),
    _k("kernel_generator", MS, "the kernel compiler: AKG, MLIR or DVM", NO_EFFECT,
       "graphkernel has one generator (Ascend C)", kind="str"),
    _k("enable_expand_ops", MS, "also expand these ops", HONOURED, "enable_expand_ops"),
    _k("enable_expand_ops_only", MS, "expand exactly these ops", HONOURED,
       "enable_expand_ops_only"),
    _k("disable_expand_ops", MS, "do not expand these ops", HONOURED, "disable_expand_ops"),
    _k("enable_cluster_ops", MS, "also cluster these ops", HONOURED, "enable_cluster_ops"),
    _k("enable_cluster_ops_only", MS, "cluster exactly these ops", HONOURED,
       "enable_cluster_ops_only"),
    _k("disable_cluster_ops", MS, "do not cluster these ops", HONOURED, "disable_cluster_ops"),
    _k("enable_simplify_exprs_only", MS, "arithmetic simplification: only these expressions",
       NO_EFFECT, "graphkernel's rules are its own numbered table; switch the pass with "
       "--disable_pass=arith_simplify", kind="list"),
    _k("disable_simplify_exprs", MS, "arithmetic simplification: not these expressions",
       NO_EFFECT, "graphkernel's rules are its own numbered table; switch the pass with "
       "--disable_pass=arith_simplify", kind="list"),
    _k("enable_pass", MS, "force on passes (stage_id.pass_id or stage_name.pass_name)",
       HONOURED, "enable_pass", "graphkernel's stages and passes are its own: a numeric "
       "selector names graphkernel's pass at that place (see `graphkernel passes`)"),
    _k("disable_pass", MS, "turn off passes (stage_id.pass_id or stage_name.pass_name)",
       HONOURED, "disable_pass", "graphkernel's stages and passes are its own: a numeric "
       "selector names graphkernel's pass at that place (see `graphkernel passes`)"),
    _k("enable_cce_lib", MS, "run clusters through the CCE library", NO_EFFECT, AKG),
    _k("enable_cce_lib_ops", MS, "CCE library ops", NO_EFFECT, AKG, kind="list"),
    _k("enable_cce_lib_ops_only", MS, "only these CCE library ops", NO_EFFECT, AKG,
       kind="list"),
    _k("disable_cce_lib_ops", MS, "not these CCE library ops", NO_EFFECT, AKG, kind="list"),
    _k("enable_packet_ops_only", MS, "kernel packet: only these kernels", NO_EFFECT,
       "graphkernel has no kernel packets (host-side shape ops are ordinary nodes)",
       kind="list"),
    _k("disable_packet_ops", MS, "kernel packet: not these kernels", NO_EFFECT,
       "graphkernel has no kernel packets (host-side shape ops are ordinary nodes)",
       kind="list"),
    _k("enable_fusion_pattern_only", MS, "run only these fusion patterns", HONOURED,
       "enable_fusion_pattern_only", "MindSpore matches names by substring; graphkernel "
       "exactly, or by prefix with a trailing *"),
    _k("disable_fusion_pattern", MS, "turn off these fusion patterns", HONOURED,
       "disable_fusion_pattern", "MindSpore matches names by substring; graphkernel "
       "exactly, or by prefix with a trailing *"),
    _k("dump_level", MS, "how much the dumps hold", NO_EFFECT,
       "graphkernel's dump_as_text writes one level", kind="str"),
    _k("path", MS, "a JSON file of flags; the rest of the string is ignored", HONOURED,
       "path", "graphkernel reads the file with file precedence and keeps the rest of the "
       "string (which overrides the file)"),
])


@dataclass(frozen=True)
class FusionGroup:
    """One name of AutoFuse's ``autofuse_enable_pass``: graphkernel's fusion patterns and
    cluster ops that make that kind of fusion. Empty when graphkernel has no such fusion."""

    patterns: tuple[str, ...]
    ops: tuple[str, ...]
    note: str = ""


# AutoFuse's extended fusions (its parser's vocabulary), each off unless listed
AUTOFUSE_GROUPS: dict[str, FusionGroup] = {
    "reduce": FusionGroup(("reduce_fwd_depth", "reduce_fwd_width", "reduce_bwd",
                           "reduce_output", "reduce_chain", "reduce_broadcast_back",
                           "reduce_columns", "reduce_rows", "elemany_addn"),
                          ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ElemAny")),
    "concat": FusionGroup(("concat",), ("Concat",)),
    "slice": FusionGroup(("slice",), ("Slice", "StridedSlice")),
    "split": FusionGroup(("split_store",), ("Split",)),
    "gather": FusionGroup(("gather", "lookup"), ("Gather",)),
    "transpose": FusionGroup(("transpose",), ("Transpose",)),
    "matmul": FusionGroup(("matmul_depth", "product_views"), ()),
    "conv": FusionGroup((), (), "graphkernel's convolution fusion is a pass, not a "
                        "pattern: conv_fusion (on from opt_level 2)"),
}
# keys whose presence in one flag string means the string speaks AutoFuse
AUTOFUSE_VOCABULARY = frozenset({"enable_autofuse", "autofuse_enable_pass",
                                 "autofuse_disable_pass"})

# AscIR op types (AutoFuse's names in autofuse_enhance_precision_blacklist) that graphkernel
# names otherwise; any other name is looked up as an op name or alias
ASCIR_OPS = {"Le": "LessEqual", "Lt": "Less", "Ge": "GreaterEqual", "Gt": "Greater",
             "Eq": "Equal", "Ne": "NotEqual", "Sum": "ReduceSum", "Mean": "ReduceMean",
             "Prod": "ReduceProd", "Max": "ReduceMax", "Min": "ReduceMin",
             "Broadcast": "BroadcastTo", "Where": "Select"}
# always promoted (a low-precision sum or product loses digits): AutoFuse's rule too
ALWAYS_PROMOTED = frozenset({"ReduceSum", "ReduceMean", "ReduceProd"})


def anchors_of(key: str) -> tuple[str, ...]:
    """The anchors that parse ``key`` (empty for graphkernel's own keys)."""
    k = KEYS.get(key)
    return k.anchors if k is not None else ()


def no_effect_keys() -> frozenset[str]:
    return frozenset(k for k, v in KEYS.items() if v.verdict == NO_EFFECT)


def markdown_table() -> str:
    """Every key an anchor parses and what graphkernel does with it (the docs' table)."""
    rows = ["| key | anchor | in the anchor | graphkernel | how it differs |",
            "|---|---|---|---|---|"]
    for k in sorted(KEYS.values(), key=lambda k: (_anchor_order(k), k.name)):
        verdict = f"**{k.verdict}**: {k.graphkernel}" if k.verdict != HONOURED else \
            "**honoured**"
        rows.append(f"| `{k.name}` | {', '.join(k.anchors)} | {k.meaning} | {verdict} | "
                    f"{k.differs or '—'} |".replace("\n", " "))
    return "\n".join(rows)


def groups_markdown() -> str:
    """AutoFuse's extended fusion names and graphkernel's patterns and ops for each."""
    rows = ["| AutoFuse name | graphkernel patterns | cluster ops |", "|---|---|---|"]
    for name, g in AUTOFUSE_GROUPS.items():
        pats = ", ".join(f"`{p}`" for p in g.patterns) or f"— ({g.note})"
        ops = ", ".join(g.ops) or "—"
        rows.append(f"| `{name}` | {pats} | {ops} |")
    return "\n".join(rows)


def _anchor_order(k: AnchorKey) -> int:
    return (AUTOFUSE, AUTOFUSE_DFX, MINDSPORE).index(k.anchors[0])
