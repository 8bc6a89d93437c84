"""Convolutional networks through torch.compile: batch norm (inference and training, its
running statistics updated as eager updates them), every pool variant and its gradient,
padding modes; each ATen op mapped (no op runs through torch) and the results eager's."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]  # torch.compile of modules


def _weights(y):
    return torch.linspace(-1, 1, y.numel()).reshape(y.shape)


def run(m: nn.Module, x, train: bool, flags: str = "") -> None:
    """Compile ``m`` (with ``flags``) and check it against eager: the output, and in training
    the gradients of the input and of every parameter and the updated buffers."""
    torch.manual_seed(0)
    m.train(train)
    ours = copy.deepcopy(m)
    if not train:
        opts = {"options": {"flags": flags}} if flags else {}
        with torch.no_grad():
            want, got = m(x), torch.compile(ours, backend="graphkernel", **opts)(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    else:
        xe, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
        want = m(xe)
        (want * _weights(want)).sum().backward()
        got = torch.compile(ours, backend="graphkernel")(xg)
        (got * _weights(got)).sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(xg.grad, xe.grad, rtol=1e-4, atol=1e-5)
        # (a convolution's bias before a training batch norm has a gradient of exactly 0:
        # both sides' rounding noise, sums over every element of a channel)
        for (name, p), q in zip(m.named_parameters(), ours.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=5e-5,
                                       msg=lambda s, n=name: f"{n}: {s}")
        for (name, b), c in zip(m.named_buffers(), ours.buffers(), strict=True):
            torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6,
                                       msg=lambda s, n=name: f"{n}: {s}")
    s = gt.stats()
    assert s["fallbacks"] == {}
    assert s["launches"]["opaque"] == 0


def conv(c=4, d=2):
    return (nn.Conv1d, nn.Conv2d)[d - 1](c, c, 1)


MODELS = {
    "conv_bn_relu": (lambda: nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6),
                                           nn.ReLU()), (2, 4, 9, 10)),
    "bn_no_affine": (lambda: nn.Sequential(conv(), nn.BatchNorm2d(4, affine=False)),
                     (3, 4, 5, 6)),
    "max_ceil": (lambda: nn.Sequential(conv(), nn.MaxPool2d(3, 2, 1, ceil_mode=True)),
                 (2, 4, 9, 10)),
    "max_dilated": (lambda: nn.Sequential(conv(), nn.MaxPool2d(2, 1, 0, dilation=2)),
                    (2, 4, 9, 10)),
    "avg_ceil_excl": (lambda: nn.Sequential(conv(), nn.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                                 count_include_pad=False)),
                      (2, 4, 9, 10)),
    "avg_divisor": (lambda: nn.Sequential(conv(), nn.AvgPool2d(2, divisor_override=3)),
                    (2, 4, 9, 10)),
    "adaptive": (lambda: nn.Sequential(conv(), nn.AdaptiveAvgPool2d((3, 4)),
                                       nn.AdaptiveMaxPool2d((2, 3))), (2, 4, 9, 10)),
    "adaptive_unbatched": (lambda: nn.Sequential(nn.AdaptiveAvgPool2d((3, 4)),
                                                 nn.AdaptiveMaxPool2d((2, 3)),
                                                 nn.AdaptiveAvgPool2d(1)), (4, 9, 10)),
    "global_avg": (lambda: nn.Sequential(conv(), nn.AdaptiveAvgPool2d(1), nn.Flatten()),
                   (2, 4, 9, 10)),
    "avg_whole_plane": (lambda: nn.Sequential(conv(), nn.AvgPool2d(16, ceil_mode=True)),
                        (2, 4, 9, 10)),
    "pads": (lambda: nn.Sequential(conv(), nn.ReflectionPad2d((1, 2, 0, 1)),
                                   nn.ReplicationPad2d(1), nn.ZeroPad2d((1, 0, 2, 1))),
             (2, 4, 6, 7)),
    "pools_1d": (lambda: nn.Sequential(conv(d=1), nn.BatchNorm1d(4), nn.MaxPool1d(3, 2),
                                       nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(2)), (2, 4, 17)),
    "pools_3d": (lambda: nn.Sequential(nn.BatchNorm3d(4), nn.MaxPool3d(2),
                                       nn.AvgPool3d(2, ceil_mode=True)), (2, 4, 5, 6, 7)),
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(MODELS))
def test_cnn_layers_match_eager(name, train):
    make, shape = MODELS[name]
    torch.manual_seed(1)
    m = make()
    if not train:  # running statistics of their own, not the initial zeros and ones
        for b in m.modules():
            if isinstance(b, nn.modules.batchnorm._BatchNorm) and b.running_mean is not None:
                b.running_mean.uniform_(-1, 1)
                b.running_var.uniform_(0.5, 2)
    run(m, torch.randn(*shape), train)


def test_frozen_batch_norm_folds_into_the_convolution():
    """Under no_grad the parameters are constants: conv + BN + ReLU is one convolution with
    the folded bias and the ReLU; joined (the panel's bound off: at this small image the
    im2col panel moves several times the bytes of the two apart) one MIX kernel, the folded
    bias an Add of its epilogue; with trainable parameters (requires grad) the BN stays an
    affine vector op."""
    import graphkernel

    torch.manual_seed(2)
    m = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6),
                      nn.ReLU()).eval()
    m[1].running_mean.uniform_(-1, 1)
    m[1].running_var.uniform_(0.5, 2)
    g = gt.export_graph(m, (torch.randn(2, 4, 9, 10),), name="t")
    res = graphkernel.compile(g, "--opt_level=2", env={})
    assert sum(p.rewrites for p in res.report.passes if p.name == "conv_bn_fold") == 2
    (conv,) = [n for n in res.graph.nodes if n.op == "Conv2D"]
    assert len(conv.inputs) == 3  # the folded bias
    ops = {m.op for n in res.graph.nodes
           for m in (n.subgraph.nodes if n.op == "GraphKernel" else [n])}
    assert ops - {"Constant"} <= {"Conv2D", "Maximum", "ReLU"}  # no affine left
    res = graphkernel.compile(g, "--opt_level=2 --conv_panel_growth=-1", env={})
    (k,) = [n for n in res.graph.nodes if n.op != "Constant"]
    assert [n.op for n in k.subgraph.nodes if n.op != "Constant"] == ["Conv2D", "Add",
                                                                      "Maximum"]
    assert sum(p.rewrites for p in res.report.passes if p.name == "conv_bn_fold") == 2
    run(m, torch.randn(2, 4, 9, 10), train=False)


def test_training_batch_norm_of_a_nearly_constant_channel_is_accurate():
    """A channel of large mean and tiny spread (a nearly saturated activation): the mean's
    rounding, times an rstd near 1/sqrt(eps), is noise of ~1e-5 in y (eager fp32 has it: it
    accumulates in fp32) unless the statistics are taken on shifted data. Judged against
    float64: y to 1e-6, the input's gradient no worse than eager's."""
    torch.manual_seed(3)
    x = 13.6 + 0.003 * torch.randn(2, 8, 4, 4)
    m = nn.Sequential(nn.BatchNorm2d(8, eps=1e-3), nn.ReLU6()).train()
    w = _weights(x)
    res = {}
    for side in ("eager", "ours", "float64"):
        mm, xx = copy.deepcopy(m), x.clone()
        if side == "float64":
            mm, xx = mm.double(), xx.double()
        xx.requires_grad_()
        torch._dynamo.reset()
        y = (torch.compile(mm, backend="graphkernel") if side == "ours" else mm)(xx)
        (y * w.to(y.dtype)).sum().backward()
        res[side] = (y.detach().double(), xx.grad.double())
    err = {k: [float((a - b).abs().max()) for a, b in zip(v, res["float64"], strict=True)]
           for k, v in res.items() if k != "float64"}
    assert err["ours"][0] < 1e-6 < err["eager"][0]
    assert err["ours"][1] <= 2 * err["eager"][1]


def test_training_batch_norm_after_a_strided_convolution_is_as_exact_as_eager():
    """MobileNetV2's stem in train mode (a strided 3x3 convolution, a batch norm of
    momentum 0.997, ReLU6): the running mean is the batch mean of 2048 values of each
    channel. PyTorch accumulates it in float64; the compiled graph's statistics, summed over
    the convolution's output (a transposed view in the reference), must be as close to a
    float64 twin's as eager's are, give or take one float32 ulp of the data's scale (~1:
    the statistics are taken on data shifted by a sample, whose rounding that is). Summed
    in float32 one by one they were 8 such ulps off (the means are ~0.01)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
                      nn.BatchNorm2d(16, eps=1e-3, momentum=0.997), nn.ReLU6()).train()
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.2, 0.2)
    x = torch.randn(2, 3, 64, 64)
    exact = copy.deepcopy(m).double()
    exact(x.double())
    eager, ours = copy.deepcopy(m), copy.deepcopy(m)
    eager(x)
    torch.compile(ours, backend="graphkernel")(x)
    err = {k: float((v[1].running_mean.double() - exact[1].running_mean).abs().max())
           for k, v in (("eager", eager), ("ours", ours))}
    assert err["ours"] <= 2 * err["eager"] + float(torch.finfo(torch.float32).eps), err


def test_training_batch_norm_mean_keeps_its_own_digits_when_the_first_element_is_large():
    """The statistics are taken on data shifted by each channel's first element k; the mean
    returned (the running mean's, and the backward's in (x - mean) rstd) must not be k +
    mean(x - k), which cancels when |k| is far above |mean| and keeps an ulp of k: ~1e-7
    on a mean of ~0.01 whose first element is 3, where eager is within ~1e-9. That error is
    the same in every element of the channel and went into every gradient through it."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16, 16)
    x -= x.mean(dim=(0, 2, 3), keepdim=True) - 0.01
    x[0, :, 0, 0] = 3.0
    m = nn.BatchNorm2d(4, momentum=1.0).train()  # the running mean is the batch mean
    exact = copy.deepcopy(m).double()
    exact(x.double())
    eager, ours = copy.deepcopy(m), copy.deepcopy(m)
    eager(x)
    torch.compile(ours, backend="graphkernel")(x)
    err = {k: float((v.running_mean.double() - exact.running_mean).abs().max())
           for k, v in (("eager", eager), ("ours", ours))}
    assert err["ours"] <= 2 * err["eager"] + 1e-9, err


def _cnn_models():
    """examples/cnn_models.py, the CNN zoo."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import cnn_models

    return cnn_models


def _zoo(name):
    build, inputs = _cnn_models().builders()[name]
    return build(), inputs()[0]


@pytest.mark.parametrize("name", ["tv_resnet", "mobilenet_v1", "poolformer"])
def test_cnn_zoo_inference_maps_every_op(name):
    """Max-pool stem and adaptive pool; TensorFlow SAME pads, ReLU6 and depthwise
    convolutions; average pooling as a token mixer: no op runs through torch, eager's
    output, a cube or MIX launch per convolution but the depthwise ones, and at most one
    vector launch per convolution beside the pools (batch norms folded or fused, pads in the
    convolutions)."""
    pytest.importorskip("transformers")
    m, x = _zoo(name)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, backend="graphkernel")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["launches"]["opaque"] == 0
    convs = sum(isinstance(c, nn.Conv2d) for c in m.modules())
    depthwise = sum(isinstance(c, nn.Conv2d) and c.groups == c.in_channels == c.out_channels
                    > 1 for c in m.modules())  # (window kernels in the vector unit)
    bns = sum(isinstance(c, nn.BatchNorm2d) for c in m.modules())
    assert s["launches"]["cube"] + s["launches"]["mix"] >= convs - depthwise
    if bns:
        assert s["launches"]["vector"] <= convs + 2


def test_cnn_zoo_training_step_matches_eager():
    """A residual network in train mode: gradients of every parameter, the running
    statistics after the step."""
    m, x = _zoo("tv_resnet")
    run(m, x[:, :, :32, :32], train=True)


@pytest.mark.parametrize("pool", [nn.AdaptiveAvgPool2d((1, 1)), nn.AvgPool2d(12, ceil_mode=True)])
def test_global_average_pool_is_a_reduction(pool):
    """A global average pool (adaptive to 1x1, or one window over the plane, as
    EfficientNet's pooler) is a mean over H and W, in inference and in its gradient."""
    import graphkernel

    m = nn.Sequential(nn.Conv2d(4, 6, 3), nn.ReLU(), pool, nn.Flatten())
    x = torch.randn(2, 4, 10, 9)
    g = gt.export_graph(m.eval(), (x,), name="t")
    ops = {n.op for n in graphkernel.compile(g, "--opt_level=1", env={}).graph.nodes}
    assert not ops & {"AvgPool", "AdaptiveAvgPool"}
    run(m, x, train=False)
    run(m, x, train=True)


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int = 16, r: int = 4) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.b(torch.relu(self.a(x.mean((2, 3), keepdim=True)))))


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


class _TokenMixer(nn.Module):
    """PoolFormer's block: x + scale * (pool(norm(x)) - norm(x))."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.scale = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        y = self.norm(x)
        return x + self.scale.unsqueeze(-1).unsqueeze(-1) * (self.pool(y) - y)


class _NormTail(nn.Module):
    """BiT's and PoolFormer's last block: a 1x1 convolution plus the residual, a group
    norm (statistics per group of channels), ReLU, then a global average pool (rows of one
    channel)."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(c, c, 1, bias=False), nn.GroupNorm(4, c)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x) + x)).mean((2, 3))


def _basic_block(cin: int, cout: int, stride: int):
    """torchvision's ResNet BasicBlock (its layout and defaults), with a projection when the
    block downsamples: the zoo's own (examples/cnn_models.py)."""
    return _cnn_models()._tv_models(torch)["tv_resnet"].block(cin, cout, stride)


def _bit_block(cin: int, cout: int):
    """BiT's pre-activation bottleneck with its projection shortcut, as transformers builds
    it (weight-standardised convolutions, group norms with ReLU)."""
    import transformers as T
    from transformers.models.bit.modeling_bit import BitPreActivationBottleneckLayer

    return BitPreActivationBottleneckLayer(T.BitConfig(num_groups=4), cin, cout,
                                           is_first_layer=True)


# launches of small blocks in inference (frozen batch norm): a 1x1 convolution is a product
# whose folded batch norm, activation and residual add run in its output tile (one MIX
# kernel); a depthwise convolution is a window kernel with its folded batch norm and activation;
# squeeze-and-excitation: the pool and its mean one reduction, each convolution on the pooled
# pixel a product of the images' rows with its bias and activation (ReLU; the gate) in its
# tile, the gated scale of the input a vector kernel
BLOCKS = {
    "conv1x1_bn_relu": (lambda: nn.Sequential(nn.Conv2d(8, 16, 1, bias=False),
                                              nn.BatchNorm2d(16), nn.ReLU()), 8,
                        {"mix": 1}),
    "conv1x1_bn_add_relu": (_Residual, 16, {"mix": 1}),
    "depthwise_separable": (lambda: nn.Sequential(
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()), 8,
        {"vector": 1, "mix": 1}),
    # the batch norm folded, the ReLU alone (one op, no kernel of its own) joins the window
    "depthwise_bn_relu": (lambda: nn.Sequential(
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU()), 8,
        {"vector": 1}),
    # the pool taken into the first 1x1 convolution's weight (pool_into_product)
    "squeeze_excite": (_SqueezeExcite, 16, {"mix": 2, "vector": 1}),
    # the ReLU before the max pool runs in the pool's window kernel
    "stem_conv_bn_relu_maxpool": (lambda: nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1)), 3, {"cube": 1, "vector": 1}),
    # the group norm, then the pool with `pool - x`, the scale and the residual add
    "poolformer_mixer": (_TokenMixer, 16, {"vector": 2}),
    # the product with the residual add in its tile; the whole group norm and ReLU; the
    # pool (rows of another length)
    "norm_then_global_pool": (_NormTail, 16, {"mix": 1, "vector": 2}),
    # each 3x3 convolution a cube launch and its folded batch norm and ReLU (the second's
    # with the residual add) a vector kernel: joined, the im2col panel would move several
    # times the bytes of the two apart (conv_panel_growth, 5% by default)
    "basic_block": (lambda: _basic_block(16, 16, 1), 16, {"cube": 2, "vector": 2}),
    # with the bound off, each 3x3 convolution an implicit-GEMM MIX kernel with its epilogue
    "basic_block_joined": (lambda: _basic_block(16, 16, 1), 16, {"mix": 2},
                           "--conv_panel_growth=-1"),
    # downsampling: the strided 1x1 projection stays a convolution (a cube launch) whose
    # folded batch norm joins the second convolution's epilogue as its residual
    "basic_block_downsample": (lambda: _basic_block(8, 16, 2), 8, {"cube": 1, "mix": 2},
                               "--conv_panel_growth=-1"),
    # BiT's block: the weight standardisation folded into the frozen weights; the projection
    # and the first 1x1 convolution read the first norm's output: one launch of two
    # products of one right operand; the 3x3 convolution (read by a group norm) a cube
    # launch; the last 1x1 convolution with the residual add in its tile
    "bit_preact_bottleneck": (lambda: _bit_block(16, 32), 16,
                              {"vector": 3, "cube": 2, "mix": 1}),
    # BiT's stem: the zero pad is the max pool's padding (one window kernel)
    "stem_conv_pad_maxpool": (lambda: nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.ConstantPad2d(1, 0.0),
        nn.MaxPool2d(3, 2)), 3, {"cube": 1, "vector": 1}),
}


@pytest.mark.parametrize("name", BLOCKS)
def test_block_launches(name):
    build, c, want, *flags = BLOCKS[name]
    torch.manual_seed(4)
    m = build().eval()
    for b in m.modules():
        if isinstance(b, nn.BatchNorm2d):
            b.running_mean.uniform_(-1, 1)
            b.running_var.uniform_(0.5, 2)
    run(m, torch.randn(2, c, 10, 9), train=False, flags=flags[0] if flags else "")
    got = {k: v for k, v in gt.stats()["launches"].items() if v}
    assert got == want


def test_a_large_kernel_depthwise_block_is_one_window_kernel():
    """A 19x19 depthwise convolution padded by 9 (a large-kernel network's token mixer) with
    its folded batch norm and ReLU: one window kernel, its input read once, though the
    padding is wider than DataCopyPad pads a row (the padding lives in the copies' rows)."""
    torch.manual_seed(4)
    m = nn.Sequential(nn.Conv2d(8, 8, 19, padding=9, groups=8, bias=False),
                      nn.BatchNorm2d(8), nn.ReLU()).eval()
    m[1].running_mean.uniform_(-1, 1)
    m[1].running_var.uniform_(0.5, 2)
    run(m, torch.randn(2, 8, 12, 16), train=False)
    assert {k: v for k, v in gt.stats()["launches"].items() if v} == {"vector": 1}


def test_one_by_one_convolutions_in_training_stay_convolutions():
    """In training the weights are inputs: the 1x1 convolutions stay convolutions (a cube
    launch each) and the gradients match eager."""
    m = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU(), _Residual())
    run(m, torch.randn(2, 8, 6, 7), train=True)
    assert gt.stats()["launches"]["cube"] >= 2


def test_a_training_norm_over_rows_of_one_channel_needs_no_phases():
    """A training batch norm over [1, C, K] (a weight standardisation's: the statistics of
    each filter) reduces over the axis of one element too: left out, each channel is one row,
    reduced in one pass, where axes (0, 2) were two runs split into phase kernels."""
    import numpy as np

    from graphkernel import Graph, TensorType

    g = Graph("standardise")
    x = g.add_input("w", TensorType((1, 16, 72), "float32"))
    n = g.add_node("BatchNormTraining", [x, g.const(np.ones(16, np.float32)),
                                         g.const(np.zeros(16, np.float32))],
                   {"epsilon": 1e-8, "momentum": 0.0, "axis": 1})
    g.set_outputs(list(n.outputs))
    import graphkernel

    res = graphkernel.compile(g, "--opt_level=2", env={})
    pats = [k.attrs["pattern"] for k in res.graph.nodes if k.op == "GraphKernel"]
    assert pats and not [p for p in pats if "/phase" in p]


def test_a_weight_standardised_convolution_trains_as_eager():
    """BiT's weight-standardised convolution (transformers' own) in a training step: the
    statistics of each filter computed from the weights each step; gradients as eager's."""
    from transformers.models.bit.modeling_bit import WeightStandardizedConv2d

    torch.manual_seed(2)
    m = WeightStandardizedConv2d(8, 16, 3, eps=1e-8)
    run(m, torch.randn(2, 8, 10, 10), train=True)


def test_a_norm_read_by_a_pool_of_other_rows_stays_whole():
    """The group norm's normalisation reads its statistics per group of channels: pushed into
    the global pool's reduction (rows of one channel) the generator could not lay them out,
    so the fusion refuses it with the reason (and the norm is one kernel)."""
    import graphkernel

    m = _NormTail().eval()
    g = gt.export_graph(m, (torch.randn(2, 16, 8, 8),), name="t")
    res = graphkernel.compile(g, "--opt_level=2", env={})
    why = [a.reason for a in res.analyses.fusion_attempts if a.verdict == "rejected"
           and a.pattern.startswith("elemwise_broadcast_bwd")]
    assert any("broadcast in another shape than the rows" in w for w in why)
    assert not res.report.extra["fallbacks"]


class _GRN(nn.Module):
    """ConvNeXt-V2's global response norm on channels-last [N, H, W, C]."""

    def __init__(self, c: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, 1, 1, c))
        self.bias = nn.Parameter(torch.randn(1, 1, 1, c))

    def forward(self, x):
        gx = torch.linalg.vector_norm(x, ord=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.weight * (x * nx) + self.bias + x


@pytest.mark.parametrize("shape", [(2, 7, 5, 24), (1, 4, 4, 16)])
def test_a_global_response_norm_is_one_launch(shape):
    """The norms over H, W, their mean over C and Nx broadcast back over H, W: one vector
    kernel in two passes over each image's rows (reduce_broadcast_back), eager's result; in
    training the gradients are eager's."""
    torch.manual_seed(0)
    m = _GRN(shape[-1])
    run(m, torch.randn(*shape), train=False)
    assert {k: v for k, v in gt.stats()["launches"].items() if v} == {"vector": 1}
    run(m, torch.randn(*shape), train=True)
