"""Why was (or wasn't) this fused? Candidate fusions ranked by score, with verdicts."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from graphkernel.api import CompileResult


def _matches(name: str, query: str) -> bool:
    return name == query or name.startswith(query + "/")


def explain(res: CompileResult, node: str | None = None) -> dict[str, Any]:
    attempts = res.analyses.fusion_attempts
    info = res.analyses.cluster
    reasons = dict(info.reasons) if info is not None else {}
    kernels = [{"name": n.name, "pattern": n.attrs["pattern"], "origin": list(n.origin),
                "nodes": [m.name for m in n.subgraph.nodes if m.op != "Constant"]}
               for n in res.graph.nodes if n.op == "GraphKernel"]
    attention = [asdict(a) for a in res.analyses.attention]
    layouts = [asdict(c) for c in res.analyses.layouts]
    rows = [a.as_dict() for a in attempts if a.areas]
    disabled = [a.as_dict() for a in attempts if not a.areas]
    if node is not None:
        rows = [r for r in rows if any(_matches(n, node) for n in r["nodes"])]
        reasons = {k: v for k, v in reasons.items() if _matches(k, node)}
        kernels = [k for k in kernels if any(_matches(n, node) for n in k["nodes"])
                   or node in k["origin"]]
        attention = [a for a in attention if any(_matches(n, node) for n in a["nodes"])
                     or a["op"] == node]
        layouts = [c for c in layouts if _matches(c["conv"], node)]
    rows.sort(key=lambda r: (-r["score"], r["verdict"] != "fused"))
    return {"node": node, "candidates": rows, "not_fusable": reasons, "kernels": kernels,
            "patterns_off": disabled, "attention": attention, "layouts": layouts}


def format_explain(d: dict[str, Any], limit: int = 40) -> str:
    lines = []
    who = f" involving {d['node']!r}" if d["node"] else ""
    if d["kernels"]:
        lines.append(f"kernels{who}:")
        for k in d["kernels"]:
            lines.append(f"  {k['name']}  [{k['pattern']}]  from {', '.join(k['origin'])}")
    lines.append(f"candidate fusions{who}, by GM bytes saved:")
    for r in d["candidates"][:limit]:
        verdict = "FUSED   " if r["verdict"] == "fused" else "refused "
        why = "" if r["verdict"] == "fused" else f"  -- {r['reason']}"
        lines.append(f"  {verdict}{r['score']:>12,d} B  {r['pattern']}: "
                     f"{' + '.join(r['areas'])}{why}")
    if len(d["candidates"]) > limit:
        lines.append(f"  ... {len(d['candidates']) - limit} more (use --json for all)")
    if not d["candidates"]:
        lines.append("  (none)")
    if d["not_fusable"]:
        lines.append(f"not fusable{who}:")
        for name, why in list(d["not_fusable"].items())[:limit]:
            lines.append(f"  {name}: {why}")
    if d.get("attention"):
        lines.append(f"attention{who} (one fused attention launch each):")
        for a in d["attention"]:
            if a["verdict"] == "fused":
                lines.append(f"  FUSED    {a['product']} -> {a['op']}: {a['reason']}")
            else:
                lines.append(f"  refused  {a['product']}  -- {a['reason']}")
    if d.get("layouts"):
        lines.append(f"convolution layouts{who} (channels_last):")
        for c in d["layouts"]:
            lines.append(f"  {c['layout']}  {c['conv']}: {c['reason']}")
    for p in d["patterns_off"]:
        lines.append(f"pattern {p['pattern']}: {p['reason']}")
    return "\n".join(lines)
