"""The attention pass: Q·Kᵀ -> scale -> mask -> softmax -> ·V (with the head split/merge
around it) becomes one FusedAttention op; what it refuses, it says why."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.backend import run_sim
from graphkernel.codegen.traffic import launches
from graphkernel.explain import explain, format_explain
from graphkernel.frontends import load_model
from graphkernel.interpreter import Interpreter, random_inputs
from graphkernel.ir import DType

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "attention.json"


def _compile(g, flags: str = "--opt_level=2 --disable_pass=codegen"):
    res = graphkernel.compile(g, flags, env={})
    res.graph.validate()
    return res


def _fused(res) -> list:
    return [n for n in res.graph.nodes if n.op == "FusedAttention"]


def _attention(heads=4, seq=8, dim=16, dtype="float32", *, probs_out=False, mask=None,
               causal=False, name="attn", q_scale=None, softcap=None, clamp=None,
               bias=None) -> Graph:
    """o = merge(softmax(split(q)·split(k)ᵀ / sqrt(dim) [+ mask] [+ causal]) · split(v)),
    q/k/v as [2, seq, heads·dim]; ``mask`` the shape of a float mask input, if any;
    ``causal`` adds a constant 0 / -inf causal mask; ``softcap`` c soft-caps the scaled
    scores, c · tanh(s / c), before the masks (Gemma 2); ``clamp`` c takes max(s, c) after
    the masks (XGLM keeps masked-out scores at the lowest float); ``bias`` the shape of a
    second float input added after ``mask``."""
    g = Graph(name)
    split = []
    for n in "qkv":
        x = g.add_input(n, TensorType((2, seq, heads * dim), dtype))
        if n == "q" and q_scale is not None:
            x = g.add_node("Mul", [x, g.const(q_scale, dtype)]).output
        x = g.add_node("Reshape", [x], {"shape": [2, seq, heads, dim]}).output
        split.append(g.add_node("Transpose", [x], {"perm": [0, 2, 1, 3]}).output)
    s = g.add_node("BatchMatMul", split[:2], {"transpose_b": True}, name="qk").output
    s = g.add_node("Div", [s, g.const(math.sqrt(dim), dtype)]).output
    if softcap is not None:
        s = g.add_node("Tanh", [g.add_node("Div", [s, g.const(softcap, dtype)]).output]).output
        s = g.add_node("Mul", [s, g.const(softcap, dtype)]).output
    if mask is not None:
        s = g.add_node("Add", [s, g.add_input("mask", TensorType(mask, dtype))]).output
    if bias is not None:
        s = g.add_node("Add", [g.add_input("bias", TensorType(bias, dtype)), s]).output
    if causal:
        low = np.triu(np.full((seq, seq), -np.inf, dtype), 1)
        s = g.add_node("Add", [g.const(low), s]).output
    if clamp is not None:
        s = g.add_node("Maximum", [s, g.const(clamp, dtype)]).output
    p = g.add_node("Softmax", [s], {"axis": -1}, name="probs").output
    o = g.add_node("BatchMatMul", [p, split[2]], name="pv").output
    o = g.add_node("Transpose", [o], {"perm": [0, 2, 1, 3]}).output
    o = g.add_node("Reshape", [o], {"shape": [2, seq, heads * dim]}).output
    g.set_outputs([o, p] if probs_out else [o])
    return g


def test_example_becomes_one_bsh_launch_equal_to_torch():
    torch = pytest.importorskip("torch")
    g = load_model(EXAMPLE)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs == {"layout": "BSH", "head_num": 4, "scale": 0.25, "mask": "atten_mask",
                        "causal": False, "window": 0, "stats": False}
    # the head split/merge transposes, the softmax and both products are gone
    left = {n.op for n in res.graph.nodes}
    assert not left & {"Transpose", "BatchMatMul", "Exp", "ReduceMax", "Select"}, left
    feeds = random_inputs(g, dims={"batch": 2})
    feeds["masked"] = np.triu(np.ones((32, 32), bool), 1)
    (got,) = Interpreter(res.graph).run(feeds)
    t = [torch.from_numpy(feeds[n].astype(np.float64)).view(2, 32, 4, 16).transpose(1, 2)
         for n in "qkv"]
    want = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True)
    want = want.transpose(1, 2).reshape(2, 32, 64).numpy()
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    (before,) = Interpreter(g).run(feeds)
    np.testing.assert_allclose(got.astype(np.float64), before.astype(np.float64),
                               rtol=2e-3, atol=2e-3)


def test_disable_pass_gives_back_the_old_graph():
    g = load_model(EXAMPLE)
    on = _compile(g, "--opt_level=2")
    off = _compile(g, "--opt_level=2 --disable_pass=attention")
    assert _fused(on) and not _fused(off) and not off.analyses.attention
    assert off.report.extra["kernels_fused"] > on.report.extra["kernels_fused"]
    forced = _compile(g, "--opt_level=1 --enable_pass=attention --disable_pass=codegen")
    assert len(_fused(forced)) == 1


@pytest.mark.parametrize("causal", [False, True])
def test_pse_mask_is_divided_by_the_scale(causal):
    g = _attention(mask=(1, 4, 8, 8), causal=causal)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == ("pse_and_atten_mask" if causal else "pse")
    assert fa.attrs["scale"] == pytest.approx(0.25)
    feeds = random_inputs(g, seed=3)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_a_computed_bias_of_one_row_per_head_is_broadcast_to_the_pse_rows():
    """A computed additive mask [B, 1, 1, S2] (a padding mask, an ALiBi row) is broadcast to
    the operator's [B, N, 1, S2]: S1 times fewer values than the scores, not refused."""
    g = _attention(mask=(2, 1, 1, 8))
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse"
    assert tuple(fa.inputs[3].type.shape) == (2, 4, 1, 8)
    feeds = random_inputs(g, seed=3)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("graph,reason", [
    (lambda: _attention(probs_out=True), r"probs.* is also used outside the attention: the "
     r"graph returns it \(the operator returns no probabilities"),
    (lambda: _attention(dim=20), r"head size D=20 .*multiple of 16"),
    (lambda: _attention(mask=(2, 1, 8, 1)), r"mask mask of shape \[2, 1, 8, 1\].*pse takes"),
    (lambda: _attention(dtype="float64"), r"dtype float64"),
])
def test_refusals_say_why(graph, reason):
    g = graph()
    res = _compile(g)
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert rec.verdict == "refused"
    assert rec.product == "qk"
    assert re.search(reason, rec.reason), rec.reason
    text = format_explain(explain(res, "qk"))
    assert "refused  qk" in text and rec.reason in text
    feeds = random_inputs(g)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_soft_capped_scores_are_refused_with_the_function_named():
    """Gemma 2's soft-capping, cap · tanh(scores / cap) before the softmax: the vendor's
    operator documents no function of the scores, so the candidate is refused and says so
    (the scores' product with its softmax stays one MIX kernel, P·V a cube kernel)."""
    g = _attention(softcap=50.0, causal=True)
    res = _compile(g)
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert rec.verdict == "refused"
    assert re.search(r"scores pass through Tanh before the softmax.*takes no function of "
                     r"the scores", rec.reason), rec.reason
    feeds = random_inputs(g)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    # without the cap the same graph is one fused attention
    assert len(_fused(_compile(_attention(causal=True)))) == 1


@pytest.mark.parametrize("mask", [None, (1, 4, 8, 8)])
def test_scores_clamped_at_the_lowest_float_are_fused(mask):
    """XGLM: max(scores + mask, lowest) before the softmax. The clamp changes only scores
    below the lowest finite value (-inf: masked out), whose softmax weight is 0 either way,
    so the operator takes the scores without it."""
    g = _attention(mask=mask, causal=True, clamp=float(np.finfo(np.float32).min))
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == ("atten_mask" if mask is None else "pse_and_atten_mask")
    assert not any(n.op == "Maximum" for n in res.graph.nodes)
    feeds = random_inputs(g, seed=5)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [(1, 4, 8, 8), (2, 1, 8, 8)])
def test_two_float_biases_are_summed_into_one_pse(bias):
    """Two float biases added to the scores (Funnel's positional and token-type scores, T5's
    position bias and a padding mask): the operator takes one pse, their sum — a [2,1,8,8]
    mask alone is no pse shape, summed with a [2,4,8,8] bias it is."""
    g = _attention(mask=(2, 4, 8, 8), bias=bias)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse" and tuple(fa.inputs[3].type.shape) == (2, 4, 8, 8)
    (rec,) = res.analyses.attention
    assert "summed into one pse" in rec.reason, rec.reason
    feeds = random_inputs(g, seed=7)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_values_wider_than_the_keys_are_refused_with_both_head_sizes():
    """LeViT: V's heads 32 wide, Q's and K's 16: the operator has one D for all three."""
    g = Graph("wide_v")
    q, k = (g.add_input(n, TensorType((2, 4, 8, 16), "float32")) for n in "qk")
    v = g.add_input("v", TensorType((2, 4, 8, 32), "float32"))
    s = g.add_node("BatchMatMul", [q, k], {"transpose_b": True}, name="qk").output
    p = g.add_node("Softmax", [g.add_node("Mul", [s, g.const(0.25, "float32")]).output],
                   {"axis": -1}).output
    g.set_outputs([g.add_node("BatchMatMul", [p, v]).output])
    res = _compile(g)
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert re.search(r"V's head size 32 differs from Q's and K's 16", rec.reason), rec.reason


def test_scores_clamped_at_a_finite_floor_are_refused():
    """max(scores, -10) changes kept scores (a function of them): refused, named."""
    g = _attention(causal=True, clamp=-10.0)
    res = _compile(g)
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert rec.verdict == "refused" and "Maximum" in rec.reason, rec.reason
    feeds = random_inputs(g)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_dropout_before_the_values_is_refused():
    g = _attention()
    pv = next(n for n in g.nodes if n.name == "pv")
    p = pv.inputs[0]
    drop = g.add_node("Opaque", [p], {
        "impl": "python", "fn": lambda x: (x,), "out_types": [p.type],
        "label": "aten.native_dropout.default"}).output
    g.replace_input(pv, 0, drop)
    g.toposort()
    res = _compile(g)
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert rec.verdict == "refused" and "dropout" in rec.reason


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_kv_is_read_with_its_own_heads(kv_heads):
    g = Graph("gqa")
    q = g.add_input("q", TensorType((2, 4, 8, 16), "float32"))
    kv = []
    for n in "kv":
        x = g.add_input(n, TensorType((2, kv_heads, 8, 16), "float32"))
        if kv_heads == 1:  # multi-query: the one head broadcast to all four
            x = g.add_node("BroadcastTo", [x], {"shape": [2, 4, 8, 16]}).output
        else:
            x = g.add_node("ExpandDims", [x], {"axis": [2]}).output
            x = g.add_node("BroadcastTo", [x], {"shape": [2, 2, 2, 8, 16]}).output
        kv.append(g.add_node("Reshape", [x], {"shape": [8, 8, 16]}).output)
    q3 = g.add_node("Reshape", [q], {"shape": [8, 8, 16]}).output
    s = g.add_node("BatchMatMul", [q3, kv[0]], {"transpose_b": True}, name="qk").output
    s = g.add_node("Mul", [g.const(0.25), s]).output
    p = g.add_node("Softmax", [s], {"axis": -1}).output
    o = g.add_node("BatchMatMul", [p, kv[1]]).output
    g.set_outputs([g.add_node("Reshape", [o], {"shape": [2, 4, 8, 16]}).output])
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BNSD" and fa.inputs[1].type.shape == (2, kv_heads, 8, 16)
    assert not [n for n in res.graph.nodes if n.op == "BroadcastTo"]
    feeds = random_inputs(g)
    np.testing.assert_allclose(Interpreter(res.graph).run(feeds)[0],
                               Interpreter(g).run(feeds)[0], rtol=1e-5, atol=1e-6)


def test_one_kv_head_broadcast_by_the_products_is_multi_query_attention():
    """An ONNX export of multi-query attention: K and V keep their one head and the products
    broadcast it over the query heads (numpy batch broadcasting, no BroadcastTo)."""
    g = Graph("mqa")
    q = g.add_input("q", TensorType((2, 4, 8, 16), "float32"))
    k = g.add_input("k", TensorType((2, 1, 8, 16), "float32"))
    v = g.add_input("v", TensorType((2, 1, 8, 16), "float32"))
    kt = g.add_node("Transpose", [k], {"perm": [0, 1, 3, 2]}).output
    s = g.add_node("BatchMatMul", [q, kt], name="qk").output
    s = g.add_node("Mul", [s, g.const(0.25)]).output
    p = g.add_node("Softmax", [s], {"axis": -1}).output
    g.set_outputs([g.add_node("BatchMatMul", [p, v]).output])
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.inputs[1].type.shape[1] == 1 and fa.inputs[0].type.shape[1] == 4
    _same_results(g, res)


def test_torch_attention_module_with_head_split_and_merge():
    torch = pytest.importorskip("torch")
    import graphkernel.torch as gt

    class Attention(torch.nn.Module):
        def __init__(self, heads=4, dim=16):
            super().__init__()
            self.h, self.d = heads, dim
            self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)

        def forward(self, x, causal):
            b, n, _ = x.shape
            q, k, v = (t.view(b, n, self.h, self.d).transpose(1, 2)
                       for t in self.qkv(x).split(self.h * self.d, dim=-1))
            bias = torch.where(causal, torch.finfo(x.dtype).min, 0.0)
            w = torch.softmax(q @ k.transpose(-1, -2) * self.d ** -0.5 + bias, dim=-1)
            return (w @ v).transpose(1, 2).reshape(b, n, self.h * self.d)

    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(2, 8, 64)
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)
    g = gt.export_graph(model, (x, causal), name="attention")
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSH" and fa.attrs["mask"] == "atten_mask"
    got = Interpreter(res.graph).run([x.numpy(), causal.numpy()])[0]
    with torch.no_grad():
        want = model(x, causal).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_torch_fp16_with_a_cast_causal_mask():
    torch = pytest.importorskip("torch")
    import graphkernel.torch as gt

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, causal):
            bias = torch.where(causal, -torch.inf, 0.0).to(q.dtype)  # fp32 -> fp16 Cast
            w = torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, dim=-1)
            return w @ v

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, dtype=torch.float16) for _ in range(3))
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)
    g = gt.export_graph(Attention(), (q, k, v, causal), name="attention")
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "atten_mask" and fa.inputs[3].dtype.value == "bool"
    got = Interpreter(res.graph).run([x.numpy() for x in (q, k, v, causal)])[0]
    t = [x.double() for x in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True).numpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)



def test_a_query_scaled_before_its_head_split_folds_into_the_scale():
    """Whisper multiplies Q by a constant right after its projection, before the head split:
    the factor joins the operator's scale and the Mul (a launch of its own) is gone."""
    g = _attention(dim=16, q_scale=0.5)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["scale"] == pytest.approx(0.5 / 4)
    assert "Mul" not in {n.op for n in res.graph.nodes}
    feeds = random_inputs(g)
    np.testing.assert_allclose(Interpreter(res.graph).run(feeds)[0],
                               Interpreter(g).run(feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", [0, 1])
def test_a_division_of_q_or_kt_by_a_constant_folds_into_the_scale(side):
    """DeBERTa divides Kᵀ by sqrt(d) before the product (``bmm(q, k.transpose(-1, -2) /
    scale)``); some encoders divide Q: the divisor's inverse joins the operator's scale."""
    g = _attention(dim=16)
    qk = next(n for n in g.nodes if n.name == "qk")
    div = next(n for n in g.nodes if n.op == "Div")
    g.replace_all_uses(div.outputs[0], qk.outputs[0])
    g.erase_node(div)
    scaled = g.add_node("Div", [qk.inputs[side], g.const(2.0, "float32")]).output
    g.replace_input(qk, side, scaled)
    g.toposort()
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["scale"] == pytest.approx(0.5)
    _same_results(g, res)


def _same_results(g, res, seed=5, feeds=None):
    feeds = random_inputs(g, seed=seed) if feeds is None else feeds
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64),
                                   rtol=1e-5, atol=1e-5)


def test_a_constant_bias_grows_to_a_documented_pse_shape():
    """A constant bias of shape [1, N, 1, S2] is no pse shape the operator documents; it is
    broadcast to [1, N, S1, S2] (equal across the batch), and explain says so."""
    rng = np.random.default_rng(0)
    bias = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    g = _attention()
    s = g.node("probs").inputs[0]
    add = g.add_node("Add", [s, g.const(bias)], name="alibi")
    g.replace_input(g.node("probs"), 0, add.output)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse"
    assert fa.inputs[3].shape == (1, 4, 8, 8)
    (rec,) = [a for a in res.analyses.attention if a.verdict == "fused"]
    assert "broadcast to" in rec.reason and "[1, 4, 1, 8]" in rec.reason
    _same_results(g, res)


@pytest.mark.parametrize("constant", [True, False])
def test_an_alibi_bias_is_taken_as_b_n_1_s2(constant):
    """ALiBi's bias, one row per batch and head for every query ([B, N, 1, S2]), is a pse
    shape the operator documents (BN1Skv): taken as it is, constant or computed (with a
    symbolic sequence length it is computed)."""
    if constant:
        rng = np.random.default_rng(0)
        g = _attention()
        s = g.node("probs").inputs[0]
        bias = g.const(rng.standard_normal((2, 4, 1, 8)).astype(np.float32))
        add = g.add_node("Add", [s, bias], name="alibi")
        g.replace_input(g.node("probs"), 0, add.output)
    else:
        g = _attention(mask=(2, 4, 1, 8))
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse" and fa.inputs[3].shape == (2, 4, 1, 8)
    (rec,) = [a for a in res.analyses.attention if a.verdict == "fused"]
    assert "broadcast to" not in rec.reason
    _same_results(g, res)


@pytest.mark.parametrize("constant", [True, False])
def test_a_masked_fill_of_the_scores_is_the_boolean_mask(constant):
    """MPT's ``scores.masked_fill(mask, finfo.min)`` after its ALiBi bias: the fill's
    condition is the operator's atten_mask (True = masked out), the bias its pse; one
    launch with the same results (every row keeps a key)."""
    rng = np.random.default_rng(0)
    g = _attention()
    s = g.node("probs").inputs[0]
    bias = g.add_node("Add", [s, g.const(rng.standard_normal((2, 4, 1, 8))
                                         .astype(np.float32))], name="alibi").output
    if constant:
        cond = g.const(np.triu(np.ones((8, 8), bool), 1), DType.bool)
    else:
        cond = g.add_input("masked", TensorType((2, 1, 8, 8), "bool"))
    low = g.const(np.float32(np.finfo(np.float32).min))
    fill = g.add_node("Select", [cond, low, bias], name="fill").output
    g.replace_input(g.node("probs"), 0, fill)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse_and_atten_mask", fa.attrs
    assert fa.inputs[4].dtype is DType.bool
    feeds = random_inputs(g, seed=3)
    if not constant:  # (a row whose every key is masked out has no defined result)
        feeds["masked"] = rng.random((2, 1, 8, 8)) < 0.5
        feeds["masked"][..., 0] = False
    _same_results(g, res, feeds=feeds)


def _positions_causal(cmp="LessEqual", q_start=0, keep_on_true=True, key_first=True,
                      window=0, positions="int64", heads=4) -> Graph:
    """Attention over a symbolic length s whose mask is built from positions, as LLaMA
    builds it: keep = cmp(arange(s)[None, :], arange(q_start, s + q_start)[:, None]) (the
    operands swapped when not ``key_first``), then where(keep, 0, lowest) (where(keep,
    lowest, 0) when not ``keep_on_true``); ``window`` w ands Mistral's sliding window
    ``arange(s)[None, :] > arange(s)[:, None] - w``; ``positions``: the aranges' type."""
    g = Graph("causal")
    split = []
    for n in "qkv":
        x = g.add_input(n, TensorType((2, "s", heads * 16), "float32"))
        x = g.add_node("Reshape", [x], {"shape": [2, "s", heads, 16]}).output
        split.append(g.add_node("Transpose", [x], {"perm": [0, 2, 1, 3]}).output)
    sc = g.add_node("BatchMatMul", split[:2], {"transpose_b": True}, name="qk").output
    sc = g.add_node("Mul", [sc, g.const(np.float32(0.25))]).output
    pos = [g.add_node("Range", [], {"start": st, "delta": 1, "length": "s",
                                    "dtype": positions}).output for st in (0, q_start)]
    kpos = g.add_node("ExpandDims", [pos[0]], {"axis": [0]}).output
    qpos = g.add_node("ExpandDims", [pos[1]], {"axis": [1]}).output
    keep = g.add_node(cmp, [kpos, qpos] if key_first else [qpos, kpos], name="keep").output
    if window:
        low_q = g.add_node("Sub", [qpos, g.const(np.int64(window))]).output
        near = g.add_node("Greater", [kpos, low_q]).output
        keep = g.add_node("BitwiseAnd", [near, keep]).output
    low, zero = g.const(np.float32(np.finfo(np.float32).min)), g.const(np.float32(0))
    m = g.add_node("Select", [keep, zero, low] if keep_on_true else [keep, low, zero],
                   name="mask").output
    sc = g.add_node("Add", [sc, m]).output
    p = g.add_node("Softmax", [sc], {"axis": -1}, name="probs").output
    o = g.add_node("BatchMatMul", [p, split[2]], name="pv").output
    o = g.add_node("Transpose", [o], {"perm": [0, 2, 1, 3]}).output
    g.set_outputs([g.add_node("Reshape", [o], {"shape": [2, "s", heads * 16]}).output])
    return g


@pytest.mark.parametrize("cmp, keep_on_true, key_first", [
    ("LessEqual", True, True),       # LLaMA: keep key <= query
    ("GreaterEqual", True, False),   # keep query >= key
    ("Greater", False, True),        # mask key > query
])
def test_a_causal_mask_built_from_positions_is_the_causal_mode(cmp, keep_on_true, key_first):
    """With a symbolic length the mask is computed from int64 positions; recognised as
    key j > query i, it is the operator's causal mode and the mask's nodes are gone."""
    g = _positions_causal(cmp, keep_on_true=keep_on_true, key_first=key_first)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["causal"] is True and fa.attrs["mask"] == "none" and len(fa.inputs) == 3
    assert not {n.op for n in res.graph.nodes} & {"Range", "LessEqual", "Select"}
    (rec,) = res.analyses.attention
    assert "causal" in rec.reason
    for n in (3, 8):
        feeds = random_inputs(g, seed=n, dims={"s": n})
        np.testing.assert_allclose(Interpreter(res.graph, symbols={"s": n}).run(feeds)[0],
                                   Interpreter(g, symbols={"s": n}).run(feeds)[0],
                                   rtol=1e-5, atol=1e-5)


def test_a_sliding_window_built_from_positions_is_the_causal_band():
    g = _positions_causal(window=3)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["causal"] is True and fa.attrs["window"] == 3 and len(fa.inputs) == 3
    assert "window of 3 keys" in res.analyses.attention[0].reason
    feeds = random_inputs(g, seed=1, dims={"s": 9})
    np.testing.assert_allclose(Interpreter(res.graph, symbols={"s": 9}).run(feeds)[0],
                               Interpreter(g, symbols={"s": 9}).run(feeds)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positions, n", [("float16", 2050), ("int8", 130)])
def test_positions_that_collide_are_not_the_causal_mode(positions, n):
    """fp16 positions round above 2048 (2049 -> 2048: key 2049 compares equal to query
    2048 and is kept); int8 ones wrap at 128. Such a mask is not causal for every length:
    it stays a mask."""
    g = _positions_causal(positions=positions, heads=1)
    res = _compile(g)
    (fa,) = _fused(res)
    assert not fa.attrs["causal"] and fa.attrs["mask"] == "atten_mask"
    feeds = random_inputs(g, seed=1, dims={"s": n})
    np.testing.assert_allclose(Interpreter(res.graph, symbols={"s": n}).run(feeds)[0],
                               Interpreter(g, symbols={"s": n}).run(feeds)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cmp, q_start", [("Less", 0), ("LessEqual", 1)])
def test_a_mask_that_is_not_causal_stays_an_atten_mask(cmp, q_start):
    """key j < query i masks the diagonal too; positions from different starts are shifted:
    neither is the causal mode, both stay a boolean atten_mask."""
    g = _positions_causal(cmp, q_start)
    res = _compile(g)
    (fa,) = _fused(res)
    assert not fa.attrs.get("causal") and fa.attrs["mask"] == "atten_mask"


def _rotary(g, x, seq, dim, base=0.1):
    """x·cos + cat(-x2, x1)·sin with constant [1, 1, seq, dim] tables."""
    ang = np.arange(seq)[:, None] * np.linspace(base, 1.0, dim)[None, :]
    cos, sin = (g.const(f(ang).astype(np.float32).reshape(1, 1, seq, dim)) for f in (np.cos,
                                                                                    np.sin))
    half = dim // 2
    x1 = g.add_node("StridedSlice", [x], {"begin": [0], "end": [half], "axes": [3]}).output
    x2 = g.add_node("StridedSlice", [x], {"begin": [half], "end": [dim], "axes": [3]}).output
    rot = g.add_node("Concat", [g.add_node("Neg", [x2]).output, x1], {"axis": -1}).output
    return g.add_node("Add", [g.add_node("Mul", [x, cos]).output,
                              g.add_node("Mul", [rot, sin]).output]).output


def _fused_qkv(heads=4, kv_heads=4, seq=8, dim=16, rotary=True, unused=0,
               k_base=0.1) -> Graph:
    """One projection [2, seq, (heads + 2·kv_heads + unused)·dim] seen as [2, seq, heads,
    dim] and sliced into Q, K, V along the head axis (Falcon's layout); rotary on Q and K."""
    g = Graph("qkv")
    total = heads + 2 * kv_heads + unused
    x = g.add_input("qkv", TensorType((2, seq, total * dim), "float32"))
    x = g.add_node("Reshape", [x], {"shape": [2, seq, total, dim]}).output
    bounds = [(0, heads), (heads, heads + kv_heads), (heads + kv_heads, heads + 2 * kv_heads)]
    parts = []
    for k, (a, b) in enumerate(bounds):
        t = g.add_node("StridedSlice", [x], {"begin": [a], "end": [b], "axes": [2]}).output
        t = g.add_node("Transpose", [t], {"perm": [0, 2, 1, 3]}).output
        parts.append(_rotary(g, t, seq, dim, (0.1, k_base)[k]) if rotary and k < 2 else t)
    q, k, v = parts
    if kv_heads != heads:
        k, v = (g.add_node("BroadcastTo", [t], {"shape": [2, heads, seq, dim]}).output
                for t in (k, v))
    s = g.add_node("BatchMatMul", [q, k], {"transpose_b": True}, name="qk").output
    s = g.add_node("Div", [s, g.const(math.sqrt(dim), "float32")]).output
    p = g.add_node("Softmax", [s], {"axis": -1}, name="probs").output
    o = g.add_node("BatchMatMul", [p, v], name="pv").output
    o = g.add_node("Transpose", [o], {"perm": [0, 2, 1, 3]}).output
    g.set_outputs([g.add_node("Reshape", [o], {"shape": [2, seq, heads * dim]}).output])
    return g


def _rotary_layers(layers: int, heads=2, seq=4, dim=16) -> Graph:
    """``layers`` attention layers in a chain, each with rotary on Q and K."""
    g = Graph("layers")
    h = g.add_input("x", TensorType((2, seq, heads * dim), "float32"))
    w = g.const(np.full((heads * dim, 3 * heads * dim), 0.01, np.float32))
    for _ in range(layers):
        x = g.add_node("Reshape", [h], {"shape": [2 * seq, heads * dim]}).output
        x = g.add_node("MatMul", [x, w]).output
        x = g.add_node("Reshape", [x], {"shape": [2, seq, 3 * heads, dim]}).output
        parts = []
        for k in range(3):
            t = g.add_node("StridedSlice", [x], {"begin": [k * heads], "end": [(k + 1) * heads],
                                                 "axes": [2]}).output
            t = g.add_node("Transpose", [t], {"perm": [0, 2, 1, 3]}).output
            parts.append(_rotary(g, t, seq, dim, 0.1 * (k + 1)) if k < 2 else t)
        s = g.add_node("BatchMatMul", parts[:2], {"transpose_b": True}).output
        s = g.add_node("Div", [s, g.const(math.sqrt(dim), "float32")]).output
        p = g.add_node("Softmax", [s], {"axis": -1}).output
        o = g.add_node("BatchMatMul", [p, parts[2]]).output
        o = g.add_node("Transpose", [o], {"perm": [0, 2, 1, 3]}).output
        h = g.add_node("Reshape", [o], {"shape": [2, seq, heads * dim]}).output
    g.set_outputs([h])
    return g


def test_rotary_regions_are_ordered_without_listing_the_graph_each_time(monkeypatch):
    """Each layer's rotary region is put in order by sorting its own nodes: the nodes the
    pass lists or sorts grow with the layers, not with their square (it was the whole graph
    for each of Q and K)."""
    from tests.passes.conftest import apply_pass

    listed = [0]
    nodes, toposort = Graph.nodes.fget, Graph.toposort

    def counted_nodes(self):
        listed[0] += len(self)
        return nodes(self)

    def counted_toposort(self):
        listed[0] += len(self)
        return toposort(self)

    def work(layers: int) -> int:
        g, _ = apply_pass("expand", _rotary_layers(layers))
        with monkeypatch.context() as m:
            m.setattr(Graph, "nodes", property(counted_nodes))
            m.setattr(Graph, "toposort", counted_toposort)
            listed[0] = 0
            out, _ = apply_pass("attention", g)
            done = listed[0]
        fused = [n for n in out.nodes if n.op == "FusedAttention"]
        assert len(fused) == layers and all(n.attrs["layout"] == "BSND" for n in fused)
        return done

    assert work(10) < 8 * work(2)  # x5 the nodes; x14 when each region listed the graph


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_rotary_q_and_k_are_computed_in_bsnd_and_the_slices_become_one_split(kv_heads):
    """Rotary embedding after the head split is rebuilt on the [B, S, N, D] value (its tables
    seen as [1, S, 1, D]), so the operator reads BSND: no Transpose is left (no head split of
    V, no head merge). Q, K and V, slices of one projection along the head axis, are one
    Split; Q's and K's rotary, the same work on every head, runs once on the projection
    before it (a Select keeps V's heads), and that kernel stores the Split's parts: one
    kernel. Explain says it all."""
    g = _fused_qkv(kv_heads=kv_heads)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSND"
    ops = [m.op for n in res.graph.nodes
           for m in (n.subgraph.nodes if n.op == "GraphKernel" else [n])]
    assert "Transpose" not in ops and ops.count("Concat") == 1  # one rotary, in BSND
    assert ops.count("Split") == 1 and ops.count("Select") == 1
    split = next(m for n in res.graph.nodes if n.op == "GraphKernel"
                 for m in n.subgraph.nodes if m.op == "Split")
    assert split.attrs["sizes"] == [4, kv_heads, kv_heads] and split.attrs["axis"] == 2
    (rec,) = res.analyses.attention
    assert "Q's elementwise work on its head split computed in BSND" in rec.reason
    assert "K's elementwise work" in rec.reason and "one Split along axis 2" in rec.reason
    assert "done once on all of" in rec.reason
    assert [n.op for n in res.graph.nodes if n.op in ("GraphKernel", "Split")] == [
        "GraphKernel"]
    _same_results(g, res)


def test_q_and_k_rotary_with_different_tables_run_apart():
    """K rotated by other tables than Q: not the same work, so no shared kernel (the Split
    still takes the slices)."""
    g = _fused_qkv(k_base=0.2)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSND"
    ops = [m.op for n in res.graph.nodes
           for m in (n.subgraph.nodes if n.op == "GraphKernel" else [n])]
    assert ops.count("Concat") == 2 and "Select" not in ops and ops.count("Split") == 1
    assert "done once" not in res.analyses.attention[0].reason
    _same_results(g, res)


def test_rotary_returned_too_is_rebuilt_and_returned_head_transposed():
    """A rotated Q that is also a graph output (a key cache handed on across a graph break)
    is computed once, in BSND for the operator: the graph returns that value transposed
    back (it was computed in BNSD, the operator reading BNSD with the head transposes
    around it)."""
    g = _fused_qkv()
    q = g.node("qk").inputs[0]
    g.set_outputs([*g.outputs, q])
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSND"
    _same_results(g, res)
    back = res.graph.outputs[-1].producer  # (Q sliced by heads: its kernel loads the
    assert back.op == "Transpose" and back.inputs[0] is fa.inputs[0]  # slice, no row work)


def test_a_returned_rotary_region_read_elsewhere_inside_stays_in_bnsd():
    """A value computed inside Q's rotary that is also a graph output would be computed
    twice (in each layout): kept as it is."""
    g = _fused_qkv()
    q = g.node("qk").inputs[0]
    inner = q.producer.inputs[0]
    g.set_outputs([*g.outputs, inner])
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BNSD"
    _same_results(g, res)


def test_slices_that_do_not_tile_the_axis_stay_slices():
    """Q and K sliced from one value whose remaining heads are unused: no Split (a Split
    writes every part)."""
    g = _fused_qkv(rotary=False, unused=1)  # the last head is read by no one
    res = _compile(g)
    assert len(_fused(res)) == 1 and "Split" not in [n.op for n in res.graph.nodes]


def test_work_that_differs_by_head_is_not_done_on_all_heads():
    """Q and K scaled by one table varying over the heads ([1, N, S, D]): the same ops on the
    same values, but not the same for every head, so never run on V's heads' positions."""
    g = _fused_qkv(rotary=False)
    table = g.const(np.random.default_rng(1).standard_normal((1, 4, 8, 16)).astype(np.float32))
    qk = g.node("qk")
    for i in range(2):
        scaled = g.add_node("Mul", [qk.inputs[i], table]).output
        g.replace_input(qk, i, scaled)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSND"
    ops = [m.op for n in res.graph.nodes
           for m in (n.subgraph.nodes if n.op == "GraphKernel" else [n])]
    assert "Select" not in ops and ops.count("Split") == 1
    assert "done once" not in res.analyses.attention[0].reason
    _same_results(g, res)


def test_two_computed_biases_are_one_pse_their_sum():
    """Two computed biases both map to pse: one pse, their sum (the sum's Add one more op)."""
    g = _attention(mask=(2, 4, 8, 8))
    add = next(n for n in g.nodes if n.op == "Add")
    extra = g.add_input("bias2", TensorType((2, 4, 8, 8), "float32"))
    bias = g.add_node("Exp", [extra]).output  # computed, not a 0 / -inf mask
    total = g.add_node("Add", [add.outputs[0], bias]).output
    g.replace_input(next(n for n in g.nodes if n.op == "Softmax"), 0, total)
    g.validate()
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse"
    feeds = random_inputs(g, seed=2)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def _math_path(heads=4, seq=8, keys=8, dim=16, masked_rows=True, guard=True) -> Graph:
    """torch's math path for scaled_dot_product_attention, as the importer leaves it: Q and
    Kᵀ each scaled by sqrt(scale), an additive mask, the softmax and the guard that writes
    zeros for a row whose every key is masked out (``Select(not any(x != -inf), 0, P)``)."""
    g = Graph("math")
    split = []
    for n, s in (("q", seq), ("k", keys), ("v", keys)):
        x = g.add_input(n, TensorType((2, s, heads * dim), "float32"))
        x = g.add_node("Reshape", [x], {"shape": [2, s, heads, dim]}).output
        split.append(g.add_node("Transpose", [x], {"perm": [0, 2, 1, 3]}).output)
    root = g.const(np.float32(dim ** -0.25))
    q = g.add_node("Mul", [split[0], root]).output
    kt = g.add_node("Transpose", [split[1]], {"perm": [0, 1, 3, 2]}).output
    kt = g.add_node("Mul", [kt, root]).output
    s = g.add_node("BatchMatMul", [q, kt], name="qk").output
    mask = g.add_input("keep", TensorType((seq, keys), "bool"))
    add = g.add_node("Select", [mask, g.const(np.float32(0)),
                                g.const(np.float32(-np.inf))]).output
    s = g.add_node("Add", [s, add]).output
    p = g.add_node("Softmax", [s], {"axis": -1}).output
    if guard:
        inf = g.add_node("Equal", [s, g.const(np.float32(-np.inf))]).output
        kept = g.add_node("LogicalNot", [inf]).output
        anyk = g.add_node("ReduceMax", [kept], {"axis": [3], "keep_dims": True}).output
        dead = g.add_node("LogicalNot", [anyk]).output
        zeros = g.const(np.zeros((2, heads, seq, keys), np.float32)) if isinstance(seq, int) \
            else g.add_node("BroadcastTo", [g.const(np.float32(0))],  # full_like, dynamic
                            {"shape": [2, heads, seq, keys]}).output
        p = g.add_node("Select", [dead, zeros, p]).output
    o = g.add_node("BatchMatMul", [p, split[2]], name="pv").output
    o = g.add_node("Transpose", [o], {"perm": [0, 2, 1, 3]}).output
    g.set_outputs([g.add_node("Reshape", [o], {"shape": [2, seq, heads * dim]}).output])
    return g


def test_the_guard_of_a_symbolic_length_is_recognised():
    """Under dynamic shapes the guard's zeros stay ``BroadcastTo(0, [2, N, s, s])`` (no
    constant of a symbolic shape): still the operator's rule (Falcon, dynamic=True: 0 -> 1
    fused attention per layer)."""
    g = _math_path(seq="s", keys="s")
    res = _compile(g)
    (fa,) = _fused(res)
    assert not {"Equal", "Select", "BatchMatMul"} & {n.op for n in res.graph.nodes}
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal((2, 8, 64), dtype=np.float32) for k in "qkv"}
    feeds["keep"] = _keep()  # s = 8
    (got,) = Interpreter(res.graph).run(feeds)
    (want,) = Interpreter(g).run(feeds)
    assert np.all(want[:, 3] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _keep(seq=8, keys=8):
    keep = np.random.default_rng(2).random((seq, keys)) > 0.3
    keep[:, 0] = True
    keep[3] = False  # a row with no key
    return keep


def test_torchs_math_path_with_its_masked_row_guard_is_one_launch():
    """The guard is the operator's own rule for a row with no key (zeros), so the pattern is
    one FusedAttention, the sqrt(scale) on Q and on Kᵀ taken into its scale, and the result
    equals the unfused graph's, that row included."""
    g = _math_path()
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSH" and fa.attrs["mask"] == "atten_mask"
    assert fa.attrs["scale"] == pytest.approx(16 ** -0.5)
    left = {n.op for n in res.graph.nodes}
    assert not left & {"Equal", "ReduceMax", "Select", "BatchMatMul", "Transpose"}, left
    feeds = random_inputs(g, seed=4)
    feeds["keep"] = _keep()
    (got,) = Interpreter(res.graph).run(feeds)
    (want,) = Interpreter(g).run(feeds)
    assert np.all(want[:, 3] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_every_candidate_of_the_math_path_it_cannot_take_says_why():
    """Head size 8: the candidate is refused naming the operator's limit, and explain says
    so; nothing changes."""
    g = _math_path(dim=8)
    res = _compile(g)
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert rec.verdict == "refused" and "head size D=8" in rec.reason
    assert "refused  qk  -- unsupported head size D=8" in format_explain(explain(res))


def _imported(layout_ok=True) -> Graph:
    """What the torch frontend makes of scaled_dot_product_attention on head splits: one
    BNSD FusedAttention between the split and merge transposes."""
    g = Graph("sdpa")
    split = []
    for n in "qkv":
        x = g.add_input(n, TensorType((2, 8, 64), "float32"))
        x = g.add_node("Reshape", [x], {"shape": [2, 8, 4, 16]}).output
        split.append(g.add_node("Transpose", [x], {"perm": [0, 2, 1, 3]}).output)
    fa = g.add_node("FusedAttention", split, {"head_num": 4, "scale": 0.25, "causal": True},
                    name="sdpa").output
    o = g.add_node("Transpose", [fa], {"perm": [0, 2, 1, 3]}).output
    outs = [g.add_node("Reshape", [o], {"shape": [2, 8, 64]}).output]
    if not layout_ok:
        outs.append(fa)  # the BNSD output is read as it is too
    g.set_outputs(outs)
    return g


def test_an_imported_fused_attention_reads_its_head_splits_in_place():
    g = _imported()
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSH" and fa.attrs["causal"]
    assert "Transpose" not in {n.op for n in res.graph.nodes}
    (rec,) = res.analyses.attention
    assert rec.verdict == "fused" and "from the frontend" in rec.reason and "BSH" in rec.reason
    feeds = random_inputs(g)
    np.testing.assert_allclose(Interpreter(res.graph).run(feeds)[0],
                               Interpreter(g).run(feeds)[0], rtol=1e-5, atol=1e-6)
    kept = _compile(_imported(layout_ok=False))
    (rec,) = kept.analyses.attention
    assert "layout BNSD (an operand or the output is not a head split" in rec.reason
    assert "FUSED    sdpa -> sdpa" in format_explain(explain(kept))


def _kept_where(g: Graph, cond, low: float = float(np.finfo(np.float32).min)) -> Graph:
    """``where(cond, scores, low)`` before the softmax of ``_attention``'s graph: the scores
    kept where ``cond`` is True (GPT-Neo's causal bias buffer)."""
    s = g.node("probs").inputs[0]
    kept = g.add_node("Select", [cond, s, g.const(np.float32(low))], name="kept").output
    g.replace_input(g.node("probs"), 0, kept)
    return g


@pytest.mark.parametrize("constant", [True, False])
def test_scores_kept_where_a_condition_holds_are_masked_by_its_negation(constant):
    """``where(cond, scores, finfo.min)`` (True = attended) is the masked_fill of the
    condition's negation: one launch whose atten_mask is ``not cond``, the same results."""
    rng = np.random.default_rng(0)
    g = _attention()
    if constant:
        cond = g.const(np.tril(np.ones((8, 8), bool))[None, None], DType.bool)
    else:
        cond = g.add_input("keep", TensorType((2, 1, 8, 8), "bool"))
    g = _kept_where(g, cond)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "atten_mask", fa.attrs
    mask = fa.inputs[3]
    assert mask.dtype is DType.bool
    if constant:  # folded at compile time: True above the diagonal (masked out)
        from graphkernel.passes.rewrite import const_array
        np.testing.assert_array_equal(const_array(mask).reshape(8, 8),
                                      np.triu(np.ones((8, 8), bool), 1))
    else:
        assert mask.producer.op == "LogicalNot"
    assert any("kept" in r.reason for r in res.analyses.attention if r.verdict == "fused")
    feeds = random_inputs(g, seed=3)
    if not constant:  # every row keeps a key
        feeds["keep"] = rng.random((2, 1, 8, 8)) < 0.5
        feeds["keep"][..., 0] = True
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds),
                    strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("computed", [False, True])
def test_a_kept_condition_and_a_minimum_mask_are_one_atten_mask_their_union(computed):
    """GPT-Neo: ``where(causal, scores, finfo.min) + mask`` with ``mask`` only 0 and the
    float minimum: both mask, so the operator's one atten_mask is their union (a constant
    folded at compile time, or a LogicalOr of a computed one); the same results."""
    rng = np.random.default_rng(1)
    g = _attention()
    g = _kept_where(g, g.const(np.tril(np.ones((8, 8), bool))[None, None], DType.bool))
    low = np.float32(np.finfo(np.float32).min)
    if computed:
        pad = g.add_input("padded", TensorType((2, 1, 1, 8), "bool"))
        m = g.add_node("Select", [pad, g.const(low), g.const(np.float32(0))]).output
    else:
        pad_arr = np.zeros((2, 1, 8, 8), np.float32)
        pad_arr[1, ..., 5:] = low
        m = g.const(pad_arr)
    s = g.node("probs").inputs[0]
    g.replace_input(g.node("probs"), 0, g.add_node("Add", [s, m], name="padding").output)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "atten_mask", fa.attrs
    assert any("united" in r.reason for r in res.analyses.attention if r.verdict == "fused")
    feeds = random_inputs(g, seed=4)
    if computed:
        feeds["padded"] = rng.random((2, 1, 1, 8)) < 0.4
        feeds["padded"][..., 0] = False
    _same_results(g, res, feeds=feeds)


def test_scores_kept_where_a_condition_holds_with_a_finite_floor_are_refused():
    """``where(cond, scores, -1)``: the other scores keep a weight, no mask says so."""
    g = _attention()
    g = _kept_where(g, g.const(np.tril(np.ones((8, 8), bool))[None, None], DType.bool),
                    low=-1.0)
    res = _compile(g)
    assert not _fused(res)


def _windowed(bias: bool = False, k_split: bool = False) -> Graph:
    """Attention with three batch axes (batch, windows, heads: Hiera's masked units, LongT5's
    blocks): Q, K, V [2, 3, 2, 8, 16] flattened to [12, 8, 16] for the products; ``bias``
    adds a computed bias to the scores viewed [12, 2, 4, 2, 4] (ViTDet's decomposed relative
    positions); ``k_split``: K instead a [2, 8, 12·16] head split (not the same batch
    axes)."""
    g = Graph("windowed")
    ops = []
    for n in "qkv":
        if n == "k" and k_split:
            x = g.add_input(n, TensorType((2, 8, 6 * 16), "float32"))
            x = g.add_node("Reshape", [x], {"shape": [2, 8, 6, 16]}).output
            x = g.add_node("Transpose", [x], {"perm": [0, 2, 1, 3]}).output
        else:
            x = g.add_input(n, TensorType((2, 3, 2, 8, 16), "float32"))
        ops.append(g.add_node("Reshape", [x], {"shape": [12, 8, 16]}).output)
    s = g.add_node("BatchMatMul", ops[:2], {"transpose_b": True}, name="qk").output
    s = g.add_node("Mul", [s, g.const(np.float32(0.25))]).output
    if bias:
        s = g.add_node("Reshape", [s], {"shape": [12, 2, 4, 2, 4]}).output
        b = g.add_input("bias", TensorType((12, 2, 4, 2, 4), "float32"))
        s = g.add_node("Add", [s, g.add_node("Tanh", [b]).output]).output
        s = g.add_node("Reshape", [s], {"shape": [12, 8, 8]}).output
    p = g.add_node("Softmax", [s], {"axis": -1}, name="probs").output
    o = g.add_node("BatchMatMul", [p, ops[2]], name="pv").output
    g.set_outputs([g.add_node("Reshape", [o], {"shape": [2, 3, 2, 8, 16]}).output])
    return g


@pytest.mark.parametrize("bias", [False, True])
def test_attention_over_more_than_two_batch_axes_is_one_launch(bias):
    """Q, K, V with batch, window and head axes are read as [12, 1, S, D] (each (batch,
    window, head) one head of its own): one launch, the same results; a bias added to the
    scores in another view of theirs is viewed back as the scores, the pse."""
    g = _windowed(bias=bias)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] in ("BNSD", "BSND", "BSH") and fa.attrs["head_num"] == 1
    assert fa.attrs["mask"] == ("pse" if bias else "none"), fa.attrs
    assert fa.inputs[0].type.shape[0] == 12
    (rec,) = [r for r in res.analyses.attention if r.verdict == "fused"]
    assert "batch axes read as one" in rec.reason
    feeds = random_inputs(g, seed=5)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds),
                    strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_batch_axes_read_as_one_only_when_q_k_and_v_all_are():
    """K a head split [2, 6, 8, 16] while Q and V have three batch axes: Q's [12, 1, S, D]
    and K's 6 heads would pair other matrices than the product does (and K's one-head view
    would look like multi-query attention): refused, saying why."""
    res = _compile(_windowed(k_split=True))
    assert not _fused(res)
    assert any("not all read" in r.reason for r in res.analyses.attention)


def _local(bias: tuple | None = None, kv_batch: tuple = (2, 3), kv_heads: int = 2,
           masked: tuple | None = None) -> Graph:
    """LongT5's local attention: Q [2, 3, 8, 2, 16] (batch, blocks, a block's queries,
    heads, head size) and K, V [2, 3, 12, 2, 16] (each block's keys: three blocks' worth),
    head split by Transpose(0, 1, 3, 2, 4) (Kᵀ by Transpose(0, 1, 3, 4, 2): the head split
    and Kᵀ at once), the products over [12, .., ..] views (an einsum's), the output merged
    back by Transpose(0, 1, 3, 2, 4) to [2, 24, 32]. ``bias``: the shape of a computed bias
    added to the scores viewed in five axes [2, 3, 2, 8, 12]; ``masked``: the shape of a
    boolean input masking them out (masked_fill); ``kv_batch``/``kv_heads``: K and V's own
    batch axes and heads (other than Q's: not the same matrices)."""
    g = Graph("local")
    q = g.add_input("q", TensorType((2, 3, 8, 2, 16), "float32"))
    q = g.add_node("Transpose", [q], {"perm": [0, 1, 3, 2, 4]}).output
    q = g.add_node("Reshape", [q], {"shape": [12, 8, 16]}).output
    kv = []
    for n, perm in (("k", [0, 1, 3, 4, 2]), ("v", [0, 1, 3, 2, 4])):
        x = g.add_input(n, TensorType((*kv_batch, 12, kv_heads, 16), "float32"))
        x = g.add_node("Transpose", [x], {"perm": perm}).output
        kv.append(g.add_node("Reshape", [x], {"shape": [12, *x.type.shape[-2:]]}).output)
    s = g.add_node("BatchMatMul", [q, kv[0]], name="qk").output
    s = g.add_node("Reshape", [s], {"shape": [2, 3, 2, 8, 12]}).output
    if bias:
        b = g.add_input("bias", TensorType(bias, "float32"))
        s = g.add_node("Add", [s, g.add_node("Tanh", [b]).output]).output
    if masked:
        c = g.add_input("masked", TensorType(masked, "bool"))
        s = g.add_node("Select", [c, g.const(np.float32(-np.inf)), s]).output
    p = g.add_node("Softmax", [s], {"axis": -1}, name="probs").output
    p = g.add_node("Reshape", [p], {"shape": [12, 8, 12]}).output
    o = g.add_node("BatchMatMul", [p, kv[1]], name="pv").output
    o = g.add_node("Reshape", [o], {"shape": [2, 3, 2, 8, 16]}).output
    o = g.add_node("Transpose", [o], {"perm": [0, 1, 3, 2, 4]}).output
    g.set_outputs([g.add_node("Reshape", [o], {"shape": [2, 24, 32]}).output])
    return g


@pytest.mark.parametrize("bias,masked,mask,shape", [
    (None, None, "none", None),
    ((2, 3, 2, 8, 12), None, "pse", [6, 2, 8, 12]),
    ((1, 1, 2, 8, 12), None, "pse", [1, 2, 8, 12]),
    (None, (2, 3, 1, 8, 12), "atten_mask", [6, 1, 8, 12]),
])
def test_local_attention_blocks_are_one_batch_read_in_place(bias, masked, mask, shape):
    """The batch and block axes in front of the head split are read as one batch B = 6 with
    the 2 heads kept: Q, K, V and the output read and written in place in BSH (no head
    transpose left), K's head split and Kᵀ included; a mask over the scores' five axes has
    its batch axes read as one too (one for each of the 6, or one for all). The same
    results."""
    g = _local(bias=bias, masked=masked)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["layout"] == "BSH" and fa.attrs["head_num"] == 2, fa.attrs
    assert fa.attrs["mask"] == mask
    assert [list(x.type.shape) for x in fa.inputs[:3]] == [[6, 8, 32], [6, 12, 32],
                                                           [6, 12, 32]]
    assert shape is None or list(fa.inputs[3].type.shape) == shape
    left = {n.op for n in res.graph.nodes}
    assert not left & {"Transpose", "BatchMatMul", "Exp"}, left
    _same_results(g, res)


def test_local_attention_with_other_batch_axes_for_k_and_v_is_refused():
    """K and V of 3 heads over [2, 2] batch axes: as many matrices as Q's [2, 3] × 2 heads,
    but B 4 against Q's 6 — the operator would pair other matrices: refused, saying why."""
    res = _compile(_local(kv_batch=(2, 2), kv_heads=3))
    assert not _fused(res)
    (rec,) = res.analyses.attention
    assert rec.verdict == "refused" and "differ in their batch (6, 4, 4)" in rec.reason


def test_local_attention_with_one_kv_head_reads_every_batch_axis_as_one():
    """K and V of one head over [2, 6]: their head split moves an axis of 1 (a view, no
    head axis left to see), so Q and V are read as K is, [12, 1, S, D] — each of the 12
    matrices the products pair one head of its own. Fused, the same results."""
    g = _local(kv_batch=(2, 6), kv_heads=1)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["head_num"] == 1 and fa.inputs[0].type.shape[0] == 12
    _same_results(g, res)


@pytest.mark.sim
def test_local_attention_is_one_launch_through_the_pipeline_and_the_simulator():
    """Through the whole pipeline: the attention one extern launch (before: both products,
    the softmax and the head transposes), its result in the simulator equal to the
    interpreter's of the graph as written."""
    g = _local()
    res = graphkernel.compile(g, "--opt_level=2", env={})
    kinds = [e["kind"] for e in launches(res.graph)]
    assert kinds == ["extern"], kinds
    off = graphkernel.compile(_local(), "--opt_level=2 --disable_pass=attention", env={})
    assert len(launches(off.graph)) >= 2
    feeds = random_inputs(g, seed=3)
    sim, _ = run_sim(res, feeds)
    (want,) = Interpreter(g).run(feeds)
    np.testing.assert_allclose(sim[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", [(2, 1, 8, 8), (1, 1, 8, 8), (1, 8, 8)])
def test_a_computed_mask_of_every_score_shared_by_the_heads_grows_to_the_pse(mask):
    """A computed additive mask of every (query, key) pair shared by the heads ([B, 1, S1,
    S2]: a decoder's 4-d causal mask fed from an earlier graph) is broadcast to the
    operator's [B, N, S1, S2] — as many values as the scores the unfused attention would
    write and read back — so the attention is one launch, with the same results; a per-query
    bias ([B, 1, S1, 1]) is still refused (test_refusals_say_why)."""
    g = _attention(mask=mask)
    res = _compile(g)
    (fa,) = _fused(res)
    assert fa.attrs["mask"] == "pse"
    assert tuple(fa.inputs[3].type.shape) == (2, 4, 8, 8)
    (rec,) = [a for a in res.analyses.attention if a.verdict == "fused"]
    assert "broadcast to [2, 4, 8, 8]" in rec.reason, rec.reason
    feeds = random_inputs(g, seed=3)
    for a, b in zip(Interpreter(g).run(feeds), Interpreter(res.graph).run(feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
