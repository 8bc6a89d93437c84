"""The model zoo (examples/models, exported from Hugging Face architectures) compiles at every
opt_level and matches eager PyTorch; torch.compile with the graphkernel backend works on every
zoo model."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import graphkernel
from graphkernel.fileio import load_npz
from graphkernel.frontends import load_model
from graphkernel.interpreter import Interpreter

pytestmark = pytest.mark.e2e  # torch.compile of whole models

ZOO = Path(__file__).resolve().parent.parent / "examples" / "models"
NAMES = sorted(p.stem for p in ZOO.glob("*.json"))


def test_zoo_is_complete():
    assert {"gpt2", "bert", "llama", "qwen2", "t5_encoder", "vit", "whisper_encoder"} <= \
        set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_compiles_at_every_level_and_matches_eager(name):
    g = load_model(ZOO / f"{name}.json")
    feeds = load_npz(ZOO / f"{name}_inputs.npz")
    expected = next(iter(load_npz(ZOO / f"{name}_expected.npz").values()))
    kernels = []
    for level in range(4):
        res = graphkernel.compile(g, f"--opt_level={level}", env={})
        res.graph.validate()
        got = Interpreter(res.graph).run(feeds)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5, err_msg=f"level {level}")
        kernels.append(res.report.extra["kernels_fused"])
    assert kernels[2] < kernels[0]  # fusion reduced the launches


def test_torch_compile_on_every_zoo_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(ZOO.parent))
    from export_models import builders

    warnings.simplefilter("ignore")
    for name, (build, inputs) in builders().items():
        torch._dynamo.reset()
        model, args = build(), inputs()
        with torch.no_grad():
            want = model(*args)
            got = torch.compile(model, backend="graphkernel")(*args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5, msg=name)
