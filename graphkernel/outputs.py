"""Where graphkernel writes, and how: only inside the folder the user gave, each file whole.

Every writer goes through this module:

- ``file_name(name)`` is the one sanitizer for file names derived from a graph, node,
  kernel or pass name: such a name never becomes a path (``../x``, ``/etc``, NUL, escapes).
- ``check_dir`` / ``check_file`` check an output path the user gave, before any work: an
  unwritable or invalid path is one ``OutputError`` naming the option and the path.
- ``Folder(root).path("kernels", name)`` joins safe names under ``root`` and refuses a
  result outside it (a symbolic link inside ``root`` pointing elsewhere included).
- ``write_file(path, data)`` writes a temporary file in the target folder and renames it
  into place, so a file appears whole or not at all.
- ``with transaction():`` holds every write back until the block succeeds; when it fails,
  none of its files appears (a command writing several outputs is all or nothing).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from graphkernel.errors import OutputError, printable

MAX_FILE_NAME = 100  # characters of a sanitized name, leaving room for suffixes
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_name(name: str) -> str:
    """The file name for a graph/node/kernel/pass name: only ``[A-Za-z0-9._-]``, not starting
    with ``.`` or ``-``, at most ``MAX_FILE_NAME`` characters. A name that had to change
    gets a short hash of the original, so two different names never share a file."""
    safe = _UNSAFE.sub("_", name).lstrip(".-")
    if name and safe == name and len(name) <= MAX_FILE_NAME:
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[:MAX_FILE_NAME - 9] or '_'}-{digest}"


def _safe_component(part: str) -> bool:
    return bool(part) and len(part) <= 200 and not _UNSAFE.search(part) \
        and not part.startswith((".", "-"))


# ----------------------------------------------------------- checks before work
def _as_path(path: str | os.PathLike, option: str) -> Path:
    text = os.fspath(path)
    if not text:
        raise OutputError(f"{option}: the path is empty")
    if "\0" in text:
        raise OutputError(f"{option} {printable(text)}: a path cannot contain a NUL byte")
    return Path(text)


def _probe(folder: Path, option: str, path: Path) -> None:
    """Create and remove a file in ``folder``: the one test of writability that holds for
    every file system and user (root included)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".graphkernel-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise OutputError(f"{option} {printable(str(path))}: cannot write in "
                          f"{printable(str(folder))} ({e.strerror or e})") from None


def check_dir(path: str | os.PathLike, option: str) -> Path:
    """An output folder: an existing writable folder, or one that can be created."""
    p = _as_path(path, option)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{option} {printable(str(p))}: is a file, not a folder")
    _check_folder(p, option, p)
    return p


def check_file(path: str | os.PathLike, option: str) -> Path:
    """An output file: not a folder, in a folder that exists (or can be created) and is
    writable."""
    p = _as_path(path, option)
    if p.is_dir() or p.name in ("", ".", ".."):
        raise OutputError(f"{option} {printable(str(p))}: is a folder; give a file name")
    _check_folder(p.parent, option, p)
    return p


def _check_folder(folder: Path, option: str, shown: Path) -> None:
    """``folder`` exists as a writable folder, or its nearest existing ancestor is one."""
    base = folder
    while not base.exists():
        if base.is_symlink():
            raise OutputError(f"{option} {printable(str(shown))}: {printable(str(base))} is a "
                              "broken symbolic link")
        base = base.parent
    if not base.is_dir():
        raise OutputError(f"{option} {printable(str(shown))}: {printable(str(base))} is a "
                          "file, not a folder")
    _probe(base, option, shown)


# --------------------------------------------------------------- writing
class Folder:
    """Writes under ``root`` only. ``immediate`` writes bypass a transaction (dumps, which
    should survive the failure they help to explain)."""

    def __init__(self, root: str | os.PathLike, immediate: bool = False) -> None:
        self.root = Path(root)
        self.immediate = immediate

    def path(self, *parts: str) -> Path:
        """``root/part/...``; each part a safe file name (see ``file_name``), and the result
        inside ``root`` once symbolic links are resolved."""
        comps = [c for part in parts for c in str(part).split("/")]
        for c in comps:
            if not _safe_component(c):
                raise OutputError(f"{printable(str(self.root))}: {printable(c)!r} is not a "
                                  "safe file name (names go through outputs.file_name)")
        target = self.root.joinpath(*comps)
        root = os.path.realpath(self.root)
        parent = os.path.realpath(target.parent)
        if os.path.commonpath([root, parent]) != root:
            raise OutputError(f"{printable(str(target))}: would be written outside "
                              f"{printable(str(self.root))} (a symbolic link leads to "
                              f"{printable(parent)}); remove the link")
        return target

    def write_bytes(self, rel: str, data: bytes) -> Path:
        return write_file(self.path(rel), data, immediate=self.immediate)

    def write_text(self, rel: str, text: str) -> Path:
        return self.write_bytes(rel, text.encode())


@dataclass
class _Stage:
    pending: list[tuple[str, Path]] = field(default_factory=list)
    made_dirs: list[Path] = field(default_factory=list)


_STAGE: contextvars.ContextVar[_Stage | None] = contextvars.ContextVar("gk_stage", default=None)


def _make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the ones created, outermost first."""
    missing = []
    q = folder
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    folder.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


# SHA-256 of what this process last wrote to each file (by real path): the output folder's
# manifest records them, so a later run removes a file only while it still holds that.
_DIGESTS: dict[str, str] = {}


def digest_written(path: str | os.PathLike) -> str | None:
    """The SHA-256 (hex) of the data this process last wrote to ``path``, or None."""
    return _DIGESTS.get(os.path.realpath(path))


def write_file(path: str | os.PathLike, data: bytes, *, immediate: bool = False) -> Path:
    """Write ``data`` to ``path`` whole or not at all: a temporary file in the same folder,
    renamed into place (at the end of the enclosing ``transaction``, if any)."""
    path = Path(path)
    stage = None if immediate else _STAGE.get()
    tmp = ""
    try:
        made = _make_dirs(path.parent)
        if stage is not None:
            stage.made_dirs += made
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _DIGESTS[os.path.realpath(path)] = hashlib.sha256(data).hexdigest()
        if stage is not None:
            stage.pending.append((tmp, path))
        else:
            os.replace(tmp, path)
    except BaseException as e:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"{printable(str(path))}: cannot be written "
                              f"({e.strerror or e})") from e
        raise
    return path


@contextlib.contextmanager
def transaction() -> Iterator[None]:
    """Hold back every write made inside the block; put them all in place when it ends,
    or remove them (and the folders made for them) when it raises."""
    stage = _Stage()
    token = _STAGE.set(stage)
    ok = False
    try:
        yield
        ok = True
    finally:
        _STAGE.reset(token)
        if ok:
            _commit(stage)
        else:
            _discard(stage)


def _commit(stage: _Stage) -> None:
    for i, (tmp, path) in enumerate(stage.pending):
        try:
            os.replace(tmp, path)
        except OSError as e:
            _discard(_Stage(stage.pending[i:], []))
            raise OutputError(f"{printable(str(path))}: cannot be written "
                              f"({e.strerror or e})") from e


def _discard(stage: _Stage) -> None:
    for tmp, _ in stage.pending:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    for d in reversed(stage.made_dirs):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: a folder that holds anything else stays
