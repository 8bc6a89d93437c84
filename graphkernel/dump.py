"""Dumps: the effective flags, the IR after each pass, reports — written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graphkernel.fileio import atomic_write_text


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str, allow_nan=True) + "\n"


class Dumper:
    """Writes into one directory; every file appears whole or not at all."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.written: list[Path] = []

    def write_text(self, name: str, text: str) -> Path:
        path = atomic_write_text(self.dir / name, text if text.endswith("\n") else text + "\n")
        self.written.append(path)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, to_json(obj))
