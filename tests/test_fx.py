"""FX import (one module per mapped ATen op, against eager) and the torch.compile backend."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import graphkernel.torch as gt  # noqa: E402
from graphkernel import registry  # noqa: E402
from graphkernel.frontends import torch_backend  # noqa: E402
from graphkernel.frontends.fx import ATEN  # noqa: E402
from graphkernel.registry import PassResult, register_pass  # noqa: E402

pytestmark = pytest.mark.e2e  # torch.compile and torch.export

R = torch.Generator().manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # each case compiles from scratch (no recompile limit, static shapes)
    yield
    torch._dynamo.reset()


def rnd(*shape, lo=-2.0, hi=2.0):
    return torch.rand(*shape, generator=R) * (hi - lo) + lo


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


X, Y = rnd(3, 8), rnd(3, 8)
P = rnd(3, 8, lo=0.1, hi=2.0)
CASES = {
    "add": (lambda x, y: x + 2 * y, (X, Y)), "add_alpha": (lambda x, y: torch.add(x, y, alpha=3),
                                                          (X, Y)),
    "sub": (lambda x, y: x - y, (X, Y)), "rsub": (lambda x: 1 - x, (X,)),
    "mul_scalar": (lambda x: x * 1.5, (X,)), "div": (lambda x, p: x / p, (X, P)),
    "div_floor": (lambda x, p: torch.div(x, p, rounding_mode="floor"), (X, P)),
    "div_trunc": (lambda x, p: torch.div(x, p, rounding_mode="trunc"), (X, P)),
    "exp": (torch.exp, (X,)), "log": (torch.log, (P,)), "rsqrt": (torch.rsqrt, (P,)),
    "sqrt": (torch.sqrt, (P,)), "tanh": (torch.tanh, (X,)), "erf": (torch.erf, (X,)),
    "sigmoid": (torch.sigmoid, (X,)), "relu": (F.relu, (X,)),
    "gelu": (F.gelu, (X,)), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (X,)),
    "silu": (F.silu, (X,)), "pow": (lambda x: x ** 3, (X,)), "pow_tt": (torch.pow, (P, X)),
    "where": (lambda x, y: torch.where(x > y, x, y), (X, Y)),
    "masked_fill": (lambda x: x.masked_fill(x < 0, -1.0), (X,)),
    "compare": (lambda x, y: ((x >= y) | (x == 0)).float(), (X, Y)),
    "to_dtype": (lambda x: x.to(torch.float16).to(torch.float32), (X,)),
    "to_int": (lambda x: (x * 3).to(torch.int32) + 1, (X,)),
    "sum": (lambda x: x.sum(dim=-1, keepdim=True), (X,)), "sum_all": (torch.sum, (X,)),
    "mean": (lambda x: x.mean(dim=0), (X,)), "amax": (lambda x: x.amax(dim=1), (X,)),
    "amin": (lambda x: x.amin(dim=(0, 1)), (X,)),
    "var_mean": (lambda x: torch.var_mean(x, dim=1, keepdim=True)[0], (X,)),
    "var_biased": (lambda x: x.var(dim=-1, unbiased=False, keepdim=True), (X,)),
    "var_all": (torch.var, (X,)),
    "var_correction": (lambda x: torch.var(x, dim=(0, 1), correction=2), (X,)),
    "std": (lambda x: x.std(dim=0), (X,)),
    "std_mean_axis": (lambda x: x.reshape(3, 2, 4).std(dim=1, keepdim=True) + x.mean(), (X,)),
    "layer_norm": (lambda x: F.layer_norm(x, (8,)), (X,)),
    "softmax": (lambda x: F.softmax(x, dim=-1), (X,)),
    "log_softmax": (lambda x: F.log_softmax(x, dim=0), (X,)),
    "view": (lambda x: x.view(4, 6).reshape(-1, 2), (X,)),
    "expand": (lambda x: x[:, :1].expand(3, 5), (X,)),
    "permute": (lambda x: x.reshape(3, 2, 4).permute(2, 0, 1), (X,)),
    "transpose": (lambda x: x.transpose(0, 1), (X,)), "t": (lambda x: x.t(), (X,)),
    "unsqueeze_squeeze": (lambda x: x.unsqueeze(1).squeeze(1) + x[None].squeeze(0), (X,)),
    "slice": (lambda x: x[1:, ::2], (X,)), "select": (lambda x: x[:, 3] + x[-1, :3], (X, )),
    "cat": (lambda x, y: torch.cat([x, y], dim=1), (X, Y)),
    "split": (lambda x: torch.split(x, 3, dim=1)[2] * 2, (X,)),
    "embedding": (lambda i, w: F.embedding(i, w), (torch.tensor([[0, 2], [1, 1]]), rnd(3, 4))),
    "mm": (lambda x, y: x @ y.t(), (X, Y)), "bmm": (lambda a, b: torch.bmm(a, b),
                                                    (rnd(2, 3, 4), rnd(2, 4, 5))),
    "linear": (torch.nn.Linear(8, 5), (X,)),
    "conv": (torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), (rnd(2, 3, 9, 9),)),
    "clamp": (lambda x: x.clamp(-0.5, 0.7), (X,)),
    "full": (lambda x: x + torch.full((3, 8), 2.0), (X,)),
    "zeros_like": (lambda x: torch.zeros_like(x) + torch.ones_like(x) * x, (X,)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), (X,)),
    "gather": (lambda x, i: torch.gather(x, 1, i), (X, torch.tensor([[0, 7], [3, 3], [5, 2]]))),
    "index_select": (lambda x: torch.index_select(x, 1, torch.tensor([4, 0, 4])), (X,)),
    "index_one_tensor": (lambda x: x[:, torch.tensor([-2, 1])], (X,)),
    # one row per batch (a pooled token), and index tensors broadcast over two axes
    "index_pooled_rows": (lambda x, j: x.reshape(3, 2, 4)[torch.arange(3), j] * 2,
                          (X, torch.tensor([1, 0, -1]))),
    "index_several": (lambda x: x.reshape(3, 2, 4)[:, torch.tensor([[0], [-1]]),
                                                   torch.tensor([-1, 2, 0])], (X,)),
    "scatter": (lambda x: x.scatter(1, torch.tensor([[0], [5], [7]]), 9.0), (X,)),
    "scatter_add": (lambda x, y: x.scatter_add(0, torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1]]),
                                               y[:1]), (X, Y)),
    "cumsum": (lambda x: torch.cumsum(x, 1) + torch.cumsum((x > 0).long(), 0), (X,)),
    "any_all": (lambda x: torch.stack([(x > 1).any(1), (x > -2).all(1), (x != 0).any(-1)]),
                (X,)),
    "any_all_scalar": (lambda x: (x > 1.9).any() | (x < 0).all(), (X,)),
    "argmax": (lambda x: x.argmax(0) + x.argmin(1, keepdim=True) + x.argmax(), (X,)),
    "topk": (lambda x: torch.topk(x, 3, dim=1), (X,)),
    "topk_smallest": (lambda x: torch.topk(x, 2, dim=0, largest=False).values, (X,)),
    "tril_triu": (lambda x: torch.tril(x, 1) + torch.triu(x, -1) * 2, (X,)),
    "causal_mask": (lambda x: x.masked_fill(torch.ones(3, 8, dtype=torch.bool).triu(1),
                                            float("-inf")).softmax(-1), (X,)),
    "index_put": (lambda x, y: x.index_put((torch.tensor([0, 2, -3]),), y, accumulate=True)
                  + x.index_put((torch.tensor([1]),), torch.tensor(5.0)), (X, Y)),
    # index tensors on consecutive axes (their linear index into the axes merged), and
    # F.fold (col2im: overlapping patches added by one such index_put)
    "index_put_several": (lambda x, y: x.reshape(3, 2, 4).index_put(
        (torch.tensor([0, 2, 2, -1]), torch.tensor([[1], [-1]])), y[:2, :4, None], accumulate=True)
        + x.reshape(3, 2, 4).index_put((torch.tensor([1, 0]), torch.tensor([0, 1]),
                                        torch.tensor([3, -1])), torch.tensor(5.0)), (X, Y)),
    "fold": (lambda p: F.fold(p * 2, output_size=(5, 5), kernel_size=3, padding=1),
             (rnd(2, 18, 25),)),
    # a mask's elements set to one value (masked_fill written as an assignment)
    "index_put_mask": (lambda x, y: x.index_put((y > 0,), torch.tensor(-2.0))
                       + x.reshape(3, 2, 4).index_put((y[:, :2] > 0,), torch.tensor(1.5),
                                                      accumulate=True).reshape(3, 8), (X, Y)),
    # overlapping windows of a transposed view, by its strides in memory
    "as_strided": (lambda x: x.t().as_strided((3, 4, 2), (2, 1, 3)) * 2, (X,)),
    "true_divide": (lambda x, p: torch.true_divide(x, p), (X, P)),
    "repeat": (lambda x: x[:1].repeat(2, 1, 3), (X,)),
    "bitwise_not": (lambda x: (~(x > 0)).float() + (~(x * 3).int()), (X,)),
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, dim=1) + x.norm(p=1, dim=0).sum()
                    + torch.linalg.vector_norm(x, ord=float("inf")), (X,)),
    "group_norm": (torch.nn.GroupNorm(2, 4), (rnd(2, 4, 5),)),
    "conv1d": (torch.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), (rnd(2, 4, 9),)),
    # padding="valid": one padding value for both spatial axes (SigLIP's patch embedding)
    "conv2d_valid": (torch.nn.Conv2d(3, 4, 2, stride=2, padding="valid"), (rnd(1, 3, 6, 6),)),
    "arange": (lambda x: x + torch.arange(8) * 0.5 + torch.arange(2, 10), (X,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_module_matches_eager(name):
    fn, args = CASES[name]
    model = fn if isinstance(fn, torch.nn.Module) else Fn(fn)
    with torch.no_grad():
        want = model(*args)
        got = torch.compile(model, backend="graphkernel", fullgraph=True)(*args)
    # cast_elim drops the fp16 round trip of "to_dtype" (documented: more precise than eager)
    tol = 1e-3 if name == "to_dtype" else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    g = gt.export_graph(model, args)
    assert not any(n.op == "Opaque" for n in g.nodes), (name, g.op_histogram())


def test_mapped_ops_cover_the_issue_list():
    need = ["add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "exp.default", "log.default",
            "rsqrt.default", "sqrt.default", "tanh.default", "erf.default", "sigmoid.default",
            "relu.default", "gelu.default", "silu.default", "pow.Tensor_Scalar", "where.self",
            "masked_fill.Scalar", "eq.Tensor", "_to_copy.default", "sum.dim_IntList",
            "mean.dim", "amax.default", "amin.default", "var_mean.correction",
            "native_layer_norm.default", "_softmax.default", "_log_softmax.default",
            "view.default", "reshape.default", "_unsafe_view.default", "expand.default",
            "permute.default", "transpose.int", "t.default", "unsqueeze.default",
            "squeeze.dim", "clone.default", "slice.Tensor", "select.int", "cat.default",
            "split.Tensor", "embedding.default", "mm.default", "addmm.default", "bmm.default",
            "convolution.default"]
    assert [n for n in need if f"aten.{n}" not in ATEN] == []


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_backend_fullgraph_and_with_graph_breaks():
    m = Block().eval()
    x = rnd(2, 5, 32)
    with torch.no_grad():
        want = m(x)
        torch.testing.assert_close(torch.compile(m, backend="graphkernel", fullgraph=True)(x),
                                   want, rtol=1e-5, atol=1e-5)

        def broken(x):
            y = m(x)
            print("graph break")  # noqa: T201 - forces Dynamo to split the graph
            return m(y)

        torch.testing.assert_close(torch.compile(broken, backend="graphkernel")(x),
                                   m(m(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_backend_sim_runs_generated_kernels():
    from graphkernel.codegen import backend as cg

    m = Block().eval()
    x = rnd(2, 5, 32)
    launched = []
    orig = cg.SimBackend.__call__
    cg.SimBackend.__call__ = lambda self, node, args, shapes: (launched.append(node.name),
                                                               orig(self, node, args, shapes))[1]
    try:
        with torch.no_grad():
            got = torch.compile(m, backend="graphkernel", options={"backend": "sim"})(x)
    finally:
        cg.SimBackend.__call__ = orig
    torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    assert launched  # the LayerNorm and GELU kernels ran through their generated code


def test_backend_takes_flags_and_dumps(tmp_path):
    m = Block().eval()
    x = rnd(2, 5, 32)
    opts = {"flags": f"--opt_level=1 --dump_as_text --debug_dir={tmp_path}"}
    with torch.no_grad():
        torch.compile(m, backend="graphkernel", options=opts)(x)
    dirs = [p for p in tmp_path.iterdir() if p.name.startswith("autofused_")]
    assert dirs and (dirs[0] / "report.json").exists()
    # every graph's dumps sit in its own folder, none at the top where graphs would mix;
    # the top holds only the index of those folders
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([d.name for d in dirs]
                                                                + ["index.json"])
    assert (dirs[0] / "0000_input.txt").exists() and (dirs[0] / "flags.json").exists()


def test_unmapped_op_falls_back_to_aten_and_is_logged_once(caplog, monkeypatch):
    from graphkernel.frontends import fx

    monkeypatch.setattr(fx, "_LOGGED", set())  # (once per process: an earlier test may have)
    # (a sort of booleans has no mapping)
    m = Fn(lambda x: torch.sort(x > 0, 1).values.float() + torch.sort(x * 2 > 1, 1).values)
    x = rnd(3, 8)
    with caplog.at_level(logging.WARNING, logger="graphkernel.fx"):
        g = gt.export_graph(m, (x,))
        with torch.no_grad():
            got = torch.compile(m, backend="graphkernel")(x)
    torch.testing.assert_close(got, m(x))
    assert sum(n.op == "Opaque" for n in g.nodes) == 2
    msgs = [r.getMessage() for r in caplog.records if "Fallback aten.sort" in r.getMessage()]
    assert len(msgs) == 1


def test_torch_bisect_finds_an_injected_fault():
    @register_pass("tt_bad_mul", stage="simplify", level=2, order=38)
    def tt_bad_mul(graph, ctx):
        """Halve the first MatMul's result (wrong on purpose)."""
        for node in graph.nodes:
            if node.op == "MatMul" and ctx.should_apply(node.name, [node]):
                users = list(node.output.uses)
                half = graph.add_node("Mul", [node.output, graph.const(np.float32(0.5))])
                for u, i in users:
                    graph.replace_input(u, i, half.output)
                return PassResult(True, 1)
        return PassResult(False, 0)

    try:
        res = gt.bisect(Block().eval(), (rnd(2, 5, 32),))
    finally:
        registry.PASSES.pop("tt_bad_mul", None)
    assert res.mismatch and res.pass_name == "tt_bad_mul" and res.flags.endswith(
        "--disable_pass=tt_bad_mul")


def test_dynamic_batch_dim_becomes_a_symbolic_dim(monkeypatch):
    seen = []
    orig = torch_backend.compile_fx

    def spy(gm, example_inputs, *a, **k):
        from graphkernel.frontends.fx import import_fx

        seen.append(import_fx(gm, example_inputs).inputs)
        return orig(gm, example_inputs, *a, **k)

    monkeypatch.setattr(torch_backend, "compile_fx", spy)
    m = Block().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for b in (2, 3, 7):
            x = rnd(b, 5, 32)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert len(seen) == 1  # one compiled graph serves every batch size
    shapes = [v.type.shape for v in seen[0] if v.type.rank == 3]
    assert shapes and isinstance(shapes[0][0], str)


def test_dynamic_with_grad_returns_the_sizes_the_backward_needs():
    """Outside no_grad the forward graph also returns sizes (SymInts) saved for the backward:
    they come back as ints of this call's batch, and the gradients match eager."""
    m = Block()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    for b in (2, 5):
        x = rnd(b, 5, 32).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        y = c(x)
        torch.testing.assert_close(y, m(x2), rtol=1e-5, atol=1e-5)
        y.square().sum().backward()
        m(x2).square().sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)


def test_a_symbolic_size_as_an_operand_is_fed_not_a_bug():
    """``x + y.size(1)`` under dynamic=True: aten.add.Tensor takes the SymInt itself (a KV
    cache's length added to positions, as a sliding-window cache's mask does). The size is
    read as ``aten.full`` reads it (a fed scalar), the graph compiled, no op left to torch;
    it was a bug in the import (the size's name made a constant) and the graph ran through
    torch."""
    gt.reset_stats()

    def f(x, y):
        return (x + y.size(1)) * 2.0 - y.size(1) * x.size(0)

    c = torch.compile(f, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 9):
            x, y = rnd(4, n), rnd(2, n)
            torch.testing.assert_close(c(x, y), f(x, y), rtol=1e-6, atol=1e-6)
    s = gt.stats()
    assert s["graphs"] >= 1 and s["launches"]["opaque"] == 0, s
    assert not any(g.get("through_torch") or g.get("bug") for g in s["per_graph"]), s
