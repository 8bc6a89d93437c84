"""A longer hostile-input fuzz run than tests/security keeps (those take seconds): random
ONNX nodes of every mapped op with hostile attributes and static inputs, mutated graph files
(each field of a small model replaced by a hostile value of another type or size), and flag
strings of every documented flag with hostile values. Every case must end with exit 0, or
with exit 2 and exactly one error line; anything else (a traceback, exit 1 or 3, a second
error line) is printed with the case that made it.

    python benchmarks/hostile_fuzz.py [--seconds S] [--cases N] [--seed N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOSTILE_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 1.5, float("nan"), float("inf"), "",
    "x", "../../etc/passwd", "\x00", "\x1b[31m", "\u202e", "a" * 5000, [], [1], [[[]]],
    {}, {"a": 1}, ["x"] * 100, [2**40, 2**40], [-1], ["n"], "float32", "int64", "Exp",
]


def _case(argv: list[str]) -> tuple[int | str, str]:
    from graphkernel.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc: int | str = main(argv)
    except BaseException as e:  # noqa: BLE001 (anything escaping main is the finding)
        return f"exception {type(e).__name__}: {str(e)[:200]}", err.getvalue()
    return rc, err.getvalue()


def _ok(rc: int | str, err: str) -> bool:
    if rc == 0:
        return "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("graphkernel: error:")]
    return rc == 2 and len(lines) == 1 and "Traceback" not in err


def _graph_doc() -> dict[str, Any]:
    return {"format": "graphkernel/1", "name": "g",
            "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
            "constants": [{"name": "c", "shape": [8], "dtype": "float32", "data": [1.0] * 8}],
            "nodes": [{"name": "n", "op": "Add", "inputs": ["x", "c"], "outputs": ["t"]},
                      {"name": "m", "op": "Softmax", "inputs": ["t"], "outputs": ["y"],
                       "attrs": {"axis": [-1]}}],
            "outputs": ["y"]}


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _mutated(rng: random.Random) -> dict[str, Any]:
    doc = _graph_doc()
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(doc)[1:])
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE_VALUES))  # (never shared)
    return doc


def _fuzz(rng: random.Random, seconds: float, cases: int, make) -> dict[str, Any]:
    """Runs the CLI on ``make(rng)``'s cases (its arguments and how to show the case, or None
    to draw again) for ``seconds`` or ``cases`` cases; prints each finding."""
    n = bad = 0
    rcs: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and n < cases:
        made = make(rng)
        if made is None:
            continue
        argv, shown = made
        rc, err = _case(argv)
        n += 1
        rcs[str(rc)] = rcs.get(str(rc), 0) + 1
        if not _ok(rc, err):
            bad += 1
            print(f"  {shown} -> {rc}: {err[-300:]}")
    return {"cases": n, "bad": bad, "exit": rcs}


def graph_file_cases(folder: Path):
    def make(rng: random.Random):
        doc = _mutated(rng)
        path = folder / "m.json"
        path.write_text(json.dumps(doc))
        command = rng.choice(["info", "run", "compile", "explain"])
        return [command, str(path)], f"graph file: {command} {json.dumps(doc)[:300]}"
    return make


def onnx_cases(folder: Path):
    try:
        import onnx  # noqa: F401
    except ImportError:
        return None
    from graphkernel.frontends.onnx import HANDLERS
    from tests.security.test_onnx_property import _model

    ops = sorted(HANDLERS)

    def make(rng: random.Random):
        op = rng.choice(ops)
        try:
            m = _model(rng, op)
        except (ValueError, TypeError):  # (onnx's helper refused the attribute mix)
            return None
        path = folder / "m.onnx"
        path.write_bytes(m.SerializeToString())
        command = rng.choice(["info", "info", "run"])
        return [command, str(path)], \
            f"onnx: {command} {op} {[a.name for a in m.graph.node[0].attribute]}"
    return make


def flag_cases(folder: Path):
    from graphkernel.flags import SPECS

    keys = sorted(SPECS)
    values = ["", "0", "-1", "1", "2", "3", "true", "false", "maybe", "9" * 19, "1e3", "a,b",
              "cse", "*", "../x", "/etc", "a\x00b", "\x1b[2J", "x" * 5000, ",", "[", "nan"]
    model = folder / "g.json"
    model.write_text(json.dumps(_graph_doc()))

    def make(rng: random.Random):
        flags = " ".join(f"--{rng.choice(keys)}={rng.choice(values)}"
                         for _ in range(rng.randint(1, 3)))
        return ["compile", str(model), "-q", "--flags", flags], f"flags: {flags!r}"
    return make


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="per fuzzer (default 60)")
    ap.add_argument("--cases", type=int, default=10**9, help="per fuzzer, at most")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    total = 0
    with tempfile.TemporaryDirectory() as d:
        import os

        os.chdir(d)  # (a stray write would land here, not in the tree)
        for name, cases in [("graph files", graph_file_cases), ("onnx nodes", onnx_cases),
                            ("flag strings", flag_cases)]:
            t0 = time.monotonic()
            make = cases(Path(d))
            if make is None:
                print(f"{name:13s} skipped: onnx is not installed")
                continue
            res = _fuzz(rng, args.seconds, args.cases, make)
            total += res["bad"]
            print(f"{name:13s} {res['cases']:6d} cases in {time.monotonic() - t0:5.1f} s; "
                  f"exit codes {dict(sorted(res['exit'].items()))}; findings {res['bad']}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
