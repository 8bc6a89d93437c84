"""Fusion quality: kernels and GM bytes unfused / fused / ideal at opt_level 2.

    python benchmarks/fusion_quality.py [--opt-level 2] [--cnn | --transformers [model ...]]

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
(the lower bound); target: fused/ideal <= 1.10.
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
    ap.add_argument("models", nargs="*", help="with --transformers: the models (default all)")
    args = ap.parse_args()
    if args.transformers:
        return transformers_table(args.models, args.opt_level)
    if args.cnn:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            return table(cnn_exports(folder), args.opt_level)
    return table(models(), args.opt_level)


def _ratio(g, opt_level: int) -> float:
    r = graphkernel.compile(g, f"--opt_level={opt_level}", env={}).report.extra
    return r["gm_bytes_fused"] / r["gm_bytes_ideal"] if r["gm_bytes_ideal"] else 1.0


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


def transformers_table(names: list[str], opt_level: int) -> int:
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
            try:
                cells.append(_ratio(gt.export_graph(model, args, name=name), opt_level))
            except Exception as e:  # noqa: BLE001 - torch.export's own limit: listed
                cells.append(None)
                why.append(f"torch.export: {str(e).splitlines()[0][:90]}")
            cell, reason = _onnx_ratio(model, args, name, opt_level)
            cells.append(cell)
            why += [reason] if reason else []
            for key, cell in zip(worst, cells, strict=True):
                if cell is not None and cell > worst[key][0]:
                    worst[key] = (cell, name)
            shown_cells = [f"{c:.3f}" if c is not None else "-" for c in cells]
            progress.write(f"{name:<16} {shown_cells[0]:>12} {shown_cells[1]:>8}  "
                           + "; ".join(why), sys.stdout)
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


def _onnx_ratio(model, args, name: str, opt_level: int) -> tuple[float | None, str]:
    """fused/ideal of ``model``'s ONNX export, and a note: which exporter when it was the
    dynamo one, torch's reason when neither exports it."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"{name}.onnx")
            how = _onnx_export(model, args, path)
            ratio = _ratio(load_model(path), opt_level)
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
