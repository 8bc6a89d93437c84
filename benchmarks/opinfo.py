"""PyTorch's OpInfo samples through ``torch.compile(backend="graphkernel")`` against eager.

    python benchmarks/opinfo.py [--samples N] [--limit K] [--ops REGEX] [--list]

The op database PyTorch's own test suite uses (``torch.testing._internal.
common_methods_invocations.op_db``; it imports ``expecttest``, in the ``dev`` extra): every
op that supports float32 on the CPU, its first ``N`` samples (default 2), each sample run
eagerly and then through a fresh ``torch.compile`` of the same call (seeded alike, so ops
drawing random numbers draw the same ones). A sample whose eager run raises is not counted.

Each counted sample lands in exactly one row of the table:

- ``own kernels``: at least one op ran in a kernel graphkernel compiled (vector, cube, MIX
  or extern launches), the rest (if any) through torch op by op;
- ``ops through torch``: graphkernel compiled the graph, but every op in it runs through
  torch (Opaque launches only: an op or dtype graphkernel has no kernel for);
- ``graph through torch``: graphkernel gave the whole graph back to torch (its reason is
  counted below the table: complex dtypes, effect tokens, a failing pass ...);
- ``no graph``: Dynamo handed the backend nothing to compile (the call is a constant, or
  Dynamo ran it itself);
- ``raised``: the compiled call raised where eager ran;
- ``mismatched``: its outputs differ from eager's (``torch.testing.assert_close`` with
  ``equal_nan``; dtype, shape and each element at float32's tolerances of accuracy.md,
  widened to rtol 1e-4, atol 1e-5 against float32 accumulation-order noise; a difference
  beyond that is judged against float64 eager: a mismatch only when graphkernel's error is
  more than twice eager float32's own).

Why ops ran through torch is counted by reason (the same reason text the backend logs).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ROWS = ("own kernels", "ops through torch", "graph through torch", "no graph", "raised",
        "mismatched")
RTOL, ATOL = 1e-4, 1e-5
SEED = 0


@dataclass
class Outcome:
    """What one sample did: its row, and the reasons it (or some of its ops) ran through
    torch; ``error`` for a raise or a mismatch, or graphkernel's own failure (a bug report)
    on a sample that then ran through torch."""

    row: str
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    compared: str = "values"  # "shapes": eager's values are uninitialised memory


def opinfos(pattern: str | None = None) -> list[Any]:
    """The OpInfos that support float32 on the CPU (optionally those whose ``name.variant``
    matches ``pattern``), in op_db's order."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    rx = re.compile(pattern) if pattern else None
    out = []
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        if rx is not None and not rx.search(full_name(op)):
            continue
        out.append(op)
    return out


def full_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def samples(op: Any, n: int) -> list[Any]:
    """The first ``n`` float32 CPU samples of ``op`` (seeded: the same ones on every run)."""
    import torch

    torch.manual_seed(SEED)
    out = []
    try:
        for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
            out.append(s)
            if len(out) >= n:
                break
    except Exception:  # noqa: BLE001 - an OpInfo whose sample generator fails on this build
        return out
    return out


def _call(op: Any, sample: Any):
    def fn(inp, args, kwargs):
        return op(inp, *args, **kwargs)

    return fn


def _clone(x: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _run(fn, sample: Any):
    import numpy as np
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    return fn(*_clone((sample.input, list(sample.args), dict(sample.kwargs))))


def _difference(want: Any, got: Any) -> str | None:
    """Why ``got`` is not ``want`` at the table's tolerances (None when it is)."""
    import torch
    from torch.utils._pytree import tree_flatten

    ws, wspec = tree_flatten(want)
    gs, gspec = tree_flatten(got)
    if len(ws) != len(gs):
        return f"{len(gs)} outputs where eager has {len(ws)}"
    for i, (w, g) in enumerate(zip(ws, gs, strict=True)):
        if isinstance(w, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"output {i} is {type(g).__name__} where eager's is {type(w).__name__}"
        if not isinstance(w, torch.Tensor):
            if w != g and not (w != w and g != g):  # NaN equals NaN here
                return f"output {i} is {g!r} where eager's is {w!r}"
            continue
        try:
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL, equal_nan=True)
        except AssertionError as e:
            return f"output {i}: " + " ".join(str(e).split())[:200]
    return None


def _noise(op: Any, sample: Any, want: Any, got: Any) -> bool:
    """Whether a difference is float32 noise: graphkernel's RMSE against float64 eager is at
    most twice eager float32's own (accuracy.md)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    def wide(t):
        return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    try:
        exact = _run(_call(op, sample), type(sample)(
            wide(sample.input), args=tree_map(wide, tuple(sample.args)),
            kwargs=tree_map(wide, dict(sample.kwargs))))
    except Exception:  # noqa: BLE001 - no float64 run to judge by
        return False
    for w, g, r in zip(tree_flatten(want)[0], tree_flatten(got)[0], tree_flatten(exact)[0],
                       strict=False):
        if not (isinstance(w, torch.Tensor) and w.is_floating_point()
                and isinstance(r, torch.Tensor) and w.shape == g.shape == r.shape):
            continue
        fin = torch.isfinite(r)
        if (torch.isfinite(g) != fin).any():
            return False
        ours = float((g.double() - r)[fin].pow(2).mean().sqrt()) if fin.any() else 0.0
        theirs = float((w.double() - r)[fin].pow(2).mean().sqrt()) if fin.any() else 0.0
        if ours > 2 * theirs + 1e-12:
            return False
    return True


def classify(stats: dict[str, Any]) -> Outcome:
    """The row of a sample that ran and matched, from ``graphkernel.torch.stats()``."""
    graphs = stats["per_graph"]
    if not graphs:
        return Outcome("no graph")
    whole = [g for g in graphs if g.get("through_torch")]
    reasons = [g["through_torch"] for g in whole]
    for g in graphs:
        reasons += list(g["fallbacks"].values())
    own = sum(sum(v for k, v in g["launches"].items() if k != "opaque") for g in graphs)
    bug = "; ".join(g["bug"] for g in graphs if g.get("bug"))
    row = "own kernels" if own else "graph through torch" if whole else "ops through torch"
    return Outcome(row, reasons, error=bug)


def check_sample(op: Any, sample: Any, options: dict[str, Any] | None = None) -> Outcome | None:
    """Run one sample eagerly and compiled; its outcome, or None when eager raises."""
    import torch

    import graphkernel.torch as gt

    fn = _call(op, sample)
    try:
        want = _run(fn, sample)
    except Exception:  # noqa: BLE001 - eager raises: nothing to hold graphkernel to
        return None
    torch._dynamo.reset()
    gt.reset_stats()
    compiled = torch.compile(fn, backend="graphkernel", options=options or {})
    try:
        got = _run(compiled, sample)
    except Exception as e:  # noqa: BLE001 - what the table counts
        inner = getattr(e, "inner_exception", None) or e  # (Dynamo's BackendCompilerFailed)
        lines = [x.strip() for x in str(inner).splitlines() if x.strip()]
        return Outcome("raised", error=f"{type(inner).__name__}: {lines[0] if lines else ''}"
                       [:300])
    finally:
        torch._dynamo.reset()
    why = _difference(want, got)
    out = classify(gt.stats())
    if why is not None and _uninitialised(fn, sample):
        why = _difference(_shapes(want), _shapes(got))
        out.compared = "shapes"
    if why is not None and not _noise(op, sample, want, got):
        return Outcome("mismatched", error=why)
    return out


def _shapes(x: Any) -> Any:
    """Each tensor as an empty one of its shape and dtype."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: torch.zeros((), dtype=t.dtype).expand(t.shape)
                    if isinstance(t, torch.Tensor) else t, x)


def _uninitialised(fn, sample: Any) -> bool:
    """Whether an output of eager's run is (partly) uninitialised memory: it comes from an
    allocating op that leaves its result unwritten (``empty``, ``empty_like``, ``new_empty``
    ...) and no op wrote into it afterwards. Its values then differ from run to run, so only
    its shape and dtype can be compared."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def storages(x: Any) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in tree_flatten(x)[0]
                if isinstance(t, torch.Tensor) and t.numel()}

    class Watch(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.unset: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            schema = func._schema
            written = [a for a, arg in zip(args, schema.arguments, strict=False)
                       if arg.alias_info is not None and arg.alias_info.is_write]
            written += [kwargs[arg.name] for arg in schema.arguments if arg.name in kwargs
                        and arg.alias_info is not None and arg.alias_info.is_write]
            self.unset -= storages(written)
            if func.overloadpacket.__name__.lstrip("_").startswith(("empty", "new_empty")):
                self.unset |= storages(out)
            return out

    watch = Watch()
    try:
        with watch:
            got = _run(fn, sample)
    except Exception:  # noqa: BLE001 - eager ran once; it is not judged here
        return False
    return bool(watch.unset & storages(got))



def _short(reason: str) -> str:
    """A reason without the details that differ per op (names, shapes, the op a dtype was
    met in), to count by kind."""
    reason = re.sub(r"^no mapping for \S+$", "no mapping for the ATen op (no handler)", reason)
    reason = re.sub(r" \([^()]*\)$", "", reason)
    reason = re.sub(r"\[[^\]]*\]", "[..]", reason)
    reason = re.sub(r"'[^']*'", "'..'", reason)
    return reason[:110]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    ap.add_argument("--ops", default=None, help="only ops whose name.variant matches REGEX")
    ap.add_argument("--limit", type=int, default=0, help="only the first K ops (0: all)")
    ap.add_argument("--list", action="store_true", help="list every raise and mismatch")
    a = ap.parse_args(argv)
    if a.samples < 1 or a.limit < 0:
        print("error: --samples must be >= 1 and --limit >= 0", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    for name in ("graphkernel", "torch._dynamo", "torch._inductor", "torch.fx"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import torch

    from graphkernel import progress

    torch._logging.set_logs(dynamo=logging.ERROR)  # graph breaks: not this table's subject
    torch._dynamo.config.suppress_errors = False
    ops = opinfos(a.ops)
    if a.limit:
        ops = ops[:a.limit]
    rows: Counter = Counter()
    reasons: Counter = Counter()
    bad: list[str] = []
    bugs: list[str] = []  # samples graphkernel failed on (run through torch, a bug report)
    skipped = shapes_only = 0
    t0 = time.perf_counter()
    progress.auto()
    with progress.task("ops", len(ops)) as shown:
        for op in ops:
            shown.describe(full_name(op))
            for i, s in enumerate(samples(op, a.samples)):
                out = check_sample(op, s)
                if out is None:
                    skipped += 1
                    continue
                rows[out.row] += 1
                shapes_only += out.compared == "shapes"
                for r in set(out.reasons):
                    reasons[_short(r)] += 1
                if any(r.startswith("bug in graphkernel") for r in out.reasons):
                    bugs.append(f"{full_name(op)}[{i}]: {out.error or 'see the log'}")
                if out.row in ("raised", "mismatched"):
                    bad.append(f"{full_name(op)}[{i}] {out.row}: {out.error}")
            shown.advance()
    total = sum(rows.values())
    print(f"OpInfo samples through torch.compile(backend='graphkernel'): {len(ops)} ops, "
          f"float32, CPU, first {a.samples} samples each ({skipped} samples skipped: eager "
          f"raises); {time.perf_counter() - t0:.0f} s")
    print(f"{'samples':<22} {total:>6}")
    for r in ROWS:
        print(f"{r:<22} {rows.get(r, 0):>6}")
    print(f"(of these, {shapes_only} compared in shape and dtype only: eager returns "
          "uninitialised memory)")
    print("reasons ops ran through torch (samples):")
    for r, k in reasons.most_common():
        print(f"  {k:>5}  {r}")
    if bugs:
        print(f"graphkernel's own failures, run through torch ({len(bugs)}):")
        for line in bugs:
            print(f"  {line}")
    if bad:
        print(f"raised or mismatched ({len(bad)}):")
        for line in bad if a.list else bad[:40]:
            print(f"  {line}")
    return 1 if rows.get("raised") or rows.get("mismatched") else 0


if __name__ == "__main__":
    sys.exit(main())
