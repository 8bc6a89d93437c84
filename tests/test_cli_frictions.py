"""The everyday CLI, tried as a new user would: each friction found that way, fixed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.cli import build_parser, main

EX = "examples/mlp_gelu.json"


@pytest.mark.e2e
def test_version_and_python_dash_m(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.match(r"graphkernel \S+", capsys.readouterr().out)
    r = subprocess.run([sys.executable, "-m", "graphkernel", "info", EX], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "graph mlp_gelu" in r.stdout


def test_a_mistyped_option_names_the_closest_of_the_commands_own(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compile", EX, "--ouput", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: graphkernel compile" in err  # the command's usage, not the top level's
    assert "unknown option --ouput; did you mean '--out'?" in err
    with pytest.raises(SystemExit):
        main(["flags", "--opt_level=1"])
    assert 'give it inside --flags "--opt_level=1"' in capsys.readouterr().err


def test_every_command_takes_config(tmp_path, capsys):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, p in sub.choices.items():
        assert any("--config" in a.option_strings for a in p._actions), name
    cfg = tmp_path / "f.yaml"
    cfg.write_text("opt_level: 0\n")
    assert main(["verify", EX, "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["match"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text("opt_levl: 1\n")
    for argv in (["verify", EX], ["info", EX], ["ops"], ["run", EX, "--backend", "sim"],
                 ["patterns"], ["bisect", EX]):
        assert main([*argv, "--config", str(bad)]) == 2, argv
        assert "unknown flag --opt_levl" in capsys.readouterr().err


def test_run_json(capsys):
    assert main(["run", EX, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["inputs"] == "random (seed 0)" and d["outputs"][0]["shape"] == [4, 256]
    assert {"min", "max", "mean"} <= set(d["outputs"][0])


def fp16_softmaxish(tmp_path) -> str:
    from graphkernel.frontends.json_format import save_graph

    g = Graph("fp16chain")
    x = g.add_input("x", TensorType((64, 256), "float16"))
    a = g.add_node("Mul", [x, g.const(np.float16(1.7))], name="scale").output
    y = g.add_node("Add", [g.add_node("Exp", [a], name="exp").output,
                           g.const(np.float16(0.3))], name="shift").output
    s = g.add_node("ReduceSum", [y], {"axis": [-1], "keep_dims": True}, name="sum").output
    g.set_outputs([g.add_node("Div", [y, s], name="norm").output])
    save_graph(g, tmp_path / "m.json")
    return str(tmp_path / "m.json")


def test_verify_does_not_print_mismatch_before_a_match(tmp_path, capsys):
    assert main(["verify", fp16_softmaxish(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("MATCH")
    assert "MISMATCH" not in out and "outside tolerance, within noise" in out


def test_flags_with_no_effect_and_selectors_matching_nothing_are_warned(capsys):
    assert main(["compile", EX, "-q", "--flags",
                 "--opt_level=0 --enable_recompute_fusion --super_kernel_scope=foo"]) == 0
    err = capsys.readouterr().err
    assert "--enable_recompute_fusion has no effect: pass cluster does not run (level 1 > " \
           "opt_level 0)" in err
    assert "--super_kernel_scope=foo matches no node of mlp_gelu" in err
    assert err.count("--enable_recompute_fusion has no effect") == 1  # once, not per resolve
    assert main(["compile", EX, "-q", "--flags", "--opt_level=3 --super_kernel_scope=gelu"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_run_dims_typo_and_non_npz_inputs(tmp_path, capsys):
    assert main(["run", EX, "--dims", "bach=2"]) == 2
    assert "the model has no symbolic dim 'bach'; did you mean 'batch'?" in \
        capsys.readouterr().err
    (tmp_path / "in.txt").write_text("1 2 3\n")
    np.save(tmp_path / "x.npy", np.zeros(3))
    for f, what in (("in.txt", "not an .npz archive"), ("x.npy", "a single .npy array")):
        assert main(["run", EX, "--inputs", str(tmp_path / f)]) == 2
        err = capsys.readouterr().err
        assert what in err and "numpy.savez(path, x=array" in err and "pickle" not in err


def test_expand_counts_the_expansion_not_the_whole_pipeline(capsys):
    assert main(["expand", "examples/models/bert.json", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["nodes_after_expand"] > d["nodes_before"]  # expanders add nodes
    assert main(["expand", "examples/models/bert.json"]) == 0
    out = capsys.readouterr().out
    assert f"{d['nodes_before']} -> {d['nodes_after_expand']} nodes after expansion" in out


def test_passes_columns_line_up(capsys):
    assert main(["passes"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    at = {m.start() for ln in lines if (m := re.search(r"  (on|off) ", ln))}
    assert len(at) == 1  # every row's on/off starts at the same column


def test_a_folder_as_model(capsys):
    assert main(["info", "examples"]) == 2
    err = capsys.readouterr().err
    assert "examples: is a folder; MODEL is one model file" in err and "mlp_gelu.json" in err
    assert "unknown model type" not in err


def test_the_patterns_command_an_error_points_at_exists(capsys):
    assert main(["compile", EX, "--flags", "--disable_fusion_pattern=reduce_fwd"]) == 2
    assert "run `graphkernel patterns` to list them all" in capsys.readouterr().err
    assert main(["patterns", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rows]
    assert names[0] == "reshape" and "matmul_depth" in names
    red = next(r for r in rows if r["name"] == "reduce_fwd_depth")
    assert red["level"] == 1 and "REDUCE area" in red["fuses"]
    assert {c["code"] for c in red["refuses"]} >= {"GK202", "GK302"}
    assert main(["patterns", "--flags", "--opt_level=2"]) == 0
    out = capsys.readouterr().out
    assert "gather  level 3, fwd width, off (pattern level 3 > opt_level 2)" in out


def test_html_report_fits_the_window_and_counts_extern_calls(tmp_path):
    import graphkernel
    from graphkernel.html_report import MAX_ORIGIN, render

    res = graphkernel.compile("examples/models/bert.json", env={})
    page = render(res)
    externs = res.report.extra["externs"]
    assert externs and page.count('<tr class="extern"') == len(externs)
    kinds = re.search(r'id="launch-kinds">\(([^)]*)\)', page).group(1)
    assert f"{len(externs)} extern" in kinds
    total = sum(int(n) for n in re.findall(r"(\d+) \w+", kinds))
    assert total == res.report.extra["kernels_fused"]
    assert "#kernels{table-layout:fixed;width:100%}" in page and '<div class="wide">' in page
    cells = re.findall(r'<td title="[^"]*">([^<]*)</td></tr>', page)
    assert cells and all(c.count(",") < MAX_ORIGIN for c in cells)


@pytest.mark.e2e
def test_bisect_run_numbers_its_first_run_1(tmp_path):
    from graphkernel.bisect import bisect_external

    script = tmp_path / "p.py"
    script.write_text("import sys; sys.exit(1)\n")  # fails, compiles nothing
    said: list[str] = []
    r = bisect_external([sys.executable, str(script)], max_n=2, log=said.append)
    assert said[0].startswith("[run 1] every rewrite on -> bad")
    assert [int(re.match(r"\[run (\d+)\]", s).group(1)) for s in said] == \
        list(range(1, len(said) + 1))
    assert r.runs == len(said)
