"""An output folder graphkernel owns what it wrote into: ``manifest.json`` lists every file of a
run (paths relative to the folder), so a later run into the same folder removes exactly the
previous run's files it does not write again, and never touches anything else.

A manifest is data from disk: only plain relative paths that stay inside the folder (after
symlinks) and name regular files are ever removed; anything else in it is ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
FORMAT = "graphkernel-kernels/2"  # what write_project writes (format 1: one entry per kernel)
KNOWN_FORMATS = ("graphkernel-kernels/1", FORMAT)


def listed(folder: str | os.PathLike, files: Iterable[str | os.PathLike]) -> list[str]:
    """The files inside ``folder``, as the manifest lists them (sorted, relative, '/'-separated);
    files elsewhere (an --html page outside the folder) are not the folder's."""
    root = Path(folder).resolve()
    out = set()
    for f in files:
        p = Path(f).resolve()
        if p.is_relative_to(root):
            out.add(p.relative_to(root).as_posix())
    return sorted(out)


def previous_outputs(folder: str | os.PathLike) -> list[Path]:
    """The files the previous run listed in ``folder/manifest.json`` that are safe to remove
    (inside the folder, regular files); [] when there is no readable graphkernel manifest."""
    root = Path(folder)
    try:
        doc = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("format") not in KNOWN_FORMATS:
        return []
    names = doc.get("files")
    if not isinstance(names, list):  # a manifest from before the file list: its kernel sources
        names = [f"kernels/{s}" for k in doc.get("kernels", []) if isinstance(k, dict)
                 for s in k.get("sources", []) if isinstance(s, str)]
        names += ["kernels/CMakeLists.txt", MANIFEST] if names else []
    top = root.resolve()
    out = []
    for name in names:
        if not isinstance(name, str) or not _plain(name):
            continue
        p = root / name
        if p.is_file() and not p.is_symlink() and p.resolve().is_relative_to(top):
            out.append(p)
    return out


def _plain(name: str) -> bool:
    """A relative path without '..', drive or backslash tricks."""
    pp = PurePosixPath(name)
    return (bool(name) and "\\" not in name and not pp.is_absolute() and ":" not in name
            and ".." not in pp.parts)


def remove_stale(folder: str | os.PathLike, previous: Iterable[Path],
                 written: Iterable[str | os.PathLike]) -> list[Path]:
    """Remove the previous run's files this run did not write again (and folders they leave
    empty); return what was removed."""
    root = Path(folder).resolve()
    keep = {Path(w).resolve() for w in written}
    removed = []
    for p in previous:
        if p.resolve() in keep or not p.is_file():
            continue
        p.unlink()
        removed.append(p)
        parent = p.parent.resolve()
        while parent != root and parent.is_relative_to(root) and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return removed
