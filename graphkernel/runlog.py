"""The replay logs: records kept as single records or as runs of many, made when read.

A large compile repeats itself: regions of equal structure replay the decisions of the first
one, and the records they leave (pattern attempts, numbered rewrites) differ only by the
region's names. Each such region adds one run; a subclass says how a run becomes records.
The two logs a compile keeps are here: every pattern attempt (``AttemptLog``, the split
pass's; ``graphkernel explain`` reads it) and every numbered rewrite (``ApplicationLog``, the
bisect counter's). A replayed text names the region's nodes by position (``Template``).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from graphkernel.refusals import code as refusal_code

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


class Template(str):
    """A string naming region nodes by position: ``template.format(*names)`` fills them in."""


def spelled(text: str, names: Sequence[str]) -> str:
    """``text`` with the names of the nodes it names by position, when it is a ``Template``."""
    return text.format(*names) if type(text) is Template else text


class Attempt:
    """One pattern attempt, for `graphkernel explain`: ``pattern``, ``areas`` (names),
    ``nodes`` (names), ``score``, ``verdict`` (fused | rejected), ``reason``.

    A compile of a large graph records hundreds of thousands, most of them the decisions of
    an earlier region of the same structure replayed (see the split pass): ``replayed``
    keeps that region's texts (``Template``) and positions with this region's names, and
    spells its areas, nodes and reason out when they are read."""

    __slots__ = ("pattern", "_areas", "_nodes", "score", "verdict", "_reason", "_names")
    FIELDS = ("pattern", "areas", "nodes", "score", "verdict", "reason")

    def __init__(self, pattern: str, areas: list[str], nodes: list[str], score: int,
                 verdict: str, reason: str = "") -> None:
        self.pattern, self._areas, self._nodes = pattern, areas, nodes
        self.score, self.verdict, self._reason = score, verdict, reason
        self._names: Sequence[str] | None = None

    @classmethod
    def replayed(cls, pattern: str, areas: list[str], nodes: tuple[int, ...], score: int,
                 verdict: str, reason: str, names: Sequence[str]) -> Attempt:
        """An attempt whose ``areas`` and ``reason`` are texts naming nodes by position in
        ``names`` and whose ``nodes`` are positions in it (shared, not copied)."""
        a = cls(pattern, areas, nodes, score, verdict, reason)  # type: ignore[arg-type]
        a._names = names
        return a

    @property
    def areas(self) -> list[str]:
        if self._names is None:
            return self._areas
        return [spelled(x, self._names) for x in self._areas]

    @property
    def nodes(self) -> list[str]:
        if self._names is None:
            return self._nodes
        return [self._names[i] for i in self._nodes]

    @property
    def reason(self) -> str:
        return self._reason if self._names is None else spelled(self._reason, self._names)

    @property
    def code(self) -> str:
        """The refusal's stable code (graphkernel.refusals); "" for a fusion made."""
        return "" if self.verdict == "fused" else refusal_code(self.reason)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS} | {"code": self.code}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attempt) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]  # compared by value, mutable like a dataclass

    def __repr__(self) -> str:
        return "Attempt(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


class AttemptLog(RunLog[Attempt]):
    """Every pattern attempt of a compile, in order (``Analyses.fusion_attempts``).

    A region that replays the decisions of an earlier region of the same structure adds
    them as one run (``replay``): those decisions and the region's names, the attempts
    made from them only when read. A 100k-node graph records ~250,000 attempts, nearly all
    of them replayed; kept as objects they would be a tenth of the compile's live objects."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = 0  # how many attempts fused (the others were refused)

    def append(self, attempt: Attempt) -> None:
        super().append(attempt)
        self.fused += attempt.verdict == "fused"

    def replay(self, entries: Sequence[tuple], names: Sequence[str]) -> None:
        """Attempts ``Attempt.replayed(*entry, names)`` for each entry, made when read."""
        self._add_run((entries, names), len(entries))
        self.fused += sum(entry[4] == "fused" for entry in entries)  # (entry[4]: the verdict)

    def refusal_codes(self) -> dict[str, int]:
        """How many refused attempts of each code, without spelling out the replayed ones
        (their reasons' templates carry the phrases the codes are read from)."""
        out: dict[str, int] = {}
        memo: dict[str, str] = {}
        for is_run, item in self._runs:
            reasons = [e[5] for e in item[0] if e[4] != "fused"] if is_run else \
                [item.reason] if item.verdict != "fused" else []
            for r in reasons:
                c = memo.get(r)
                if c is None:
                    c = memo[r] = refusal_code(r)
                out[c] = out.get(c, 0) + 1
        return out

    def _expand(self, run: tuple[Sequence[tuple], Sequence[str]]) -> Iterator[Attempt]:
        entries, names = run
        for entry in entries:
            yield Attempt.replayed(*entry, names)


@dataclass
class Application:
    """One numbered rewrite: which pass, on what, the user's nodes it touched, and whether it
    ran."""

    number: int
    pass_name: str
    description: str
    origin: list[str]
    applied: bool


class ApplicationLog(RunLog[Application]):
    """Every numbered rewrite of a compile, in order (``CompileResult.applications``).

    The rewrites of a region that replays the decisions of an earlier, equal region are one
    run (``BisectCounter.replay``): the numbers they took, the decided descriptions and
    node positions, the region's names and its nodes' origins; made into ``Application``
    records only when read (a 100k-node graph numbers ~140,000 rewrites, nearly all replayed)."""

    def replay(self, first: int, pass_name: str, entries: Sequence[tuple[str, tuple[int, ...]]],
               names: Sequence[str], origins: Sequence[tuple[str, ...]]) -> None:
        self._add_run((first, pass_name, entries, names, origins), len(entries))

    def _expand(self, run: tuple) -> Iterator[Application]:
        first, pass_name, entries, names, origins = run
        for k, (text, idx) in enumerate(entries):
            origin = list(dict.fromkeys(o for i in idx for o in origins[i]))
            yield Application(first + k, pass_name, spelled(text, names), origin, True)
