"""The ``graphkernel`` command.

Every command prints one clear message and exits with status 2 on bad input
(a malformed model, flag or inputs file), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphkernel.errors import ExecutionError, GraphKernelError
from graphkernel.ir import Graph


def _load(path: str) -> Graph:
    from graphkernel.frontends import load_model

    return load_model(path)


def _parse_dims(text: str | None) -> dict[str, int]:
    dims: dict[str, int] = {}
    if not text:
        return dims
    for item in text.split(","):
        key, _, val = item.partition("=")
        if not key.strip() or not val.strip().isdigit():
            raise ExecutionError(f"--dims item {item!r} is malformed; expected NAME=INT, "
                                 "e.g. --dims s0=8,batch=2")
        dims[key.strip()] = int(val)
    return dims


# ------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    g = _load(args.model)
    consts = g.constants
    const_bytes = sum(int(n.attrs["value"].nbytes) for n in consts)
    opaque = [n for n in g.nodes if n.op == "Opaque"]
    info: dict[str, Any] = {
        "name": g.name,
        "nodes": len(g),
        "constants": len(consts),
        "constant_bytes": const_bytes,
        "ops": g.op_histogram(),
        "inputs": [{"name": v.name, "type": str(v.type), "mutable": v.mutable} for v in g.inputs],
        "outputs": [{"name": v.name, "type": str(v.type)} for v in g.outputs],
        "opaque": [{"node": n.name, "label": n.attrs["label"], "impl": n.attrs["impl"]}
                   for n in opaque],
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"graph {g.name}: {len(g)} nodes ({len(consts)} constants, {const_bytes:,} bytes)")
    print("inputs:")
    for v in g.inputs:
        print(f"  {v.name}: {v.type}{' (mutable)' if v.mutable else ''}")
    print("outputs:")
    for v in g.outputs:
        print(f"  {v.name}: {v.type}")
    print("ops:")
    for op, n in info["ops"].items():
        print(f"  {op:<16} {n}")
    if opaque:
        labels: dict[str, int] = {}
        for n in opaque:
            labels[n.attrs["label"]] = labels.get(n.attrs["label"], 0) + 1
        print("opaque (run by their framework's reference): "
              + ", ".join(f"{k} x{v}" for k, v in sorted(labels.items())))
    return 0


# -------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from graphkernel.fileio import load_npz, save_npz
    from graphkernel.interpreter import Interpreter, random_inputs

    g = _load(args.model)
    if args.inputs:
        feeds = load_npz(args.inputs)
        src = args.inputs
    else:
        feeds = random_inputs(g, seed=args.seed, dims=_parse_dims(args.dims))
        src = f"random (seed {args.seed})"
    outs = Interpreter(g, compute_dtype=args.compute_dtype).run(feeds)
    print(f"ran {g.name} ({len(g)} nodes) on {src} inputs")
    result = {}
    for v, a in zip(g.outputs, outs, strict=True):
        result[v.name] = a
        stats = "empty"
        if a.size:
            f = a.astype(np.float64)
            stats = f"min {np.nanmin(f):.6g}  max {np.nanmax(f):.6g}  mean {np.nanmean(f):.6g}"
        print(f"  {v.name}: {a.dtype}{list(a.shape)}  {stats}")
    if args.out:
        save_npz(args.out, result)
        print(f"wrote {args.out}")
    return 0


# -------------------------------------------------------------------- ops
def cmd_ops(args: argparse.Namespace) -> int:
    from graphkernel import ops

    rows = []
    for o in ops.all_ops():
        lo, hi = o.arity
        arity = str(lo) if lo == hi else (f"{lo}..{hi}" if hi is not None else f"{lo}+")
        rows.append({"name": o.name, "kind": o.kind.name, "arity": arity,
                     "category": o.category, "composite": o.composite,
                     "aliases": list(o.aliases), "attrs": list(o.attrs.model_fields),
                     "reference": o.reference is not None})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'op':<16} {'kind':<10} {'arity':<6} {'type':<10} attrs")
    for r in rows:
        kind = "composite" if r["composite"] else "basic"
        alias = f"  (alias: {', '.join(r['aliases'])})" if r["aliases"] else ""
        print(f"{r['name']:<16} {r['kind']:<10} {r['arity']:<6} {kind:<10} "
              f"{', '.join(r['attrs'])}{alias}")
    print(f"{len(rows)} ops")
    return 0


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphkernel",
        description="Graph-kernel fusion compiler for Ascend NPUs. MODEL is a graphkernel "
                    ".json/.yaml graph or an .onnx model.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("info", help="node count, op histogram, inputs and outputs of a model",
                       description="Show a model's size, op histogram, inputs and outputs.")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(fn=cmd_info)

    s = sub.add_parser("run", help="run a model through the numpy interpreter",
                       description="Run a model op by op with the numpy reference semantics.")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--inputs", metavar="IN.npz", help="input arrays by graph input name")
    s.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    s.add_argument("--dims", metavar="S=N,...", help="sizes of symbolic dims for random inputs "
                                                     "(default 4 each)")
    s.add_argument("--compute-dtype", choices=["float32", "float64"], default=None,
                   help="keep every float value in this precision (a high-precision reference)")
    s.add_argument("--out", metavar="OUT.npz", help="write the outputs to this file")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("ops", help="list every registered op",
                       description="List every registered op: kind, arity, attributes.")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(fn=cmd_ops)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except GraphKernelError as e:
        print(f"graphkernel: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return 0


def _entry() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
