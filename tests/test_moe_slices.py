"""Parts of one operand read by one kernel: a mixture of experts' gate/up product cut in two
halves (``silu(gate) * up``) is one kernel loading each half as a strided view of the
product, not a copy of one half and a kernel reading the other; through torch.compile, on a
block built as the library builds it, and through the simulator. A half that a product reads
is no such part (it keeps its own launch), nor is an input the kernel also reads whole."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]


def _compiled(fn, args, options=None):
    with torch.no_grad():
        want = fn(*args)
        got = torch.compile(fn, backend="graphkernel", options=options or {})(*args)
    return got, want, gt.stats()


def _gate_up(seed=0, m=32, k=16, n=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, 2 * n, generator=g) * 0.3


def _swiglu(x, w):
    gate, up = (x @ w).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def test_gate_and_up_halves_are_read_by_one_kernel():
    got, want, s = _compiled(_swiglu, _gate_up())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the product, and one kernel for the activation reading both halves: no copy of one
    assert s["launches"] == {"vector": 1, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s


@pytest.mark.sim
def test_gate_and_up_halves_through_the_simulator():
    got, want, s = _compiled(_swiglu, _gate_up(1), {"backend": "sim"})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["launches"]["vector"] == 1 and s["bugs"] == 0, s


def test_a_half_that_a_product_reads_keeps_its_launch():
    """The up half also multiplied by a matrix: a slice copied for the product (the cube
    unit reads it), the activation kernel reading the gate half and that copy."""
    def f(x, w, v):
        gate, up = (x @ w).chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up, up @ v

    x, w = _gate_up(2)
    v = torch.randn(24, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = f(x, w, v)
        got = torch.compile(f, backend="graphkernel")(x, w, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    s = gt.stats()["launches"]
    assert s["opaque"] == 0 and s["vector"] == 2, s


def test_an_operand_read_whole_and_in_parts_keeps_one_input():
    """The rotate-half of a rotary embedding reads x whole (``x * cos``) and in halves: its
    halves stay column views of the one loaded tile (one kernel input), as before."""
    from graphkernel.ir import DType, Graph, TensorType
    from graphkernel.kernels import sliced_inputs

    g = Graph("k")
    x = g.add_input("x", TensorType((4, 8), DType.float32))
    a = g.add_node("StridedSlice", [x], {"begin": [0], "end": [4], "strides": [1],
                                         "axes": [1]}).outputs[0]
    b = g.add_node("StridedSlice", [x], {"begin": [4], "end": [8], "strides": [1],
                                         "axes": [1]}).outputs[0]
    c = g.add_node("Concat", [b, a], {"axis": 1}).outputs[0]
    g.set_outputs([g.add_node("Mul", [c, x], {}).outputs[0]])
    assert sliced_inputs(g) == []
    g2 = Graph("k2")
    y = g2.add_input("y", TensorType((4, 8), DType.float32))
    p = g2.add_node("StridedSlice", [y], {"begin": [0], "end": [4], "strides": [1],
                                          "axes": [1]}).outputs[0]
    q = g2.add_node("StridedSlice", [y], {"begin": [4], "end": [8], "strides": [1],
                                          "axes": [1]}).outputs[0]
    g2.set_outputs([g2.add_node("Mul", [p, q], {}).outputs[0]])
    assert sliced_inputs(g2) == [y]


def _rot(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), -1)


def _latent_kv(x, w, g, cos, sin):
    """Multi-head latent attention's compressed key/value: one product split into the latent
    part (normalised) and the shared rotary key (a head axis of one, rotated)."""
    kv = x @ w
    latent, rope = torch.split(kv, [32, 8], dim=-1)
    latent = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    rope = rope.view(2, 1, 16, 8)
    return latent, rope * cos + _rot(rope) * sin


def _latent_data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 16, 64, generator=gen), torch.randn(64, 40, generator=gen) * 0.2,
            torch.rand(32, generator=gen) + 0.5, torch.randn(1, 1, 16, 8, generator=gen),
            torch.randn(1, 1, 16, 8, generator=gen))


def test_latent_and_rotary_parts_are_read_by_their_kernels():
    """Each part of the split is read in place by the kernel computing on it (the rotary
    key through its head view): no launch copying the parts."""
    got, want, s = _compiled(_latent_kv, _latent_data())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert s["launches"] == {"vector": 2, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s


@pytest.mark.sim
def test_latent_and_rotary_parts_through_the_simulator():
    got, want, s = _compiled(_latent_kv, _latent_data(1), {"backend": "sim"})
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert s["launches"]["vector"] == 2 and s["bugs"] == 0, s


def test_unit_axes_view_keeps_the_elements_in_place():
    from graphkernel.codegen.vector.schedule import View, unit_axes_view

    v = View(32, (640, 40, 1))  # columns 32.. of rows of 40: [2, 16, 8]
    assert unit_axes_view(v, (2, 16, 8), (2, 1, 16, 8)) == View(32, (640, 0, 40, 1))
    # the rows of the two batch elements lie end to end (640 = 16 * 40): merged, one view
    assert unit_axes_view(v, (2, 16, 8), (32, 8)) == View(32, (40, 1))
    # a row merged with its columns crosses the slice's gap (columns 32..39 of 40): no view
    assert unit_axes_view(v, (2, 16, 8), (2, 128)) is None


def _interleaved(x, w):
    """GPT-OSS's gated activation: gate the even columns of one product, up the odd ones,
    each clamped (transformers' GptOssExperts._apply_gate)."""
    h = x @ w
    gate, up = h[..., ::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
    return (up + 1) * (gate * torch.sigmoid(gate * 1.702))


@pytest.mark.parametrize("backend", ["reference", pytest.param("sim", marks=pytest.mark.sim)])
def test_interleaved_gate_and_up_columns_are_read_by_one_kernel(backend):
    """Both every-second-column parts of the product are strided loads of one kernel (before:
    a launch copying one part, the activation kernel reading the copy and the other)."""
    got, want, s = _compiled(_interleaved, _gate_up(4), {"backend": backend})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert s["launches"] == {"vector": 1, "cube": 1, "mix": 0, "extern": 0, "opaque": 0}, s
    assert s["bugs"] == 0, s


def test_gpt_oss_experts_built_from_the_config_read_the_pairs_in_place():
    """GPT-OSS's MoE block as the library builds it (its decoder from a config with the
    library's defaults, seeded; the first layer's block): the interleaved gate/up columns of
    the grouped product read by the activation kernel, no launch copying one part; frozen,
    the experts' columns are reordered so that each part is a block of the product's rows."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    num_local_experts=4, num_experts_per_tok=2,
                                    vocab_size=256)
    block = transformers.GptOssModel(cfg).layers[0].mlp.eval()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    import graphkernel

    results, orig = [], graphkernel.compile

    def capture(*a, **k):
        results.append(orig(*a, **k))
        return results[-1]

    try:
        graphkernel.compile = capture
        got, want, s = _compiled(block, (x,))
    finally:
        graphkernel.compile = orig
    torch.testing.assert_close(got[0] if isinstance(got, tuple) else got,
                               want[0] if isinstance(want, tuple) else want,
                               rtol=1e-5, atol=1e-5)
    assert s["launches"]["opaque"] == 0 and s["launches"]["vector"] == 1, s
    # the frozen experts' columns reordered (interleaved_columns): each part a block of
    # every row, no slice with a step left
    steps = [m.attrs["strides"] for r in results for k in r.graph.nodes
             if k.op == "GraphKernel" for m in k.subgraph.nodes if m.op == "StridedSlice"]
    assert steps and all(st == [1] for st in steps), steps


def test_stepped_parts_put_back_together_stay_apart():
    """An interleaved rotary's pairs (x[..., ::2] and x[..., 1::2] rotated and stacked back
    into pairs): the stepped parts are no parts of a row the kernel computes on, and the
    slice pattern leaves them as before (three launches: each part's kernel, the pairs'
    stack)."""
    def rotate(x):
        a, b = x[..., ::2], x[..., 1::2]
        return torch.stack((-b, a), dim=-1).flatten(-2) * 2.0

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))
    got, want, s = _compiled(rotate, (x,))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert s["launches"] == {"vector": 3, "cube": 0, "mix": 0, "extern": 0, "opaque": 0}, s
