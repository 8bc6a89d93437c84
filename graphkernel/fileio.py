"""Atomic file writes: a failed run never leaves a half-written file behind."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from graphkernel.errors import ExecutionError, FormatError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return atomic_write_bytes(path, buf.getvalue())


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ExecutionError(f"{p}: no such inputs file") from None
    except (OSError, ValueError) as e:
        raise FormatError(f"{p}: not a readable .npz file ({e}); save inputs with "
                          "numpy.savez(path, name=array, ...)") from None
