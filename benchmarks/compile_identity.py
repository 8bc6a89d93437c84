"""Same compiles before and after a change: every example and zoo model through
``graphkernel compile --out`` with two source trees, outputs compared.

    python benchmarks/compile_identity.py [--base main] [--levels 1,2,3]

The base tree is the given git revision (extracted with ``git archive``); the other is this
checkout. For every model and opt level both trees write the compiled graph, report.json,
manifest.json and the kernel sources; then:

- the compiled graph JSON must be byte-identical;
- report.json must be equal once wall-clock fields are removed (fields only the new tree
  writes are listed, not counted as differences);
- every kernel instance (a GraphKernel node of the compiled graph) must have the same manifest
  entry and the same source files. A manifest of format 2 lists each distinct kernel once and
  maps instances to it: an instance's entry is rebuilt from its instance record (its own
  fields) and its shared kernel (the rest), and its old source files are compared with the
  shared ones after renaming the instance's own kernel symbol to the shared symbol and
  dropping ``//`` comments (the only places node names appear). The first instance of a
  shared kernel must match byte for byte.

Prints one line per compile and the totals; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIGHT = ["resnet50", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet",
         "vgg19"]
TIMING = {"seconds"}  # wall-clock fields of report.json

# Runs inside each tree: compile every (model, level) with the CLI into OUT/<model>-O<level>.
CHILD = r"""
import contextlib, io, json, sys
from graphkernel.cli import main
jobs = json.loads(sys.argv[1])
for model, level, out in jobs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["compile", model, "--flags", f"--opt_level={level}", "--out", out])
    print(json.dumps([model, level, rc]), flush=True)
"""


def models(tmp: Path) -> list[str]:
    out = [str(p) for p in sorted((ROOT / "examples").glob("*.json"))]
    out += [str(p) for p in sorted((ROOT / "examples" / "models").glob("*.json"))]
    try:
        import onnx

        light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
        out += [str(light / f"light_{n}.onnx") for n in LIGHT]
    except ImportError:
        print("(onnx not installed: ONNX light models skipped)")
    sys.path.insert(0, str(ROOT))
    from benchmarks.models import transformer
    from graphkernel.frontends.json_format import save_graph

    save_graph(transformer(3), str(tmp / "transformer_3.json"))  # identical layers
    out.append(str(tmp / "transformer_3.json"))
    return out


def compile_all(tree: Path, jobs: list[tuple[str, int, str]]) -> dict[tuple[str, int], int]:
    env = dict(os.environ, PYTHONPATH=str(tree), AUTOFUSE_FLAGS="")
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"compiling in {tree} failed:\n{done.stderr[-3000:]}")
    return {(m, lvl): rc for m, lvl, rc in map(json.loads, done.stdout.splitlines())}


def without_timing(x):
    if isinstance(x, dict):
        return {k: without_timing(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [without_timing(v) for v in x]
    return x


def added_fields(old, new, path="") -> list[str]:
    """Dict keys only ``new`` has (at any depth where both are dicts)."""
    out = []
    if isinstance(old, dict) and isinstance(new, dict):
        for k in new:
            if k not in old:
                out.append(f"{path}{k}")
            else:
                out += added_fields(old[k], new[k], f"{path}{k}.")
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out += added_fields(a, b, f"{path}{i}.")
    return out


def strip_added(old, new):
    """``new`` without the keys ``old`` does not have."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: strip_added(old[k], v) for k, v in new.items() if k in old}
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [strip_added(a, b) for a, b in zip(old, new, strict=True)]
    return new


def instances(out: Path) -> dict[str, tuple[dict, str, dict[str, str]]]:
    """node -> (its manifest entry in format 1, its kernel symbol, its source files)."""
    m = json.loads((out / "manifest.json").read_text())
    kdir = out / "kernels"

    def files(entry: dict) -> dict[str, str]:
        return {f: (kdir / f).read_text() for f in entry["sources"]}

    if m["format"] == "graphkernel-kernels/1":
        return {e["node"]: (e, e["name"], files(e)) for e in m["kernels"]}
    kernels = {k["name"]: k for k in m["kernels"]}
    out_map = {}
    for inst in m["instances"]:
        k = kernels[inst["kernel"]]
        own = {f: v for f, v in inst.items() if f != "kernel"}  # the instance's own fields
        shared = {f: v for f, v in k.items() if f not in own and f != "instances"}
        out_map[inst["node"]] = (shared | own, k["name"], files(k))
    return out_map


def no_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def compare(old: Path, new: Path) -> tuple[list[str], dict[str, int], list[str]]:
    """(differences, counts of instances by how they matched, fields only ``new`` has)."""
    diffs: list[str] = []
    counts = {"byte-identical": 0, "identical but for names": 0}
    for f in old.glob("*.compiled.json"):
        if f.read_bytes() != (new / f.name).read_bytes():
            diffs.append(f"{f.name} differs")
    rep_old = without_timing(json.loads((old / "report.json").read_text()))
    rep_new = without_timing(json.loads((new / "report.json").read_text()))
    added = added_fields(rep_old, rep_new)
    if strip_added(rep_old, rep_new) != rep_old:
        diffs.append("report.json differs")
    a, b = instances(old), instances(new)
    if set(a) != set(b):
        diffs.append(f"kernel instances differ: {sorted(set(a) ^ set(b))[:5]}")
    for node in sorted(set(a) & set(b)):
        (ea, sa, fa), (eb, sb, fb) = a[node], b[node]
        if json.loads(json.dumps(ea).replace(sa, sb)) != eb:
            diffs.append(f"{node}: manifest entry differs")
        elif sa == sb:  # the kernel's own source (a shared kernel's first instance)
            if fa == fb:
                counts["byte-identical"] += 1
            else:
                diffs.append(f"{node}: kernel sources differ")
        else:
            fa = {f.replace(sa, sb): t.replace(sa, sb) for f, t in fa.items()}
            if set(fa) == set(fb) and all(no_comments(fa[f]) == no_comments(fb[f])
                                          for f in fa):
                counts["identical but for names"] += 1
            else:
                diffs.append(f"{node}: kernel sources differ")
    return diffs, counts, added


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git revision to compare against")
    ap.add_argument("--levels", default="1,2,3")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        jobs_of = {}
        todo = [(m, lvl) for m in models(tmp) for lvl in map(int, args.levels.split(","))]
        for tree, tag in ((base, "old"), (ROOT, "new")):
            outs = [(m, lvl, str(tmp / tag / f"{Path(m).stem}-O{lvl}")) for m, lvl in todo]
            jobs_of[tag] = compile_all(tree, outs)
        totals = {"byte-identical": 0, "identical but for names": 0}
        total_diffs, added_all = 0, set()
        print(f"{'model':<26} {'O':>2} {'kernels':>8} {'bytes=':>7} {'names':>6}  differences")
        for (model, lvl), rc in jobs_of["old"].items():
            stem = f"{Path(model).stem}-O{lvl}"
            if rc != 0 or jobs_of["new"][(model, lvl)] != 0:
                same = rc == jobs_of["new"][(model, lvl)]
                print(f"{Path(model).stem:<26} {lvl:>2}  exit {rc} / "
                      f"{jobs_of['new'][(model, lvl)]}{'' if same else '  DIFFERENT'}")
                total_diffs += not same
                continue
            diffs, counts, added = compare(tmp / "old" / stem, tmp / "new" / stem)
            added_all |= set(added)
            for k in totals:
                totals[k] += counts[k]
            total_diffs += len(diffs)
            print(f"{Path(model).stem:<26} {lvl:>2} {sum(counts.values()):>8} "
                  f"{counts['byte-identical']:>7} {counts['identical but for names']:>6}  "
                  f"{'; '.join(diffs[:3]) or '-'}")
        print(f"{sum(totals.values())} kernel instances: {totals['byte-identical']} byte-identical,"
              f" {totals['identical but for names']} identical but for names (sharing a kernel); "
              f"{total_diffs} differences")
        if added_all:
            print("report fields only the new tree writes: " + ", ".join(sorted(added_all)))
    return 1 if total_diffs else 0


if __name__ == "__main__":
    sys.exit(main())
