"""CLI: flags, passes, compile — including the commands the README documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from graphkernel.cli import main

pytestmark = pytest.mark.e2e  # the CLI in a subprocess

EX = "examples/layernorm_residual.json"


def gk(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOFUSE", "MS_DEV"))}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "graphkernel.cli", *args], capture_output=True,
                          text=True, env=e)


def test_passes_by_level():
    one = gk("passes", "--flags", "--opt_level=1")
    three = gk("passes", "--flags", "--opt_level=3")
    assert one.returncode == three.returncode == 0
    on1 = {ln.split()[2] for ln in one.stdout.splitlines()[2:] if ln.split()[4] == "on"}
    on3 = {ln.split()[2] for ln in three.stdout.splitlines()[2:] if ln.split()[4] == "on"}
    assert on1 == {"validate", "axis_normalize", "expand", "dce:1", "dce:2", "cluster", "split",
                   "codegen"}
    assert on3 == on1 | {"constant_fold", "arith_simplify", "cse", "reshape_elim",
                         "promote_precision", "window_fusion", "conv_fusion",
                         "transpose_elim", "channels_last", "concat_sink", "cast_elim",
                         "attention", "attention_sinks", "conv_bn_fold", "conv_matmul",
                         "scan", "moe_routing",
                         "slice_phases",
                         "matvec", "scan_loop", "product_transpose", "transpose_hoist",
                         "transpose_view",
                         "product_broadcast", "split_slices", "scan_prologue",
                         "interleaved_columns", "pool_into_product", "scatter_slices",
                         "product_zero_blocks", "reduce_merge", "movement_gather",
                         "small_ints", "trisolve",
                         "rotary_pairs", "rotary_halves",
                         "recompute", "sibling_fusion", "parallel_fusion",
                         "super_kernel", "matmul_group"}
    assert "level 2 > opt_level 1" in one.stdout


def test_compile_with_env_flags_writes_report_and_dumps(tmp_path):
    out = tmp_path / "out"
    r = gk("compile", EX, "-o", str(out),
           env={"AUTOFUSE_FLAGS": "--opt_level=2;--disable_pass=cse --dump_as_text"})
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    cse = next(p for p in rep["passes"] if p["name"] == "cse")
    assert not cse["ran"] and cse["reason"] == "disabled by --disable_pass=cse (env AUTOFUSE_FLAGS)"
    assert rep["flags"]["disable_pass"]["origin"] == "env AUTOFUSE_FLAGS"
    files = sorted(p.name for p in out.iterdir())
    assert "flags.json" in files and "0000_input.txt" in files
    assert any(f.endswith("_preprocess_axis_normalize.txt") for f in files)
    assert not any("_cse" in f for f in files)
    assert "cse" in r.stdout and "off" in r.stdout


def test_flags_typo_exits_2_with_suggestion():
    r = gk("flags", "--flags", "--disable_pas=cse")
    assert r.returncode == 2
    assert "did you mean 'disable_pass'" in r.stderr and "Traceback" not in r.stderr


def test_flags_shows_origins(capsys, tmp_path, monkeypatch):
    (tmp_path / "f.yaml").write_text("reduce_fuse_depth: 3\n")
    monkeypatch.setenv("AUTOFUSE_FLAGS", "--bisect_limit=5")
    assert main(["flags", "--flags", "--opt_level=1", "--config", str(tmp_path / "f.yaml"),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["opt_level"] == {"value": 1, "origin": "explicit"}
    assert d["bisect_limit"] == {"value": 5, "origin": "env AUTOFUSE_FLAGS"}
    assert d["reduce_fuse_depth"]["origin"] == f"file {tmp_path / 'f.yaml'}"
    assert d["composite_op_limit_size"] == {"value": 64, "origin": "default@ascend910b"}


def test_bad_config_file_exits_2(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("opt_level: [1\n")
    assert main(["compile", EX, "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_compile_json_report(capsys):
    assert main(["compile", EX, "--flags", "--opt_level=0", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["flags"]["opt_level"]["value"] == 0
    assert [p["name"] for p in rep["passes"] if p["ran"]] == ["validate"]


def test_flag_note_printed_once_as_graphkernel_warning():
    # compile and explain resolve the flags more than once; the note still appears once
    for cmd in (["compile", EX], ["explain", EX]):
        r = gk(*cmd, env={"AUTOFUSE_FLAGS": "--opt_level=2 --opt_level=3"})
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("given more than once") == 1, r.stderr
        assert "graphkernel: warning: env AUTOFUSE_FLAGS: --opt_level is given more than once" \
            in r.stderr
        assert "UserWarning" not in r.stderr


def test_flags_text_shows_values_in_effect_with_their_origin():
    r = gk("flags", "--flags", "--opt_level=3")
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines()[1:] if ln.strip()}
    assert rows["enable_super_kernel"] == ["true", "default@opt3"]
    assert rows["opt_level"] == ["3", "explicit"]
    assert rows["bisect_pass"] == ['""', "default"]
    assert "None" not in r.stdout and "null" not in r.stdout


def test_explicit_enable_pass_overrides_a_disable_from_the_environment(tmp_path):
    r = gk("compile", EX, "--flags", "--enable_pass=cse", "-o", str(tmp_path),
           env={"AUTOFUSE_FLAGS": "--disable_pass=cse"})
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    cse = next(p for p in rep["passes"] if p["name"] == "cse")
    assert cse["ran"] and cse["reason"] == "forced by --enable_pass=cse (explicit)"
    r = gk("flags", "--flags", "--enable_pass=cse", env={"AUTOFUSE_FLAGS": "--disable_pass=cse"})
    assert "note: --enable_pass=cse (explicit) overrides --disable_pass=cse (env AUTOFUSE_FLAGS)" \
        in r.stdout
