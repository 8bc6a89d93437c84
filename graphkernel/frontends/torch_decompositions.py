"""The decomposition table torch.compile graphs are traced with: the core ATen
decompositions, each rule checked against its op, the fused attention overloads kept whole."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("graphkernel.torch")


# ATen ops traced whole: the fused attention overloads and their backwards, imported as
# FusedAttention / FusedAttentionGrad (graphkernel/frontends/fx.py). The math overload
# (``_scaled_dot_product_attention_math``, what torch itself runs for dropout or a mask that
# needs its gradient) stays an exact decomposition.
KEEP_WHOLE = frozenset({
    "aten.scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_cudnn_attention_backward",
})
_REFUSED: dict[str, str] = {}  # decomposition rules refused, with why (logged once each)


def decompositions(checked: bool = True) -> dict[Any, Callable[..., Any]]:
    """The decomposition table training and inference graphs are traced with: the core ATen
    decompositions without the ops of ``KEEP_WHOLE``, each rule checked against its op.

    A rule stands in for its op only where it returns what the op returns: the same number
    of outputs, each of the op's shape and dtype (``faithful``). An op's backward reads the
    forward's outputs as the op defines them, so a rule that returns something else there
    (torch's rule for the CPU flash attention returns the attention weights [B, H, L, S]
    where the op returns its logsumexp [B, H, L]) would feed the backward the wrong saved
    tensor. Refused, the op is traced whole and runs as itself. (``checked=False``: the
    rules as they are, for an inference graph, whose outputs no backward reads.)"""
    return {op: faithful(op, rule) if checked else rule for op, rule in _core_rules()}


@functools.cache
def _core_rules() -> tuple[tuple[Any, Callable[..., Any]], ...]:
    """torch's core ATen rules without ``KEEP_WHOLE``'s ops, read once per process: torch
    builds the table anew on each call (a scan of every namespace's ops, ~0.1-0.25 s), and
    it does not change once torch is imported. The checks (``faithful``) stay per table."""
    from torch._decomp import core_aten_decompositions

    return tuple((op, rule) for op, rule in core_aten_decompositions().items()
                 if str(op).rsplit(".", 1)[0] not in KEEP_WHOLE)


_CHECKING = threading.local()  # inside a check: an op's own run may come back to its rule


def faithful(op: Any, rule: Callable[..., Any]) -> Callable[..., Any]:
    """``rule`` (a decomposition of ``op``) where its outputs match the op's own in count,
    shape and dtype on the arguments at hand; elsewhere NotImplemented (make_fx then traces
    the op itself). Both are run on the fake arguments without tracing, once per kind of
    argument (shapes, dtypes, plain values); an op that writes its arguments is not run
    twice, and its rule is taken as it is."""
    if op._schema.is_mutable:
        return rule
    verdicts: dict[Any, bool] = {}

    def checked(*args: Any, **kwargs: Any) -> Any:
        if getattr(_CHECKING, "on", False):  # (the op itself decomposes to this rule)
            return rule(*args, **kwargs)
        key = _signature((args, kwargs))
        ok = verdicts.get(key)
        if ok is None:
            _CHECKING.on = True
            try:
                ok = verdicts[key] = _same_outputs(op, rule, args, kwargs)
            finally:
                _CHECKING.on = False
        return rule(*args, **kwargs) if ok else NotImplemented

    return checked


def _signature(x: Any) -> Any:
    """A hashable key of an argument structure: tensors by shape and dtype."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(str(d) for d in x.shape), str(x.dtype))
    if isinstance(x, dict):
        return tuple((k, _signature(v)) for k, v in sorted(x.items()))
    if isinstance(x, list | tuple):
        return tuple(_signature(v) for v in x)
    return (type(x).__name__, str(x))


def _same_outputs(op: Any, rule: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether ``rule`` returns what ``op`` returns on these (fake) arguments."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    from torch.utils._pytree import tree_map

    def fresh() -> tuple[tuple, dict]:  # new lists around the same tensors: some rules
        return tree_map(lambda x: x, (args, kwargs))  # write into the lists they are given

    try:
        with disable_proxy_modes_tracing():  # (the sizes compared too: symbolic ones are
            a, k = fresh()  # expressions the tracer must not record)
            want = op(*a, **k)
            a, k = fresh()
            got = rule(*a, **k)
            if got is NotImplemented:
                return True
            why = _output_difference(want, got)
    except Exception:  # noqa: BLE001 - not checkable here: the rule runs as it would have
        return True
    if why is None:
        return True
    name = str(op)
    if name not in _REFUSED:
        _REFUSED[name] = why
        log.info("decomposition of %s not used: %s; the op is traced whole", name, why)
    return False


def _output_difference(want: Any, got: Any) -> str | None:
    """What differs between an op's outputs and its rule's (None when nothing does)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    ws = list(want) if isinstance(want, list | tuple) else [want]
    gs = list(got) if isinstance(got, list | tuple) else [got]
    if len(ws) != len(gs):
        return f"{len(gs)} outputs where the op has {len(ws)}"
    for i, (w, g) in enumerate(zip(ws, gs, strict=True)):
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if isinstance(w, torch.Tensor) != isinstance(g, torch.Tensor):
                return f"output {i} is {type(g).__name__} where the op's is {type(w).__name__}"
            continue
        same = len(w.shape) == len(g.shape) and all(
            statically_known_true(a == b) for a, b in zip(w.shape, g.shape, strict=True))
        if not same or w.dtype != g.dtype:
            return (f"output {i} is {g.dtype} {list(g.shape)} where the op's is "
                    f"{w.dtype} {list(w.shape)}")
    return None
