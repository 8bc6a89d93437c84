"""Reading data files within limits (JSON/YAML documents, .npz inputs), and the
compatibility names of the atomic writers (which live in ``graphkernel.outputs``)."""

from __future__ import annotations

import errno
import io
import json
import math
import mmap
import os
import stat
import struct
import weakref
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import yaml

from graphkernel import limits
from graphkernel.errors import ExecutionError, FormatError, shown
from graphkernel.outputs import file_name, write_file


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the operating system (glibc's ``malloc_trim``; a
    no-op with any other C library). A loader calls it once a model's parsed form (the
    document's text and strings, an ONNX model's messages) is freed: glibc keeps memory freed
    below the top of its heap resident, and what the later phases allocate need not reuse it,
    so without this an imported ONNX model's messages would add to the peak of every later
    phase."""
    global _TRIM
    if _TRIM is None:
        _TRIM = _malloc_trim()
    if _TRIM is not False:
        _TRIM(0)


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` as the interpreter already has it linked, or ``False``: only
    glibc is asked (``CS_GNU_LIBC_VERSION`` names it), no library is loaded by name, and the
    function is typed, so the call cannot pass or return garbage."""
    try:
        if not str(os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        import ctypes

        fn = ctypes.CDLL(None).malloc_trim  # (the interpreter's own C library)
    except (AttributeError, OSError, ValueError):
        return False
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_TRIM: Any = None  # (found on first use)


# ---------------------------------------------------------------- documents
class FileTooLarge(OSError):
    """A data file is larger than its documented limit."""


class DocumentError(Exception):
    """A JSON/YAML document cannot be used: a syntax error (``syntax``) or a breached limit.
    ``pos`` is ``":line:col"`` when known."""

    def __init__(self, detail: str, syntax: bool, pos: str = "") -> None:
        super().__init__(detail)
        self.detail, self.syntax, self.pos = detail, syntax, pos


class NotRegularFile(OSError):
    """A path names a FIFO, a device, a socket or a folder where a file is wanted (reading
    one could block for ever or never end), or a symbolic link where links are refused."""


def open_regular(path: str | os.PathLike, *, follow_links: bool = True) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file. Opening never blocks (a FIFO
    is opened non-blocking, then refused); with ``follow_links=False`` a symbolic link as the
    last component is refused too (a path a data file names is never a link)."""
    if "\0" in os.fspath(path):  # (os.open would raise ValueError, not an OSError)
        raise NotRegularFile(errno.EINVAL, "a path cannot contain a NUL byte", str(path))
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links and os.path.islink(path):
            raise NotRegularFile(errno.ELOOP, "is a symbolic link; a path named by a data "
                                 "file may not be a link", str(path)) from None
        raise
    return _regular(fd, str(path))


def _regular(fd: int, shown: str) -> BinaryIO:
    """``fd`` as a file object when it is a regular file; otherwise it is closed and refused."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)"
                    if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode)
                    or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "not a regular file")
            raise NotRegularFile(errno.EINVAL, f"is {kind}, not a regular file", shown)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path``; past ``limit`` bytes it stops reading and
    raises FileTooLarge. A FIFO or device (``/dev/zero``) is refused without reading."""
    with open_regular(path, follow_links=follow_links) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"larger than the {limit:,}-byte limit")
    return data


def open_beneath(folder: str | os.PathLike, relative: str) -> BinaryIO:
    """Open the regular file ``relative`` inside ``folder``, following no symbolic link on
    the way: each folder is opened relative to the one before it with ``O_NOFOLLOW``, so a
    link anywhere in the path (or swapped in meanwhile) is refused, as are '..', absolute
    paths and non-regular files. For paths that a data file names."""
    parts = relative.replace("\\", "/").split("/")
    if not relative or os.path.isabs(relative) or "\0" in relative or \
            any(p in ("", ".", "..") for p in parts):
        raise NotRegularFile(errno.EINVAL, "must be a relative path inside the folder (no '..', "
                             "no absolute path)", relative)
    base = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=base)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotRegularFile(e.errno, f"{part!r} is not a folder (a symbolic link "
                                         "is never followed)", relative) from None
                raise
            os.close(base)
            base = nxt
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(parts[-1], flags, dir_fd=base)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise NotRegularFile(e.errno, "is a symbolic link; a path named by a data file "
                                     "may not be a link", relative) from None
            raise
    finally:
        os.close(base)
    return _regular(fd, relative)


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

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A mapping whose keys are distinct (a ``<<`` merge may still be overridden)."""
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=False)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # (an unhashable key: the constructor names it)
                    continue
                if repeated:
                    mark = key_node.start_mark
                    raise DocumentError(_repeated_key(key), False,
                                        f":{mark.line + 1}:{mark.column + 1}")
        return super().construct_mapping(node, deep)


def _repeated_key(key: Any) -> str:
    return (f"key '{shown(str(key))}' is given twice in one object (which value is meant "
            "depends on the reader)")


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct (``json.loads`` would keep the last silently)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise DocumentError(_repeated_key(k), False)
            seen.add(k)
    return d


def parse_document(data: bytes, yaml_syntax: bool, walk: bool = True) -> Any:
    """Parse JSON or YAML bytes into plain data, within the nesting and alias limits.
    ``walk=False``: a JSON document's nesting is left for the caller to check (a reader that
    walks the document anyway checks it on the way, for free); YAML is always walked (its
    aliases expand)."""
    fmt = "YAML" if yaml_syntax else "JSON"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"not UTF-8 text (byte {e.start})", True) from None
    max_values = max_chars = None
    try:
        if yaml_syntax:
            loader = _LimitedLoader(text)
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
            if loader.aliases:
                max_values, max_chars = limits.MAX_YAML_VALUES, limits.MAX_YAML_EXPANDED_CHARS
        else:
            doc = json.loads(text, object_pairs_hook=_distinct_keys)
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
    if walk or yaml_syntax:
        problem = limits.check_document(doc, limits.MAX_DEPTH, max_values, max_chars)
        if problem is not None:
            raise DocumentError(problem, False)
    return doc


def read_document(path: str | os.PathLike, max_bytes: int, walk: bool = True) -> Any:
    """Read and parse a JSON (``.json``) or YAML (any other suffix) file within the limits
    (``walk``: see ``parse_document``). Raises OSError (missing, unreadable, too large) or
    DocumentError."""
    p = Path(path)
    return parse_document(read_bounded(p, max_bytes), p.suffix != ".json", walk)


# --------------------------------------------------------------------- arrays
class NpzError(ValueError):
    """An .npz archive, or one of its members, cannot be used; the message says why."""


_NPY_HEADER_MAX = 65536 + 16  # magic, version, header length and a header of .npy format 1/2


class MappedData(mmap.mmap):
    """A read-only memory map of a whole data file (a model's .npz, ONNX external data), whose
    constants are arrays viewing it: the operating system reads their pages when something
    reads them, and a writer finds in ``source_of`` that an array is still the file's own
    bytes (and writes a reference to the file instead of a copy). Made by ``map_file``.

    ``path`` (absolute) and ``stat`` name the file as it was mapped; ``fd`` is a descriptor
    of that file kept open while the map lives (a writer links or copies exactly the file
    mapped, even if its name now leads elsewhere); ``members``: data offset -> (.npz member
    name, bytes, dtype) of each member mapped so far. A file truncated by someone else while
    its map is read ends the process (SIGBUS): the price of not copying it."""

    path: Path
    stat: os.stat_result
    fd: int
    address: int
    members: dict[int, tuple[str, int, np.dtype]]


def map_file(f: BinaryIO, path: str | os.PathLike) -> MappedData | None:
    """A map of the open regular file ``f`` (None when it is empty: nothing to map)."""
    st = os.fstat(f.fileno())
    if st.st_size == 0:
        return None
    mm = MappedData(f.fileno(), 0, access=mmap.ACCESS_READ)
    mm.path = Path(os.path.abspath(path))
    mm.stat = st
    mm.fd = os.dup(f.fileno())
    weakref.finalize(mm, os.close, mm.fd)
    mm.address = np.frombuffer(mm, np.uint8, count=1).__array_interface__["data"][0]
    mm.members = {}
    return mm


def source_of(arr: np.ndarray) -> tuple[MappedData, int] | None:
    """(the mapped file, byte offset) when ``arr`` is a C-contiguous view of a file mapped by
    ``map_file`` (an unchanged constant as it was loaded), else None."""
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, MappedData) or not arr.flags.c_contiguous:
        return None
    return base, arr.__array_interface__["data"][0] - base.address


def mapped_view(mm: MappedData, offset: int, nbytes: int, dtype: np.dtype,
                shape: tuple[int, ...]) -> np.ndarray:
    """The read-only array of ``dtype`` and ``shape`` (``nbytes`` bytes) at ``offset`` of
    ``mm``; the caller has checked that it lies inside the file."""
    count = nbytes // dtype.itemsize if dtype.itemsize else 0
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(mm, dtype=dtype, count=count, offset=offset).reshape(shape)


class NpzFile:
    """An .npz archive read one member at a time, on request: a member is decompressed only
    when asked for, and never past the bytes its caller allows (a declared shape and dtype),
    so a small file that would inflate to gigabytes, or members nobody uses, cost nothing.
    Arrays hold numbers or bools only (no objects, strings or structured records), and the
    .npy header must agree with the bytes that follow it.

    ``mapped=True``: a member stored uncompressed (as ``numpy.savez`` stores them) in native
    byte order and C order is not read but mapped (``MappedData``): a read-only view of the
    file, checked the same way (its header, its size against the caller's bound) before
    anything is made of it. Its CRC is not checked: its bytes are never read as a whole."""

    def __init__(self, path: str | os.PathLike, *, follow_links: bool = True,
                 mapped: bool = False) -> None:
        self.path = Path(path)
        self._f = open_regular(path, follow_links=follow_links)
        self._map: MappedData | None = None
        try:
            self._check_directory()
            self._zip = zipfile.ZipFile(self._f)
            if mapped:
                try:
                    self._map = map_file(self._f, path)
                except (OSError, ValueError):  # (a file system without maps: members are read)
                    self._map = None
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as e:
            self._f.close()
            raise NpzError(f"not an .npz archive ({e})") from None
        except BaseException:
            self._f.close()
            raise
        self._members: dict[str, zipfile.ZipInfo] = {}
        for i in self._zip.infolist():
            if not i.filename.endswith(".npy"):
                continue
            if i.filename[:-4] in self._members:
                # (zipfile keeps the last entry of a name, an unzip tool may take the first:
                # which array the archive holds would depend on the reader)
                self.close()
                raise NpzError(f"member {i.filename!r} appears twice in its directory (which "
                               "array is meant depends on the reader)")
            self._members[i.filename[:-4]] = i

    def _check_directory(self) -> None:
        """The archive's directory is read whole when it opens: refuse one above the limit."""
        find = getattr(zipfile, "_EndRecData", None)  # the reader zipfile itself uses
        end = find(self._f) if find is not None else None  # None: ZipFile says what is wrong
        if end is not None and end[zipfile._ECD_SIZE] > limits.MAX_NPZ_DIRECTORY_BYTES:
            raise NpzError(f"its member directory is {end[zipfile._ECD_SIZE]:,} bytes, above "
                           f"the limit of {limits.MAX_NPZ_DIRECTORY_BYTES:,}")
        self._f.seek(0)

    def __enter__(self) -> NpzFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the archive; a map lives on while arrays view it (it is unmapped with the
        last of them)."""
        self._zip.close()
        self._f.close()
        self._map = None

    @property
    def mapped(self) -> MappedData | None:
        """The archive's map (``mapped=True``), or None."""
        return self._map

    def names(self) -> list[str]:
        return list(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def read(self, key: str, max_bytes: int, dtype: np.dtype | None = None,
             bits_of: np.dtype | None = None) -> np.ndarray:
        """Member ``key`` as an array of at most ``max_bytes`` bytes (and of ``dtype``, when
        given, in any byte order). ``bits_of``: a member holding raw 2-byte values (``|V2``,
        as numpy saves bfloat16, or uint16) is viewed as that dtype. Raises NpzError naming
        what is wrong."""
        info = self._members.get(key)
        if info is None:
            raise NpzError(f"no array {key!r} in it")
        cap = max_bytes + _NPY_HEADER_MAX
        if info.file_size > cap:
            raise NpzError(f"array {key!r} holds {info.file_size:,} bytes, more than the "
                           f"{max_bytes:,} its declared shape and dtype need")
        if info.flag_bits & 0x1:
            raise NpzError(f"array {key!r} is encrypted; arrays are read without a password "
                           "(save them with numpy.savez)")
        if self._map is not None:
            arr = self._mapped(key, info, max_bytes, dtype, bits_of)
            if arr is not None:
                return arr
        try:
            with self._zip.open(info) as member:
                data = member.read(cap + 1)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError,
                RuntimeError) as e:  # (RuntimeError: zipfile's word for a password needed)
            raise NpzError(f"array {key!r} cannot be read ({e})") from None
        if len(data) > cap:
            raise NpzError(f"array {key!r} inflates past the {max_bytes:,} bytes its declared "
                           "shape and dtype need")
        return _parse_npy(key, data, max_bytes, dtype, bits_of)

    def _mapped(self, key: str, info: zipfile.ZipInfo, max_bytes: int, want: np.dtype | None,
                bits_of: np.dtype | None) -> np.ndarray | None:
        """Member ``key`` as a view of the map, or None when it cannot be one (compressed,
        encrypted, another byte order or Fortran order, a local header that disagrees with
        the directory): then it is read as any member is, and that read names any problem."""
        mm = self._map
        assert mm is not None
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 \
                or info.compress_size != info.file_size:
            return None
        # headers are read with pread, not through the map: a page touched in a map brings
        # its neighbours with it (the kernel maps cached pages around a fault), and the
        # weights are to stay out of memory until something reads them
        fd = self._f.fileno()
        start = info.header_offset
        blob = os.pread(fd, 1024, start)  # (usually the local header, name and .npy header)
        if len(blob) < 30 or blob[:4] != b"PK\x03\x04":
            return None
        n_name, n_extra = struct.unpack("<HH", blob[26:30])
        name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
        at = 30 + n_name + n_extra  # the member's data, in blob
        if len(blob) < at + 12:
            blob += os.pread(fd, at + 12 - len(blob), start + len(blob))
        if blob[30:30 + n_name] != name:
            return None
        begin = start + at
        if begin + info.file_size > len(mm):
            return None
        size = blob[at:at + 12]  # magic, version, header length: then the header, no more
        end = 10 + int.from_bytes(size[8:10], "little") if size[6:7] == b"\x01" else \
            12 + int.from_bytes(size[8:12], "little")
        end = min(info.file_size, end, _NPY_HEADER_MAX)
        if len(blob) < at + end:
            blob += os.pread(fd, at + end - len(blob), start + len(blob))
        head = blob[at:at + end]
        shape, fortran, dt, body_at = _npy_header(key, head)
        raw_bits = bits_of is not None and dt.itemsize == 2 and \
            (dt.kind == "V" or dt == np.uint16)
        if raw_bits and dt.kind == "V" and dt.fields is None and dt.subdtype is None:
            dt = np.dtype(np.uint16)
        if fortran or not dt.isnative:
            return None
        nbytes = _check_npy(key, shape, dt, info.file_size - body_at, max_bytes, want)
        arr = mapped_view(mm, begin + body_at, nbytes, dt, shape)
        mm.members[begin + body_at] = (key, nbytes, dt)
        return arr.view(bits_of) if raw_bits else arr


_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}  # .npy header -> parsed
_HEADERS_LIMIT = 4096


def _npy_header(key: str, data: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, where the body starts) of the .npy bytes ``data`` (its
    header at least). Equal headers are parsed once: the weights of a model share a few."""
    buf = io.BytesIO(data)
    fmt = np.lib.format
    try:
        version = fmt.read_magic(buf)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f".npy format version {version} is not accepted (1.0, 2.0)")
        size_at = buf.tell()
        width = 2 if version == (1, 0) else 4
        end = size_at + width + int.from_bytes(data[size_at:size_at + width], "little")
        head = data[:end]
        known = _HEADERS.get(head)
        if known is not None:
            return (*known, end)
        buf.seek(0)
        fmt.read_magic(buf)
        if version == (1, 0):
            shape, fortran, dt = fmt.read_array_header_1_0(buf)
        else:
            shape, fortran, dt = fmt.read_array_header_2_0(buf)
    except ValueError as e:
        raise NpzError(f"array {key!r} is not a .npy array ({str(e).splitlines()[0]})") from None
    if buf.tell() == end:  # (the header is exactly the bytes counted: safe to share)
        if len(_HEADERS) >= _HEADERS_LIMIT:
            _HEADERS.clear()
        _HEADERS[head] = (shape, fortran, dt)
    return shape, fortran, dt, buf.tell()


def _check_npy(key: str, shape: tuple[int, ...], dt: np.dtype, body: int, max_bytes: int,
               want: np.dtype | None) -> int:
    """The bytes an array of ``shape`` and ``dt`` holds, after checking it is numbers of the
    wanted dtype, within ``max_bytes``, and exactly the ``body`` bytes the member holds."""
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None or dt.kind in "OSUVMm":
        raise NpzError(f"array {key!r} has dtype {dt}; an array of numbers or bools is "
                       "accepted (no objects, strings, records or dates)")
    if want is not None and dt.newbyteorder("=") != np.dtype(want).newbyteorder("="):
        raise NpzError(f"array {key!r} holds {dt.name}, the graph declares {np.dtype(want).name}")
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > max_bytes:
        raise NpzError(f"array {key!r}: shape {list(shape)} of {dt.name} is {nbytes:,} bytes, "
                       f"more than the {max_bytes:,} its declared shape and dtype need")
    if nbytes != body:
        raise NpzError(f"array {key!r}: its header says shape {list(shape)} of {dt.name} "
                       f"({nbytes:,} bytes), the member holds {body:,}")
    return nbytes


def _parse_npy(key: str, data: bytes, max_bytes: int, want: np.dtype | None,
               bits_of: np.dtype | None = None) -> np.ndarray:
    """The array in the bytes of a .npy member, checked before anything is allocated."""
    shape, fortran, dt, body_at = _npy_header(key, data)
    raw_bits = bits_of is not None and dt.itemsize == 2 and (dt.kind == "V" or dt == np.uint16)
    if raw_bits and dt.kind == "V" and dt.fields is None and dt.subdtype is None:
        dt = np.dtype(np.uint16)
    _check_npy(key, shape, dt, len(data) - body_at, max_bytes, want)
    arr = np.frombuffer(data, dtype=dt, count=math.prod(shape), offset=body_at)
    arr = arr.reshape(shape, order="F" if fortran else "C")
    arr = arr.astype(dt.newbyteorder("="), order="C")  # a writable native-order copy
    return arr.view(bits_of) if raw_bits else arr


def member_name(key: str) -> str:
    """The .npz member (``<member>.npy``) an array named ``key`` is stored under: the name
    itself when it is a plain file name, else ``outputs.file_name(key)`` (a value named
    ``../../x`` must not become a zip member that an unzip tool writes outside its folder)."""
    return file_name(key)


def load_npz(path: str | os.PathLike,
             types: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an inputs .npz. With ``types`` (input name -> TensorType) only the
    members of those inputs are read (stored under the name or its ``member_name``), each
    within the bytes its type allows (a symbolic shape: up to ``MAX_NUMEL`` elements); a
    member naming no input is an error, and is never decompressed."""
    p = Path(path)
    try:
        with NpzFile(p) as z:
            if types is None:
                return {k: z.read(k, _max_bytes(None)) for k in z.names()}
            out, used = {}, set()
            for name, t in types.items():
                key = name if name in z else member_name(name)
                if key in z:
                    bits = t.dtype.np if t.dtype.value == "bfloat16" else None
                    out[name] = z.read(key, _max_bytes(t), bits_of=bits)
                    used.add(key)
            extra = sorted(set(z.names()) - used)
    except FileNotFoundError:
        raise ExecutionError(f"{p}: no such inputs file") from None
    except (OSError, NpzError, MemoryError) as e:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise FormatError(f"{p}: not a readable .npz file ({detail}); save inputs with "
                          "numpy.savez(path, name=array, ...)") from None
    if extra:
        raise ExecutionError(f"{p}: unknown input(s) {', '.join(shown(e) for e in extra[:5])}"
                             f"{', ...' if extra[5:] else ''} (inputs: {', '.join(types)})")
    return out


def _max_bytes(t: Any) -> int:
    """The bytes an array of TensorType ``t`` may hold (any array without a type)."""
    if t is None:
        return limits.MAX_NUMEL * 8
    n = 1
    for d in t.shape:
        n *= d if isinstance(d, int) else limits.MAX_NUMEL
    return min(n, limits.MAX_NUMEL) * t.dtype.np.itemsize


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write arrays as an .npz (what numpy.savez writes), each under ``member_name(key)``:
    any key is allowed, even one that numpy.savez would take for its own parameter
    (``file``, ``allow_pickle``), and none becomes a path in the archive."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, value in arrays.items():
            with zf.open(f"{member_name(key)}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
    return write_file(path, buf.getvalue())


# ----------------------------------------------------- writers (compatibility)
def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write a file whole or not at all (see ``graphkernel.outputs.write_file``)."""
    return write_file(path, data)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return write_file(path, text.encode())
