"""Dumps: the effective flags, the IR after each pass, reports — written atomically."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from graphkernel import json_text
from graphkernel.outputs import Folder


def to_json(obj: Any) -> str:
    return json_text.dumps(obj, indent=2, default=str) + "\n"  # json.dumps's text, faster


def report_document(report: Any) -> dict[str, Any]:
    """``report.to_dict()`` for ``as_json`` to encode: its fields (its figures as the
    top-level entries ``extra`` names) as they are, without the deep copy
    ``dataclasses.asdict`` makes of every record first."""
    doc = {f.name: getattr(report, f.name) for f in fields(report)
           if f.name not in ("extra", "figures")}
    return doc | report.extra


def as_json(obj: Any) -> Any:
    """``to_json``'s ``default``, also taking a dataclass (as the dict of its fields): the
    encoder then writes what ``dataclasses.asdict`` would have made of it, from the object."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}
    return str(obj)


class Dumper:
    """Writes into one directory; every file appears whole or not at all. Dumps are written
    at once, outside any transaction, so that they outlive the failure they help explain."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.folder = Folder(self.dir, immediate=True)
        self.written: list[Path] = []

    def write_text(self, name: str, text: str) -> Path:
        """Write ``name`` (a safe file name: see ``outputs.file_name``) in the directory."""
        path = self.folder.write_text(name, text if text.endswith("\n") else text + "\n")
        self.written.append(path)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, to_json(obj))
