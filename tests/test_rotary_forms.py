"""Rotary forms of mixture-of-experts decoders as the library writes them, through
torch.compile (and the simulator): GPT-OSS's rotary on the halves with half-width tables,
DeepSeek's interleaved pairs written back as halves (past a head's unrotated features), each
one vector kernel beside its projection; and the forms the rewrites must leave alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
deepseek = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]

B, S, HEADS, D = 2, 8, 4, 16
NOPE, ROPE = 8, 8  # DeepSeek's head: unrotated features, then rotated ones


def _tables(width, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(S, width, generator=g), torch.randn(S, width, generator=g)


class Tables(torch.nn.Module):
    """The cos/sin tables as the models have them by the time they are compiled: constants
    (computed from constant positions and frequencies, folded)."""

    def __init__(self, width, seed):
        super().__init__()
        cos, sin = _tables(width, seed)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)


class HalfTables(Tables):
    """A projection split into heads (BNSD), rotated as GPT-OSS does."""

    def __init__(self, seed):
        super().__init__(D // 2, seed)
        self.proj = torch.nn.Linear(HEADS * D, HEADS * D, bias=False)

    def forward(self, x):
        q = self.proj(x).view(B, S, HEADS, D).transpose(1, 2)
        return gpt_oss._apply_rotary_emb(q, self.cos[None, None], self.sin[None, None])


class Interleaved(Tables):
    """DeepSeek's query and key: the rotated features after the others in each query head,
    the key's from a projection of its own, rotated in pairs and written back as halves."""

    def __init__(self, seed):
        super().__init__(ROPE, seed)
        self.q = torch.nn.Linear(HEADS * D, HEADS * (NOPE + ROPE), bias=False)
        self.k = torch.nn.Linear(HEADS * D, 32 + ROPE, bias=False)

    def forward(self, x):
        cos, sin = self.cos, self.sin
        q = self.q(x).view(B, S, HEADS, NOPE + ROPE).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [NOPE, ROPE], dim=-1)
        kv, k_rot = torch.split(self.k(x), [32, ROPE], dim=-1)
        k_rot = k_rot.view(B, 1, S, ROPE)
        q_rot, k_rot = deepseek.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos[None],
                                                                sin[None])
        return torch.cat((q_pass, q_rot), dim=-1), k_rot, kv


def _x(seed=0):
    return torch.randn(B, S, HEADS * D, generator=torch.Generator().manual_seed(seed))


def _compiled(model, args, options=None):
    torch.manual_seed(0)
    model = model.eval()
    with torch.no_grad():
        want = model(*args)
        got = torch.compile(model, backend="graphkernel", options=options or {})(*args)
    return got, want, gt.stats()


def _total(s):
    return sum(s["launches"].values())


def test_half_table_rotary_is_one_kernel():
    got, want, s = _compiled(HalfTables(1), (_x(),))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the projection, the rotary (its tables widened constants); not a launch per op
    assert s["launches"] == {"vector": 1, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s


@pytest.mark.sim
def test_half_table_rotary_through_the_simulator():
    got, want, s = _compiled(HalfTables(2), (_x(2),), {"backend": "sim"})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["bugs"] == 0 and _total(s) == 2, s


def test_interleaved_pairs_written_as_halves_are_one_kernel_each():
    got, want, s = _compiled(Interleaved(3), (_x(3),))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the two projections of one input as one launch (the key's split into its rotated and
    # other parts taken into its product: pieces of one product group, the other part stored
    # by it), the query's rotary with its unrotated features, the key's rotary: no launch per
    # op, no strided pairs
    assert s["launches"] == {"vector": 2, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s


@pytest.mark.sim
def test_interleaved_pairs_through_the_simulator():
    """The query's rotate-half sits at columns 8-16 of each head's row: the Concat of its
    halves is placed at the columns they span."""
    got, want, s = _compiled(Interleaved(4), (_x(4),), {"backend": "sim"})
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert s["bugs"] == 0 and _total(s) == 3, s  # the projections (key cut in two) as one launch


def test_computed_tables_sliced_from_wider_ones():
    """The tables as the graph computes them when the positions are not constant: inputs,
    each sliced to its first half by the rotary itself (DeepSeek's ``cos[..., :d/2]``); the
    value whose halves the products read is told from the tables' own halves."""
    class Computed(Interleaved):
        def forward(self, x, cos, sin):
            k_rot = self.k(x)[..., 32:].view(B, 1, S, ROPE)
            _, k_rot = deepseek.apply_rotary_pos_emb_interleave(k_rot, k_rot, cos[None],
                                                                sin[None])
            return k_rot

    cos, sin = _tables(ROPE, 7)
    got, want, s = _compiled(Computed(7), (_x(7), cos, sin))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the product, the key's columns sliced, the rotary in one kernel; each table's half (a
    # slice of an input) read in place by the kernel widening it
    assert s["launches"] == {"vector": 3, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s


def test_tables_differing_between_the_halves_are_left_alone():
    """``cat(x1*c - x2*s, x2*c2 + x1*s)`` is no rotary: widening one table would be wrong."""
    class Two(torch.nn.Module):
        def forward(self, x, c, s, c2):
            x1, x2 = torch.chunk(x, 2, dim=-1)
            return torch.cat((x1 * c - x2 * s, x2 * c2 + x1 * s), dim=-1)

    g = torch.Generator().manual_seed(5)
    args = (torch.randn(B, HEADS, S, D, generator=g), *(torch.randn(S, D // 2, generator=g)
                                                         for _ in range(3)))
    got, want, _ = _compiled(Two(), args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pairs_with_another_reader_keep_their_order():
    """The rotated features also returned as they are: permuting the product's columns would
    show the permutation, so the pairs stay strided (and the results right)."""
    class Seen(Interleaved):
        def forward(self, x):
            cos, sin = self.cos, self.sin
            k = self.k(x)
            kv, k_rot = torch.split(k, [32, ROPE], dim=-1)
            k_rot = k_rot.view(B, 1, S, ROPE)
            _, rotated = deepseek.apply_rotary_pos_emb_interleave(k_rot, k_rot, cos[None],
                                                                  sin[None])
            return rotated, k_rot

    got, want, _ = _compiled(Seen(6), (_x(6),))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
