"""PyTorch integration, the public API: the ``torch.compile`` backend
(``torch.compile(model, backend="graphkernel")``, registered under that name; implemented in
``graphkernel.frontends.torch_backend``, its decomposition table in
``graphkernel.frontends.torch_decompositions``), its statistics, the export of a model's
graph, and bisection of a model's forward pass or training step."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graphkernel.frontends import torch_decompositions
from graphkernel.frontends.torch_backend import (
    LAUNCH_KINDS,
    OFF_ENV,
    OPTIONS,
    STRICT_ENV,
    GraphSummary,
    _real_tensors,
    _runner,
    backend,
    compile_fx,
    configure_logging,
    launch_counts,
    reset_stats,
    stats,
    unsupported,
)
from graphkernel.frontends.torch_decompositions import KEEP_WHOLE, decompositions, faithful

__all__ = ["KEEP_WHOLE", "LAUNCH_KINDS", "OFF_ENV", "OPTIONS", "STRICT_ENV", "GraphSummary",
           "StepBisect", "backend", "bisect", "compile_fx", "configure_logging",
           "decompositions", "export_graph", "faithful", "launch_counts", "reset_stats",
           "stats", "step_bisect", "step_loss", "step_target", "unsupported"]

log = logging.getLogger("graphkernel.torch")


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
    _seed_all(seed)
    out = fn(*args)
    loss(out).backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    return {"output": out.detach() if isinstance(out, torch.Tensor) else out, **grads}


def step_target(out: Any) -> Any:
    """The checked training step's target for ``out``: standard normal values drawn in fp32
    from a generator of their own (torch's stream, which dropout draws from, is untouched),
    the same on every call for a shape, widened exactly for a float64 output."""
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    return target.to(out.dtype)


def step_loss(out: Any) -> Any:
    """The checked training step's default loss: the mean squared error of the output (in
    fp32 at least) against ``step_target``. Not the mean square of the output: after a
    LayerNorm at its initial weight 1 and bias 0 (most encoders' last op) that is
    ``var / (var + eps)``, a constant up to ``eps``, and every gradient before the norm is
    of order ``eps``, below the atol: a wrong backward there would pass the check."""
    out = out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
    return (out - step_target(out)).pow(2).mean()


def _seed_all(seed: int) -> None:
    """Seed torch's, numpy's and Python's random streams (a model may draw from any: speech
    models mask time steps with numpy's)."""
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


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
                            decompositions=torch_decompositions.decompositions())(
                                gm, example_inputs)

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
        # both from the same random state: a graph's dropout draws alike on both sides
        state = torch.get_rng_state()
        want = _outputs(gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
        torch.set_rng_state(state)
        got = _outputs(_runner(imported, imported.graph)(*args))
    names = [f"output {i}" for i in range(len(want))]
    return _differing(dict(zip(names, want, strict=True)), dict(zip(names, got, strict=True)),
                      rtol, atol)


def step_bisect(model: torch.nn.Module, example_inputs: Sequence[Any], flags: str = "",
                loss: Callable[[Any], Any] | None = None, seed: int = 0, rtol: float = 1e-3,
                atol: float = 1e-5, **kw: Any) -> StepBisect:
    """Check one training step of ``model`` through ``torch.compile(backend="graphkernel")``
    against eager — the output and every parameter's gradient (``loss(output).backward()``,
    default ``step_loss``; both sides seeded alike) — and, when they differ,
    say where the difference starts (``StepBisect.stage``): torch.compile itself (its
    AOT-eager path differs the same way), the traced ATen graphs, graphkernel's import of
    the forward or backward graph, or a pass (then bisected to the rewrite on that graph:
    ``graphkernel.bisect.bisect`` with ``kw``)."""
    import copy

    from graphkernel.bisect import bisect as run_bisect
    from graphkernel.frontends.fx import import_fx_module, to_numpy

    loss = loss or step_loss
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
    # what the graphs graphkernel gets should give: torch.compile's own step when that
    # differs from eager (other random numbers), else eager's
    ref = plain if _differing(want, plain, rtol, atol) else want
    store: list[dict[str, Any]] = []
    traced = _compiled_step(fresh(), args, _capturing(store), loss, seed)
    bad = _differing(ref, traced, rtol, atol)
    if bad:
        return StepBisect(True, "tracing", differ=bad,
                          message="the ATen graphs traced with graphkernel's decomposition "
                                  "table, run by torch, already differ from eager (or from "
                                  "torch.compile's own step where that differs from eager: "
                                  "graphkernel.torch.decompositions)")
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
