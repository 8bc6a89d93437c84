"""An output folder graphkernel owns what it wrote into: ``manifest.json`` lists every file of a
run (paths relative to the folder) with the SHA-256 digest of what was written, so a later run
into the same folder removes exactly the previous run's files it does not write again, and
never touches anything else.

A manifest is data from disk, and the folder may be shared with someone who can write in it:

- the manifest is read within a size limit, as a regular file that is not a symbolic link;
- only plain relative paths (no '..', no absolute path) with a recorded digest are removed;
- each one is checked again when it is removed, through file descriptors: every folder on
  the way is opened relative to the one before without following a symbolic link, the file
  itself must be a regular file (not a link) whose content still has the recorded digest,
  and it is unlinked relative to its open folder. A folder swapped for a link between the
  check and the unlink is never followed; a file whose content changed is left alone and
  named.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from graphkernel import limits
from graphkernel.fileio import read_bounded
from graphkernel.outputs import digest_written, known_digest, shared_as

MANIFEST = "manifest.json"
FORMAT = "graphkernel-kernels/2"  # what write_project writes (format 1: one entry per kernel)
KNOWN_FORMATS = ("graphkernel-kernels/1", FORMAT)

# Called with (folder fd, file name) just before an unlink: a test's stand-in for another
# user acting between graphkernel's check and its unlink.
BEFORE_UNLINK: list[Callable[[int, str], None]] = []


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


def file_entries(folder: str | os.PathLike, files: Iterable[str | os.PathLike]
                 ) -> dict[str, Any]:
    """The manifest's ``files`` (see ``listed``) and ``digests``: the SHA-256 of what this
    process wrote to each of them (the manifest itself, written last, has none); and, when
    some of them are a model's data files shared rather than copied (``outputs.share_file``),
    ``data_sources``: for each, the file it is (a hard link to, or a copy of), its identity
    and digest (a later run sharing the same unchanged file does not read it again to
    digest it)."""
    names = listed(folder, files)
    root = Path(folder)
    digests, sources = {}, {}
    for name in names:
        d = digest_written(root / name)
        if d is not None:
            digests[name] = d
        shared = shared_as(root / name)
        if shared is not None:
            sources[name] = shared.entry()
    return {"files": names, "digests": digests} | ({"data_sources": sources} if sources else {})


class Previous(NamedTuple):
    """A file the previous run's manifest lists, with the digest it recorded (or None)."""

    name: str
    digest: str | None


@dataclass
class Cleanup:
    """What ``remove_stale`` did: the files removed, and those left because their content
    is no longer what graphkernel wrote (or no digest says what it wrote)."""

    removed: list[Path] = field(default_factory=list)
    changed: list[Path] = field(default_factory=list)
    unrecorded: list[Path] = field(default_factory=list)


def previous_outputs(folder: str | os.PathLike) -> list[Previous]:
    """The files the previous run listed in ``folder/manifest.json`` that are candidates for
    removal (plain relative paths inside the folder, regular files now); [] when there is no
    readable graphkernel manifest. Each is checked again when it is removed."""
    from graphkernel.pipeline import collector_paused

    root = Path(folder)
    try:
        with collector_paused():  # (a large manifest is many small objects, none garbage)
            doc = json.loads(read_bounded(root / MANIFEST, limits.MAX_MANIFEST_BYTES,
                                          follow_links=False))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(doc, dict) or doc.get("format") not in KNOWN_FORMATS:
        return []
    names = doc.get("files")
    if not isinstance(names, list):  # a manifest from before the file list: its kernel sources
        names = [f"kernels/{s}" for k in doc.get("kernels", []) if isinstance(k, dict)
                 for s in k.get("sources", []) if isinstance(s, str)]
        names += ["kernels/CMakeLists.txt", MANIFEST] if names else []
    digests = doc.get("digests")
    digests = digests if isinstance(digests, dict) else {}
    _remember_sources(doc.get("data_sources"), digests)
    out = []
    for name in names:
        if not isinstance(name, str) or not _plain(name):
            continue
        d = digests.get(name)
        try:
            with _parent_fd(root, name) as (_, st):
                if st is None or not stat.S_ISREG(st.st_mode):
                    continue
        except OSError:
            continue
        out.append(Previous(name, d if isinstance(d, str) else None))
    return out


def _remember_sources(sources: Any, digests: dict) -> None:
    """The digests a previous run recorded of the data files it shared, by their identity:
    the same unchanged file is not read again to digest it. (A record naming a wrong digest
    makes that file's later cleanup leave it, nothing more: see ``remove_stale``.)"""
    if not isinstance(sources, dict):
        return
    for name, entry in sources.items():
        if not isinstance(entry, dict):
            continue
        ident, sha = entry.get("identity"), entry.get("sha256")
        if isinstance(ident, list) and len(ident) == 4 \
                and all(type(i) is int and i >= 0 for i in ident) \
                and isinstance(sha, str) and _SHA256.fullmatch(sha) and digests.get(name) == sha:
            known_digest(tuple(ident), sha)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _plain(name: str) -> bool:
    """A relative path without '..', drive or backslash tricks."""
    pp = PurePosixPath(name)
    return (bool(name) and "\\" not in name and "\0" not in name and not pp.is_absolute()
            and ":" not in name and all(p not in ("", ".", "..") for p in name.split("/")))


@contextlib.contextmanager
def _parent_fd(root: Path, name: str):
    """Yield (fd of the folder holding ``name``, lstat of the entry or None), reaching the
    folder from ``root`` one component at a time without following a symbolic link."""
    parts = name.split("/")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))]
    try:
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                               dir_fd=fds[-1]))
        try:
            st = os.stat(parts[-1], dir_fd=fds[-1], follow_symlinks=False)
        except FileNotFoundError:
            st = None
        yield fds[-1], st
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _digest_at(dir_fd: int, entry: str, expect: os.stat_result) -> str | None:
    """SHA-256 of the regular file ``entry`` in ``dir_fd`` if it is still the file
    ``expect`` describes (opened without following a link), else None."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expect.st_dev,
                                                                      expect.st_ino):
            return None
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        return h.hexdigest()


def remove_stale(folder: str | os.PathLike, previous: Iterable[Previous],
                 written: Iterable[str | os.PathLike]) -> Cleanup:
    """Remove the previous run's files this run did not write again (and folders they leave
    empty), each re-checked at the moment it is removed (see the module docstring)."""
    root = Path(folder)
    keep = set(listed(root, written))
    done = Cleanup()
    for prev in previous:
        if prev.name in keep or not _plain(prev.name):
            continue
        shown = root / prev.name
        if prev.digest is None:
            done.unrecorded.append(shown)
            continue
        entry = prev.name.rsplit("/", 1)[-1]
        try:
            with _parent_fd(root, prev.name) as (dir_fd, st):
                if st is None or not stat.S_ISREG(st.st_mode):
                    continue
                if _digest_at(dir_fd, entry, st) != prev.digest:
                    done.changed.append(shown)
                    continue
                for hook in BEFORE_UNLINK:
                    hook(dir_fd, entry)
                now = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) \
                        or not stat.S_ISREG(now.st_mode):
                    done.changed.append(shown)
                    continue
                os.unlink(entry, dir_fd=dir_fd)
        except OSError:
            continue  # gone, or a folder on the way is no folder (a link): nothing to remove
        done.removed.append(shown)
        _remove_empty_parents(root, prev.name)
    return done


def _remove_empty_parents(root: Path, name: str) -> None:
    """rmdir the folders of ``name`` below ``root`` that are now empty, deepest first, each
    relative to its open parent (rmdir never follows a link and fails on a non-empty one)."""
    parts = name.split("/")[:-1]
    while parts:
        try:
            with _parent_fd(root, "/".join(parts)) as (dir_fd, st):
                if st is None or not stat.S_ISDIR(st.st_mode):
                    return
                os.rmdir(parts[-1], dir_fd=dir_fd)
        except OSError:  # not empty (or not there, or no folder): it stays
            return
        parts = parts[:-1]
