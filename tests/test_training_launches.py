"""Launches of training graphs: what a training step's forward returns for its backward (a
norm's per-row statistics) and reads back there (dropout's boolean mask) stays inside the
kernels that compute or use it, with the simulator's numbers as the reference's and the
gradients as eager's."""

from __future__ import annotations

import copy

import numpy as np
import pytest

N = 64


def _norm_with_statistics(per_column: bool = False, residual: bool = False):
    """A LayerNorm as a training forward computes it: ``y = (x - mean) * rstd * w + b``, the
    mean and ``rstd`` returned too (one value per row, [4, 16, 1]). With ``per_column`` the
    statistics are over the rows instead (one value per column, [1, 16, 64]); with
    ``residual``, x is a residual sum ``h + r`` returned as well (the backward's norm reads
    it)."""
    from graphkernel import Graph, TensorType

    g = Graph()
    x = g.add_input("x", TensorType((4, 16, N), "float32"))
    if residual:
        x = g.add_node("Add", [x, g.add_input("r", TensorType((4, 16, N), "float32"))]).output
    w = g.add_input("w", TensorType((N,), "float32"))
    bias = g.add_input("b", TensorType((N,), "float32"))
    axis, count = ([0], 4) if per_column else ([-1], N)
    inv = g.const(np.float32(1.0 / count))
    mean = g.add_node("Mul", [g.add_node("ReduceSum", [x], {"axis": axis, "keep_dims": True})
                              .output, inv]).output
    d = g.add_node("Sub", [x, mean]).output
    var = g.add_node("Mul", [g.add_node("ReduceSum", [g.add_node("Mul", [d, d]).output],
                                        {"axis": axis, "keep_dims": True}).output, inv]).output
    rstd = g.add_node("Rsqrt", [g.add_node("Add", [var, g.const(np.float32(1e-5))]).output]
                      ).output
    y = g.add_node("Add", [g.add_node("Mul", [g.add_node("Mul", [d, rstd]).output, w]).output,
                           bias]).output
    g.set_outputs([y, mean, rstd, *([x] if residual else [])])
    return g


def _feeds(g, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for v in g.inputs:
        if v.type.dtype.value == "bool":
            out[v.name] = rng.random(v.type.shape) < 0.75
        else:
            out[v.name] = (rng.standard_normal(v.type.shape) * 2 + 0.5).astype(np.float32)
    return out


def _simulated_as_reference(g, res) -> None:
    from graphkernel.codegen.backend import run_sim
    from graphkernel.interpreter import run_graph

    feeds = _feeds(g)
    outs, _ = run_sim(res, feeds)
    got = outs if isinstance(outs, list) else list(outs.values())
    for o, want in zip(got, run_graph(g, feeds), strict=True):
        np.testing.assert_allclose(np.asarray(o), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("residual", [False, True])
def test_a_norm_that_returns_its_statistics_is_one_kernel(residual):
    """The mean and rstd leave the graph (the backward reads them): the norm's kernel stores
    them as columns (six launches before: the sum, the mean, the centring, the variance,
    rstd and the affine step apart); a residual sum leaving the graph, read by the norm's
    mean, is computed and stored by the same kernel (a launch of its own before);
    simulated outputs, statistics included, as the reference's."""
    import graphkernel
    from graphkernel.torch import launch_counts

    g = _norm_with_statistics(residual=residual)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 1, launch_counts(res.graph)
    _simulated_as_reference(g, res)


def test_statistics_spread_along_other_axes_stay_a_graph_output_apart():
    """Statistics of the columns (one value per column, spread over the rows) are not one
    value per row of the consumer's loop: the rule does not take them."""
    import graphkernel
    from tests.patterns.conftest import reasons

    res = graphkernel.compile(_norm_with_statistics(per_column=True), "--opt_level=2", env={})
    assert any(r.endswith("is a graph output")
               for r in reasons(res, "elemwise_broadcast_bwd_depth"))


def _masked_gradient():
    """Dropout's backward as AOT autograd writes it: ``g * mask.to(float32) * 1/(1-p)``, the
    mask a bool input (the forward's saved draw), then a row sum (a bias's gradient)."""
    from graphkernel import Graph, TensorType

    g = Graph()
    grad = g.add_input("g", TensorType((4, 16, N), "float32"))
    mask = g.add_input("mask", TensorType((4, 16, N), "bool"))
    m = g.add_node("Cast", [mask], {"dtype": "float32"}).output
    y = g.add_node("Mul", [grad, g.add_node("Mul", [m, g.const(np.float32(1 / 0.75))]).output]
                   ).output
    g.set_outputs([y, g.add_node("ReduceSum", [y], {"axis": [0, 1], "keep_dims": False}).output])
    return g


def test_a_bool_mask_cast_to_float_is_read_by_its_kernel():
    """The Cast of a bool input is its load (bytes widened to 0/1 floats, exact): no codegen
    fallback splitting the kernel into one launch per op; simulated as the reference."""
    import graphkernel
    from graphkernel.torch import launch_counts

    g = _masked_gradient()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert not res.report.extra.get("fallbacks"), res.report.extra.get("fallbacks")
    assert sum(launch_counts(res.graph).values()) <= 2, launch_counts(res.graph)
    _simulated_as_reference(g, res)


def _weight_and_bias_gradients():
    """A norm's weight and bias gradients as a backward takes them: the incoming gradient
    summed over the batch, alone and times the normalised input."""
    from graphkernel import Graph, TensorType

    g = Graph()
    dy = g.add_input("dy", TensorType((4, 16, N), "float32"))
    xh = g.add_input("xh", TensorType((4, 16, N), "float32"))
    dw = g.add_node("ReduceSum", [g.add_node("Mul", [dy, xh]).output],
                    {"axis": [0, 1], "keep_dims": False}).output
    db = g.add_node("ReduceSum", [dy], {"axis": [0, 1], "keep_dims": False}).output
    g.set_outputs([dw, db])
    return g


def test_sums_over_the_batch_of_one_gradient_are_one_launch():
    """The bias's sum (a reduction alone) joins the weight's (a kernel reducing the same
    axes of the same shape, reading the same gradient): one launch (two before), the
    joint noted by sibling_fusion; simulated sums as the reference's."""
    import graphkernel
    from graphkernel.torch import launch_counts

    g = _weight_and_bias_gradients()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 1, launch_counts(res.graph)
    _simulated_as_reference(g, res)


def test_sums_over_different_axes_stay_apart():
    """A sum over the rows and one over the batch run different tiles: not joined."""
    import graphkernel
    from graphkernel import Graph, TensorType
    from graphkernel.torch import launch_counts

    g = Graph()
    dy = g.add_input("dy", TensorType((4, 16, N), "float32"))
    xh = g.add_input("xh", TensorType((4, 16, N), "float32"))
    dw = g.add_node("ReduceSum", [g.add_node("Mul", [dy, xh]).output],
                    {"axis": [0, 1], "keep_dims": False}).output
    rows = g.add_node("ReduceSum", [dy], {"axis": [-1], "keep_dims": True}).output
    g.set_outputs([dw, rows])
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(launch_counts(res.graph).values()) == 2, launch_counts(res.graph)


torch = pytest.importorskip("torch")


class _Block(torch.nn.Module):
    """A post-norm residual block with dropout, as encoders train it."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(N, N)
        self.drop = torch.nn.Dropout(0.25)
        self.norm = torch.nn.LayerNorm(N)

    def forward(self, x):
        return self.norm(self.drop(torch.nn.functional.gelu(self.fc(x))) + x)


def test_a_training_step_keeps_norm_statistics_and_dropout_masks_in_kernels():
    """One training step of the block: the forward's norm is one kernel (with the
    statistics it returns), the backward reads dropout's mask in a kernel (no launch
    per op); gradients as eager's under the same seed."""
    import graphkernel.torch as gt
    from tests.training import step

    torch.manual_seed(0)
    model = _Block().train()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 16, N)
    want_out, want = step(model, model, (x,))
    torch._dynamo.reset()
    gt.reset_stats()
    compiled = torch.compile(twin, backend="graphkernel")
    step(twin, compiled, (x,))  # the first call compiles (tracing may draw numbers)
    got_out, got = step(twin, compiled, (x,))
    s = gt.stats()
    per = {g["role"]: g for g in s["per_graph"]}
    assert sum(per["forward"]["launches"].values()) <= 4, per["forward"]["launches"]
    assert per["backward"]["codegen_fallbacks"] == 0
    assert sum(per["backward"]["launches"].values()) <= 6, per["backward"]["launches"]
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6)
