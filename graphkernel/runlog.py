"""A log of records kept as single records or as runs of many, the records made when read.

A large compile repeats itself: regions of equal structure replay the decisions of the first
one, and the records they leave (pattern attempts, numbered rewrites) differ only by the
region's names. Each such region adds one run; a subclass says how a run becomes records.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RunLog(Sequence[T], Generic[T]):
    """Records in order: appended one by one, or added as a run (``_add_run``) that
    ``_expand`` turns into its records when the log is read."""

    def __init__(self) -> None:
        self._runs: list[tuple[bool, Any]] = []  # (is a run, the record or the run)
        self._len = 0

    def append(self, record: T) -> None:
        self._runs.append((False, record))
        self._len += 1

    def _add_run(self, run: Any, count: int) -> None:
        if count:
            self._runs.append((True, run))
            self._len += count

    @abstractmethod
    def _expand(self, run: Any) -> Iterator[T]:
        """The records of ``run``, in order."""

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[T]:
        for is_run, item in self._runs:
            if is_run:
                yield from self._expand(item)
            else:
                yield item

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"{type(self).__name__} index out of range")
        return next(itertools.islice(self, i % n, None))
