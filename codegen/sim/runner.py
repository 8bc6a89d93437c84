"""Compile Ascend C kernels against the CPU simulator header with g++ and run them.

Many kernels go into one shared library per build (compiles are the slow part), split into
parts built by parallel g++ runs when there are many (``--jobs``), each part cached by a hash
of its sources, the header and the compiler flags. A kernel source must define
``gk_sim_call_<name>(uint8_t** args)`` and expand ``GK_SIM_LAUNCHER(<name>, <nargs>)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from graphkernel import progress
from graphkernel.errors import CodegenError

HEADER_DIR = Path(__file__).resolve().parent
HEADERS = ("ascendc_sim.h", "matmul_sim.h")  # the first includes the second
CXX_FLAGS = ["-std=c++20", "-O1", "-shared", "-fPIC", "-w", "-pthread"]
_LIBS: dict[str, ctypes.CDLL] = {}


class SimulatorError(CodegenError):
    """A kernel broke a rule of the hardware model (reported with kernel name and line)."""


class Counts(NamedTuple):
    """What a launch did, added up over its cores."""

    gm_read: int      # GM bytes read
    gm_written: int   # GM bytes written
    scalar: int       # scalar-pipe GetValue/SetValue of UB or GM
    syncs: int        # SetFlag/WaitFlag pairs and PipeBarrier<PIPE_ALL>
    vector: int       # vector instructions issued
    ub_peak: int = 0  # the most UB bytes one core reserved with InitBuffer
    mm_a: int = 0     # GM bytes the Matmul API read of A
    mm_b: int = 0     # ... of B
    mm_bias: int = 0  # ... of the bias
    mm_c: int = 0     # GM bytes it wrote of C (IterateAll)
    reads: tuple[int, ...] = ()  # GM bytes read of each buffer argument, in argument order


N_COUNTERS = len(Counts._fields) - 1  # the counters before ``reads`` (the simulator's NCOUNTERS)


def cache_dir() -> Path:
    """The folder of built libraries: ``$GRAPHKERNEL_SIM_CACHE``, else ``graphkernel/sim``
    in ``$XDG_CACHE_HOME`` or ``~/.cache``. graphkernel loads code from it, so it must be the
    user's own: created with mode 0700, and an existing one must be a real folder (not a
    link) owned by this user that nobody else can write (group and others: no access);
    otherwise it is refused, never repaired or used."""
    env = os.environ.get("GRAPHKERNEL_SIM_CACHE")
    if env:
        d = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        d = base / "graphkernel" / "sim"
    try:
        if not os.path.lexists(d):
            d.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
        st = os.lstat(d)
    except OSError as e:
        raise SimulatorError(f"the simulator cache folder {d} cannot be made: "
                             f"{e.strerror or e}") from None
    problem = _cache_problem(st)
    if problem is not None:
        raise SimulatorError(f"the simulator cache folder {d} {problem}; graphkernel builds and "
                             "loads code there, so it must be a folder of your own that only "
                             f"you can use (mode 0700): remove it, or `chmod 700 {d}` if it is "
                             "yours, or set GRAPHKERNEL_SIM_CACHE to such a folder")
    unsafe = _unsafe_ancestor(d)
    if unsafe is not None:
        where, why = unsafe
        raise SimulatorError(f"the simulator cache folder {d} lies in {where}, which {why}: "
                             "whoever can write there can swap the cache folder for one of "
                             "theirs between graphkernel's check and its use; set "
                             "GRAPHKERNEL_SIM_CACHE (or XDG_CACHE_HOME) to a folder whose "
                             "parents only you or root can change")
    return d


def _unsafe_ancestor(d: Path) -> tuple[Path, str] | None:
    """The first folder above ``d`` (on its path as given and on its real path) that
    someone other than this user or root can change: owned by another user, or writable by
    group or others without the sticky bit (which keeps them from renaming or deleting
    entries they do not own, as in /tmp). An entry of such a folder could be swapped at
    any moment, so the cache folder's own checks would not hold until it is used."""
    me = os.geteuid()
    lexical = Path(os.path.abspath(d))
    seen: set[Path] = set()
    for a in (*lexical.parents, *Path(os.path.realpath(d)).parents):
        if a in seen:
            continue
        seen.add(a)
        try:
            st = os.stat(a)
        except OSError:
            continue  # (the folder itself was made or found: its path is readable)
        if st.st_uid not in (me, 0):
            return a, f"is owned by user id {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return a, f"has mode {stat.S_IMODE(st.st_mode):04o} (others may write in it)"
    return None


def _cache_problem(st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"is owned by user id {st.st_uid}, not by you ({os.geteuid()})"
    if st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}: others can use it"
    return None


def _write_new(folder: Path, name: str, data: bytes) -> None:
    """Write ``folder/name`` through a fresh temporary file (created exclusively, never
    through a link) renamed into place: a planted link at ``name`` is replaced, not followed."""
    tmp = folder / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _verified(folder: Path, key: str) -> int | None:
    """An open descriptor of ``k_<key>.so`` when it is a regular file of this user (not a
    link) whose SHA-256 equals the one recorded when it was built; None otherwise."""
    so, record = folder / f"k_{key[:24]}.so", folder / f"k_{key[:24]}.so.sha256"
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            want = f.read(65).decode("ascii", "replace").strip()
        fd = os.open(so, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    if h.hexdigest() != want:
        os.close(fd)
        return None
    return fd


_PROC_NAMES: set[int] = set()  # descriptor numbers already used in a /proc path we loaded


def _load(fd: int, path: Path) -> ctypes.CDLL:
    """dlopen the very file ``fd`` was verified on (through /proc, so the file at ``path``
    cannot be swapped between the check and the load), then close ``fd``. The loader takes
    a name it loaded before for that library, so each load uses a descriptor number never
    used in one before."""
    held: list[int] = []
    try:
        n = fd
        while n in _PROC_NAMES:
            n = os.dup(fd)
            held.append(n)
        proc = f"/proc/self/fd/{n}"
        if not os.path.exists(proc):
            return ctypes.CDLL(str(path))
        _PROC_NAMES.add(n)
        return ctypes.CDLL(proc)
    finally:
        for h in held:
            os.close(h)
        os.close(fd)


MIN_PER_PART = 8  # kernels per g++ run below which splitting a build costs more than it saves


def default_jobs() -> int:
    """g++ runs at once: ``GRAPHKERNEL_JOBS`` (``--jobs``), else 1. Not the core count: each
    part compiles the simulator header again, and on the 2-core machine measured
    (benchmarks/sim_build_jobs.py) two parts cost more than they saved."""
    raw = os.environ.get("GRAPHKERNEL_JOBS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


class Library:
    """Kernels compiled into one or more shared libraries (parts built in parallel); a symbol
    is looked up in each part. The kernels' results do not depend on how they were split."""

    def __init__(self, parts: Sequence[ctypes.CDLL]) -> None:
        self.parts = list(parts)

    def __getattr__(self, symbol: str):
        for lib in self.parts:
            fn = getattr(lib, symbol, None)
            if fn is not None:
                return fn
        raise AttributeError(symbol)


def _unit(sources: Sequence[str]) -> str:
    # each source numbered from its own line 1, so errors name lines of the kernel's file
    return "\n".join(['#define GK_SIM 1', '#include "ascendc_sim.h"', "using namespace AscendC;",
                      *(f'#line 1\n{src}' for src in sources)])


def build(sources: Sequence[str], jobs: int | None = None) -> Library:
    """Every kernel in ``sources``, compiled by up to ``jobs`` g++ runs at once (one part per
    run, at least MIN_PER_PART kernels each); each part cached by the hash of its source, the
    header and the compiler flags."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise SimulatorError("the CPU simulator needs a C++ compiler (g++): apt-get install g++")
    jobs = max(1, jobs if jobs is not None else default_jobs())
    n_parts = max(1, min(jobs, len(sources) // MIN_PER_PART))
    parts = [list(sources[i::n_parts]) for i in range(n_parts)]  # the same split for any run
    header = "".join((HEADER_DIR / h).read_text() for h in HEADERS)
    units = [_unit(p) for p in parts]
    keys = [hashlib.sha256("\0".join([header, u, " ".join(CXX_FLAGS)]).encode()).hexdigest()
            for u in units]
    folder = cache_dir()
    ready: dict[str, int] = {}  # key -> a descriptor of its verified library
    try:
        for k in keys:
            if k not in _LIBS and k not in ready and (fd := _verified(folder, k)) is not None:
                ready[k] = fd
        todo = [(k, u) for k, u in zip(keys, units, strict=True)
                if k not in _LIBS and k not in ready]
        if todo:
            n = len(sources)
            split = f" in {len(todo)} parallel parts" if len(todo) > 1 else ""
            with progress.ticking("simulator build", f"g++ compiling {n} kernel source"
                                  f"{'s' if n != 1 else ''}{split} (cached by content for the "
                                  "next run)"):
                ready.update(_compile(cxx, folder, todo))
        for key in keys:
            if key not in _LIBS:
                _LIBS[key] = _load(ready.pop(key), folder / f"k_{key[:24]}.so")
    finally:
        for fd in ready.values():
            os.close(fd)
    return Library([_LIBS[k] for k in keys])


def _compile(cxx: str, folder: Path, todo: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Build each (key, unit) with g++ into ``folder``: the source and the library are
    written under fresh names and renamed into place, the library's SHA-256 is recorded
    beside it, and the descriptor hashed is returned, so what is loaded is what was built."""
    running = []
    for key, unit in todo:
        name = f"k_{key[:24]}"
        _write_new(folder, f"{name}.cpp", unit.encode())
        tmp = folder / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.so.tmp"
        proc = subprocess.Popen([cxx, *CXX_FLAGS, f"-I{HEADER_DIR}", str(folder / f"{name}.cpp"),
                                 "-o", str(tmp)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        running.append((key, tmp, proc))
    built: dict[str, int] = {}
    errors = []
    for key, tmp, proc in running:
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(err)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            continue
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        built[key] = fd
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        os.replace(tmp, folder / f"k_{key[:24]}.so")
        _write_new(folder, f"k_{key[:24]}.so.sha256", f"{h.hexdigest()}\n".encode())
    if errors:
        for fd in built.values():
            os.close(fd)
        raise SimulatorError("kernel source does not compile:\n" + errors[0][-4000:])
    return built


def launch(lib: Library | ctypes.CDLL, kernel: str, buffers: Sequence[np.ndarray], blocks: int,
           ub_bytes: int) -> Counts:
    """Run ``blocks`` cores of ``kernel`` over the given GM buffers (written in place)."""
    fn = getattr(lib, f"gk_sim_launch_{kernel}", None)
    if fn is None:
        raise SimulatorError(f"no kernel {kernel!r} in the library")
    # The kernel gets each buffer's own memory and writes its outputs there: a buffer must
    # be one C-contiguous block, as a device allocation is (the host copies a strided array
    # into one before the launch, as it would before copying it to the device). Tested on
    # the array itself: a 0-d view (a Squeeze of an input) is one element, so contiguous,
    # and is passed as [1], a view of the same memory.
    for i, b in enumerate(buffers):
        if not b.flags.c_contiguous:
            raise SimulatorError(f"{kernel}: GM buffer {i} (shape {list(b.shape)}, strides "
                                 f"{list(b.strides)}) must be a C-contiguous array")
    arrays = [b if b.ndim else b.reshape(1) for b in buffers]
    n = len(arrays)
    ptrs = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    sizes = (ctypes.c_uint64 * n)(*[a.nbytes for a in arrays])
    counters = (ctypes.c_uint64 * (N_COUNTERS + n))()
    err = ctypes.create_string_buffer(1024)
    fn.restype = ctypes.c_int32
    rc = fn(ptrs, sizes, ctypes.c_int32(n), ctypes.c_int32(blocks), ctypes.c_uint64(ub_bytes),
            counters, err, ctypes.c_int32(len(err)))
    if rc != 0:
        raise SimulatorError(err.value.decode(errors="replace"))
    got = [int(c) for c in counters]
    return Counts(*got[:N_COUNTERS], reads=tuple(got[N_COUNTERS:]))
