"""The torch.compile backend's behaviour around the graphs: freezing, training graphs,
logging and statistics, per-graph dumps, dynamic shapes."""

from __future__ import annotations

import json
import logging
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import graphkernel.torch as gt  # noqa: E402
from graphkernel import symbolic  # noqa: E402
from graphkernel.errors import ExecutionError  # noqa: E402
from graphkernel.frontends import torch_backend  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]  # torch.compile of modules

R = torch.Generator().manual_seed(1)


class Net(torch.nn.Module):
    """Embedding, LayerNorm, two Linears (their weights are transposed for the MatMul) and a
    parameter the output does not use (its gradient is None)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.unused = torch.nn.Parameter(torch.ones(3))
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids):
        h = self.ln(self.emb(ids))
        return h + self.fc2(F.gelu(self.fc1(h))) * self.scale


def _ids(*shape):
    return torch.randint(0, 20, shape, generator=R)


def _compiled_graphs(monkeypatch) -> list:
    """Capture the graphs the backend compiled (after the pipeline)."""
    seen = []
    orig = torch_backend._runner

    def spy(imported, compiled, runner=None):
        seen.append(compiled)
        return orig(imported, compiled, runner)

    monkeypatch.setattr(torch_backend, "_runner", spy)
    return seen


def test_no_grad_freezes_parameters_and_folds_weight_transposes(monkeypatch):
    graphs = _compiled_graphs(monkeypatch)
    m = Net().eval()
    ids = _ids(2, 7)
    c = torch.compile(m, backend="graphkernel")
    with torch.no_grad():
        torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
    (g,) = graphs
    s = gt.stats()["per_graph"][0]
    assert s["role"] == "inference" and s["frozen"] == 8  # 7 parameters used + the buffer
    assert len(g.inputs) == 1  # the ids only
    ops = {n.op for n in g.nodes} | {m.op for n in g.nodes if n.op == "GraphKernel"
                                     for m in n.subgraph.nodes}
    assert "Transpose" not in ops  # fc weights: folded into MatMul's flag or the constant


def test_frozen_graph_compiles_again_when_a_weight_is_written():
    m = Net().eval()
    ids = _ids(2, 5)
    c = torch.compile(m, backend="graphkernel")
    with torch.no_grad():
        c(ids)
        m.fc2.bias.add_(1.0)  # an optimizer step would do this
        torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
        c(ids)
    assert gt.stats()["refreezes"] == 1


def test_freeze_false_keeps_parameters_as_inputs():
    m = Net().eval()
    c = torch.compile(m, backend="graphkernel", options={"freeze": False})
    with torch.no_grad():
        c(_ids(2, 5))
    assert gt.stats()["per_graph"][0]["frozen"] == 0
    with pytest.raises(Exception, match="freeze='yes'"):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(m, backend="graphkernel", options={"freeze": "yes"})(_ids(2, 5))


def _grads(model, fn, ids):
    model.zero_grad(set_to_none=True)
    fn(ids).pow(2).mean().backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def test_training_graph_returns_the_gradients_eager_does():
    m = Net()
    ids = _ids(3, 6)
    want = _grads(m, m, ids)
    got = _grads(m, torch.compile(m, backend="graphkernel"), ids)
    assert got.keys() == want.keys() and got["unused"] is None and want["unused"] is None
    for k in want:
        if want[k] is not None:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6, msg=k)
    roles = [s["role"] for s in gt.stats()["per_graph"]]
    assert roles == ["forward", "backward"]
    assert gt.stats()["per_graph"][0]["frozen"] == 0  # parameters stay inputs with grad on
    assert gt.stats()["fallbacks"] == {}  # embedding's backward is mapped too


class ConvNet(torch.nn.Module):
    """Convolutions whose backward is a convolution_backward (strided, padded, grouped,
    dilated, depthwise, 1-D with weight normalisation) and a gather along a later axis,
    whose backward is an index_put there."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.grouped = torch.nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=2, bias=False)
        self.depthwise = torch.nn.Conv2d(6, 6, 7, padding=3, groups=6)
        self.seq = torch.nn.utils.parametrizations.weight_norm(
            torch.nn.Conv1d(6, 6, 4, padding=2, groups=3), dim=2)
        self.register_buffer("pick", torch.tensor([3, 0, 2]))

    def forward(self, x):
        h = self.depthwise(self.grouped(self.stem(x)))
        h = h[:, :, self.pick]  # [N, C, 3, W]
        return self.seq(h.flatten(2))


def test_convolution_and_weight_norm_gradients_are_mapped_and_match_eager():
    m = ConvNet()
    x = torch.randn(2, 4, 9, 8, generator=R)
    want = _grads(m, m, x)
    got = _grads(m, torch.compile(m, backend="graphkernel"), x)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    assert gt.stats()["fallbacks"] == {}  # no ATen op left to torch in either graph


def test_one_summary_line_per_graph_and_graph_breaks_counted(caplog):
    m = Net().eval()

    def broken(ids):
        y = m(ids)
        print("graph break")  # noqa: T201 - forces Dynamo to split the graph
        return y.sum(-1)

    with caplog.at_level(logging.INFO, logger="graphkernel.torch"), torch.no_grad():
        torch.compile(broken, backend="graphkernel")(_ids(2, 4))
    lines = [r.getMessage() for r in caplog.records if r.name == "graphkernel.torch"]
    assert len(lines) == 2 and all("launches (vector" in x and "ATen fallbacks: none" in x
                                   for x in lines)
    s = gt.stats()
    assert s["graphs"] == 2 and s["graph_breaks"] >= 1 and s["recompiles"] == 0
    assert sum(s["launches"].values()) == sum(sum(g["launches"].values())
                                              for g in s["per_graph"])


def test_logging_is_switched_on_by_the_environment():
    assert gt.configure_logging({}) is None
    assert gt.configure_logging({"GRAPHKERNEL_LOG": "info"}) == logging.INFO
    assert gt.configure_logging({"TORCH_LOGS": "dynamo,+graphkernel"}) == logging.DEBUG
    assert gt.configure_logging({"TORCH_LOGS": "-graphkernel"}) == logging.ERROR
    with pytest.raises(ExecutionError, match="GRAPHKERNEL_LOG='loud' is not a level"):
        gt.configure_logging({"GRAPHKERNEL_LOG": "loud"})
    logging.getLogger("graphkernel.torch").setLevel(logging.NOTSET)


def test_every_graph_dumps_to_its_own_folder_with_an_index(tmp_path):
    m = Net().eval()

    def broken(ids):
        y = m(ids)
        print("graph break")  # noqa: T201
        return m(ids + 1) + y

    opts = {"flags": f"--opt_level=1 --dump_as_text --debug_dir={tmp_path}"}
    with torch.no_grad():
        torch.compile(broken, backend="graphkernel", options=opts)(_ids(2, 4) % 19)
    index = json.loads((tmp_path / "index.json").read_text())["graphs"]
    assert len(index) == 2 and len({e["dir"] for e in index}) == 2
    for e in index:
        assert (tmp_path / e["dir"] / "report.json").exists()
        assert (tmp_path / e["dir"] / "graph.txt").exists()
    assert not (tmp_path / "report.json").exists()  # nothing overwritten at the top


def test_static_shapes_recompile_and_the_count_says_so():
    c = torch.compile(torch.nn.Linear(4, 3), backend="graphkernel")
    with torch.no_grad():
        for n in (4, 6):
            c(torch.rand(n, 4))
    s = gt.stats()
    assert s["graphs"] == 2 and s["recompiles"] == 1


class Attention(torch.nn.Module):
    """Causal single-head self-attention whose positions and mask are built from the sequence
    length (symbolic arange bounds, SymInt arguments)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.pos = torch.nn.Embedding(32, 16)

    def forward(self, ids):
        n = ids.shape[1]
        h = self.emb(ids) + self.pos(torch.arange(n))
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        att = (h @ h.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
        return (att.softmax(-1) @ h).cumsum(1)


def test_dynamic_shapes_serve_three_sequence_lengths_with_one_compile(monkeypatch):
    graphs = _compiled_graphs(monkeypatch)
    m = Attention().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for b, n in ((2, 5), (2, 9), (3, 17)):
            ids = _ids(b, n)
            torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    (g,) = graphs
    assert all(isinstance(d, str) for d in g.inputs[0].type.shape)  # batch and sequence


class AudioFrontEnd(torch.nn.Module):
    """Wav2Vec2's shape story in small: strided 1-D convolutions make the length
    (L - 10)//5 + 1 and then (.. - 3)//2 + 1, a padded convolution makes it one longer and a
    slice removes the extra frame."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(1, 8, 10, stride=5)
        self.c2 = torch.nn.Conv1d(8, 8, 3, stride=2)
        self.pos = torch.nn.Conv1d(8, 8, 4, padding=2, groups=2)
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.c2(torch.nn.functional.gelu(self.c1(x[:, None]))))
        h = h + torch.nn.functional.gelu(self.pos(h)[:, :, :-1])
        return self.proj(h.transpose(1, 2))


def _serves_three_sizes(m, make, sizes, tol: float) -> dict:
    """Compile ``m`` with dynamic=True, check it against eager on ``make(n)`` for each size,
    and return graphkernel.torch's statistics."""
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in sizes:
            x = make(n)
            torch.testing.assert_close(c(x), m(x), rtol=tol, atol=tol)
    return gt.stats()


def test_a_convolution_length_stays_symbolic(monkeypatch):
    """An audio length through strided and padded 1-D convolutions is a derived symbol
    (graphkernel/symbolic.py): one compile serves three lengths, and no kernel falls back."""
    graphs = _compiled_graphs(monkeypatch)
    s = _serves_three_sizes(AudioFrontEnd().eval(), lambda n: torch.rand(2, n, generator=R),
                            (400, 480, 560), 1e-5)
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert all(g["codegen_fallbacks"] == 0 for g in s["per_graph"])
    (g,) = graphs
    length = g.inputs[0].type.shape[1]
    assert isinstance(length, str)
    frames = symbolic.floor_affine(symbolic.floor_affine(length, -10 + 5, 5), -3 + 2, 2)
    assert frames in {d for v in g.outputs for d in v.type.shape}, g.outputs[0].type


class PaddedChunks(torch.nn.Module):
    """As a Mamba-2 layer: a causal depthwise convolution over the length, the length padded
    to a multiple of a chunk (8), a sum within each chunk, the padding cut off only when
    there is some (a Python branch on the size: Dynamo guards it), viewed back as ``L``."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 4, groups=4, padding=3)

    def forward(self, x):  # x [B, L, 4]
        b, n = x.shape[0], x.shape[1]
        h = torch.nn.functional.silu(self.conv(x.transpose(1, 2))[..., :n]).transpose(1, 2)
        pad = (8 - n % 8) % 8
        h = torch.nn.functional.pad(h, (0, 0, 0, pad))
        y = h.reshape(b, -1, 8, 4).cumsum(2).reshape(b, -1, 4)
        if pad > 0:
            y = y[:, :n]
        return y.reshape(b, n, -1) * 2


def test_a_length_guarded_to_a_multiple_stays_symbolic(monkeypatch, caplog):
    """Lengths that are multiples of the chunk: Dynamo guards that the padding is 0, under
    which the padded length is the length; graphkernel writes the length as 8 times a symbol
    (no guard of its own), so one compile serves three lengths, the convolution's ``L + 3``
    included (a scaled derived symbol)."""
    graphs = _compiled_graphs(monkeypatch)
    with caplog.at_level(logging.INFO, logger="graphkernel"):
        s = _serves_three_sizes(PaddedChunks().eval(),
                                lambda n: torch.rand(2, n, 4, generator=R), (16, 24, 40), 1e-5)
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    (g,) = graphs
    length = g.inputs[0].type.shape[1]
    assert isinstance(length, str) and length.startswith("8*")
    assert "specialised" not in caplog.text
    assert "under Dynamo's guards" in caplog.text


class CausalConvMixer(torch.nn.Module):
    """As a Mamba layer's convolution: the input projection's ``[B, L, C]`` rows, a causal
    depthwise 1-D convolution (``padding=k-1`` sliced back to ``L``), SiLU, the output
    projection."""

    def __init__(self, c: int = 16, k: int = 4):
        super().__init__()
        self.inp = torch.nn.Linear(8, c)
        self.conv = torch.nn.Conv1d(c, c, k, groups=c, padding=k - 1)
        self.out = torch.nn.Linear(c, 8)

    def forward(self, x):  # x [B, L, 8]
        h = self.inp(x).transpose(1, 2)
        h = torch.nn.functional.silu(self.conv(h)[..., :x.shape[1]])
        return self.out(h.transpose(1, 2))


def test_a_causal_depthwise_convolution_over_a_symbolic_length_is_a_window_kernel(
        monkeypatch):
    """``conv(x)[..., :L]`` of a symbolic L is the convolution padded on the left only (the
    frontend's Gather of the rows 0..L-1 folded into its padding), and that convolution with
    its SiLU is one window kernel in bands of the length: one compile serves three lengths,
    no op of the convolution is left outside a kernel, outputs match."""
    graphs = _compiled_graphs(monkeypatch)
    s = _serves_three_sizes(CausalConvMixer().eval(),  # (lengths other than the 8 features:
                            lambda n: torch.rand(2, n, 8, generator=R),  # Dynamo would
                            (12, 24, 40), 1e-5)  # specialise an 8 as equal to them)
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert all(g["codegen_fallbacks"] == 0 for g in s["per_graph"])
    (g,) = graphs
    assert not {"Conv2D", "Gather", "Range"} & {n.op for n in g.nodes}
    (win,) = [n for n in g.nodes if n.op == "GraphKernel"
              and n.attrs["pattern"] == "window_fusion"]
    ops = {m.op for m in win.subgraph.nodes}
    assert "Conv2D" in ops and "Exp" in ops  # (the SiLU, expanded)
    assert any(isinstance(d, str) for v in win.inputs for d in v.type.shape)


class TableTail(torch.nn.Module):
    """A bias table of ``L`` positions sliced to the sequence's last ones, as MPT slices its
    alibi table: ``table[..., max(0, L - s):]``; ``stop`` ends the slice early (a slice
    graphkernel does not take from a symbolic start)."""

    def __init__(self, stop: int | None = None):
        super().__init__()
        self.table = torch.nn.Parameter(torch.rand(4, 1, 32, generator=R))
        self.stop = stop

    def forward(self, x):  # x [B, S]
        tail = self.table[:, :, max(0, 32 - x.shape[1]):self.stop]
        x = x if self.stop is None else x[:, 1:]  # (as long as the shortened tail)
        return torch.sigmoid(x[:, None, None, :] + tail)


def test_a_table_sliced_to_the_sequence_stays_symbolic():
    """``max(0, L - s)`` is settled by a guard on the branch the sizes take (s <= L, as
    Dynamo guards a Python branch), and ``table[..., L - s:]`` is the table's last s rows:
    one compile serves three lengths, nothing runs through torch."""
    s = _serves_three_sizes(TableTail().eval(), lambda n: torch.rand(2, n, generator=R),
                            (8, 16, 24), 1e-6)
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert len(s["per_graph"][0]["symbols"]) == 2  # the batch and the length


def test_a_table_slice_that_ends_early_specialises_the_length():
    """A start counted back from the end with an early stop is not the table's last rows:
    graphkernel cannot keep that length symbolic, so it is specialised (Dynamo compiles once
    per length, as for a convolution's sizes), and every graph is compiled, not run through
    torch; outputs match."""
    s = _serves_three_sizes(TableTail(stop=31).eval(),
                            lambda n: torch.rand(2, n, generator=R), (8, 16, 24), 1e-6)
    assert s["graphs"] == 3 and s["fallbacks"] == {} and s["graphs_through_torch"] == {}


class ConvRepeat(torch.nn.Module):
    """A strided convolution (its output side is (side - 4)//2 + 1: not a product of
    symbols) and a repeat by the batch size (BLOOM repeats its alibi slopes so)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 4, stride=2)
        self.bias = torch.nn.Parameter(torch.rand(2, 1, 1, generator=R))

    def forward(self, x):
        y = self.conv(x).flatten(2)                                  # [B, 4, L]
        r = self.bias.repeat(x.shape[0], 2, 1).reshape(x.shape[0], 4, 1)
        return y * r


def test_dynamic_shapes_specialise_only_what_graphkernel_cannot_keep(monkeypatch):
    """The image side is specialised (with a guard: a new side compiles again), the batch
    stays symbolic and serves three batch sizes with one compile."""
    graphs = _compiled_graphs(monkeypatch)
    m = ConvRepeat().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for b in (2, 3, 4):
            x = torch.rand(b, 3, 12, 12, generator=R)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
        s = gt.stats()
        assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
        (g,) = graphs
        assert isinstance(g.inputs[0].type.shape[0], str)  # batch
        assert g.inputs[0].type.shape[2:] == (12, 12)       # the side, specialised
        x = torch.rand(2, 3, 16, 16, generator=R)
        torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert gt.stats()["graphs"] == 2


class PatchRows(torch.nn.Module):
    """A patchify convolution whose rows are flattened and viewed back by a height computed
    from the flattened length (``(h*w)//w``): a size that divides by a symbol."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 4, stride=4)

    def forward(self, x):
        y = self.conv(x)
        w = y.shape[3]
        z = y.flatten(2)                                             # [B, 4, h*w]
        return z.view(x.shape[0], 4, z.shape[2] // w, w) * 2


def test_dynamic_shapes_take_a_size_divided_by_a_symbol(monkeypatch):
    """A view whose size divides by the image side's symbol compiles (the side specialised,
    the batch symbolic) instead of the whole graph running through torch."""
    graphs = _compiled_graphs(monkeypatch)
    m = PatchRows().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for b in (2, 3, 4):
            x = torch.rand(b, 3, 16, 16, generator=R)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert s["launches"]["opaque"] == 0
    (g,) = graphs
    assert isinstance(g.inputs[0].type.shape[0], str)


class PadToChunks(torch.nn.Module):
    """A sequence padded to a multiple of a chunk and split into chunks, as a chunked scan
    does (Mamba2): the pad amount ``(chunk - L % chunk) % chunk`` and the chunk count are
    floor divisions and remainders of the length."""

    def __init__(self, chunk: int = 8, before: bool = False):
        super().__init__()
        self.chunk, self.before = chunk, before
        self.lin = torch.nn.Linear(12, 12)

    def forward(self, x):
        n = x.shape[1]
        pad = (self.chunk - n % self.chunk) % self.chunk
        y = F.pad(self.lin(x), (0, 0, pad, 0) if self.before else (0, 0, 0, pad))
        y = y.reshape(x.shape[0], -1, self.chunk, x.shape[2])
        return torch.cumsum(y.exp(), dim=2).sum(2) * 2


def test_dynamic_shapes_pad_to_a_multiple_of_a_chunk_with_one_compile(monkeypatch):
    """The padded length (``8*ceil(L/8)``) and the chunk count stay symbolic: one compile
    serves lengths that pad by 0, 5 and 3 rows, and the padding is zeros."""
    graphs = _compiled_graphs(monkeypatch)
    m = PadToChunks().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (16, 19, 29):
            x = torch.rand(2, n, 12, generator=R)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert s["launches"]["opaque"] == 0
    (g,) = graphs
    length = g.inputs[0].type.shape[1]
    assert isinstance(length, str)
    (chunks,) = {d for n in g.nodes for v in n.outputs for d in v.type.shape
                 if isinstance(d, str) and symbolic.derived(d)}
    assert [symbolic.evaluate(chunks, {length: n}) for n in (16, 19, 29)] == [2, 3, 4]


def test_dynamic_shapes_specialise_a_symbolic_pad_before_the_sequence():
    """A pad by a size expression before the axis is not taken: the length is specialised
    (one graph per length) and the outputs still match."""
    m = PadToChunks(before=True).eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (16, 19, 29):
            x = torch.rand(2, n, 12, generator=R)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 3 and s["fallbacks"] == {}


class HeadRowsAndTail(torch.nn.Module):
    """The first row of a symbolic-length axis (``x[:, :1]``: a chunked scan's initial
    state shaped from it) and the last ``L`` rows of an ``L``-long axis (``x[..., -L:]``)."""

    def forward(self, x):
        n = x.shape[1]
        y = (x * 2)[:, -n:]
        return torch.cat([y[:, :1] * 0.5, y], dim=1).exp()


def test_dynamic_shapes_take_the_first_rows_and_the_whole_tail_of_a_length():
    m = HeadRowsAndTail().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 14):
            x = torch.rand(2, n, 6, generator=R)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert s["launches"]["opaque"] == 0


def test_size_expressions_with_remainders_are_dims_for_every_length():
    """Floor divisions and remainders of one symbol by constants become a (derived) dim
    equal to the expression at every length; what no dim spells is refused (None)."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    from graphkernel.frontends.fx import _sym_dim

    s = sympy.Symbol("s3", integer=True, positive=True)
    padded = s + Mod(8 - Mod(s, 8), 8)
    taken = [padded, FloorDiv(padded, 8), FloorDiv(padded, 8) + 1, s + PythonMod(-s, 4),
             FloorDiv(padded, FloorDiv(padded, 8)), 6 * FloorDiv(s + 5, 6) + 6,
             FloorDiv(FloorDiv(s, 2) + 1, 3), 8 - Mod(s, 8) + s - 8, 3 * s + 2]
    for e in taken:
        d = _sym_dim(e)
        assert d is not None, e
        for n in range(1, 50):
            assert symbolic.evaluate(d, {"s3": n}) == int(e.subs(s, n)), (e, n)
    for e in (Mod(8 - Mod(s, 8), 8), FloorDiv(padded, 3), s * s,
              FloorDiv(padded, s)):
        assert _sym_dim(e) is None, e


def test_a_read_only_array_reaches_torch_as_a_writable_copy():
    import warnings

    import numpy as np

    from graphkernel.frontends.fx import to_torch

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    a.flags.writeable = False  # a graph constant
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a non-writable array it would share
        t = to_torch(a)
    t.add_(1)
    assert a[0, 0] == 0 and t[0, 0].item() == 1


class ScaledAttention(torch.nn.Module):
    """LLaMA's attention in small: two query heads sharing one K/V head (repeated by
    ``k[:, :, None, :, :].expand(...)``), the scale a float attribute, a causal mask built
    from the sequence length."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 32)
        self.qkv = torch.nn.Linear(32, 64)
        self.scaling = 16 ** -0.5

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).split([32, 16, 16], -1)
        q = q.view(b, n, 2, 16).transpose(1, 2)
        k, v = (t.view(b, n, 1, 16).transpose(1, 2)[:, :, None, :, :].expand(b, 1, 2, n, 16)
                .reshape(b, 2, n, 16) for t in (k, v))
        pos = torch.arange(n)
        mask = torch.where(pos[None, :] <= pos[:, None], 0.0, torch.finfo(torch.float32).min)
        att = (q @ k.transpose(-1, -2)) * self.scaling + mask
        return (att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, 32)


def _fused_attention(g) -> int:
    return sum(n.op == "FusedAttention" for n in g.nodes)


def _match_eager_at_three_lengths(c, m) -> None:
    with torch.no_grad():
        for n in (5, 9, 17):
            ids = _ids(2, n)
            torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)


def test_dynamic_shapes_keep_the_fused_attention(monkeypatch):
    """Dynamo passes the float attribute as a 0-d tensor and slices the symbolic axes whole:
    the scale is inlined (a constant, as with static shapes) and the whole slices dropped,
    so the attention pattern matches for every length; the causal mask, computed from int64
    positions, is the operator's causal mode, so no kernel falls back."""
    graphs = _compiled_graphs(monkeypatch)
    m = ScaledAttention().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    _match_eager_at_three_lengths(c, m)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0
    (g,) = graphs
    assert isinstance(g.inputs[0].type.shape[1], str)
    assert _fused_attention(g) == 1 and len(g.inputs) == 1  # the ids only: scale inlined
    (fa,) = [n for n in g.nodes if n.op == "FusedAttention"]
    assert fa.attrs.get("causal") and fa.attrs["mask"] == "none"
    assert s["per_graph"][0]["codegen_fallbacks"] == 0


class FourHeads(torch.nn.Module):
    """Token ids embedded, one Linear making Q, K and V of 4 heads of 16 ([B, N, S, D])."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 64)
        self.qkv = torch.nn.Linear(64, 192)

    def heads(self, ids):
        b, s = ids.shape
        return (t.view(b, s, 4, 16).transpose(1, 2)
                for t in self.qkv(self.emb(ids)).split(64, -1))


class AlibiRows(FourHeads):
    """MPT's attention in small: the ALiBi bias one row per head ([N, 1, L]), sliced to the
    last ``s`` keys -- under dynamic=True a computed value, not a constant."""

    def __init__(self):
        super().__init__()
        slopes = torch.tensor([2.0 ** -i for i in range(1, 5)]).view(4, 1, 1)
        self.register_buffer("alibi", slopes * torch.arange(1 - 32, 1).view(1, 1, 32).float())

    def forward(self, ids):
        b, s = ids.shape
        q, k, v = self.heads(ids)
        scores = q @ k.transpose(-1, -2) * 16 ** -0.5 + self.alibi[:, :, -s:]
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, 64)


def test_dynamic_shapes_keep_a_computed_alibi_row_in_the_fused_attention(monkeypatch):
    """A bias of one row per head computed under dynamic=True is the operator's pse,
    broadcast to [B, N, 1, S2] (S1 times fewer values than the scores): one fused attention
    for every length, where the whole attention ran as products and a softmax."""
    graphs = _compiled_graphs(monkeypatch)
    m = AlibiRows().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    _match_eager_at_three_lengths(c, m)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    (g,) = graphs
    assert isinstance(g.inputs[0].type.shape[1], str)
    (fa,) = [n for n in g.nodes if n.op == "FusedAttention"]
    assert fa.attrs["mask"] == "pse"


class SlicedCausalMask(FourHeads):
    """The causal mask as transformers builds it for sdpa: key and query positions taken
    whole (``[..., :]``) before they are compared, the mask broadcast over the batch."""

    def forward(self, ids):
        b, s = ids.shape
        q, k, v = self.heads(ids)
        pos = torch.arange(s)
        keys, queries = pos[None, None, None, :][..., :], pos[None, None, :, None][:, :, :]
        mask = (keys <= queries).expand(b, -1, -1, -1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return a.transpose(1, 2).reshape(b, s, 64)


def test_dynamic_shapes_see_a_causal_mask_through_whole_slices(monkeypatch):
    """Positions sliced whole under dynamic=True (a symbolic length: the slice is not
    dropped at import) are still positions: the mask is the operator's causal mode, no mask
    input computed and read."""
    graphs = _compiled_graphs(monkeypatch)
    m = SlicedCausalMask().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    _match_eager_at_three_lengths(c, m)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    (g,) = graphs
    (fa,) = [n for n in g.nodes if n.op == "FusedAttention"]
    assert fa.attrs.get("causal") and fa.attrs["mask"] == "none"


def test_an_inlined_float_attribute_compiles_again_when_it_changes(monkeypatch):
    graphs = _compiled_graphs(monkeypatch)
    m = ScaledAttention().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    ids = _ids(2, 6)
    with torch.no_grad():
        c(ids)
        c(ids)
        assert gt.stats()["refreezes"] == 0  # the same value: no compile
        m.scaling = 0.5
        torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
    assert gt.stats()["refreezes"] == 1 and len(graphs) == 2


class AlibiAttention(torch.nn.Module):
    """BLOOM's attention in small: an ALiBi bias computed from the positions ([B·N, 1, S],
    per head slope times key position), added by baddbmm with float alpha and beta."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 32)
        self.qkv = torch.nn.Linear(32, 96)
        self.register_buffer("slopes", torch.tensor([0.5, 0.25]))
        self.inv_norm_factor = 16 ** -0.5
        self.beta = 1.0

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, 2, 16).transpose(1, 2).reshape(b * 2, n, 16)
                   for t in self.qkv(self.emb(ids)).split(32, -1))
        alibi = (self.slopes[None, :, None] * torch.arange(n)[None, None, :])
        alibi = alibi.expand(b, 2, n).reshape(b * 2, 1, n)
        att = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=self.beta,
                            alpha=self.inv_norm_factor)
        return (att.softmax(-1) @ v).view(b, 2, n, 16).transpose(1, 2).reshape(b, n, 32)


def test_dynamic_shapes_take_a_computed_alibi_bias_as_pse(monkeypatch):
    graphs = _compiled_graphs(monkeypatch)
    m = AlibiAttention().eval()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    _match_eager_at_three_lengths(c, m)
    assert gt.stats()["graphs"] == 1
    (g,) = graphs
    (fa,) = [n for n in g.nodes if n.op == "FusedAttention"]
    assert fa.attrs["mask"] == "pse"
    b, n = g.inputs[0].type.shape
    assert tuple(fa.inputs[3].type.shape)[1:3] == (2, 1)  # [B, N, 1, S]



class NanBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("t", torch.tensor(float("nan")))  # 0-d: guarded by its value
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + self.t


def test_a_frozen_nan_scalar_does_not_compile_again_on_every_call(monkeypatch):
    """NaN never equals itself: keyed by value, the guard compiled on every call, and the
    compile's own guard again, until the recursion limit."""
    graphs = _compiled_graphs(monkeypatch)
    c = torch.compile(NanBuffer().eval(), backend="graphkernel")
    with torch.no_grad():
        for _ in range(3):
            assert torch.isnan(c(torch.randn(2, 4))).all()
    assert gt.stats()["refreezes"] == 0 and len(graphs) == 1


class TwoStreams(torch.nn.Module):
    """Dropout on one embedding twice, each feeding its own stack of layers with dropouts
    (an encoder-decoder fed the same ids): nothing but the program orders the draws."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.enc, self.dec = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, ids):
        x = self.emb(ids)
        h = F.dropout(x, 0.1)
        for _ in range(2):
            h = h + F.dropout(self.enc(self.ln(h)), 0.1)
        d = F.dropout(x, 0.1)
        for _ in range(2):
            d = d + F.dropout(self.dec(self.ln(d)), 0.1) + h
        return d


def test_random_ops_draw_in_program_order():
    """Ops that draw random numbers run through torch in the program's order whatever the
    pipeline does to the rest of the graph: each reads the previous one's output, so with
    the same seed a training step gives eager's output and gradients."""

    from graphkernel.frontends import fx

    _seeded_step_matches_eager(TwoStreams().train(), _ids(2, 8))
    from torch.fx.experimental.proxy_tensor import make_fx

    def draws(x):
        y = torch.ops.aten.native_dropout(x, 0.5, True)[0] * 2
        return torch.ops.aten.native_dropout(y, 0.5, True)[0] + torch.ops.aten.rand([3])

    gm = make_fx(draws, tracing_mode="fake")(torch.ones(3))
    seeded = [n for n in fx.import_fx(gm).nodes if n.op == "Opaque"]
    assert len(seeded) == 3
    for before, after in zip(seeded, seeded[1:]):
        assert after.inputs[-1] is before.outputs[0]  # an input the op's arguments do not name


def _seeded_step_matches_eager(m, x, **options):
    """A training step of ``m`` and of its compiled twin, each after ``manual_seed(0)``
    (compiled once before, so the step runs the compiled graphs only): the same output and
    gradients."""
    import copy

    twin = copy.deepcopy(m)
    c = torch.compile(twin, backend="graphkernel", **options)
    c(x)
    out = {}
    for side, (model, fn) in (("eager", (m, m)), ("compiled", (twin, c))):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        y = fn(x)
        y.pow(2).mean().backward()
        out[side] = (y, {k: p.grad for k, p in model.named_parameters()})
    torch.testing.assert_close(out["compiled"][0], out["eager"][0], rtol=1e-5, atol=1e-5)
    for k, g in out["eager"][1].items():
        torch.testing.assert_close(out["compiled"][1][k], g, rtol=1e-4, atol=1e-6, msg=k)


class TransposedDropout(torch.nn.Module):
    """Dropout on a projection computed time-major and transposed to batch-major (as
    ``F.multi_head_attention_forward`` returns it): the tensor the dropout takes is not
    row-major, and torch draws its mask in memory order."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):  # x [B, T, 16]
        h = self.proj(x.transpose(0, 1)).transpose(0, 1)  # [T, B, 16] in memory
        return self.ln(x + F.dropout(h, 0.5))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_random_op_draws_in_its_inputs_memory_order(dynamic):
    """An op drawing random numbers, run through torch, gets its input in the layout the
    program gave it (a transposed one here): its draws fall on the elements eager's do, so
    a training step matches eager's; fed a row-major copy, only the first and last elements
    would get eager's draws."""

    from torch.fx.experimental.proxy_tensor import make_fx

    from graphkernel.frontends import fx

    _seeded_step_matches_eager(TransposedDropout().train(), torch.randn(2, 6, 16),
                               dynamic=dynamic)

    def draws(a):  # the mask of dropout on a transposed tensor (and on a row-major one)
        return (torch.ops.aten.native_dropout(a.permute(1, 0, 2), 0.5, True)[1],
                torch.ops.aten.native_dropout(a, 0.5, True)[1])

    a = torch.ones(3, 4, 5)
    gm = make_fx(draws, tracing_mode="symbolic" if dynamic else "fake")(a)
    calls = [n.attrs["fn"] for n in fx.import_fx(gm).nodes if n.op == "Opaque"]
    assert [c.layouts for c in calls] == [[[1, 0, 2]], [None]]
    torch.manual_seed(0)
    want = draws(a)[0]
    torch.manual_seed(0)
    got = calls[0]([a.permute(1, 0, 2).contiguous().numpy()])[1]  # (row-major arrays)
    assert torch.equal(torch.from_numpy(got), want)


class RelativeBias(torch.nn.Module):
    """T5's bidirectional relative-position buckets (16 exact and log-spaced ones per side),
    a table of them per head added to the scores, as ``T5Attention`` computes them."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(32, 2)

    def forward(self, x):  # x [B, L, 8]
        n = x.shape[1]
        rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
        bucket = (rel > 0).to(torch.long) * 16
        rel = torch.abs(rel)
        large = 8 + (torch.log(rel.float() / 8) / math.log(128 / 8) * 8).to(torch.long)
        large = torch.min(large, torch.full_like(large, 15))
        bucket = bucket + torch.where(rel < 8, rel, large)
        bias = self.table(bucket).permute(2, 0, 1)  # [2, L, L]
        q = x.reshape(x.shape[0], n, 2, 4).transpose(1, 2)
        return torch.softmax(q @ q.transpose(-1, -2) + bias, dim=-1)


def test_relative_positions_over_a_symbolic_length_are_one_float32_kernel(monkeypatch):
    """Under dynamic=True T5's positions are ``arange(L)`` of a symbolic L, int64; the [L, L]
    values bound L by 2**20, so the outer difference, its sign and its absolute value run in
    float32 (small_ints), in one kernel that loads the positions twice (a row and a column
    of the loop space): no int64 Sub or Abs is left a launch of its own; outputs match at
    three lengths with one compile."""
    graphs = _compiled_graphs(monkeypatch)
    s = _serves_three_sizes(RelativeBias().eval(), lambda n: torch.rand(2, n, 8, generator=R),
                            (12, 24, 40), 1e-5)
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}
    assert all(g["codegen_fallbacks"] == 0 for g in s["per_graph"])
    (g,) = graphs
    assert not [n for n in g.nodes if n.op in ("Sub", "Abs")], [n.op for n in g.nodes]
    (r,) = [n for n in g.nodes if n.op == "Range"]
    assert r.outputs[0].dtype.value == "float32"
    (k,) = [n for n in g.nodes if n.op == "GraphKernel"
            and {"Sub", "Abs"} <= {m.op for m in n.subgraph.nodes}]
    assert len(k.inputs) == 2 and k.inputs[0] is k.inputs[1] is r.outputs[0]


class BreakingRouter(torch.nn.Module):
    """A router whose forward breaks the graph (a data-dependent ``.tolist()``, as a mixture
    of experts' token counts): Dynamo compiles the part before the break once for every
    module of the class, each layer calling it with its own weight."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(16, 4, bias=False)

    def forward(self, x):
        p = self.gate(x).softmax(-1)
        torch._dynamo.graph_break()
        return x * p.amax(-1, keepdim=True)


class RoutedLayers(torch.nn.Module):
    def __init__(self, n: int = 3):
        super().__init__()
        self.routers = torch.nn.ModuleList(BreakingRouter() for _ in range(n))

    def forward(self, x):
        for r in self.routers:
            x = r(x)
        return x


def test_a_frozen_graph_several_modules_call_is_compiled_once_more_with_inputs(monkeypatch):
    """Each router inlined its own weight in turn: every call compiled the graph again, once
    per layer. Other tensors in the frozen places compile it once with them as inputs; that
    version serves every layer, and the frozen one it replaces is retired (its launches
    counted apart)."""
    graphs = _compiled_graphs(monkeypatch)
    m = RoutedLayers().eval()
    x = torch.randn(5, 16, generator=R)
    c = torch.compile(m, backend="graphkernel")
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
        n = len(graphs)
        for _ in range(2):
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
        assert len(graphs) == n  # nothing compiled on later calls (was: once per layer)
    s = gt.stats()
    assert s["shared"] == 1 and s["refreezes"] == 0
    per = s["per_graph"]
    gate = [g for g in per if g["frozen"] or g["retired"]]
    assert [(g["frozen"], g["retired"]) for g in gate] == [(1, True)]
    shared = per[per.index(gate[0]) + 1]
    assert shared["frozen"] == 0 and not shared["retired"]
    live = sum(sum(g["launches"].values()) for g in per if not g["retired"])
    assert sum(s["launches"].values()) == live
    assert sum(s["retired_launches"].values()) == sum(gate[0]["launches"].values()) > 0


def test_a_written_frozen_weight_retires_the_version_it_replaces():
    m = Net().eval()
    ids = _ids(2, 5)
    c = torch.compile(m, backend="graphkernel")
    with torch.no_grad():
        c(ids)
        one = dict(gt.stats()["launches"])
        m.fc2.bias.add_(1.0)
        torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
    s = gt.stats()
    assert s["refreezes"] == 1 and s["shared"] == 0 and s["graphs"] == 2
    assert s["launches"] == one == s["retired_launches"]


class PaddingMask(torch.nn.Module):
    """As transformers' padding mask under dynamic=True: the (batch, keys) mask indexed by
    ``arange(batch)[:, None, None, None]`` and ``arange(keys)[None, None, None, :]`` (both
    symbolic axes), broadcast against the scores."""

    def forward(self, scores, mask):
        b, s = mask.shape
        rows, keys = torch.arange(b), torch.arange(s)
        keep = mask.bool()[rows[:, None, None, None], keys[None, None, None, :]]
        return scores.masked_fill(~keep, -1e9).softmax(-1)


def test_several_index_tensors_into_symbolic_axes_read_the_mask_itself(monkeypatch):
    """x[arange(B)[:, None, None, None], arange(S)[None, None, None, :]] with B and S
    symbolic: each index tensor varies along one axis of their broadcast shape, in order,
    and covers its whole axis, so the result is x viewed as (B, 1, 1, S): no Opaque, no
    Gather, one compile for three lengths."""
    graphs = _compiled_graphs(monkeypatch)
    m = PaddingMask()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (6, 10, 14):
            scores = torch.rand(2, 2, n, n, generator=R)
            mask = (torch.rand(2, n, generator=R) > 0.3).long()
            torch.testing.assert_close(c(scores, mask), m(scores, mask), rtol=1e-5, atol=1e-6)
    s = gt.stats()
    assert s["graphs"] == 1 and s["recompiles"] == 0 and s["fallbacks"] == {}, s["fallbacks"]
    (g,) = graphs
    assert isinstance(g.inputs[1].type.shape[1], str)
    ops = {n.op for n in g.nodes} | {b.op for n in g.nodes if n.op == "GraphKernel"
                                     for b in n.subgraph.nodes}
    assert not ops & {"Opaque", "Gather", "GatherElements"}, ops


class OuterRows(torch.nn.Module):
    """``x[i[:, None, None], j[None, None, :]]``: rows i and columns j of x, an axis of 1
    between (an outer index of more axes than it indexes, both indexed axes symbolic, the
    index tensors inputs of symbolic lengths)."""

    def forward(self, x, i, j):
        return x[i[:, None, None], j[None, None, :]] * 2.0


def test_several_index_tensors_into_symbolic_axes_gather_each_axis_in_turn(monkeypatch):
    """Index tensors read from the inputs (negative ones too): a Gather along each indexed
    axis by its own tensor, then a view; matches eager at three sizes with one compile and
    no Opaque."""
    graphs = _compiled_graphs(monkeypatch)
    m = OuterRows()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (5, 7, 9):
            x = torch.rand(n, n + 1, 2, generator=R)
            i = torch.randint(-n, n, (n - 1,), generator=R)
            j = torch.randint(0, n + 1, (n - 2,), generator=R)
            torch.testing.assert_close(c(x, i, j), m(x, i, j))
    s = gt.stats()
    assert s["graphs"] == 1 and s["fallbacks"] == {}, s["fallbacks"]
    (g,) = graphs
    gathers = [n for n in g.nodes if n.op == "Gather"] + [
        b for n in g.nodes if n.op == "GraphKernel" for b in n.subgraph.nodes
        if b.op == "Gather"]
    assert sorted(n.attrs["axis"] for n in gathers) == [0, 1]
    assert not any(n.op == "Opaque" for n in g.nodes)


class PointIndex(torch.nn.Module):
    def forward(self, x, i, j):
        return x[i, j]  # i, j: (P, Q), each varying along both axes


def test_several_index_tensors_into_symbolic_axes_varying_together_are_refused():
    """Index tensors that vary along the same axes of their broadcast shape pick single
    elements (no Gather per axis reads them), and the merged axis' linear index would need
    the symbolic strides as values: refused with the reason, run by torch, still exact."""
    m = PointIndex()
    c = torch.compile(m, backend="graphkernel", dynamic=True)
    with torch.no_grad():
        for n in (5, 7, 9):
            x = torch.rand(n, n + 1, generator=R)
            i = torch.randint(0, n, (2, n), generator=R)
            j = torch.randint(0, n + 1, (2, n), generator=R)
            torch.testing.assert_close(c(x, i, j), m(x, i, j))
    why = gt.stats()["fallbacks"]["aten.index.Tensor"]
    assert "varying along more than one axis" in why, why
