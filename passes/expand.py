"""Expand composite ops into basic ops, per the effective expand list."""

from __future__ import annotations

from graphkernel import ops, registry
from graphkernel.expanders.base import (
    Template,
    expand_node,
    record,
    replay,
    template_key,
)
from graphkernel.flags import Config
from graphkernel.passes.rewrite import replace_with
from graphkernel.registry import PassResult, counted


def default_expand_ops() -> list[str]:
    """Composite ops with an expander on by default (optional ones such as Erf are not)."""
    return sorted(name for name, e in registry.EXPANDERS.items()
                  if e.default and ops.get(name).composite)


def expand_list(cfg: Config) -> set[str]:
    """The effective list: ``*_only`` replaces the default; else default + enable - disable."""
    if cfg.enable_expand_ops_only:
        return set(cfg.enable_expand_ops_only)
    return (set(default_expand_ops()) | set(cfg.enable_expand_ops)) - set(cfg.disable_expand_ops)


def expand(graph, ctx) -> PassResult:
    """Rewrite composite op -> its basic-op expansion, for ops on the expand list.

    A node whose expander's preconditions fail is kept and the reason logged
    (``expand: kept LayerNorm 'ln1': ...``); so is one whose expansion does not
    reproduce the op's output types.
    """
    wanted = expand_list(ctx.flags)
    expanded = kept = created_total = 0
    templates: dict[tuple, Template | None] = {}  # by template_key; None: not replayable
    for node in graph.nodes:
        if node.op not in wanted or node.op not in registry.EXPANDERS:
            continue
        exp = registry.EXPANDERS[node.op]
        reason = exp.why_not(node)
        if reason is None:
            if not ctx.should_apply(f"{node.name} ({node.op})", [node]):
                continue
            size = len(graph)
            key = template_key(node)
            template = templates.get(key) if key is not None else None
            if template is not None:
                outs, reason = replay(graph, node, template), ""
            else:
                with graph.recording() as added:
                    outs, reason = expand_node(graph, node, exp)
                if outs is not None and key is not None and key not in templates:
                    templates[key] = record(node, added, outs)
            if outs is not None:
                created = len(graph) - size
                replace_with(graph, node, outs)
                ctx.log(f"expanded {node.op} '{node.name}' into {created} ops")
                expanded += 1
                created_total += created
                continue
        ctx.log(f"kept {node.op} '{node.name}': {reason}")
        kept += 1
    summary = (f"{counted(expanded, 'composite node')} expanded into "
               f"{counted(created_total, 'op')}, {kept} kept" if expanded or kept else "")
    return PassResult(expanded > 0, expanded, summary=summary)
