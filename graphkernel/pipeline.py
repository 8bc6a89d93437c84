"""The pass manager: the pipeline as data, the enable rule, the bisect counter, reports, hooks.

The pipeline is every registered pass run, ordered by stage and by each pass's
order within its stage. A pass that runs several times (``extra_runs``) has one
slot per run. Selectors in ``enable_pass``/``disable_pass``:

- ``name``            every run of the pass
- ``stage.name``      its runs in that stage
- ``S.P``             stage index S, pass index P within the stage (0-based, as printed
                      by ``graphkernel passes``)
- ``name:N``          only the N-th run of the pass (1-based)
"""

from __future__ import annotations

import gc
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from graphkernel import ops, progress, registry
from graphkernel.analyses import Analyses, ReportFigures
from graphkernel.dump import Dumper
from graphkernel.errors import FlagError, GraphKernelError, PluginError, did_you_mean
from graphkernel.flags import Config, rank
from graphkernel.ir import Graph, Node
from graphkernel.outputs import check_dir, file_name
from graphkernel.registry import STAGES, PassInfo, PassResult
from graphkernel.runlog import Application, ApplicationLog, spelled


class PassFailure(GraphKernelError):
    """A pass raised an unexpected error: a bug in graphkernel, reported with context."""

    exit_code = 3


@dataclass(frozen=True)
class PassSlot:
    info: PassInfo
    stage: str
    stage_index: int
    pass_index: int
    run: int  # 1-based occurrence of this pass in the pipeline
    runs: int  # how many times this pass runs in total

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def index(self) -> str:
        return f"{self.stage_index}.{self.pass_index}"

    @property
    def label(self) -> str:
        return self.name if self.runs == 1 else f"{self.name}:{self.run}"


def build_pipeline() -> list[PassSlot]:
    entries = []
    for info in registry.PASSES.values():
        for stage, order in ((info.stage, info.order), *info.extra_runs):
            entries.append((STAGES.index(stage), order, info.name, stage, info))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    counts: dict[str, int] = {}
    for e in entries:
        counts[e[2]] = counts.get(e[2], 0) + 1
    slots, seen, per_stage = [], {}, {}
    for si, _, name, stage, info in entries:
        seen[name] = seen.get(name, 0) + 1
        pi = per_stage.get(stage, 0)
        per_stage[stage] = pi + 1
        slots.append(PassSlot(info, stage, si, pi, seen[name], counts[name]))
    return slots


# ------------------------------------------------------------------ selectors
_NUMERIC = re.compile(r"^(\d+)\.(\d+)$")
_NTH = re.compile(r"^([a-z0-9_]+):(\d+)$")


def match_selector(sel: str, slots: list[PassSlot]) -> list[PassSlot]:
    if m := _NUMERIC.match(sel):
        si, pi = int(m.group(1)), int(m.group(2))
        return [s for s in slots if s.stage_index == si and s.pass_index == pi]
    if m := _NTH.match(sel):
        return [s for s in slots if s.name == m.group(1) and s.run == int(m.group(2))]
    if "." in sel:
        stage, _, name = sel.partition(".")
        return [s for s in slots if s.stage == stage and s.name == name]
    return [s for s in slots if s.name == sel]


def check_selector(sel: str, slots: list[PassSlot], where: str) -> None:
    if match_selector(sel, slots):
        return
    choices = sorted({s.name for s in slots} | {f"{s.stage}.{s.name}" for s in slots}
                     | {s.index for s in slots} | {f"{s.name}:{s.run}" for s in slots
                                                   if s.runs > 1})
    raise FlagError(f"{where}: pass selector {sel!r} matches no pass" + did_you_mean(sel, choices)
                    + "; run `graphkernel passes` to list them all (selectors: name, "
                      "stage.name, S.P, name:N)")


def name_checker(slots: list[PassSlot] | None = None) -> Callable[[str, str, str], str | None]:
    """Validate names in list flags against the registries; return canonical spellings."""
    slots = slots if slots is not None else build_pipeline()

    def check(kind: str, name: str, where: str) -> str | None:
        if kind == "pass":
            check_selector(name, slots, where)
            return name
        if kind == "pattern":
            pats = registry.PATTERNS
            if name.endswith("*") and any(p.startswith(name[:-1]) for p in pats):
                return name
            if name in pats:
                return name
            if not pats:
                raise FlagError(f"{where}: fusion pattern {name!r}: no fusion patterns are "
                                "registered in this build")
            raise FlagError(f"{where}: unknown fusion pattern {name!r}"
                            + did_you_mean(name.rstrip("*"), pats)
                            + " (exact names, or prefix* for a prefix); run `graphkernel "
                              "patterns` to list them all")
        if kind in ("op", "expand_op"):
            if not ops.exists(name):
                raise FlagError(f"{where}: unknown op {name!r}"
                                + did_you_mean(name, [o.name for o in ops.all_ops()])
                                + "; run `graphkernel ops` to list them all")
            canon = ops.canonical(name)
            if kind == "expand_op" and canon not in registry.EXPANDERS:
                raise FlagError(f"{where}: {canon!r} has no expander; expandable ops: "
                                "composite ops and " + ", ".join(
                                    sorted(n for n in registry.EXPANDERS
                                           if not ops.get(n).composite))
                                + " (see `graphkernel ops`)")
            return canon
        return name

    return check


# ---------------------------------------------------------------- enable rule
@dataclass(frozen=True)
class Decision:
    slot: PassSlot
    on: bool
    reason: str


def decide(slot: PassSlot, cfg: Config, forced: dict[int, str], disabled: dict[int, str]
           ) -> Decision:
    """The enable rule: required -> on; disabled -> off; forced -> on; feature flag; level.

    ``forced``/``disabled`` hold, per slot, the selector that switches it (``plan`` has
    already settled a slot named by both by the precedence of their sources)."""
    key = id(slot)
    if slot.info.required:
        return Decision(slot, True, "required")
    if key in disabled:
        return Decision(slot, False, f"disabled by --disable_pass={disabled[key]}")
    if key in forced:
        return Decision(slot, True, f"forced by --enable_pass={forced[key]}")
    if slot.info.feature is not None:
        flag, _ = slot.info.feature
        if not cfg.is_default(flag):
            value = cfg.value(flag)
            return Decision(slot, bool(value), f"--{flag}={'true' if value else 'false'}")
    lvl, opt = slot.info.level, cfg.opt_level
    if opt >= lvl:
        return Decision(slot, True, f"level {lvl} <= opt_level {opt}")
    return Decision(slot, False, f"level {lvl} > opt_level {opt}")


def plan(cfg: Config, slots: list[PassSlot] | None = None) -> list[Decision]:
    """Decide every slot; disabling a required pass is a FlagError.

    Precedence is per pass: a slot named by both an ``enable_pass`` and a ``disable_pass``
    selector follows the one from the higher source (explicit > env > file); from the same
    source, disabling wins."""
    slots = slots if slots is not None else build_pipeline()
    # id(slot) -> (rank of the source, selector with its origin) per list
    forced: dict[int, tuple[int, str]] = {}
    disabled: dict[int, tuple[int, str]] = {}
    for key, table in (("enable_pass", forced), ("disable_pass", disabled)):
        for sel in getattr(cfg, key):
            where = cfg.item_origin(key, sel)
            check_selector(sel, slots, f"{where}: --{key}")
            for s in match_selector(sel, slots):
                if key == "disable_pass" and s.info.required:
                    raise FlagError(f"{where}: --disable_pass={sel}: pass {s.name!r} is "
                                    "required (the pipeline needs it for correct results) "
                                    "and cannot be disabled")
                r = rank(where)
                if id(s) not in table or r >= table[id(s)][0]:
                    table[id(s)] = (r, f"{sel} ({where})")
    for k in set(forced) & set(disabled):
        if forced[k][0] > disabled[k][0]:
            del disabled[k]
        else:
            del forced[k]
    return [decide(s, cfg, {k: v for k, (_, v) in forced.items()},
                   {k: v for k, (_, v) in disabled.items()}) for s in slots]


def markdown_table(slots: list[PassSlot] | None = None) -> str:
    """The pipeline as the README's table: index, stage, pass, level, what it does."""
    rows = ["| idx | stage | pass | level | what it does |", "|---|---|---|---|---|"]
    for s in slots if slots is not None else build_pipeline():
        level = "required" if s.info.required else str(s.info.level)
        if s.info.feature is not None:
            level += f" (or `--{s.info.feature[0]}`)"
        rows.append(f"| {s.index} | {s.stage} | `{s.label}` | {level} | "
                    f"{s.info.summary.replace('|', '/')} |")
    return "\n".join(rows)


# ------------------------------------------------------------- bisect counter
class BisectCounter:
    """Numbers every rewrite application across a pipeline run (LLVM's opt-bisect).

    With ``scope`` (a pass name), only that pass's applications are numbered and limited;
    every other rewrite runs, so a bug a later pass would mask is still visible."""

    def __init__(self, limit: int = -1, printer: Callable[[str], None] | None = None,
                 scope: str = "") -> None:
        self.limit = limit
        self.count = 0
        self.refused = 0
        self.printer = printer
        self.scope = scope
        self.log = ApplicationLog()

    def should_apply(self, pass_name: str, description: str,
                     origin: list[str] | None = None) -> bool:
        if self.scope and pass_name != self.scope:
            return True
        self.count += 1
        ok = self.limit < 0 or self.count <= self.limit
        if not ok:
            self.refused += 1
        self.log.append(Application(self.count, pass_name, description, origin or [], ok))
        if self.printer is not None:
            verb = "running" if ok else "NOT running"
            self.printer(f"BISECT: {verb} ({self.count}) {pass_name} on {description}")
        return ok

    def replay(self, pass_name: str, entries: Sequence[tuple[str, tuple[int, ...]]],
               names: Sequence[str], origins: Sequence[tuple[str, ...]]) -> bool:
        """Number the rewrites ``entries`` (a description, a ``Template`` naming region nodes by
        position in ``names``, and the positions of the nodes touched, whose origins are
        ``origins``) at once, all allowed. Only without a limit, a printer or another pass's
        scope (False: then each goes through ``should_apply``)."""
        if self.limit >= 0 or self.printer is not None or \
                (self.scope and pass_name != self.scope):
            return False
        self.log.replay(self.count + 1, pass_name, entries, names, origins)
        self.count += len(entries)
        return True


# `graphkernel bisect run -- CMD` learns how many rewrites each compile of CMD numbered through
# this file (one count per line); the child's compiles append to it.
COUNT_ENV = "GRAPHKERNEL_BISECT_COUNT_FILE"


def report_count(applications: int) -> None:
    """Called by compile(): when a bisect driver asked for it, append this compile's count."""
    path = os.environ.get(COUNT_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{applications}\n")


class PassContext:
    """What a pass may use: the flags, the target (the backend's facts, loaded once per
    compile), a logger, the bisect counter, the analyses earlier passes left, the report's
    figures (``report``) and the dumper."""

    def __init__(self, cfg: Config, bisect: BisectCounter, log: Callable[[str], None],
                 target: Any = None) -> None:
        self.flags = cfg
        self.target = target
        self.bisect = bisect
        self._log = log
        self.current_pass = ""
        self.rewrites = 0
        self.notes: list[str] = []
        self.analyses = Analyses()
        self.report = ReportFigures()  # the figures a pass contributes to the report
        self.dumper: Dumper | None = None
        # the graph is as a model loader built and checked it (``PassManager``'s
        # ``checked_on_load``): the validate pass has nothing left to find in it
        self.checked_on_load = False

    def should_apply(self, description: str, nodes: Iterable[Node] = ()) -> bool:
        """Ask before each single rewrite (naming the nodes it touches); counts it and may
        refuse it (bisect_limit)."""
        origin = list(dict.fromkeys(o for n in nodes for o in n.origin))
        ok = self.bisect.should_apply(self.current_pass, description, origin)
        if ok:
            self.rewrites += 1
        return ok

    def replay_rewrites(self, entries: Sequence[tuple[str, tuple[int, ...]]],
                        region: Sequence[Node]) -> None:
        """Ask for the rewrites an equal region was allowed, on ``region``: each entry is a
        description (a ``Template`` of node positions) and the positions of the nodes it
        touches. Numbered as ``should_apply`` numbers them; allowed, as a replay only runs
        without a bisect limit."""
        names = [n.name for n in region]
        if self.bisect.replay(self.current_pass, entries, names, [n.origin for n in region]):
            self.rewrites += len(entries)
            return
        for text, idx in entries:
            self.should_apply(spelled(text, names), [region[i] for i in idx])

    def log(self, message: str) -> None:
        """Record a note for this pass (shown in the report and the compile summary)."""
        self.notes.append(message)

    def task(self, label: str, total: int | None = None) -> progress.Task:
        """A progress task for long work inside a pass (shown on a terminal, else a no-op)."""
        return progress.task(label, total)


# --------------------------------------------------------------------- report
@dataclass
class PassRecord:
    index: str
    stage: str
    name: str
    label: str
    run: int
    ran: bool
    reason: str
    seconds: float = 0.0
    changed: bool = False
    rewrites: int = 0
    nodes_after: int = 0
    summary: str = ""  # one line, shown by default
    notes: list[str] = field(default_factory=list)  # per-node detail, shown at --verbose


@dataclass
class RunReport:
    passes: list[PassRecord] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0
    bisect_applications: int = 0
    bisect_refused: int = 0
    bisect_limit: int = -1
    figures: ReportFigures = field(default_factory=ReportFigures)

    @property
    def extra(self) -> dict[str, Any]:
        """The figures the passes set, by name (the report's top-level entries)."""
        return self.figures.as_dict()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, figures=ReportFigures()))
        del d["figures"]
        return d | self.extra


# --------------------------------------------------------------------- hooks
class PassHook:
    """An instrument of a run (TVM's pass instruments): called at the start of the run,
    before and after every pass that runs, and at the end. The pass manager times passes,
    validates the graph and dumps it through hooks (``Timing``, ``Validation``, ``Dumps``);
    ``registry.register_hook`` adds one to every run (tests validate after every pass)."""

    def begin(self, graph: Graph, ctx: PassContext, report: RunReport) -> None:
        """Before the first pass."""

    def before(self, slot: PassSlot, graph: Graph, ctx: PassContext) -> None:
        """Before pass ``slot`` runs."""

    def after(self, slot: PassSlot, graph: Graph, ctx: PassContext, record: PassRecord,
              result: PassResult) -> None:
        """After pass ``slot`` ran and returned ``result``; ``record`` is its report line."""

    def end(self, graph: Graph, ctx: PassContext, report: RunReport) -> None:
        """After the last pass."""


class Timing(PassHook):
    """Each pass's wall time (``PassRecord.seconds``) and the whole run's."""

    def begin(self, graph: Graph, ctx: PassContext, report: RunReport) -> None:
        self._start = time.perf_counter()

    def before(self, slot: PassSlot, graph: Graph, ctx: PassContext) -> None:
        self._t0 = time.perf_counter()

    def after(self, slot: PassSlot, graph: Graph, ctx: PassContext, record: PassRecord,
              result: PassResult) -> None:
        record.seconds = time.perf_counter() - self._t0

    def end(self, graph: Graph, ctx: PassContext, report: RunReport) -> None:
        report.seconds = time.perf_counter() - self._start


class Validation(PassHook):
    """``graph.validate()`` after every pass that changed the graph: a broken invariant names
    the pass that broke it (the plugin's when a plugin's pass did)."""

    def after(self, slot: PassSlot, graph: Graph, ctx: PassContext, record: PassRecord,
              result: PassResult) -> None:
        if result.modified:
            try:
                graph.validate()
            except GraphKernelError as e:
                raise _blame(slot, f"pass {slot.label} left an invalid graph: {e}") from None


class Dumps(PassHook):
    """With ``dump_as_text``: the flags and the input graph first, then the IR after every
    pass that changed it, into the dump folder."""

    def __init__(self, dumper: Dumper, numbers: dict[int, int]) -> None:
        self.dumper = dumper
        self.numbers = numbers  # id(slot) -> its number in the pipeline (the dump's prefix)

    def begin(self, graph: Graph, ctx: PassContext, report: RunReport) -> None:
        self.dumper.write_json("flags.json", report.flags)
        self.dumper.write_text("0000_input.txt", str(graph))

    def after(self, slot: PassSlot, graph: Graph, ctx: PassContext, record: PassRecord,
              result: PassResult) -> None:
        if result.modified:
            seq = self.numbers[id(slot)]
            self.dumper.write_text(file_name(f"{seq:04d}_{slot.stage}_{slot.name}")
                                   + ".txt", str(graph))


# -------------------------------------------------------------------- manager
@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a block. A graph is a web of node <-> value
    references; the collector would rescan all of it over and over while a large graph is
    copied, compiled or written out (15% of the time on large graphs) and free nothing.
    Reference counting still frees what is dropped.

    Then every tracked object — what the block allocated, and the program's own young objects
    with it — is promoted to the oldest generation (``freeze`` then ``unfreeze``), where the
    next full collection looks at it, cycles left behind included:
    re-enabled as it is, the collector would scan all of it as young objects at the next
    allocation (2 of the 20 CPU seconds of a 100k-node compile). Skipped when the program
    froze objects itself (``unfreeze`` would release them too)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class PassManager:
    """Runs the pipeline the flags select on a graph, with ``target`` (the backend's facts)
    in the pass context, and reports what every pass did. Its hooks: timing, the ones
    ``hooks`` and ``registry.register_hook`` give, validation after every pass with
    ``check_each_pass``, and dumps when a dump folder is given (``dump_dir``, or the flags'
    ``debug_dir`` with ``dump_as_text``)."""

    def __init__(self, cfg: Config, target: Any = None, log: Callable[[str], None] | None = None,
                 check_each_pass: bool = False, dump_dir: str | None = None,
                 hooks: Sequence[PassHook] = (), checked_on_load: bool = False) -> None:
        self.cfg = cfg
        self.checked_on_load = checked_on_load  # (see ``api.compile``)
        self.target = target
        self.slots = build_pipeline()
        self.decisions = plan(cfg, self.slots)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        # called with (graph, ctx) after the last pass (final report figures); this
        # manager's own list, starting from the pipeline table's
        self.finish_hooks: list[Callable[[Graph, PassContext], None]] = list(registry.FINISH)
        dump_to = dump_dir if dump_dir is not None else (cfg.debug_dir if cfg.dump_as_text
                                                         else None)
        if dump_to is not None:
            check_dir(dump_to, "--debug_dir")  # before any pass runs
        self.dumper = Dumper(dump_to) if dump_to is not None else None
        self.hooks: list[PassHook] = [Timing(), *hooks, *registry.HOOKS]
        if check_each_pass and not any(isinstance(h, Validation) for h in self.hooks):
            self.hooks.append(Validation())
        if self.dumper is not None:
            numbers = {id(d.slot): k for k, d in enumerate(self.decisions, start=1)}
            self.hooks.append(Dumps(self.dumper, numbers))

    def run(self, graph: Graph) -> RunReport:
        with collector_paused():
            return self._run(graph)

    def _run(self, graph: Graph) -> RunReport:
        cfg = self.cfg
        printer = self.log if cfg.print_bisect else None
        bisect = BisectCounter(cfg.bisect_limit, printer, cfg.bisect_pass)
        ctx = PassContext(cfg, bisect, self.log, self.target)
        ctx.dumper = self.dumper
        ctx.checked_on_load = self.checked_on_load
        self.ctx = ctx
        report = RunReport(flags=cfg.to_dict(), nodes_before=len(graph),
                           bisect_limit=cfg.bisect_limit, figures=ctx.report)
        for h in self.hooks:
            h.begin(graph, ctx, report)
        ran: list[str] = []
        with progress.task("passes", sum(d.on for d in self.decisions)) as shown:
            for d in self.decisions:
                s = d.slot
                rec = PassRecord(s.index, s.stage, s.name, s.label, s.run, d.on, d.reason)
                report.passes.append(rec)
                if d.on:
                    shown.describe(s.label)
                    self._run_pass(s, rec, graph, ctx, ran)
                    shown.advance()
        for h in self.hooks:
            h.end(graph, ctx, report)
        report.nodes_after = len(graph)
        for hook in self.finish_hooks:
            hook(graph, ctx)
        report.bisect_applications = bisect.count
        report.bisect_refused = bisect.refused
        self.bisect = bisect
        return report

    def _run_pass(self, s: PassSlot, rec: PassRecord, graph: Graph, ctx: PassContext,
                  ran: list[str]) -> None:
        """Run one pass between the hooks and record what it did."""
        ctx.current_pass, ctx.rewrites, ctx.notes = s.name, 0, []
        for h in self.hooks:
            h.before(s, graph, ctx)
        try:
            result = s.info.fn(graph, ctx)
        except Exception as e:
            err = _pass_error(s, e, ran)
            if err is e:
                raise
            raise err from e
        if not isinstance(result, PassResult):
            raise _blame(s, f"pass {s.label} returned {type(result).__name__}, expected "
                            "PassResult")
        rec.changed = result.modified
        rec.rewrites = max(result.rewrites, ctx.rewrites)
        rec.notes = ctx.notes + result.notes
        rec.summary = result.summary or (rec.notes[0] if len(rec.notes) == 1 else
                                         f"{len(rec.notes)} notes" if rec.notes else "")
        rec.nodes_after = len(graph)
        graph.release_erased()
        ran.append(s.label)
        for h in self.hooks:
            h.after(s, graph, ctx, rec, result)


def _plugin_frame(tb: Any) -> str | None:
    """``file:line`` of the innermost traceback frame in plugin code, if any."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename in registry.PLUGIN_FILES:
            found = f"{code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _pass_error(s: PassSlot, e: Exception, ran: list[str]) -> GraphKernelError:
    """What a pass's exception becomes: a plugin's failure (exit 1) when plugin code raised
    it or the pass is a plugin's; graphkernel's own input errors as they are; anything else
    a bug in graphkernel (exit 3)."""
    at = _plugin_frame(e.__traceback__)
    if s.info.plugin or (at is not None and not isinstance(e, GraphKernelError)):
        origin = s.info.source.rpartition(":")[0] if s.info.plugin else at.rpartition(":")[0]
        return PluginError(
            f"plugin {origin}: pass {s.label} ({s.stage}) failed: {type(e).__name__}: {e}"
            + (f" (raised at {at})" if at else "")
            + f"; the plugin's code failed, not graphkernel's: fix the plugin or rerun with "
              f"--disable_pass={s.label}")
    if isinstance(e, GraphKernelError):
        return e
    before = ", ".join(ran[-5:]) or "none"
    return PassFailure(f"pass {s.label} ({s.stage}) failed: {type(e).__name__}: {e} "
                       f"(passes run before it: {before}); this is a bug in graphkernel: "
                       f"rerun with --disable_pass={s.label} to work around it")


def _blame(s: PassSlot, message: str) -> GraphKernelError:
    """A pass broke the pipeline's contract: the plugin's fault when it is a plugin's."""
    if s.info.plugin:
        return PluginError(f"plugin {s.info.source.rpartition(':')[0]}: {message}")
    return PassFailure(message)
