"""Accuracy verification and bisection: find the pass, the single rewrite and the user's
nodes behind a mismatch, with a flag string that avoids it and a reproducer.

Judging (see the accuracy reference): a compiled result is *bad* only when it fails the
tolerance check against the unoptimized run AND its RMSE against a higher-precision
reference (float64, or float32 for fp16/bf16 graphs) is more than twice the unoptimized
run's own RMSE, or it has NaN/Inf that neither the unoptimized run nor the reference has.
Rounding noise (fp32 inside a fused fp16 kernel) is therefore never blamed.

Search: pass level (disable halves of the passes that rewrote something, every other pass
kept on, so a bug a later pass masks is still found), then application level inside the
culprit pass (``bisect_pass`` numbers only that pass's rewrites), then a flag string that
avoids it, checked by one more evaluation, and a reproducer graph.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphkernel.errors import ExecutionError, GraphKernelError
from graphkernel.interpreter import Interpreter, is_step, random_inputs
from graphkernel.ir import DType, Graph
from graphkernel.pipeline import COUNT_ENV
from graphkernel.verify import AccuracyReport, compare, tolerance

BACKENDS = ("reference", "sim")


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    return float(np.sqrt(np.mean((a[ok] - b[ok]) ** 2))) if ok.any() else 0.0


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    na, nb = np.linalg.norm(a[ok]), np.linalg.norm(b[ok])
    if na == 0 and nb == 0:
        return 1.0
    return float(a[ok] @ b[ok] / (na * nb)) if na and nb else 0.0


@dataclass
class Judgement:
    bad: bool
    reason: str
    cosine: float  # worst cosine against the high-precision reference
    report: AccuracyReport  # compiled vs unoptimized, per output
    rmse: list[float] = field(default_factory=list)  # compiled vs reference
    rmse_base: list[float] = field(default_factory=list)  # unoptimized vs reference

    sim_error: str = ""  # the simulator rejected a kernel (backend sim): always bad
    change: str = ""  # what moved, on the output furthest out of tolerance

    def short(self) -> str:
        return f"{'mismatch' if self.bad else 'ok'} ({self.change})"


def _change(name: str, actual: np.ndarray, expected: np.ndarray, dtype: Any) -> tuple[float, str]:
    """(excess, text): the element furthest out of tolerance (|a - e| / (atol + rtol |e|)) and
    a line naming its error and tolerance, e.g. ``max abs 3.1e-2 > tol 1e-3 on output y``."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if a.shape != e.shape:
        return math.inf, f"shape {list(a.shape)} != {list(e.shape)} on output {name}"
    if not a.size:
        return 0.0, f"empty output {name}"
    rtol, atol = tolerance(dtype)
    ok = np.isfinite(a) & np.isfinite(e)
    if not ok.all() and (np.isfinite(a) != np.isfinite(e)).any():
        k = int(np.sum(np.isfinite(a) != np.isfinite(e)))
        return math.inf, f"{k} NaN/Inf differ on output {name}"
    err = np.abs(np.where(ok, a, 0.0) - np.where(ok, e, 0.0))
    tol = atol + rtol * np.abs(np.where(ok, e, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):  # exact dtypes: tolerance 0
        ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0))
    i = int(np.argmax(ratio))
    rel = float(ratio.flat[i])
    sign = ">" if rel > 1 else "<="
    return rel, f"max abs {err.flat[i]:.2g} {sign} tol {tol.flat[i]:.2g} on output {name}"


def _new_nan_inf(actual: Any, base: Any, ref: Any) -> int:
    """NaN/Inf in ``actual`` that the unoptimized run ``base`` does not have (its own fp32
    overflow is not ours) and the higher-precision run ``ref`` does not have either. Where
    the exact math is non-finite too, the compiled run is the more accurate one: an op with
    a jump or a pole (Floor, Div) turns a working-precision rounding across it, such as
    fp16 rounding sin(1.576) = 0.99998 up to 1.0 before Floor, into a finite value the
    unoptimized run alone has."""
    a, b, r = (np.asarray(x, np.float64) for x in (actual, base, ref))
    same_as_ref = (a == r) | (np.isnan(a) & np.isnan(r))
    return int(np.sum(~np.isfinite(a) & np.isfinite(b) & ~same_as_ref))


class Observer:
    """Hooks a front end may give verify and bisect (the CLI shows them as progress): every
    method is a no-op here."""

    def evaluation(self, what: str) -> None:
        """A run starts: a reference run, or one compile + run under ``what`` flags."""

    def candidates(self, text: str) -> None:
        """The search narrowed: where the culprit is now known to be."""


class Evaluator:
    """Runs the reference once; then each evaluation is one compile + one run."""

    def __init__(self, graph: Graph, inputs: Mapping[str, np.ndarray] | None = None,
                 flags: str = "", backend: str = "reference", reference: str = "auto",
                 env: Mapping[str, str] | None = None, observer: Observer | None = None
                 ) -> None:
        self.observer = observer or Observer()
        if backend not in BACKENDS:
            raise ExecutionError(f"unknown backend {backend!r} (accepted: {', '.join(BACKENDS)})")
        self.graph = graph
        self.inputs = dict(inputs) if inputs is not None else random_inputs(graph, 0)
        self.flags = flags
        self.backend = backend
        self.env = env
        low = any(v.dtype.is_low_precision for v in graph.outputs)
        ref = {"auto": "float32" if low else "float64"}.get(reference, reference)
        if ref not in ("float32", "float64"):
            raise ExecutionError(f"reference precision {reference!r} is not float32 or float64")
        self.reference_dtype = ref
        self.observer.evaluation(f"reference run ({ref})")
        self.ref = Interpreter(graph, ref).run(self.inputs)
        # At a step function (Floor, a comparison, a cast to integers) the exact value of its
        # input and that value correctly rounded to its declared type are both the program's
        # answer: a kernel keeping fp32 through the step floors the first, one that stores
        # the value in its fp16 type (a kernel boundary) the second; noise either way.
        self.refs = [self.ref]
        wide = np.dtype(DType.parse(ref).np).itemsize
        if any(is_step(n) and any(v.dtype.is_float and v.dtype.np.itemsize < wide
                                  for v in n.inputs) for n in graph.nodes):
            self.refs.append(Interpreter(graph, ref, round_steps=True).run(self.inputs))
        self.observer.evaluation("unoptimized run")
        self.base = Interpreter(graph).run(self.inputs)
        self.base_err = [min(_rmse(b, run[i]) for run in self.refs)
                         for i, b in enumerate(self.base)]
        # the unoptimized run's own worst cosine: a low one is the model's, not a rewrite's
        self.base_cosine = min((_cos(b, r) for b, r in zip(self.base, self.ref, strict=True)),
                               default=1.0)
        self.evaluations = 0
        self._memo: dict[str, tuple[Judgement, Any]] = {}

    def compile(self, extra: str = ""):
        from graphkernel.api import compile as gk_compile

        return gk_compile(self.graph, f"{self.flags} {extra}".strip(),
                          env=self.env if self.env is not None else {}, log=lambda m: None)

    def judge(self, outs: Sequence[np.ndarray]) -> Judgement:
        rep = AccuracyReport()
        bad, reasons, worst = False, [], 1.0
        rmses = []
        change = (-1.0, "no outputs")
        for i, (v, o, b, r, eb) in enumerate(zip(self.graph.outputs, outs, self.base, self.ref,
                                                 self.base_err, strict=True)):
            change = max(change, _change(v.name, o, b, v.dtype), key=lambda c: c[0])
            m = compare(o, b, v.dtype, name=v.name)
            rep.outputs.append(m)
            e = min(_rmse(o, run[i]) for run in self.refs)
            rmses.append(e)
            worst = min(worst, _cos(o, r))
            new_nan = _new_nan_inf(o, b, r)
            if new_nan:
                bad = True
                reasons.append(f"{v.name}: {new_nan} NaN/Inf neither the unoptimized run nor "
                               f"the reference ({self.reference_dtype}) has")
            elif not m.passed:
                floor = 1e-3 * tolerance(v.dtype)[1]
                if e > max(2 * eb, floor):
                    bad = True
                    reasons.append(f"{v.name}: RMSE {e:.3g} vs the unoptimized run's "
                                   f"{eb:.3g} (reference {self.reference_dtype})")
        return Judgement(bad, "; ".join(reasons), worst, rep, rmses, list(self.base_err),
                         change=change[1])

    def sim_failure(self, e: Exception) -> Judgement:
        """A kernel the simulator rejected: as bad as a mismatch, and localised the same way."""
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return Judgement(True, f"simulator error: {first}", 0.0, AccuracyReport(),
                         sim_error=str(e), change=f"simulator error: {first[:120]}")

    def evaluate(self, res: Any, interpret: Sequence[str] = ()) -> Judgement:
        """Run and judge a compiled graph; a simulator error is a bad judgement."""
        from graphkernel.codegen.sim.runner import SimulatorError

        try:
            outs = self.execute(res, interpret)
        except SimulatorError as e:
            return self.sim_failure(e)
        return self.judge(outs)

    def execute(self, res: Any, interpret: Sequence[str] = ()) -> list[np.ndarray]:
        """Run a compiled graph: op by op, or its kernels' generated code in the simulator
        (except the kernels named in ``interpret``, run op by op)."""
        if self.backend == "sim" or interpret:
            from graphkernel.codegen.backend import run_sim

            return run_sim(res, self.inputs, interpret)[0]
        return Interpreter(res.graph).run(self.inputs)

    def run(self, extra: str = "") -> tuple[Judgement, Any]:
        """One evaluation (compile + run + judge); repeated flag strings are not re-run."""
        if extra in self._memo:
            return self._memo[extra]
        self.evaluations += 1
        self.observer.evaluation(f"compile + run with {extra or 'the given flags'}")
        res = self.compile(extra)
        self._memo[extra] = (self.evaluate(res), res)
        return self._memo[extra]


# ------------------------------------------------------------------- verify
def verify(graph: Graph, flags: str = "", inputs: Mapping[str, np.ndarray] | None = None,
           backend: str = "reference", env: Mapping[str, str] | None = None,
           observer: Observer | None = None) -> Judgement:
    """Compile with ``flags``, run compiled and unoptimized graphs on the same inputs, judge."""
    j, _ = Evaluator(graph, inputs, flags, backend, env=env, observer=observer).run()
    return j


# ------------------------------------------------------------------- bisect
@dataclass
class BisectResult:
    mismatch: bool
    evaluations: int
    pass_label: str = ""
    pass_name: str = ""
    stage: str = ""
    index: str = ""
    application: int = 0  # within the culprit pass (bisect_pass numbering)
    applications_in_pass: int = 0
    description: str = ""
    origin: list[str] = field(default_factory=list)
    with_it: str = ""
    without_it: str = ""
    flags: str = ""  # a flag string that avoids the problem (verified)
    kernel: str = ""  # kernel level (backend sim): the kernel whose generated code is wrong
    repro: str = ""  # always written when there is a mismatch (see write_repro)
    repro_reproduces: bool = False  # re-checked from the written files
    repro_kind: str = ""  # "cut subgraph" or "whole model"
    replay: str = ""  # the command that replays the reproducer
    repro_note: str = ""
    steps: list[str] = field(default_factory=list)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def summary(self) -> str:
        if not self.mismatch:
            return f"no mismatch ({self.message}); {self.evaluations} evaluation(s)"
        lines = [
            f"culprit: the generated code of kernel {self.kernel} (codegen, {self.index}), "
            f"kernel {self.application} of {self.applications_in_pass}"
            if self.kernel else
            f"culprit: pass {self.pass_label} ({self.stage}, {self.index}), application "
            f"{self.application} of {self.applications_in_pass}",
            f"rewrite: {self.description}",
            f"your nodes: {', '.join(self.origin) or '(none recorded)'}",
            f"with it: {self.with_it}; without it: {self.without_it}",
            f"avoid it with: {self.flags}" if self.flags else
            "no single flag avoids it (see the steps)",
        ]
        if self.repro:
            lines.append(f"reproducer ({self.repro_kind}): {self.repro} (re-checked: "
                         f"{'reproduces' if self.repro_reproduces else 'does NOT reproduce'})")
            if self.repro_note:
                lines.append(f"  {self.repro_note}")
            lines.append(f"replay it: {self.replay}")
        lines.append(f"{self.evaluations} evaluations")
        return "\n".join(lines)


def _pattern_of(description: str) -> str | None:
    m = re.match(r"^([a-z0-9_]+): ", description)
    return m.group(1) if m else None


def _op_of(description: str) -> str | None:
    m = re.search(r"\(([A-Za-z0-9]+)\)$", description)
    return m.group(1) if m else None


def bisect(graph_or_path: Graph | str | os.PathLike, inputs: Mapping[str, np.ndarray] | None = None,
           flags: str = "", backend: str = "reference", reference: str = "auto",
           repro_dir: str | os.PathLike | None = None,
           log: Callable[[str], None] | None = None,
           env: Mapping[str, str] | None = None,
           observer: Observer | None = None,
           plugins: Sequence[str] = ()) -> BisectResult:
    """Find the pass and the single rewrite that break accuracy under ``flags``; write a
    reproducer into ``repro_dir`` (a new temporary folder when not given). ``plugins``: the
    plugin files the replay command must load."""
    if isinstance(graph_or_path, Graph):
        graph = graph_or_path
    else:
        from graphkernel.frontends import load_model

        graph = load_model(graph_or_path)
    say = log or (lambda m: None)
    ev = Evaluator(graph, inputs, flags, backend, reference, env, observer)
    res = BisectResult(False, 0)
    j, full = ev.run()
    if not j.bad:
        res.evaluations = ev.evaluations
        res.message = f"the compiled graph matches within noise, {j.short()}"
        return res
    res.mismatch = True
    out_dir = Path(repro_dir) if repro_dir is not None else Path(
        tempfile.mkdtemp(prefix="graphkernel-bisect-"))
    changed = [p for p in full.report.passes if p.ran and p.rewrites > 0]
    est = 4 + math.ceil(math.log2(max(full.report.bisect_applications, 1)))
    step = [1]

    def record(what: str, jj: Judgement) -> None:
        step[0] += 1
        line = f"[step {step[0]}/~{est}] {what} -> {jj.short()}"
        res.steps.append(line)
        say(line)

    say(f"[step 1/~{est}] user flags -> {j.short()}")
    res.steps.append(f"[step 1/~{est}] user flags -> {j.short()}")
    if backend == "sim" and _search_kernels(ev, full, record, res, flags, out_dir, plugins):
        res.evaluations = ev.evaluations
        return res
    found = _search_global(ev, full, record) or _search_pass_level(ev, full, changed, record)
    if found is None:
        res.evaluations = ev.evaluations
        res.message = "no single rewrite explains the mismatch (see the steps)"
        _reproduce(ev, res, flags, out_dir, plugins)
        return res
    rec, app, j_with, j_without, n_in_pass, total = found
    label, name = rec.label, rec.name
    j_off = ev.run(f"--disable_pass={label}")[0]
    record(f"disable {label} alone", j_off)
    res.pass_label, res.pass_name, res.stage, res.index = label, name, rec.stage, rec.index
    res.application, res.applications_in_pass = n_in_pass, total
    res.description = app.description
    res.origin = app.origin
    res.with_it, res.without_it = j_with.short(), j_without.short()
    # the finest flag string that avoids it, checked by an evaluation
    options = []
    if name == "split" and (pat := _pattern_of(res.description)):
        options.append(f"--disable_fusion_pattern={pat}")
    if name == "expand" and (op := _op_of(res.description)):
        options.append(f"--disable_expand_ops={op}")
    if name == "recompute":
        options.append("--enable_recompute_fusion=false")
    options.append(f"--disable_pass={label}")
    _conclude(ev, res, flags, options, record, out_dir, plugins, recorded=options[-1])
    res.evaluations = ev.evaluations
    return res


def _conclude(ev: Evaluator, res: BisectResult, flags: str, options: Sequence[str], record,
              out_dir: Path, plugins: Sequence[str], recorded: str = "") -> None:
    """The first of ``options`` (finest first) checked to avoid the mismatch becomes the
    suggested flag string; then the reproducer. ``recorded``: an option already shown."""
    for opt in options:
        jj = ev.run(opt)[0]
        if opt != recorded:
            record(f"check {opt}", jj)
        if not jj.bad:
            res.flags = f"{flags} {opt}".strip()
            break
    _reproduce(ev, res, flags, out_dir, plugins)


def _reproduce(ev: Evaluator, res: BisectResult, flags: str, out_dir: Path,
               plugins: Sequence[str]) -> None:
    fix = res.flags[len(flags):].strip() if res.flags else ""
    culprit = ""
    if res.kernel:
        culprit = f"kernel {res.kernel}'s generated code ({res.index})"
    elif res.pass_name:
        culprit = (f"application {res.application} of {res.applications_in_pass} of pass "
                   f"{res.pass_name}: --bisect_pass={res.pass_name} "
                   f"--bisect_limit={res.application - 1} avoids it")
    r = write_repro(ev.graph, ev.inputs, res.origin, flags, out_dir, ev.backend, fix, culprit,
                    plugins)
    res.repro, res.repro_reproduces, res.repro_kind = r.path, r.reproduces, r.kind
    res.replay, res.repro_note = r.replay, r.note


def _search_kernels(ev: Evaluator, full, record, res: BisectResult, flags: str,
                    out_dir: Path, plugins: Sequence[str]) -> bool:
    """Kernel level (backend sim): if the compiled graph is right when every kernel runs op
    by op, a kernel's generated code is wrong. Halve the set of kernels run through their
    generated code until one remains. Fills ``res`` and returns True when found."""
    kernels = [n.name for n in full.graph.nodes if n.op == "GraphKernel"]

    def judge(interpret: Sequence[str], what: str) -> Judgement:
        ev.evaluations += 1
        ev.observer.evaluation(what)
        jj = ev.evaluate(full, interpret)
        record(what, jj)
        return jj

    if not kernels or judge(kernels, "every kernel op by op (no generated code)").bad:
        return False
    cands = kernels
    while len(cands) > 1:
        ev.observer.candidates(f"culprit among {len(cands)} of {len(kernels)} kernels")
        half = cands[: len(cands) // 2]
        rest = [k for k in kernels if k not in half]
        # generated code for `half` only: still bad -> the culprit is in it
        jj = judge(rest, f"generated code for {len(half)} of {len(cands)} candidate kernels")
        cands = half if jj.bad else cands[len(cands) // 2:]
    culprit = cands[0]
    without = judge([culprit], f"{culprit} op by op, every other kernel generated")
    if without.bad:
        return False
    with_it = judge([k for k in kernels if k != culprit], f"only {culprit} generated")
    node = full.graph.node(culprit)
    res.pass_label = res.pass_name = "codegen"
    res.stage, res.index = "codegen", next((p.index for p in full.report.passes
                                            if p.name == "codegen"), "")
    res.kernel = culprit
    res.application, res.applications_in_pass = kernels.index(culprit) + 1, len(kernels)
    res.description = (f"generated code of kernel {culprit} ({node.attrs['pattern']}: "
                       f"{', '.join(m.op for m in node.subgraph.nodes if m.op != 'Constant')})")
    res.origin = list(node.origin)
    res.with_it, res.without_it = with_it.short(), without.short()
    options = [f"--disable_fusion_pattern={p}"
               for p in dict.fromkeys(node.attrs["pattern"].replace("/", "+").split("+"))
               if p and p != "epilogue" and p != "single_node"]
    if res.origin:
        from graphkernel.outputs import Folder

        skip = Folder(out_dir).write_text("skip_nodes.ini",
                                            "[ByNodeName]\n" + "\n".join(res.origin) + "\n")
        options.append(f"--skip_node_names_cfg={skip}")
    options.append("--disable_pass=codegen")
    _conclude(ev, res, flags, options, record, out_dir, plugins)
    return True


def _pass_record(full, app_pass: str, nth_of_pass: int):
    """The pipeline record (label, stage, index) of the pass run holding that application."""
    seen = 0
    for p in full.report.passes:
        if p.name == app_pass and p.ran:
            seen += p.rewrites
            if seen >= nth_of_pass:
                return p
    return next(p for p in full.report.passes if p.name == app_pass)


def _search_global(ev: Evaluator, full, record):
    """Binary-search the global rewrite counter for the first application that turns the
    result bad, then confirm it with the rest of the pipeline kept on (so a later pass
    cannot mask it, and a prerequisite pass is not blamed for it)."""
    lo, hi = 0, full.report.bisect_applications
    judged: dict[int, Judgement] = {}
    while hi - lo > 1:
        ev.observer.candidates(f"first bad rewrite in {lo + 1}..{hi} of "
                               f"{full.report.bisect_applications}")
        mid = (lo + hi) // 2
        jj, _ = ev.run(f"--bisect_limit={mid}")
        judged[mid] = jj
        record(f"bisect_limit={mid}", jj)
        if jj.bad:
            hi = mid
        else:
            lo = mid
    app = next((a for a in full.applications if a.number == hi), None)
    if app is None:
        return None
    name = app.pass_name
    nth = sum(1 for a in full.applications if a.pass_name == name and a.number <= hi)
    total = sum(1 for a in full.applications if a.pass_name == name)
    without, _ = ev.run(f"--bisect_pass={name} --bisect_limit={nth - 1}")
    record(f"bisect_pass={name} bisect_limit={nth - 1} (only this rewrite refused)", without)
    if without.bad:
        return None  # something else is wrong too: fall back to the pass-level search
    with_it = judged.get(hi) or ev.run(f"--bisect_limit={hi}")[0]
    return _pass_record(full, name, nth), app, with_it, without, nth, total


def _search_pass_level(ev: Evaluator, full, changed, record):
    """Fallback: disable halves of the passes that rewrote something (every other pass on),
    then search the culprit pass's own applications."""
    cands = [p.label for p in changed]
    while len(cands) > 1:
        ev.observer.candidates(f"culprit among {len(cands)} passes ({', '.join(cands[:4])}"
                               f"{', ...' if len(cands) > 4 else ''})")
        half = cands[: len(cands) // 2]
        jj, _ = ev.run(f"--disable_pass={','.join(half)}")
        record(f"disable {','.join(half)}", jj)
        cands = half if not jj.bad else cands[len(cands) // 2:]
    if not cands:
        return None
    rec = next(p for p in changed if p.label == cands[0])
    name = rec.name
    total = sum(1 for a in full.applications if a.pass_name == name)
    lo, hi = 0, total
    known: dict[int, tuple[Judgement, Any]] = {}
    while hi - lo > 1:
        ev.observer.candidates(f"first bad rewrite of {name} in {lo + 1}..{hi} of {total}")
        mid = (lo + hi) // 2
        known[mid] = ev.run(f"--bisect_pass={name} --bisect_limit={mid}")
        record(f"bisect_pass={name} bisect_limit={mid}", known[mid][0])
        hi, lo = (mid, lo) if known[mid][0].bad else (hi, mid)
    if hi not in known:
        known[hi] = ev.run(f"--bisect_pass={name} --bisect_limit={hi}")
    j_without = known[lo][0] if lo in known else ev.run(f"--disable_pass={rec.label}")[0]
    apps = [a for a in known[hi][1].applications if a.pass_name == name]
    app = apps[hi - 1] if len(apps) >= hi else apps[-1]
    return rec, app, known[hi][0], j_without, hi, total


# --------------------------------------------------------------- reproducer
def _neighbourhood(graph: Graph, names: set[str]) -> Graph | None:
    """The nodes named (the culprit's origin) as a graph of their own: values from outside
    become inputs, values used outside become outputs."""
    nodes = [n for n in graph.nodes if n.name in names]
    if not nodes:
        return None
    ids = {id(n) for n in nodes}
    sub = Graph(f"repro_{nodes[0].name}")
    vmap: dict[int, Any] = {}
    for n in nodes:
        for v in n.inputs:
            if id(v) in vmap or (v.producer is not None and id(v.producer) in ids):
                continue
            p = v.producer
            if p is not None and p.op == "Constant":
                vmap[id(v)] = sub.add_node("Constant", [], {"value": p.attrs["value"]},
                                           name=sub.fresh_name(p.name)).output
            else:
                vmap[id(v)] = sub.add_input(v.name, v.type)
        sub.clone_node(n, vmap)
    outs = [vmap[id(v)] for n in nodes for v in n.outputs
            if any(id(u) not in ids for u in v.users) or graph.is_output(v)]
    sub.set_outputs(outs or [vmap[id(nodes[-1].outputs[0])]])
    return sub


MAX_HOPS = 6  # neighbourhood growth before the whole model is the reproducer


@dataclass
class Repro:
    """A reproducer as written and re-checked from its files."""

    kind: str  # "cut subgraph" or "whole model"
    path: str
    reproduces: bool
    replay: str  # the command that replays it (exit 1: the mismatch is there)
    note: str = ""  # whole model: the flags that fix it and the culprit application


def replay_command(path: Path, inputs: Path, flags: str, backend: str,
                   plugins: Sequence[str] = ()) -> str:
    """The verify command that replays a reproducer (exit 1 when it still mismatches)."""
    cmd = ["graphkernel", "verify", str(path), "--inputs", str(inputs)]
    if flags:
        cmd.append(f"--flags={flags}")
    if backend != "reference":
        cmd += ["--backend", backend]
    for p in plugins:
        cmd += ["--plugin", str(p)]
    return shlex.join(cmd)


def _bad(graph: Graph, feeds: Mapping[str, np.ndarray], flags: str, backend: str) -> bool:
    try:
        return Evaluator(graph, feeds, flags, backend).run()[0].bad
    except GraphKernelError:  # the cut does not compile or run on its own: not a reproducer
        return False


def _write_checked(graph: Graph, feeds: Mapping[str, np.ndarray], flags: str, backend: str,
                   out_dir: Path) -> tuple[Path, Path, Graph, dict[str, np.ndarray], bool]:
    """Write a graph and its inputs, load both back, and judge the loaded copy (what a
    replay sees, so a mismatch lost in writing is not reported as reproduced)."""
    from graphkernel.fileio import load_npz, save_npz
    from graphkernel.frontends import load_model
    from graphkernel.frontends.json_format import save_graph
    from graphkernel.outputs import Folder

    folder = Folder(out_dir)
    path, inputs = folder.path("repro.json"), folder.path("repro_inputs.npz")
    save_graph(graph, path)
    save_npz(inputs, feeds)
    try:
        loaded = load_model(path)
    except GraphKernelError:
        # the graph names an operator a model FILE may not run (an Opaque ATen call of a graph
        # built in-process): the files are written, and cannot replay it
        return path, inputs, graph, dict(feeds), False
    loaded_feeds = load_npz(inputs, {v.name: v.type for v in loaded.inputs})
    return path, inputs, loaded, loaded_feeds, _bad(loaded, loaded_feeds, flags, backend)


def write_repro(graph: Graph, inputs: Mapping[str, np.ndarray], origin: Sequence[str],
                flags: str, out_dir: Path, backend: str = "reference", fix: str = "",
                culprit: str = "", plugins: Sequence[str] = ()) -> Repro:
    """Write a reproducer and re-check it from its files: the culprit's neighbourhood (its
    nodes, grown one hop at a time, up to MAX_HOPS) with the values that reach it, the first
    that still mismatches on its own; else the whole model, with ``fix`` (a flag string that
    avoids the mismatch, re-checked too) and ``culprit`` (which application) in the note."""
    names = set(origin)
    for _ in range(MAX_HOPS if names else 0):
        sub = _neighbourhood(graph, names)
        if sub is None or len(sub) >= len(graph):
            break
        probe = graph.copy()
        probe.set_outputs([probe.value(v.name) for v in sub.inputs])
        feeds = dict(zip([v.name for v in sub.inputs], Interpreter(probe).run(inputs),
                         strict=True)) if sub.inputs else {}
        if _bad(sub, feeds, flags, backend):
            path, ins, *_, ok = _write_checked(sub, feeds, flags, backend, out_dir)
            if ok:
                return Repro("cut subgraph", str(path), True,
                             replay_command(path, ins, flags, backend, plugins))
            break
        grown = set(names)
        for n in graph.nodes:
            if n.name in names:
                grown |= {v.producer.name for v in n.inputs if v.producer is not None}
                grown |= {u.name for v in n.outputs for u in v.users}
        if grown == names:
            break
        names = grown
    path, ins, loaded, feeds, ok = _write_checked(graph, dict(inputs), flags, backend, out_dir)
    note = []
    if fix:
        fixed = not _bad(loaded, feeds, f"{flags} {fix}".strip(), backend)
        note.append(f"{fix!r} {'avoids it' if fixed else 'does NOT avoid it'} (re-checked)")
    if culprit:
        note.append(culprit)
    return Repro("whole model", str(path), ok, replay_command(path, ins, flags, backend, plugins),
                 "; ".join(note))


# ----------------------------------------------------------- external driver
STDERR_LINES = 12  # of a failing child's stderr, shown and kept


@dataclass
class ExternalResult:
    found: bool
    limit: int = 0
    upper: int = 0
    runs: int = 0
    culprit_line: str = ""
    message: str = ""
    stderr: list[str] = field(default_factory=list)  # last lines of the last failing run
    nothing_wrong: bool = False  # the program succeeded with every rewrite on
    # the program fails with every rewrite refused: does it pass with graphkernel off (its
    # torch.compile backend replaced by torch's AOT-eager path)? None: not asked
    passes_with_graphkernel_off: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


# with this in the environment the torch.compile backend steps aside for torch's own AOT-eager
# path (graphkernel/torch.py reads it): the program's run with graphkernel off
OFF_ENV = ("GRAPHKERNEL_TORCH_BACKEND", "aot_eager")


def _child(cmd: Sequence[str], limit: int | None, base_flags: str, count_file: str,
           off: bool = False) -> tuple[int, str, list[str]]:
    """Run the program once (``off``: with graphkernel's torch.compile backend off); (exit
    code, stdout + stderr, the last lines of stderr)."""
    env = dict(os.environ)
    extra = " --print_bisect" + (f" --bisect_limit={limit}" if limit is not None else "")
    env["AUTOFUSE_FLAGS"] = f"{base_flags}{extra}".strip()
    env[COUNT_ENV] = count_file
    if off:
        env[OFF_ENV[0]] = OFF_ENV[1]
    p = subprocess.run(list(cmd), env=env, capture_output=True, text=True)
    tail = [ln for ln in p.stderr.splitlines() if not ln.startswith("BISECT: ")]
    return p.returncode, p.stderr + p.stdout, tail[-STDERR_LINES:]


def check_command(cmd: Sequence[str]) -> str | None:
    """Why ``cmd`` cannot be run (missing, not executable), or None."""
    prog = cmd[0]
    if os.sep in prog or (os.altsep and os.altsep in prog):
        if not os.path.isfile(prog):
            return f"{prog}: no such file"
        if not os.access(prog, os.X_OK):
            return f"{prog}: not executable (chmod +x it, or run it through its interpreter)"
        return None
    if shutil.which(prog) is None:
        return f"{prog}: command not found on PATH"
    return None


def bisect_external(cmd: Sequence[str], max_n: int | None = None,
                    log: Callable[[str], None] | None = None) -> ExternalResult:
    """Bisect any program that uses graphkernel, judged by its exit code (0 = good)."""
    say = log or (lambda m: None)
    base = os.environ.get("AUTOFUSE_FLAGS", "")
    out = ExternalResult(False)
    with tempfile.TemporaryDirectory() as tmp:
        counts = os.path.join(tmp, "counts")
        rc, _, tail = _child(cmd, None, base, counts)
        out.runs += 1
        say(f"[run {out.runs}] every rewrite on -> {'good' if rc == 0 else 'bad'}")
        if rc == 0:
            out.nothing_wrong = True
            out.message = "the program succeeds with graphkernel's rewrites on"
            return out
        out.stderr = tail
        try:
            seen = [int(x) for x in Path(counts).read_text().split()]
        except (FileNotFoundError, ValueError):
            seen = []
        upper = max_n if max_n is not None else max(seen, default=0)
        if not seen and max_n is None:
            out.message = (f"the program failed (exit {rc}) but compiled nothing with "
                           "graphkernel (no application count was reported); pass --max N to "
                           "bisect anyway")
            return out
        out.upper = upper
        rc0, _, tail0 = _child(cmd, 0, base, counts)
        out.runs += 1
        say(f"[run {out.runs}] bisect_limit=0 -> {'good' if rc0 == 0 else 'bad'}")
        if rc0 != 0:
            out.stderr = tail0
            rc_off, _, tail_off = _child(cmd, None, base, counts, off=True)
            out.runs += 1
            say(f"[run {out.runs}] graphkernel off ({OFF_ENV[0]}={OFF_ENV[1]}) -> "
                f"{'good' if rc_off == 0 else 'bad'}")
            out.passes_with_graphkernel_off = rc_off == 0
            if rc_off == 0:
                out.message = (f"the program fails (exit {rc0}) with every rewrite refused but "
                               "passes with graphkernel off (torch.compile's AOT-eager path): "
                               "graphkernel's, before any rewrite (its import of the graphs "
                               "or an op it runs; `graphkernel.torch.step_bisect` narrows a "
                               "training step down)")
            else:
                out.stderr = tail_off
                out.message = (f"the program fails (exit {rc0}) with every rewrite refused, "
                               f"and (exit {rc_off}) with graphkernel off too (torch.compile's "
                               "AOT-eager path): not graphkernel's")
            return out
        lo, hi = 0, upper
        while hi - lo > 1:
            mid = (lo + hi) // 2
            rc, _, tail = _child(cmd, mid, base, counts)
            out.runs += 1
            say(f"[run {out.runs}] bisect_limit={mid} -> {'good' if rc == 0 else 'bad'}")
            if rc == 0:
                lo = mid
            else:
                hi = mid
                out.stderr = tail
        rc, text, tail = _child(cmd, hi, base, counts)
        out.runs += 1
        if rc == 0:  # the program is not deterministic in its verdict
            out.message = (f"bisect_limit={hi} failed once and then succeeded: the program's "
                           "verdict is not repeatable")
            return out
        out.stderr = tail
        out.found, out.limit = True, hi
        out.culprit_line = next((ln for ln in text.splitlines()
                                 if ln.startswith(f"BISECT: running ({hi}) ")), "")
    return out


def _main_external(argv: Sequence[str]) -> int:
    """``graphkernel bisect run [--max N] [--report OUT.json] -- CMD ARGS...``: exit 0 when
    a culprit was found, 1 when it could not bisect (the reason is printed), 2 when the
    command cannot be run."""
    import argparse

    ap = argparse.ArgumentParser(prog="graphkernel bisect run",
                                 description="Bisect a program that uses graphkernel by its "
                                             "exit code (0 = good).")
    ap.add_argument("--max", type=int, default=None, help="upper bound of applications")
    ap.add_argument("--report", metavar="OUT.json", help="write the result as JSON")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("graphkernel: error: give the program after --, e.g. "
              "graphkernel bisect run -- python train.py", file=sys.stderr)
        return 2
    if (why := check_command(cmd)) is not None:
        print(f"graphkernel: error: bisect run: {why}", file=sys.stderr)
        return 2
    r = bisect_external(cmd, args.max, log=print)
    if r.stderr:
        print(f"last lines of the failing run's stderr ({len(r.stderr)}):")
        print("\n".join(f"  | {ln}" for ln in r.stderr))
    if args.report:
        from graphkernel.dump import Dumper

        Dumper(Path(args.report).parent).write_json(Path(args.report).name, r.to_dict())
    if not r.found:
        print(("nothing to bisect: " if r.nothing_wrong else "could not bisect: ") + r.message)
        return 0 if r.nothing_wrong else 1
    print(f"first bad application: {r.limit} of {r.upper} ({r.runs} runs)")
    if r.culprit_line:
        print(r.culprit_line)
        m = re.match(r"BISECT: running \(\d+\) ([a-z0-9_]+) on", r.culprit_line)
        if m:
            print(f'avoid it with: AUTOFUSE_FLAGS="--disable_pass={m.group(1)}"')
    return 0
