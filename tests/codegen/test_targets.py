"""Target spec files: the list of targets, their validation, and the generated code obeying
the facts they carry."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.codegen import targets
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.render import render
from graphkernel.codegen.vector.tiling import align_elems, budget
from graphkernel.errors import ConfigError
from graphkernel.flags import target_names


def test_the_targets_are_the_spec_files(tmp_path, monkeypatch):
    on_disk = sorted(p.stem for p in targets.TARGET_DIR.glob("*.yaml"))
    assert list(target_names()) == on_disk and "ascend910b" in on_disk
    spec = (targets.TARGET_DIR / "ascend910b.yaml").read_text()
    ub = targets.load("ascend910b").ub_bytes
    (tmp_path / "npu_x.yaml").write_text(spec.replace("name: ascend910b", "name: npu_x"))
    monkeypatch.setattr(targets, "TARGET_DIR", tmp_path)
    assert targets.available() == ["npu_x"]
    assert targets.parse(tmp_path / "npu_x.yaml").ub_bytes == ub


BASE = (targets.TARGET_DIR / "ascend910b.yaml").read_text()


@pytest.mark.parametrize("text, message", [
    ("name: [unclosed", "not valid YAML"),
    ("- a list", "a mapping of facts"),
    (BASE.replace("max_repeats: 255", "max_repeats: many"), "max_repeats: Input should be"),
    (BASE.replace("ub_align_bytes: 32", "ub_align_bytes: 24"), "power of two"),
    (BASE.replace("ub_bytes: 196352", "ub_bytes: 196350"), "whole ub_align_bytes"),
    (BASE.replace("aiv_cores: 48", "aiv_cores: 0"), "aiv_cores: Input should be greater"),
    (BASE + "l2_bytes: 1\n", "l2_bytes: Extra inputs are not permitted"),
    (BASE.replace("name: ascend910b", "name: other"), "is not the file's name"),
    (BASE.replace("[ascend910b1,", "[ascend910b1; rm -rf,"), "not a CANN SOC_VERSION name"),
    (BASE.replace("soc_versions: [ascend910b1, ascend910b2, ascend910b2c]", "soc_versions: []"),
     "soc_versions: List should have at least 1 item"),
], ids=["yaml", "list", "type", "align", "ub", "cores", "extra", "name", "soc", "no-soc"])
def test_a_malformed_target_file_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "ascend910b.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        targets.parse(path)
    assert str(path) in str(e.value)


def _softmax_kernel(rows: int, cols: int):
    """A softmax over rows of ``cols`` as one GraphKernel (whole-row reductions, per-row
    values applied to rows: the code paths that issue repeats and Brcb blocks)."""
    from graphkernel.kernels import build_kernel

    g = Graph("softmax")
    x = g.add_input("x", TensorType((rows, cols), "float32"))
    n = lambda op, ins, **a: g.add_node(op, ins, a).output  # noqa: E731
    e = n("Exp", [n("Sub", [x, n("ReduceMax", [x], axis=[1], keep_dims=True)])])
    g.set_outputs([n("Div", [e, n("ReduceSum", [e], axis=[1], keep_dims=True)])])
    g2 = g.copy()
    k = build_kernel(g2, [m for m in g2.nodes if m.op != "Constant"], "one", "test")
    return g, g2, k


def _with(**facts) -> targets.Target:
    return targets.Target.model_validate(targets.load("ascend910b").model_dump() | facts)


def test_the_generated_code_follows_the_target_facts():
    from graphkernel.codegen.legalize import check

    _, _, k = _softmax_kernel(300, 40)
    s = check(k, targets.load("ascend910b"))
    wide = check(k, _with(ub_align_bytes=64, repeat_bytes=512, max_repeats=100))
    src, wsrc = (render(x).files[f"{x.name}.cpp"] for x in (s, wide))
    assert "r0 += 255)" in src and "r0 += 100)" in wsrc and "255)" not in wsrc.replace(
        "pitch <= 255", "")  # the API's 8-bit repeat stride is not a target fact
    assert "8 * 254" in src and "8 * 100" in wsrc   # Brcb: blocks per repeat, even repeats
    assert "(bytes + 63) / 64 * 64" in wsrc and "512 / sizeof(CT)" in wsrc
    low, wlow = lower(s), lower(wide)
    assert budget(wide, wlow).fixed > budget(s, low).fixed
    assert (align_elems(s), align_elems(wide)) == (8, 16)  # fp32 elements per UB block


@pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
def test_a_kernel_for_fewer_repeats_per_instruction_runs_in_the_simulator():
    """max_repeats from the target: instructions over 150 rows per core issue at most 7
    repeats each, and the kernel still matches the interpreter on the simulated device."""
    from graphkernel.bisect import Evaluator
    from graphkernel.codegen.backend import SimBackend
    from graphkernel.codegen.legalize import check
    from graphkernel.interpreter import Interpreter

    g, g2, k = _softmax_kernel(300, 40)
    few = _with(max_repeats=7, aiv_cores=2)
    s = check(k, few)
    assert "r0 += 7)" in render(s).files[f"{s.name}.cpp"]
    backend = SimBackend(g2, {k.name: s})
    backend.spec = few  # two cores: 150 rows each, in one tile
    feeds = {"x": np.random.default_rng(0).standard_normal((300, 40)).astype(np.float32)}
    got = Interpreter(g2, kernel_runner=backend).run(feeds)
    (st,) = backend.stats.values()
    assert st.block_dim == 2 and st.tiling["rt"] >= 150
    j = Evaluator(g, feeds).judge(got)
    assert not j.bad, j.reason
