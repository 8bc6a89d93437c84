"""A training step through torch.compile over the model zoo: gradients against eager.

    python benchmarks/zoo_training.py [--attn sdpa,eager] [--families] [model ...]
    python benchmarks/zoo_training.py --cnn [--held-out] [model ...]   # the CNN zoo (batch
                                                                        # norm in train)
    python benchmarks/zoo_training.py --held-out [model ...]  # held-out MoE decoders

Each zoo model, built with each attention implementation (``sdpa``: the library default,
``F.scaled_dot_product_attention``; ``eager``: explicit matmuls and softmax), runs one step of
``graphkernel.torch.step_loss(model(x)).backward()`` (the mean squared error against fixed
standard normal values, ``step_target``) in TRAIN mode (dropout on) eagerly and through
``torch.compile(model, backend="graphkernel")``, both sides from the same seeds (torch,
numpy, random) so that dropout draws the same numbers; the compiled step is the second call
(the first compiles: tracing may draw random numbers of its own). A row prints the graphs
compiled (forward and backward), launches by kind over both, the fused-attention launches
of the forward and of the backward graphs per attention layer (the layers are counted in the
eager step: calls of scaled_dot_product_attention or of softmax over attention scores, not a
router's over experts), whether the output matches eager (``noise`` when it differs but
is no further from a float64 twin's output than twice eager's noise, the farthest of
torch's fp32 paths, as the gradients are judged), and how many parameters'
gradients differ from eager (accuracy.md: rtol 1e-3, atol 1e-5 for fp32 gradients, the
same None pattern). Models with buffers (batch norm's
running statistics) also count the buffers that differ from an eager twin's after the same
two steps (``stats``: rtol 1e-4, atol 1e-6) and are further from a float64 twin's than twice
eager's noise, taken as for the gradients below (the larger over torch's fp32 paths).

A gradient that differs is then judged twice: against a float64 copy of the model
(accuracy.md: graphkernel's is wrong only when its RMSE against float64 is more than twice
eager fp32's own, the larger of torch's two CPU attention kernels' — its flash kernel and its
math path, ``sdpa_kernel(SDPBackend.MATH)``, and for a network with convolutions eager with
the model and its images in ``channels_last``, torch's other convolution layout: a
gradient behind a ReLU6 whose input sits within fp32 noise of 0, as one of mobilenet_v1's
does, changes by 100x eager's own error when another valid summation order flips its sign),
and against the same step compiled with
graphkernel off (``aot_eager``: Dynamo and AOT autograd as graphkernel gets them). When
graphkernel matches that step, the difference is torch.compile's own, not graphkernel's
(when that step raises, as Doge's backward does in torch, the difference is graphkernel's).
A model whose eager step itself raises (``EagerFails``) is listed apart, not as one that
does not compile: there is nothing to compare against.

Speech models (wav2vec2, HuBERT, WavLM ...) draw their time masking with ``numpy.random``.
By default Dynamo replaces numpy's random stream by torch's in the programs it traces, so
every compiled step, whatever its backend, masks other time steps than eager; the steps here
are compiled with ``torch._dynamo.config.use_numpy_random_stream = True`` (numpy's own
stream, what eager draws), so that the comparison is about the backend. ``--torch-random``
measures Dynamo's default instead.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from graphkernel import progress  # noqa: E402

KINDS = ("vector", "cube", "mix", "extern", "opaque")
SEED = 0
RTOL, ATOL = 1e-3, 1e-5


def _seed() -> None:
    import numpy as np
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    random.seed(SEED)


def _step(model, fn, args) -> tuple:
    """(output, {parameter: gradient}) of one seeded step of ``fn`` (``model`` compiled or
    not)."""
    import graphkernel.torch as gt

    model.zero_grad(set_to_none=True)
    _seed()
    out = fn(*args)
    gt.step_loss(out).backward()
    return out.detach(), {k: p.grad for k, p in model.named_parameters()}


def _compiled_step(model, args, backend: str) -> tuple:
    """The second step of ``model`` compiled with ``backend`` (the first compiles)."""
    import torch

    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend)
    _step(model, fn, args)
    return _step(model, fn, args)


def _close(a, b) -> bool:
    import torch

    if (a is None) != (b is None):
        return False
    if a is None:
        return True
    try:
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    except AssertionError:
        return False
    return True


def _buffers_differing(before, ours, args) -> list[str]:
    """The floating buffers (running statistics) of ``ours``, after its two compiled steps
    from ``before``'s state, that differ from the same two steps taken eagerly and are
    further from a float64 twin's than twice eager's noise: the larger of eager's distance
    and that of torch's other fp32 paths taking the same two steps (``_other_buffers``), as
    the gradients are judged (a mean of N fp32 values is only as exact as its accumulation,
    and a statistic deep in a network carries every layer's summation order before it)."""
    import torch

    eager = copy.deepcopy(before)
    for _ in range(2):
        _step(eager, eager, args)
    differ = [(k, b, c) for (k, b), c in zip(eager.named_buffers(), ours.buffers(), strict=True)
              if b.is_floating_point() and not torch.allclose(c, b, rtol=1e-4, atol=1e-6)]
    exact = _float64_steps(before, args, 2) if differ else None  # (only when needed)
    others = _other_buffers(before, args) if exact is not None else []
    out = []
    for k, b, c in differ:
        if exact is None:  # no float64 judge: every difference counts
            out.append(k)
            continue
        e = dict(exact.named_buffers())[k]
        ours_d, *theirs = (float((v.double() - e).pow(2).mean().sqrt())
                           for v in (c, b, *(o[k] for o in others)))
        if ours_d > 2 * max(theirs):  # (RMSE, as the gradients' judge)
            out.append(k)
    return out


def _other_buffers(before, args) -> list[dict]:
    """The buffers after two eager steps from ``before`` on torch's other fp32 paths, those
    the gradients' judge takes (``measure``): its math attention kernel, and for a network
    with convolutions the ``channels_last`` layout. Each is another valid summation order;
    a running statistic after a chain of batch norms moves with it (mobilenet_v2_hf's last
    ones: eager in ``channels_last`` 1.9-2.1x eager's own distance from float64)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def two_steps(model, wide):
        for _ in range(2):
            _step(model, model, wide)
        return {k: b for k, b in model.named_buffers()}

    with sdpa_kernel(SDPBackend.MATH):
        out = [two_steps(copy.deepcopy(before), args)]
    if _has_conv(before):
        twin = copy.deepcopy(before).to(memory_format=torch.channels_last)
        out.append(two_steps(twin, [a.contiguous(memory_format=torch.channels_last)
                                    if isinstance(a, torch.Tensor) and a.dim() == 4 else a
                                    for a in args]))
    return out


class EagerFails(RuntimeError):
    """The model's eager step itself raises (the message: the first error line): no
    compiler is at fault, and there is nothing to compare against."""


def _why(e: BaseException) -> str:
    """The first line of ``e``'s message that names an error, else its type's name."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return next((x for x in lines if "Error:" in x),
                f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__)


def _float64_steps(model, args, steps: int):
    """A float64 copy of ``model`` after ``steps`` seeded steps on widened inputs, or None
    when an op of the model has no float64 kernel on this machine (torch's CPU grouped
    matmul, which mixture-of-experts layers call, takes fp32/bf16/fp16 only)."""
    exact = copy.deepcopy(model).double()
    wide = [a.double() if a.is_floating_point() else a for a in args]
    try:
        for _ in range(steps):
            _step(exact, exact, wide)
    except RuntimeError:
        return None
    return exact


def _has_conv(model) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def _other_steps(model, args) -> list[tuple]:
    """(output, gradients) of the same eager step on torch's other fp32 paths: its math
    attention kernel (sdpa models), and for a network with convolutions the
    ``channels_last`` layout. The judges take eager's noise as the farthest of these and
    eager from a float64 twin (the output and the running statistics as the gradients)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # torch's other fp32 attention (sdpa models)
        out = [_step(model, model, args)]
    if _has_conv(model):  # torch's other fp32 convolution layout (CNNs)
        out.append(_channels_last_step(model, args))
    return out


def _channels_last_step(model, args) -> tuple:
    """(output, gradients) of the same eager step with the model and its 4-d inputs in
    ``channels_last``: torch's other fp32 convolution layout, another summation order. A
    gradient through a ReLU6/ReLU mask depends on the sign of each pre-activation; where
    one sits within fp32 noise of a kink (a batch-norm output of -4e-6 whose error is 4e-5),
    any other valid summation order may flip it and move every gradient before that layer
    (mobilenet_v1: by 100x eager's own error, as eager in this layout does). Eager in this
    layout measures that noise."""
    import torch

    twin = copy.deepcopy(model).to(memory_format=torch.channels_last)
    wide = [a.contiguous(memory_format=torch.channels_last)
            if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args]
    return _step(twin, twin, wide)


def measure(build, inputs) -> dict:
    """One model: launches, fused attention per layer, output and gradients against eager,
    and the verdict on each gradient that differs."""
    import torch
    from export_models import attention_layers

    import graphkernel.torch as gt

    model, args = build(), inputs()
    model.train()
    _seed()
    start = copy.deepcopy(model)
    plain = copy.deepcopy(model)
    try:  # eager first: a model whose own step raises has nothing to compare against
        layers = attention_layers(model, args)
        want_out, want = _step(model, model, args)
    except Exception as e:  # noqa: BLE001 - whatever the model raises
        raise EagerFails(_why(e)) from e
    gt.reset_stats()
    t0 = time.perf_counter()
    twin = copy.deepcopy(model)
    before = copy.deepcopy(twin)
    got_out, got = _compiled_step(twin, args, "graphkernel")
    seconds = time.perf_counter() - t0
    stats = _buffers_differing(before, twin, args)
    s = gt.stats()
    differ = [k for k in want if not _close(got[k], want[k])]
    judged: dict[str, str] = {}
    paths = None  # torch's other fp32 paths' (output, gradients), when a judge needs them
    if differ:
        exact = _float64_steps(start, args, 1)
        ref = {k: p.grad for k, p in exact.named_parameters()} if exact is not None else {}
        try:  # torch's own path: a step it cannot take judges nothing (graphkernel's)
            _, aot = _compiled_step(plain, args, "aot_eager")
        except Exception:  # noqa: BLE001 - torch.compile's failure, not the model's
            aot = None
        paths = _other_steps(model, args)
        others = [grads for _, grads in paths]
        for k in differ:
            if got[k] is not None and want[k] is not None and ref.get(k) is not None:
                ours, *theirs = (float((x.double() - ref[k]).pow(2).mean().sqrt())
                                 for x in (got[k], want[k], *(o[k] for o in others)))
                if ours <= 2 * max(theirs):
                    judged[k] = "noise (float64 judge)"
                    continue
            if aot is not None and _close(got[k], aot[k]) and not _close(aot[k], want[k]):
                judged[k] = "torch.compile's (aot_eager differs the same)"
            else:
                judged[k] = "graphkernel's"
    attentions = {role: sum(g["attentions"] for g in s["per_graph"] if g["role"] == role)
               for role in ("forward", "backward")}
    forward = "match" if torch.allclose(got_out, want_out, rtol=1e-4, atol=2e-5) else "DIFF"
    if forward == "DIFF":  # judged as the gradients are: against a float64 twin's output
        exact = copy.deepcopy(start).double()
        try:
            want64, _ = _step(exact, exact, [a.double() if a.is_floating_point() else a
                                             for a in args])
        except RuntimeError:  # (no float64 kernel for an op of the model)
            want64 = None
        if want64 is not None:  # (eager's noise: the farthest of torch's fp32 paths)
            if paths is None:
                paths = _other_steps(model, args)
            ours, *theirs = (float((x.double() - want64).pow(2).mean().sqrt())
                             for x in (got_out, want_out, *(o for o, _ in paths)))
            forward = "noise" if ours <= 2 * max(theirs) else forward
    return {"stats": s, "layers": layers, "attentions": attentions, "seconds": seconds,
            "forward": forward,
            "params": len(want), "differ": differ, "judged": judged,
            "buffers": sum(b.is_floating_point() for b in model.buffers()),
            "buffers_differ": stats}


def _per_layer(n: int, layers: int) -> str:
    return "-" if not layers else f"{n / layers:g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="zoo models to measure (default: all)")
    ap.add_argument("--attn", default="sdpa,eager",
                    help="attention implementations, comma-separated (sdpa, eager)")
    ap.add_argument("--cnn", action="store_true",
                    help="the convolutional networks of examples/cnn_models.py instead")
    ap.add_argument("--held-out", action="store_true",
                    help="the held-out families instead of the zoo: with --cnn the CNNs', "
                         "else the mixture-of-experts decoders (moe_ssm_models)")
    ap.add_argument("--torch-random", action="store_true",
                    help="Dynamo's default for numpy.random in compiled programs (torch's "
                         "random stream: compiled steps mask other time steps than eager)")
    ap.add_argument("--families", action="store_true",
                    help="also the architectures outside the zoo (partial rotary, "
                         "encoder-decoder, mixture of experts: export_models.families)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)  # fallbacks: in the table
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    import torch._dynamo.config

    torch._dynamo.config.use_numpy_random_stream = not a.torch_random
    from export_models import ATTENTION, select

    variants = [v.strip() for v in a.attn.split(",") if v.strip()]
    bad = sorted(set(variants) - set(ATTENTION))
    if bad or not variants:
        print(f"error: --attn {a.attn!r} (accepted: {', '.join(ATTENTION)})", file=sys.stderr)
        return 2
    if a.cnn:
        import cnn_models

        zoos = {"-": cnn_models.select(a.models, held_out=a.held_out)}
    elif a.held_out:
        import moe_ssm_models

        zoos = {v: moe_ssm_models.select_held_out(a.models, v) for v in variants}
    else:
        zoos = {v: select(a.models, v, a.families) for v in variants}
    if any(z is None for z in zoos.values()):
        return 2
    from export_models import trainable

    zoos = {v: {k: e for k, e in z.items() if trainable(e[0]())} for v, z in zoos.items()}
    progress.auto()
    print("torch.compile training step, TRAIN mode (forward + backward graphs): gradients "
          "against eager")
    print(f"{'model':<16} {'attn':<5} {'graphs':>6} | " + " ".join(f"{k:>6}" for k in KINDS)
          + f" {'total':>5} | {'FA/layer fwd bwd':>16} | {'step s':>6}  {'output':<6} "
          "grads differing")
    wrong, opaque, torchs, failed, eager_fails = [], {}, [], [], []
    rows = sum(len(z) for z in zoos.values())
    with progress.task("models", rows) as shown:
        for variant, zoo in zoos.items():
            for name, (build, inputs) in zoo.items():
                shown.describe(f"{name} ({variant})")
                try:
                    r = measure(build, inputs)
                except EagerFails as e:  # torch's own step raises: not graphkernel's
                    eager_fails.append(f"{name} ({variant}): {e}")
                    progress.write(f"{name:<16} {variant:<5} eager fails (not compiled): "
                                   f"{type(e.__cause__).__name__}", sys.stdout)
                    shown.advance()
                    continue
                except Exception as e:  # noqa: BLE001 - a model that does not compile
                    failed.append(f"{name} ({variant}): {_why(e)}")
                    progress.write(f"{name:<16} {variant:<5} does not compile: "
                                   f"{type(e).__name__}", sys.stdout)
                    shown.advance()
                    continue
                s, n = r["stats"], r["layers"]
                ours = [k for k, v in r["judged"].items() if v == "graphkernel's"]
                if ours or r["forward"] == "DIFF" and not r["judged"]:
                    wrong.append(f"{name} ({variant}): {', '.join(ours) or 'output'}")
                if any(v.startswith("torch.compile") for v in r["judged"].values()):
                    torchs.append(f"{name} ({variant})")
                for k, v in s["fallbacks"].items():
                    opaque.setdefault(f"{k}: {v}", set()).add(name)
                fa = (f"{_per_layer(r['attentions']['forward'], n):>5} "
                      f"{_per_layer(r['attentions']['backward'], n):>5}")
                notes = sorted({v for v in r["judged"].values() if v != "graphkernel's"})
                progress.write(
                    f"{name:<16} {variant:<5} {s['graphs']:>6} | "
                    + " ".join(f"{s['launches'][k]:>6}" for k in KINDS)
                    + f" {sum(s['launches'].values()):>5} | {n:>4} layers {fa} | "
                    f"{r['seconds']:>6.2f}  {r['forward']:<6} "
                    f"{len(r['differ'])}/{r['params']}"
                    + (f" ({len(ours)} graphkernel's; {'; '.join(notes)})" if r["differ"]
                       else "")
                    + (f"; stats differing {len(r['buffers_differ'])}/{r['buffers']}"
                       if r["buffers"] else ""), sys.stdout)
                if r["buffers_differ"]:
                    wrong.append(f"{name} ({variant}): buffers "
                                 f"{', '.join(r['buffers_differ'])}")
                shown.advance()
    print("gradients differing because of graphkernel: "
          + ("none" if not wrong else "; ".join(wrong)))
    if torchs:
        print("differing from eager the same way with graphkernel off (aot_eager): "
              + ", ".join(torchs))
    for f in failed:
        print(f"does not compile: {f[:300]}")
    for f in eager_fails:
        print(f"eager step raises (no comparison; not counted as graphkernel's): {f[:300]}")
    print("ATen ops left to torch: " + ("none" if not opaque else "; ".join(
        f"{k} ({', '.join(sorted(v))})" for k, v in sorted(opaque.items()))))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
