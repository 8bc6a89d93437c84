"""PyTorch integration: ``torch.compile(model, backend="graphkernel")`` and bisection.

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
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from graphkernel.errors import ExecutionError

log = logging.getLogger("graphkernel.torch")
_COUNTER = itertools.count(1)
OPTIONS = ("flags", "backend", "freeze")
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

    def line(self) -> str:
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
    index: dict[str, list[dict]] = field(default_factory=dict)  # debug dir -> entries


_STATS = _Stats()


def stats() -> dict[str, Any]:
    """Totals over the graphs compiled since the last ``reset_stats()``: graphs, recompiles,
    Dynamo's graph breaks, launches by kind, ATen fallbacks with their reasons."""
    from torch._dynamo.utils import counters

    launches: Counter = Counter()
    fallbacks: dict[str, str] = {}
    for s in _STATS.graphs:
        launches.update(s.launches)
        fallbacks.update(s.fallbacks)
    return {"graphs": len(_STATS.graphs),
            "recompiles": sum(s.recompile for s in _STATS.graphs if s.role != "backward"),
            "graph_breaks": sum(counters["graph_break"].values()),
            "refreezes": _STATS.refreezes,
            "launches": {k: launches.get(k, 0) for k in LAUNCH_KINDS},
            "fallbacks": fallbacks,
            "per_graph": [asdict(s) for s in _STATS.graphs]}


def reset_stats() -> None:
    """Forget the graphs counted so far (Dynamo's counters are reset by torch._dynamo.reset)."""
    _STATS.graphs.clear()
    _STATS.refreezes = 0


def launch_counts(graph) -> dict[str, int]:
    """Launches of a compiled graph by kind (see ``graphkernel.codegen.traffic.launch_kind``)."""
    from graphkernel.codegen.traffic import launches

    out = dict.fromkeys(LAUNCH_KINDS, 0)
    for entry in launches(graph):
        out[entry["kind"]] += 1
    return out


def _recompile() -> bool:
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return bool(cid is not None and getattr(cid, "frame_compile_id", 0))


# ------------------------------------------------------------------- runner
def _runner(imported, compiled, kernel_runner: Any = None) -> Callable[..., Any]:
    """The compiled graph as a callable with the FX graph's signature."""
    from graphkernel import symbolic
    from graphkernel.frontends.fx import to_numpy, to_torch
    from graphkernel.interpreter import Interpreter

    names = [v.name for v in imported.graph.inputs]
    plain = [(i, d) for i, d in enumerate(imported.inputs)
             if isinstance(d, str) and d.isidentifier()]

    def run(*args: Any) -> Any:
        feeds, symbols = {}, {}
        for spec, a in zip(imported.inputs, args, strict=False):
            if isinstance(spec, int) and not isinstance(spec, bool):
                feeds[names[spec]] = to_numpy(a)
        for i, d in plain:  # SymInt arguments bind their symbols directly
            symbols[d] = int(args[i])
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
    checks their version counters on every call and compiles again when one moved."""
    run, frozen, name = _compile_once(gm, example_inputs, options, role, frozen)
    if not frozen:
        return run
    with _real_tensors():
        state = {"key": _versions(frozen.values()), "run": run, "name": name}

    def guarded(*args: Any) -> Any:
        if _versions(args[i] for i in frozen) != state["key"]:
            _STATS.refreezes += 1
            log.info("%s: frozen parameters were written since they were inlined; compiling "
                     "again", state["name"])
            live = {i: args[i] for i in frozen}
            state["run"], _, state["name"] = _compile_once(gm, example_inputs, options, role,
                                                           live)
            state["key"] = _versions(live.values())
        return state["run"](*args)

    return guarded


def _real_tensors():
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _compile_once(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  options: dict[str, Any] | None, role: str,
                  frozen: dict[int, torch.Tensor] | None
                  ) -> tuple[Callable[..., Any], dict[int, torch.Tensor], str]:
    """One compile of ``gm`` with ``frozen``'s tensors (those that apply here) inlined: the
    runner, the tensors it inlined and the compiled graph's name."""
    import graphkernel
    from graphkernel.frontends.fx import import_fx_module, specialize_unmodelled, to_numpy

    t0 = time.perf_counter()
    options = dict(options or {})
    backend = options.get("backend", "reference")
    if backend not in ("reference", "sim"):
        raise ExecutionError(f"unknown backend {backend!r} (accepted: reference, sim)")
    frozen = _frozen_here(gm, frozen) if role != "backward" else {}
    n = next(_COUNTER)
    name = f"autofused_{n}"
    fixed = specialize_unmodelled(gm)
    if fixed:
        log.info("%s: sizes %s specialised (a convolution's or a size graphkernel cannot keep "
                 "symbolic); Dynamo recompiles when they change", name, ", ".join(fixed))
    with _real_tensors():  # graph constants are real tensors; read them as such
        consts = {i: to_numpy(t).copy() for i, t in frozen.items()}
        imported = import_fx_module(gm, example_inputs, name=name, constants=consts)
    g = imported.graph  # built to be compiled: compiled in place (it keeps its inputs)
    n_nodes = len(g)
    symbols = sorted({str(d) for v in g.inputs for d in v.type.shape if isinstance(d, str)})
    env = dict(os.environ)
    flags = options.get("flags") or ""
    dump_dir = _dump_dir(flags, env, name)
    res = graphkernel.compile(g, flags, env=env, log=lambda m: None, dump_dir=dump_dir,
                              copy=False)
    if dump_dir is not None:
        from graphkernel.dump import Dumper

        Dumper(dump_dir).write_text("graph.txt", str(res.graph))
    summary = GraphSummary(
        name, role, sum(1 for x in gm.graph.nodes if x.op == "call_function"), n_nodes,
        launch_counts(res.graph), dict(imported.fallbacks),
        len(res.report.extra.get("fallbacks", [])), len(frozen), _recompile(),
        round(time.perf_counter() - t0, 3), dump_dir, symbols)
    _STATS.graphs.append(summary)
    log.info("%s", summary.line())
    if dump_dir is not None:
        _write_index(os.path.dirname(dump_dir), asdict(summary) |
                     {"dir": os.path.basename(dump_dir)})
    runner = None
    if backend == "sim":  # fused kernels run through their generated code
        from graphkernel.codegen.backend import SimBackend

        runner = SimBackend.for_result(res)
    run = _runner(imported, res.graph, runner)
    return run, frozen, name


def _versions(tensors) -> list[tuple]:
    """What says a frozen tensor changed: its storage and version counter; a 0-d tensor's
    value (Dynamo wraps a module's float attribute in a new tensor on every call); a NaN
    value is keyed by a name, since NaN never equals itself."""
    return [_value_key(t.item()) if t.dim() == 0 else (t.data_ptr(), t._version)
            for t in tensors]


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


# ------------------------------------------------------------ decompositions
# ATen ops traced whole: the fused attention overloads and their backwards, imported as
# FusedAttention / FusedAttentionGrad (graphkernel/frontends/fx.py). The math overload
# (``_scaled_dot_product_attention_math``, what torch itself runs for dropout or a mask that
# needs its gradient) stays an exact decomposition.
KEEP_WHOLE = frozenset({
    "aten.scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_cudnn_attention_backward",
})
_REFUSED: dict[str, str] = {}  # decomposition rules refused, with why (logged once each)


def decompositions(checked: bool = True) -> dict[Any, Callable[..., Any]]:
    """The decomposition table training and inference graphs are traced with: the core ATen
    decompositions without the ops of ``KEEP_WHOLE``, each rule checked against its op.

    A rule stands in for its op only where it returns what the op returns: the same number
    of outputs, each of the op's shape and dtype (``faithful``). An op's backward reads the
    forward's outputs as the op defines them, so a rule that returns something else there
    (torch's rule for the CPU flash attention returns the attention weights [B, H, L, S]
    where the op returns its logsumexp [B, H, L]) would feed the backward the wrong saved
    tensor. Refused, the op is traced whole and runs as itself. (``checked=False``: the
    rules as they are, for an inference graph, whose outputs no backward reads.)"""
    from torch._decomp import core_aten_decompositions

    table = {}
    for op, rule in core_aten_decompositions().items():
        name = str(op).rsplit(".", 1)[0]
        if name in KEEP_WHOLE:
            continue
        table[op] = faithful(op, rule) if checked else rule
    return table


_CHECKING = threading.local()  # inside a check: an op's own run may come back to its rule


def faithful(op: Any, rule: Callable[..., Any]) -> Callable[..., Any]:
    """``rule`` (a decomposition of ``op``) where its outputs match the op's own in count,
    shape and dtype on the arguments at hand; elsewhere NotImplemented (make_fx then traces
    the op itself). Both are run on the fake arguments without tracing, once per kind of
    argument (shapes, dtypes, plain values); an op that writes its arguments is not run
    twice, and its rule is taken as it is."""
    if op._schema.is_mutable:
        return rule
    verdicts: dict[Any, bool] = {}

    def checked(*args: Any, **kwargs: Any) -> Any:
        if getattr(_CHECKING, "on", False):  # (the op itself decomposes to this rule)
            return rule(*args, **kwargs)
        key = _signature((args, kwargs))
        ok = verdicts.get(key)
        if ok is None:
            _CHECKING.on = True
            try:
                ok = verdicts[key] = _same_outputs(op, rule, args, kwargs)
            finally:
                _CHECKING.on = False
        return rule(*args, **kwargs) if ok else NotImplemented

    return checked


def _signature(x: Any) -> Any:
    """A hashable key of an argument structure: tensors by shape and dtype."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(str(d) for d in x.shape), str(x.dtype))
    if isinstance(x, dict):
        return tuple((k, _signature(v)) for k, v in sorted(x.items()))
    if isinstance(x, list | tuple):
        return tuple(_signature(v) for v in x)
    return (type(x).__name__, str(x))


def _same_outputs(op: Any, rule: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether ``rule`` returns what ``op`` returns on these (fake) arguments."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    from torch.utils._pytree import tree_map

    def fresh() -> tuple[tuple, dict]:  # new lists around the same tensors: some rules
        return tree_map(lambda x: x, (args, kwargs))  # write into the lists they are given

    try:
        with disable_proxy_modes_tracing():
            a, k = fresh()
            want = op(*a, **k)
            a, k = fresh()
            got = rule(*a, **k)
    except Exception:  # noqa: BLE001 - not checkable here: the rule runs as it would have
        return True
    if got is NotImplemented:
        return True
    why = _output_difference(want, got)
    if why is None:
        return True
    name = str(op)
    if name not in _REFUSED:
        _REFUSED[name] = why
        log.info("decomposition of %s not used: %s; the op is traced whole", name, why)
    return False


def _output_difference(want: Any, got: Any) -> str | None:
    """What differs between an op's outputs and its rule's (None when nothing does)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    ws = list(want) if isinstance(want, list | tuple) else [want]
    gs = list(got) if isinstance(got, list | tuple) else [got]
    if len(ws) != len(gs):
        return f"{len(gs)} outputs where the op has {len(ws)}"
    for i, (w, g) in enumerate(zip(ws, gs, strict=True)):
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if isinstance(w, torch.Tensor) != isinstance(g, torch.Tensor):
                return f"output {i} is {type(g).__name__} where the op's is {type(w).__name__}"
            continue
        same = len(w.shape) == len(g.shape) and all(
            statically_known_true(a == b) for a, b in zip(w.shape, g.shape, strict=True))
        if not same or w.dtype != g.dtype:
            return (f"output {i} is {g.dtype} {list(g.shape)} where the op's is "
                    f"{w.dtype} {list(w.shape)}")
    return None


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
                        decompositions=decompositions())(gm, example_inputs)


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
    configure_logging()
    frozen = {i: example_inputs[i] for i in _freezable(gm, example_inputs, freeze)}
    return _aot(gm, example_inputs, options, frozen)


def export_graph(model: torch.nn.Module, example_inputs: Sequence[Any], name: str = "model"):
    """A model's inference graph as a graphkernel Graph (torch.export at the core ATen level,
    attention kept whole: ``decompositions()``; parameters and buffers become constants). A
    transformers model is exported with ``use_cache=False`` (its KV cache output is not a
    tensor); a model torch.export cannot trace is a FrontendError naming the model and
    torch's reason."""
    from graphkernel.errors import FrontendError
    from graphkernel.frontends.fx import import_fx, to_numpy

    config = getattr(model, "config", None)
    cached = getattr(config, "use_cache", None) is True
    if cached:  # a KV cache object as an output is no tensor torch.export can return; an
        # inference graph of one forward pass does not need it
        log.info("export_graph: %s exported with use_cache=False (the KV cache is not part of "
                 "one forward pass)", type(model).__name__)
        config.use_cache = False
    try:
        ep = torch.export.export(model.eval(), tuple(example_inputs))
    except Exception as e:  # torch.export's own error: one line naming the model
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FrontendError(f"export_graph({type(model).__name__}): torch.export cannot trace "
                            f"the model: {first}") from None
    finally:
        if cached:
            config.use_cache = True
    ep = ep.run_decompositions(decompositions(checked=False))
    g = import_fx(ep.graph_module, None, name=name)
    consts = {}
    sig = ep.graph_signature
    for spec in sig.input_specs:
        if spec.target is not None and spec.arg.name in [v.name for v in g.inputs]:
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants.get(spec.target)
            if t is not None:
                consts[spec.arg.name] = to_numpy(t)
    return _inline_inputs(g, consts)


def _inline_inputs(g, consts: dict[str, Any]):
    """Turn the named graph inputs (parameters) into constants."""
    from graphkernel.ir import Graph

    out = Graph(g.name)
    vmap = {}
    for v in g.inputs:
        if v.name in consts:
            vmap[id(v)] = out.add_node("Constant", [], {"value": consts[v.name]},
                                       name=out.fresh_name(v.name)).output
        else:
            vmap[id(v)] = out.add_input(v.name, v.type)
    for n in g.nodes:
        out.clone_node(n, vmap)
    out.set_outputs([vmap[id(v)] for v in g.outputs])
    return out


def bisect(model: torch.nn.Module, example_inputs: Sequence[Any],
           check: Callable[[Sequence[Any]], bool] | None = None, flags: str = "",
           backward: bool = False, **kw: Any):
    """Bisect a PyTorch model: export it, then find the pass and rewrite that break its
    accuracy (``check`` is not needed: the judge compares with a float64 reference).

    With ``backward``, check a training step instead (``step_bisect``): the gradients as well
    as the output, through torch.compile's forward and backward graphs."""
    from graphkernel.bisect import bisect as run_bisect
    from graphkernel.frontends.fx import to_numpy

    if backward:
        return step_bisect(model, example_inputs, flags=flags, **kw)
    g = export_graph(model, example_inputs)
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, tensors, strict=True)}
    return run_bisect(g, feeds, flags, **kw)


# ------------------------------------------------------------ training steps
@dataclass
class StepBisect:
    """What ``step_bisect`` found about a training step through ``torch.compile``.

    ``stage`` names where a difference starts: ``""`` (none: the step matches eager),
    ``"torch.compile"`` (torch's own AOT-eager path differs from eager the same way: not
    graphkernel's), ``"tracing"`` (the ATen graphs graphkernel is given, run by torch, already
    differ: the decomposition table), ``"import"`` (graphkernel's unoptimized import of one
    graph differs from torch running that graph), ``"pipeline"`` (a pass: ``result`` is the
    graph-level bisect of that graph)."""

    mismatch: bool
    stage: str = ""
    graph: str = ""  # the graph it starts in: forward or backward
    differ: list[str] = field(default_factory=list)  # outputs / gradients that differ
    message: str = ""
    result: Any = None  # graphkernel.bisect.BisectResult of the pipeline stage

    def summary(self) -> str:
        head = f"{self.stage or 'no mismatch'}: {self.message}"
        if self.differ:
            head += f"\ndiffering: {', '.join(self.differ[:12])}" + (
                f" (+{len(self.differ) - 12})" if len(self.differ) > 12 else "")
        if self.result is not None:
            head += "\n" + self.result.summary()
        return head


def _train_step(model: torch.nn.Module, fn: Callable[..., Any], args: Sequence[Any],
                loss: Callable[[Any], Any], seed: int) -> dict[str, Any]:
    """One seeded step: {"output": ..., parameter name: gradient}."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = fn(*args)
    loss(out).backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    return {"output": out.detach() if isinstance(out, torch.Tensor) else out, **grads}


def _differing(want: dict[str, Any], got: dict[str, Any], rtol: float, atol: float
               ) -> list[str]:
    out = []
    for k, w in want.items():
        g = got.get(k)
        if (w is None) != (g is None):
            out.append(k)
        elif isinstance(w, torch.Tensor):
            try:
                torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
            except AssertionError:
                out.append(k)
    return out


def _compiled_step(model, args, backend_fn, loss, seed) -> dict[str, Any]:
    """The second step of ``model`` compiled with ``backend_fn`` (the first compiles: tracing
    may draw random numbers of its own)."""
    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend_fn)
    _train_step(model, fn, args, loss, seed)
    return _train_step(model, fn, args, loss, seed)


def _capturing(store: list[dict[str, Any]]) -> Callable[..., Any]:
    """A backend tracing as graphkernel's does (the same decomposition table) and running the
    ATen graphs through torch, keeping each graph and the arguments of its last call."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def compiler(role):
        def fn(graph_module, inputs):
            entry = {"role": role, "gm": graph_module, "args": None}
            store.append(entry)

            def run(*args):
                entry["args"] = [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                 for a in args]
                return graph_module(*args)

            return make_boxed_func(run)
        return fn

    def capture(gm, example_inputs):
        return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                            inference_compiler=compiler("inference"),
                            decompositions=decompositions())(gm, example_inputs)

    return capture


def _outputs(values: Any) -> list[Any]:
    return list(values) if isinstance(values, list | tuple) else [values]


def _import_difference(entry: dict[str, Any], rtol: float, atol: float) -> list[str]:
    """The outputs of one captured graph where graphkernel's unoptimized import differs from
    torch running the graph on the same arguments."""
    from graphkernel.frontends.fx import import_fx_module

    gm, args = entry["gm"], entry["args"]
    with _real_tensors():
        imported = import_fx_module(gm, args, name=f"{entry['role']}_check")
        want = _outputs(gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
        got = _outputs(_runner(imported, imported.graph)(*args))
    names = [f"output {i}" for i in range(len(want))]
    return _differing(dict(zip(names, want, strict=True)), dict(zip(names, got, strict=True)),
                      rtol, atol)


def step_bisect(model: torch.nn.Module, example_inputs: Sequence[Any], flags: str = "",
                loss: Callable[[Any], Any] | None = None, seed: int = 0, rtol: float = 1e-3,
                atol: float = 1e-5, **kw: Any) -> StepBisect:
    """Check one training step of ``model`` through ``torch.compile(backend="graphkernel")``
    against eager — the output and every parameter's gradient (``loss(output).backward()``,
    default the mean square of the output; both sides seeded alike) — and, when they differ,
    say where the difference starts (``StepBisect.stage``): torch.compile itself (its
    AOT-eager path differs the same way), the traced ATen graphs, graphkernel's import of
    the forward or backward graph, or a pass (then bisected to the rewrite on that graph:
    ``graphkernel.bisect.bisect`` with ``kw``)."""
    import copy

    from graphkernel.bisect import bisect as run_bisect
    from graphkernel.frontends.fx import import_fx_module, to_numpy

    loss = loss or (lambda out: out.float().pow(2).mean())
    args = list(example_inputs)
    model = copy.deepcopy(model)

    def fresh():
        return copy.deepcopy(model)

    want = _train_step(model, model, args, loss, seed)
    opts = {"flags": flags} if flags else {}
    ours = _compiled_step(fresh(), args, lambda g, e: backend(g, e, opts), loss, seed)
    differ = _differing(want, ours, rtol, atol)
    if not differ:
        return StepBisect(False, message="the compiled step's output and gradients match "
                                         "eager")
    from torch._dynamo.backends.registry import lookup_backend

    plain = _compiled_step(fresh(), args, lookup_backend("aot_eager"), loss, seed)
    if _differing(want, plain, rtol, atol) and not _differing(plain, ours, rtol, atol):
        return StepBisect(True, "torch.compile", differ=differ,
                          message="torch.compile's AOT-eager path (graphkernel off) differs "
                                  "from eager the same way: not graphkernel's")
    store: list[dict[str, Any]] = []
    traced = _compiled_step(fresh(), args, _capturing(store), loss, seed)
    bad = _differing(want, traced, rtol, atol)
    if bad:
        return StepBisect(True, "tracing", differ=bad,
                          message="the ATen graphs traced with graphkernel's decomposition "
                                  "table, run by torch, already differ from eager "
                                  "(graphkernel.torch.decompositions)")
    for entry in store:
        if entry["args"] is None:
            continue
        bad = _import_difference(entry, rtol, atol)
        if bad:
            return StepBisect(True, "import", entry["role"], bad,
                              f"graphkernel's unoptimized import of the {entry['role']} graph "
                              "differs from torch running it (the FX frontend or an op run "
                              "through torch)")
    for entry in store:
        if entry["args"] is None:
            continue
        with _real_tensors():
            imported = import_fx_module(entry["gm"], entry["args"], name=entry["role"])
        feeds = {imported.graph.inputs[i].name: to_numpy(a)
                 for spec, a in zip(imported.inputs, entry["args"], strict=False)
                 if isinstance(spec, int) and not isinstance(spec, bool)
                 for i in [spec]}
        res = run_bisect(imported.graph, feeds, flags, **kw)
        if res.mismatch:
            return StepBisect(True, "pipeline", entry["role"], differ, "a pass changes the "
                              f"{entry['role']} graph's results", res)
    return StepBisect(True, "pipeline", differ=differ,
                      message="the step differs but no graph's compiled run differs from its "
                              "unoptimized one on the recorded arguments (see the tolerances)")
