"""The CNN zoo: convolutional networks built as users build them (library defaults, random
seeded weights, no downloads), for the benchmarks and the tests.

Most come from Hugging Face ``transformers`` configs (their modules are plain ``nn.Conv2d``,
``nn.BatchNorm2d``, pools and activations): ResNet (bottleneck residual blocks), RegNetY
(grouped convolutions with squeeze-and-excitation), MobileNetV1 (depthwise-separable, ReLU6,
TensorFlow "SAME" padding), MobileNetV2 (inverted bottlenecks), EfficientNet (compound
scaled: SiLU, squeeze-and-excitation, a ceil-mode average pool as the pooler), BiT
(weight-standardised convolutions, group norm, a padded max pool) and PoolFormer (average
pooling as the token mixer). Three are written in plain ``torch.nn`` the way torchvision
writes its models: a densely connected network (batch norm, ReLU, 1x1 and 3x3 convolutions,
average-pool transitions, concatenation), a ResNet (max-pool stem, ``AdaptiveAvgPool2d``,
``flatten``), a MobileNetV3 (Hardswish, Hardsigmoid squeeze-and-excitation) and an
EfficientNet (SiLU, Sigmoid squeeze-and-excitation; ``init_like_torchvision`` gives it
torchvision's initialisation for accuracy studies).

    python examples/cnn_models.py        # builds each model and prints its output's shape
    python examples/cnn_models.py --held-out   # the held-out families (not in the zoo)

Every model takes ``[2, 3, 64, 64]`` images and returns its logits (one tensor). Weights are
seeded and given a trained network's statistics (``trained_like``).
"""

from __future__ import annotations

import sys

SEED = 0
SIZE = 64
LABELS = 10


def _images(torch):
    g = torch.Generator().manual_seed(SEED)
    return (torch.rand(2, 3, SIZE, SIZE, generator=g),)


def _tv_models(torch):
    """The plain torch.nn models (torchvision's style): name -> module class."""
    nn = torch.nn

    class DenseLayer(nn.Module):
        def __init__(self, cin: int, growth: int, width: int = 4) -> None:
            super().__init__()
            self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
            self.conv1 = nn.Conv2d(cin, width * growth, 1, bias=False)
            self.norm2, self.relu2 = nn.BatchNorm2d(width * growth), nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(width * growth, growth, 3, padding=1, bias=False)

        def forward(self, feats):
            x = torch.cat(feats, 1)
            return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))

    class DenseBlock(nn.Module):
        def __init__(self, layers: int, cin: int, growth: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth)
                                        for i in range(layers))

        def forward(self, x):
            feats = [x]
            for layer in self.layers:
                feats.append(layer(feats))
            return torch.cat(feats, 1)

    class Transition(nn.Sequential):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__(nn.BatchNorm2d(cin), nn.ReLU(inplace=True),
                             nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2, 2))

    class DenseNet(nn.Module):
        """DenseNet-BC: stem, two dense blocks of three layers (growth 8), a transition."""

        def __init__(self, growth: int = 8, stem: int = 16, layers=(3, 3)) -> None:
            super().__init__()
            mods = [nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem),
                    nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
            c = stem
            for i, n in enumerate(layers):
                mods.append(DenseBlock(n, c, growth))
                c += n * growth
                if i + 1 < len(layers):
                    mods.append(Transition(c, c // 2))
                    c //= 2
            mods.append(nn.BatchNorm2d(c))
            self.features = nn.Sequential(*mods)
            self.classifier = nn.Linear(c, LABELS)

        def forward(self, x):
            x = torch.relu(self.features(x))
            x = torch.nn.functional.adaptive_avg_pool2d(x, (1, 1))
            return self.classifier(torch.flatten(x, 1))

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1, self.relu = nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet(nn.Module):
        """torchvision's ResNet-18 layout at a small width: two blocks per stage."""

        block = BasicBlock  # (its residual block, for tests that build one alone)

        def __init__(self, widths=(16, 32, 64)) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
            self.bn1, self.relu = nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            blocks, c = [], widths[0]
            for i, w in enumerate(widths):
                blocks += [BasicBlock(c, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
                c = w
            self.layers = nn.Sequential(*blocks)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(c, LABELS)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.avgpool(self.layers(x))
            return self.fc(torch.flatten(x, 1))

    class SqueezeExcitation(nn.Module):
        def __init__(self, c: int, squeeze: int) -> None:
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
            self.activation, self.scale_activation = nn.ReLU(), nn.Hardsigmoid()

        def forward(self, x):
            s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
            return s * x

    def conv_bn_act(cin, cout, k, stride=1, groups=1, act=nn.Hardswish):
        mods = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
        return nn.Sequential(*mods, act(inplace=True)) if act else nn.Sequential(*mods)

    class InvertedResidual(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, stride) -> None:
            super().__init__()
            self.use_res = stride == 1 and cin == cout
            layers = [] if exp == cin else [conv_bn_act(cin, exp, 1, act=act)]
            layers.append(conv_bn_act(exp, exp, k, stride, groups=exp, act=act))
            if se:
                layers.append(SqueezeExcitation(exp, max(8, exp // 4)))
            layers.append(conv_bn_act(exp, cout, 1, act=None))
            self.block = nn.Sequential(*layers)

        def forward(self, x):
            y = self.block(x)
            return y + x if self.use_res else y

    class MobileNetV3(nn.Module):
        """torchvision's MobileNetV3-Small layout, first blocks only."""

        SETTING = ((16, 3, 16, 16, True, nn.ReLU, 2), (16, 3, 72, 24, False, nn.ReLU, 2),
                   (24, 3, 88, 24, False, nn.ReLU, 1), (24, 5, 96, 40, True, nn.Hardswish, 2),
                   (40, 5, 240, 40, True, nn.Hardswish, 1))

        def __init__(self) -> None:
            super().__init__()
            layers = [conv_bn_act(3, 16, 3, 2)]
            layers += [InvertedResidual(*s) for s in self.SETTING]
            layers.append(conv_bn_act(40, 240, 1))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(240, 128), nn.Hardswish(inplace=True),
                                            nn.Dropout(0.2, inplace=True),
                                            nn.Linear(128, LABELS))

        def forward(self, x):
            x = self.avgpool(self.features(x))
            return self.classifier(torch.flatten(x, 1))

    class MBConv(nn.Module):
        """torchvision's EfficientNet block: expand, depthwise, SiLU squeeze-and-excitation
        with a Sigmoid scale, project; the residual (stochastic depth: the identity in
        inference)."""

        def __init__(self, cin, k, stride, ratio, cout) -> None:
            super().__init__()
            self.use_res = stride == 1 and cin == cout
            exp = cin * ratio
            layers = [] if ratio == 1 else [conv_bn_act(cin, exp, 1, act=nn.SiLU)]
            layers.append(conv_bn_act(exp, exp, k, stride, groups=exp, act=nn.SiLU))
            se = SqueezeExcitation(exp, max(1, cin // 4))
            se.activation, se.scale_activation = nn.SiLU(), nn.Sigmoid()
            layers += [se, conv_bn_act(exp, cout, 1, act=None)]
            self.block = nn.Sequential(*layers)

        def forward(self, x):
            y = self.block(x)
            return y + x if self.use_res else y

    class EfficientNet(nn.Module):
        """torchvision's EfficientNet-B0 layout at half width, its first four stages, with
        torchvision's initialisation (``init_like_torchvision``)."""

        SETTING = ((1, 3, 1, 16, 8, 1), (6, 3, 2, 8, 12, 2), (6, 5, 2, 12, 20, 2),
                   (6, 3, 2, 20, 40, 2))  # (ratio, kernel, stride, in, out, layers)

        def __init__(self) -> None:
            super().__init__()
            layers = [conv_bn_act(3, 16, 3, 2, act=nn.SiLU)]
            for ratio, k, stride, cin, cout, n in self.SETTING:
                for i in range(n):
                    layers.append(MBConv(cin if i == 0 else cout, k, stride if i == 0 else 1,
                                         ratio, cout))
            layers.append(conv_bn_act(40, 160, 1, act=nn.SiLU))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(160, LABELS))

        def forward(self, x):
            x = self.avgpool(self.features(x))
            return self.classifier(torch.flatten(x, 1))

    return {"densenet": DenseNet, "tv_resnet": ResNet, "tv_mobilenet_v3": MobileNetV3,
            "tv_efficientnet": EfficientNet}


def _held_out_models(torch):
    """Further CNN families written as torchvision writes them, measured apart from the zoo
    (``select(..., held_out=True)``): the mechanisms are tuned on the zoo, these check that
    they carry over. name -> module class."""
    nn = torch.nn

    def cbr(cin, cout, k, stride=1, groups=1, relu=True):
        mods = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout)]
        return nn.Sequential(*mods, nn.ReLU(inplace=True)) if relu else nn.Sequential(*mods)

    class Bottleneck(nn.Module):
        """torchvision's ResNeXt bottleneck: 1x1, grouped 3x3, 1x1, the residual."""

        def __init__(self, cin, width, cout, stride, groups) -> None:
            super().__init__()
            self.body = nn.Sequential(cbr(cin, width, 1), cbr(width, width, 3, stride, groups),
                                      cbr(width, cout, 1, relu=False))
            self.down = None if stride == 1 and cin == cout else cbr(cin, cout, 1, stride,
                                                                     relu=False)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + (x if self.down is None else self.down(x)))

    class ResNeXt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(cbr(3, 16, 7, 2), nn.MaxPool2d(3, 2, 1))
            self.layers = nn.Sequential(Bottleneck(16, 16, 32, 1, 4),
                                        Bottleneck(32, 32, 64, 2, 4),
                                        Bottleneck(64, 64, 128, 2, 4))
            self.fc = nn.Linear(128, LABELS)

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1)
            return self.fc(torch.flatten(x, 1))

    class ShuffleUnit(nn.Module):
        """torchvision's ShuffleNetV2 unit: split (stride 1) or both branches (stride 2),
        depthwise 3x3, concatenation, channel shuffle."""

        def __init__(self, cin, cout, stride) -> None:
            super().__init__()
            self.stride = stride
            half = cout // 2
            if stride > 1:
                self.branch1 = nn.Sequential(cbr(cin, cin, 3, stride, cin, relu=False),
                                             cbr(cin, half, 1))
            bin_ = cin if stride > 1 else half
            self.branch2 = nn.Sequential(cbr(bin_, half, 1),
                                         cbr(half, half, 3, stride, half, relu=False),
                                         cbr(half, half, 1))

        def forward(self, x):
            if self.stride == 1:
                x1, x2 = x.chunk(2, dim=1)
                out = torch.cat((x1, self.branch2(x2)), dim=1)
            else:
                out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
            n, c, h, w = out.shape
            out = out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous()
            return out.view(n, c, h, w)

    class ShuffleNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(cbr(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1))
            self.stages = nn.Sequential(ShuffleUnit(24, 48, 2), ShuffleUnit(48, 48, 1),
                                        ShuffleUnit(48, 96, 2), ShuffleUnit(96, 96, 1))
            self.conv5 = cbr(96, 128, 1)
            self.fc = nn.Linear(128, LABELS)

        def forward(self, x):
            x = self.conv5(self.stages(self.stem(x)))
            return self.fc(x.mean([2, 3]))

    class Fire(nn.Module):
        def __init__(self, cin, squeeze, expand) -> None:
            super().__init__()
            self.squeeze = nn.Conv2d(cin, squeeze, 1)
            self.e1, self.e3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3,
                                                                        padding=1)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            x = self.relu(self.squeeze(x))
            return torch.cat([self.relu(self.e1(x)), self.relu(self.e3(x))], 1)

    class SqueezeNet(nn.Module):
        """torchvision's SqueezeNet 1.1 layout, narrower: ceil-mode max pools, fire modules,
        a 1x1 convolution classifier with ReLU and a global average pool."""

        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 32, 3, 2), nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, ceil_mode=True), Fire(32, 8, 16), Fire(32, 8, 16),
                nn.MaxPool2d(3, 2, ceil_mode=True), Fire(32, 16, 32), Fire(64, 16, 32))
            self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(64, LABELS, 1),
                                            nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))

        def forward(self, x):
            return torch.flatten(self.classifier(self.features(x)), 1)

    class VGG(nn.Module):
        """torchvision's VGG-11 with batch norm, narrower: conv-BN-ReLU stacks and max
        pools, an adaptive average pool and the classifier's linear layers."""

        def __init__(self, cfg=(16, "M", 32, "M", 64, 64, "M", 128, 128, "M")) -> None:
            super().__init__()
            layers, c = [], 3
            for v in cfg:
                if v == "M":
                    layers.append(nn.MaxPool2d(2, 2))
                else:
                    layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v),
                               nn.ReLU(inplace=True)]
                    c = v
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
            self.classifier = nn.Sequential(nn.Linear(c * 4, 64), nn.ReLU(True), nn.Dropout(),
                                            nn.Linear(64, LABELS))

        def forward(self, x):
            return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))

    class MnasBlock(nn.Module):
        def __init__(self, cin, cout, k, stride, exp) -> None:
            super().__init__()
            mid = cin * exp
            self.res = cin == cout and stride == 1
            self.layers = nn.Sequential(cbr(cin, mid, 1), cbr(mid, mid, k, stride, mid),
                                        cbr(mid, cout, 1, relu=False))

        def forward(self, x):
            return self.layers(x) + x if self.res else self.layers(x)

    class MNASNet(nn.Module):
        """torchvision's MNASNet layout (inverted residuals with ReLU, no
        squeeze-and-excitation), first stages at a small width."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(
                cbr(3, 16, 3, 2), cbr(16, 16, 3, 1, 16), cbr(16, 8, 1, relu=False),
                MnasBlock(8, 12, 3, 2, 3), MnasBlock(12, 12, 3, 1, 3),
                MnasBlock(12, 20, 5, 2, 3), MnasBlock(20, 20, 5, 1, 3),
                MnasBlock(20, 40, 5, 2, 6), cbr(40, 160, 1))
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(160, LABELS))

        def forward(self, x):
            return self.classifier(self.layers(x).mean([2, 3]))

    class Inception(nn.Module):
        """torchvision's GoogLeNet inception block: 1x1; 1x1 then 3x3; 1x1 then 3x3; a 3x3
        max pool (stride 1, ceil mode) then 1x1; concatenated."""

        def __init__(self, cin, c1, c3r, c3, c5r, c5, pp) -> None:
            super().__init__()
            self.b1 = cbr(cin, c1, 1)
            self.b2 = nn.Sequential(cbr(cin, c3r, 1), cbr(c3r, c3, 3))
            self.b3 = nn.Sequential(cbr(cin, c5r, 1), cbr(c5r, c5, 3))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), cbr(cin, pp, 1))

        def forward(self, x):
            return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)

    class GoogLeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(cbr(3, 16, 7, 2), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      cbr(16, 16, 1), cbr(16, 32, 3),
                                      nn.MaxPool2d(3, 2, ceil_mode=True))
            self.blocks = nn.Sequential(Inception(32, 8, 12, 16, 4, 8, 8),
                                        Inception(40, 16, 16, 24, 4, 12, 12),
                                        nn.MaxPool2d(3, 2, ceil_mode=True),
                                        Inception(64, 24, 12, 32, 4, 8, 8))
            self.fc = nn.Linear(72, LABELS)

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
            return self.fc(torch.flatten(x, 1))

    class XBlock(nn.Module):
        """torchvision's RegNetX block: 1x1, grouped 3x3 (groups of 8 channels), 1x1, the
        residual (no squeeze-and-excitation)."""

        def __init__(self, cin, cout, stride) -> None:
            super().__init__()
            self.f = nn.Sequential(cbr(cin, cout, 1), cbr(cout, cout, 3, stride, cout // 8),
                                   cbr(cout, cout, 1, relu=False))
            self.proj = None if stride == 1 and cin == cout else cbr(cin, cout, 1, stride,
                                                                     relu=False)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.f(x) + (x if self.proj is None else self.proj(x)))

    class RegNetX(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = cbr(3, 16, 3, 2)
            self.trunk = nn.Sequential(XBlock(16, 24, 2), XBlock(24, 56, 2), XBlock(56, 56, 1),
                                       XBlock(56, 152, 2))
            self.fc = nn.Linear(152, LABELS)

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.trunk(self.stem(x)), 1)
            return self.fc(torch.flatten(x, 1))

    class SE(nn.Module):
        """timm's squeeze-and-excitation: a global mean, 1x1 reduce, activation, 1x1
        expand, gate."""

        def __init__(self, c, r, act, gate) -> None:
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)
            self.act, self.gate = act(), gate()

        def forward(self, x):
            s = self.act(self.reduce(x.mean((2, 3), keepdim=True)))
            return x * self.gate(self.expand(s))

    class MixBlock(nn.Module):
        """timm's MixNet block: expand, depthwise convolutions of mixed kernel sizes on
        channel groups (split, concatenated), SiLU, squeeze-and-excitation, project."""

        def __init__(self, cin, cout, stride, ks=(3, 5)) -> None:
            super().__init__()
            exp = cin * 4
            self.expand = nn.Sequential(nn.Conv2d(cin, exp, 1, bias=False), nn.BatchNorm2d(exp),
                                        nn.SiLU())
            self.split = [exp // len(ks)] * len(ks)
            self.dw = nn.ModuleList(nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False)
                                    for c, k in zip(self.split, ks, strict=True))
            self.bn, self.act = nn.BatchNorm2d(exp), nn.SiLU()
            self.se = SE(exp, cin // 2, nn.SiLU, nn.Sigmoid)
            self.project = nn.Sequential(nn.Conv2d(exp, cout, 1, bias=False),
                                         nn.BatchNorm2d(cout))
            self.res = stride == 1 and cin == cout

        def forward(self, x):
            y = self.expand(x)
            y = torch.cat([m(t) for m, t in zip(self.dw, y.split(self.split, 1), strict=True)],
                          1)
            y = self.project(self.se(self.act(self.bn(y))))
            return y + x if self.res else y

    class MixNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = cbr(3, 16, 3, 2)
            self.blocks = nn.Sequential(MixBlock(16, 24, 2), MixBlock(24, 24, 1),
                                        MixBlock(24, 40, 2, (3, 5, 7)), MixBlock(40, 40, 1))
            self.head = cbr(40, 160, 1)
            self.fc = nn.Linear(160, LABELS)

        def forward(self, x):
            return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))

    class Ghost(nn.Module):
        """GhostNet's module: a 1x1 convolution to half the channels, a cheap depthwise 3x3
        of them, both concatenated."""

        def __init__(self, cin, cout, relu=True) -> None:
            super().__init__()
            half = cout // 2
            self.primary = cbr(cin, half, 1, relu=relu)
            self.cheap = cbr(half, half, 3, 1, half, relu=relu)

        def forward(self, x):
            y = self.primary(x)
            return torch.cat([y, self.cheap(y)], 1)

    class GhostBottleneck(nn.Module):
        def __init__(self, cin, mid, cout, stride, se) -> None:
            super().__init__()
            self.ghost1 = Ghost(cin, mid)
            self.dw = cbr(mid, mid, 3, stride, mid, relu=False) if stride > 1 else None
            self.se = SE(mid, mid // 4, nn.ReLU, nn.Hardsigmoid) if se else None
            self.ghost2 = Ghost(mid, cout, relu=False)
            self.short = None if stride == 1 and cin == cout else nn.Sequential(
                cbr(cin, cin, 3, stride, cin, relu=False), cbr(cin, cout, 1, relu=False))

        def forward(self, x):
            y = self.ghost1(x)
            y = self.dw(y) if self.dw is not None else y
            y = self.se(y) if self.se is not None else y
            return self.ghost2(y) + (x if self.short is None else self.short(x))

    class GhostNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = cbr(3, 16, 3, 2)
            self.blocks = nn.Sequential(GhostBottleneck(16, 16, 16, 1, False),
                                        GhostBottleneck(16, 48, 24, 2, False),
                                        GhostBottleneck(24, 72, 40, 2, True),
                                        GhostBottleneck(40, 120, 40, 1, True))
            self.head = cbr(40, 160, 1)
            self.fc = nn.Linear(160, LABELS)

        def forward(self, x):
            return self.fc(nn.functional.adaptive_avg_pool2d(self.head(self.blocks(
                self.stem(x))), 1).flatten(1))

    return {"ho_resnext": ResNeXt, "ho_shufflenet_v2": ShuffleNetV2,
            "ho_squeezenet": SqueezeNet, "ho_vgg": VGG, "ho_mnasnet": MNASNet,
            "ho_googlenet": GoogLeNet, "ho_regnet_x": RegNetX, "ho_mixnet": MixNet,
            "ho_ghostnet": GhostNet}


def init_like_torchvision(model):
    """torchvision's initialisation of its CNNs: convolutions Kaiming-normal (fan out),
    batch norms the identity, linear layers uniform(±1/sqrt(out features)); the signal grows
    with depth (outputs of hundreds on a random image)."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    torch.nn.init.zeros_(m.bias)
            elif isinstance(m, torch.nn.BatchNorm2d):
                torch.nn.init.ones_(m.weight)
                torch.nn.init.zeros_(m.bias)
            elif isinstance(m, torch.nn.Linear):
                r = 1.0 / m.out_features ** 0.5
                torch.nn.init.uniform_(m.weight, -r, r)
                torch.nn.init.zeros_(m.bias)
    return model


def trained_like(model, seed: int = SEED):
    """Weights with the statistics of a trained network, seeded: convolutions scaled to keep
    the signal's variance (Kaiming, fan in), every batch norm with its own scale, shift and
    running statistics. A library's initialisation (the normal(0, 0.02) of the Hugging Face
    vision models, a batch norm that is the identity in inference) lets the signal of a
    deep network vanish and makes every batch norm the same affine: outputs of ~1e-30 that
    any compiler "matches", and a folded batch norm that nothing checks."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d | torch.nn.Conv1d):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.2 - 0.1)
            elif isinstance(m, torch.nn.BatchNorm2d | torch.nn.BatchNorm1d):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return model


def builders() -> dict:
    """name -> (build model, example inputs); each model returns its logits."""
    import torch
    import transformers as T
    from transformers.models.efficientnet.modeling_efficientnet import round_filters

    class Logits(torch.nn.Module):
        """A transformers image classifier returning its logits only."""

        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(pixel_values=x).logits

    def hf(cfg_cls, model_cls, **kw):
        def build():
            torch.manual_seed(SEED)
            cfg = cfg_cls(num_labels=LABELS, **kw)
            if cfg_cls is T.EfficientNetConfig:  # the top convolution's width, scaled
                cfg.hidden_dim = round_filters(cfg, 1280)
            return trained_like(Logits(model_cls(cfg).eval()))
        return build, lambda: _images(torch)

    def tv(cls):
        def build():
            torch.manual_seed(SEED)
            return trained_like(cls().eval())
        return build, lambda: _images(torch)

    zoo = {
        "resnet": hf(T.ResNetConfig, T.ResNetForImageClassification, embedding_size=16,
                     hidden_sizes=[32, 64], depths=[1, 1]),
        "regnet": hf(T.RegNetConfig, T.RegNetForImageClassification, embedding_size=16,
                     hidden_sizes=[16, 32], depths=[1, 1], groups_width=8),
        "mobilenet_v1": hf(T.MobileNetV1Config, T.MobileNetV1ForImageClassification,
                           image_size=SIZE, depth_multiplier=0.25),
        "mobilenet_v2": hf(T.MobileNetV2Config, T.MobileNetV2ForImageClassification,
                           image_size=SIZE, depth_multiplier=0.35),
        "efficientnet": hf(T.EfficientNetConfig, T.EfficientNetForImageClassification,
                           image_size=SIZE, width_coefficient=0.25, depth_coefficient=0.3),
        "bit": hf(T.BitConfig, T.BitForImageClassification, embedding_size=16,
                  hidden_sizes=[16, 32], depths=[1, 1], num_groups=4),
        "poolformer": hf(T.PoolFormerConfig, T.PoolFormerForImageClassification,
                         hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1]),
    }
    zoo.update({name: tv(cls) for name, cls in _tv_models(torch).items()})
    return zoo


def held_out_builders() -> dict:
    """name -> (build model, example inputs) of the held-out families (``_held_out_models``),
    built as the zoo's torchvision-style models are (seeded, ``trained_like``)."""
    import torch

    def build(cls):
        def make():
            torch.manual_seed(SEED)
            return trained_like(cls().eval())
        return make, lambda: _images(torch)

    return {name: build(cls) for name, cls in _held_out_models(torch).items()}


def select(names, held_out: bool = False) -> dict | None:
    """The CNN zoo's builders named in ``names`` (every one when empty; ``held_out``: the
    held-out families instead); None, after printing what is accepted, when a name is not
    in it."""
    zoo = held_out_builders() if held_out else builders()
    unknown = sorted(set(names) - set(zoo))
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)} (accepted: {', '.join(zoo)})",
              file=sys.stderr)
        return None
    return {k: v for k, v in zoo.items() if not names or k in names}


if __name__ == "__main__":
    import torch

    held = "--held-out" in sys.argv
    chosen = select([a for a in sys.argv[1:] if a != "--held-out"], held_out=held)
    if chosen is None:
        sys.exit(2)
    for name, (build, inputs) in chosen.items():
        with torch.no_grad():
            print(name, tuple(build()(*inputs()).shape))
