"""One optimizer step through the interpreter equals torch.optim's step on the same tensors,
for the composite op (its reference) and for its expansion (basic ops + Assign)."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.interpreter import Interpreter

torch = pytest.importorskip("torch")
N = 16


def step_graph(op: str, names: list[str], params: set[str], attrs=None) -> Graph:
    g = Graph(op)
    ins = [g.add_input(n, TensorType((N,) if n in params or n == "grad" else (1,), "float32"),
                       mutable=n in params) for n in names]
    node = g.add_node(op, ins, attrs or {}, name="step")
    g.set_outputs(node.outputs)
    return g


def run_both(g: Graph, feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Parameter values after one step: composite reference, then expanded graph."""
    out = []
    for graph in (g, graphkernel.compile(g, "--opt_level=1", env={}).graph):
        if graph is not g:
            assert all(n.op != g.nodes[0].op for n in graph.nodes)  # really expanded
        it = Interpreter(graph)
        it.run({k: v.copy() for k, v in feeds.items()})
        out.append(it.state)
    return out


def scal(v):
    return np.array([v], np.float32)


def f32(*vals):
    """Hyperparameters as the float32 values both sides actually use."""
    return [float(np.float32(v)) for v in vals]


@pytest.fixture
def tensors():
    rng = np.random.default_rng(0)
    return {"var": rng.standard_normal(N).astype(np.float32),
            "grad": rng.standard_normal(N).astype(np.float32)}


@pytest.mark.slow
@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_momentum_is_sgd_with_momentum(tensors, nesterov):
    lr, mom = f32(0.1, 0.9)
    accum = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    p = torch.nn.Parameter(torch.from_numpy(tensors["var"].copy()))
    opt = torch.optim.SGD([p], lr=lr, momentum=mom, nesterov=nesterov)
    opt.state[p]["momentum_buffer"] = torch.from_numpy(accum.copy())
    p.grad = torch.from_numpy(tensors["grad"].copy())
    opt.step()
    g = step_graph("ApplyMomentum", ["var", "accum", "lr", "grad", "momentum"], {"var", "accum"},
                   {"use_nesterov": nesterov})
    feeds = {"var": tensors["var"], "accum": accum, "lr": scal(lr), "grad": tensors["grad"],
             "momentum": scal(mom)}
    for state in run_both(g, feeds):
        np.testing.assert_allclose(state["var"], p.detach().numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(state["accum"], opt.state[p]["momentum_buffer"].numpy(),
                                   rtol=1e-6)


def test_adam_first_step(tensors):
    lr, b1, b2, eps = f32(1e-2, 0.9, 0.999, 1e-8)
    p = torch.nn.Parameter(torch.from_numpy(tensors["var"].copy()))
    opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2), eps=eps)
    p.grad = torch.from_numpy(tensors["grad"].copy())
    opt.step()
    names = ["var", "m", "v", "beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon",
             "grad"]
    g = step_graph("Adam", names, {"var", "m", "v"})
    z = np.zeros(N, np.float32)
    feeds = {"var": tensors["var"], "m": z, "v": z, "beta1_power": scal(b1),
             "beta2_power": scal(b2), "lr": scal(lr), "beta1": scal(b1), "beta2": scal(b2),
             "epsilon": scal(eps), "grad": tensors["grad"]}
    for state in run_both(g, feeds):
        # MindSpore's form folds bias correction into lr; it differs from torch's only in
        # how eps is scaled (eps vs eps*sqrt(1-b2^t)), far below fp32 resolution here
        np.testing.assert_allclose(state["var"], p.detach().numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(state["m"], opt.state[p]["exp_avg"].numpy(), rtol=1e-6)
        np.testing.assert_allclose(state["v"], opt.state[p]["exp_avg_sq"].numpy(), rtol=1e-6)


def test_adam_weight_decay_is_adamw_without_bias_correction(tensors):
    lr, b1, b2, eps, wd = f32(1e-2, 0.9, 0.999, 1e-8, 0.05)
    rng = np.random.default_rng(2)
    m0 = rng.standard_normal(N).astype(np.float32) * 0.1
    v0 = rng.uniform(0.01, 0.1, N).astype(np.float32)
    p = torch.nn.Parameter(torch.from_numpy(tensors["var"].copy()))
    opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    # a step far into training: torch's bias corrections are then exactly 1
    opt.state[p] = {"step": torch.tensor(1e7), "exp_avg": torch.from_numpy(m0.copy()),
                    "exp_avg_sq": torch.from_numpy(v0.copy())}
    p.grad = torch.from_numpy(tensors["grad"].copy())
    opt.step()
    g = step_graph("AdamWeightDecay", ["var", "m", "v", "lr", "beta1", "beta2", "epsilon",
                                       "decay", "grad"], {"var", "m", "v"})
    feeds = {"var": tensors["var"], "m": m0, "v": v0, "lr": scal(lr), "beta1": scal(b1),
             "beta2": scal(b2), "epsilon": scal(eps), "decay": scal(wd), "grad": tensors["grad"]}
    for state in run_both(g, feeds):
        np.testing.assert_allclose(state["var"], p.detach().numpy(), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(state["v"], opt.state[p]["exp_avg_sq"].numpy(), rtol=1e-6)


def test_assign_add(tensors):
    g = step_graph("AssignAdd", ["var", "grad"], {"var"})
    for state in run_both(g, tensors):
        np.testing.assert_allclose(state["var"], tensors["var"] + tensors["grad"], rtol=1e-7)
