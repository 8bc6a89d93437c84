"""Mechanisms the transformer families need through torch.compile, each on a small module
written as the families write it: a KV cache growing along a symbolic axis under
``dynamic=True`` (keys and values as separate inputs, one attention over the grown cache)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]  # torch.compile of modules


class CachedAttention(torch.nn.Module):
    """One decoding step: the new token's key and value appended to the caches, the query
    attending to every cached position; the grown caches returned for the next step."""

    def forward(self, q, k_cache, v_cache, k, v):
        keys, values = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
        return F.scaled_dot_product_attention(q, keys, values) * 2, keys, values


def test_a_kv_cache_step_serves_three_cache_lengths_with_one_compile_as_one_attention():
    """Dynamo gives the key and value caches their own length symbols; the cache grows by
    s + 1 and attention reads both as one length (its head size and head count, symbolic
    too, are specialised): one graph for three lengths, no op left to torch, one fused
    attention, outputs equal to eager's."""
    model = CachedAttention()
    compiled = torch.compile(model, backend="graphkernel", dynamic=True)
    g = torch.Generator().manual_seed(0)
    for length in (5, 7, 9):  # (4 would share the heads' symbol: Dynamo's duck sizing)
        q, k, v = (torch.randn(2, 4, 1, 16, generator=g) for _ in range(3))
        k_cache, v_cache = (torch.randn(2, 4, length, 16, generator=g) for _ in range(2))
        want = model(q, k_cache, v_cache, k, v)
        got = compiled(q, k_cache, v_cache, k, v)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["fallbacks"] == {}, s["fallbacks"]
    assert s["launches"]["extern"] == 1 and s["launches"]["opaque"] == 0, s["launches"]


class FusedProjection(torch.nn.Module):
    """GPT-NeoX's attention: one projection seen as [B, S, N, 3D], each head's row cut into
    its q, k and v columns, rotary on q and k (``rotate_half``), causal attention."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(32, 3 * 32), torch.nn.Linear(32, 32)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 4, 24).permute(0, 2, 1, 3).chunk(3, dim=-1)

        def rotary(y):
            y1, y2 = y.chunk(2, -1)
            return y * cos + torch.cat((-y2, y1), -1) * sin

        a = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, 32))


def test_a_fused_projection_cut_per_head_is_read_as_columns_not_copied_apart():
    """The q, k and v columns of each head are views the rotary kernels read (no Split
    launch copying every part out): 5 vector launches, against 9 with the cut as a Split."""
    torch.manual_seed(0)
    model = FusedProjection()
    args = (torch.randn(2, 6, 32), torch.randn(6, 8), torch.randn(6, 8))
    with torch.no_grad():
        want = model(*args)
        got = torch.compile(model, backend="graphkernel")(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
    assert s["launches"]["vector"] <= 5, s["launches"]
    assert "Split" not in gt.export_graph(model, args).op_histogram()


class PositionsFromMask(torch.nn.Module):
    """RoBERTa's embeddings: position ids counted from the tokens that are not padding
    (``cumsum`` of the mask, int64 as torch traces it), token types gathered from a buffer of
    zeros by those positions, three embeddings summed and normalised."""

    def __init__(self, pad: int = 1):
        super().__init__()
        self.pad = pad
        self.words, self.positions = torch.nn.Embedding(30, 16), torch.nn.Embedding(40, 16)
        self.types, self.norm = torch.nn.Embedding(2, 16), torch.nn.LayerNorm(16)
        self.register_buffer("type_ids", torch.zeros(1, 40, dtype=torch.long))

    def forward(self, ids):
        mask = ids.ne(self.pad).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + self.pad
        types = torch.gather(self.type_ids[:, :ids.shape[1]].expand(ids.shape[0], -1), 1,
                             positions)
        return self.norm(self.words(ids) + self.positions(positions) + self.types(types))


def test_position_ids_from_a_mask_are_one_kernel_and_token_types_a_constant():
    """Without the float32 region the eight integer ops are eight launches and the token
    types two more (a gather of zeros, then of the table); with it, the mask, one kernel
    counting the positions and storing their int32 ids, and the norm's kernel loading the
    token and position rows by id: 6 fewer than 9; the mask's comparison of the int64 ids
    with the pad id made in float32 (exact for any int64) joins the counting kernel: 7
    fewer."""
    torch.manual_seed(0)
    model = PositionsFromMask().eval()
    ids = torch.randint(2, 30, (2, 12))
    ids[:, -3:] = 1
    ids[1, 4] = 1
    want = model(ids)
    with torch.no_grad():
        got = torch.compile(model, backend="graphkernel")(ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    launches = gt.stats()["launches"]
    assert gt.stats()["fallbacks"] == {} and launches["opaque"] == 0, gt.stats()
    torch._dynamo.reset()
    gt.reset_stats()
    with torch.no_grad():
        torch.compile(model, backend="graphkernel",
                      options={"flags": "--disable_pass=small_ints"})(ids)
    integers = gt.stats()["launches"]
    assert sum(launches.values()) == sum(integers.values()) - 7, (launches, integers)
    assert sum(launches.values()) == 2, launches


def rotate_every_two(x):
    """GPT-J's rotation of each pair of adjacent features."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class InterleavedRotary(torch.nn.Module):
    """GPT-J's attention: Q, K and V projections split into heads [B, S, N, D], the first
    ``rot`` features of each head of Q and K rotated pair by pair (cos/sin repeated
    interleaved), the rest passed through, causal attention; optionally K returned too (the
    KV cache a decoder keeps)."""

    def __init__(self, rot: int = 8, bias: bool = False, keep_k: bool = False):
        super().__init__()
        self.rot, self.keep_k = rot, keep_k
        self.q, self.k, self.v = (torch.nn.Linear(32, 32, bias=bias) for _ in range(3))
        self.o = torch.nn.Linear(32, 32)
        inv = 1.0 / 10000 ** (torch.arange(0, rot, 2).float() / rot)
        angles = torch.arange(16).float()[:, None] * inv[None, :]
        self.register_buffer("sin", angles.sin().repeat_interleave(2, -1)[None, :, None])
        self.register_buffer("cos", angles.cos().repeat_interleave(2, -1)[None, :, None])

    def forward(self, x):
        b, t, _ = x.shape

        def heads(p):
            return p(x).view(b, t, 4, 8)

        def rotary(y):
            r, rest = y[..., :self.rot], y[..., self.rot:]
            cos, sin = self.tables(t)
            return torch.cat([r * cos + rotate_every_two(r) * sin, rest], -1)

        q, k = rotary(heads(self.q)), rotary(heads(self.k))
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           heads(self.v).transpose(1, 2), is_causal=True)
        out = self.o(a.transpose(1, 2).reshape(b, t, 32))
        return (out, k) if self.keep_k else out

    def tables(self, t: int):
        return self.cos[:, :t], self.sin[:, :t]


def _compiled(model, args, flags: str = ""):
    """``model(*args)`` through graphkernel with nothing run by torch, and its launches."""
    torch._dynamo.reset()
    gt.reset_stats()
    with torch.no_grad():
        got = torch.compile(model, backend="graphkernel", options={"flags": flags})(*args)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
    return got, s["launches"]


def _launches(model, args, flags: str = ""):
    got, launches = _compiled(model, args, flags)
    return got, sum(launches.values())


def _against_strided_rotaries(model):
    """``model`` (seeded before it is built) on one input: graphkernel's outputs, eager's,
    and the launches with ``rotary_pairs`` on and off."""
    model.eval()
    args = (torch.randn(2, 12, 32),)
    with torch.no_grad():
        want = model(*args)
    got, launches = _launches(model, args)
    _, strided = _launches(model, args, "--disable_pass=rotary_pairs")
    return got, want, launches, strided


@pytest.mark.parametrize("rot,bias,saved", [(4, False, 8), (8, True, 4)])
def test_interleaved_rotary_on_q_and_k_is_one_kernel_each(rot, bias, saved):
    """Q's and K's features permuted alike (evens, then odds, in the projection weights)
    make the pairs two halves: one rotary kernel per operand, as for split-half rotary,
    where the strided pairs were five launches each (three when every feature rotates)."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(InterleavedRotary(rot, bias))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert launches == strided - saved, (launches, strided)


@pytest.mark.parametrize("rot", [4, 8])
def test_interleaved_rotary_of_an_onnx_export_is_one_kernel_each(tmp_path, rot):
    """The same attention exported to ONNX: projections by [in, out] weights, Kᵀ an explicit
    transpose and the scale applied to Q and to Kᵀ. Q's and K's features are permuted alike
    all the same: no pair slices of step 2 are left, and fewer kernels run."""
    pytest.importorskip("onnx")
    import graphkernel
    from graphkernel.frontends import load_model
    from graphkernel.interpreter import run_graph

    torch.manual_seed(0)
    model = InterleavedRotary(rot).eval()
    x = torch.randn(2, 16, 32)
    path = str(tmp_path / "gptj_attention.onnx")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
    g = load_model(path)
    on = graphkernel.compile(g, "--opt_level=2", env={})
    off = graphkernel.compile(g, "--opt_level=2 --disable_pass=rotary_pairs", env={})
    (got,) = run_graph(on.graph, [x.numpy()])
    with torch.no_grad():
        want = model(x).numpy()
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), rtol=1e-4,
                               atol=1e-5)

    def pair_slices(res):
        return sum(1 for k in res.graph.nodes if k.op == "GraphKernel" for m in k.subgraph.nodes
                   if m.op == "StridedSlice" and (m.attrs.get("strides") or [1])[0] == 2)

    assert pair_slices(on) == 0 < pair_slices(off)
    assert on.report.extra["kernels_fused"] < off.report.extra["kernels_fused"]


def test_interleaved_rotary_of_a_k_that_is_returned_is_left_alone():
    """A K the graph returns (a KV cache) must keep its features in place: no rewrite."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(InterleavedRotary(keep_k=True))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert launches == strided


class PositionRotary(InterleavedRotary):
    """GPT-J's attention with its cos/sin tables computed from the positions in the forward
    (``repeat_interleave(2)`` of the half tables): under ``dynamic=True`` the positions are a
    symbolic range, so the tables are computed values, not constants."""

    def __init__(self, rot: int = 8):
        super().__init__(rot)
        self.register_buffer("inv", 1.0 / 10000 ** (torch.arange(0, rot, 2).float() / rot))

    def tables(self, t):
        angles = torch.arange(t, dtype=torch.float32)[:, None] * self.inv[None, :]
        return (angles.cos().repeat_interleave(2, -1)[None, :, None],
                angles.sin().repeat_interleave(2, -1)[None, :, None])


def _dynamic_launches(model, lengths, flags: str = "") -> int:
    torch._dynamo.reset()
    gt.reset_stats()
    c = torch.compile(model, backend="graphkernel", dynamic=True, options={"flags": flags})
    with torch.no_grad():
        for n in lengths:
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(c(x), model(x), rtol=1e-4, atol=1e-5)
    s = gt.stats()
    assert s["graphs"] == 1 and s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
    return sum(s["launches"].values())


def test_interleaved_rotary_with_computed_tables_under_dynamic_shapes():
    """Tables computed from a symbolic range of positions are not constants to permute; a
    table repeating each entry twice, permuted evens-then-odds, is its half twice (a Concat
    shared by Q's and K's rotary): the rotary is rewritten under dynamic=True as well."""
    torch.manual_seed(0)
    model = PositionRotary().eval()
    on = _dynamic_launches(model, (12, 16, 20))
    off = _dynamic_launches(model, (12, 16, 20), "--disable_pass=rotary_pairs")
    assert on < off - 4, (on, off)


def test_one_k_v_head_lets_attention_read_q_and_write_its_output_in_bsnd():
    """GPT-BigCode's multi-query attention as transformers builds it: K and V of one head
    are [B, 1, S, D], in BSND ([B, S, 1, D]) views too, so the operator reads Q's head split
    and writes its head merge in place: no Transpose launch before or after it (6 vector
    launches for one layer, 8 when K/V were read in BNSD only)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTBigCodeConfig(n_layer=1, n_embd=64, n_head=4, n_inner=128,
                                        vocab_size=256, n_positions=64, multi_query=True)
    model = transformers.GPTBigCodeModel(cfg).eval()
    ids = torch.randint(0, 256, (2, 16))

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(input_ids=x).last_hidden_state

    wrapped = Hidden().eval()
    with torch.no_grad():
        want = wrapped(ids)
    got, _ = _launches(wrapped, (ids,))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    launches = gt.stats()["launches"]
    assert launches["extern"] == 1 and launches["vector"] <= 6, launches


class GroupedQKV(torch.nn.Module):
    """Falcon's new decoder architecture: one projection seen as [B, S, N2, G + 2, D] (G query
    heads, then one key and one value head per group), K and V broadcast to the query heads
    (``broadcast_to`` + ``flatten``: grouped-query heads repeated in BSND), rotary on Q and
    on the repeated K, causal attention. ``per_head``: K scaled per query head after its
    repetition (work that differs between the copies of a K/V head)."""

    def __init__(self, per_head: bool = False):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 2 * 4 * 16, bias=False)
        self.o = torch.nn.Linear(64, 32)
        self.per_head = per_head
        self.register_buffer("head_scale", torch.linspace(0.5, 2.0, 4).view(1, 4, 1, 1))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        fused = self.qkv(x).view(b, t, 2, 4, 16)
        q, k, v = fused[:, :, :, :-2], fused[:, :, :, [-2]], fused[:, :, :, [-1]]
        k, v = torch.broadcast_to(k, q.shape), torch.broadcast_to(v, q.shape)
        q, k, v = (y.flatten(2, 3).transpose(1, 2) for y in (q, k, v))

        def rotary(y):
            y1, y2 = y.chunk(2, -1)
            return y * cos + torch.cat((-y2, y1), -1) * sin

        k = rotary(k) * self.head_scale if self.per_head else rotary(k)
        a = F.scaled_dot_product_attention(rotary(q), k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, 64))


def _attention_case(model, width: int):
    """(launches, args): the model compiled on [2, 12, width] tokens and rotary tables of 12
    positions, its output checked against eager."""
    args = (torch.randn(2, 12, width), torch.randn(12, 16), torch.randn(12, 16))
    with torch.no_grad():
        want = model(*args)
    got, launches = _launches(model, args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return launches, args


def _grouped_case(per_head: bool):
    torch.manual_seed(0)
    return _attention_case(GroupedQKV(per_head).eval(), 32)[0]


def test_grouped_k_v_repeated_in_bsnd_are_read_with_their_own_heads():
    """The attention reads K and V with their 2 heads (no copy repeating them: the operator
    shares each among its 4 query heads), K's rotary runs on its 2 heads, and Q's and K's
    rotary is one kernel on the whole projection, which stores the parts of the one Split
    where the attention reads them: 4 launches (the products, that kernel, the attention),
    where the repeated V, the Split and the rotary of Q and of the repeated K were 4 vector
    launches of their own."""
    launches = _grouped_case(False)
    s = gt.stats()["launches"]
    assert s["extern"] == 1 and s["vector"] == 1, s
    assert launches == 4, s


def test_k_work_that_differs_between_its_copies_keeps_the_heads_repeated():
    """K scaled per query head after its repetition is not the same work on each copy of a
    K/V head: K stays repeated (the result equals eager's) and costs more launches than the
    grouped read above."""
    launches = _grouped_case(True)
    assert launches > 4, gt.stats()["launches"]


class MultiQueryColumns(torch.nn.Module):
    """GPT-BigCode's attention: one projection of E + 2D columns cut along its last axis into
    Q (E), one K head and one V head (``split`` of a [B, 1, S, E + 2D] view), repeated for
    the query heads (``repeat_kv``), causal attention over them. ``rotary``:
    Q and K rotated first (work that reads its columns in place)."""

    def __init__(self, rotary: bool = False):
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(64, 64 + 2 * 16), torch.nn.Linear(64, 64)
        self.rotary = rotary

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).unsqueeze(1).split([64, 16, 16], dim=3)
        q = q.view(b, t, 4, 16).transpose(1, 2)
        k, v = (y[:, :, None].expand(b, 1, 4, t, 16).reshape(b, 4, t, 16) for y in (k, v))
        if self.rotary:
            def rotate(y):
                y1, y2 = y.chunk(2, -1)
                return y * cos + torch.cat((-y2, y1), -1) * sin
            q, k = rotate(q), rotate(k)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, 64))


def _columns_case(rotary: bool):
    torch.manual_seed(0)
    model = MultiQueryColumns(rotary).eval()
    launches, args = _attention_case(model, 64)
    return launches, gt.export_graph(model, args)


def test_columns_only_the_attention_reads_are_one_split():
    """Q, K and V cut from the last axis of one projection and read only by the attention
    operator (which reads whole rows, not columns) are copied out by one Split: one vector
    launch where the three slices were three; the generated kernels (the Split's among
    them) give the reference's numbers in the simulator."""
    import graphkernel
    from graphkernel.bisect import verify

    launches, g = _columns_case(False)
    s = gt.stats()["launches"]
    assert s["vector"] == 1 and s["extern"] == 1, s
    assert launches == 4, s  # the two products, the Split, the attention
    hist = graphkernel.compile(g, "--opt_level=2", env={}).graph.op_histogram()
    assert hist.get("Split") == 1 and hist.get("FusedAttention") == 1, hist
    judged = verify(g, "--opt_level=2", backend="sim")
    assert not judged.bad, judged.reason


def test_columns_read_by_rotary_work_are_not_copied_apart():
    """Q and K rotated first: their kernels read the columns in place, so no Split copies
    them (only V's columns are a copy of their own)."""
    import graphkernel

    _, g = _columns_case(True)
    hist = graphkernel.compile(g, "--opt_level=2", env={}).graph.op_histogram()
    assert "Split" not in hist and hist.get("FusedAttention") == 1, hist


class PatchMerging(torch.nn.Module):
    """A windowed vision model's downsampling as Swin writes it: the four pixels of each 2x2
    patch gathered by strided slices, concatenated along the channels, normalised and
    projected."""

    def __init__(self, c=16):
        super().__init__()
        self.norm, self.proj = torch.nn.LayerNorm(4 * c), torch.nn.Linear(4 * c, 2 * c)

    def forward(self, x):
        x0, x1 = x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :]
        x2, x3 = x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]
        return self.proj(self.norm(torch.cat([x0, x1, x2, x3], -1)))


class CountedEmbeddings(torch.nn.Module):
    """An encoder's embeddings as RoBERTa writes them: position ids counted from the input
    ids (padding keeps the padding position), token embeddings plus position embeddings,
    LayerNorm; ``learned`` instead adds one position table shared by the batch (BART's,
    GPT-2's)."""

    def __init__(self, learned=False):
        super().__init__()
        self.learned = learned
        self.tokens, self.positions = torch.nn.Embedding(50, 32), torch.nn.Embedding(40, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, ids):
        if self.learned:
            pos = self.positions(torch.arange(ids.shape[1]))[None]
        else:
            mask = ids.ne(1).int()
            pos = self.positions(torch.cumsum(mask, dim=1).type_as(mask) * mask + 1)
        return self.norm(self.tokens(ids) + pos)


def _eager_matched_launches(model, *args):
    with torch.no_grad():
        want = model(*args)
    got, launches = _compiled(model, args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    return launches


def test_patch_merging_is_one_transpose_kernel_before_the_norm():
    """The four slices and their Concat are one Transpose (five launches before), gathered
    in UB by the norm's kernel: one vector kernel before the reduction's product."""
    x = torch.randn(2, 8, 8, 16, generator=torch.Generator().manual_seed(0))
    launches = _eager_matched_launches(PatchMerging().eval(), x)
    assert launches["vector"] == 1 and sum(launches.values()) == 2, launches


@pytest.mark.parametrize("learned", [False, True], ids=["counted", "learned"])
def test_embeddings_position_ids_and_norm_launches(learned):
    """Counted positions: the padding mask (the int64 ids compared with the pad id in
    float32), the running count with its int32 ids in one kernel (the Cast to int32 stored
    by it), the norm with the sum of the embeddings, whose kernel loads the token and
    position rows by id: two launches (six before the float32 region, three before the
    mask joined it). A learned
    table shared by the batch (folded) joins the norm's kernel, which loads the token rows:
    one launch (three before)."""
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    ids[0, -3:] = 1  # padding
    launches = _eager_matched_launches(CountedEmbeddings(learned).eval(), ids)
    assert sum(launches.values()) == (1 if learned else 2), launches


class Embeddings(torch.nn.Module):
    """BERT's embeddings: token rows by id, position rows (positions 0..S-1), LayerNorm."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(100, 32), torch.nn.Embedding(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.register_buffer("ids", torch.arange(16).unsqueeze(0), persistent=False)

    def forward(self, input_ids):
        pos = self.positions(self.ids[:, :input_ids.shape[1]])
        return self.norm(self.tokens(input_ids) + pos)


def test_the_token_lookup_is_read_by_the_kernel_that_normalizes_the_embeddings():
    """The token rows are loaded by the LayerNorm's kernel (the scalar unit reads each id):
    one vector launch for lookup, position add and norm, outputs equal to eager's."""
    torch.manual_seed(0)
    model = Embeddings().eval()
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        want = model(ids)
        got = torch.compile(model, backend="graphkernel")(ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0, s
    assert s["launches"]["vector"] == 1 and sum(s["launches"].values()) == 1, s["launches"]



class HeadsFirstInterleavedRotary(torch.nn.Module):
    """ERNIE 4.5's (GLM-style) attention: projections viewed [B, S, N, D] and transposed to
    [B, N, S, D] before the rotary; every pair of adjacent features rotated, the cos/sin
    tables computed from the positions in the forward (the half tables repeated
    interleaved), grouped K/V heads, causal attention."""

    def __init__(self, kv_heads: int = 2):
        super().__init__()
        self.kv = kv_heads
        self.q = torch.nn.Linear(32, 32, bias=False)
        self.k, self.v = (torch.nn.Linear(32, 8 * kv_heads, bias=False) for _ in range(2))
        self.o = torch.nn.Linear(32, 32, bias=False)
        self.register_buffer("inv", 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8),
                             persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        pos = torch.arange(t).float()[None, :, None]
        emb = torch.cat([pos * self.inv, pos * self.inv], -1)  # [1, S, D]
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
        q = self.q(x).view(b, t, -1, 8).transpose(1, 2)
        k = self.k(x).view(b, t, -1, 8).transpose(1, 2)
        v = self.v(x).view(b, t, -1, 8).transpose(1, 2)
        q = q * cos + rotate_every_two(q) * sin
        k = k * cos + rotate_every_two(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(b, t, 32))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_interleaved_rotary_after_the_heads_transpose_is_split_half(kv_heads):
    """The pairs' permutation folds into the projections' rows through the Transpose that
    puts the heads first (it keeps the features last): the rotary of Q and of K as halves,
    fewer launches than with the pass off (where each rotary is strided slices and an
    interleave, launch by launch), outputs equal to eager's."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(HeadsFirstInterleavedRotary(kv_heads))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert launches <= strided - 4, (launches, strided)



class HeadsFirstPartialRotary(HeadsFirstInterleavedRotary):
    """GLM's attention: as ``HeadsFirstInterleavedRotary`` with only the first half of each
    head's features rotated: the rotated columns sliced from the moved heads [B, N, S, D],
    rotated pair by pair and concatenated back with the others; ``seen``: the projection's
    heads also returned before the transpose (a reader the permutation would show to)."""

    def __init__(self, kv_heads: int = 2, seen: bool = False):
        super().__init__(kv_heads)
        self.seen = seen
        self.register_buffer("inv", 1.0 / 10000 ** (torch.arange(0, 4, 2).float() / 4),
                             persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        pos = torch.arange(t).float()[None, :, None]
        emb = torch.cat([pos * self.inv, pos * self.inv], -1)  # [1, S, 4]
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
        heads = self.q(x).view(b, t, -1, 8)
        q = heads.transpose(1, 2)
        k = self.k(x).view(b, t, -1, 8).transpose(1, 2)
        v = self.v(x).view(b, t, -1, 8).transpose(1, 2)

        def rotary(y):
            r, rest = y[..., :4], y[..., 4:]
            return torch.cat([r * cos + rotate_every_two(r) * sin, rest], -1)

        a = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True,
                                           enable_gqa=True)
        out = self.o(a.transpose(1, 2).reshape(b, t, 32))
        return (out, heads) if self.seen else out


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_partial_interleaved_rotary_sliced_after_the_heads_transpose_is_split_half(kv_heads):
    """The rotated columns sliced from the moved heads (the Transpose their one reader, the
    other columns passed through): the permutation folds into the projection's rows through
    the Transpose; one rotary kernel for Q and one for K instead of strided slices and an
    interleave launch by launch; outputs equal to eager's."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(HeadsFirstPartialRotary(kv_heads))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert launches <= strided - 8, (launches, strided)


def test_partial_interleaved_rotary_of_heads_read_elsewhere_is_left_alone():
    """Q's heads before the transpose also returned: their features keep their order (the
    pass leaves the rotaries strided), and the outputs are eager's."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(HeadsFirstPartialRotary(2, seen=True))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # (Q and K are permuted together or not at all: their dot products must not change)
    assert launches == strided, (launches, strided)


class GroupedFusedQKVRotary(InterleavedRotary):
    """CodeGen's attention: one fused projection viewed as ``groups`` rows of [Q | V | K]
    (``qkv.view(B, S, groups, 3 * width).split(width)``), each part reshaped into the heads
    [B, S, N, D]; the first ``rot`` features of each head of Q and K rotated pair by pair
    (GPT-J's tables), the rest passed through, causal attention."""

    def __init__(self, groups: int = 4, bias: bool = False):
        super().__init__(rot=4)
        self.groups = groups
        self.qkv = torch.nn.Linear(32, 96, bias=bias)

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, self.groups, 96 // self.groups)
        q, v, k = qkv.split(32 // self.groups, dim=-1)
        q, k, v = (y.reshape(b, t, 4, 8) for y in (q, k, v))

        def rotary(y):
            r, rest = y[..., :self.rot], y[..., self.rot:]
            cos, sin = self.tables(t)
            return torch.cat([r * cos + rotate_every_two(r) * sin, rest], -1)

        a = F.scaled_dot_product_attention(rotary(q).transpose(1, 2),
                                           rotary(k).transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, 32))


@pytest.mark.parametrize("bias", [False, True])
def test_interleaved_rotary_of_heads_cut_from_a_fused_projection_is_one_kernel_each(bias):
    """Each group of the fused product's columns holds one head of Q, of V and of K: the
    pairs' permutation goes to the columns of Q's and of K's heads in that product (V's and
    the unrotated ones untouched): one rotary kernel for Q and one for K instead of strided
    slices and an interleave, launch by launch; outputs equal to eager's."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(GroupedFusedQKVRotary(4, bias))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert launches <= strided - 8, (launches, strided)


def test_interleaved_rotary_of_several_heads_per_fused_group_is_left_alone():
    """Two heads in each group of the fused product's columns: no one offset and period
    name a head's features there, so the rotaries stay strided (the outputs eager's)."""
    torch.manual_seed(0)
    got, want, launches, strided = _against_strided_rotaries(GroupedFusedQKVRotary(2))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert launches == strided, (launches, strided)


class ShiftedScaledInPlace(torch.nn.Module):
    """Funnel's relative shift with its in-place multiply: the product seen through views, a
    slice of rows and of columns taken (the shift), scaled in place (``*= cls_mask``), then
    read again: functionalized, the multiply is written back into the product by two
    slice_scatters that the next read takes through the same views."""

    def forward(self, q, r, c):
        b, n, s, d = q.shape
        att = torch.einsum("bnid,tnd->bnit", q, r)  # [B, N, S, 2S]
        att = att.reshape(b, n, 2 * s, s)[:, :, 1:].reshape(b, n, s, 2 * s - 1)[..., :s]
        att *= c
        return torch.softmax(att + 1.0, dim=-1)


def test_an_in_place_multiply_on_a_view_is_not_written_back_and_read_again():
    """The written-back product read again through views that move nothing is the piece
    written (``arith_simplify`` rule 25 through views): no Concat launch, the slices and the
    multiply one kernel with the softmax's reads; outputs as eager's."""
    args = (torch.randn(2, 4, 8, 16), torch.randn(16, 4, 16), torch.rand(8, 8))
    with torch.no_grad():
        want = ShiftedScaledInPlace()(*args)
    got, launches = _launches(ShiftedScaledInPlace(), args)
    _, kept = _launches(ShiftedScaledInPlace(), args, "--disable_pass=arith_simplify")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert launches <= kept - 2, (launches, kept)


class EinsumRelativeAttention(torch.nn.Module):
    """Funnel's relative attention: the content scores by einsum (torch views the operands
    with an axis of 1 and permutes five axes), plus two computed biases (positional and
    token-type scores), softmax, the values by einsum back to [B, S, N, D]."""

    def forward(self, q, k, v, pos, seg):
        content = torch.einsum("bind,bjnd->bnij", q * 0.25, k)
        score = content + torch.tanh(pos) + seg * 2.0
        return torch.einsum("bnij,bjnd->bind", torch.softmax(score, dim=-1), v)


def test_einsum_attention_with_two_biases_is_one_fused_attention():
    """The five-axis permutes are the 4-d head splits, merge and Kᵀ between views
    (``transpose_elim``), and the two biases one pse, their sum: one FusedAttention."""
    b, s, n, d = 2, 8, 4, 16
    args = (torch.randn(b, s, n, d), torch.randn(b, s, n, d), torch.randn(b, s, n, d),
            torch.randn(b, n, s, s), torch.randn(b, n, s, s))
    with torch.no_grad():
        want = EinsumRelativeAttention()(*args)
    got, launches = _compiled(EinsumRelativeAttention(), args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert launches["extern"] == 1 and launches["mix"] == 0, launches


class RotaryReturningCache(torch.nn.Module):
    """LLaMA-style attention of one layer whose rotated keys and values are returned in
    [B, N, S, D] (the KV cache a graph break hands to the rest of the layer: DBRX, JetMoE):
    split-half rotary on Q and K after their head transposes."""

    def __init__(self, heads: int = 2, dim: int = 16, seq: int = 12):
        super().__init__()
        self.h, self.d = heads, dim
        self.q = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.k = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.v = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.o = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
        ang = torch.arange(seq).float()[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], -1)
        self.register_buffer("cos", ang.cos()[None, None])
        self.register_buffer("sin", ang.sin()[None, None])

    def forward(self, x):
        b, t, _ = x.shape

        def heads(p):
            return p(x).view(b, t, self.h, self.d).transpose(1, 2)

        def rotary(y):
            half = torch.cat([-y[..., self.d // 2:], y[..., :self.d // 2]], -1)
            return y * self.cos + half * self.sin

        q, k, v = rotary(heads(self.q)), rotary(heads(self.k)), heads(self.v)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, -1)), k, v


def test_a_returned_rotary_key_keeps_the_attention_in_bsnd(monkeypatch):
    """K's rotary is computed in [B, S, N, D] for the operator even though the graph returns
    K in [B, N, S, D]: the returned value is the rebuilt one transposed back, stored by the
    same kernel (a strided store of its rows). So the operator reads Q, K, V and writes its
    output in BSND: no head transpose of Q, of the output, nor a kernel of K's transpose;
    V's transpose is the returned V's only. Generated code in the simulator matches eager."""
    from graphkernel.frontends import torch_backend

    graphs = []
    orig = torch_backend._runner
    monkeypatch.setattr(torch_backend, "_runner",
                        lambda imp, g, r=None: graphs.append(g) or orig(imp, g, r))
    torch.manual_seed(0)
    model = RotaryReturningCache().eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        want = model(x)
    got, launches = _compiled(model, (x,))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    g = graphs[-1]
    (fa,) = [n for n in g.nodes if n.op == "FusedAttention"]
    assert fa.attrs["layout"] == "BSND"
    alone = [n for n in g.nodes if n.op == "Transpose"]
    assert len(alone) == 1  # the returned V's
    kernels = [n for n in g.nodes if n.op == "GraphKernel"
               and any(m.op == "Transpose" for m in n.subgraph.nodes)]
    assert len(kernels) == 1 and len(kernels[0].outputs) == 2  # K for the operator, K returned
    assert sum(launches.values()) == 6, launches  # Q/K/V products, 2 rotaries, V, FA, O
    torch._dynamo.reset()
    with torch.no_grad():
        sim = torch.compile(model, backend="graphkernel", options={"backend": "sim"})(x)
    for a, b in zip(sim, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
