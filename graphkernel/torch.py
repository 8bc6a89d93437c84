"""PyTorch integration: ``torch.compile(model, backend="graphkernel")`` and bisection.

The backend lowers Dynamo's graph to core ATen (AOT autograd with the core ATen
decompositions), imports it, runs the pass pipeline under the effective flags
(``AUTOFUSE_FLAGS`` or ``options={"flags": ...}``) and returns a callable that runs on the
CPU: fused kernels through the numpy interpreter (or, with ``options={"backend": "sim"}``,
through their generated Ascend C in the CPU simulator), unmapped ATen ops through torch.
With ``dump_as_text`` each compiled graph gets its own folder ``autofused_<n>`` under the
debug directory (report, flags, per-pass IR).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphkernel.errors import ExecutionError

_COUNTER = itertools.count(1)


def _runner(graph, compiled, compute_dtype: str | None = None,
            kernel_runner: Any = None, extras: Sequence[tuple[int, Any]] = ()
            ) -> Callable[..., tuple]:
    """The compiled graph as a function of the FX graph's inputs; ``extras`` are the outputs
    that are not tensors (position, size or None), put back in their places."""
    from graphkernel import symbolic
    from graphkernel.frontends.fx import to_numpy, to_torch
    from graphkernel.interpreter import Interpreter

    names = [v.name for v in graph.inputs]

    def run(*args: Any) -> tuple:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        feeds = {n: to_numpy(t) for n, t in zip(names, tensors, strict=True)}
        outs = [to_torch(o) for o in Interpreter(compiled, compute_dtype, kernel_runner)
                .run(feeds)]
        if not extras:
            return tuple(outs)
        dims: dict[str, int] = {}  # this call's value of every symbolic dim
        for v, t in zip(graph.inputs, tensors, strict=True):
            for d, actual in zip(v.type.shape, t.shape, strict=True):
                symbolic.bind(d, int(actual), dims)
        for i, d in extras:
            outs.insert(i, None if d is None else symbolic.evaluate(d, dims))
        return tuple(outs)

    return run


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
               options: dict[str, Any] | None = None) -> Callable[..., tuple]:
    """Compile an ATen-level FX graph; returns a callable taking the same inputs."""
    import graphkernel
    from graphkernel.api import load_config
    from graphkernel.frontends.fx import import_fx

    options = dict(options or {})
    backend = options.pop("backend", "reference")
    if backend not in ("reference", "sim"):
        raise ExecutionError(f"unknown backend {backend!r} (accepted: reference, sim)")
    n = next(_COUNTER)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # graph constants are real tensors; read them as such
        extras: list = []  # sizes AOT autograd saves for the backward, Nones
        g = import_fx(gm, example_inputs, name=f"autofused_{n}", extras=extras)
    flags = options.pop("flags", None)
    env = dict(os.environ)
    cfg = load_config(flags if flags is not None else "", env=env)
    own = os.path.join(cfg.debug_dir, f"autofused_{n}")  # this graph's dumps, apart
    res = graphkernel.compile(g, flags if flags is not None else "", env=env,
                              log=lambda m: None, dump_dir=own)
    if res.config.dump_as_text:
        from graphkernel.dump import Dumper

        Dumper(own).write_text("graph.txt", str(res.graph))
    if backend == "sim":  # fused kernels run through their generated code
        from graphkernel.codegen.backend import SimBackend

        return _runner(g, res.graph, kernel_runner=SimBackend.for_result(res), extras=extras)
    return _runner(g, res.graph, extras=extras)


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
            options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend (registered as "graphkernel")."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def fw(graph_module, inputs):
        # boxed: AOT autograd hands the arguments as one list it may free early
        return make_boxed_func(compile_fx(graph_module, inputs, options))

    return aot_autograd(fw_compiler=fw, decompositions=core_aten_decompositions())(
        gm, example_inputs)


def export_graph(model: torch.nn.Module, example_inputs: Sequence[Any], name: str = "model"):
    """A model's inference graph as a graphkernel Graph (torch.export at the core ATen level;
    parameters and buffers become constants)."""
    from graphkernel.frontends.fx import import_fx, to_numpy

    ep = torch.export.export(model.eval(), tuple(example_inputs))
    ep = ep.run_decompositions()
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
           **kw: Any):
    """Bisect a PyTorch model: export it, then find the pass and rewrite that break its
    accuracy (``check`` is not needed: the judge compares with a float64 reference)."""
    from graphkernel.bisect import bisect as run_bisect
    from graphkernel.frontends.fx import to_numpy

    g = export_graph(model, example_inputs)
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    feeds = {v.name: to_numpy(t) for v, t in zip(g.inputs, tensors, strict=True)}
    return run_bisect(g, feeds, flags, **kw)
