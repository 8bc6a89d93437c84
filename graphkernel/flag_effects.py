"""Flags that change nothing where they are used, said out loud.

A flag given for a pass that does not run (``--opt_level=0 --enable_recompute_fusion``: no
kernels are formed, so none is recomputed into) and a selector that matches no node of the
model (``--super_kernel_scope=foo``) are not errors (the same string serves several models
and levels) but they are almost always a mistake: each gets a one-line warning naming the
flag and why it has no effect.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Sequence
from typing import Any

from graphkernel.errors import did_you_mean
from graphkernel.flags import Config, FlagWarning

# flag -> the passes that read it, all of which must run for it to change anything
_FUSION = ("cluster", "split")
FLAG_USES: dict[str, tuple[str, ...]] = {
    "enable_recompute_fusion": (*_FUSION, "recompute"),
    "recompute_max_consumers": (*_FUSION, "recompute"),
    "enable_parallel_fusion": (*_FUSION, "parallel_fusion"),
    "enable_matmul_group": ("matmul_group",),
    "enable_super_kernel": (*_FUSION, "super_kernel", "codegen"),
    "super_kernel_scope": (*_FUSION, "super_kernel", "codegen"),
    "composite_op_limit_size": _FUSION,
    "max_kernel_inputs": _FUSION,
    "peak_memory_growth": _FUSION,
    "conv_panel_growth": ("conv_fusion",),
    "reduce_fuse_depth": _FUSION,
    "broadcast_fuse_depth": _FUSION,
    "disable_fusion_pattern": _FUSION,
    "enable_fusion_pattern_only": _FUSION,
    "enable_fusion_pattern": _FUSION,
    "enable_single_node_fusion": _FUSION,
    "enable_cluster_ops": _FUSION,
    "disable_cluster_ops": _FUSION,
    "enable_cluster_ops_only": _FUSION,
    "skip_node_names": _FUSION,
    "skip_node_types": _FUSION,
    "enable_expand_ops": ("expand",),
    "disable_expand_ops": ("expand",),
    "enable_expand_ops_only": ("expand",),
    "enable_low_precision": (*_FUSION, "promote_precision"),
    "precision_blacklist": (*_FUSION, "promote_precision"),
    "precision_blacklist_kernels": (*_FUSION, "promote_precision"),
    "disable_fallback": (*_FUSION, "codegen"),
    "replace_kernel": (*_FUSION, "codegen"),
    "keep_codegen_project": ("codegen",),
    "dump_kernel_graphs": _FUSION,
}


def unused_flags(cfg: Config, decisions: Sequence[Any]) -> list[str]:
    """One message per flag the user set that no running pass reads (``decisions``: the
    pipeline's plan for ``cfg``)."""
    off = {}
    for d in decisions:
        if not d.on:
            off.setdefault(d.slot.name, d.reason)
    on = {d.slot.name for d in decisions if d.on}
    notes = []
    for flag, passes in FLAG_USES.items():
        if cfg.is_default(flag) or cfg.value(flag) in ([], False, ""):
            continue
        missing = next((p for p in passes if p not in on), None)
        if missing is not None:
            why = off.get(missing, "not in the pipeline")
            notes.append(f"{cfg.origin(flag)}: --{flag} has no effect: pass {missing} does not "
                         f"run ({why})")
    return notes


def unmatched_selectors(graph: Any, cfg: Config) -> list[str]:
    """One message per name in a node selector (``super_kernel_scope``, ``skip_node_names``)
    that matches no node of ``graph`` (by its name or the user's node names it came from)."""
    if not cfg.value("super_kernel_scope") and not cfg.value("skip_node_names"):
        return []
    names = sorted({n.name for n in graph.nodes} | {o for n in graph.nodes for o in n.origin})
    notes = []
    for flag, glob in (("super_kernel_scope", True), ("skip_node_names", False)):
        for sel in cfg.value(flag):
            hit = any(n == sel or (glob and (n.startswith(sel) or fnmatch.fnmatchcase(n, sel)))
                      for n in names)
            if not hit:
                notes.append(f"{cfg.item_origin(flag, sel)}: --{flag}={sel} matches no node of "
                             f"{graph.name}" + did_you_mean(sel, names))
    return notes


def warn(messages: Sequence[str]) -> None:
    for m in messages:
        warnings.warn(m, FlagWarning, stacklevel=2)
