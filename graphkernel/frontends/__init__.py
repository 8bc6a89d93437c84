"""Frontends: models in, graphs out, and back. graphkernel's own JSON/YAML format
(``json_format``), ONNX import and export (``onnx``, ``onnx_export``, with the conformance
runner ``onnx_conformance``) and, with torch installed, FX graphs from torch.compile and
torch.export (``fx``). ``load_model`` picks the reader by file type."""

from __future__ import annotations

import os
from pathlib import Path

from graphkernel.errors import FormatError
from graphkernel.ir import Graph

MODEL_SUFFIXES = (".json", ".yaml", ".yml", ".onnx")


def load_model(path: str | os.PathLike) -> Graph:
    """Load a graph from a .json/.yaml/.yml graph file or an .onnx model."""
    p = Path(path)
    if p.suffix == ".onnx":
        from graphkernel.frontends.onnx import import_onnx_file

        return import_onnx_file(p)
    if p.suffix in (".json", ".yaml", ".yml"):
        from graphkernel.frontends.json_format import load_graph

        return load_graph(p)
    raise FormatError(f"{p}: unknown model type {p.suffix or '(no extension)'!r} "
                      f"(accepted: {', '.join(MODEL_SUFFIXES)})")
