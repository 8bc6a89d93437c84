"""Registries of passes, expanders and fusion patterns, filled on import.

graphkernel's own passes are registered from one table, ``graphkernel.passes.PIPELINE``
(``register_steps``). Third-party code registers a pass with a decorator, placing it by its
stage and ``order`` among the table's rows::

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

Each registration records where it was made. Code registered from outside graphkernel
is a plugin: a name it takes twice is a ``RegistrationError`` naming both places, and an
exception it raises while running is reported as the plugin's (``PluginError``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphkernel.errors import RegistrationError

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
    source: str = ""  # where it was registered: "file:line"

    @property
    def summary(self) -> str:
        """The docstring's first sentence (its first paragraph, up to the first full stop)."""
        para = " ".join((self.doc or "").strip().split("\n\n")[0].split())
        end = para.find(". ")
        return para if end < 0 else para[:end + 1]

    @property
    def plugin(self) -> bool:
        """Registered by code outside graphkernel."""
        return is_plugin(self.fn)


PASSES: dict[str, PassInfo] = {}
EXPANDERS: dict[str, Any] = {}
PATTERNS: dict[str, Any] = {}
FINISH: list[Callable[[Any, Any], None]] = []  # after the last pass (register_steps)
HOOKS: list[Any] = []  # pass hooks every pass manager runs besides its own (register_hook)
# Where each expander/pattern was registered ("file:line"), for duplicate-name errors.
_SOURCES: dict[tuple[str, str], str] = {}
# Source files of plugin code: an exception raised in one of them is the plugin's.
PLUGIN_FILES: set[str] = set()


def is_plugin(obj: Any) -> bool:
    """Code from outside the graphkernel package (a --plugin file, the user's module)."""
    module = getattr(obj, "__module__", None) or ""
    return not (module == "graphkernel" or module.startswith("graphkernel."))


def source_of(obj: Any) -> str:
    """``file:line`` where ``obj`` (a function or class) is defined."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    try:
        return f"{inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
    except (OSError, TypeError):
        return getattr(obj, "__module__", None) or repr(obj)


def _note_source(obj: Any) -> str:
    where = source_of(obj)
    if is_plugin(obj):
        PLUGIN_FILES.add(where.rpartition(":")[0])
    return where


def register_pass(name: str, stage: str, level: int = 1, order: float = 50.0,
                  required: bool = False, feature: tuple[str, int] | None = None,
                  extra_runs: tuple[tuple[str, float], ...] = ()) -> Callable[[PassFn], PassFn]:
    """Register ``fn(graph, ctx) -> PassResult`` as a pass of ``stage``.

    ``order`` places it within the stage; ``extra_runs`` adds more runs in other stages
    (selected as ``name:2``, ``name:3`` …); ``feature`` names a flag such as
    ``("enable_recompute_fusion", 2)`` that turns the pass on or off explicitly.
    """
    if stage not in STAGES:
        raise RegistrationError(f"pass {name!r}: unknown stage {stage!r} (stages: "
                                f"{', '.join(STAGES)})")

    def deco(fn: PassFn) -> PassFn:
        where = _note_source(fn)
        if name in PASSES:
            raise RegistrationError(f"pass {name!r} is registered twice: by {PASSES[name].source} "
                                    f"and by {where}; give one of them another name")
        PASSES[name] = PassInfo(name, stage, level, order, required, feature,
                                fn.__doc__ or "", fn, extra_runs, where)
        return fn

    return deco


@dataclass(frozen=True)
class Step:
    """One row of a pipeline table: ``fn`` (a pass; its name is the function's) runs in
    ``stage`` at ``order`` from ``level`` on; ``feature`` names the flag that switches it
    whatever the level; a ``required`` pass cannot be turned off."""

    stage: str
    order: float
    fn: PassFn
    level: int
    feature: str | None = None
    required: bool = False


def register_steps(steps: Sequence[Step], finish: Sequence[Callable[[Any, Any], None]] = ()
                   ) -> None:
    """Register the passes of a pipeline table. A function listed in several rows is one
    pass run several times: its first row places it, the others are its extra runs.
    ``finish`` are called with (graph, ctx) after the last pass of every run."""
    FINISH.extend(finish)
    firsts: dict[PassFn, Step] = {}
    extra: dict[PassFn, list[tuple[str, float]]] = {}
    for st in steps:
        if st.fn in firsts:
            extra[st.fn].append((st.stage, st.order))
        else:
            firsts[st.fn], extra[st.fn] = st, []
    for fn, st in firsts.items():
        feature = (st.feature, st.level) if st.feature else None
        register_pass(fn.__name__, st.stage, st.level, st.order, st.required, feature,
                      tuple(extra[fn]))(fn)


def register_hook(hook: Any) -> Any:
    """Run ``hook`` (a ``graphkernel.pipeline.PassHook``) in every compile from now on, e.g.
    ``register_hook(Validation())`` to validate the graph after every pass; returns it."""
    HOOKS.append(hook)
    return hook


def _register_in(table: dict[str, Any], kind: str, name: str) -> Callable[[Any], Any]:
    def deco(obj: Any) -> Any:
        where = _note_source(obj)
        if name in table:
            first = _SOURCES.get((kind, name), source_of(table[name]))
            raise RegistrationError(f"{kind} {name!r} is registered twice: by {first} and by "
                                    f"{where}; give one of them another name")
        table[name] = obj
        _SOURCES[(kind, name)] = where
        return obj

    return deco


def register_expander(op: str) -> Callable[[Any], Any]:
    """Register the expander of composite op ``op`` (see ``expanders/``)."""
    return _register_in(EXPANDERS, "expander for", op)


def register_pattern(name: str) -> Callable[[Any], Any]:
    """Register a fusion pattern under its user-visible name (see ``patterns/``)."""
    return _register_in(PATTERNS, "pattern", name)
