"""A self-contained HTML page for one compile: summary, a picture of the graph with nodes
coloured by the kernel that holds them, the kernels, the fallbacks and the per-pass times.

The picture is an inline SVG drawn by graphviz ``dot`` when it is installed; otherwise the
page shows the same grouping as an indented list.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from typing import Any

from jinja2 import Environment, StrictUndefined

from graphkernel.fileio import atomic_write_text
from graphkernel.ir import Graph

PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
           "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]
MAX_DRAWN = 1500  # nodes; larger graphs get the list view (dot gets slow and unreadable)

PAGE = Environment(undefined=StrictUndefined, autoescape=True).from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>graphkernel: {{ name }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;
font-size:13px;text-align:left}th{background:#f3f3f3}.num{text-align:right}
.swatch{display:inline-block;width:.9em;height:.9em;border:1px solid #888;margin-right:.3em}
#picture svg{max-width:100%;height:auto;border:1px solid #ddd}
</style></head><body>
<h1>graphkernel compile report: {{ name }}</h1>
<h2>Summary</h2>
<table>
<tr><th>kernel launches</th><td class="num">{{ kernels_unfused }} unfused</td>
<td class="num"><span id="kernel-count">{{ kernels_fused }}</span> fused</td></tr>
<tr><th>GM bytes</th><td class="num">{{ gm_unfused }} unfused</td>
<td class="num">{{ gm_fused }} fused ({{ gm_ideal }} ideal, fused/ideal {{ ratio }})</td></tr>
<tr><th>modeled time</th><td colspan="2">{{ modeled }}</td></tr>
<tr><th>nodes</th><td colspan="2">{{ nodes_before }} before, {{ nodes_after }} after,
{{ seconds }} ms</td></tr>
</table>
<h2>Graph</h2>
<div id="picture">{{ picture | safe }}</div>
<h2>Kernels</h2>
<table id="kernels"><tr><th>kernel</th><th>pattern</th><th class="num">ops</th>
<th class="num">GM bytes</th><th>your nodes</th></tr>
{% for k in kernels %}<tr>
<td><span class="swatch" style="background:{{ k.color }}"></span>{{ k.name }}</td>
<td>{{ k.pattern }}</td><td class="num">{{ k.ops }}</td><td class="num">{{ k.bytes }}</td>
<td>{{ k.origin }}</td></tr>{% endfor %}
</table>
<h2>Fallbacks</h2>
{% if fallbacks %}<ul>{% for f in fallbacks %}<li>{{ f }}</li>{% endfor %}</ul>
{% else %}<p>none</p>{% endif %}
<h2>Passes</h2>
<table><tr><th>idx</th><th>stage</th><th>pass</th><th>ran</th><th class="num">ms</th>
<th class="num">rewrites</th><th>why</th></tr>
{% for p in passes %}<tr><td>{{ p.index }}</td><td>{{ p.stage }}</td><td>{{ p.label }}</td>
<td>{{ "yes" if p.ran else "no" }}</td><td class="num">{{ "%.2f"|format(p.seconds * 1000) }}</td>
<td class="num">{{ p.rewrites }}</td><td>{{ p.reason }}</td></tr>{% endfor %}
</table>
</body></html>
""")


def _dot_source(graph: Graph, colors: dict[str, str]) -> str:
    """Nodes of the compiled graph, kernels expanded into their member ops (one cluster each)."""
    lines = ["digraph G {", "rankdir=TB;", 'node [shape=box,style="rounded,filled",'
             'fontname="Helvetica",fontsize=10,fillcolor="#ffffff"];']
    producer: dict[int, str] = {}  # id(value) -> drawn node id
    q = lambda s: '"' + s.replace('"', "'") + '"'  # noqa: E731
    for v in graph.inputs:
        producer[id(v)] = f"in:{v.name}"
        lines.append(f'{q("in:" + v.name)} [label={q(v.name)},shape=ellipse];')
    edges: list[tuple[str, str]] = []
    for n in graph.nodes:
        if n.op == "Constant":
            continue
        if n.op != "GraphKernel":
            lines.append(f"{q(n.name)} [label={q(n.op + chr(10) + n.name)}];")
            for v in n.inputs:
                if id(v) in producer:
                    edges.append((producer[id(v)], n.name))
            for v in n.outputs:
                producer[id(v)] = n.name
            continue
        sub = n.subgraph
        inner: dict[int, str] = {}
        for p, outer in zip(sub.inputs, n.inputs, strict=True):
            if id(outer) in producer:
                inner[id(p)] = producer[id(outer)]
        lines.append(f"subgraph {q('cluster_' + n.name)} {{ label={q(n.name)}; "
                     f'style=filled; color="#888888"; fillcolor="{colors[n.name]}33";')
        for m in sub.nodes:
            if m.op == "Constant":
                continue
            mid = f"{n.name}/{m.name}"
            lines.append(f'{q(mid)} [label={q(m.op)},fillcolor="{colors[n.name]}"];')
            for v in m.inputs:
                if id(v) in inner:
                    edges.append((inner[id(v)], mid))
            for v in m.outputs:
                inner[id(v)] = mid
        lines.append("}")
        for outer, v in zip(n.outputs, sub.outputs, strict=True):
            if id(v) in inner:
                producer[id(outer)] = inner[id(v)]
    lines += [f"{q(a)} -> {q(b)};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines)


def _picture(graph: Graph, colors: dict[str, str]) -> str:
    drawn = sum(len(n.subgraph.nodes) if n.op == "GraphKernel" else 1 for n in graph.nodes)
    dot = shutil.which("dot")
    if dot and drawn <= MAX_DRAWN:
        try:
            svg = subprocess.run([dot, "-Tsvg"], input=_dot_source(graph, colors), text=True,
                                 capture_output=True, timeout=120, check=True).stdout
            return svg[svg.find("<svg"):]
        except (subprocess.SubprocessError, OSError):
            pass
    # readable fallback: the grouping as an indented list
    items = []
    for n in graph.nodes:
        if n.op == "GraphKernel":
            members = ", ".join(html.escape(m.op) for m in n.subgraph.nodes if m.op != "Constant")
            items.append(f'<li><span class="swatch" style="background:{colors[n.name]}"></span>'
                         f"<b>{html.escape(n.name)}</b>: {members}</li>")
        elif n.op != "Constant":
            items.append(f"<li>{html.escape(n.op)} {html.escape(n.name)}</li>")
    why = "graphviz is not installed" if not dot else f"more than {MAX_DRAWN} nodes"
    return f"<p>(picture as a list: {why})</p><ul>{''.join(items)}</ul>"


def render(res: Any) -> str:
    graph: Graph = res.graph
    ex = res.report.extra
    kernels = [n for n in graph.nodes if n.op == "GraphKernel"]
    colors = {k.name: PALETTE[i % len(PALETTE)] for i, k in enumerate(kernels)}
    by_name = {k["name"]: k for k in ex.get("kernels", [])}
    rows = [{"name": k.name, "pattern": k.attrs["pattern"], "color": colors[k.name],
             "ops": sum(1 for m in k.subgraph.nodes if m.op != "Constant"),
             "bytes": f"{by_name[k.name]['bytes_read'] + by_name[k.name]['bytes_written']:,}"
             if k.name in by_name else "", "origin": ", ".join(k.origin)} for k in kernels]
    ideal = ex.get("gm_bytes_ideal") or 0
    fused = ex.get("gm_bytes_fused", 0)
    return PAGE.render(
        name=graph.name, kernels_unfused=ex.get("kernels_unfused", "?"),
        kernels_fused=ex.get("kernels_fused", "?"), gm_unfused=f"{ex.get('gm_bytes_unfused', 0):,}",
        gm_fused=f"{fused:,}", gm_ideal=f"{ideal:,}",
        ratio=f"{fused / ideal:.3f}" if ideal else "-",
        modeled=(f"{ex['modeled_us_unfused']:.1f} us unfused, {ex['modeled_us_fused']:.1f} us "
                 f"fused on {ex['target']} (a cost model, not a measurement)")
        if "modeled_us_fused" in ex else "not available",
        nodes_before=res.report.nodes_before, nodes_after=res.report.nodes_after,
        seconds=f"{res.report.seconds * 1e3:.1f}", picture=_picture(graph, colors),
        kernels=rows, fallbacks=[f"{f['nodes']}: {f['reason']}" for f in ex.get("fallbacks", [])],
        passes=res.report.passes)


def write_html(res: Any, path: str | os.PathLike) -> str:
    atomic_write_text(path, render(res))
    return str(path)
