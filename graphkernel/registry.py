"""Registries of passes, expanders and fusion patterns, filled by decorators on import.

Third-party code registers its own passes the same way graphkernel does::

    from graphkernel.registry import register_pass, PassResult

    @register_pass("fold_my_op", stage="simplify", level=2, order=55)
    def fold_my_op(graph, ctx):
        \"\"\"Rewrite MyOp(x) -> x when ... .\"\"\"
        changed = 0
        for node in graph.nodes:
            if node.op == "MyOp" and ctx.should_apply(f"fold {node.name}"):
                ...
                changed += 1
        return PassResult(changed > 0, changed)

Importing the module that holds it (before ``graphkernel.compile``) is enough:
the pass then appears in ``graphkernel passes`` and can be selected by flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STAGES = ("preprocess", "expand", "simplify", "cluster", "split", "postfusion", "codegen")


@dataclass
class PassResult:
    """What a pass reports: whether the graph changed, how many rewrites it made, detail
    notes (one per node or kernel; shown with ``--verbose``) and a one-line summary (shown
    by default; a single note serves as its own summary)."""

    modified: bool
    rewrites: int = 0
    notes: list[str] = field(default_factory=list)
    summary: str = ""


def counted(n: int, noun: str, plural: str = "") -> str:
    """``1 kernel``, ``2 kernels``: a count with its noun in agreement (for pass summaries)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


PassFn = Callable[[Any, Any], PassResult]


@dataclass(frozen=True)
class PassInfo:
    """A pass's metadata: a value, so the pipeline is data (see ``graphkernel passes``)."""

    name: str
    stage: str
    level: int
    order: float
    required: bool
    feature: tuple[str, int] | None  # (flag, level): a feature flag that switches the pass
    doc: str
    fn: PassFn
    extra_runs: tuple[tuple[str, float], ...] = ()

    @property
    def summary(self) -> str:
        """The docstring's first sentence (its first paragraph, up to the first full stop)."""
        para = " ".join((self.doc or "").strip().split("\n\n")[0].split())
        end = para.find(". ")
        return para if end < 0 else para[:end + 1]


PASSES: dict[str, PassInfo] = {}
EXPANDERS: dict[str, Any] = {}
PATTERNS: dict[str, Any] = {}


def register_pass(name: str, stage: str, level: int = 1, order: float = 50.0,
                  required: bool = False, feature: tuple[str, int] | None = None,
                  extra_runs: tuple[tuple[str, float], ...] = ()) -> Callable[[PassFn], PassFn]:
    """Register ``fn(graph, ctx) -> PassResult`` as a pass of ``stage``.

    ``order`` places it within the stage; ``extra_runs`` adds more runs in other stages
    (selected as ``name:2``, ``name:3`` …); ``feature`` names a flag such as
    ``("enable_recompute_fusion", 2)`` that turns the pass on or off explicitly.
    """
    if stage not in STAGES:
        raise ValueError(f"pass {name!r}: unknown stage {stage!r} (stages: {', '.join(STAGES)})")

    def deco(fn: PassFn) -> PassFn:
        if name in PASSES:
            raise ValueError(f"pass {name!r} is registered twice")
        PASSES[name] = PassInfo(name, stage, level, order, required, feature,
                                fn.__doc__ or "", fn, extra_runs)
        return fn

    return deco


def _register_in(table: dict[str, Any], kind: str, name: str) -> Callable[[Any], Any]:
    def deco(obj: Any) -> Any:
        if name in table:
            raise ValueError(f"{kind} {name!r} is registered twice")
        table[name] = obj
        return obj

    return deco


def register_expander(op: str) -> Callable[[Any], Any]:
    """Register the expander of composite op ``op`` (see ``expanders/``)."""
    return _register_in(EXPANDERS, "expander for", op)


def register_pattern(name: str) -> Callable[[Any], Any]:
    """Register a fusion pattern under its user-visible name (see ``patterns/``)."""
    return _register_in(PATTERNS, "pattern", name)
