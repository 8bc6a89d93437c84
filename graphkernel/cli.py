"""The ``graphkernel`` command.

Every command prints one clear message and exits with status 2 on bad input
(a malformed model, flag or inputs file), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphkernel import outputs, progress
from graphkernel.errors import ExecutionError, GraphKernelError, PluginError, printable, shown
from graphkernel.ir import Graph
from graphkernel.registry import counted


def _load(path: str) -> Graph:
    from graphkernel.frontends import MODEL_SUFFIXES, load_model

    p = Path(path)
    if p.is_dir():
        found = sorted(q.name for q in p.iterdir() if q.suffix in MODEL_SUFFIXES)[:5]
        inside = f" (in it: {', '.join(found)})" if found else ""
        raise ExecutionError(f"{path}: is a folder; MODEL is one model file ("
                             f"{', '.join(MODEL_SUFFIXES)}){inside}")
    return load_model(path)


def _check_dims(g: Graph, dims: dict[str, int]) -> None:
    """Every ``--dims`` name is a symbolic dim of the model (a typo is not silently
    ignored)."""
    from graphkernel import symbolic
    from graphkernel.errors import did_you_mean

    known = sorted({s for v in g.inputs for d in v.type.shape for s in symbolic.symbols(d)})
    for name in dims:
        if name not in known:
            has = f"its symbolic dims: {', '.join(known)}" if known else \
                "it has no symbolic dims"
            raise ExecutionError(f"--dims {name}: the model has no symbolic dim {name!r}"
                                 + did_you_mean(name, known) + f" ({has})")


def _load_inputs(path: str, g: Graph) -> dict[str, np.ndarray]:
    """An ``--inputs`` file: an .npz of arrays by input name, each read within its input's
    type (anything else is named as what it is, not with numpy's advice about pickles)."""
    from graphkernel.errors import FormatError
    from graphkernel.fileio import load_npz, open_regular

    try:
        with open_regular(path) as f:
            head = f.read(6)
    except OSError:
        head = b"PK"  # let load_npz report a missing or unreadable file its own way
    if not head.startswith(b"PK"):
        what = "a single .npy array" if head.startswith(b"\x93NUMPY") else \
            "empty" if not head else "not an .npz archive"
        raise FormatError(f"{path}: {what}; --inputs takes an .npz of arrays named after the "
                          "model's inputs: numpy.savez(path, x=array, ...)")
    return load_npz(path, {v.name: v.type for v in g.inputs})


def _jsonable(obj: Any) -> Any:
    """Strict JSON: NaN and infinities (a diverged metric) become the strings "nan", "inf",
    "-inf"; numpy scalars become numbers; anything else unknown its str()."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return "nan" if np.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


def _emit_json(args: argparse.Namespace, obj: Any) -> None:
    """The command's one JSON document, on the real stdout (with --json everything else a
    command prints goes to stderr: see ``main``)."""
    out = getattr(args, "stdout", None) or sys.stdout
    out.write(json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")
    out.flush()


def _parse_dims(text: str | None) -> dict[str, int]:
    from graphkernel import limits

    dims: dict[str, int] = {}
    if not text:
        return dims
    for item in text.split(","):
        key, _, val = (p.strip() for p in item.partition("="))
        if not limits.SYMBOL.fullmatch(key) or not re.fullmatch(r"[0-9]{1,18}", val):
            raise ExecutionError(f"--dims item '{shown(item)}' is malformed; expected NAME=INT, "
                                 "e.g. --dims s0=8,batch=2")
        if int(val) > limits.MAX_DIM:
            raise ExecutionError(f"--dims {key}={val}: above the limit of {limits.MAX_DIM}")
        if key in dims and dims[key] != int(val):
            raise ExecutionError(f"--dims {key} is given twice ({dims[key]} and {int(val)})")
        dims[key] = int(val)
    return dims


# ------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    if args.config:
        _config(args)  # checked as every command checks it (info compiles nothing)
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
        _emit_json(args, info)
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
    from graphkernel.fileio import member_name, save_npz
    from graphkernel.interpreter import Interpreter, random_inputs

    g = _load(args.model)
    dims = _parse_dims(args.dims)
    _check_dims(g, dims)
    if args.inputs:
        if dims:
            raise ExecutionError("--dims sizes the random inputs; with --inputs the sizes are "
                                 "the arrays' own (give one or the other)")
        feeds = _load_inputs(args.inputs, g)
        src = args.inputs
    else:
        feeds = random_inputs(g, seed=args.seed, dims=dims)
        src = f"random (seed {args.seed})"
    if args.backend == "sim":
        from graphkernel.api import compile as gk_compile
        from graphkernel.codegen.backend import run_sim

        res = gk_compile(g, args.flags or "", args.config, log=lambda m: None)
        outs, be = run_sim(res, feeds)
        head = (f"ran {g.name} compiled ({counted(len(res.graph), 'node')}, "
                f"{counted(len(be.stats), 'generated kernel')} in the CPU simulator) on {src} "
                "inputs")
    else:
        if args.flags or args.config:
            raise ExecutionError("--flags and --config choose how a model is compiled; `run` "
                                 "compiles only with --backend sim")
        outs = Interpreter(g, compute_dtype=args.compute_dtype).run(feeds)
        head = f"ran {g.name} ({len(g)} nodes) on {src} inputs"
    result = {}
    rows = []
    for v, a in zip(g.outputs, outs, strict=True):
        result[v.name] = a
        row: dict[str, Any] = {"name": v.name, "dtype": str(a.dtype), "shape": list(a.shape)}
        if a.size:
            f = a.astype(np.float64)
            row |= {"min": float(np.nanmin(f)), "max": float(np.nanmax(f)),
                    "mean": float(np.nanmean(f))}
        rows.append(row)
    if args.out:
        save_npz(args.out, result)
    renamed = {k: member_name(k) for k in result if member_name(k) != k} if args.out else {}
    if args.json:
        _emit_json(args, {"model": g.name, "backend": args.backend, "inputs": src,
                          "outputs": rows, "wrote": args.out, "renamed": renamed})
        return 0
    print(head)
    for r in rows:
        stats = f"min {r['min']:.6g}  max {r['max']:.6g}  mean {r['mean']:.6g}" \
            if "min" in r else "empty"
        print(f"  {r['name']}: {r['dtype']}{r['shape']}  {stats}")
    if args.out:
        for k, m in renamed.items():
            print(f"note: output {k!r} is stored as {m!r} (a member name is a plain file name)")
        print(f"wrote {args.out}")
    return 0


# -------------------------------------------------------------------- ops
def cmd_ops(args: argparse.Namespace) -> int:
    from graphkernel import ops, registry

    if args.config:
        _config(args)
    from graphkernel.passes.expand import default_expand_ops

    default = set(default_expand_ops())
    rows = []
    for o in ops.all_ops():
        lo, hi = o.arity
        arity = str(lo) if lo == hi else (f"{lo}..{hi}" if hi is not None else f"{lo}+")
        exp = registry.EXPANDERS.get(o.name)
        rows.append({"name": o.name, "kind": o.kind.name, "arity": arity,
                     "category": o.category, "composite": o.composite,
                     "aliases": list(o.aliases), "attrs": list(o.attrs.model_fields),
                     "reference": o.reference is not None, "expander": exp is not None,
                     "default_expand": o.name in default,
                     "expander_note": exp.note if exp is not None else "",
                     "in_place": bool(o.writes)})
    if args.json:
        _emit_json(args, rows)
        return 0
    print(f"{'op':<34} {'kind':<10} {'arity':<6} {'type':<10} {'expander':<9} attrs")
    for r in rows:
        kind = "composite" if r["composite"] else "basic"
        exp = ("default" if r["default_expand"] else "opt-in") if r["expander"] else "-"
        alias = f"  (alias: {', '.join(r['aliases'])})" if r["aliases"] else ""
        print(f"{r['name']:<34} {r['kind']:<10} {r['arity']:<6} {kind:<10} {exp:<9} "
              f"{', '.join(r['attrs'])}{alias}")
    n_comp = sum(r["composite"] for r in rows)
    print(f"{len(rows)} ops ({n_comp} composite, {len(default)} expanded by default)")
    return 0


def cmd_expand(args: argparse.Namespace) -> int:
    from graphkernel.api import compile as gk_compile

    g = _load(args.model)
    res = gk_compile(g, args.flags or "", args.config)
    rec = next((p for p in res.report.passes if p.name == "expand"), None)
    if rec is None or not rec.ran:
        print(f"expand did not run: {rec.reason if rec else 'no expand pass'}")
        return 0
    notes = rec.notes
    expanded = [n for n in notes if n.startswith("expanded")]
    kept = [n for n in notes if n.startswith("kept")]
    before, after = _expand_counts(g, res)
    if args.json:
        _emit_json(args, {"expanded": expanded, "kept": kept, "nodes_before": before,
                          "nodes_after_expand": after})
        return 0
    for n in notes:
        print(f"expand: {n}")
    print(f"{len(expanded)} expanded, {len(kept)} kept; {before} -> {after} nodes after "
          "expansion")
    return 0


def _expand_counts(g: Graph, res: Any) -> tuple[int, int]:
    """Nodes before the expanders and right after the expand stage: what `expand` is about,
    not what the rest of the pipeline makes of it."""
    stage = [p for p in res.report.passes if p.ran and p.stage in ("preprocess", "expand")]
    return res.report.nodes_before, stage[-1].nodes_after if stage else len(g)


# ------------------------------------------------------------------ flags
def _config(args: argparse.Namespace):
    """The effective config (its notes reach stderr through ``_show_warning``)."""
    from graphkernel.api import load_config

    return load_config(getattr(args, "flags", "") or "", getattr(args, "config", None))


def cmd_flags(args: argparse.Namespace) -> int:
    from graphkernel.flags import format_value, markdown_table

    if args.anchors:
        return _anchor_table(args)
    if args.from_string is not None:
        args.text = args.from_string
    if args.source is not None or args.text is not None:
        return _translate(args)
    if args.markdown:
        print(markdown_table())
        return 0
    cfg = _config(args)
    data = cfg.to_dict()
    if args.json:
        _emit_json(args, data)
        return 0
    width = max(len(k) for k in data)
    vwidth = max(24, *(len(format_value(e["value"])) for e in data.values()))
    print(f"{'flag':<{width}}  {'value':<{vwidth}}  origin")
    for key, entry in data.items():
        print(f"{key:<{width}}  {format_value(entry['value']):<{vwidth}}  {entry['origin']}")
        if "note" in entry:
            print(f"{'':<{width}}  note: {entry['note']}")
    for note in cfg.overrides:
        print(f"note: {note}")
    return 0


def _anchor_table(args: argparse.Namespace) -> int:
    """Every key AutoFuse or MindSpore parses, and what graphkernel does with it."""
    from graphkernel.anchors import KEYS, groups_markdown, markdown_table

    if args.markdown:
        print(markdown_table())
        print()
        print(groups_markdown())
        return 0
    rows = [{"key": k.name, "anchors": list(k.anchors), "meaning": k.meaning,
             "verdict": k.verdict, "graphkernel": k.graphkernel, "differs": k.differs}
            for k in KEYS.values()]
    if args.json:
        _emit_json(args, rows)
        return 0
    width = max(len(r["key"]) for r in rows)
    for r in rows:
        what = r["verdict"] if r["verdict"] == "honoured" else \
            f"{r['verdict']}: {r['graphkernel']}"
        print(f"{r['key']:<{width}}  {'/'.join(r['anchors']):<18}  {what}")
    return 0


def _translate(args: argparse.Namespace) -> int:
    """`flags --from ANCHOR [STRING]`: the string key by key, as the anchor and graphkernel
    read it, and the effective graphkernel flags."""
    from graphkernel.translate import format_translation, translate

    if args.source is None:
        raise ExecutionError("flags: a flag string needs --from autofuse or --from mindspore "
                             "(the anchor whose string it is)")
    t = translate(args.source, args.text)
    if args.json:
        _emit_json(args, t.to_dict())
    else:
        print(format_translation(t))
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    from graphkernel.pipeline import markdown_table, plan

    if args.markdown:
        print(markdown_table())
        return 0
    cfg = _config(args)
    rows = [{"index": d.slot.index, "stage": d.slot.stage, "name": d.slot.label,
             "level": "required" if d.slot.info.required else d.slot.info.level,
             "on": d.on, "reason": d.reason, "doc": d.slot.info.summary} for d in plan(cfg)]
    if args.json:
        _emit_json(args, rows)
        return 0
    print(f"opt_level {cfg.opt_level}")
    w = {k: max(len(h), *(len(str(r[k])) for r in rows)) for k, h in
         (("index", "idx"), ("stage", "stage"), ("name", "pass"), ("level", "level"))}
    print(f"{'idx':<{w['index']}}  {'stage':<{w['stage']}}  {'pass':<{w['name']}}  "
          f"{'level':<{w['level']}}  {'on':<3}  why")
    for r in rows:
        print(f"{r['index']:<{w['index']}}  {r['stage']:<{w['stage']}}  {r['name']:<{w['name']}}  "
              f"{str(r['level']):<{w['level']}}  {'on' if r['on'] else 'off':<3}  {r['reason']}")
    return 0


def cmd_patterns(args: argparse.Namespace) -> int:
    """Every fusion pattern: order, level, direction and mode, what it fuses, and the
    refusals its own rules give (every pattern also meets the common ones)."""
    from graphkernel.patterns.base import all_patterns
    from graphkernel.refusals import BY_CODE, COMMON
    from graphkernel.refusals import markdown_table as codes_table

    if args.codes:
        if args.markdown:
            print(codes_table())
        elif args.json:
            _emit_json(args, [{"code": r.code, "name": r.name, "meaning": r.meaning,
                               "autofuse": r.autofuse} for r in BY_CODE.values()])
        else:
            for r in BY_CODE.values():
                af = f" (AutoFuse {r.autofuse})" if r.autofuse else ""
                print(f"{r.code}  {r.name:<17} {r.meaning}{af}")
        return 0
    from graphkernel.passes.split import enabled_patterns

    cfg = _config(args)
    _, off = enabled_patterns(cfg)
    rows = [{"name": p.name, "order": p.order, "level": p.level, "direction": p.direction,
             "mode": p.mode, "on": p.name not in off, "why_off": off.get(p.name, ""),
             "fuses": p.doc, "refuses": [{"code": c, "name": BY_CODE[c].name}
                                         for c in p.refuses],
             "refuses_also": list(COMMON)} for p in all_patterns()]
    if args.json:
        _emit_json(args, rows)
        return 0
    if args.markdown:
        print("| pattern | level | direction, mode | what it fuses | its refusals |")
        print("|---|---|---|---|---|")
        for r in rows:
            codes = ", ".join(f"`{c['code']}` {c['name']}" for c in r["refuses"]) or "—"
            print(f"| `{r['name']}` | {r['level']} | {r['direction']}, {r['mode']} | "
                  f"{' '.join(r['fuses'].split())} | {codes} |")
        return 0
    import textwrap

    print(f"fusion patterns in the order the split model runs them (opt_level "
          f"{cfg.opt_level}); every one may also refuse with "
          + ", ".join(f"{c} {BY_CODE[c].name}" for c in COMMON))
    for r in rows:
        state = "on" if r["on"] else f"off ({r['why_off']})"
        print(f"\n{r['name']}  level {r['level']}, {r['direction']} {r['mode']}, {state}")
        for line in textwrap.wrap(" ".join(r["fuses"].split()), 92):
            print(f"    {line}")
        if r["refuses"]:
            print("    refuses: " + ", ".join(f"{c['code']} {c['name']}"
                                             for c in r["refuses"]))
    print("\nthe codes: graphkernel patterns --codes")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from graphkernel.api import compile as gk_compile

    g = _load(args.model)
    flags = args.flags or ""
    cfg = _config(args)
    if args.out:
        from graphkernel.flags import confine_to

        confine_to(cfg, args.out, "-o/--out")
    if args.out and cfg.dump_as_text and cfg.origin("debug_dir") == "default":
        flags = f"{flags} --debug_dir={args.out}"
    previous = None
    if args.out:
        from graphkernel.outdir import previous_outputs

        previous = previous_outputs(args.out)  # (the digests it recorded are known now)
        _digest_data_files(g)
    # g becomes res.graph; as _load returned it (only its data files' digests were read)
    res = gk_compile(g, flags, args.config, log=progress.write, copy=False,
                     checked_on_load=True)
    rep = res.report
    written = _write_outputs(args, res, previous)
    if args.json:
        _emit_json(args, rep.to_dict() | {"written": [str(w) for w in written]})
        _say_written(args, written)  # on stderr, as all human text with --json
        return 0
    print(f"compiled {res.graph.name}: {rep.nodes_before} -> {rep.nodes_after} nodes in "
          f"{rep.seconds * 1e3:.1f} ms (opt_level {res.config.opt_level}, "
          f"{counted(rep.bisect_applications, 'rewrite')})")
    for p in [] if args.quiet else rep.passes:
        if p.ran:
            change = counted(p.rewrites, "rewrite") if p.changed else "no change"
            print(f"  {p.index:<5} {p.stage:<11} {p.label:<16} {p.seconds * 1e3:8.2f} ms  "
                  f"{change:<13} {p.summary}".rstrip())
            for note in p.notes if args.verbose and p.notes != [p.summary] else []:
                print(f"        {note}")
        else:
            print(f"  {p.index:<5} {p.stage:<11} {p.label:<16}      off    {p.reason}")
    ex = rep.extra
    if "gm_bytes_fused" in ex:
        ratio = ex["gm_bytes_fused"] / ex["gm_bytes_ideal"] if ex["gm_bytes_ideal"] else 1.0
        print(f"kernels: {ex['kernels_unfused']} -> {ex['kernels_fused']} launches; GM bytes: "
              f"{ex['gm_bytes_unfused']:,} unfused, {ex['gm_bytes_fused']:,} fused, "
              f"{ex['gm_bytes_ideal']:,} ideal (fused/ideal {ratio:.3f})")
        if "modeled_us_fused" in ex:
            print(f"modeled time on {ex['target']}: {ex['modeled_us_unfused']:.1f} us unfused, "
                  f"{ex['modeled_us_fused']:.1f} us fused (a cost model, not a measurement)")
        for k in ex["kernels"][:20]:
            print(f"  {k['name']:<44} {k['ops']:>3} ops  [{k['pattern']}]  "
                  f"{k['bytes_read'] + k['bytes_written']:,} B")
        if len(ex["kernels"]) > 20:
            print(f"  ... {len(ex['kernels']) - 20} more kernels in report.json")
        for e in ex.get("externs", []):
            call = e["arguments"]
            what = (f"{call['input_layout']}, head_num {call['head_num']}"
                    if "input_layout" in call else  # an attention; else a MoE operator
                    ", ".join(f"{k} {v}" for k, v in call.items()))
            print(f"  {e['name']:<44} extern {e['operator']} ({what})  "
                  f"{e['bytes_read'] + e['bytes_written']:,} B")
    for kernel, files in res.replacements.items():
        print(f"replace_kernel: {kernel} uses {', '.join(sorted(files))} from "
              f"{res.config.replace_kernel} (built and checked in the simulator)")
    if res.config.dump_as_text:
        print(f"dumps in {res.config.debug_dir}")
    _say_written(args, written)
    return 0


def _say_written(args: argparse.Namespace, written: list[Path]) -> None:
    folder = Path(args.out) / "kernels" if args.out else None
    kernels = [w for w in written if folder and w.is_relative_to(folder)]
    for w in written:
        if w not in kernels:
            print(f"wrote {w}")
    if kernels:
        drivers = sum(1 for w in kernels if w.name.endswith("_cpu.cpp"))
        sources = sum(1 for w in kernels if w.parent == folder) - 1
        print(f"wrote {folder}/: {sources} Ascend C sources, CMakeLists.txt and {drivers} "
              "CPU-model drivers with their data (cpu/)")


def _digest_data_files(g: Any) -> None:
    """Start digesting the data files the model's constants are views of, while the graph
    compiles: the compiled graph shares them (``outputs.share_file``), and its manifest
    records their digests."""
    from graphkernel.fileio import source_of

    files = {}
    for c in g.constants:
        found = source_of(c.attrs["value"])
        if found is not None:
            files.setdefault(id(found[0]), found[0])
    for mm in files.values():
        outputs.digest_soon(mm.fd)


def _write_outputs(args: argparse.Namespace, res: Any, previous: list | None = None
                   ) -> list[Path]:
    """The compiled graph, report, kernels and manifest (-o), ONNX and HTML files: all of
    them, or (when one fails) none. A reused -o folder then loses the files its previous
    manifest lists that this run did not write again (nothing else in it is touched):
    ``previous``, read before the compile (``outdir.previous_outputs``), or read now."""
    from graphkernel.dump import as_json, report_document
    from graphkernel.outdir import previous_outputs, remove_stale

    written: list[Path] = []
    if previous is None:
        previous = previous_outputs(args.out) if args.out else []
    notes: list[str] = []
    with outputs.transaction():
        if args.export_onnx:
            from graphkernel.frontends.onnx_export import export_onnx

            written.append(Path(export_onnx(res.graph, args.export_onnx)))
        if args.html:
            from graphkernel.html_report import write_html

            written.append(Path(write_html(res, args.html, notes)))
        if args.out:
            from graphkernel.codegen.backend import write_project
            from graphkernel.frontends.json_format import save_graph

            # names from the model never become paths: the graph's name is sanitized and
            # every file is checked to stay inside -o
            folder = outputs.Folder(args.out)
            written += save_graph(res.graph, folder.path(
                outputs.file_name(res.graph.name) + ".compiled.json"), share_data=True)
            written.append(folder.write_json("report.json", report_document(res.report),
                                             as_json))
            written += write_project(res, args.out, [*written, *res.dumps])
    for note in notes:
        progress.write(f"graphkernel: note: {note}")
    if args.out:
        done = remove_stale(args.out, previous, [*written, *res.dumps])
        if done.removed:
            progress.write(f"graphkernel: note: removed {len(done.removed)} files of the "
                           f"previous run from {args.out} (listed in its manifest.json; nothing "
                           "else was touched)")
        for p in done.changed:
            progress.write(f"graphkernel: note: left {printable(str(p))}: a file of the previous "
                           "run whose content changed since graphkernel wrote it")
        if done.unrecorded:
            progress.write(f"graphkernel: note: left {len(done.unrecorded)} files of the "
                           f"previous run in {args.out}: its manifest.json records no digest "
                           "of what was written (an older graphkernel), so they are not "
                           "removed")
    return written


def cmd_explain(args: argparse.Namespace) -> int:
    from graphkernel.api import compile as gk_compile
    from graphkernel.explain import explain, format_explain

    g = _load(args.model)
    res = gk_compile(g, args.flags or "", args.config)
    d = explain(res, args.node)
    if args.node and not (d["candidates"] or d["not_fusable"] or d["kernels"]
                          or d["attention"]):
        from graphkernel.errors import GraphError, did_you_mean

        raise GraphError(f"no node {args.node!r} took part in fusion"
                         + did_you_mean(args.node, [n.name for n in g.nodes]))
    if args.json:
        _emit_json(args, d)
    else:
        print(format_explain(d))
    return 0


def _load_plugins(args: argparse.Namespace) -> None:
    """Run --plugin files: a plugin is code, and runs as code; it registers its own passes,
    expanders and patterns. Its failure is reported as the plugin's (exit 1); a name it takes
    twice is a RegistrationError naming both registrations (exit 2)."""
    import runpy
    import traceback

    from graphkernel import registry

    loaded: set[Path] = set()
    for path in getattr(args, "plugin", None) or []:
        p = Path(path)
        if not p.is_file():
            raise ExecutionError(f"--plugin {path}: no such file")
        if p.resolve() in loaded:
            continue  # the same file given twice
        loaded.add(p.resolve())
        registry.PLUGIN_FILES.add(str(p))
        try:
            runpy.run_path(str(p), run_name=f"graphkernel_plugin_{p.stem}")
        except GraphKernelError:
            raise
        except Exception as e:
            frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(p)]
            at = f" at {p}:{frames[-1].lineno}" if frames else ""
            if isinstance(e, SyntaxError):
                at, e = f" at {p}:{e.lineno}", SyntaxError(e.msg)
            raise PluginError(f"--plugin {path}: the plugin failed while loading{at}: "
                              f"{type(e).__name__}: {e}") from None


def _inputs(args: argparse.Namespace, g: Graph):
    return _load_inputs(args.inputs, g) if getattr(args, "inputs", None) else None



def _with_config(args: argparse.Namespace) -> str:
    """The command's flags with ``--config FILE`` as ``--path=FILE`` in front: the same file
    precedence, for commands that compile many times from one flag string."""
    flags = args.flags or ""
    config = getattr(args, "config", None)
    if not config:
        return flags
    if re.search(r"[\s;]", config):
        raise ExecutionError(f"--config {config!r}: a flags file path with spaces or ';' cannot "
                             "be passed on to verify and bisect (rename or link the file)")
    return f"--path={config} {flags}".strip()


def _observer(t: progress.Task):
    """verify/bisect progress: the runs so far, where the culprit is, the run under way."""
    from graphkernel.bisect import Observer

    class Shown(Observer):
        where = ""

        def evaluation(self, what: str) -> None:
            t.advance(f"{self.where}: {what}" if self.where else what)

        def candidates(self, text: str) -> None:
            self.where = text

    return Shown()


def cmd_verify(args: argparse.Namespace) -> int:
    from graphkernel.bisect import Evaluator

    g = _load(args.model)
    with progress.task("verify") as t:
        ev = Evaluator(g, _inputs(args, g), _with_config(args), args.backend,
                       observer=_observer(t))
        j, _ = ev.run()
    if args.json:
        _emit_json(args, {"match": not j.bad, "reason": j.reason, "cosine": j.cosine,
                          "cosine_unoptimized": ev.base_cosine,
                          "rmse": j.rmse, "rmse_unoptimized": j.rmse_base,
                          "reference": ev.reference_dtype,
                          "outputs": j.report.to_dict()["outputs"]})
    else:
        for m in j.report.outputs:
            line = m.line()
            if not j.bad and not m.passed:  # within noise of the reference: not a mismatch
                line = line.replace(": MISMATCH  ", ": outside tolerance, within noise  ", 1)
            print(line)
        print(("MISMATCH: " + j.reason) if j.bad else
              f"MATCH: compiled vs unoptimized within tolerance or within noise of the "
              f"{ev.reference_dtype} reference (worst cos vs the reference: compiled "
              f"{j.cosine:.6f}, unoptimized {ev.base_cosine:.6f})")
    return 1 if j.bad else 0


def cmd_bisect(args: argparse.Namespace) -> int:
    from graphkernel.bisect import bisect as run_bisect
    from graphkernel.dump import to_json

    g = _load(args.model)
    plugins = [str(Path(p).resolve()) for p in getattr(args, "plugin", None) or []]
    with progress.task("bisect") as t:
        res = run_bisect(g, _inputs(args, g), _with_config(args), args.backend, args.reference,
                         args.repro_dir, log=lambda line: progress.write(line, sys.stdout),
                         observer=_observer(t), plugins=plugins)
    if args.json:
        _emit_json(args, res.to_dict())
    else:
        print(res.summary())
    if args.report:
        outputs.write_file(args.report, to_json(res.to_dict()).encode())
    return 0


def cmd_realcheck(args: argparse.Namespace) -> int:
    """Every kernel of a compiled project type-checked against the real Ascend C headers."""
    from graphkernel.codegen import realcheck

    if args.config:
        _config(args)  # checked as every command checks it (the project is already compiled)
    headers = realcheck.find_headers(args.ascend_headers)
    if headers is None:
        raise ExecutionError("no Ascend C headers: " + realcheck.HOW)
    results = realcheck.check_project(args.project, headers)
    summary = realcheck.summary(results)
    if args.json:
        _emit_json(args, {"headers": headers.origin, "summary": summary,
                          "results": [{"kernel": r.unit.name, "kind": r.unit.kind,
                                       "mode": r.mode, "ok": r.ok, "error": r.error,
                                       "deprecated": r.deprecated} for r in results]})
    else:
        print(f"Ascend C headers: {headers.origin}")
        for r in results:
            print("  " + r.line())
        print(f"{summary['kernels']} kernels, {summary['tiling_files']} host tiling files, "
              f"{summary['drivers']} CPU-model drivers ({summary['results']} compiles): "
              f"{summary['failed_kernels']} kernels and {summary['failed_other']} other files "
              "failed")
    return 1 if summary["failed_results"] else 0


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphkernel",
        description="Graph-kernel fusion compiler for Ascend NPUs. MODEL is a graphkernel "
                    ".json/.yaml graph or an .onnx model.")
    p.add_argument("--version", action="version", version=f"graphkernel {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true",
                        help="no progress display and no per-pass lines")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="per-node detail (every expansion, fallback, recompute ...)")
    common.add_argument("--jobs", type=_positive_int, metavar="N",
                        help="g++ runs at once when building simulator kernels (default 1, "
                             "or GRAPHKERNEL_JOBS); results do not depend on it")

    def command(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    s = command("info", help="node count, op histogram, inputs and outputs of a model",
                       description="Show a model's size, op histogram, inputs and outputs.")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--config", metavar="FILE", help="a JSON or YAML flags file (info does not "
                   "compile; the file is checked like every command's)")
    s.set_defaults(fn=cmd_info)

    s = command("run", help="run a model through the numpy interpreter",
                       description="Run a model op by op with the numpy reference semantics.")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--inputs", metavar="IN.npz", help="input arrays by graph input name")
    s.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    s.add_argument("--dims", metavar="S=N,...", help="sizes of symbolic dims for random inputs "
                                                     "(default 4 each)")
    s.add_argument("--compute-dtype", choices=["float32", "float64"], default=None,
                   help="keep every float value in this precision (a high-precision reference)")
    s.add_argument("--out", metavar="OUT.npz", help="write the outputs to this file")
    s.add_argument("--backend", choices=["reference", "sim"], default="reference",
                   help="sim: compile (with --flags/--config) and run the generated kernels "
                        "in the CPU simulator")
    s.add_argument("--flags", metavar="S", default="", help="flags for --backend sim")
    s.add_argument("--config", metavar="FILE", help="a JSON or YAML flags file (--backend sim)")
    s.add_argument("--json", action="store_true", help="print the outputs' summary as JSON")
    s.set_defaults(fn=cmd_run)

    def flag_args(sp: argparse.ArgumentParser, config: bool = True) -> None:
        sp.add_argument("--flags", metavar="S", default="",
                        help='flag string, e.g. "--opt_level=2 --disable_pass=cse" (overrides '
                             "AUTOFUSE_FLAGS)")
        if config:
            sp.add_argument("--config", metavar="FILE", help="a JSON or YAML flags file")
        sp.add_argument("--plugin", metavar="FILE.py", action="append",
                        help="a Python file that registers its own passes (repeatable)")

    s = command("flags", help="the effective flags and where each value came from",
                       description="Print every flag's effective value and its origin "
                                   "(default, file, env, explicit).")
    flag_args(s)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--markdown", action="store_true",
                   help="print the table of every flag (type, default, meaning) as in the README")
    s.add_argument("--from", dest="source", choices=["autofuse", "mindspore"],
                   help="read STRING (default: the anchor's environment variables) as that "
                        "anchor's flag string: per key honoured / mapped / no effect / how it "
                        "differs, and the effective graphkernel flags")
    s.add_argument("text", nargs="?", metavar="STRING", help="an AutoFuse or MindSpore flag "
                                                             "string (with --from)")
    s.add_argument("--from-string", dest="from_string", help=argparse.SUPPRESS)
    s.add_argument("--anchors", action="store_true",
                   help="every key AutoFuse or MindSpore parses and what graphkernel does "
                        "with it")
    s.set_defaults(fn=cmd_flags)

    s = command("passes", help="the pass pipeline and why each pass is on or off",
                       description="Print the pipeline: stage, index, pass, level, on/off, why.")
    flag_args(s)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--markdown", action="store_true",
                   help="print the table of every pass (level, what it does) as in the README")
    s.set_defaults(fn=cmd_passes)

    s = command("patterns", help="every fusion pattern: level, what it fuses, its refusals",
                description="List the fusion patterns in the order the split model runs "
                            "them: level, direction and mode, what each fuses, the refusal "
                            "codes its rules give, and whether it runs under the flags.")
    flag_args(s)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--markdown", action="store_true", help="print a markdown table")
    s.add_argument("--codes", action="store_true",
                   help="the refusal codes instead (explain --json and report.json use them)")
    s.set_defaults(fn=cmd_patterns)

    s = command("compile", help="run the pass pipeline on a model",
                       description="Run the pipeline; print a summary; write report.json, the "
                                   "compiled graph and (with --dump_as_text) per-pass dumps.")
    s.add_argument("model", metavar="MODEL")
    flag_args(s)
    s.add_argument("-o", "--out", metavar="DIR", help="write report.json, the compiled graph "
                                                      "and dumps here")
    s.add_argument("--export-onnx", metavar="FUSED.onnx",
                   help="write the fused graph as ONNX (kernels as functions) for netron")
    s.add_argument("--html", metavar="REPORT.html", help="write a self-contained HTML report")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(fn=cmd_compile)

    s = command("explain", help="candidate fusions ranked by score, and why each was "
                                       "taken or refused",
                       description="Explain fusion decisions for the whole graph or one node.")
    s.add_argument("model", metavar="MODEL")
    flag_args(s)
    s.add_argument("--node", metavar="NAME", help="only fusions involving this node")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(fn=cmd_explain)

    s = command("expand", help="which composite nodes expand, and why others are kept",
                       description="Run the expanders under the given flags and print, per "
                                   "composite node, whether it was expanded or kept and why.")
    s.add_argument("model", metavar="MODEL")
    flag_args(s)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(fn=cmd_expand)

    s = command("verify", help="compiled vs unoptimized on the same inputs; exit 1 on "
                                      "mismatch",
                       description="Run the unoptimized and the compiled graph on the same "
                                   "inputs and judge the difference (exit 0 match, 1 mismatch).")
    s.add_argument("model", metavar="MODEL")
    flag_args(s)
    s.add_argument("--inputs", metavar="IN.npz")
    s.add_argument("--backend", choices=["reference", "sim"], default="reference")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(fn=cmd_verify)

    s = command("bisect", help="find the pass and rewrite that break accuracy "
                                      "(`bisect run -- CMD` bisects any program)",
                       description="Find the pass, the single rewrite and your nodes behind a "
                                   "mismatch; print a flag string that avoids it. "
                                   "`graphkernel bisect run [--max N] -- CMD ARGS...` bisects a "
                                   "program by its exit code.")
    s.add_argument("model", metavar="MODEL")
    flag_args(s)
    s.add_argument("--inputs", metavar="IN.npz")
    s.add_argument("--backend", choices=["reference", "sim"], default="reference")
    s.add_argument("--reference", choices=["auto", "float64", "float32"], default="auto",
                   help="precision of the reference run (auto: float32 for fp16/bf16 graphs)")
    s.add_argument("--report", metavar="OUT.json", help="write the result as JSON")
    s.add_argument("--repro-dir", metavar="DIR",
                   help="write the reproducer here (default: a new temporary folder)")
    s.add_argument("--json", action="store_true",
                   help="print the result as JSON (the steps go to stderr)")
    s.set_defaults(fn=cmd_bisect)

    s = command("realcheck", help="type-check a compiled project's kernels against the real "
                                  "Ascend C headers; exit 1 on an error",
                description="Compile every kernel of a folder written by `compile -o DIR` with "
                            "g++ against the Ascend C devkit and tikicpulib's CPU-debug headers "
                            "(vector, cube and MIX modes; the host tiling files as host C++) and "
                            "report each one OK or its first error (exit 0 all OK, 1 not).")
    s.add_argument("project", metavar="DIR", help="a folder written by `graphkernel compile -o`")
    s.add_argument("--ascend-headers", metavar="HEADERS",
                   help="a folder holding the Ascend C devkit, tikicpulib's headers, stub_fun.h "
                        "and kernel_tiling/ (default: GRAPHKERNEL_ASCEND_HEADERS, else the CANN "
                        "install in ASCEND_HOME_PATH)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--config", metavar="FILE", help="a JSON or YAML flags file (the project "
                   "is already compiled; checked like every command's)")
    s.set_defaults(fn=cmd_realcheck)

    s = command("ops", help="list every registered op",
                       description="List every registered op: kind, arity, attributes.")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--config", metavar="FILE", help="a JSON or YAML flags file (the ops are "
                   "the same under any flags; checked like every command's)")
    s.set_defaults(fn=cmd_ops)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("graphkernel")
    except PackageNotFoundError:  # run from a source tree
        return "(source tree)"


def _bind_flag_values(argv: list[str]) -> list[str]:
    """``--flags "--opt_level=1"``: a value that itself starts with ``--`` would be taken
    for an option by argparse, so bind it to ``--flags`` explicitly. The same for the flag
    string after ``flags --from ANCHOR`` (an argument that is not one of the command's own
    options)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--flags" and i + 1 < len(argv):
            out.append(f"--flags={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        if a == "--from" and i + 2 < len(argv) and argv[i + 2].startswith("--") and \
                re.split(r"[=;\s]", argv[i + 2])[0] not in FLAGS_OPTIONS:
            out += [argv[i + 1], f"--from-string={argv[i + 2]}"]
            i += 3
            continue
        i += 1
    return out


# the options of `graphkernel flags` (anything else after --from ANCHOR is the flag string)
FLAGS_OPTIONS = frozenset({"--flags", "--config", "--plugin", "--json", "--markdown", "--from",
                           "--anchors", "--quiet", "--verbose", "--jobs", "--help"})


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argparse, but an unknown option gets the command's own usage and the closest of its
    options (argparse would print the top-level usage and no suggestion)."""
    from graphkernel.errors import did_you_mean

    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sp = sub.choices[args.command]
    options = [o for a in sp._actions for o in a.option_strings if o.startswith("--")]
    bad = extra[0]
    if bad.startswith("-"):
        from graphkernel.anchors import KEYS
        from graphkernel.flags import SPECS

        name = bad.split("=", 1)[0]
        msg = f"unknown option {name}" + did_you_mean(name, options)
        if name[2:] in SPECS or name[2:] in KEYS:
            msg += f"; {name} is a flag: give it inside --flags \"{bad}\""
    else:
        msg = f"unexpected argument {bad!r}"
    sp.print_usage(sys.stderr)
    sp.exit(2, f"{sp.prog}: error: {printable(msg)} (see graphkernel {args.command} --help)\n")
    raise AssertionError("unreachable")  # pragma: no cover


# The output paths each command takes: (argument dest, option as the user writes it, kind).
# main() checks every one before any work, so a bad path costs nothing and writes nothing.
OUTPUTS: dict[str, list[tuple[str, str, str]]] = {
    "run": [("out", "--out", "file")],
    "compile": [("out", "-o/--out", "dir"), ("export_onnx", "--export-onnx", "file"),
                ("html", "--html", "file")],
    "bisect": [("report", "--report", "file"), ("repro_dir", "--repro-dir", "dir")],
}


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path the command was given is writable (OutputError, exit 2, if not)."""
    for dest, option, kind in OUTPUTS.get(args.command, []):
        value = getattr(args, dest, None)
        if value is not None:
            (outputs.check_dir if kind == "dir" else outputs.check_file)(value, option)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bisect", "run"]:
        from graphkernel.bisect import _main_external

        try:
            return _main_external(argv[2:])
        except GraphKernelError as e:  # e.g. a --report path that cannot be written
            print(f"graphkernel: error: {e}", file=sys.stderr)
            return e.exit_code
    parser = build_parser()
    args = _parse(parser, _bind_flag_values(argv))
    progress.auto(quiet=args.quiet)
    # --json: stdout carries exactly one JSON document; whatever else the command, a plugin
    # or a library prints goes to stderr
    args.stdout = sys.stdout
    quiet_stdout = contextlib.redirect_stdout(sys.stderr) if getattr(args, "json", False) \
        else contextlib.nullcontext()
    try:
        with warnings.catch_warnings(), quiet_stdout, _jobs(args.jobs):
            warnings.showwarning = _show_warning
            check_outputs(args)
            _load_plugins(args)
            return int(args.fn(args) or 0)
    except GraphKernelError as e:
        print(f"graphkernel: error: {printable(str(e))}", file=sys.stderr)
        return e.exit_code
    except MemoryError:
        print("graphkernel: error: out of memory (the model's tensors do not fit; give "
              "smaller sizes for its symbolic dims with --dims)", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    finally:
        progress.enable(False)


def _positive_int(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{printable(text[:20])!r}: expected a whole number "
                                         "from 1 to 1024")
    return int(text)


@contextlib.contextmanager
def _jobs(n: int | None) -> Iterator[None]:
    """``--jobs N`` for this command only (the simulator reads GRAPHKERNEL_JOBS)."""
    if n is None:
        yield
        return
    before = os.environ.get("GRAPHKERNEL_JOBS")
    os.environ["GRAPHKERNEL_JOBS"] = str(n)
    try:
        yield
    finally:
        if before is None:
            del os.environ["GRAPHKERNEL_JOBS"]
        else:
            os.environ["GRAPHKERNEL_JOBS"] = before


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Flag notes read as graphkernel's own warnings; the default filter shows each once even
    when a command resolves its flags twice."""
    from graphkernel.flags import FlagWarning

    if issubclass(category, FlagWarning):
        progress.write(f"graphkernel: warning: {printable(str(message))}")
    else:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno,
                                                          line))


def run() -> int:
    """The ``graphkernel`` program: ``main``, then leave the process without a last garbage
    collection. A compiled graph is a web of node <-> value cycles that only the collector
    frees; at interpreter exit it would walk all of them (5 of the 25 seconds of a
    100k-node compile) to free memory the operating system takes back anyway. Everything the
    command writes is closed by then, and ``atexit`` handlers still run."""
    code = main()
    gc.freeze()  # the collections at exit skip every object alive now
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
