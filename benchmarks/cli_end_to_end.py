"""A large model from a file through the ``graphkernel`` command, end to end, and by phase.

    python benchmarks/cli_end_to_end.py [--nodes 100000] [--formats json,onnx] [--repeat 2]
                                        [--dir DIR] [--no-phases] [--check]

Builds the synthetic transformer of ``benchmarks/models.py`` (about ``--nodes`` nodes, ~50 MB
of float32 weights per 10,000 nodes) as a user would hand it to the program: a graphkernel
JSON file with its ``.npz`` of weights (``save_graph``), and the same layers as an ONNX model
(opset 20, standard ops) with its weights in one external data file. Both are kept in
``--dir`` (default: a folder under the system's temporary folder) and built only once.

Then, for each format, every command in a fresh process, ``--repeat`` times:

- ``graphkernel info MODEL``, ``graphkernel compile MODEL -q``, ``graphkernel compile MODEL -q
  -o OUT`` (into an empty folder, then again into the folder of the previous run, which is
  then cleaned): wall seconds, CPU seconds (user + system) and peak RSS of that process, the
  load average when it started, and what ``-o`` wrote (bytes in new files, and bytes shared
  with the input through hard links);
- (unless ``--no-phases``) the same ``compile -o`` once more, timed by phase inside the
  process: start (interpreter and imports), load, the pipeline (its ``validate`` pass apart),
  each output writer, the cleanup of the previous run, the rest of the command, and the
  process exit; wall and CPU seconds and the peak RSS within each phase (the kernel's
  high-water mark, reset as each phase starts).

``--check`` then loads the compiled graph that ``-o`` wrote and runs it and the input model on
the same seeded inputs through the numpy interpreter: the outputs must agree (the compiled
graph's kernels are the input's ops, regrouped).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------- the models
def build_json(folder: Path, nodes: int) -> Path:
    from benchmarks.models import transformer_of_size
    from graphkernel.frontends.json_format import save_graph

    path = folder / f"transformer_{nodes}.json"
    if not path.exists():
        save_graph(transformer_of_size(nodes), path)
    return path


def build_onnx(folder: Path, nodes: int) -> Path:
    """The layers of ``benchmarks.models.transformer`` in standard ONNX ops (LayerNormalization,
    MatMul, Split, Softmax, Gelu), weights in one external data file next to the model."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from benchmarks.models import FFN, HEADS, HIDDEN, transformer

    path = folder / f"transformer_{nodes}.onnx"
    if path.exists():
        return path
    per_layer = len(transformer(1)) - 1
    layers = max(1, round(nodes / per_layer))
    rng = np.random.default_rng(0)
    inits, body = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def w(name, *shape):
        return init(name, (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    def node(op, ins, out, **attrs):
        body.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    init("ones", np.ones(HIDDEN, np.float32))
    init("zeros", np.zeros(HIDDEN, np.float32))
    init("scale", np.array(0.25, np.float32))
    init("flat", np.array([-1, HIDDEN], np.int64))
    init("heads", np.array([-1, 16, HEADS, HIDDEN // HEADS], np.int64))
    init("seq", np.array([-1, 16, HIDDEN], np.int64))
    init("ffn_flat", np.array([-1, HIDDEN], np.int64))
    init("thirds", np.array([HIDDEN] * 3, np.int64))
    x = "x"
    for i in range(layers):
        p = f"l{i}."
        h = node("LayerNormalization", [x, "ones", "zeros"], p + "ln1", axis=-1)
        f = node("Reshape", [h, "flat"], p + "flat")
        qkv = node("Add", [node("MatMul", [f, w(p + "w_qkv", HIDDEN, 3 * HIDDEN)], p + "qkv"),
                           w(p + "b_qkv", 3 * HIDDEN)], p + "qkv_bias")
        body.append(helper.make_node("Split", [qkv, "thirds"], [p + "q", p + "k", p + "v"],
                                     name=p + "split", axis=1))
        q, k, v = (node("Transpose", [node("Reshape", [p + t, "heads"], p + t + "_r")],
                        p + t + "_t", perm=[0, 2, 1, 3]) for t in "qkv")
        kt = node("Transpose", [k], p + "k_tt", perm=[0, 1, 3, 2])
        s = node("Mul", [node("MatMul", [q, kt], p + "scores"), "scale"], p + "scale")
        o = node("MatMul", [node("Softmax", [s], p + "softmax", axis=-1), v], p + "ctx")
        o = node("Reshape", [node("Transpose", [o], p + "ctx_t", perm=[0, 2, 1, 3]), "flat"],
                 p + "ctx_r")
        o = node("Add", [node("MatMul", [o, w(p + "w_proj", HIDDEN, HIDDEN)], p + "proj"),
                         w(p + "b_proj", HIDDEN)], p + "proj_bias")
        x = node("Add", [x, node("Reshape", [o, "seq"], p + "proj_r")], p + "res1")
        h = node("Reshape", [node("LayerNormalization", [x, "ones", "zeros"], p + "ln2",
                                  axis=-1), "ffn_flat"], p + "ffn_flat")
        h = node("Add", [node("MatMul", [h, w(p + "w_fc1", HIDDEN, FFN)], p + "fc1"),
                         w(p + "b_fc1", FFN)], p + "fc1_bias")
        h = node("Gelu", [h], p + "gelu", approximate="tanh")
        h = node("Add", [node("MatMul", [h, w(p + "w_fc2", FFN, HIDDEN)], p + "fc2"),
                         w(p + "b_fc2", HIDDEN)], p + "fc2_bias")
        x = node("Add", [x, node("Reshape", [h, "seq"], p + "ffn_r")], p + "res2")
    graph = helper.make_graph(
        body, f"transformer_{layers}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16, HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["b", 16, HIDDEN])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=path.name + ".data",
                    size_threshold=1024)
    return path


# ------------------------------------------------------------ one command, timed
# Runs a command as /usr/bin/time does and prints its wall and CPU seconds and peak RSS. A
# process started by this (large) one would report this one's peak as its own: Linux carries
# the peak RSS of the process image an exec replaces into the new program's.
LAUNCHER = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, u = os.wait4(pid, 0)
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": u.ru_utime + u.ru_stime,
                  "peak_mb": u.ru_maxrss / 1024, "code": os.waitstatus_to_exitcode(status)}))
"""


def run_command(argv: list[str]) -> dict:
    """Run ``graphkernel ARGV`` in a fresh process: wall and CPU seconds, peak RSS (MB)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as err:
        done = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, sys.executable, "-m",
                               "graphkernel", *argv], stdout=subprocess.PIPE, stderr=err,
                              check=True)
        # (the command's own output goes to the launcher's: its last line is the figures)
        r = json.loads(done.stdout.decode().strip().splitlines()[-1])
        if r["code"] != 0:
            err.seek(0)
            raise SystemExit(f"graphkernel {' '.join(argv)} failed ({r['code']}):\n"
                             + err.read().decode())
    return r | {"load": load}


def written(out: Path, inputs: list[Path]) -> tuple[int, int]:
    """Bytes of the files in ``out``: (in files of their own, in hard links to ``inputs``)."""
    shared = {(s.st_dev, s.st_ino) for p in inputs if p.exists() for s in [p.stat()]}
    own = linked = 0
    for p in out.rglob("*"):
        if p.is_file() and not p.is_symlink():
            s = p.stat()
            if (s.st_dev, s.st_ino) in shared:
                linked += s.st_size
            else:
                own += s.st_size
    return own, linked


def data_files(model: Path) -> list[Path]:
    """The weights file beside the model (its .npz, or the ONNX external data)."""
    data = model.with_suffix(".npz") if model.suffix == ".json" else \
        model.with_name(model.name + ".data")
    return [data] if data.exists() else []


# ------------------------------------------------------------------ phases (child)
def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak RSS restarts from the current RSS
    except OSError:
        pass


class Phases:
    """Wall, CPU and peak RSS of named phases; time outside every phase is 'other'."""

    def __init__(self) -> None:
        self.rows: list[list] = []
        self.depth = 0

    def wrap(self, module: str, attr: str, label: str) -> None:
        import importlib

        mod = importlib.import_module(module)
        fn = getattr(mod, attr, None)
        if fn is None:
            return

        def timed(*a, **kw):
            if self.depth:  # (called inside another phase: counted there)
                return fn(*a, **kw)
            self.depth += 1
            _reset_hwm()
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                self.depth -= 1
                self.rows.append([label, time.perf_counter() - w0, time.process_time() - c0,
                                  _hwm_mb()])

        setattr(mod, attr, timed)


def phases_child(model: str, out: str, started: float) -> None:
    """``graphkernel compile MODEL -o OUT -q`` in this process, timed by phase; prints one
    JSON line and exits as the program does."""
    from graphkernel import cli

    ph = Phases()
    for module, attr, label in [
            ("graphkernel.frontends", "load_model", "load"),
            ("graphkernel.api", "compile", "pipeline"),
            ("graphkernel.frontends.json_format", "save_graph", "write compiled graph"),
            ("graphkernel.frontends.json_format", "save_compiled", "write compiled graph"),
            ("graphkernel.dump", "to_json", "write report.json"),
            ("graphkernel.api", "write_report_file", "write report.json"),
            ("graphkernel.codegen.backend", "write_project", "write kernels + manifest"),
            ("graphkernel.outdir", "remove_stale", "clean previous run")]:
        ph.wrap(module, attr, label)
    results = {}

    real_compile = sys.modules["graphkernel.api"].compile

    def compile_kept(*a, **kw):
        res = real_compile(*a, **kw)
        results["passes"] = res.report.passes
        return res

    sys.modules["graphkernel.api"].compile = compile_kept
    start_wall, start_cpu = time.time() - started, time.process_time()  # and the imports
    _reset_hwm()
    m0, mc0 = time.perf_counter(), time.process_time()
    rc = cli.main(["compile", model, "-o", out, "-q"])
    main_wall, main_cpu = time.perf_counter() - m0, time.process_time() - mc0
    if rc != 0:
        raise SystemExit(rc)
    rows = {}
    for label, w, c, peak in ph.rows:
        r = rows.setdefault(label, [0.0, 0.0, 0.0])
        r[0] += w
        r[1] += c
        r[2] = max(r[2], peak)
    validate = sum(p.seconds for p in results["passes"] if p.ran and p.name == "validate")
    table = [["start (interpreter, imports)", start_wall, start_cpu, None]]
    for label in ["load", "pipeline", "write compiled graph", "write report.json",
                  "write kernels + manifest", "clean previous run"]:
        if label in rows:
            w, c, peak = rows[label]
            table.append([label, w, c, peak])
            if label == "pipeline":
                table.append(["  of it the validate pass", validate, None, None])
    inside = sum(r[0] for r in rows.values())
    inside_cpu = sum(r[1] for r in rows.values())
    table.append(["rest of the command", main_wall - inside, main_cpu - inside_cpu, None])
    print(json.dumps({"rows": table, "end": time.time()}), flush=True)
    code = cli.gc.freeze() or 0  # as cli.run leaves: no last collection
    sys.exit(code)


def phases(model: Path, out: Path) -> list[list]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        started = time.time()
        proc = subprocess.Popen([sys.executable, __file__, "--phases-child", str(model),
                                 str(out), repr(started)], stdout=out_f, stderr=err_f)
        _, status, usage = os.wait4(proc.pid, 0)
        ended = time.time()
        out_f.seek(0)
        err_f.seek(0)
        out_text, err = out_f.read().decode(), err_f.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the timed compile failed:\n{err}")
    doc = json.loads(out_text.strip().splitlines()[-1])
    rows = doc["rows"]
    rows.append(["process exit", ended - doc["end"], None, None])
    # (the peak RSS is each phase's: resetting it per phase resets the process's own too)
    rows.append(["total", ended - started, usage.ru_utime + usage.ru_stime,
                 max(r[3] or 0 for r in rows)])
    rows.append(["(load average at start)", load, None, None])
    return rows


# ------------------------------------------------------------------------- check
def check(model: Path, out: Path) -> str:
    """The compiled graph that ``-o`` wrote, loaded back and run on seeded inputs: judged
    against the input model as ``graphkernel verify`` judges a compile, and compared with the
    graph compiled in memory (the same numbers, bit for bit)."""
    import numpy as np

    import graphkernel
    from graphkernel.bisect import Evaluator
    from graphkernel.frontends import load_model
    from graphkernel.interpreter import random_inputs, run_graph

    compiled = next(out.glob("*.compiled.json"))
    g = load_model(model)
    feeds = random_inputs(g, seed=0, dims={"b": 1})
    ev = Evaluator(g, feeds)
    got = run_graph(load_model(compiled), feeds)
    j = ev.judge(got)
    mem = run_graph(graphkernel.compile(g, "", env={}, copy=False).graph, feeds)
    same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got, mem, strict=True))
    return (f"{compiled.name} against {model.name}: "
            + (f"MISMATCH ({j.reason})" if j.bad else f"verify's MATCH (cos {j.cosine:.6f})")
            + ("; identical to the graph compiled in memory" if same else
               "; DIFFERS from the graph compiled in memory"))


# -------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100000)
    ap.add_argument("--formats", default="json,onnx")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "gk_cli_e2e")
    ap.add_argument("--no-phases", dest="phases", action="store_false")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--phases-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phases_child:
        model, out, started = args.phases_child
        phases_child(model, out, float(started))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    builders = {"json": build_json, "onnx": build_onnx}
    for fmt in args.formats.split(","):
        model = builders[fmt](args.dir, args.nodes)
        inputs = [model, *data_files(model)]
        size = sum(p.stat().st_size for p in inputs)
        print(f"\n{model.name} ({', '.join(p.name for p in inputs)}: {size / 2**20:,.0f} MB)")
        print(f"{'command':<38} {'wall s':>7} {'cpu s':>6} {'peak MB':>8} {'load':>5} "
              f"{'out MB':>7} {'linked MB':>9}")
        for rep in range(args.repeat):
            out = args.dir / f"out_{fmt}_{rep}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            for name, argv in [("info", ["info", str(model)]),
                               ("compile -q", ["compile", str(model), "-q"]),
                               ("compile -q -o OUT (empty)", ["compile", str(model), "-q", "-o",
                                                              str(out)]),
                               ("compile -q -o OUT (again)", ["compile", str(model), "-q", "-o",
                                                              str(out)])]:
                r = run_command(argv)
                own = linked = None
                if "-o" in argv:
                    own, linked = written(out, inputs)
                print(f"{name:<38} {r['wall']:>7.2f} {r['cpu']:>6.2f} {r['peak_mb']:>8.0f} "
                      f"{r['load']:>5.1f} "
                      + ("" if own is None else f"{own / 2**20:>7.0f} {linked / 2**20:>9.0f}"),
                      flush=True)
        out = args.dir / f"out_{fmt}_0"
        if args.phases:
            print(f"\nphases of `graphkernel compile {model.name} -q -o OUT` (into the folder of "
                  "a previous run)")
            print(f"{'phase':<32} {'wall s':>7} {'cpu s':>6} {'peak MB':>8}")
            for label, w, c, peak in phases(model, out):
                print(f"{label:<32} {w:>7.2f} " + ("      " if c is None else f"{c:>6.2f}")
                      + ("" if peak is None else f" {peak:>8.0f}"))
        if args.check:
            print("check:", check(model, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
