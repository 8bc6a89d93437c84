"""The CLI: commands, JSON output, and bad input -> one message, exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from graphkernel.cli import main
from graphkernel.interpreter import run_graph

EX = "examples/layernorm_residual.json"


def test_info(capsys):
    assert main(["info", EX]) == 0
    out = capsys.readouterr().out
    assert "graph layernorm_residual: 16 nodes" in out and "ReduceSum" in out
    assert main(["info", EX, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ops"]["ReduceSum"] == 2 and info["inputs"][0]["type"] == "float32[batch,16,128]"


def test_run_with_inputs_and_out(tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((2, 16, 128)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, residual=x)
    assert main(["run", EX, "--inputs", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as z:
        y = z["ln_shift"]
    from graphkernel.frontends import load_model

    np.testing.assert_array_equal(y, run_graph(load_model(EX), {"x": x, "residual": x})[0])
    assert "ln_shift: float32[2, 16, 128]" in capsys.readouterr().out


def test_ops_json_lists_every_basic_op(capsys):
    assert main(["ops", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    required = """Abs Neg Exp Expm1 Log Log1p Sqrt Rsqrt Reciprocal Sin Cos Tan Asin Acos Atan
    Tanh Erf Erfc Floor Ceil Trunc Round Sign IsFinite IsNan IsInf LogicalNot Cast Identity Add
    Sub Mul Div FloorDiv FloorMod Mod Pow Maximum Minimum Atan2 Equal NotEqual Greater
    GreaterEqual Less LessEqual LogicalAnd LogicalOr BitwiseAnd BitwiseOr Select BroadcastTo
    Reshape ExpandDims Squeeze Transpose Slice StridedSlice Concat Split Gather OneHot CumSum
    ReduceSum ReduceMax ReduceMin ReduceProd ArgMax ArgMin ElemAny Constant Assign MatMul
    BatchMatMul Conv2D MaxPool AvgPool Opaque""".split()
    missing = [op for op in required if op not in rows]
    assert not missing
    assert all(rows[op]["reference"] for op in required)
    assert "RealDiv" in rows["Div"]["aliases"]


@pytest.mark.parametrize("argv,message", [
    (["info", "nope.json"], "nope.json: no such file"),
    (["info", "README.md"], "unknown model type '.md'"),
    (["run", EX, "--inputs", "missing.npz"], "missing.npz: no such inputs file"),
    (["run", EX, "--dims", "batch=two"], "--dims item 'batch=two' is malformed"),
])
def test_bad_input_exits_2_with_one_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.e2e
def test_bad_graph_file_via_subprocess(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "graphkernel/1", "inputs": [],
                               "nodes": [{"name": "n", "op": "Fooo", "inputs": [],
                                          "outputs": ["n"]}], "outputs": ["n"]}))
    r = subprocess.run([sys.executable, "-m", "graphkernel.cli", "info", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "nodes[0] ('n').op: unknown op 'Fooo'" in r.stderr and "Traceback" not in r.stderr


def test_wrong_input_shape_exits_2(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32),
             residual=np.ones((2, 3), np.float32))
    assert main(["run", EX, "--inputs", str(tmp_path / "in.npz")]) == 2
    assert "input 'x': expected float32[batch,16,128]" in capsys.readouterr().err


@pytest.mark.e2e
def test_every_command_has_help(capsys):
    """Through the program (``python -m graphkernel.cli``) once, then through ``main`` in
    this process (the program's whole body), without an interpreter started per command."""
    r = subprocess.run([sys.executable, "-m", "graphkernel.cli", "info", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "usage: graphkernel" in r.stdout
    for cmd in ("info", "run", "ops"):
        with pytest.raises(SystemExit) as done:
            main([cmd, "--help"])
        assert done.value.code == 0 and "usage: graphkernel" in capsys.readouterr().out


@pytest.mark.e2e
def test_program_exits_without_walking_the_compiled_graph(tmp_path):
    """The ``graphkernel`` program (``cli.run``) returns the command's exit status and leaves
    every live object frozen, so the collections at interpreter exit skip them."""
    code = ("import gc, sys; from graphkernel.cli import run; "
            f"sys.argv = ['graphkernel', 'compile', {EX!r}, '-o', {str(tmp_path / 'o')!r}]; "
            "status = run(); print(status, gc.get_freeze_count() > 1000)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["0", "True"]
    assert (tmp_path / "o").is_dir()
