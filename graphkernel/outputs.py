"""Where graphkernel writes, and how: only inside the folder the user gave, each file whole.

Every writer goes through this module:

- ``file_name(name)`` is the one sanitizer for file names derived from a graph, node,
  kernel or pass name: such a name never becomes a path (``../x``, ``/etc``, NUL, escapes).
- ``check_dir`` / ``check_file`` check an output path the user gave, before any work: an
  unwritable or invalid path is one ``OutputError`` naming the option and the path.
- ``Folder(root).path("kernels", name)`` joins safe names under ``root`` and refuses a
  result outside it (a symbolic link inside ``root`` pointing elsewhere included).
- ``write_file(path, data)`` writes a temporary file in the target folder and renames it
  into place, so a file appears whole or not at all; ``write_stream`` does the same for a
  file written piece by piece (never held whole in memory), and ``share_file`` for a file
  that is a hard link to (or, where no link can be made, a copy of) a model's data file.
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
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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

    def write_json(self, rel: str, doc: Any, default: Callable[[Any], Any] = str) -> Path:
        """``doc`` as JSON, a line per entry (``json_text.dump_lines``), and a line break:
        encoded and written a batch at a time (the text is never held whole)."""
        from graphkernel import json_text

        def put(f: BinaryIO) -> None:
            json_text.dump_lines(doc, lambda text: f.write(text.encode()), default)
            f.write(b"\n")

        return write_stream(self.path(rel), put, immediate=self.immediate)


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
    def put(f: BinaryIO) -> None:
        f.write(data)

    return _write(path, put, lambda _: hashlib.sha256(data).hexdigest(), immediate)


def write_stream(path: str | os.PathLike, write: Callable[[BinaryIO], None], *,
                 immediate: bool = False) -> Path:
    """``write_file`` for a file written piece by piece: ``write(f)`` writes into the
    temporary file (and may seek in it, as a zip writer does); the digest is taken from what
    it holds once written."""
    def digest(tmp: str) -> str:
        with open(tmp, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    return _write(path, write, digest, immediate)


def _write(path: str | os.PathLike, write: Callable[[BinaryIO], None],
           digest: Callable[[str], str], immediate: bool) -> Path:
    path = Path(path)
    with _placed(path, None if immediate else _STAGE.get()) as tmp:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.",
                                    suffix=".tmp")
        tmp.append(name)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            write(f)
        _DIGESTS[os.path.realpath(path)] = digest(name)
        _SHARED.pop(os.path.realpath(path), None)
    return path


@contextlib.contextmanager
def _placed(path: Path, stage: Any) -> Iterator[list[str]]:
    """Make ``path``'s folders (recorded with ``stage``), let the block make the temporary
    file that will become ``path`` (its name appended to the list yielded), then put it in
    place: now, or when ``stage``'s transaction ends. On any failure the temporary file is
    removed, and an OSError becomes one OutputError naming ``path``."""
    tmp: list[str] = []
    try:
        made = _make_dirs(path.parent)
        if stage is not None:
            stage.made_dirs += made
        yield tmp
        if stage is not None:
            stage.pending.append((tmp[0], path))
        else:
            _replace(tmp[0], path)
    except BaseException as e:
        if tmp and os.path.lexists(tmp[0]):
            os.unlink(tmp[0])
        if isinstance(e, OSError):
            raise OutputError(f"{printable(str(path))}: cannot be written "
                              f"({e.strerror or e})") from e
        raise


# ------------------------------------------------------------ a model's data, shared
@dataclass(frozen=True)
class Shared:
    """How an output file holds a model's data file: the source (absolute path), its
    identity when it was read (device, inode, size, modification time in ns), the SHA-256 of
    its content, and whether the output is a hard link to it (else a copy)."""

    source: str
    identity: tuple[int, int, int, int]
    sha256: str
    linked: bool

    def entry(self) -> dict:
        """What an output folder's manifest records of it (``graphkernel.outdir``)."""
        return {"source": self.source, "sha256": self.sha256,
                "how": "hard link" if self.linked else "copy",
                "identity": list(self.identity)}


# output file (real path) -> Shared, for the files ``share_file`` made
_SHARED: dict[str, Shared] = {}
# identity of a data file -> the SHA-256 of its content, computed once in this process or
# recorded by a previous run in the output folder's manifest (see ``known_digest``)
_KNOWN: dict[tuple[int, int, int, int], str] = {}
# identity of a data file -> its digest being computed on a thread of its own (``digest_soon``)
_PENDING: dict[tuple[int, int, int, int], _Digest] = {}


def shared_as(path: str | os.PathLike) -> Shared | None:
    """How ``path`` holds a model's data file, when ``share_file`` made it."""
    return _SHARED.get(os.path.realpath(path))


def known_digest(identity: tuple[int, int, int, int], sha256: str) -> None:
    """The SHA-256 of a data file of this identity (device, inode, size, mtime in ns), as a
    previous run recorded it: a file still of that identity is not read again to digest it.
    A wrong record costs nothing but that file's cleanup later: a file is removed only when
    its content has the digest recorded (``graphkernel.outdir``), so one whose record is
    wrong is left where it is."""
    _KNOWN[identity] = sha256


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Digest(threading.Thread):
    """The SHA-256 of a file, computed on a thread of its own from a descriptor of its own."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__(name="graphkernel-digest", daemon=True)
        self.fd, self.size = fd, size
        self.sha256: str | None = None

    def run(self) -> None:
        try:
            self.sha256 = file_sha256(self.fd, self.size)
        except OSError:
            pass  # (``share_file`` then digests the file itself, and meets the error there)
        finally:
            os.close(self.fd)


def digest_soon(fd: int) -> None:
    """Start digesting the open regular file ``fd`` (a model's data file that ``share_file``
    will likely be asked to share) while the program does other work: reading and hashing
    release the interpreter's lock, so on a second core the digest of a large weights file
    (about a second for 500 MB) is ready when the outputs are written, instead of being
    computed then. Nothing is started for a file whose digest is known or under way; the
    digest is used only for a file of the same identity (device, inode, size, mtime) when it
    is shared, as a known digest is."""
    st = os.fstat(fd)
    ident = _identity(st)
    if ident in _KNOWN or ident in _PENDING:
        return
    job = _Digest(os.dup(fd), st.st_size)
    _PENDING[ident] = job
    job.start()


def _digest_of(ident: tuple[int, int, int, int], fd: int, size: int) -> str:
    """The digest of the file ``fd`` of identity ``ident``: known, computed in the background
    (``digest_soon``), or computed now."""
    sha = _KNOWN.get(ident)
    if sha is None:
        job = _PENDING.pop(ident, None)
        if job is not None:
            job.join()
            sha = job.sha256
        if sha is None:
            sha = file_sha256(fd, size)
        _KNOWN[ident] = sha
    return sha


def file_sha256(fd: int, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of the open file ``fd``, read with pread (the file
    position, and any map of it, untouched)."""
    h = hashlib.sha256()
    at = 0
    while at < size:
        chunk = os.pread(fd, min(1 << 22, size - at), at)
        if not chunk:
            break
        h.update(chunk)
        at += len(chunk)
    return h.hexdigest()


def share_file(path: str | os.PathLike, fd: int, source: str | os.PathLike) -> Path:
    """Make ``path`` hold the content of the open regular file ``fd`` (``source`` names it)
    without copying it: a hard link to that very file (made through its descriptor, so a file
    that has since taken its name elsewhere is not the one linked), or, when the file system
    cannot link it there (another device, no right to link another user's file), a copy made
    inside the kernel (no pass through this process's memory). Put in place as ``write_file``
    puts a file; its digest is recorded as for a file written, and is computed only when no
    earlier digest of this same file is known (``known_digest``) or under way
    (``digest_soon``)."""
    path = Path(path)
    st = os.fstat(fd)
    ident = _identity(st)
    with _placed(path, _STAGE.get()) as tmp:
        name, linked = _link_or_copy(fd, st, path)
        tmp.append(name)
        sha = _digest_of(ident, fd, st.st_size)
        real = os.path.realpath(path)
        _DIGESTS[real] = sha
        _SHARED[real] = Shared(os.path.abspath(source), ident, sha, linked)
    return path


def _link_or_copy(fd: int, st: os.stat_result, path: Path) -> tuple[str, bool]:
    """A new name in ``path``'s folder for the file ``fd``: (the name, True) when it is a
    hard link to it, (the name, False) when it is a copy."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for _ in range(100):
            name = f".{path.name[:40]}.{os.urandom(6).hex()}.tmp"
            try:  # (a dir fd makes it linkat, which follows /proc's link to the open file)
                os.link(f"/proc/self/fd/{fd}", name, src_dir_fd=folder, dst_dir_fd=folder,
                        follow_symlinks=True)
            except FileExistsError:
                continue
            except OSError:
                break  # (another device, a file system without links, no right, no /proc)
            now = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return os.path.join(path.parent, name), True
            os.unlink(name, dir_fd=folder)
            break
    finally:
        os.close(folder)
    out, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(out, 0o666 & ~umask)
        _kernel_copy(fd, out, st.st_size)
    finally:
        os.close(out)
    return tmp, False


def _kernel_copy(src: int, dst: int, size: int) -> None:
    """Copy ``size`` bytes of ``src`` from its start into ``dst``: copy_file_range (or
    sendfile) where the system has them, so no byte passes through this process."""
    at = 0
    try:
        while at < size:
            n = os.copy_file_range(src, dst, size - at, at)
            if n == 0:
                break
            at += n
    except (AttributeError, OSError):
        pass
    try:
        while at < size:
            n = os.sendfile(dst, src, at, size - at)
            if n == 0:
                break
            at += n
    except (AttributeError, OSError):
        pass
    while at < size:
        chunk = os.pread(src, min(1 << 22, size - at), at)
        if not chunk:
            break
        os.write(dst, chunk)
        at += len(chunk)
    if at != size:
        raise OSError(f"the data file ended after {at:,} of its {size:,} bytes")


def _replace(tmp: str, path: Path) -> None:
    """Rename ``tmp`` onto ``path``. Both may be hard links to one file (a model's data file
    shared again): rename then does nothing, and the spare name is removed."""
    os.replace(tmp, path)
    if os.path.lexists(tmp):
        os.unlink(tmp)


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
            _replace(tmp, path)
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
