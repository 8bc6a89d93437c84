"""benchmarks/zoo_training.py's check of a training step: a loss whose gradients are not
rounding noise, a model whose eager step raises labelled as such, a model's inputs that do
not depend on which models were measured before it, and gradients judged when torch's own
path (aot_eager) cannot take the step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks import zoo_training  # noqa: E402
from graphkernel.torch import step_target  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]


class _Normed(torch.nn.Module):
    """A product and a LayerNorm at its initial weight 1 and bias 0, the last op of most
    encoders (ViT, DeiT, BERT): mean(out²) is var / (var + eps), a constant up to eps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.norm = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16, eps=1e-12)

    def forward(self, x):
        return self.norm(self.proj(x))


def test_the_step_gradients_before_a_final_layernorm_are_not_of_order_eps():
    """In float64, so that only the loss decides: out.pow(2).mean() gave the product's
    weight a gradient of ~1e-12, below the atol (a backward returning zeros matched)."""
    model = _Normed().double()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, grads = zoo_training._step(model, model, (x,))
    assert float(grads["proj.weight"].abs().max()) > 100 * zoo_training.ATOL
    assert float(grads["proj.bias"].abs().max()) > 100 * zoo_training.ATOL
    # the same target on both sides of the comparison, widened exactly for the float64 twin
    out = torch.zeros(3, 5)
    assert torch.equal(step_target(out), step_target(out))
    assert torch.equal(step_target(out.double()), step_target(out).double())


class _RaisesEagerly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        raise RuntimeError("shape '[2, 16, 4, 8]' is invalid for input of size 768")


def test_a_model_whose_eager_step_raises_is_not_graphkernels_failure(monkeypatch, capsys):
    build, inputs = _RaisesEagerly, lambda: (torch.ones(2, 4),)
    with pytest.raises(zoo_training.EagerFails, match="is invalid for input of size 768"):
        zoo_training.measure(build, inputs)
    import export_models

    monkeypatch.setattr(export_models, "select",
                        lambda names, attn, more=False: {"raiser": (build, inputs)})
    monkeypatch.setattr(export_models, "trainable", lambda model: True)
    assert zoo_training.main(["--attn", "eager", "raiser"]) == 0
    out = capsys.readouterr().out
    assert "raiser           eager eager fails (not compiled): RuntimeError" in out
    assert "does not compile" not in out
    assert "gradients differing because of graphkernel: none" in out
    assert "eager step raises (no comparison; not counted as graphkernel's): raiser (eager): " \
        "RuntimeError: shape '[2, 16, 4, 8]' is invalid" in out


def test_a_zoo_models_inputs_do_not_depend_on_the_models_drawn_before():
    pytest.importorskip("transformers")
    import export_models

    for attn in ("sdpa", "eager"):
        zoo = export_models.builders(attn) | export_models.families(attn)
        alone = {k: zoo[k][1]() for k in ("deit", "vit", "swin", "wav2vec2")}
        for _, inputs in zoo.values():
            inputs()
        for name, want in alone.items():
            for a, b in zip(zoo[name][1](), want, strict=True):
                assert torch.equal(a, b), (attn, name)


def test_a_difference_is_judged_when_torchs_own_path_cannot_take_the_step(monkeypatch):
    """The judge's aot_eager step (torch's path with graphkernel off) may raise where eager
    and graphkernel run (Doge's backward: a view of a non-contiguous gradient): the
    gradients that differ are then graphkernel's, the model is not "does not compile"."""
    real = zoo_training._compiled_step

    def step(model, args, backend):
        if backend == "aot_eager":
            raise RuntimeError("view size is not compatible with input tensor's size")
        out, grads = real(model, args, backend)
        return out, {k: g + 1.0 for k, g in grads.items()}  # every gradient off by 1

    monkeypatch.setattr(zoo_training, "_compiled_step", step)
    r = zoo_training.measure(_Normed, lambda: (torch.ones(4, 8),))
    assert r["differ"] and set(r["judged"].values()) == {"graphkernel's"}


class _ConvNorm(torch.nn.Module):
    """A convolution and a batch norm: running statistics to judge."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.norm = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.norm(self.conv(x))


def test_running_statistics_are_judged_against_torchs_other_fp32_paths_too(monkeypatch):
    """A running statistic that differs from eager's is graphkernel's only when it is more
    than twice as far from a float64 twin's as the farthest of torch's fp32 paths (eager,
    its math attention, a convolution network in channels_last): the gradients' yardstick.
    Eager's own distance alone would blame another valid summation order."""
    model = _ConvNorm().train()
    args = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)
    exact = dict(zoo_training._float64_steps(model, args, 2).named_buffers())
    ours = _ConvNorm().train()
    for _ in range(2):
        zoo_training._step(ours, ours, args)
    off = torch.tensor([1e-4, -1e-4, 1e-4, -1e-4], dtype=torch.float64)
    with torch.no_grad():
        ours.norm.running_mean.copy_(exact["norm.running_mean"] + off)
    # torch's own paths within fp32 noise of float64: a difference of 1e-4 is graphkernel's
    assert zoo_training._buffers_differing(model, ours, args) == ["norm.running_mean"]
    # another fp32 path as far (0.6x ours): the difference is noise
    other = {k: v.clone() for k, v in exact.items()}
    other["norm.running_mean"] = exact["norm.running_mean"] + 0.6 * off
    seen = []
    monkeypatch.setattr(zoo_training, "_other_buffers",
                        lambda before, a: seen.append(before) or [other])
    assert zoo_training._buffers_differing(model, ours, args) == [] and seen == [model]
    other["norm.running_mean"] = exact["norm.running_mean"] + 0.4 * off  # (2.5x ours)
    assert zoo_training._buffers_differing(model, ours, args) == ["norm.running_mean"]


def test_torchs_other_paths_for_the_statistics_include_channels_last_for_convolutions():
    model = _ConvNorm().train()
    args = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)
    paths = zoo_training._other_buffers(model, args)
    assert len(paths) == 2 and all("norm.running_var" in p for p in paths)
    assert len(zoo_training._other_buffers(_Normed().train(), (torch.ones(4, 8),))) == 1


def test_an_output_is_judged_against_torchs_other_fp32_paths_too(monkeypatch):
    """A training step's output that differs from eager's is noise when it is no further
    from a float64 twin's than twice the farthest of torch's fp32 paths."""
    args = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)
    m64 = _ConvNorm().train().double()
    want64 = zoo_training._step(m64, m64, [args[0].double()])[0]
    off = torch.full_like(want64, 1e-3)  # beyond allclose

    def step(model, a, backend):  # eager's gradients, an output 1e-3 from float64
        _, grads = zoo_training._step(model, model, a)
        return (want64 + off).float(), grads

    monkeypatch.setattr(zoo_training, "_compiled_step", step)
    assert zoo_training.measure(_ConvNorm, lambda: args)["forward"] == "DIFF"
    monkeypatch.setattr(zoo_training, "_other_steps",
                        lambda model, a: [((want64 + 0.6 * off).float(), {})])
    assert zoo_training.measure(_ConvNorm, lambda: args)["forward"] == "noise"
