"""Composite losses (expanded by expanders/losses.py)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from graphkernel.opdefs.composite import composite, elementwise, elementwise_infer
from graphkernel.ops import Attrs, OpKind
from graphkernel.tensor_types import TensorType

L = "loss"


def sigmoid_ce(x, y):
    """max(x, 0) - x*y + log(1 + exp(-|x|)): stable for any x."""
    return np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))


class ReductionAttrs(Attrs):
    reduction: Literal["mean", "sum", "none"] = "mean"


def _reduced_infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
    t = elementwise_infer("float")(ins, attrs)[0]
    return [t if attrs["reduction"] == "none" else TensorType((), t.dtype)]


def _reduce(loss: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "mean":
        return np.asarray(loss.mean())
    if reduction == "sum":
        return np.asarray(loss.sum())
    return loss


def _bce_logits_ref(xs, a, ctx):
    """torch's form: (1-y)x + (1+(pw-1)y)(log(1+exp(-|x|)) + max(-x, 0)), times weight."""
    x, y, w, pw = xs
    log_weight = 1 + (pw - 1) * y
    loss = (1 - y) * x + log_weight * (np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0))
    return _reduce(loss * w, a["reduction"])


def _bce_ref(xs, a, ctx):
    """-w (y log x + (1-y) log(1-x)), each log clamped at -100 as torch does."""
    x, y = xs[0], xs[1]
    w = xs[2] if len(xs) == 3 else 1.0
    with np.errstate(divide="ignore"):
        lx = np.maximum(np.log(x), -100.0)
        l1x = np.maximum(np.log(1 - x), -100.0)
    return _reduce(-w * (y * lx + (1 - y) * l1x), a["reduction"])


elementwise("SigmoidCrossEntropyWithLogits", 2, sigmoid_ce, category=L)
composite("BCEWithLogitsLoss", (4, 4), _reduced_infer, _bce_logits_ref, ReductionAttrs,
          category=L, kind=OpKind.REDUCE)
composite("BinaryCrossEntropy", (2, 3), _reduced_infer, _bce_ref, ReductionAttrs, category=L,
          kind=OpKind.REDUCE)
