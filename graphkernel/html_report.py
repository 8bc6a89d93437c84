"""A self-contained HTML page for one compile: summary, a chart of every kernel's GM bytes and
modeled time, a picture of the graph with nodes coloured by the kernel that holds them, the
kernels with the user's nodes they came from, the fallbacks and the per-pass times.

The picture is an inline SVG. graphviz ``dot`` draws it when it is installed; otherwise
graphkernel's own layered layout does (nodes in rows by depth, ordered to keep edges short):
the page says which, and the terminal is told when graphviz is missing. A graph too large to
draw legibly gets the same grouping as an indented list, with the reason on the page and on
the terminal. A small script in the page lets a click on a kernel highlight its nodes and
checks, once loaded, that every kernel is on the picture and in the chart.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
from jinja2 import Environment, StrictUndefined

from graphkernel.ir import Graph
from graphkernel.outputs import write_file
from graphkernel.refusals import BY_CODE, CODEGEN

PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
           "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]
MAX_DRAWN = 1500  # nodes; larger graphs get the list view (unreadable as a picture)
NODE_W, NODE_H, GAP_X, GAP_Y = 120, 34, 18, 46  # the built-in layout's grid, in px
SWEEPS = 8  # barycentre ordering passes (down and up) of the built-in layout

PAGE = Environment(undefined=StrictUndefined, autoescape=True).from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>graphkernel: {{ name }}</title>
<script>window.gkErrors = []; window.addEventListener("error", function (e) {
  window.gkErrors.push(String(e.message)); });</script>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;
font-size:13px;text-align:left}th{background:#f3f3f3}.num{text-align:right}
.swatch{display:inline-block;width:.9em;height:.9em;border:1px solid #888;margin-right:.3em}
#picture{max-height:80vh;overflow:auto;border:1px solid #ddd}
#picture svg{height:auto}#chart svg{max-width:100%;height:auto}
#kernels tr[data-cls]{cursor:pointer}
.wide{max-width:100%;overflow-x:auto}
#kernels{table-layout:fixed;width:100%}#kernels td{overflow-wrap:anywhere}
#kernels col.k{width:22%}#kernels col.p{width:22%}#kernels col.n{width:7%}
.hl rect,.hl polygon,.hl path,rect.hl,li.hl{stroke:#d00 !important;stroke-width:3px !important;
outline:2px solid #d00}
.note{color:#555;font-size:13px}
</style></head><body>
<h1>graphkernel compile report: {{ name }}</h1>
<h2>Summary</h2>
<table>
<tr><th>kernel launches</th><td class="num">{{ kernels_unfused }} unfused</td>
<td class="num"><span id="kernel-count">{{ kernels_fused }}</span> fused
<span id="launch-kinds">({{ launch_kinds }})</span></td></tr>
<tr><th>GM bytes</th><td class="num">{{ gm_unfused }} unfused</td>
<td class="num">{{ gm_fused }} fused ({{ gm_ideal }} ideal, fused/ideal {{ ratio }})</td></tr>
<tr><th>modeled time</th><td colspan="2">{{ modeled }}</td></tr>
<tr><th>nodes</th><td colspan="2">{{ nodes_before }} before, {{ nodes_after }} after,
{{ seconds }} ms</td></tr>
</table>
<p id="selfcheck" class="note"></p>
<h2>Kernels: GM bytes and modeled time</h2>
<div id="chart">{{ chart | safe }}</div>
<h2>Graph</h2>
<p class="note" id="picture-note">{{ picture_note }}</p>
<div id="picture">{{ picture | safe }}</div>
<h2>Kernels</h2>
<p class="note">Click a kernel to highlight its nodes in the picture. Calls of vendor
operators (extern) are launches too; they are listed after the generated kernels.</p>
<div class="wide"><table id="kernels"><colgroup><col class="k"><col class="p"><col class="n">
<col class="n"><col class="n"><col></colgroup>
<tr><th>kernel</th><th>pattern</th><th class="num">ops</th>
<th class="num">GM bytes</th><th class="num">modeled us</th><th>your nodes</th></tr>
{% for k in kernels %}<tr data-kernel="{{ k.name }}" data-cls="{{ k.cls }}">
<td><span class="swatch" style="background:{{ k.color }}"></span>{{ k.name }}</td>
<td>{{ k.pattern }}</td><td class="num">{{ k.ops }}</td><td class="num">{{ k.bytes }}</td>
<td class="num">{{ k.us }}</td><td title="{{ k.origin_all }}">{{ k.origin }}</td></tr>
{% endfor %}{% for x in externs %}<tr class="extern" data-extern="{{ x.name }}">
<td>{{ x.name }}</td><td>extern {{ x.operator }}</td><td class="num">1</td>
<td class="num">{{ x.bytes }}</td><td class="num">{{ x.us }}</td>
<td title="{{ x.origin_all }}">{{ x.origin }}</td></tr>{% endfor %}
</table></div>
<h2>Fallbacks</h2>
{% if fallbacks %}<ul>{% for f in fallbacks %}<li>{{ f }}</li>{% endfor %}</ul>
{% else %}<p>none</p>{% endif %}
<h2>Refusals by code</h2>
{% if refusals %}<table id="refusals"><tr><th>code</th><th>refusal</th><th class="num">count</th>
</tr>{% for r in refusals %}<tr><td>{{ r.code }}</td><td>{{ r.meaning }}</td>
<td class="num">{{ r.count }}</td></tr>{% endfor %}</table>
<p class="note">Each fusion candidate refused, node no kernel may take and codegen fallback,
by its stable code (graphkernel patterns --codes).</p>
{% else %}<p>none</p>{% endif %}
<h2>Passes</h2>
<table><tr><th>idx</th><th>stage</th><th>pass</th><th>ran</th><th class="num">ms</th>
<th class="num">rewrites</th><th>summary / why</th></tr>
{% for p in passes %}<tr><td>{{ p.index }}</td><td>{{ p.stage }}</td><td>{{ p.label }}</td>
<td>{{ "yes" if p.ran else "no" }}</td><td class="num">{{ "%.2f"|format(p.seconds * 1000) }}</td>
<td class="num">{{ p.rewrites }}</td><td>{{ p.summary if p.ran else p.reason }}</td></tr>
{% endfor %}
</table>
<script>
(function () {
  var rows = document.querySelectorAll("#kernels tr[data-cls]");
  var drawn = 0, charted = 0;
  function visible(el) {
    var b = el.getBoundingClientRect();
    return b.width > 0 && b.height > 0;
  }
  rows.forEach(function (row) {
    var cls = row.getAttribute("data-cls");
    var shapes = document.querySelectorAll("#picture ." + cls);
    if (Array.prototype.some.call(shapes, visible)) { drawn += 1; }
    var bars = document.querySelectorAll("#chart ." + cls);
    if (Array.prototype.some.call(bars, visible)) { charted += 1; }
    row.addEventListener("click", function () {
      document.querySelectorAll(".hl").forEach(function (el) { el.classList.remove("hl"); });
      shapes.forEach(function (el) { el.classList.add("hl"); });
      if (shapes.length) { shapes[0].scrollIntoView({block: "center"}); }
    });
  });
  var check = document.getElementById("selfcheck");
  check.setAttribute("data-kernels", rows.length);
  check.setAttribute("data-drawn", drawn);
  check.setAttribute("data-charted", charted);
  check.setAttribute("data-errors", window.gkErrors.length);
  var table = document.getElementById("kernels");
  check.setAttribute("data-overflow",
                     table.getBoundingClientRect().right > window.innerWidth + 1 ? 1 : 0);
  check.textContent = rows.length + " kernels: " + drawn + " on the picture, " + charted +
    " in the chart" + (window.gkErrors.length ? "; script errors: " + window.gkErrors : "");
})();
</script>
</body></html>
""")


# ------------------------------------------------------------------- the drawn graph
@dataclass
class DrawnNode:
    id: str
    label: str  # the op
    title: str  # the node's name (a tooltip)
    kernel: int | None  # index of the kernel holding it


def drawn_graph(graph: Graph) -> tuple[list[DrawnNode], list[tuple[str, str]]]:
    """The nodes to draw (graph inputs and outputs under their names, ops outside kernels,
    every kernel's member ops; constants left out) and the edges between them."""
    nodes: list[DrawnNode] = []
    edges: list[tuple[str, str]] = []
    producer: dict[int, str] = {}  # id(value) -> drawn node id
    for v in graph.inputs:
        producer[id(v)] = f"in:{v.name}"
        nodes.append(DrawnNode(f"in:{v.name}", v.name, f"graph input {v.name}: {v.type}", None))
    kernel_index = 0
    for n in graph.nodes:
        if n.op == "Constant":
            continue
        if n.op != "GraphKernel":
            nodes.append(DrawnNode(n.name, n.op, n.name, None))
            edges += [(producer[id(v)], n.name) for v in n.inputs if id(v) in producer]
            producer.update((id(v), n.name) for v in n.outputs)
            continue
        sub = n.subgraph
        inner = {id(p): producer[id(o)] for p, o in zip(sub.inputs, n.inputs, strict=True)
                 if id(o) in producer}
        for m in sub.nodes:
            if m.op == "Constant":
                continue
            mid = f"{n.name}/{m.name}"
            nodes.append(DrawnNode(mid, m.op, f"{n.name}: {m.name}", kernel_index))
            edges += [(inner[id(v)], mid) for v in m.inputs if id(v) in inner]
            inner.update((id(v), mid) for v in m.outputs)
        producer.update((id(o), inner[id(v)]) for o, v in zip(n.outputs, sub.outputs,
                                                                 strict=True) if id(v) in inner)
        kernel_index += 1
    for name, v in graph.named_outputs():
        nodes.append(DrawnNode(f"out:{name}", name, f"graph output {name}: {v.type}", None))
        if id(v) in producer:
            edges.append((producer[id(v)], f"out:{name}"))
    return nodes, edges


# --------------------------------------------------------------------------- graphviz
def _dot_source(nodes: list[DrawnNode], edges: list[tuple[str, str]], kernels: list[str],
                colors: list[str]) -> str:
    def q(s: str) -> str:
        return '"' + s.replace("\\", "/").replace('"', "'") + '"'

    lines = ["digraph G {", "rankdir=TB;", 'node [shape=box,style="rounded,filled",'
             'fontname="Helvetica",fontsize=10,fillcolor="#ffffff"];']
    for n in nodes:
        if n.kernel is None:
            shape = ",shape=ellipse" if n.id.startswith(("in:", "out:")) else ""
            lines.append(f"{q(n.id)} [label={q(n.label)},tooltip={q(n.title)}{shape}];")
    for i, name in enumerate(kernels):
        lines.append(f"subgraph {q('cluster_' + name)} {{ label={q(name)}; "
                     f'id={q("kernel:" + name)}; class="gk-kernel k{i}"; style=filled; '
                     f'color="#888888"; fillcolor="{colors[i]}33";')
        lines += [f'{q(n.id)} [label={q(n.label)},tooltip={q(n.title)},class="gk-node k{i}",'
                  f'fillcolor="{colors[i]}"];' for n in nodes if n.kernel == i]
        lines.append("}")
    lines += [f"{q(a)} -> {q(b)};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines)


def dot_program() -> str | None:
    """graphviz's ``dot``, if installed."""
    return shutil.which("dot")


def _dot_svg(source: str) -> str | None:
    dot = dot_program()
    if dot is None:
        return None
    try:
        svg = subprocess.run([dot, "-Tsvg"], input=source, text=True, capture_output=True,
                             timeout=120, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return svg[svg.find("<svg"):]


# ------------------------------------------------------------------ built-in layout
def layout(nodes: list[DrawnNode], edges: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """A layered layout: each node in the row of its longest path from an input, rows ordered
    by the barycentre of their neighbours (sweeps down and up) with a kernel's nodes kept
    together. Returns each node's (column, row)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(n.id for n in nodes)
    dag.add_edges_from(edges)
    kernel = {n.id: n.kernel for n in nodes}
    rows = [list(gen) for gen in nx.topological_generations(dag)]
    pos: dict[str, float] = {}
    for row in rows:
        pos.update((v, float(i)) for i, v in enumerate(row))

    def order(row: list[str], neighbours: Callable[[str], Any]) -> list[str]:
        def centre(v: str) -> float:
            near = [pos[u] for u in neighbours(v)]
            return sum(near) / len(near) if near else pos[v]

        c = {v: centre(v) for v in row}
        group: dict[Any, list[float]] = {}
        for v in row:  # a kernel's nodes sit together, at their mean position
            group.setdefault(("k", kernel[v]) if kernel[v] is not None else v, []).append(c[v])
        key = {g: sum(xs) / len(xs) for g, xs in group.items()}
        return sorted(row, key=lambda v: (key[("k", kernel[v]) if kernel[v] is not None
                                              else v], c[v]))

    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        for row in rows[1:] if down else rows[-2::-1]:
            row[:] = order(row, dag.predecessors if down else dag.successors)
            pos.update((v, float(i)) for i, v in enumerate(row))
    width = max((len(r) for r in rows), default=0)
    return {v: (i + (width - len(row)) // 2, r) for r, row in enumerate(rows)
            for i, v in enumerate(row)}


def _builtin_svg(nodes: list[DrawnNode], edges: list[tuple[str, str]], kernels: list[str],
                 colors: list[str]) -> str:
    grid = layout(nodes, edges)
    cols = max((c for c, _ in grid.values()), default=0) + 1
    rows = max((r for _, r in grid.values()), default=0) + 1
    pad = 10
    x = {v: pad + c * (NODE_W + GAP_X) for v, (c, _) in grid.items()}
    y = {v: pad + r * (NODE_H + GAP_Y) for v, (_, r) in grid.items()}
    w, h = pad * 2 + cols * (NODE_W + GAP_X), pad * 2 + rows * (NODE_H + GAP_Y)
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="Helvetica,sans-serif" font-size="11">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
           'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#777"/>'
           "</marker></defs>"]
    for i, name in enumerate(kernels):  # a translucent box around each kernel's nodes
        members = [n.id for n in nodes if n.kernel == i]
        if not members:
            continue
        x0, x1 = min(x[v] for v in members) - 5, max(x[v] for v in members) + NODE_W + 5
        y0, y1 = min(y[v] for v in members) - 5, max(y[v] for v in members) + NODE_H + 5
        out.append(f'<rect class="gk-kernel k{i}" x="{x0}" y="{y0}" width="{x1 - x0}" '
                   f'height="{y1 - y0}" rx="8" fill="{colors[i]}" fill-opacity="0.25" '
                   f'stroke="#888" stroke-dasharray="4 3"><title>{e(name)}</title></rect>')
    for a, b in edges:
        x1, y1, x2, y2 = x[a] + NODE_W / 2, y[a] + NODE_H, x[b] + NODE_W / 2, y[b]
        out.append(f'<path d="M{x1},{y1} C{x1},{y1 + GAP_Y / 2} {x2},{y2 - GAP_Y / 2} {x2},{y2}"'
                   ' fill="none" stroke="#999" marker-end="url(#arrow)"/>')
    for n in nodes:
        cls = f"gk-node k{n.kernel}" if n.kernel is not None else "gk-node"
        fill = colors[n.kernel] if n.kernel is not None else "#ffffff"
        rx = NODE_H / 2 if n.id.startswith(("in:", "out:")) else 6
        label = n.label if len(n.label) <= 18 else n.label[:17] + "…"
        out.append(f'<g class="{cls}"><title>{e(n.title)}</title>'
                   f'<rect x="{x[n.id]}" y="{y[n.id]}" width="{NODE_W}" height="{NODE_H}" '
                   f'rx="{rx}" fill="{fill}" stroke="#555"/>'
                   f'<text x="{x[n.id] + NODE_W / 2}" y="{y[n.id] + NODE_H / 2 + 4}" '
                   f'text-anchor="middle">{e(label)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def _list_view(graph: Graph, colors: list[str]) -> str:
    items, i = [], 0
    for n in graph.nodes:
        if n.op == "GraphKernel":
            members = ", ".join(html.escape(m.op) for m in n.subgraph.nodes if m.op != "Constant")
            items.append(f'<li class="gk-node k{i}"><span class="swatch" style="background:'
                         f'{colors[i]}"></span><b>{html.escape(n.name)}</b>: {members}</li>')
            i += 1
        elif n.op != "Constant":
            items.append(f"<li>{html.escape(n.op)} {html.escape(n.name)}</li>")
    return f"<ul>{''.join(items)}</ul>"


def picture(graph: Graph, kernels: list[str], colors: list[str]) -> tuple[str, str, str | None]:
    """(SVG or list, what drew it, a note for the terminal or None)."""
    nodes, edges = drawn_graph(graph)
    if len(nodes) > MAX_DRAWN:
        why = (f"the graph has {len(nodes)} nodes to draw, more than {MAX_DRAWN}: shown as a "
               "list of kernels and ops instead of a picture")
        return _list_view(graph, colors), why, f"HTML report: {why}"
    svg = _dot_svg(_dot_source(nodes, edges, kernels, colors))
    if svg is not None:
        return svg, "Drawn by graphviz dot; nodes coloured by the kernel that holds them.", None
    note = ("graphviz (dot) is not installed: the report's graph is drawn by graphkernel's "
            "built-in layout (install graphviz for a tidier picture)")
    return (_builtin_svg(nodes, edges, kernels, colors),
            "Drawn by graphkernel's built-in layered layout (graphviz is not installed); "
            "nodes coloured by the kernel that holds them.", f"HTML report: {note}")


# ---------------------------------------------------------------------------- chart
def chart(rows: list[dict[str, Any]]) -> str:
    """Two bars per kernel: GM bytes (left) and modeled microseconds (right), each scaled to
    its largest value."""
    if not rows:
        return "<p>no kernels</p>"
    label_w, bar_w, row_h, top = 300, 260, 18, 22
    w, h = label_w + 2 * (bar_w + 90), top + row_h * len(rows) + 6
    max_b = max(r["gm"] for r in rows) or 1
    max_t = max(r["us_value"] for r in rows) or 1
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="Helvetica,sans-serif" font-size="11">',
           f'<text x="{label_w}" y="14" font-weight="bold">GM bytes</text>',
           f'<text x="{label_w + bar_w + 90}" y="14" font-weight="bold">modeled us</text>']
    for j, r in enumerate(rows):
        y = top + j * row_h
        gb = max(1.0, bar_w * r["gm"] / max_b)
        tb = max(1.0, bar_w * r["us_value"] / max_t)
        x2 = label_w + bar_w + 90
        out.append(f'<g class="gk-bar {r["cls"]}"><title>{e(r["name"])}: {r["bytes"]} B, '
                   f'{r["us"]} us</title>'
                   f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{e(r["name"])}</text>'
                   f'<rect x="{label_w}" y="{y + 2}" width="{gb:.1f}" height="{row_h - 5}" '
                   f'fill="{r["color"]}" stroke="#555"/>'
                   f'<text x="{label_w + gb + 4:.1f}" y="{y + 12}">{r["bytes"]}</text>'
                   f'<rect x="{x2}" y="{y + 2}" width="{tb:.1f}" height="{row_h - 5}" '
                   f'fill="{r["color"]}" stroke="#555"/>'
                   f'<text x="{x2 + tb + 4:.1f}" y="{y + 12}">{r["us"]}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- page
def render(res: Any, notes: list[str] | None = None) -> str:
    """The page; a note for the terminal (graphviz missing, graph too large) is appended to
    ``notes``."""
    graph: Graph = res.graph
    ex = res.report.extra
    kernel_nodes = [n for n in graph.nodes if n.op == "GraphKernel"]
    names = [k.name for k in kernel_nodes]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    by_name = {k["name"]: k for k in ex.get("kernels", [])}
    rows = []
    for i, k in enumerate(kernel_nodes):
        entry = by_name.get(k.name, {})
        gm = entry.get("bytes_read", 0) + entry.get("bytes_written", 0)
        us = entry.get("modeled_us")
        rows.append({"name": k.name, "pattern": k.attrs["pattern"], "color": colors[i],
                     "cls": f"k{i}", "ops": sum(1 for m in k.subgraph.nodes if m.op != "Constant"),
                     "gm": gm, "bytes": f"{gm:,}" if entry else "", "us_value": us or 0.0,
                     "us": f"{us:.2f}" if us is not None else ""} | _origin(k.origin))
    origins = {n.name: n.origin for n in graph.nodes}
    externs = [{"name": x["name"], "operator": x.get("operator", ""),
                "bytes": f"{x.get('bytes_read', 0) + x.get('bytes_written', 0):,}",
                "us": f"{x['modeled_us']:.2f}" if x.get("modeled_us") is not None else ""}
               | _origin(origins.get(x["name"], ())) for x in ex.get("externs", [])]
    svg, picture_note, terminal_note = picture(graph, names, colors)
    if terminal_note is not None and notes is not None:
        notes.append(terminal_note)
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
        seconds=f"{res.report.seconds * 1e3:.1f}", chart=chart(rows), picture=svg,
        picture_note=picture_note, kernels=rows, externs=externs,
        launch_kinds=launch_kinds(graph),
        fallbacks=[f"{f['nodes']}: {f.get('code', CODEGEN.code)} {f['reason']}"
                   for f in ex.get("fallbacks", [])],
        refusals=[{"code": c, "meaning": BY_CODE[c].meaning if c in BY_CODE else "", "count": n}
                  for c, n in ex.get("refusals", {}).items()],
        passes=res.report.passes)


MAX_ORIGIN = 12  # the user's nodes listed in a row (all of them in its tooltip)


def _origin(names: Any) -> dict[str, str]:
    names = list(names)
    shown = ", ".join(names[:MAX_ORIGIN])
    if len(names) > MAX_ORIGIN:
        shown += f" … and {len(names) - MAX_ORIGIN} more"
    return {"origin": shown, "origin_all": ", ".join(names)}


def launch_kinds(graph: Graph) -> str:
    """The fused graph's launches by kind (generated vector/cube/mix kernels, extern calls of
    vendor operators, other ops)."""
    from graphkernel.codegen.traffic import launches

    kinds: dict[str, int] = {}
    for k in launches(graph):
        kinds[k["kind"]] = kinds.get(k["kind"], 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"


def write_html(res: Any, path: str | os.PathLike, notes: list[str] | None = None) -> str:
    """Write the page; terminal notes (graphviz missing, graph too large) go to ``notes``."""
    write_file(path, render(res, notes).encode())
    return str(path)
