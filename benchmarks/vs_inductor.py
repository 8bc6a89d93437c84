"""graphkernel vs TorchInductor (CPU) on the model zoo.

    python benchmarks/vs_inductor.py [--attn sdpa|eager] [--zoo] [--training] [--dynamic]
                                     [--export] [model ...]
    python benchmarks/vs_inductor.py --cnn [--export] [model ...]   # the CNN zoo
    python benchmarks/vs_inductor.py --cnn --held-out [model ...]   # the held-out CNN families
    python benchmarks/vs_inductor.py --held-out [--training] [model ...]  # held-out transformers

Table 1 is what a PyTorch user gets: each zoo model compiled with ``torch.compile`` on both
sides (inference, no grad, the same inputs, caches off, Dynamo reset in between).
Inductor's launches are read from its generated code: the calls of its fused kernels
(``cpp_fused_*``; each call counts, since Inductor compiles one kernel for layers whose code
is identical and calls it once per layer) and extern calls (``extern_kernels.*``, its matmuls
and convolutions, and the ATen ops it calls as they are, ``torch.ops.aten.*``: its attention
with sdpa models). graphkernel's are its launches by kind (``graphkernel.torch.stats()``):
vector kernels, cube (a matrix product alone), mix (a product with fused vector work), extern
and Opaque (ops run through torch).
Compile time is the first call on both sides (Dynamo + AOT + the backend); graphkernel's
outputs are checked against eager. The models are built with the library's default attention
(``--attn sdpa``: ``F.scaled_dot_product_attention``) or with eager attention (``--attn
eager``: explicit matmuls and softmax, as in the earlier tables); ``FA/layer`` is
graphkernel's fused-attention launches per attention layer (the layers counted in an eager
forward: calls of scaled_dot_product_attention, or of softmax over attention scores, not a
router's over experts), the target being 1.
Parameters are frozen on graphkernel's side (its default
under no_grad); Inductor reads them as inputs through strided views, which costs it nothing.

The models are the zoo and the further architectures of ``export_models.families`` (``--zoo``:
the zoo only), each in its family (``export_models.FAMILY``). After each table, a summary per
family: models, how many at or under Inductor's launches, the geometric mean of graphkernel's
launches over Inductor's and the worst model; then the same over every model. ``--training``
adds the table of one training step (train mode: the forward and backward graphs of both
sides, gradients against eager), ``--dynamic`` the table of ``dynamic=True`` (one compile
serving three input sizes, as ``dynamic_shapes.py`` calls it: the launches are those of every
graph compiled, on both sides; ``floor`` is the graphs Dynamo makes by itself, with a
backend that runs each graph as it is: no backend can make fewer). A ``generate()`` loop
compiles its model's forward (the prompt's graph and the growing cache's) and is not trained.

Table 2 (``--export``) is the export path: ``graphkernel.torch.export_graph`` + the pipeline
at opt_level 2, with graphkernel's fusion time (the passes up to split) against Inductor's
(the time spent in ``Scheduler.__init__``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from graphkernel import progress  # noqa: E402

KINDS = ("vector", "cube", "mix", "extern", "opaque")


def _count(code) -> tuple[int, int]:
    """(fused-kernel launches, extern calls) in Inductor's generated modules: every call of a
    ``cpp_fused_*`` kernel in a module's ``call()`` is a launch, however many calls share one
    compiled kernel."""
    kernels = externs = 0
    for src in code:  # one module per compiled graph
        body = src[src.find("def call("):] if "def call(" in src else src
        kernels += len(re.findall(r"\bcpp_fused_\w+\(", body))
        externs += len(re.findall(r"extern_kernels\.\w+\(", body))
        # ATen ops it calls as they are (its fallback kernels: scaled_dot_product_attention)
        externs += len(re.findall(r"= torch\.ops\.\w+\.\w+\.\w+\(", body))
    return kernels, externs


def _loss_step(fn, args):
    """One training step's forward and backward, with the gradient check's loss (so both
    compilers see the same backward graph as the gradient check)."""
    from graphkernel.torch import step_loss

    out = fn(*args)
    step_loss(out).backward()
    return out


def inductor(model, args, mode: str = "inference", calls=None):
    """(fused kernels, extern calls, fusion seconds, first-call seconds) over every graph
    Inductor compiled: ``inference`` (no grad), ``training`` (one step in train mode: the
    forward and backward graphs) or ``dynamic`` (``dynamic=True``, called with each of
    ``calls``)."""
    import copy

    import torch
    import torch._inductor.config as cfg
    import torch._inductor.scheduler as sched
    from export_models import compile_model
    from torch._inductor.utils import run_and_get_code

    cfg.fx_graph_cache = False
    spent = {"s": 0.0}
    orig = sched.Scheduler.__init__

    def timed(self, *a, **k):
        t = time.perf_counter()
        orig(self, *a, **k)
        spent["s"] += time.perf_counter() - t

    sched.Scheduler.__init__ = timed
    try:
        torch._dynamo.reset()
        if mode == "training":
            twin = copy.deepcopy(model).train()
            fn = compile_model(twin, backend="inductor")
            t0 = time.perf_counter()
            _, code = run_and_get_code(_loss_step, fn, args)
        else:
            fn = compile_model(model, backend="inductor",
                               dynamic=True if mode == "dynamic" else None)
            t0 = time.perf_counter()
            with torch.no_grad():
                _, code = run_and_get_code(lambda: [fn(*c) for c in calls or [args]])
        total = time.perf_counter() - t0
    finally:
        sched.Scheduler.__init__ = orig
    return (*_count(code), spent["s"], total)


def _matches(got, want) -> bool:
    import torch

    try:  # accuracy.md: fp32 against eager fp32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    except AssertionError:
        return False
    return True


def ours_compiled(model, args):
    """(launches by kind, graphs, fallbacks, first-call seconds, matches eager)."""
    import torch
    from export_models import compile_model

    import graphkernel.torch as gt

    torch._dynamo.reset()
    gt.reset_stats()
    with torch.no_grad():
        want = model(*args)
        t0 = time.perf_counter()
        got = compile_model(model, backend="graphkernel")(*args)
        total = time.perf_counter() - t0
    s = gt.stats()
    return s["launches"], s["graphs"], s["fallbacks"], total, _matches(got, want)


def ours_exported(model, args, name):
    """(vector kernels, other launches, GM bytes, fusion seconds, seconds)."""
    import graphkernel
    import graphkernel.torch as gt

    t0 = time.perf_counter()
    g = gt.export_graph(model, args, name=name)
    res = graphkernel.compile(g, "--opt_level=2", env={})
    total = time.perf_counter() - t0
    until_split = sum(p.seconds for p in res.report.passes
                      if p.stage in ("preprocess", "expand", "simplify", "cluster", "split"))
    by_kind = gt.launch_counts(res.graph)
    return (by_kind["vector"], sum(by_kind.values()) - by_kind["vector"],
            res.report.extra["gm_bytes_fused"], until_split, total)


def warm_up() -> None:
    """Pay each side's one-time costs (imports, Inductor's C++ toolchain) outside the table."""
    import torch

    import graphkernel.torch as gt

    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.rand(2, 8)
    inductor(m, (x,))
    inductor(m, (x,), "training")
    ours_compiled(m, (x,))
    gt.reset_stats()


def _ratio(ours: int, ind: int) -> str:
    return f"{ours / ind:>5.2f}" if ind else "    -"


def summary(rows: dict[str, tuple[int, int]], failed: list[str]) -> None:
    """Per family and over all: models, how many at or under Inductor's launches, the
    geometric mean of ours/Inductor's and the worst model (name and ratio)."""
    from export_models import family

    groups: dict[str, list[str]] = {}
    for name in rows:
        groups.setdefault(family(name), []).append(name)
    print(f"{'family':<16} {'models':>6} {'<= ind':>6} {'geomean':>7}  worst")

    def line(label: str, names: list[str]) -> None:
        ratios = {n: rows[n][0] / rows[n][1] for n in names if rows[n][1]}
        if not ratios:
            return
        geo = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
        worst = max(ratios, key=ratios.get)
        under = sum(r <= 1 for r in ratios.values())
        print(f"{label:<16} {len(ratios):>6} {under:>6} {geo:>7.3f}  {worst} "
              f"{ratios[worst]:.2f} ({rows[worst][0]}/{rows[worst][1]})")

    for fam in sorted(groups):
        line(fam, groups[fam])
    line("all", list(rows))
    if failed:
        print("does not compile: " + "; ".join(failed))


def _header(extra: str) -> None:
    print(f"{'model':<16} {'family':<15} {'ind fused':>9} {'extern':>6} {'total':>5} | "
          f"{'vector':>6} {'cube':>4} {'mix':>3} {'extern':>6} {'opaque':>6} {'total':>5} "
          f"{'ratio':>5} | {extra}")


def _row(name: str, k: int, e: int, launches: dict, rest: str) -> str:
    from export_models import family

    total = sum(launches.values())
    return (f"{name:<16} {family(name):<15} {k:>9} {e:>6} {k + e:>5} | "
            + " ".join(f"{launches[x]:>{max(len(x), 3)}}" for x in KINDS)
            + f" {total:>5} {_ratio(total, k + e)} | {rest}")


def _failure(e: Exception) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return next((x for x in lines if "Error:" in x), type(e).__name__)[:200]


def _eager_error(model, calls) -> str | None:
    """The first error line when the model's own eager forward raises on one of ``calls``
    (argument tuples), else None: such a row is no compiler's failure."""
    import torch

    try:
        with torch.no_grad():
            for c in calls:
                model(*c)
    except Exception as err:  # noqa: BLE001 - the model's own failure, reported as such
        lines = [x.strip() for x in str(err).splitlines() if x.strip()]
        return f"{type(err).__name__}: {lines[0] if lines else ''}"
    return None


def _skip_if_eager_fails(name, model, calls, eager_fails, shown) -> bool:
    """True (the row written as "eager fails" and counted in ``eager_fails``) when the
    model's own eager forward raises on ``calls``."""
    why = _eager_error(model, calls)
    if why:
        eager_fails.append(f"{name}: {why}")
        progress.write(f"{name:<16} eager fails (not compiled)", sys.stdout)
        shown.advance()
    return bool(why)


def compiled_table(zoo) -> None:
    from export_models import attention_layers

    import graphkernel.torch as gt

    print("torch.compile, inference (launches: Inductor fused + extern; graphkernel by kind)")
    _header(f"{'FA/layer':>8} {'compile s (ind/ours)':>20}  eager")
    rows, failed, fallbacks, wrong, unfused, eager_fails = {}, [], {}, [], [], []
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            model, args = build(), inputs()
            if _skip_if_eager_fails(name, model, [args], eager_fails, shown):
                continue
            shown.describe(f"{name}: Inductor")
            k, e, _, t_ind = inductor(model, args)
            shown.describe(f"{name}: graphkernel")
            try:
                launches, _, fb, t_ours, ok = ours_compiled(model, args)
            except Exception as err:  # noqa: BLE001 - a model that does not compile
                failed.append(f"{name}: {_failure(err)}")
                progress.write(f"{name:<16} does not compile", sys.stdout)
                shown.advance()
                continue
            layers = attention_layers(model, args)
            attentions = gt.stats()["attentions"]  # (of the compile ours_compiled made)
            rows[name] = (sum(launches.values()), k + e)
            if not ok:
                wrong.append(name)
            if layers and attentions < layers:  # (a generate() loop compiles several graphs)
                unfused.append(f"{name} {attentions}/{layers}")
            fallbacks.update({f"{op}: {why}": fallbacks.get(f"{op}: {why}", []) + [name]
                              for op, why in fb.items()})
            per = f"{attentions / layers:g}" if layers else "-"
            progress.write(_row(name, k, e, launches, f"{per:>8} {t_ind:>9.2f} / "
                                f"{t_ours:<8.2f}  " + ("match" if ok else "DIFF")), sys.stdout)
            shown.advance()
    summary(rows, failed)
    if eager_fails:
        print("eager fails (not a compiler's failure): " + "; ".join(eager_fails))
    print("fused attention per attention layer < 1: "
          + ("none" if not unfused else ", ".join(unfused)))
    print("outputs match eager: " + ("every model" if not wrong else "not on " + ", ".join(wrong)))
    print("Opaque fallbacks: " + ("none" if not fallbacks else "; ".join(
        f"{k} ({', '.join(v)})" for k, v in sorted(fallbacks.items()))))


def training_table(zoo) -> None:
    """One training step (train mode) on both sides: launches of the forward and backward
    graphs; graphkernel's output and gradients against eager (``zoo_training.measure``)."""
    from export_models import trainable
    from zoo_training import EagerFails, measure

    print("torch.compile, one training step in train mode (forward + backward graphs)")
    _header("output grads differing")
    rows, failed, wrong, eager_fails = {}, [], [], []
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            if not trainable(build()):
                shown.advance()
                continue
            shown.describe(f"{name}: graphkernel")
            try:
                r = measure(build, inputs)
            except EagerFails as err:  # torch's own step raises: not graphkernel's
                eager_fails.append(f"{name}: {err}")
                progress.write(f"{name:<16} eager fails (not compiled)", sys.stdout)
                shown.advance()
                continue
            except Exception as err:  # noqa: BLE001 - a model that does not compile
                failed.append(f"{name}: {_failure(err)}")
                progress.write(f"{name:<16} does not compile", sys.stdout)
                shown.advance()
                continue
            shown.describe(f"{name}: Inductor")
            k, e, _, _ = inductor(build(), inputs(), "training")
            launches = r["stats"]["launches"]
            rows[name] = (sum(launches.values()), k + e)
            ours = [p for p, v in r["judged"].items() if v == "graphkernel's"]
            if ours or r["forward"] == "DIFF" and not r["judged"]:
                wrong.append(name)
            notes = sorted({v for v in r["judged"].values() if v != "graphkernel's"})
            progress.write(_row(name, k, e, launches,
                                f"{r['forward']:<6} "
                                f"{len(r['differ'])}/{r['params']}"
                                + (f" ({len(ours)} graphkernel's; {'; '.join(notes)})"
                                   if r["differ"] else "")), sys.stdout)
            shown.advance()
    summary(rows, failed)
    if eager_fails:
        print("eager fails (not a compiler's failure): " + "; ".join(eager_fails))
    print("gradients differing because of graphkernel: "
          + ("none" if not wrong else ", ".join(wrong)))


def dynamic_table(zoo) -> None:
    """``dynamic=True`` on both sides, each model called with three input sizes."""
    import dynamic_shapes as dyn

    print("torch.compile(dynamic=True), inference, three input sizes (launches of every graph "
          "compiled)")
    _header(f"{'sizes':<20} {'graphs':>6} {'floor':>5} {'recompiles':>10} eager")
    rows, failed, short, eager_fails = {}, [], [], []
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            calls = dyn.sizes(name, inputs())
            if _skip_if_eager_fails(name, build(), calls, eager_fails, shown):
                continue
            shown.describe(f"{name}: Inductor")
            k, e, _, _ = inductor(build(), inputs(), "dynamic", calls)
            shown.describe(f"{name}: graphkernel")
            try:
                r = dyn.measure(build(), calls)
            except Exception as err:  # noqa: BLE001 - a model that does not compile
                failed.append(f"{name}: {_failure(err)}")
                progress.write(f"{name:<16} does not compile", sys.stdout)
                shown.advance()
                continue
            shown.describe(f"{name}: Dynamo alone")
            floor = dyn.dynamo_graphs(build(), calls)
            rows[name] = (sum(r["by_kind"].values()), k + e)
            if r["graphs"] > max(dyn.graphs_allowed(name), floor) or not r["ok"]:
                short.append(name)
            progress.write(_row(name, k, e, r["by_kind"],
                                f"{dyn.label(calls):<20} {r['graphs']:>6} {floor:>5} "
                                f"{r['recompiles']:>10} {'match' if r['ok'] else 'DIFF'}"),
                           sys.stdout)
            shown.advance()
    summary(rows, failed)
    if eager_fails:
        print("eager fails (not a compiler's failure): " + "; ".join(eager_fails))
    print("one compile serving three sizes (a generate() loop: the prompt's and the cache's; "
          "where Dynamo alone makes more graphs, its floor: the 'floor' column, "
          "backend=\"eager\"), matching eager: "
          + ("every model" if not short else "not on " + ", ".join(short)))


def export_table(zoo) -> None:
    from graphkernel.errors import FrontendError

    print("torch.export + pipeline at opt_level 2")
    print(f"{'model':<16} {'ind fused':>9} {'extern':>6} | {'vector':>6} {'other':>5} "
          f"{'GM MB':>6} | {'fusion s (ind/ours)':>20} {'compile s (ind/ours)':>21}")
    worst = 0.0
    with progress.task("models", len(zoo)) as shown:
        for name, (build, inputs) in zoo.items():
            shown.describe(f"{name}: Inductor")
            model, args = build(), inputs()
            k, e, s_ind, t_ind = inductor(model, args)
            shown.describe(f"{name}: graphkernel")
            try:
                v, o, gm, s_ours, t_ours = ours_exported(model, args, name)
            except FrontendError as err:  # torch.export's own limit, not the pipeline's
                progress.write(f"{name:<16} {k:>9} {e:>6} | not exported: {err}", sys.stdout)
                shown.advance()
                continue
            worst = max(worst, s_ours / t_ind)
            progress.write(f"{name:<16} {k:>9} {e:>6} | {v:>6} {o:>5} {gm / 2**20:>6.2f} | "
                           f"{s_ind:>9.3f} / {s_ours:<8.3f} {t_ind:>9.2f} / {t_ours:<9.2f}",
                           sys.stdout)
            shown.advance()
    print(f"pipeline time / Inductor end-to-end compile: worst {worst:.3f} (target <= 0.1)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="models to measure (default: all)")
    ap.add_argument("--zoo", action="store_true",
                    help="the zoo only (not the further architectures of each family)")
    ap.add_argument("--training", action="store_true", help="also the training-step table")
    ap.add_argument("--dynamic", action="store_true", help="also the dynamic=True table")
    ap.add_argument("--export", action="store_true", help="also print the export-path table")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                    help="the models' attention: the library default (sdpa) or eager")
    ap.add_argument("--cnn", action="store_true",
                    help="the convolutional networks of examples/cnn_models.py instead")
    ap.add_argument("--held-out", action="store_true",
                    help="the held-out families (not the zoo): with --cnn the CNNs', else the "
                         "architectures of moe_ssm_models.held_out_builders (MoE, SSM and "
                         "hybrid decoders, decoders, encoders, encoder-decoders, vision and "
                         "speech models)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)  # fallbacks: in the table
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    from export_models import select

    if a.cnn:
        import cnn_models

        zoo = cnn_models.select(a.models, held_out=a.held_out)
    elif a.held_out:
        import moe_ssm_models

        zoo = moe_ssm_models.select_held_out(a.models, a.attn)
    else:
        zoo = select(a.models, a.attn, more=not a.zoo)
    if zoo is None:
        return 2
    progress.auto()  # on a terminal: which model
    warm_up()
    compiled_table(zoo)
    if a.training:
        print()
        training_table(zoo)
    if a.dynamic:
        print()
        dynamic_table(zoo)
    if a.export:
        print()
        export_table({k: v for k, v in zoo.items() if trainable_name(k, v)})
    return 0


def trainable_name(name: str, entry) -> bool:
    """Whether ``export_graph`` applies (a module, not a generate() loop)."""
    from export_models import trainable

    return trainable(entry[0]())


if __name__ == "__main__":
    sys.exit(main())
