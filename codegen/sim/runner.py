"""Compile Ascend C kernels against the CPU simulator header with g++ and run them.

Many kernels go into one shared library per build (compiles are the slow part), cached by
a hash of the sources, the header and the compiler flags. A kernel source must define
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


def cache_dir() -> Path:
    d = Path(os.environ.get("GRAPHKERNEL_SIM_CACHE",
                            Path(tempfile.gettempdir()) / "graphkernel-sim-cache"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(sources: Sequence[str]) -> ctypes.CDLL:
    """One shared library holding every kernel in ``sources``."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise SimulatorError("the CPU simulator needs a C++ compiler (g++): apt-get install g++")
    header = (HEADER_DIR / "ascendc_sim.h").read_text()
    # each source numbered from its own line 1, so errors name lines of the kernel's file
    text = "\n".join(['#define GK_SIM 1', '#include "ascendc_sim.h"', "using namespace AscendC;",
                      *(f'#line 1\n{src}' for src in sources)])
    key = hashlib.sha256("\0".join([header, text, " ".join(CXX_FLAGS)]).encode()).hexdigest()
    if key in _LIBS:
        return _LIBS[key]
    lib = cache_dir() / f"k_{key[:24]}.so"
    if not lib.exists():
        src = cache_dir() / f"k_{key[:24]}.cpp"
        src.write_text(text)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        n = len(sources)
        with progress.ticking("simulator build", f"g++ compiling {n} kernel source"
                              f"{'s' if n != 1 else ''} (cached by content for the next run)"):
            r = subprocess.run([cxx, *CXX_FLAGS, f"-I{HEADER_DIR}", str(src), "-o", str(tmp)],
                               capture_output=True, text=True)
        if r.returncode != 0:
            raise SimulatorError("kernel source does not compile:\n" + r.stderr[-4000:])
        os.replace(tmp, lib)
    _LIBS[key] = ctypes.CDLL(str(lib))
    return _LIBS[key]


def launch(lib: ctypes.CDLL, kernel: str, buffers: Sequence[np.ndarray], blocks: int,
           ub_bytes: int) -> Counts:
    """Run ``blocks`` cores of ``kernel`` over the given GM buffers (written in place)."""
    fn = getattr(lib, f"gk_sim_launch_{kernel}", None)
    if fn is None:
        raise SimulatorError(f"no kernel {kernel!r} in the library")
    arrays = [np.ascontiguousarray(b) if b.ndim else b.reshape(1) for b in buffers]
    for a, b in zip(arrays, buffers, strict=True):
        if a is not b and a.base is not b:
            raise SimulatorError("GM buffers must be C-contiguous arrays")
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    counters = (ctypes.c_uint64 * len(Counts._fields))()
    err = ctypes.create_string_buffer(1024)
    fn.restype = ctypes.c_int32
    rc = fn(ptrs, ctypes.c_int32(blocks), ctypes.c_uint64(ub_bytes), counters, err,
            ctypes.c_int32(len(err)))
    if rc != 0:
        raise SimulatorError(err.value.decode(errors="replace"))
    return Counts(*(int(c) for c in counters))
