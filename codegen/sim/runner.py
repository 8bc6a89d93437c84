"""Compile Ascend C kernels against the CPU simulator header with g++ and run them.

Many kernels go into one shared library per build (compiles are the slow part), split into
parts built by parallel g++ runs when there are many (``--jobs``), each part cached by a hash
of its sources, the header and the compiler flags. A kernel source must define
``gk_sim_call_<name>(uint8_t** args)`` and expand ``GK_SIM_LAUNCHER(<name>, <nargs>)``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
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
    d = Path(os.environ.get("GRAPHKERNEL_SIM_CACHE",
                            Path(tempfile.gettempdir()) / "graphkernel-sim-cache"))
    d.mkdir(parents=True, exist_ok=True)
    return d


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
    todo = [(k, u) for k, u in zip(keys, units, strict=True)
            if k not in _LIBS and not (cache_dir() / f"k_{k[:24]}.so").exists()]
    if todo:
        n = len(sources)
        split = f" in {len(todo)} parallel parts" if len(todo) > 1 else ""
        with progress.ticking("simulator build", f"g++ compiling {n} kernel source"
                              f"{'s' if n != 1 else ''}{split} (cached by content for the "
                              "next run)"):
            running = []
            for key, unit in todo:
                src = cache_dir() / f"k_{key[:24]}.cpp"
                src.write_text(unit)
                tmp = (cache_dir() / f"k_{key[:24]}.so").with_suffix(f".{os.getpid()}.tmp")
                proc = subprocess.Popen([cxx, *CXX_FLAGS, f"-I{HEADER_DIR}", str(src), "-o",
                                         str(tmp)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                running.append((key, tmp, proc))
            errors = []
            for key, tmp, proc in running:
                _, err = proc.communicate()
                if proc.returncode != 0:
                    errors.append(err)
                else:
                    os.replace(tmp, cache_dir() / f"k_{key[:24]}.so")
        if errors:
            raise SimulatorError("kernel source does not compile:\n" + errors[0][-4000:])
    for key in keys:
        if key not in _LIBS:
            _LIBS[key] = ctypes.CDLL(str(cache_dir() / f"k_{key[:24]}.so"))
    return Library([_LIBS[k] for k in keys])


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
