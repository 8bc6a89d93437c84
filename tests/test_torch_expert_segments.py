"""Mixture-of-experts layers that split the sorted tokens by their experts' counts read as
Python numbers (``expert_size.tolist()``, the ScatterMoE / Megablocks ``ParallelExperts``
that JetMoE uses) and run one product per expert: after Dynamo's graph break the counts are
symbolic inputs, and the split + products + concatenation becomes one grouped product
instead of running the graph through torch."""

from __future__ import annotations

import copy
import logging

import pytest

from tests.training import step

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402
from graphkernel.frontends.expert_segments import group_segmented_products  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]
F = torch.nn.functional


class ParallelExperts(torch.nn.Module):
    """One weight per expert, stacked; the rows come sorted by expert, ``sizes`` of each."""

    def __init__(self, experts, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, n_out, n_in) * n_in ** -0.5)

    def forward(self, x, sizes):
        parts = x.split(sizes, dim=0)
        return torch.cat([F.linear(parts[i], self.weight[i]) for i in range(len(parts))],
                         dim=0)


class ScatterMoE(torch.nn.Module):
    """Top-k routing, tokens sorted by expert, counts read as numbers, a GLU per expert."""

    def __init__(self, dim=16, hidden=24, experts=4, k=2):
        super().__init__()
        self.k, self.experts = k, experts
        self.router = torch.nn.Linear(dim, experts, bias=False)
        self.up = ParallelExperts(experts, dim, 2 * hidden)
        self.down = ParallelExperts(experts, hidden, dim)

    def forward(self, x):
        b, s, d = x.shape
        x = x.reshape(-1, d)
        logits = self.router(x)
        top, idx = logits.topk(self.k, dim=1)
        gates = torch.softmax(top, dim=1)
        counts = torch.zeros(x.shape[0], self.experts).scatter(1, idx, 1).long().sum(0)
        sizes = counts.tolist()  # (Dynamo breaks the graph here)
        _, order = idx.flatten().sort(0)
        rows = order.div(self.k, rounding_mode="trunc")
        h = self.up(x[rows], sizes)
        a, g = h.chunk(2, dim=-1)
        y = self.down(F.silu(a) * g, sizes) * gates.flatten()[order][:, None]
        return torch.zeros_like(x).index_add(0, rows, y).view(b, s, d)


def _g(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _inputs():
    """Two batches routed differently: the second compile has symbolic expert counts."""
    return [_g(2, 8, 16, seed=1), _g(2, 8, 16, seed=2)]


def test_expert_counts_read_as_numbers_make_grouped_products_and_match_eager(monkeypatch):
    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")
    torch.manual_seed(0)
    model = ScatterMoE().eval()
    fn = torch.compile(model, backend="graphkernel")
    with torch.no_grad():
        for x in _inputs():
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=2e-5)
    s = gt.stats()
    assert s["graphs_through_torch"] == {} and s["bugs"] == 0, s["graphs_through_torch"]
    assert s["launches"]["opaque"] == 0 and s["fallbacks"] == {}, s["fallbacks"]
    # the counts changed: the expert graph compiled again, its counts symbolic; there and
    # in its first compile the two products are two grouped products (extern launches),
    # not one cube launch per expert
    experts = [g for g in s["per_graph"] if g["launches"]["extern"]]
    assert len(experts) == 2 and [g["recompile"] for g in experts] == [False, True]
    for g in experts:
        assert g["launches"]["extern"] == 2 and g["launches"]["cube"] == 0, g["launches"]


def test_the_expert_graph_is_a_few_launches():
    """Launches of the graph after the break with symbolic counts: the gather of the sorted
    rows, the grouped products and their GLU, the gates and the scatter back (on the base
    tree the whole graph, 30 and more ATen ops, ran through torch)."""
    torch.manual_seed(0)
    model = ScatterMoE().eval()
    fn = torch.compile(model, backend="graphkernel")
    with torch.no_grad():
        for x in _inputs():
            fn(x)
    (g,) = [g for g in gt.stats()["per_graph"] if g["recompile"] and g["aten_ops"] > 20]
    assert g["through_torch"] == "" and sum(g["launches"].values()) <= 16, g["launches"]


def test_expert_segments_train_with_eager_gradients(monkeypatch):
    """In training the forward keeps each expert's rows for the weights' gradients (the
    split stays, so no grouped product replaces it): the graphs of the symbolic counts run
    through torch as before, the first ones through graphkernel; gradients as eager's."""
    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")
    torch.manual_seed(0)
    model = ScatterMoE().train()
    twin = copy.deepcopy(model)
    fn = torch.compile(twin, backend="graphkernel")
    for x in _inputs():
        want_out, want = step(model, model, (x,))
        got_out, got = step(twin, fn, (x,))
        torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=2e-5)
        for k, g in want.items():
            torch.testing.assert_close(got[k], g, rtol=1e-3, atol=1e-5, msg=k)
    s = gt.stats()
    assert s["bugs"] == 0
    assert any(g["role"] == "backward" and not g["through_torch"] for g in s["per_graph"])


def test_a_split_by_symbolic_counts_without_products_still_runs_through_torch(caplog):
    """Parts reduced rather than multiplied: no grouped product; that graph keeps running
    through torch, with the symbolic size named in the logged reason, while the experts'
    graph of the same counts compiles."""
    def fn(x):
        counts = (x[:, 0] > 0).long() + 1
        sizes = [int(c) for c in counts.tolist()]
        parts = torch.ones(sum(sizes), 3).split(sizes, dim=0)
        return torch.cat([p.sum(0, keepdim=True) * (i + 1) for i, p in enumerate(parts)])

    torch.manual_seed(0)
    model = ScatterMoE().eval()
    experts = torch.compile(model, backend="graphkernel")
    compiled = torch.compile(fn, backend="graphkernel")
    with caplog.at_level(logging.WARNING, logger="graphkernel.torch"), torch.no_grad():
        for seed, x in zip((1, 2, 3), _inputs() + [_g(2, 8, 16, seed=3)], strict=True):
            torch.testing.assert_close(experts(x), model(x), rtol=1e-4, atol=2e-5)
            y = _g(3, 2, seed=seed)
            torch.testing.assert_close(compiled(y), fn(y))
    s = gt.stats()
    assert s["bugs"] == 0
    reasons = list(s["graphs_through_torch"])
    assert reasons and all("symbolic size" in r for r in reasons), reasons
    through = [g for g in s["per_graph"] if g["through_torch"]]
    assert through and all(g["aten_ops"] < 20 for g in through), through  # not the experts'
    assert any(g["recompile"] and g["launches"].get("extern") for g in s["per_graph"])


def test_the_rewrite_is_structural_and_exact():
    from torch.fx.experimental.proxy_tensor import make_fx

    def segmented(x, w):
        parts = x.split([2, 3, 1], dim=0)
        return torch.cat([p @ w[i] for i, p in enumerate(parts)], dim=0) * 2

    x, w = _g(6, 8), _g(3, 8, 4, seed=4)  # (torch runs _grouped_mm on 16-byte rows)
    gm = make_fx(segmented, tracing_mode="fake")(x, w)
    new = group_segmented_products(gm)
    assert new is not None
    targets = [n.target for n in new.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._grouped_mm.default in targets
    assert torch.ops.aten.split_with_sizes.default not in targets
    assert torch.ops.aten.mm.default not in targets
    torch.testing.assert_close(new(x, w), segmented(x, w))

    def part_read_twice(x, w):  # a part read by another op too: left as it is
        parts = x.split([2, 3, 1], dim=0)
        return torch.cat([p @ w[i] for i, p in enumerate(parts)], dim=0).sum() + parts[0].sum()

    assert group_segmented_products(make_fx(part_read_twice, tracing_mode="fake")(x, w)) \
        is None


def test_a_size_read_as_a_number_is_fed_not_counted(monkeypatch):
    """``torch.full((1,), x.shape[0])`` under ``dynamic=True``: the size is a scalar input of
    the imported graph, fed with its value at each call (one launch: the product; the base
    tree counted the size with a reduction over ones, 3 launches); every size matches eager."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from graphkernel.frontends.fx import import_fx_module

    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")

    def f(x):
        return x * torch.full((1,), x.shape[0], dtype=torch.float32)

    compiled = torch.compile(f, backend="graphkernel", dynamic=True)
    for n in (5, 7, 9):
        x = _g(n, 3, seed=n)
        torch.testing.assert_close(compiled(x), f(x))
    (g,) = gt.stats()["per_graph"]
    assert g["symbols"] and not g["recompile"] and sum(g["launches"].values()) == 1, g

    gm = make_fx(f, tracing_mode="symbolic")(_g(5, 3))
    fed = import_fx_module(gm, None, sizes_in=True)
    assert len(fed.sizes) == 1 and "ReduceSum" not in {n.op for n in fed.graph.nodes}
    ((at, dim),) = fed.sizes.items()
    # a scalar input holding x's row count (the symbol of x's first dim)
    assert fed.graph.inputs[at].type.shape == () and dim == fed.graph.inputs[0].type.shape[0]
    counted = import_fx_module(gm, None)  # exported graphs: no extra input, a count
    assert not counted.sizes and len(counted.graph.inputs) == 1
    assert "ReduceSum" in {n.op for n in counted.graph.nodes}


def test_running_sums_of_counts_are_fed_with_the_counts():
    """The counts read as numbers are scalar graph inputs the runner feeds with the symbols'
    values (each was once a reduction over a tensor of ones of its length: two launches per
    count), and the grouped product's offsets, their running sum, are one vector input the
    runner feeds (the host holds the counts): the graph with symbolic counts costs no launch
    more than the static one, whose offsets are constants (before, the counts' Concat and
    CumSum were two launches more)."""
    torch.manual_seed(0)
    model = ScatterMoE().eval()
    fn = torch.compile(model, backend="graphkernel")
    with torch.no_grad():
        for x in _inputs():
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=2e-5)
    static, symbolic = [g for g in gt.stats()["per_graph"] if g["aten_ops"] > 20]
    assert not static["recompile"] and symbolic["recompile"]
    assert sum(symbolic["launches"].values()) <= sum(static["launches"].values()), \
        (static["launches"], symbolic["launches"])


def test_sizes_concatenated_and_summed_are_one_fed_vector(monkeypatch):
    """``cumsum(cat(full((1,), n_i)))`` of symbolic sizes: one vector input of the running
    sums (each element the sum of its sizes), no Concat or CumSum; a vector mixing a static
    size in, and one of static sizes alone (constants: nothing fed); values as eager's at
    every size under ``dynamic=True``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from graphkernel.frontends.fx import fed_size, import_fx_module

    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")

    def f(x, y):
        n = torch.cat([torch.full((1,), x.shape[0], dtype=torch.int32),
                       torch.full((1,), 3, dtype=torch.int32),
                       torch.full((1,), y.shape[0], dtype=torch.int32)]).cumsum(0)
        return x.sum(0) * n.float()[:, None].sum(0) + y.sum(0) * n[-1].float()

    gm = make_fx(f, tracing_mode="symbolic")(_g(5, 3), _g(4, 3))
    fed = import_fx_module(gm, None, sizes_in=True)
    ops = {n.op for n in fed.graph.nodes}
    assert "Concat" not in ops and "CumSum" not in ops, ops
    vectors = [(i, s) for i, s in fed.sizes.items() if isinstance(s, tuple)]
    assert len(vectors) == 1, fed.sizes
    at, sums = vectors[0]
    assert fed.graph.inputs[at].type.shape == (3,)
    a, b = fed.graph.inputs[0].type.shape[0], fed.graph.inputs[1].type.shape[0]
    assert fed_size(sums, {a: 5, b: 4}) == [5, 8, 12]

    compiled = torch.compile(f, backend="graphkernel", dynamic=True)
    for n in (5, 7, 9):
        x, y = _g(n, 3, seed=n), _g(n + 2, 3, seed=n + 1)
        torch.testing.assert_close(compiled(x, y), f(x, y))
    assert all(not g["through_torch"] for g in gt.stats()["per_graph"])


def test_rows_added_back_at_their_tokens_are_one_index_put(monkeypatch):
    """``zeros_like(x).index_add(0, rows, y)`` (the experts' rows added back to their tokens)
    is one IndexPut at the 1-D rows: the rows' broadcast over the hidden axis (int64, a
    launch of its own on the base tree) is gone; index_put of whole rows likewise; both
    as eager, repeated rows included."""
    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")

    def f(x, y, rows):
        added = torch.zeros_like(x).index_add(0, rows, y)
        put = x.clone()
        put[rows[:3]] = y[:3] * 2
        return added * 2, put + 1

    x, y = _g(6, 16, seed=1), _g(8, 16, seed=2)
    rows = torch.tensor([0, 3, 5, 3, 1, 0, 0, 2])
    compiled = torch.compile(f, backend="graphkernel")
    for got, want in zip(compiled(x, y, rows), f(x, y, rows), strict=True):
        torch.testing.assert_close(got, want)
    (g,) = gt.stats()["per_graph"]
    # the rows' slice, two IndexPuts, the doubled updates, the two results' ops (the base
    # tree: 8, with the two broadcasts of the rows)
    assert g["launches"]["opaque"] == 0 and sum(g["launches"].values()) <= 6, g["launches"]
