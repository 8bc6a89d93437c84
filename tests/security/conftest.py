"""Helpers for the hostile-input suite: run the CLI in-process, build graph files, watch
which files a command writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphkernel.cli import main


def graph_doc(name: str = "g", nodes: list | None = None, outputs: list | None = None,
              inputs: list | None = None, **extra: Any) -> dict[str, Any]:
    """A small valid graph file (x -> Exp -> y) with parts replaced."""
    return {"format": "graphkernel/1", "name": name,
            "inputs": inputs if inputs is not None else
            [{"name": "x", "shape": [4], "dtype": "float32"}],
            "nodes": nodes if nodes is not None else
            [{"name": "n", "op": "Exp", "inputs": ["x"], "outputs": ["y"]}],
            "outputs": outputs if outputs is not None else ["y"], **extra}


def opaque_doc(impl: str, spec: dict[str, Any], n_in: int = 1) -> dict[str, Any]:
    """A graph whose only node is an Opaque node with this impl and spec."""
    return graph_doc(nodes=[{"name": "op", "op": "Opaque", "inputs": ["x"] * n_in,
                             "outputs": ["y"],
                             "attrs": {"impl": impl, "spec": spec,
                                       "out_types": [{"shape": [4], "dtype": "float32"}]}}])


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def snapshot(root: Path) -> set[str]:
    """Every file and folder under ``root`` (relative paths)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


class Cli:
    """``graphkernel ARGS`` in this process: the exit status and what it printed. Any
    exception escaping ``main`` fails the test (that would be a traceback)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: Any) -> tuple[int, str, str]:
        self.capsys.readouterr()
        rc = main([str(a) for a in argv])
        out, err = self.capsys.readouterr()
        assert "Traceback" not in err and "Traceback" not in out
        return rc, out, err

    def error(self, *argv: Any, code: int = 2) -> str:
        """Run a command that must fail with ``code`` and one error line; return the line."""
        rc, _, err = self(*argv)
        lines = [ln for ln in err.splitlines() if ln.startswith("graphkernel: error:")]
        assert rc == code and len(lines) == 1, (rc, err)
        assert "\x1b" not in err
        return lines[0]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so that a stray write would show in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def clean_registry():
    """Plugins loaded by a test register into the global registries: undo that."""
    from graphkernel import registry

    saved = (dict(registry.PASSES), dict(registry.EXPANDERS), dict(registry.PATTERNS),
             dict(registry._SOURCES), set(registry.PLUGIN_FILES))
    yield
    for table, old in zip((registry.PASSES, registry.EXPANDERS, registry.PATTERNS,
                           registry._SOURCES, registry.PLUGIN_FILES), saved, strict=True):
        table.clear()
        table.update(old)


def have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


