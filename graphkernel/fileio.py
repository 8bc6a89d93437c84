"""Reading data files within limits (JSON/YAML documents, .npz inputs), and the
compatibility names of the atomic writers (which live in ``graphkernel.outputs``)."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from graphkernel import limits
from graphkernel.errors import ExecutionError, FormatError
from graphkernel.outputs import write_file


# ---------------------------------------------------------------- documents
class FileTooLarge(OSError):
    """A data file is larger than its documented limit."""


class DocumentError(Exception):
    """A JSON/YAML document cannot be used: a syntax error (``syntax``) or a breached limit.
    ``pos`` is ``":line:col"`` when known."""

    def __init__(self, detail: str, syntax: bool, pos: str = "") -> None:
        super().__init__(detail)
        self.detail, self.syntax, self.pos = detail, syntax, pos


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``; past ``limit`` bytes it stops reading (``/dev/zero`` included)
    and raises FileTooLarge."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"larger than the {limit:,}-byte limit")
    return data


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only: no tags that build Python objects), counting
    nesting depth and alias references as the document is composed."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > limits.MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise DocumentError(f"more than {limits.MAX_YAML_ALIASES} aliases",
                                    False, f":{mark.line + 1}:{mark.column + 1}")
        self.depth += 1
        try:
            if self.depth > limits.MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise DocumentError(f"lists and objects are nested more than "
                                    f"{limits.MAX_DEPTH} deep", False,
                                    f":{mark.line + 1}:{mark.column + 1}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def parse_document(data: bytes, yaml_syntax: bool) -> Any:
    """Parse JSON or YAML bytes into plain data, within the nesting and alias limits."""
    fmt = "YAML" if yaml_syntax else "JSON"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"not UTF-8 text (byte {e.start})", True) from None
    max_values = None
    try:
        if yaml_syntax:
            loader = _LimitedLoader(text)
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
            max_values = limits.MAX_YAML_VALUES if loader.aliases else None
        else:
            doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DocumentError(e.msg, True, f":{e.lineno}:{e.colno}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        pos = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise DocumentError(str(getattr(e, "problem", None) or e).splitlines()[0], True,
                            pos) from None
    except RecursionError:
        raise DocumentError(f"lists and objects are nested more than {limits.MAX_DEPTH} deep",
                            False) from None
    except ValueError as e:  # e.g. an integer literal of thousands of digits
        raise DocumentError(f"{fmt} value out of range: {str(e).splitlines()[0]}", True) \
            from None
    problem = limits.check_document(doc, limits.MAX_DEPTH, max_values)
    if problem is not None:
        raise DocumentError(problem, False)
    return doc


def read_document(path: str | os.PathLike, max_bytes: int) -> Any:
    """Read and parse a JSON (``.json``) or YAML (any other suffix) file within the limits.
    Raises OSError (missing, unreadable, too large) or DocumentError."""
    p = Path(path)
    return parse_document(read_bounded(p, max_bytes), p.suffix != ".json")


# --------------------------------------------------------------------- arrays
def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ExecutionError(f"{p}: no such inputs file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, MemoryError) as e:
        raise FormatError(f"{p}: not a readable .npz file ({e}); save inputs with "
                          "numpy.savez(path, name=array, ...)") from None


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write arrays as an .npz (what numpy.savez writes); any key is allowed, even one that
    numpy.savez would take for its own parameter (``file``, ``allow_pickle``)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, value in arrays.items():
            with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
    return write_file(path, buf.getvalue())


# ----------------------------------------------------- writers (compatibility)
def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write a file whole or not at all (see ``graphkernel.outputs.write_file``)."""
    return write_file(path, data)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return write_file(path, text.encode())
