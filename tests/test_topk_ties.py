"""Ties in a top-k or a sort: any choice among equal values is a valid top-k, but a
torch program's result is eager's. The torch frontend's TopK takes torch's own choice and
order (``ties`` "torch.topk" / "torch.sort": computed by torch), its routers' gating
operators too; ONNX's rule (the lower index first) stays TopK's default, now also for
integers at the ends of their range."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.interpreter import run_graph

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402


def _run(op, inputs, attrs):
    g = Graph(op)
    ins = [g.add_input(f"i{k}", TensorType(a.shape, str(a.dtype))) for k, a in enumerate(inputs)]
    node = g.add_node(op, ins, attrs)
    g.set_outputs(list(node.outputs))
    g.validate()
    return run_graph(g, {f"i{k}": a for k, a in enumerate(inputs)})


def _compiled(fn, *args):
    """(graphkernel's results, eager's, stats, the compiled graphs' nodes)."""
    import graphkernel

    res, orig = [], graphkernel.compile

    def capture(*a, **k):
        res.append(orig(*a, **k))
        return res[-1]

    torch._dynamo.reset()
    gt.reset_stats()
    try:
        graphkernel.compile = capture
        with torch.no_grad():
            want = fn(*args)
            got = torch.compile(fn, backend="graphkernel")(*args)
    finally:
        graphkernel.compile = orig
        torch._dynamo.reset()
    return got, want, gt.stats(), [n for r in res for n in r.graph.nodes]


def _ties(*shape, levels=3, seed=0):
    """Values of a few levels only: ties everywhere, around every k."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, shape, generator=g).float()


def test_topk_and_sort_over_ties_are_eagers_choice_and_order():
    """Sorted and unsorted, largest and smallest, k = 1 and k = n, batch dims, a middle
    axis, sizes on both sides of torch's switch from one selection algorithm to another,
    integers, and the default (unstable) sort: every index as eager's."""
    def f(x, y, i):
        outs = []
        for k, largest, ordered in ((1, True, True), (8, True, False), (8, False, True),
                                    (x.shape[-1], False, False)):
            outs += list(torch.topk(x, k, dim=-1, largest=largest, sorted=ordered))
        outs += list(torch.topk(x, 3, dim=1))  # a middle axis of [2, 9, 70]
        outs += list(torch.topk(y, 4, dim=-1, sorted=False))  # 600 per row
        outs += list(torch.topk(i, 2, dim=-1, largest=False))  # integers
        outs += list(torch.sort(y, dim=-1, descending=True))  # torch's default: not stable
        outs += list(torch.sort(y, dim=-1, stable=True))
        return outs

    x, y = _ties(2, 9, 70), _ties(3, 600, levels=2, seed=1)
    i = torch.randint(0, 2, (4, 9), generator=torch.Generator().manual_seed(2))
    got, want, s, nodes = _compiled(f, x, y, i)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert s["launches"]["opaque"] == 0 and not s["fallbacks"], s  # graphkernel's TopK
    ties = sorted({n.attrs["ties"] for n in nodes if n.op == "TopK"})
    assert ties == ["first", "torch.sort", "torch.topk"], ties


def test_torch_tie_rule_is_torchs_own_choice_not_the_lower_index():
    """On nine equal values torch keeps neither the first eight nor the last: the rule is
    torch's, so the reference asks torch (the default rule stays ONNX's)."""
    x = np.zeros((1, 9), np.float32)
    want = torch.topk(torch.from_numpy(x), 8, sorted=False).indices.numpy()
    _, idx = _run("TopK", [x], {"k": 8, "ties": "torch.topk", "sorted": False})
    np.testing.assert_array_equal(idx, want)
    _, first = _run("TopK", [x], {"k": 8})
    assert first.tolist() == [list(range(8))] and not np.array_equal(first, want)
    bf = np.zeros((2, 6), np.float32).astype(TensorType((1,), "bfloat16").dtype.np)
    v, idx = _run("TopK", [bf], {"k": 2, "ties": "torch.topk"})
    assert v.dtype == bf.dtype
    np.testing.assert_array_equal(idx, torch.topk(torch.zeros(2, 6), 2).indices.numpy())
    with pytest.raises(Exception, match="must be the axis size"):
        _run("TopK", [x], {"k": 3, "ties": "torch.sort"})


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
def test_first_rule_ranks_integers_at_the_ends_of_their_range(dtype):
    """ONNX's rule (the lower index first among equals, the values in order): the largest
    of integers including their minimum and maximum (negating INT_MIN or an unsigned value
    wrapped around)."""
    info = np.iinfo(dtype)
    x = np.array([[info.min, 1, info.max, info.min, info.max, 0]], dtype)
    v, idx = _run("TopK", [x], {"k": 3, "largest": True})
    assert idx.tolist() == [[2, 4, 1]] and v.tolist() == [[info.max, info.max, 1]]
    v, idx = _run("TopK", [x], {"k": 3, "largest": False})
    assert idx.tolist() == [[0, 3, 5]] and v.tolist() == [[info.min, info.min, 0]]


def test_first_rule_orders_ties_and_nan_as_onnx():
    x = np.array([[1.0, np.nan, 2.0, 2.0, 1.0, -0.0, 0.0]], np.float32)
    _, idx = _run("TopK", [x], {"k": 7, "largest": True})
    assert idx.tolist() == [[1, 2, 3, 0, 4, 5, 6]]
    _, idx = _run("TopK", [x], {"k": 7, "largest": False})
    assert idx.tolist() == [[5, 6, 0, 4, 2, 3, 1]]


E = 8


def _router(logits):
    """Mixtral's router: the K largest of the softmax, renormalised; the ids to int32."""
    w, ids = torch.topk(torch.softmax(logits, -1), 2, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def _sigmoid_router(logits, bias):
    """A sigmoid router ranking scores plus a bias (afmoe's, DeepSeek's with one group)."""
    scores = logits.sigmoid()
    ids = torch.topk(scores + bias, 2, dim=-1)[1]
    wts = scores.gather(1, ids)
    return wts / (wts.sum(-1, keepdim=True) + 1e-20), ids.to(torch.int32)


@pytest.mark.parametrize("router", ["softmax", "ranked"])
def test_routers_gating_operator_picks_eagers_experts_among_ties(router):
    """A router at its initialisation (a zero gate: every expert's score equal) keeps the
    gating operator (one extern launch) and picks the experts eager picks."""
    logits = torch.zeros(6, E)
    logits[1, 3:] = 1.0  # ties among the best, and a row without ties
    logits[2] = torch.arange(E).float()
    if router == "softmax":
        got, want, s, nodes = _compiled(_router, logits)
    else:
        got, want, s, nodes = _compiled(_sigmoid_router, logits, torch.zeros(E))
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    gating = [n for n in nodes if n.op == "MoeGatingTopKSoftmax"]
    assert len(gating) == 1 and gating[0].attrs["ties"] == "torch.topk", nodes
    assert s["launches"]["extern"] == 1, s


def test_group_router_picks_eagers_groups_and_experts_among_ties():
    """DeepSeek-V3's group-limited router with every score tied (a zero gate and bias):
    the vendor's group gating operator, its groups and experts eager's."""
    def f(logits, bias):
        scores = logits.sigmoid()
        choice = scores + bias
        gs = choice.view(-1, 4, 2).topk(2, dim=-1)[0].sum(dim=-1)
        gi = torch.topk(gs, k=2, dim=-1, sorted=False)[1]
        gm = torch.zeros_like(gs).scatter_(1, gi, 1)
        mask = gm.unsqueeze(-1).expand(-1, 4, 2).reshape(-1, E)
        ids = torch.topk(choice.masked_fill(~mask.bool(), float("-inf")), k=3, dim=-1)[1]
        wts = scores.gather(1, ids)
        return wts / (wts.sum(dim=-1, keepdim=True) + 1e-20), ids.to(torch.int32)

    got, want, s, nodes = _compiled(f, torch.zeros(5, E), torch.zeros(E))
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    gating = [n for n in nodes if n.op == "MoeGatingTopK"]
    assert len(gating) == 1 and gating[0].attrs["ties"] == "torch.topk", nodes


def test_picks_by_max_keep_their_rule_and_torch_topk_of_one_is_not_a_pick():
    """torch.max's index is the first among equals (TopK "first"): experts picked one by
    one with it are the gating operator's lower-expert rule; a torch.topk of one is not
    that rule, and stays a TopK computed by torch."""
    def picks(logits, fn):
        first = fn(logits)
        masked = logits.scatter(-1, first, float("-inf"))
        second = fn(masked)
        return torch.cat([first, second], -1).to(torch.int32)

    by_max = lambda v: v.max(dim=-1, keepdim=True)[1]  # noqa: E731
    by_topk = lambda v: torch.topk(v, 1, dim=-1)[1]  # noqa: E731
    logits = torch.zeros(4, E)
    for fn, gated in ((by_max, True), (by_topk, False)):
        got, want, _, nodes = _compiled(lambda x, fn=fn: picks(x, fn), logits)
        assert torch.equal(got, want)
        assert any(n.op == "MoeGatingTopKSoftmax" for n in nodes) == gated, nodes
