"""torch.compile's dumps say where they went and never overwrite another process's;
export_graph takes a stock causal LM as transformers builds it."""

from __future__ import annotations

import itertools
import json
import logging
import os

import pytest

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402
from graphkernel.errors import FrontendError  # noqa: E402
from graphkernel.frontends import torch_backend  # noqa: E402

pytestmark = pytest.mark.e2e  # torch.compile and torch.export of modules


def test_dumps_do_not_overwrite_another_process_and_the_log_says_where(tmp_path, monkeypatch,
                                                                       caplog):
    monkeypatch.setattr(torch_backend, "_COUNTER", itertools.count(1))
    monkeypatch.setattr(torch_backend._STATS, "index", {})
    theirs = tmp_path / "autofused_1"  # another process's dumps, made first
    theirs.mkdir()
    (theirs / "report.json").write_text("theirs")
    (tmp_path / "index.json").write_text(json.dumps(
        {"graphs": [{"name": "autofused_1", "dir": "autofused_1", "pid": 1}]}))
    opts = {"flags": f"--opt_level=1 --dump_as_text --debug_dir={tmp_path}"}
    with caplog.at_level(logging.WARNING, logger="graphkernel.torch"), torch.no_grad():
        f = torch.compile(lambda x: torch.relu(x * 2 + 1), backend="graphkernel", options=opts)
        f(torch.rand(4, 8))
    assert (theirs / "report.json").read_text() == "theirs"  # untouched
    mine = tmp_path / f"autofused_1_{os.getpid()}"
    assert (mine / "report.json").exists()
    index = json.loads((tmp_path / "index.json").read_text())["graphs"]
    assert {(e["dir"], e["pid"]) for e in index} == {("autofused_1", 1),
                                                    (mine.name, os.getpid())}
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"this one: {mine}" in said and str(tmp_path) in said


def test_export_graph_of_a_stock_causal_lm():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100,
                                  n_positions=16, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)  # use_cache=True, as transformers builds it
    assert model.config.use_cache is True
    g = gt.export_graph(model, [torch.randint(0, 100, (1, 8))])
    assert len(g.outputs) == 1 and g.outputs[0].type.shape[-1] == 100  # the logits
    assert model.config.use_cache is True  # the user's model is left as it was


def test_export_graph_names_what_torch_export_cannot_trace():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return {"y": x + 1, "note": object()}

    with pytest.raises(FrontendError, match=r"export_graph\(Odd\): torch.export cannot trace"):
        gt.export_graph(Odd(), [torch.rand(2)])
