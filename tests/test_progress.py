"""Progress on stderr (only on a terminal, never with --quiet) and the compile log: one summary
line per pass by default, per-node detail with --verbose."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

import graphkernel
from graphkernel import progress
from graphkernel.cli import main
from graphkernel.frontends import load_model

pytestmark = pytest.mark.e2e  # the CLI on a pseudo-terminal

EX = "examples/layernorm_residual.json"


@pytest.fixture
def shown(monkeypatch):
    """Progress switched on into a buffer (as on a terminal), every update drawn; switched off
    afterwards."""
    monkeypatch.setattr(progress, "REFRESH_S", 0.0)

    def use(backend: str) -> io.StringIO:
        buf = io.StringIO()
        progress.enable(True, backend, buf)
        return buf

    yield use
    progress.enable(False)


def on_a_terminal(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal (120 columns); return (exit, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    e = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOFUSE", "MS_DEV"))}
    p = subprocess.Popen([sys.executable, "-m", "graphkernel.cli", *args], stdin=slave,
                         stdout=subprocess.DEVNULL, stderr=slave, env=e | (env or {}))
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            out += data
        elif p.poll() is not None:
            break
    os.close(master)
    return p.wait(), out.decode(errors="replace")


@pytest.mark.parametrize("backend", ["line", "tqdm"])
def test_compile_shows_passes_and_kernels_then_erases_the_display(shown, backend):
    if backend == "tqdm":
        pytest.importorskip("tqdm")
    buf = shown(backend)
    res = graphkernel.compile(load_model("examples/models/llama.json"), env={})
    text = buf.getvalue()
    on = sum(p.ran for p in res.report.passes)
    assert "kernels" in text and "codegen" in text and "split" in text
    if backend == "line":
        assert f"passes [{on - 1}/{on}] codegen > kernels [1/" in text  # nested tasks
        assert text.endswith("\r\x1b[K")  # erased: nothing left on the terminal
    else:
        assert f"{on}/{on}" in text
    assert not progress._stack


def test_simulator_runs_and_builds_are_shown(shown, tmp_path, monkeypatch):
    from graphkernel.codegen.backend import run_sim
    from graphkernel.codegen.sim import runner
    from graphkernel.interpreter import random_inputs

    g = load_model("examples/attention_softmax.json")
    res = graphkernel.compile(g, env={})
    buf = shown("line")
    run_sim(res, random_inputs(g, 0))
    assert "running kernels in the simulator [" in buf.getvalue()
    # a build that takes a while shows its elapsed time while g++ runs
    buf = shown("line")

    class SlowFailingCompiler:  # g++ that takes 1.2 s and fails
        returncode = 1

        def __init__(self, *args, **kwargs):
            pass

        def communicate(self):
            time.sleep(1.2)
            return "", "no"

    monkeypatch.setattr(runner.subprocess, "Popen", SlowFailingCompiler)
    monkeypatch.setenv("GRAPHKERNEL_SIM_CACHE", str(tmp_path))
    with pytest.raises(runner.SimulatorError):
        runner.build(["// a source never built before"])
    text = buf.getvalue()
    assert "simulator build 0s g++ compiling 1 kernel source (cached" in text
    assert "simulator build 1s g++" in text  # redrawn with its elapsed time while g++ runs


def test_progress_is_silent_when_off():
    progress.enable(False)
    buf = io.StringIO()
    with progress.task("x", 3) as t:
        t.advance("y")
    progress.write("a line", buf)
    assert buf.getvalue() == "a line\n"


def test_cli_progress_only_on_a_terminal_and_never_with_quiet():
    rc, err = on_a_terminal("compile", EX)
    assert rc == 0 and "passes" in err and "codegen" in err
    rc, err = on_a_terminal("compile", EX, "--quiet")
    assert rc == 0 and err.strip() == ""
    r = subprocess.run([sys.executable, "-m", "graphkernel.cli", "compile", EX],
                       capture_output=True, text=True)  # stderr a pipe: silent
    assert r.returncode == 0 and r.stderr == ""


def test_bisect_shows_its_steps_with_the_candidate_range():
    rc, err = on_a_terminal("bisect", "examples/mlp_gelu.json", "--plugin",
                            "examples/faulty_pass.py")
    assert rc == 0
    assert "bisect" in err and "first bad rewrite in 1.." in err
    assert "compile + run with --bisect_limit=" in err


def test_compile_log_is_one_line_per_pass_and_detail_at_verbose(capsys):
    assert main(["compile", "examples/models/llama.json"]) == 0
    out = capsys.readouterr().out
    assert "expanded Softmax" not in out  # per-node detail is off by default
    expand = [ln for ln in out.splitlines() if ln.split()[2:3] == ["expand"]]
    assert len(expand) == 1 and "composite nodes expanded into" in expand[0]
    assert main(["compile", "examples/models/llama.json", "-v"]) == 0
    verbose = capsys.readouterr().out
    assert "expanded Softmax '_softmax' into" in verbose
    assert len(verbose.splitlines()) > len(out.splitlines())
    assert main(["compile", "examples/models/llama.json", "--quiet"]) == 0
    quiet = capsys.readouterr().out
    assert "composite nodes expanded" not in quiet and quiet.startswith("compiled llama")


def test_every_pass_record_has_a_summary_of_one_line():
    res = graphkernel.compile(load_model("examples/models/llama.json"), "--opt_level=3", env={})
    for p in res.report.passes:
        assert "\n" not in p.summary
        if p.ran and p.notes:
            assert p.summary, p.name
    expand = next(p for p in res.report.passes if p.name == "expand")
    assert len(expand.notes) > 1 and expand.summary.startswith(f"{len(expand.notes)} composite")


def test_counts_agree_with_their_nouns(capsys):
    from graphkernel.registry import counted

    assert [counted(1, "kernel"), counted(0, "kernel"), counted(2, "pass", "passes")] == \
        ["1 kernel", "0 kernels", "2 passes"]
    assert main(["compile", "examples/layernorm_residual.json"]) == 0  # one kernel, one region
    out = capsys.readouterr().out
    assert "1 kernel from" in out and "in 1 region;" in out and "1 kernel scheduled" in out
    assert not any(f"1 {noun}s" in out for noun in ("kernel", "region", "rewrite"))
