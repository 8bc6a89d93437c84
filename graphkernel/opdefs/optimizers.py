"""In-place optimizer ops (expanded by expanders/optimizers.py into basic ops + Assign).

Each writes its updated tensors back into the parameter inputs (``OpDef.writes``):
when those are mutable graph inputs, the interpreter stores the new values in
``Interpreter.state``. Scalars (lr, betas, …) are tensors of shape [] or [1].
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from graphkernel import symbolic
from graphkernel.errors import ShapeError
from graphkernel.opdefs.composite import composite, elementwise
from graphkernel.ops import Attrs, NoAttrs, check_dtype
from graphkernel.tensor_types import TensorType

O = "optimizer"  # noqa: E741


class NesterovAttrs(Attrs):
    use_nesterov: bool = False


def _update_infer(outputs: tuple[int, ...]):
    """All inputs float of one dtype; each broadcasts to the parameter (input ``outputs[0]``)."""
    def infer(ins: list[TensorType], attrs: dict) -> list[TensorType]:
        param = ins[outputs[0]]
        check_dtype(param, "float")
        for i, t in enumerate(ins):
            if t.dtype != param.dtype:
                raise ShapeError(f"input {i} dtype {t.dtype.value} differs from the parameter's "
                                 f"{param.dtype.value}")
            if symbolic.broadcast_shapes(t.shape, param.shape) != param.shape:
                raise ShapeError(f"input {i} {t} does not broadcast to the parameter {param}")
        return [ins[i] for i in outputs]

    return infer


def optimizer(name: str, names: str, outputs: tuple[int, ...], fn,
              attrs: type[BaseModel] = NoAttrs, writes: tuple[tuple[int, int], ...] = ()):
    """Register an update op whose inputs are named ``names`` (space-separated)."""
    arity = len(names.split())
    composite(name, (arity, arity), _update_infer(outputs),
              lambda xs, a, ctx: fn(*xs, **a), attrs, category=O, writes=writes)


def apply_momentum(var, accum, lr, grad, momentum, use_nesterov=False):
    accum = accum * momentum + grad
    step = grad * lr + accum * momentum * lr if use_nesterov else lr * accum
    return var - step, accum


def adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad,
         use_nesterov=False):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    lr_t = lr * np.sqrt(1 - beta2_power) / (1 - beta1_power)
    mom = beta1 * m + (1 - beta1) * grad if use_nesterov else m
    return var - lr_t * mom / (np.sqrt(v) + epsilon), m, v


def adam_weight_decay(var, m, v, lr, beta1, beta2, epsilon, decay, grad):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    update = m / (np.sqrt(v) + epsilon) + decay * var
    return var - lr * update, m, v


def adam_apply_one_with_decay(grad, v, m, var, lr, beta1, one_minus_beta1, beta2,
                              one_minus_beta2, decay, epsilon):
    """MindSpore's fused Adam step with weight decay; returns (v, m, var)."""
    m = beta1 * m + one_minus_beta1 * grad
    v = beta2 * v + one_minus_beta2 * grad * grad
    update = m / (np.sqrt(v) + epsilon) + decay * var
    return v, m, var - lr * update


def lamb_apply_optimizer(grad, v, m, var, beta1, one_minus_beta1, beta2, one_minus_beta2,
                         epsilon, steps, do_use_weight, weight_decay_rate):
    """LAMB's first half: the bias-corrected Adam direction plus weight decay; returns
    (update, v, m)."""
    m = beta1 * m + one_minus_beta1 * grad
    v = beta2 * v + one_minus_beta2 * grad * grad
    m_hat = m / (1 - beta1 ** steps)
    v_hat = v / (1 - beta2 ** steps)
    update = m_hat / (np.sqrt(v_hat) + epsilon) + do_use_weight * weight_decay_rate * var
    return np.broadcast_to(update, var.shape), v, m


def lamb_apply_weight(w_norm, g_norm, lr, update, var):
    """LAMB's second half: var -= lr * trust_ratio * update."""
    ratio = np.where(w_norm > 0, np.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
    return var - lr * ratio * update


optimizer("AssignAdd", "ref value", (0,), lambda ref, value: ref + value, writes=((0, 0),))
optimizer("ApplyMomentum", "var accum lr grad momentum", (0, 1), apply_momentum, NesterovAttrs,
          writes=((0, 0), (1, 1)))
optimizer("Adam", "var m v beta1_power beta2_power lr beta1 beta2 epsilon grad", (0, 1, 2), adam,
          NesterovAttrs, writes=((0, 0), (1, 1), (2, 2)))
optimizer("AdamWeightDecay", "var m v lr beta1 beta2 epsilon decay grad", (0, 1, 2),
          adam_weight_decay, writes=((0, 0), (1, 1), (2, 2)))
_AAOWD = "grad v m var lr beta1 one_minus_beta1 beta2 one_minus_beta2 decay epsilon"
optimizer("AdamApplyOneWithDecay", _AAOWD, (1, 2, 3), adam_apply_one_with_decay)
optimizer("AdamApplyOneWithDecayAssign", _AAOWD, (1, 2, 3), adam_apply_one_with_decay,
          writes=((0, 1), (1, 2), (2, 3)))
optimizer("LambApplyOptimizerAssign", "grad v m var beta1 one_minus_beta1 beta2 one_minus_beta2 "
          "epsilon steps do_use_weight weight_decay_rate", (3, 1, 2), lamb_apply_optimizer,
          writes=((1, 1), (2, 2)))
optimizer("LambApplyWeightAssign", "w_norm g_norm lr update var", (4,), lamb_apply_weight,
          writes=((0, 4),))
elementwise("ClipByNormNoDivSum", 4,
            lambda x, thr, zero, floor: np.maximum(np.where(x > thr, np.sqrt(
                np.where(x > thr, x, zero)), x), floor), category=O)
