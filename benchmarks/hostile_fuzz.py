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

CASES = [10**9]  # at most this many cases per fuzzer (--cases)
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


def fuzz_graph_files(rng: random.Random, seconds: float, folder: Path) -> dict[str, Any]:
    n = bad = 0
    rcs: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and n < CASES[0]:
        doc = _mutated(rng)
        path = folder / "m.json"
        path.write_text(json.dumps(doc))
        command = rng.choice(["info", "run", "compile", "explain"])
        rc, err = _case([command, str(path)])
        n += 1
        rcs[str(rc)] = rcs.get(str(rc), 0) + 1
        if not _ok(rc, err):
            bad += 1
            print(f"  graph file: {command} {json.dumps(doc)[:300]} -> {rc}: {err[-300:]}")
    return {"cases": n, "bad": bad, "exit": rcs}


def fuzz_onnx(rng: random.Random, seconds: float, folder: Path) -> dict[str, Any]:
    try:
        import onnx  # noqa: F401
    except ImportError:
        return {"cases": 0, "bad": 0, "exit": {}, "note": "onnx is not installed"}
    from graphkernel.frontends.onnx import HANDLERS
    from tests.security.test_onnx_property import _model

    ops = sorted(HANDLERS)
    n = bad = 0
    rcs: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and n < CASES[0]:
        op = rng.choice(ops)
        try:
            m = _model(rng, op)
        except (ValueError, TypeError):  # (onnx's helper refused the attribute mix)
            continue
        path = folder / "m.onnx"
        path.write_bytes(m.SerializeToString())
        command = rng.choice(["info", "info", "run"])
        rc, err = _case([command, str(path)])
        n += 1
        rcs[str(rc)] = rcs.get(str(rc), 0) + 1
        if not _ok(rc, err):
            bad += 1
            print(f"  onnx: {command} {op} {[(a.name) for a in m.graph.node[0].attribute]} "
                  f"-> {rc}: {err[-300:]}")
    return {"cases": n, "bad": bad, "exit": rcs}


def fuzz_flags(rng: random.Random, seconds: float, folder: Path) -> dict[str, Any]:
    from graphkernel.flags import SPECS

    keys = sorted(SPECS)
    values = ["", "0", "-1", "1", "2", "3", "true", "false", "maybe", "9" * 19, "1e3", "a,b",
              "cse", "*", "../x", "/etc", "a\x00b", "\x1b[2J", "x" * 5000, ",", "[", "nan"]
    model = folder / "g.json"
    model.write_text(json.dumps(_graph_doc()))
    n = bad = 0
    rcs: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and n < CASES[0]:
        flags = " ".join(f"--{rng.choice(keys)}={rng.choice(values)}"
                         for _ in range(rng.randint(1, 3)))
        rc, err = _case(["compile", str(model), "-q", "--flags", flags])
        n += 1
        rcs[str(rc)] = rcs.get(str(rc), 0) + 1
        if not _ok(rc, err):
            bad += 1
            print(f"  flags: {flags!r} -> {rc}: {err[-300:]}")
    return {"cases": n, "bad": bad, "exit": rcs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="per fuzzer (default 60)")
    ap.add_argument("--cases", type=int, default=10**9, help="per fuzzer, at most")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    CASES[0] = args.cases
    rng = random.Random(args.seed)
    total = 0
    with tempfile.TemporaryDirectory() as d:
        import os

        os.chdir(d)  # (a stray write would land here, not in the tree)
        for name, fn in [("graph files", fuzz_graph_files), ("onnx nodes", fuzz_onnx),
                         ("flag strings", fuzz_flags)]:
            t0 = time.monotonic()
            res = fn(rng, args.seconds, Path(d))
            total += res["bad"]
            print(f"{name:13s} {res['cases']:6d} cases in {time.monotonic() - t0:5.1f} s; "
                  f"exit codes {dict(sorted(res['exit'].items()))}; findings {res['bad']}"
                  + (f" ({res['note']})" if "note" in res else ""))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
