"""Conv stacks as audio and vision models write them, through torch.compile: a stack of
grouped 1-D convolutions each followed by a LayerNorm over the channels between transposes
and a GELU (data2vec-audio's positional convolutions) is one vector kernel a layer
(channels_last); a global context taken as a mean of a mean (FocalNet) is one reduction that
joins its reader (reduce_merge)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fresh_torch"), pytest.mark.e2e]


class ConvNormLayer(torch.nn.Module):
    def __init__(self, c: int = 32, k: int = 7, groups: int = 4):
        super().__init__()
        self.conv = torch.nn.Conv1d(c, c, k, padding=k // 2, groups=groups)
        self.norm = torch.nn.LayerNorm(c, elementwise_affine=False)

    def forward(self, x):
        x = self.conv(x).transpose(1, 2)
        return torch.nn.functional.gelu(self.norm(x).transpose(1, 2))


class ConvNormStack(torch.nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = torch.nn.ModuleList([ConvNormLayer() for _ in range(layers)])

    def forward(self, x):  # [batch, time, channels] in and out
        x = x.transpose(1, 2)
        for layer in self.layers:
            x = layer(x)
        return x.transpose(1, 2)


class GlobalContext(torch.nn.Module):
    def forward(self, x):
        ctx = x.exp()
        glob = torch.nn.functional.gelu(ctx.mean(2, keepdim=True).mean(3, keepdim=True))
        return ctx * glob


def _compiled(model, x):
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="graphkernel")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    s = gt.stats()
    assert s["fallbacks"] == {} and s["graphs"] == 1, s
    return s["launches"]


@pytest.mark.parametrize("layers", [2, 3])
def test_a_conv_stack_with_channel_norms_is_one_vector_kernel_a_layer(layers):
    torch.manual_seed(0)
    model = ConvNormStack(layers).eval()
    x = torch.randn(2, 23, 32, generator=torch.Generator().manual_seed(0))
    launches = _compiled(model, x)
    assert launches["vector"] == layers and launches["cube"] == layers, launches


def test_a_mean_of_a_mean_joins_its_reader():
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    launches = _compiled(GlobalContext().eval(), x)
    assert sum(launches.values()) == 1, launches
