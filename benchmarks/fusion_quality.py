"""Fusion quality: kernels and GM bytes unfused / fused / ideal at opt_level 2.

    python benchmarks/fusion_quality.py [--opt-level 2] [--cnn | --transformers [--excess N]
                                         [model ...]]

Models: the bundled examples and the ONNX light models that ship in the onnx
package; with ``--cnn``, the CNN zoo (examples/cnn_models.py) exported to ONNX in inference
mode (``torch.onnx.export``, opset 17, into a temporary folder) instead; with
``--transformers``, the transformer zoo of ``vs_inductor.py`` (every family, with the
mixture-of-experts and state-space models) through both export paths: torch.export
(``graphkernel.torch.export_graph``) and an ONNX export (``torch.onnx.export``, opset 17;
where that TorchScript exporter has no conversion -- grouped-query attention -- torch's dynamo
exporter, which needs ``onnxscript``: the ``export`` extra), where torch can export the model
(a model neither exporter converts is listed with torch's reasons).
"ideal" puts every connected group of cluster-able ops in one kernel, ignoring every limit
(the lower bound: ``codegen/traffic.py`` ``ideal``, one definition for every model, each of
its launches counted by the rules the fused launches are counted by); target: fused/ideal
<= 1.10 (<= 1.05 on the transformer exports).

    python benchmarks/fusion_quality.py --transformers --excess 5 swin siglip

``--excess N`` lists under each row the N groups of ideal kernels whose fused launches move
the most bytes over them (a fused launch and the ideal kernels its nodes belong to are one
group): which kernels carry a ratio above 1, and with which ops.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphkernel  # noqa: E402
from graphkernel import progress  # noqa: E402
from graphkernel.frontends import load_model  # noqa: E402

LIGHT = ["resnet50", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet",
         "vgg19"]


def models() -> list[tuple[str, str]]:
    out = [(p.stem, str(p)) for p in sorted((ROOT / "examples").glob("*.json"))]
    try:
        import onnx

        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        out += [(name, os.path.join(light, f"light_{name}.onnx")) for name in LIGHT]
    except ImportError:
        print("(onnx not installed: ONNX light models skipped)")
    return out


def cnn_exports(folder: str) -> list[tuple[str, str]]:
    """The CNN zoo exported to ONNX files in ``folder`` (inference: batch norm with its
    running statistics, the weights initializers)."""
    import warnings

    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    import cnn_models

    out = []
    for name, (build, inputs) in cnn_models.builders().items():
        path = os.path.join(folder, f"{name}.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(build(), inputs(), path, dynamo=False, opset_version=17)
        out.append((name, path))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opt-level", type=int, default=2)
    ap.add_argument("--cnn", action="store_true",
                    help="the CNN zoo exported to ONNX instead of the bundled models")
    ap.add_argument("--transformers", action="store_true",
                    help="the transformer zoo through torch.export and ONNX exports")
    ap.add_argument("--excess", type=int, metavar="N", default=0,
                    help="with --transformers: under each model's row, the N ideal kernels "
                         "whose fused kernels move the most bytes over them, and why")
    ap.add_argument("models", nargs="*", help="with --transformers: the models (default all)")
    args = ap.parse_args()
    if args.transformers:
        return transformers_table(args.models, args.opt_level, args.excess)
    if args.cnn:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            return table(cnn_exports(folder), args.opt_level)
    return table(models(), args.opt_level)


def _ratio(g, opt_level: int, excess: int = 0, lines: list[str] | None = None) -> float:
    """fused/ideal of ``g``; with ``excess``, the lines of ``excess_lines`` go to ``lines``."""
    result = graphkernel.compile(g, f"--opt_level={opt_level}", env={})
    r = result.report.extra
    if excess and lines is not None:
        lines += excess_lines(g, result, opt_level, excess)
    return r["gm_bytes_fused"] / r["gm_bytes_ideal"] if r["gm_bytes_ideal"] else 1.0


# the passes after the cluster pass: without them the graph is the one the ideal is taken on
_AFTER_CLUSTER = "split,recompute,parallel_fusion,window_fusion,promote_precision,matmul_group"


def excess_lines(g, result, opt_level: int, top: int) -> list[str]:
    """The ``top`` groups of ideal kernels (``traffic.ideal``'s launches, on the graph the
    cluster pass saw) whose fused launches move the most bytes over them. A fused launch and
    every ideal launch one of its nodes belongs to (by node name, else by the source node it
    came from) are one group, joined transitively: so a region cut in two shows the bytes of
    the cut, and a product the ideal runs alone shows with the kernel that took it."""
    from graphkernel.codegen import targets, traffic
    from graphkernel.fusion import cluster_ops, reason_checker
    from graphkernel.ops import PRODUCT_OPS

    before = graphkernel.compile(g, f"--opt_level={opt_level} --disable_pass={_AFTER_CLUSTER}",
                                 env={})
    graph = before.graph
    why_not = reason_checker(cluster_ops(before.config), before.config)
    ok = {id(n) for n in graph.nodes if why_not(n) is None}
    vector = {id(n) for n in graph.nodes if id(n) in ok and n.op not in PRODUCT_OPS}
    detail: list = []
    traffic.ideal(graph, vector, ok - vector, targets.load(before.config.target), None, detail)
    home = {n.name: k for k, (members, _) in enumerate(detail) for n in members}
    by_origin: dict[str, set[int]] = {}
    for k, (members, _) in enumerate(detail):
        for n in members:
            for o in n.origin:
                by_origin.setdefault(o, set()).add(k)
    parent = list(range(len(detail)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    launches: list[tuple[set[int], int, str]] = []
    for n, r, w in traffic.launch_io(result.graph):
        members = list(n.subgraph.nodes) if n.op == "GraphKernel" else [n]
        ks = {home[m.name] for m in members if m.name in home}
        ks |= {k for m in members if m.name not in home and m.op != "Constant"
               for o in m.origin for k in by_origin.get(o, ())}
        for k in ks:
            parent[root(k)] = root(next(iter(ks)))
        launches.append((ks, r + w, n.name))
    groups: dict[int, list] = {}
    for k, (_, b) in enumerate(detail):
        groups.setdefault(root(k), [0, b, [], set()])[1:2] = [groups.get(root(k), [0, 0])[1] + b]
        groups[root(k)][3] |= {m.op for m in detail[k][0] if m.op != "Constant"}
    stray = []
    for ks, size, name in launches:
        if not ks:
            stray.append((size, name))
            continue
        entry = groups[root(next(iter(ks)))]
        entry[0] += size
        entry[2].append(name)
    rows = sorted(((f - b, f, b, names, kinds) for f, b, names, kinds in groups.values()),
                  key=lambda row: -row[0])
    out = []
    for extra, f, b, names, kinds in rows[:top]:
        if extra <= 0:
            break
        out.append(f"    +{extra:>9,} B  fused {f:,} B in {len(names)} launch(es) "
                   f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}), ideal "
                   f"{b:,} B; ops {', '.join(sorted(kinds)[:12])}")
    for size, name in sorted(stray, reverse=True)[:top]:
        out.append(f"    +{size:>9,} B  {name}: a launch of no node of the ideal's graph")
    return out


@contextlib.contextmanager
def _stdout_silenced():
    """The exporter prints the whole TorchScript graph on a failure, from C++ to the process's
    standard output: file descriptor 1 goes to /dev/null meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def transformers_table(names: list[str], opt_level: int, excess: int = 0) -> int:
    """fused/ideal GM bytes of each transformer-zoo model's inference graph, exported by
    torch.export and by the ONNX exporter."""
    import logging
    import warnings

    import graphkernel.torch as gt

    sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "benchmarks")]
    import moe_ssm_models
    from export_models import select

    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)
    zoo = (select([], more=True) or {}) | moe_ssm_models.builders()
    unknown = sorted(set(names) - set(zoo))
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)} (accepted: {', '.join(zoo)})",
              file=sys.stderr)
        return 2
    print(f"{'model':<16} {'torch.export':>12} {'ONNX':>8}  (fused/ideal GM bytes, "
          f"opt_level {opt_level})")
    worst: dict[str, tuple[float, str]] = {"torch.export": (0.0, ""), "ONNX": (0.0, "")}
    todo = [n for n in zoo if not names or n in names]
    with progress.task("models", len(todo)) as shown, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in todo:
            shown.describe(name)
            build, inputs = zoo[name]
            model, args = build(), inputs()
            args = args if isinstance(args, tuple) else (args,)
            cells, why = [], []
            lines: dict[str, list[str]] = {"torch.export": [], "ONNX": []}
            try:
                cells.append(_ratio(gt.export_graph(model, args, name=name), opt_level,
                                    excess, lines["torch.export"]))
            except Exception as e:  # noqa: BLE001 - torch.export's own limit: listed
                cells.append(None)
                why.append(f"torch.export: {str(e).splitlines()[0][:90]}")
            cell, reason = _onnx_ratio(model, args, name, opt_level, excess, lines["ONNX"])
            cells.append(cell)
            why += [reason] if reason else []
            for key, cell in zip(worst, cells, strict=True):
                if cell is not None and cell > worst[key][0]:
                    worst[key] = (cell, name)
            shown_cells = [f"{c:.3f}" if c is not None else "-" for c in cells]
            progress.write(f"{name:<16} {shown_cells[0]:>12} {shown_cells[1]:>8}  "
                           + "; ".join(why), sys.stdout)
            for key, more in lines.items():
                if more:
                    progress.write(f"  {key}: bytes over the ideal", sys.stdout)
                    for line in more:
                        progress.write(line, sys.stdout)
            shown.advance()
    for key, (ratio, name) in worst.items():
        print(f"worst fused/ideal, {key}: {ratio:.3f} ({name}; target <= 1.05)")
    return 0


def _onnx_export(model, args, path: str) -> str:
    """Export ``model`` to ``path`` with the TorchScript exporter (opset 17) or, where it has
    no conversion (grouped-query ``scaled_dot_product_attention``), with torch's dynamo
    exporter when ``onnxscript`` is installed. Returns which exporter wrote the file."""
    import torch

    try:
        with _stdout_silenced():
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17)
        return "torchscript"
    except Exception as first:  # noqa: BLE001 - the dynamo exporter may still convert it
        try:
            import onnxscript  # noqa: F401 - the dynamo exporter needs it
        except ImportError:
            raise first from None
        try:
            with _stdout_silenced(), contextlib.redirect_stderr(io.StringIO()):
                torch.onnx.export(model, args, path, dynamo=True, external_data=False)
        except Exception as second:  # noqa: BLE001 - both exporters' reasons are listed
            raise RuntimeError(f"{str(first).splitlines()[0][:70]}; dynamo exporter: "
                               f"{_first_line(second)[:90]}") from None
        return "dynamo"


def _first_line(e: Exception) -> str:
    """The dynamo exporter's cause: its exception summary's first entry, else the first line."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    cause = next((x.split(">: ", 1)[1] for x in lines if x.startswith("<class") and ">: " in x),
                 None)
    return cause or (lines[0] if lines else type(e).__name__)


def _onnx_ratio(model, args, name: str, opt_level: int, excess: int = 0,
                lines: list[str] | None = None) -> tuple[float | None, str]:
    """fused/ideal of ``model``'s ONNX export, and a note: which exporter when it was the
    dynamo one, torch's reason when neither exports it."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"{name}.onnx")
            how = _onnx_export(model, args, path)
            ratio = _ratio(load_model(path), opt_level, excess, lines)
    except Exception as e:  # noqa: BLE001 - the exporter's own limit: listed
        return None, f"ONNX: {str(e).splitlines()[0][:170]}"
    return ratio, ("ONNX by torch's dynamo exporter" if how == "dynamo" else "")


def table(todo: list[tuple[str, str]], opt_level: int) -> int:
    print(f"{'model':<20} {'kernels':>15} {'GM MB unfused':>14} {'fused':>9} {'ideal':>9} "
          f"{'fused/ideal':>11}")
    worst = 0.0
    progress.auto()  # on a terminal: which model, which pass
    with progress.task("models", len(todo)) as shown:
        for name, path in todo:
            shown.describe(name)
            g = load_model(path)
            r = graphkernel.compile(g, f"--opt_level={opt_level}", env={}).report.extra
            ratio = r["gm_bytes_fused"] / r["gm_bytes_ideal"] if r["gm_bytes_ideal"] else 1.0
            worst = max(worst, ratio)
            mb = 1 / 2**20
            progress.write(f"{name:<20} {r['kernels_unfused']:>6} -> {r['kernels_fused']:<6} "
                           f"{r['gm_bytes_unfused'] * mb:>14.2f} "
                           f"{r['gm_bytes_fused'] * mb:>9.2f} {r['gm_bytes_ideal'] * mb:>9.2f} "
                           f"{ratio:>11.3f}", sys.stdout)
            shown.advance()
    print(f"worst fused/ideal: {worst:.3f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
