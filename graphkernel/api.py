"""The Python API: ``graphkernel.compile``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphkernel import flag_effects
from graphkernel.dump import Dumper
from graphkernel.flags import Config, resolve
from graphkernel.ir import Graph
from graphkernel.pipeline import (
    Analyses,
    PassManager,
    RunReport,
    collector_paused,
    name_checker,
    plan,
    report_count,
)


@dataclass
class CompileResult:
    """The graph after the pipeline, the run report, and the effective flags."""

    graph: Graph
    report: RunReport
    config: Config
    analyses: Analyses = field(default_factory=Analyses)
    applications: list[Any] = field(default_factory=list)  # every numbered rewrite
    dumps: list[Path] = field(default_factory=list)  # files written by dump_as_text
    # kernel -> the user's files used in place of generated ones (replace_kernel), checked
    replacements: dict[str, dict[str, str]] = field(default_factory=dict)

    def write_report(self, directory: str | os.PathLike) -> Path:
        return Dumper(directory).write_json("report.json", self.report.to_dict())


def load_config(flags: str | Mapping[str, Any] | None = "", config: str | os.PathLike | None = None,
                target: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """The effective configuration (defaults < config file < environment < explicit flags)."""
    explicit: Any = flags
    if target is not None:
        explicit = (dict(flags) | {"target": target}) if isinstance(flags, Mapping) else \
            f"{flags or ''} --target={target}"
    cfg = resolve(explicit, config=config, env=env, name_check=name_checker())
    decisions = plan(cfg)  # selector and required-pass errors surface here, with the flags
    flag_effects.warn(flag_effects.unused_flags(cfg, decisions))
    return cfg


def compile(graph_or_path: Graph | str | os.PathLike, flags: str | Mapping[str, Any] | None = "",
            config: str | os.PathLike | None = None, target: str | None = None, *,
            env: Mapping[str, str] | None = None, log: Callable[[str], None] | None = None,
            out_dir: str | os.PathLike | None = None,
            dump_dir: str | os.PathLike | None = None, copy: bool = True,
            checked_on_load: bool = False) -> CompileResult:
    """Run the pass pipeline on a graph (or a model file) under the effective flags.

    The input graph is not modified: the pipeline runs on a copy of it. With ``copy=False``
    it runs on the graph itself, which the caller gives up (it becomes the result's graph,
    or is left half-compiled when the compile fails): for a graph built only to be
    compiled, it saves the copy's time and memory. ``out_dir`` also receives
    ``report.json``; ``dump_dir`` replaces ``debug_dir`` as the folder of the
    ``dump_as_text`` dumps and, with ``keep_codegen_project``, of the kernel project
    (``kernels/`` and its manifest).

    ``checked_on_load``: the caller vouches that the graph is exactly as
    ``frontends.load_model`` returned it, nothing done to it since. The loaders build every
    node through the checks ``Graph.validate`` repeats (each node's attributes, arity and
    inferred output types, or those of an equal node checked before; inputs defined before
    use, so no cycle; use-lists, owners and names kept by the IR's own operations; outputs
    set once), so the pipeline's first validate pass, which would find nothing, is skipped
    (half a second of a 100k-node compile). A graph built or changed otherwise must not be
    vouched for: the validate pass is what names its broken invariant.
    """
    with collector_paused():
        return _compile(graph_or_path, flags, config, target, env, log, out_dir, dump_dir,
                        copy, checked_on_load)


def _compile(graph_or_path: Graph | str | os.PathLike, flags: str | Mapping[str, Any] | None,
             config: str | os.PathLike | None, target: str | None,
             env: Mapping[str, str] | None, log: Callable[[str], None] | None,
             out_dir: str | os.PathLike | None, dump_dir: str | os.PathLike | None,
             copy: bool, checked_on_load: bool = False) -> CompileResult:
    if isinstance(graph_or_path, Graph):
        if copy:
            graph = graph_or_path.copy()
        else:
            graph = graph_or_path  # as the copy would be: the same compile
            built = False
            if checked_on_load:  # (a file's graph, as the JSON loader built it?)
                from graphkernel.frontends.json_format import BUILT_IN_ORDER

                built = graph in BUILT_IN_ORDER
            graph.settle(built_in_order=built)
    else:
        from graphkernel.frontends import load_model

        graph = load_model(graph_or_path)
        checked_on_load = True  # (loaded here: nothing touched it since)
    cfg = load_config(flags, config, target, env)
    flag_effects.warn(flag_effects.unmatched_selectors(graph, cfg))
    from graphkernel.codegen import targets  # the backend's facts, loaded once per compile

    pm = PassManager(cfg, targets.load(cfg.target), log=log,
                     dump_dir=str(dump_dir) if dump_dir is not None and cfg.dump_as_text
                     else None, checked_on_load=checked_on_load)
    report = pm.run(graph)
    _refusal_codes(report, pm.ctx.analyses)
    result = CompileResult(graph, report, cfg, pm.ctx.analyses, pm.bisect.log)
    report_count(report.bisect_applications)
    if out_dir is not None:
        result.write_report(out_dir)
    if pm.dumper is not None:
        pm.dumper.write_json("report.json", report.to_dict())
        result.dumps = list(pm.dumper.written)
    if cfg.replace_kernel:  # AutoFuse's replace_kernel: the user's kernels, once checked
        from graphkernel.replacements import check_replacements

        result.replacements = check_replacements(result, cfg.replace_kernel)
    if cfg.dump_kernel_graphs:  # AutoFuse's subgraph_recover: each kernel as a graph file
        result.dumps += write_kernel_graphs(result.graph, dump_dir if dump_dir is not None
                                            else cfg.debug_dir)
    if cfg.keep_codegen_project:  # AutoFuse's codegen_compile_debug: kernels kept with dumps
        from graphkernel.codegen.backend import write_project

        keep = dump_dir if dump_dir is not None else cfg.debug_dir
        result.dumps += write_project(result, keep, result.dumps)
    return result


def write_kernel_graphs(graph: Graph, folder: str | os.PathLike) -> list[Path]:
    """Each kernel's body as a graph file ``folder/kernel_graphs/<kernel>.json``: a kernel on
    its own, to run (``graphkernel run``), verify or bisect apart from its model."""
    from graphkernel.frontends.json_format import save_graph
    from graphkernel.outputs import Folder, file_name

    out = Folder(folder, immediate=True)
    written: list[Path] = []
    for n in graph.nodes:
        if n.op == "GraphKernel":
            written += save_graph(n.subgraph, out.path("kernel_graphs",
                                                       file_name(n.name) + ".json"))
    return written


def _refusal_codes(report: RunReport, analyses: Analyses) -> None:
    """The refusals' stable codes in the report: each codegen fallback's, and how many
    refusals of each code the compile made (fusion candidates, nodes no kernel may take,
    fallbacks)."""
    from graphkernel.refusals import CODEGEN, code

    counts = analyses.fusion_attempts.refusal_codes()
    info = analyses.cluster
    for reason in (info.reasons.values() if info is not None else ()):
        c = code(reason)
        counts[c] = counts.get(c, 0) + 1
    for f in report.figures.fallbacks or []:
        f["code"] = CODEGEN.code
        counts[CODEGEN.code] = counts.get(CODEGEN.code, 0) + 1
    if counts:
        report.figures.refusals = dict(sorted(counts.items()))
