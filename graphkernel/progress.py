"""Progress of long work on stderr: passes, kernels generated, simulator builds, bisect steps.

Off unless a front end switches it on: the CLI does when stderr is a terminal and
``--quiet`` is not given, so a pipe, a log file, a test or a library user sees nothing.
When on, a task draws with tqdm if it is installed (``pip install 'graphkernel[progress]'``),
else as one status line rewritten in place (``compile [7/19] codegen > kernels [3/30] ...``).
Either way the display is erased when the work ends, so only results stay on the terminal.

Code that does long work opens a task and advances it::

    with progress.task("kernels", total=len(work)) as t:
        for k in work:
            t.advance(k.name)

Lines printed while a task is shown go through ``progress.write`` so the display is not
torn.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_state: dict[str, Any] = {"on": False, "backend": "auto", "stream": None}
_stack: list[Task] = []  # the tasks shown, outermost first
_lock = threading.RLock()
REFRESH_S = 0.1  # counts are redrawn at most this often; a new task or step is drawn at once


def enable(on: bool, backend: str = "auto", stream: TextIO | None = None) -> None:
    """Switch the display on or off. ``backend``: ``auto`` (tqdm when installed), ``tqdm``
    or ``line``; ``stream`` defaults to stderr."""
    if backend not in ("auto", "tqdm", "line"):
        raise ValueError(f"progress backend {backend!r}: expected auto, tqdm or line")
    _state.update(on=on, backend=backend, stream=stream)


def enabled() -> bool:
    return bool(_state["on"])


def auto(quiet: bool = False) -> None:
    """The CLI's rule: on when stderr is a terminal, unless ``quiet``."""
    enable(not quiet and sys.stderr.isatty())


def _stream() -> TextIO:
    return _state["stream"] or sys.stderr


def _use_tqdm() -> bool:
    if _state["backend"] == "line":
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        if _state["backend"] == "tqdm":
            raise
        return False
    return True


class Task:
    """One piece of long work: a label, an optional total, the item being worked on."""

    def __init__(self, label: str, total: int | None = None, counted: bool = True) -> None:
        self.label = label
        self.total = total
        self.counted = counted  # False: one step, shown with its elapsed time, not a count
        self.done = 0
        self.detail = ""
        self.started = time.monotonic()

    # the no-op task (display off): every method does nothing
    def advance(self, detail: str = "", n: int = 1) -> None:
        """Count ``n`` items done; ``detail`` names what is being worked on now."""

    def describe(self, detail: str) -> None:
        """Change the detail without counting an item."""

    def add_total(self, n: int) -> None:
        """More work turned up (e.g. a kernel replaced by its parts)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def text(self) -> str:
        if not self.counted:
            elapsed = time.monotonic() - self.started
            return f"{self.label} {elapsed:.0f}s" + (f" {self.detail}" if self.detail else "")
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        return f"{self.label} [{count}]" + (f" {self.detail}" if self.detail else "")

    def refresh(self) -> None:
        """Redraw (the elapsed time of a long step)."""


class _LineTask(Task):
    """The built-in display: the open tasks as one status line, rewritten in place."""

    def __init__(self, label: str, total: int | None = None, counted: bool = True) -> None:
        super().__init__(label, total, counted)
        self._drawn = 0.0
        with _lock:
            _stack.append(self)
        self._draw(force=True)

    def advance(self, detail: str = "", n: int = 1) -> None:
        self.done += n
        self.detail = detail or self.detail
        self._draw()

    def describe(self, detail: str) -> None:
        self.detail = detail
        self._draw(force=True)  # a new step may run long: show it at once

    def add_total(self, n: int) -> None:
        self.total = (self.total or 0) + n

    def refresh(self) -> None:
        self._draw(force=True)

    def close(self) -> None:
        with _lock:
            if self in _stack:
                _stack.remove(self)
            _clear_line()
            if _stack:
                _stack[-1]._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < REFRESH_S:
            return
        self._drawn = now
        with _lock:
            line = " > ".join(t.text() for t in _stack)
            width = shutil.get_terminal_size((100, 20)).columns - 1
            out = _stream()
            out.write("\r\x1b[K" + line[:width])
            out.flush()


class _TqdmTask(Task):
    """A tqdm bar (nested bars stack below their parent; each is erased when it ends)."""

    def __init__(self, label: str, total: int | None = None, counted: bool = True) -> None:
        from tqdm import tqdm

        super().__init__(label, total, counted)
        with _lock:
            _stack.append(self)
            position = len(_stack) - 1
        fmt = ("{desc} {bar:16} {n_fmt}/{total_fmt} {elapsed}{postfix}" if total else
               "{desc} {n_fmt} {elapsed}{postfix}" if counted else "{desc} {elapsed}{postfix}")
        self.bar = tqdm(total=total, desc=label, file=_stream(), leave=False,
                        position=position, dynamic_ncols=True, mininterval=REFRESH_S,
                        bar_format=fmt)

    def advance(self, detail: str = "", n: int = 1) -> None:
        self.done += n
        if detail:
            self.detail = detail
            self.bar.set_postfix_str(detail, refresh=False)
        self.bar.update(n)

    def describe(self, detail: str) -> None:
        self.detail = detail
        self.bar.set_postfix_str(detail)

    def add_total(self, n: int) -> None:
        self.total = (self.total or 0) + n
        self.bar.total = self.total
        self.bar.refresh()

    def refresh(self) -> None:
        self.bar.refresh()

    def close(self) -> None:
        with _lock:
            if self in _stack:
                _stack.remove(self)
        self.bar.close()


def _clear_line() -> None:
    out = _stream()
    out.write("\r\x1b[K")
    out.flush()


def task(label: str, total: int | None = None, counted: bool = True) -> Task:
    """A task to advance (a context manager); a no-op when the display is off. ``counted``
    False: one long step, shown with its elapsed time instead of a count."""
    if not enabled():
        return Task(label, total, counted)
    cls = _TqdmTask if _use_tqdm() else _LineTask
    return cls(label, total, counted)


@contextmanager
def ticking(label: str, detail: str = "", every: float = 0.5) -> Iterator[Task]:
    """A task for one blocking step (a g++ build): its elapsed time is redrawn while the
    step runs, so a long build visibly runs."""
    t = task(label, counted=False)
    t.describe(detail)
    if not enabled():
        yield t
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every):
            t.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield t
    finally:
        stop.set()
        thread.join()
        t.close()


def write(line: str, stream: TextIO | None = None) -> None:
    """Print a line (to stderr by default) without tearing a task on display."""
    out = stream or _stream()
    with _lock:
        if not _stack:
            print(line, file=out)
            return
        if isinstance(_stack[-1], _TqdmTask):
            from tqdm import tqdm

            tqdm.write(line, file=out)
            return
        _clear_line()
        print(line, file=out)
        _stack[-1]._draw(force=True)
