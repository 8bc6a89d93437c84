"""Expansions of the losses."""

from __future__ import annotations

from graphkernel.expanders.base import expander


def _log1p_exp_neg_abs(b, x):
    return b.log1p(b.exp(b.neg(b.abs(x))))  # log(1 + exp(-|x|)), never overflows


def _reduce(b, loss, reduction):
    if reduction == "none":
        return loss
    axes = list(range(loss.type.rank))
    return b.reduce_mean(loss, axes) if reduction == "mean" else b.reduce_sum(loss, axes)


@expander("SigmoidCrossEntropyWithLogits")
def sigmoid_ce(b, x, y):
    # max(x, 0) - x y + log(1 + exp(-|x|))
    return b.add(b.sub(b.maximum(x, 0.0), b.mul(x, y)), _log1p_exp_neg_abs(b, x))


@expander("BCEWithLogitsLoss")
def bce_with_logits(b, x, y, weight, pos_weight, *, reduction):
    # (1 - y) x + (1 + (pw - 1) y) (log(1 + exp(-|x|)) + max(-x, 0)), times weight
    log_weight = b.add(b.mul(b.sub(pos_weight, 1.0), y), 1.0)
    soft = b.add(_log1p_exp_neg_abs(b, x), b.maximum(b.neg(x), 0.0))
    loss = b.add(b.mul(b.sub(1.0, y), x), b.mul(log_weight, soft))
    return _reduce(b, b.mul(loss, weight), reduction)



@expander("BinaryCrossEntropy")
def binary_cross_entropy(b, x, y, *weight, reduction):
    # -w (y log x + (1 - y) log(1 - x)), logs clamped at -100 (as torch)
    lx = b.maximum(b.log(x), -100.0)
    l1x = b.maximum(b.log(b.sub(1.0, x)), -100.0)
    loss = b.neg(b.add(b.mul(y, lx), b.mul(b.sub(1.0, y), l1x)))
    if weight:
        loss = b.mul(weight[0], loss)
    return _reduce(b, loss, reduction)
