"""Why was (or wasn't) this fused? Candidate fusions ranked by score, with verdicts; every
refusal with its stable code (graphkernel.refusals)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from graphkernel.api import CompileResult
from graphkernel.refusals import CODEGEN, code


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
    products = [asdict(c) for c in res.analyses.conv_products]
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
        products = [c for c in products if _matches(c["conv"], node)]
    fallbacks = [f | {"code": CODEGEN.code} for f in res.report.extra.get("fallbacks", [])]
    if node is not None:
        fallbacks = [f for f in fallbacks if any(_matches(n, node) for n in f["nodes"])]
    rows.sort(key=lambda r: (-r["score"], r["verdict"] != "fused"))
    return {"node": node, "candidates": rows, "not_fusable": reasons,
            "not_fusable_codes": {k: code(v) for k, v in reasons.items()},
            "kernels": kernels, "patterns_off": disabled, "attention": attention,
            "layouts": layouts, "conv_products": products, "fallbacks": fallbacks,
            "refusals": refusal_counts(rows + disabled, reasons, fallbacks)}


def refusal_counts(rows: list[dict[str, Any]], reasons: dict[str, str],
                   fallbacks: list[dict[str, Any]]) -> dict[str, int]:
    """How many refusals of each code: fusion candidates (and patterns switched off), nodes no
    kernel may take, kernels the code generator gave back."""
    out: dict[str, int] = {}
    for c in [r["code"] for r in rows if r["verdict"] != "fused"] + \
            [code(v) for v in reasons.values()] + [f["code"] for f in fallbacks]:
        out[c] = out.get(c, 0) + 1
    return dict(sorted(out.items()))


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
        why = "" if r["verdict"] == "fused" else f"  -- {r['code']} {r['reason']}"
        lines.append(f"  {verdict}{r['score']:>12,d} B  {r['pattern']}: "
                     f"{' + '.join(r['areas'])}{why}")
    if len(d["candidates"]) > limit:
        lines.append(f"  ... {len(d['candidates']) - limit} more (use --json for all)")
    if not d["candidates"]:
        lines.append("  (none)")
    if d["not_fusable"]:
        lines.append(f"not fusable{who}:")
        for name, why in list(d["not_fusable"].items())[:limit]:
            lines.append(f"  {name}: {d['not_fusable_codes'][name]} {why}")
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
    if d.get("conv_products"):
        lines.append(f"1x1 convolutions{who} (conv_matmul):")
        for c in d["conv_products"]:
            lines.append(f"  {c['verdict']:<8} {c['conv']}: {c['reason']}")
    for f in d.get("fallbacks", []):
        lines.append(f"codegen fallback {f['kernel']}: {f['code']} {f['reason']}")
    for p in d["patterns_off"]:
        lines.append(f"pattern {p['pattern']}: {p['code']} {p['reason']}")
    if d.get("refusals"):
        lines.append("refusals by code (graphkernel patterns --codes): " + ", ".join(
            f"{c} x{n}" for c, n in d["refusals"].items()))
    return "\n".join(lines)
