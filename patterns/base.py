"""Pattern records and the helper every rule uses to state its conditions.

A pattern is ``fn(model, area) -> Area | None``: it proposes a fusion around
``area`` and returns the merged area when the fusion happened (the split pass
then tries the same pattern on it again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphkernel.fusion import INJECTIVE, Area, SplitModel
from graphkernel.ops import OpKind
from graphkernel.registry import PATTERNS, register_pattern

PatternFn = Callable[[SplitModel, Area], Area | None]


@dataclass(frozen=True)
class Pattern:
    name: str
    order: int
    direction: str  # fwd: pull producers in; bwd: push into consumers
    mode: str  # depth: one-to-one chains; width: several neighbours at once
    level: int  # the opt_level from which it runs by default (extended fusions: 3)
    fn: PatternFn
    doc: str
    # the refusal codes its own conditions give (graphkernel.refusals; every pattern may also
    # meet refusals.COMMON: a cycle, a cap, a flag, bisection)
    refuses: tuple[str, ...] = ()


def pattern(name: str, order: int, direction: str, mode: str, level: int = 1,
            refuses: tuple[str, ...] = ()):
    def deco(fn: PatternFn) -> PatternFn:
        register_pattern(name)(Pattern(name, order, direction, mode, level, fn,
                                       (fn.__doc__ or "").strip(), refuses))
        return fn

    return deco


Condition = Callable[[], str | None]  # returns why the fusion is refused, or None


def need(ok: Callable[[], bool], reason: Callable[[], str]) -> Condition:
    """A lazily checked condition: ``reason`` is only formatted when ``ok()`` fails."""
    return lambda: None if ok() else reason()


def fuse_if(model: SplitModel, name: str, areas: Sequence[Area],
            conditions: Sequence[Condition], limit: int | None = None) -> Area | None:
    """Fuse ``areas`` (into the first) when every condition holds; otherwise record the first
    failing condition's reason as the verdict. Conditions are checked in order, lazily."""
    reason = first_failure(conditions)
    if reason is not None:
        model.reject(name, list(areas), reason)
        return None
    return areas[0] if model.try_fuse(name, list(areas), limit) else None


def fuse_qualifying(model: SplitModel, name: str, area: Area, candidates: Sequence[Area],
                    conditions: Callable[[Area], Sequence[Condition]],
                    limit: int | None = None) -> Area | None:
    """Width mode: fuse ``area`` with every candidate whose conditions hold (recording why
    each other one is refused), all at once, with the cycle check."""
    good = []
    for cand in candidates:
        why = first_failure(conditions(cand))
        if why is not None:
            model.reject(name, [area, cand], why)
        else:
            good.append(cand)
    return fuse_if(model, name, [area, *good], [], limit) if good else None


def first_failure(conditions: Sequence[Condition]) -> str | None:
    for cond in conditions:
        reason = cond()
        if reason is not None:
            return reason
    return None


def all_patterns() -> list[Pattern]:
    return sorted(PATTERNS.values(), key=lambda p: p.order)


def pull_in_conditions(model: SplitModel, a: Area, p: Area, max_kind: OpKind,
                       kind_note: str) -> list[Condition]:
    """What a forward fusion asks of producer ``p`` before ``a`` pulls it in: its kind is at
    most ``max_kind``, ``a`` is its only consumer, and the edge is INJECTIVE."""
    return [
        need(lambda: model.kind(p) <= max_kind,
             lambda: f"kind mismatch: producer {p.name} is {model.kind(p).name} ({kind_note})"),
        need(lambda: model.only_consumer_is(p, a),
             lambda: f"producer {p.name} has other consumers"),
        need(lambda: model.relation(p, a) == INJECTIVE,
             lambda: f"edge relation: {p.name} -> {a.name} is BROADCAST (needs INJECTIVE)"),
    ]
