"""The ``torch.compile`` backend: ``torch.compile(model, backend="graphkernel")``.

The backend lowers Dynamo's graph to core ATen (AOT autograd with the core ATen
decompositions), imports it, runs the pass pipeline under the effective flags
(``AUTOFUSE_FLAGS`` or ``options={"flags": ...}``) and returns a callable that runs on the
CPU: fused kernels through the numpy interpreter (or, with ``options={"backend": "sim"}``,
through their generated Ascend C in the CPU simulator), unmapped ATen ops through torch.

Options (``torch.compile(..., options={...})``):

- ``flags``: a flag string or mapping, as for ``graphkernel compile``.
- ``backend``: ``reference`` (default) or ``sim``.
- ``freeze``: parameters and buffers become constants, like Inductor's ``freezing``. By
  default (``None``) this happens when the graph is compiled with grad disabled; ``True``
  also freezes the ones that do not require grad when grad is enabled; ``False`` never
  freezes. A frozen graph checks its tensors' version counters on every call and compiles
  again when one was written (an optimizer step, ``load_state_dict``).
- ``strict``: raise graphkernel's own failures instead of running the graph through torch
  (default: the environment's ``GRAPHKERNEL_TORCH_STRICT=1``, else off; tests run strict).

The backend never raises where eager runs. Complex tensors become real pairs (a last axis
of 2, ``complex_lowering``). A graph it cannot take (a complex op without a real lowering, an
unsigned dtype, an effect token, a higher-order op, a size it cannot model) runs through torch
as Dynamo gave it, with one logged reason; an op it has no kernel for (an ATen op without a
mapping, or a custom op of any namespace the program called) runs through torch inside the
compiled graph. A failure of graphkernel itself on a graph it accepted (a pass, the import,
the compiled graph's run) is a bug: it is logged with its traceback as a bug report and the
graph runs through torch, unless ``strict``. ``stats()`` counts all of them.

Each compiled graph logs one line on the ``graphkernel.torch`` logger (enable it with
``GRAPHKERNEL_LOG=info`` or ``TORCH_LOGS=graphkernel``); ``stats()`` sums them up with
Dynamo's graph breaks and recompiles. With ``dump_as_text`` each graph gets its own folder
``autofused_<n>`` under the debug directory (flags, per-pass IR, report) and the debug
directory gets an ``index.json`` listing them.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from graphkernel.errors import ExecutionError, GraphKernelError
from graphkernel.frontends import torch_decompositions

log = logging.getLogger("graphkernel.torch")
_COUNTER = itertools.count(1)
OPTIONS = ("flags", "backend", "freeze", "strict")
STRICT_ENV = "GRAPHKERNEL_TORCH_STRICT"  # "1": graphkernel's own failures raise
LAUNCH_KINDS = ("vector", "cube", "mix", "extern", "opaque")


# ------------------------------------------------------------------ logging
def configure_logging(env: Mapping[str, str] | None = None) -> int | None:
    """Attach a stderr handler to ``graphkernel.torch`` when ``GRAPHKERNEL_LOG`` names a level
    (``info``, ``debug``, ``warning``) or ``TORCH_LOGS`` names ``graphkernel`` (``+graphkernel``
    for debug, ``-graphkernel`` for errors only, as TORCH_LOGS spells levels). Returns the
    level set, or None when neither asks for it."""
    env = os.environ if env is None else env
    level = None
    want = env.get("GRAPHKERNEL_LOG", "").strip().upper()
    if want:
        level = logging.getLevelName(want)
        if not isinstance(level, int):
            raise ExecutionError(f"GRAPHKERNEL_LOG={env['GRAPHKERNEL_LOG']!r} is not a level "
                                 "(accepted: debug, info, warning, error)")
    for item in env.get("TORCH_LOGS", "").replace(" ", "").split(","):
        if item.lstrip("+-") == "graphkernel":
            level = {"+": logging.DEBUG, "-": logging.ERROR}.get(item[0], logging.INFO)
    if level is None:
        return None
    log.setLevel(level)
    if not any(getattr(h, "_graphkernel", False) for h in log.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[graphkernel] %(message)s"))
        h._graphkernel = True  # type: ignore[attr-defined]
        log.addHandler(h)
    return level


# -------------------------------------------------------------------- stats
@dataclass
class GraphSummary:
    """What the backend did with one ATen graph."""

    name: str
    role: str  # inference, forward or backward
    aten_ops: int
    ops_in: int  # graphkernel ops after import
    launches: dict[str, int]
    fallbacks: dict[str, str]  # ATen op -> why it runs through torch
    codegen_fallbacks: int
    frozen: int  # parameters, buffers and module float attributes inlined as constants
    recompile: bool
    seconds: float
    dump_dir: str | None = None
    symbols: list[str] = field(default_factory=list)  # symbolic dims of the graph's inputs
    through_torch: str = ""  # why the whole graph runs through torch ("" when it does not)
    bug: str = ""  # graphkernel's own failure on this graph (a bug report was logged)
    attentions: int = 0  # fused-attention launches (forward or gradient) among the externs
    # replaced by a later compile of the same graph (its frozen tensors were written, or the
    # graph serves other modules' tensors): this version no longer runs
    retired: bool = False

    def line(self) -> str:
        if self.through_torch:
            again = ", recompile" if self.recompile else ""
            return (f"{self.name} ({self.role}{again}): {self.aten_ops} ATen ops run through "
                    f"torch: {self.through_torch}; {self.seconds:.2f} s")
        kinds = ", ".join(f"{k} {self.launches.get(k, 0)}" for k in LAUNCH_KINDS)
        fb = "; ".join(f"{k}: {v}" for k, v in sorted(self.fallbacks.items())) or "none"
        frozen = f", {self.frozen} frozen tensors" if self.frozen else ""
        again = ", recompile" if self.recompile else ""
        dumps = f"; dumps in {self.dump_dir}" if self.dump_dir else ""
        return (f"{self.name} ({self.role}{frozen}{again}): {self.aten_ops} ATen ops -> "
                f"{self.ops_in} ops -> {sum(self.launches.values())} launches ({kinds}); "
                f"ATen fallbacks: {fb}; codegen fallbacks: {self.codegen_fallbacks}; "
                f"{self.seconds:.2f} s{dumps}")


@dataclass
class _Stats:
    graphs: list[GraphSummary] = field(default_factory=list)
    refreezes: int = 0
    shared: int = 0  # frozen graphs compiled again unfrozen: other modules' tensors came in
    run_bugs: int = 0  # compiled graphs that failed when run (and ran through torch)
    index: dict[str, list[dict]] = field(default_factory=dict)  # debug dir -> entries


_STATS = _Stats()


def stats() -> dict[str, Any]:
    """Totals over the graphs compiled since the last ``reset_stats()``: graphs (every
    compile), recompiles, Dynamo's graph breaks, launches by kind (and the fused attentions
    among the externs) of the compiled versions that run (a version replaced by a later
    compile of the same graph, ``retired``, no longer runs: its launches are listed in its
    ``per_graph`` entry and in ``retired_launches``), ATen fallbacks with their reasons."""
    from torch._dynamo.utils import counters

    launches: Counter = Counter()
    retired: Counter = Counter()
    fallbacks: dict[str, str] = {}
    whole: Counter = Counter()
    for s in _STATS.graphs:
        (retired if s.retired else launches).update(s.launches)
        fallbacks.update(s.fallbacks)
        if s.through_torch:
            whole[s.through_torch] += 1
    return {"graphs": len(_STATS.graphs),
            "recompiles": sum(s.recompile for s in _STATS.graphs if s.role != "backward"),
            "graph_breaks": sum(counters["graph_break"].values()),
            "refreezes": _STATS.refreezes,
            "shared": _STATS.shared,
            "launches": {k: launches.get(k, 0) for k in LAUNCH_KINDS},
            "retired_launches": {k: retired.get(k, 0) for k in LAUNCH_KINDS},
            "attentions": sum(s.attentions for s in _STATS.graphs if not s.retired),
            "fallbacks": fallbacks,
            "graphs_through_torch": dict(whole),
            "bugs": sum(bool(s.bug) for s in _STATS.graphs) + _STATS.run_bugs,
            "per_graph": [asdict(s) for s in _STATS.graphs]}


def reset_stats() -> None:
    """Forget the graphs counted so far (Dynamo's counters are reset by torch._dynamo.reset)."""
    _STATS.graphs.clear()
    _STATS.refreezes = 0
    _STATS.shared = 0
    _STATS.run_bugs = 0


def launch_counts(graph) -> dict[str, int]:
    """Launches of a compiled graph by kind (see ``graphkernel.codegen.traffic.launch_kind``)."""
    from graphkernel.codegen.traffic import launches

    out = dict.fromkeys(LAUNCH_KINDS, 0)
    for entry in launches(graph):
        out[entry["kind"]] += 1
    return out


def _attentions(graph) -> int:
    """Fused-attention launches of a compiled graph: the extern launches also count other
    vendor operators (a mixture of experts' grouped products), so the attention per layer is
    counted by op."""
    return sum(n.op in ("FusedAttention", "FusedAttentionGrad") for n in graph.nodes)


def _recompile() -> bool:
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return bool(cid is not None and getattr(cid, "frame_compile_id", 0))


# ------------------------------------------------------------------- runner
def _runner(imported, compiled, kernel_runner: Any = None) -> Callable[..., Any]:
    """The compiled graph as a callable with the FX graph's signature."""
    import numpy as np

    from graphkernel import symbolic
    from graphkernel.frontends.fx import fed_size, to_numpy, to_torch
    from graphkernel.interpreter import Interpreter

    names = [v.name for v in imported.graph.inputs]
    plain = [(i, d) for i, d in enumerate(imported.inputs)
             if isinstance(d, str) and d.isidentifier()]
    # a SymInt argument that is a multiple of a symbol (``8*s0x8``: a length the guards hold
    # to be a multiple of 8) binds that symbol
    scaled = [(i, d) for i, d in enumerate(imported.inputs)
              if isinstance(d, str) and not d.isidentifier()]

    graph_inputs = imported.graph.inputs

    def run(*args: Any) -> Any:
        feeds, symbols = {}, {}
        for spec, a in zip(imported.inputs, args, strict=False):
            if isinstance(spec, int) and not isinstance(spec, bool):
                feeds[names[spec]] = to_numpy(a)
        for i, d in plain:  # SymInt arguments bind their symbols directly
            symbols[d] = int(args[i])
        for i, d in scaled:
            symbolic.bind(d, int(args[i]), symbols)
        if imported.sizes:  # sizes read as numbers: their values, the symbols bound
            bound = dict(symbols)
            for v in graph_inputs:
                if v.name in feeds:
                    for dim, actual in zip(v.type.shape, feeds[v.name].shape, strict=False):
                        symbolic.bind(dim, actual, bound)
            for i, dim in imported.sizes.items():
                v = graph_inputs[i]
                feeds[v.name] = np.asarray(fed_size(dim, bound), v.type.dtype.np)
        interp = Interpreter(compiled, None, kernel_runner, symbols)
        outs = interp.run(feeds)
        result = []
        for kind, x in imported.outputs:
            if kind == "value":
                result.append(to_torch(outs[x]))
            elif kind == "dim":
                result.append(symbolic.evaluate(x, interp.env))
            else:
                result.append(None)
        return tuple(result)

    return run


def _dump_dir(flags: Any, env: Mapping[str, str], sub: str) -> str | None:
    """This graph's own dump folder under ``debug_dir`` (None when not dumping): ``sub``, or
    ``sub_<pid>`` (and a count) when another process (or an earlier run) already has it, so
    that no process overwrites another's dumps. The first one a process makes is logged with
    a warning: the user asked for dumps and should find them."""
    from graphkernel.api import load_config

    cfg = load_config(flags, env=env)
    if not cfg.dump_as_text:
        return None
    top = os.path.abspath(cfg.debug_dir)
    os.makedirs(top, exist_ok=True)
    for k in itertools.count():
        name = sub if k == 0 else f"{sub}_{os.getpid()}" + (f"_{k}" if k > 1 else "")
        path = os.path.join(top, name)
        try:
            os.mkdir(path)  # claimed: mkdir fails for every other taker
            break
        except FileExistsError:
            continue
    if not _STATS.index:
        log.warning("graphkernel: dump_as_text: each compiled graph's dumps go to a folder "
                    "under %s (index.json lists them); this one: %s", top, path)
    return path


def _write_index(top: str, entry: dict) -> None:
    """``index.json`` of the dump folder: this process's graphs added to what other
    processes listed there (each entry with its process id)."""
    import json

    from graphkernel.dump import Dumper

    entries = _STATS.index.setdefault(os.path.abspath(top), [])
    entries.append(entry | {"pid": os.getpid()})
    try:
        with open(os.path.join(top, "index.json")) as f:
            others = [e for e in json.load(f).get("graphs", []) if e.get("pid") != os.getpid()]
    except (OSError, ValueError, AttributeError):
        others = []
    Dumper(top).write_json("index.json", {"graphs": others + entries})


def _frozen_here(gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor] | None
                 ) -> dict[int, torch.Tensor]:
    """The frozen tensors by placeholder of an AOT graph. AOT keeps Dynamo's inputs in order
    (parameters first in a backward graph do not occur: backward graphs freeze nothing); when
    it changed them (duplicates, synthetic bases), nothing is frozen."""
    if not frozen:
        return {}
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = {}
    for i, t in frozen.items():
        val = phs[i].meta.get("val") if i < len(phs) else None
        if val is None or tuple(val.shape) != tuple(t.shape) or val.dtype != t.dtype:
            log.info("parameters not frozen: AOT autograd rearranged the graph's inputs")
            return {}
        out[i] = t
    return out


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
               options: dict[str, Any] | None = None, role: str = "inference",
               frozen: dict[int, torch.Tensor] | None = None) -> Callable[..., Any]:
    """Compile an ATen-level FX graph; returns a callable taking the same inputs.

    ``frozen`` maps placeholder indices to the tensors inlined as constants; the callable
    checks their version counters on every call and compiles again when one moved: with the
    new values inlined when the same tensors were written (an optimizer step,
    ``load_state_dict``), or once with those placeholders as inputs when other tensors come
    in their places. Dynamo compiles a function once for every module of its class (a layer's
    router after a graph break: the frame's ``self`` is an argument), so each layer calls the
    graph with its own weights; inlining each layer's in turn would compile again at every
    call. The unfrozen version serves every module from then on, and the version it replaces
    is retired (``stats()`` counts the launches of the versions that run)."""
    run, frozen, name = _compile_once(gm, example_inputs, options, role, frozen)
    if not frozen:
        return run
    with _real_tensors():
        state = {"key": _versions(frozen.values()), "run": run, "name": name,
                 "storages": _storages(frozen.values()), "shared": False}

    def guarded(*args: Any) -> Any:
        if state["shared"]:
            return state["run"](*args)
        if _versions(args[i] for i in frozen) != state["key"]:
            _retire(state["name"])
            live = {i: args[i] for i in frozen}
            if _storages(live.values()) != state["storages"]:
                _STATS.shared += 1
                log.info("%s: called with other tensors in the places of its frozen "
                         "parameters (the graph serves several modules); compiling it again "
                         "with them as inputs, for every module", state["name"])
                state["run"], _, state["name"] = _compile_once(gm, example_inputs, options,
                                                               role, None)
                state["shared"] = True
                return state["run"](*args)
            _STATS.refreezes += 1
            log.info("%s: frozen parameters were written since they were inlined; compiling "
                     "again", state["name"])
            state["run"], _, state["name"] = _compile_once(gm, example_inputs, options, role,
                                                           live)
            state["key"] = _versions(live.values())
        return state["run"](*args)

    return guarded


def _retire(name: str) -> None:
    """Mark the compiled version ``name`` as replaced: it no longer runs."""
    for s in reversed(_STATS.graphs):
        if s.name == name:
            s.retired = True
            return


def _real_tensors():
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _compile_once(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  options: dict[str, Any] | None, role: str,
                  frozen: dict[int, torch.Tensor] | None
                  ) -> tuple[Callable[..., Any], dict[int, torch.Tensor], str]:
    """One compile of ``gm`` with ``frozen``'s tensors (those that apply here) inlined: the
    runner, the tensors it inlined and the compiled graph's name. A graph graphkernel cannot
    take, or fails on, runs through torch (``gm`` itself) with its reason logged and counted;
    with ``strict`` graphkernel's own failures raise instead."""
    import graphkernel
    from graphkernel.errors import ConfigError, FrontendError
    from graphkernel.frontends.fx import import_fx_module, specialize_unmodelled, to_numpy

    t0 = time.perf_counter()
    options = dict(options or {})
    backend = options.get("backend", "reference")
    if backend not in ("reference", "sim"):
        raise ExecutionError(f"unknown backend {backend!r} (accepted: reference, sim)")
    strict = _strict(options)
    n = next(_COUNTER)
    name = f"autofused_{n}"
    aten_ops = sum(1 for x in gm.graph.nodes if x.op == "call_function")

    def through_torch(why: str, bug: str = "") -> tuple[Callable[..., Any], dict, str]:
        summary = GraphSummary(name, role, aten_ops, 0, {"opaque": aten_ops}, {}, 0, 0,
                               _recompile(), round(time.perf_counter() - t0, 3),
                               through_torch=why, bug=bug)
        _STATS.graphs.append(summary)
        if not bug:  # (a bug was logged with its report)
            log.warning("%s (%s) runs through torch: %s", name, role, why)
        log.info("%s", summary.line())
        return gm, {}, name

    from graphkernel.frontends.complex_lowering import NotLowered, lower_complex
    from graphkernel.frontends.expert_segments import group_segmented_products

    try:  # complex values as real pairs; the caller's signature kept by ``wrap``
        lowered = lower_complex(gm, example_inputs)
    except NotLowered as e:
        return through_torch(str(e))
    work = lowered.gm if lowered else gm  # (gm itself stays what runs through torch)
    if lowered:
        example_inputs = lowered.example_inputs
        if frozen:
            with _real_tensors():
                frozen = {i: torch.view_as_real(t.resolve_conj()) if t.is_complex() else t
                          for i, t in frozen.items()}
    why = unsupported(work)
    if why is not None:
        return through_torch(why)
    frozen = _frozen_here(work, frozen) if role != "backward" else {}
    try:
        # rows split by (data-dependent) sizes, one product per part: one grouped product
        work = group_segmented_products(work) or work
        fixed = specialize_unmodelled(work)
        if fixed:
            log.info("%s: sizes %s specialised (a convolution's or a size graphkernel cannot "
                     "keep symbolic); Dynamo recompiles when they change", name,
                     ", ".join(fixed))
        with _real_tensors():  # graph constants are real tensors; read them as such
            consts = {i: to_numpy(t).copy() for i, t in frozen.items()}
            imported = import_fx_module(work, example_inputs, name=name, constants=consts,
                                        strict=strict, sizes_in=True)
    except FrontendError as e:  # the graph holds what graphkernel cannot model
        return through_torch(str(e))
    except Exception as e:  # noqa: BLE001 - graphkernel's own failure: a bug, not the user's
        return through_torch(*_bug(e, name, role, "the import", strict))
    g = imported.graph  # built to be compiled: compiled in place (it keeps its inputs)
    n_nodes = len(g)
    symbols = sorted({str(d) for v in g.inputs for d in v.type.shape if isinstance(d, str)})
    env = dict(os.environ)
    flags = options.get("flags") or ""
    dump_dir = _dump_dir(flags, env, name)
    try:
        res = graphkernel.compile(g, flags, env=env, log=lambda m: None, dump_dir=dump_dir,
                                  copy=False)
        runner = None
        if backend == "sim":  # fused kernels run through their generated code
            from graphkernel.codegen.backend import SimBackend

            runner = SimBackend.for_result(res)
    except ConfigError:  # the user's flags: their error to see
        raise
    except Exception as e:  # noqa: BLE001 - a pass failed on a graph it accepted: a bug
        return through_torch(*_bug(e, name, role, "the pipeline", strict))
    if dump_dir is not None:
        from graphkernel.dump import Dumper

        Dumper(dump_dir).write_text("graph.txt", str(res.graph))
    summary = GraphSummary(
        name, role, aten_ops, n_nodes, launch_counts(res.graph), dict(imported.fallbacks),
        len(res.report.extra.get("fallbacks", [])), len(frozen), _recompile(),
        round(time.perf_counter() - t0, 3), dump_dir, symbols,
        bug="; ".join(imported.bugs.values()), attentions=_attentions(res.graph))
    _STATS.graphs.append(summary)
    log.info("%s", summary.line())
    if dump_dir is not None:
        _write_index(os.path.dirname(dump_dir), asdict(summary) |
                     {"dir": os.path.basename(dump_dir)})
    run = _runner(imported, res.graph, runner)
    if lowered:
        run = lowered.wrap(run)
    return _falling_back(run, gm, name, strict), frozen, name


def _strict(options: Mapping[str, Any]) -> bool:
    """Whether graphkernel's own failures raise (the ``strict`` option, else the
    environment's ``GRAPHKERNEL_TORCH_STRICT``)."""
    strict = options.get("strict")
    if strict is None:
        strict = os.environ.get(STRICT_ENV, "").strip() not in ("", "0")
    return bool(strict)


def _bug(e: BaseException, name: str, role: str, where: str, strict: bool) -> tuple[str, str]:
    """Report graphkernel's own failure on a graph (the log gets a bug report with the
    traceback) and return (why the graph runs through torch, the bug); with ``strict``,
    re-raise it."""
    if strict:
        raise e
    first = (str(e).strip().splitlines() or [""])[0]
    bug = f"{where} failed: {type(e).__name__}: {first}"[:500]
    log.error("bug in graphkernel: %s (%s): %s; the graph runs through torch instead. Please "
              "report it with this message and traceback (options={'strict': True} raises "
              "it)", name, role, bug, exc_info=e)
    return f"bug in graphkernel ({where})", bug


def _falling_back(run: Callable[..., Any], gm: torch.fx.GraphModule, name: str,
                  strict: bool) -> Callable[..., Any]:
    """``run`` that, when it fails where torch running ``gm`` does not, reports the failure
    as a bug and runs ``gm`` from then on (torch's random stream rewound first when the graph
    draws random numbers, so it draws what eager would). When torch fails too, its error is
    the program's own and is raised as eager would raise it."""
    if strict:
        return run
    from graphkernel.frontends.fx import _seeded

    seeded = any(n.op == "call_function" and _seeded(n) for n in gm.graph.nodes)
    state = {"fn": run}

    def call(*args: Any) -> Any:
        if state["fn"] is not run:
            return gm(*args)
        rng = torch.get_rng_state() if seeded else None
        try:
            return run(*args)
        except Exception as e:  # noqa: BLE001 - judged below: torch's error or graphkernel's
            if rng is not None:
                torch.set_rng_state(rng)
            out = gm(*args)  # raises what eager raises when the error is the program's
            state["fn"] = gm
            _STATS.run_bugs += 1
            _bug(e, name, "run", "running the compiled graph", False)
            return out

    return call


# higher-order ops that are one call of an operator (no subgraph, no token): they run through
# torch as one op of the graph (a custom op that writes its inputs, functionalized)
CALLABLE_HOPS = frozenset({"auto_functionalized", "auto_functionalized_v2"})


def unsupported(gm: torch.fx.GraphModule) -> str | None:
    """Why graphkernel cannot take an ATen graph at all (it then runs through torch), or
    None: a value of a dtype graphkernel has no type for (complex, unsigned wider than 8
    bits, float8), an effect token (``with_effects``: ops ordered by a token, such as linalg's
    error checks) or another higher-order op (control flow, subgraphs; not those of
    ``CALLABLE_HOPS``)."""
    from graphkernel.frontends.fx import torch_dtype

    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) \
                and n.target.name() not in CALLABLE_HOPS:
            if n.target is torch.ops.higher_order.with_effects:
                op = n.args[1] if len(n.args) > 1 else "an op"
                return f"effect tokens ({op} is ordered by a token)"
            return f"the higher-order op {n.target.name()}"
        val = n.meta.get("val")
        for v in val if isinstance(val, list | tuple) else [val]:
            if isinstance(v, torch.Tensor):
                try:
                    torch_dtype(v.dtype, n.name)
                except GraphKernelError:
                    where = n.target if n.op == "call_function" else "an input"
                    return f"torch dtype {v.dtype} has no graphkernel dtype ({where})"
    return None


def _versions(tensors) -> list[tuple]:
    """What says a frozen tensor changed: its storage and version counter; a 0-d tensor's
    value (Dynamo wraps a module's float attribute in a new tensor on every call); a NaN
    value is keyed by a name, since NaN never equals itself."""
    return [_value_key(t.item()) if t.dim() == 0 else (t.data_ptr(), t._version)
            for t in tensors]


def _storages(tensors) -> list[int]:
    """Which tensors are frozen (0-d ones aside, keyed by value: Dynamo wraps a float
    attribute in a new tensor on every call): their storages."""
    return [t.data_ptr() for t in tensors if t.dim() != 0]


def _value_key(v: Any) -> tuple:
    return ("nan",) if v != v else (v,)


# ------------------------------------------------------------------ freezing
_VIEWS = frozenset({"view", "reshape", "transpose", "t", "permute", "expand", "unsqueeze",
                    "squeeze", "narrow", "select", "__getitem__", "getitem", "as_strided",
                    "unflatten", "flatten", "split", "chunk", "view_as", "expand_as",
                    "contiguous", "detach"})


def _mutated(node: torch.fx.Node) -> bool:
    """Whether Dynamo's graph writes into ``node`` (or a view of it) in place."""
    import operator

    work, seen = [node], set()
    while work:
        n = work.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            target = u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")
            if u.target is operator.setitem or (target.endswith("_") and
                                                 not target.startswith("_")):
                if u.args and u.args[0] is n:
                    return True
            if target in _VIEWS or u.target is operator.getitem:
                work.append(u)
    return False


def _freezable(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
               freeze: bool | None) -> list[int]:
    """Indices of the placeholders that are module parameters or buffers to inline."""
    if freeze is False:
        return []
    grad = torch.is_grad_enabled()
    if grad and freeze is None:
        return []
    out = []
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (n, ex) in enumerate(zip(phs, example_inputs, strict=False)):
        arg = n.meta.get("grapharg")
        source = arg.source.name if arg is not None and arg.source is not None else ""
        source = source() if callable(source) else str(source)
        if not isinstance(ex, torch.Tensor) or not ("._parameters[" in source
                                                    or "._buffers[" in source
                                                    or _module_float(arg, source)):
            continue
        if (grad and ex.requires_grad) or _mutated(n):
            continue
        out.append(i)
    return out


def _module_float(arg: Any, source: str) -> bool:
    """Whether a placeholder is a float attribute of the module (a norm's epsilon, the
    attention's scale) that Dynamo did not specialise (``specialize_float`` off: it passes
    the float as a 0-d float64 tensor). Like a parameter it is the model's configuration:
    inlined, the scale is a constant the attention pattern can take and the epsilon folds.
    A float argument of ``forward`` (``L['temperature']``) stays an input."""
    return bool(getattr(arg, "pass_arg_as_tensor", False)) and source.startswith("L['self']")


# ------------------------------------------------------------------- tracing
def _aot(gm, example_inputs, options, frozen: dict[int, torch.Tensor] | None = None):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def compiler(role):
        def fn(graph_module, inputs):
            # boxed: AOT autograd hands the arguments as one list it may free early
            return make_boxed_func(compile_fx(graph_module, inputs, options, role, frozen))
        return fn

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        inference_compiler=compiler("inference"),
                        decompositions=torch_decompositions.decompositions())(
                            gm, example_inputs)


OFF_ENV = "GRAPHKERNEL_TORCH_BACKEND"  # "aot_eager": graphkernel off (torch's AOT-eager path)


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
            options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend (registered as "graphkernel"). With the environment's
    ``GRAPHKERNEL_TORCH_BACKEND=aot_eager`` graphkernel steps aside: Dynamo's graph runs on
    torch's own AOT-eager path (what ``graphkernel bisect run`` compares a failing program
    with before it says a failure is not graphkernel's)."""
    off = os.environ.get("GRAPHKERNEL_TORCH_BACKEND", "").strip()  # (OFF_ENV)
    if off:
        if off != "aot_eager":
            raise ExecutionError(f"{OFF_ENV}={off!r} (accepted: aot_eager, or unset)")
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")(gm, example_inputs)
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ExecutionError(f"unknown graphkernel option(s) {', '.join(unknown)} "
                             f"(accepted: {', '.join(OPTIONS)})")
    freeze = options.get("freeze")
    if freeze not in (None, True, False):
        raise ExecutionError(f"option freeze={freeze!r} (accepted: True, False, None)")
    if options.get("strict") not in (None, True, False):
        raise ExecutionError(f"option strict={options['strict']!r} (accepted: True, False, "
                             "None)")
    if options.get("backend", "reference") not in ("reference", "sim"):
        raise ExecutionError(f"unknown backend {options['backend']!r} (accepted: reference, "
                             "sim)")
    from graphkernel.api import load_config

    load_config(options.get("flags") or "", env=os.environ)  # the user's flags: checked now
    configure_logging()
    frozen = {i: example_inputs[i] for i in _freezable(gm, example_inputs, freeze)}
    from torch._dynamo.exc import RestartAnalysis

    try:
        return _aot(gm, example_inputs, options, frozen)
    except RestartAnalysis:
        # Dynamo's own signal (a Python scalar that tracing turned into a tensor: it re-traces
        # the frame with the scalar specialised), not a failure; Inductor lets it through too
        raise
    except Exception as e:
        data_dependent = _data_dependent(e)
        if _strict(options) and data_dependent is None:
            raise
        # AOT autograd could not trace Dynamo's graph with graphkernel's decomposition table:
        # the graph runs as Dynamo gave it
        name = f"autofused_{next(_COUNTER)}"
        if data_dependent is not None:  # what the graph computes, not a failure of ours
            why, bug = data_dependent, ""
            log.warning("%s (Dynamo's graph) runs through torch: %s", name, why)
        else:
            why, bug = _bug(e, name, "Dynamo's graph", "AOT autograd's tracing", False)
        ops = sum(1 for x in gm.graph.nodes if x.op == "call_function")
        _STATS.graphs.append(GraphSummary(name, "inference", ops, 0, {"opaque": ops}, {}, 0,
                                          0, _recompile(), 0.0, through_torch=why, bug=bug))
        return gm.forward


def _data_dependent(e: BaseException) -> str | None:
    """Why AOT autograd's tracing failed when the reason is a value only the run knows (a
    tensor read as a Python number, an output whose shape depends on the data): the graph
    then runs through torch, as Dynamo gave it. None for any other failure."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    kinds = (DataDependentOutputException, DynamicOutputShapeException,
             GuardOnDataDependentSymNode)
    while e is not None and not isinstance(e, kinds):
        e = e.__cause__ or e.__context__
    if e is None:
        return None
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return f"a data-dependent value in AOT tracing ({type(e).__name__}: {first})"
