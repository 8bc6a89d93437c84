"""scaled_dot_product_attention through torch.compile: the traced graphs keep every op's
outputs as the op defines them (the backward reads them), attention is one fused op forward
and backward, every argument is honoured, and gradients match eager."""

from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import graphkernel.torch as gt  # noqa: E402
from graphkernel.frontends import fx  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]  # torch.compile of modules

SDPA_OPS = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default")


def _grads(model, args, flags: str = "", seed: int = 0):
    """Every parameter's gradient of one step, eagerly and compiled (the same weights and the
    same random stream on both sides)."""
    twin = copy.deepcopy(model)
    out = {}
    for side, m in (("eager", model), ("compiled", twin)):
        fn = m if side == "eager" else torch.compile(m, backend="graphkernel",
                                                     options={"flags": flags})
        torch.manual_seed(seed)
        fn(*args).pow(2).mean().backward()
        out[side] = {k: p.grad for k, p in m.named_parameters()}
    return out["eager"], out["compiled"]


def assert_same_grads(want, got, rtol=1e-3, atol=1e-5):
    assert [k for k in want if (want[k] is None) != (got[k] is None)] == []
    for k, g in want.items():
        if g is not None:
            torch.testing.assert_close(got[k], g, rtol=rtol, atol=atol, msg=k)


# ---------------------------------------------------------------- the traced graphs
def test_a_decomposition_that_changes_an_ops_outputs_is_refused():
    """torch's rule for the CPU flash attention returns the attention weights where the op
    returns its logsumexp; checked against the op, it is refused and the op traced whole,
    while a rule that returns what its op does still applies."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    core = core_aten_decompositions()
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    silu = torch.ops.aten.silu.default
    table = {op: gt.faithful(op, core[op]) for op in (flash, silu)}

    def f(q, k, v):
        out, lse = flash(q, k, v, 0.0, True)
        return torch.ops.aten.silu(out), lse

    q, k, v = (torch.randn(2, 4, 5, 16) for _ in range(3))
    traced = make_fx(f, decomposition_table=table, tracing_mode="fake")(q, k, v)
    targets = [str(n.target) for n in traced.graph.nodes if n.op == "call_function"]
    assert SDPA_OPS[0] in targets  # kept whole
    assert "aten.silu.default" not in targets and "aten.sigmoid.default" in targets
    unchecked = make_fx(f, decomposition_table={flash: core[flash]}, tracing_mode="fake")
    lse = [n for n in unchecked(q, k, v).graph.nodes if n.op == "output"][0].args[0][1]
    assert tuple(lse.meta["val"].shape) == (2, 4, 5, 7 - 2)  # the weights: [B, H, L, S]
    assert not any(str(op).startswith(tuple(gt.KEEP_WHOLE)) for op in gt.decompositions())


class ConvAttention(torch.nn.Module):
    """A bias-free convolution (its backward has None outputs), then two attention layers
    (causal, and with a boolean mask) over the convolution's channels."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 32, 3, padding=1, bias=False)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.conv(x).transpose(1, 2)  # [B, L, 32]
        b, n = h.shape[:2]
        keep = torch.arange(n)[None, :] <= torch.arange(n)[:, None] + 2
        for mask in (None, keep):
            q, k, v = (t.view(b, n, 2, 16).transpose(1, 2)
                       for t in self.qkv(h).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
            h = h + self.out(a.transpose(1, 2).reshape(b, n, 32))
        return h


@pytest.mark.parametrize("level", [0, 2])
def test_backward_with_several_multi_output_ops_run_through_torch_matches_eager(
        monkeypatch, level):
    """The attention's forward and backward and the convolution's backward (None among its
    outputs), all run through torch as Opaque ops: each reads the saved tensors AOT autograd
    gave it, and every gradient matches eager."""
    for name in (*SDPA_OPS, "aten.convolution_backward.default"):
        monkeypatch.delitem(fx.ATEN, name, raising=False)
    model = ConvAttention().train()
    want, got = _grads(model, (torch.randn(2, 4, 6),), f"--opt_level={level}")
    s = gt.stats()
    assert set(s["fallbacks"]) == {*SDPA_OPS, "aten.convolution_backward.default"}
    assert_same_grads(want, got)


# --------------------------------------------------------- one op, every argument
B, H, L, S, E = 2, 4, 5, 7, 16
_ROW_MASKED = torch.ones(L, S, dtype=torch.bool)
_ROW_MASKED[2] = False  # query 2 sees no key: zeros, and no gradient through it
_PADDING = torch.rand(B, 1, 1, S, generator=torch.Generator().manual_seed(3)) > 0.3
_PADDING[..., 0] = True
R2 = torch.Generator().manual_seed(5)


def _sdpa_case(kw, length=L, src=S, e=E, kv_heads=H):
    """(function of q, k, v, the operands) for F.scaled_dot_product_attention with ``kw``."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, length, e, generator=g, requires_grad=True)
    k, v = (torch.randn(B, kv_heads, src, e, generator=g, requires_grad=True)
            for _ in range(2))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)), (q, k, v)


CASES = {
    "plain": ({},),
    "causal": ({"is_causal": True},),
    "causal, more queries than keys": ({"is_causal": True}, 7, 4),
    "causal, more keys than queries": ({"is_causal": True}, 3, 8),
    "scale": ({"scale": 0.3},),
    "grouped-query": ({"enable_gqa": True}, L, S, E, 2),
    "bool mask [L, S]": ({"attn_mask": torch.rand(L, S, generator=R2) > 0.3},),
    "key padding [B, 1, 1, S]": ({"attn_mask": _PADDING},),
    "additive [B, 1, L, S]": ({"attn_mask": torch.randn(B, 1, L, S, generator=R2)},),
    "additive [1, H, 1, S]": ({"attn_mask": torch.randn(1, H, 1, S, generator=R2)},),
    "a fully masked row": ({"attn_mask": _ROW_MASKED},),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_is_one_fused_launch_forward_and_backward(name):
    """Each case: the forward graph holds one FusedAttention and the backward one
    FusedAttentionGrad (the extern launches), nothing runs through torch, and the output and
    the gradients of q, k, v match eager."""
    kw, *dims = CASES[name]
    fn, args = _sdpa_case(kw, *dims)
    want = fn(*args)
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(9))
    want_grads = torch.autograd.grad(want, args, dy)
    compiled = torch.compile(fn, backend="graphkernel")
    got = compiled(*args)
    got_grads = torch.autograd.grad(got, args, dy)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for w, g in zip(want_grads, got_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0
    assert [(g["role"], g["launches"]["extern"]) for g in s["per_graph"]] == \
        [("forward", 1), ("backward", 1)]
    assert s["attentions"] == 2 and [g["attentions"] for g in s["per_graph"]] == [1, 1]
    if name == "a fully masked row":
        assert float(got.detach()[:, :, 2].abs().max()) == 0.0
        assert float(got_grads[0][:, :, 2].abs().max()) == 0.0


def test_a_mask_torch_takes_through_its_math_path_gives_eager_gradients():
    """A rank-3 mask: torch's CPU attention leaves it to its math path (matmuls, softmax and
    the masked-row guard, the probabilities kept for the backward); the gradients match."""
    fn, args = _sdpa_case({"attn_mask": torch.randn(H, L, S, generator=R2)})
    want = torch.autograd.grad(fn(*args).sum(), args)
    got = torch.autograd.grad(torch.compile(fn, backend="graphkernel")(*args).sum(), args)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert gt.stats()["fallbacks"] == {}


def test_head_sizes_the_operator_does_not_take_are_the_exact_decomposition(caplog):
    """Head size 8 (the operator needs a multiple of 16): the forward and the backward are
    their exact decompositions, with the reason logged, and the gradients match."""
    fn, args = _sdpa_case({"is_causal": True}, e=8)
    with caplog.at_level(logging.INFO, logger="graphkernel.fx"):
        want_grads = torch.autograd.grad(fn(*args).sum(), args)
        got_grads = torch.autograd.grad(torch.compile(fn, backend="graphkernel")(*args).sum(),
                                        args)
    for w, g in zip(want_grads, got_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert gt.stats()["launches"]["extern"] == 0
    assert "head size D=8" in caplog.text


def test_dropout_runs_through_torch_with_its_random_stream():
    """dropout_p > 0: torch's own dropout runs (its reason in the fallbacks), so with the same
    seed the compiled forward and gradients equal eager's."""
    fn, args = _sdpa_case({"dropout_p": 0.3})
    out = {}
    for side, f in (("eager", fn), ("compiled", torch.compile(fn, backend="graphkernel"))):
        torch.manual_seed(11)
        y = f(*args)
        out[side] = (y, *torch.autograd.grad(y.sum(), args))
    for w, g in zip(out["eager"], out["compiled"], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    why = gt.stats()["fallbacks"]
    assert any("dropout" in k for k in why) and all("random" in v for v in why.values())


def _meta_graph(fn, *shapes):
    """``fn`` traced on meta tensors (the overloads of other devices trace there)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*(torch.empty(s, device="meta") for s in shapes))


def _run(gm, arrays):
    import numpy as np

    from graphkernel.interpreter import run_graph

    g = fx.import_fx(gm)
    outs = run_graph(g, {v.name: a for v, a in zip(g.inputs, arrays, strict=True)})
    return g, [np.asarray(o) for o in outs]


aten = torch.ops.aten


def _efficient(q, k, v, bias):
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, False)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        out * 2, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False], False)
    return out, dq, dk, dv


def _flash(q, k, v, bias):
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, True)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
        out * 2, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset)
    return out, dq, dk, dv


def _cudnn(q, k, v, bias):
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias, True, 0.0, False)
    dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
        out * 2, q, k, v, out, lse, seed, offset, bias, cq, ck, mq, mk, 0.0, False)
    return out, dq, dk, dv


@pytest.mark.parametrize("fn", [_efficient, _flash, _cudnn], ids=["efficient", "flash",
                                                                   "cudnn"])
def test_the_other_devices_overloads_are_one_op_each_way(fn):
    """The efficient (its logsumexp padded to 32 queries), CUDA flash (causal) and cuDNN
    (logsumexp [B, N, L, 1]) overloads and their backwards, traced on meta tensors: one
    FusedAttention and one FusedAttentionGrad, matching torch's math on the CPU."""
    import numpy as np

    shapes = [(B, H, L, E), (B, H, S, E), (B, H, S, E), (B, H, L, S)]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g, got = _run(_meta_graph(fn, *shapes), arrays)
    assert sum(n.op == "FusedAttention" for n in g.nodes) == 1
    assert sum(n.op == "FusedAttentionGrad" for n in g.nodes) == 1
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in arrays[:3])
    bias = None if fn is _flash else torch.from_numpy(arrays[3])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=fn is _flash)
    want = [out, *torch.autograd.grad(out, (q, k, v), 2 * out.detach())]
    for w, x in zip(want, got, strict=True):
        np.testing.assert_allclose(x, w.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_attention_with_dropout_in_an_imported_graph_is_left_to_torch_naming_why():
    gm = _meta_graph(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.1)[0], (B, H, L, E), (B, H, S, E), (B, H, S, E))
    res = fx.import_fx_module(gm)
    (op,) = res.fallbacks
    assert "flash_attention_for_cpu" in op and "dropout_p=0.1" in res.fallbacks[op]
    assert [n.op for n in res.graph.nodes] == ["Opaque"]


def test_export_keeps_attention_one_op():
    class Attend(torch.nn.Module):
        def forward(self, q, k, m):
            return F.scaled_dot_product_attention(q, k, k, attn_mask=m)

    _, (q, k, _) = _sdpa_case({})
    m = _PADDING.expand(B, 1, L, S)
    g = gt.export_graph(Attend(), (q.detach(), k.detach(), m))
    assert sum(n.op == "FusedAttention" for n in g.nodes) == 1
    import numpy as np

    from graphkernel.interpreter import run_graph

    got = run_graph(g, {v.name: t.detach().numpy() for v, t in zip(g.inputs, (q, k, m),
                                                                   strict=True)})[0]
    np.testing.assert_allclose(got, Attend()(q, k, m).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.sim
def test_causal_attention_with_more_keys_runs_in_the_simulator():
    """is_causal with q [4, 3, 8] and k/v [4, 6, 8] (one head, head size 8: the exact
    decomposition, including the masked-row guard) through the generated kernels."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, n, 8, generator=g) for n in (3, 6, 6))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        got = torch.compile(fn, backend="graphkernel", options={"backend": "sim"})(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ the training check
class Attend(torch.nn.Module):
    """Three projections into causal attention (the minimal training case)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (m(x).view(b, n, 2, 16).transpose(1, 2) for m in (self.q, self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


X = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4))


def test_the_training_check_passes_a_step_that_matches():
    r = gt.bisect(Attend(), (X,), backward=True)
    assert not r.mismatch and r.stage == ""


def test_the_training_check_finds_wrong_gradients_in_the_traced_graphs(monkeypatch):
    """torch's core decomposition table as it is (the CPU flash attention's rule returns the
    weights where the backward reads the logsumexp): the graphs graphkernel is given are
    already wrong, before its import — the stage says so and names the gradients."""
    from torch._decomp import core_aten_decompositions

    from graphkernel.frontends import torch_decompositions

    # (the table both the backend and the bisection's capture trace with)
    monkeypatch.setattr(torch_decompositions, "decompositions",
                        lambda: dict(core_aten_decompositions()))
    r = gt.bisect(Attend(), (X,), backward=True)
    assert r.mismatch and r.stage == "tracing"
    assert "q.weight" in r.differ and "decomposition" in r.message


def test_the_training_check_finds_a_wrong_import_of_the_backward(monkeypatch):
    handler = fx.ATEN[SDPA_OPS[1]]

    def doubled(c):
        dq, dk, dv = handler(c)
        return [c.emit("Mul", [dq, c.const(2.0, dq.dtype)]), dk, dv]

    monkeypatch.setitem(fx.ATEN, SDPA_OPS[1], doubled)
    r = gt.bisect(Attend(), (X,), backward=True)
    assert (r.mismatch, r.stage, r.graph) == (True, "import", "backward")
    assert "q.weight" not in r.differ and r.differ  # the graph's outputs that differ


def test_the_training_check_runs_a_graphs_random_ops_alike_on_both_sides(monkeypatch):
    """A forward graph with dropout, imported right, and a backward imported wrong: the
    import check runs torch's graph and graphkernel's import from the same random state, so
    it names the backward, not the forward's dropout drawing other numbers."""

    class Dropped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x):
            return self.b(F.dropout(self.a(x), 0.5))

    handler = fx.ATEN["aten.mm.default"]

    def doubled(c):
        y = handler(c)
        return c.emit("Mul", [y, c.const(2.0, y.dtype)])

    monkeypatch.setitem(fx.ATEN, "aten.mm.default", doubled)  # (the backward's products)
    r = gt.bisect(Dropped().train(), (X,), backward=True)
    assert (r.mismatch, r.stage, r.graph) == (True, "import", "backward")


def test_the_training_check_bisects_a_pass_breaking_the_backward():
    from graphkernel import registry
    from graphkernel.registry import PassResult, register_pass

    @register_pass("tt_bad_grad", stage="simplify", level=2, order=38)
    def tt_bad_grad(graph, ctx):
        """Double the first FusedAttentionGrad's dQ (wrong on purpose)."""
        for node in graph.nodes:
            if node.op == "FusedAttentionGrad" and ctx.should_apply(node.name, [node]):
                dq = node.outputs[0]
                users = list(dq.uses)
                twice = graph.add_node("Add", [dq, dq])
                for u, i in users:
                    graph.replace_input(u, i, twice.output)
                graph.toposort()
                return PassResult(True, 1)
        return PassResult(False, 0)

    try:
        r = gt.bisect(Attend(), (X,), backward=True)
    finally:
        registry.PASSES.pop("tt_bad_grad", None)
    assert (r.mismatch, r.stage, r.graph) == (True, "pipeline", "backward")
    assert r.result.pass_name == "tt_bad_grad" and "q.weight" in r.differ


def test_the_training_check_leaves_torch_compiles_own_differences_to_it():
    """numpy's random numbers, which Dynamo turns into torch's: torch.compile differs from
    eager with graphkernel off too."""
    import numpy as np

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) * torch.from_numpy(np.random.rand(8).astype(np.float32))

    r = gt.bisect(Noisy(), (torch.randn(2, 8),), backward=True)
    assert r.mismatch and r.stage == "torch.compile" and "lin.weight" in r.differ


def test_blockwise_local_attention_by_einsum_is_one_fused_launch():
    """Local attention over blocks written with einsums ([B, blocks, block, N, D] queries
    against each block's keys and its neighbours', a position bias over five axes): torch
    lowers the einsums to products of views with a Transpose of the head and sequence axes
    behind two batch axes (Kᵀ's with the head split at once). One fused attention, read in
    place (batch × blocks as one batch), and the result matches eager."""
    b, blocks, block, heads, dim = 2, 3, 4, 2, 16

    def local(q, k, v, bias):
        q = q.view(b, blocks, block, heads, dim)
        k, v = (x.view(b, blocks, block, heads, dim) for x in (k, v))
        pad = [0, 0, 0, 0, 0, 0, 1, 1]  # one empty block on each side of the blocks axis
        k, v = (F.pad(x, pad) for x in (k, v))
        k, v = (torch.cat([x[:, i:i + blocks] for i in range(3)], dim=2) for x in (k, v))
        scores = torch.einsum("...qhd,...khd->...hqk", q, k) + bias
        p = F.softmax(scores.float(), dim=-1).type_as(scores)
        o = torch.einsum("...hqk,...khd->...qhd", p, v)
        return o.reshape(b, blocks * block, heads * dim)

    gen = torch.Generator().manual_seed(4)
    args = [torch.randn(b, blocks * block, heads * dim, generator=gen) for _ in range(3)]
    args.append(torch.randn(1, 1, heads, block, 3 * block, generator=gen))
    want = local(*args)
    with torch.no_grad():
        got = torch.compile(local, backend="graphkernel")(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0
    assert s["attentions"] == 1, s["per_graph"]
