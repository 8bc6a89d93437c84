"""Expansions of the in-place optimizer ops into basic ops + Assign (the write-back)."""

from __future__ import annotations

from graphkernel.expanders.base import expander


def _adam_moments(b, m, v, grad, beta1, one_minus_beta1, beta2, one_minus_beta2):
    m_new = b.add(b.mul(beta1, m), b.mul(one_minus_beta1, grad))
    v_new = b.add(b.mul(beta2, v), b.mul(one_minus_beta2, b.square(grad)))
    return m_new, v_new


@expander("AssignAdd")
def assign_add(b, ref, value):
    return b.assign(ref, b.add(ref, value))  # ref += value


@expander("ApplyMomentum")
def apply_momentum(b, var, accum, lr, grad, momentum, *, use_nesterov):
    # accum = accum momentum + grad; var -= lr accum (Nesterov: grad lr + accum momentum lr)
    acc = b.add(b.mul(accum, momentum), grad)
    step = b.add(b.mul(grad, lr), b.mul(b.mul(acc, momentum), lr)) if use_nesterov else \
        b.mul(lr, acc)
    return [b.assign(var, b.sub(var, step)), b.assign(accum, acc)]


@expander("Adam")
def adam(b, var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, *,
         use_nesterov):
    # lr_t = lr sqrt(1 - b2^t) / (1 - b1^t); var -= lr_t m / (sqrt(v) + eps)
    m_new, v_new = _adam_moments(b, m, v, grad, beta1, b.sub(1.0, beta1), beta2,
                                 b.sub(1.0, beta2))
    lr_t = b.div(b.mul(lr, b.sqrt(b.sub(1.0, beta2_power))), b.sub(1.0, beta1_power))
    mom = b.add(b.mul(beta1, m_new), b.mul(b.sub(1.0, beta1), grad)) if use_nesterov else m_new
    step = b.div(b.mul(lr_t, mom), b.add(b.sqrt(v_new), epsilon))
    return [b.assign(var, b.sub(var, step)), b.assign(m, m_new), b.assign(v, v_new)]


@expander("AdamWeightDecay")
def adam_weight_decay(b, var, m, v, lr, beta1, beta2, epsilon, decay, grad):
    # update = m / (sqrt(v) + eps) + decay var; var -= lr update (no bias correction)
    m_new, v_new = _adam_moments(b, m, v, grad, beta1, b.sub(1.0, beta1), beta2,
                                 b.sub(1.0, beta2))
    update = b.add(b.div(m_new, b.add(b.sqrt(v_new), epsilon)), b.mul(decay, var))
    return [b.assign(var, b.sub(var, b.mul(lr, update))), b.assign(m, m_new),
            b.assign(v, v_new)]


def _apply_one(b, grad, v, m, var, lr, beta1, omb1, beta2, omb2, decay, epsilon):
    m_new, v_new = _adam_moments(b, m, v, grad, beta1, omb1, beta2, omb2)
    update = b.add(b.div(m_new, b.add(b.sqrt(v_new), epsilon)), b.mul(decay, var))
    return v_new, m_new, b.sub(var, b.mul(lr, update))


@expander("AdamApplyOneWithDecay")
def adam_apply_one_with_decay(b, *ins):
    return list(_apply_one(b, *ins))


@expander("AdamApplyOneWithDecayAssign")
def adam_apply_one_with_decay_assign(b, grad, v, m, var, *rest):
    v_new, m_new, var_new = _apply_one(b, grad, v, m, var, *rest)
    return [b.assign(v, v_new), b.assign(m, m_new), b.assign(var, var_new)]


@expander("LambApplyOptimizerAssign")
def lamb_apply_optimizer(b, grad, v, m, var, beta1, omb1, beta2, omb2, epsilon, steps,
                         do_use_weight, weight_decay_rate):
    # m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t); update = m_hat/(sqrt(v_hat)+eps) + w wd var
    m_new, v_new = _adam_moments(b, m, v, grad, beta1, omb1, beta2, omb2)
    m_hat = b.div(m_new, b.sub(1.0, b.pow(beta1, steps)))
    v_hat = b.div(v_new, b.sub(1.0, b.pow(beta2, steps)))
    update = b.add(b.div(m_hat, b.add(b.sqrt(v_hat), epsilon)),
                   b.mul(b.mul(do_use_weight, weight_decay_rate), var))
    return [b.broadcast_to(update, list(var.shape)), b.assign(v, v_new), b.assign(m, m_new)]


@expander("LambApplyWeightAssign")
def lamb_apply_weight(b, w_norm, g_norm, lr, update, var):
    # ratio = w_norm > 0 ? (g_norm > 0 ? w_norm / g_norm : 1) : 1; var -= lr ratio update
    ratio = b.select(b.greater(w_norm, 0.0),
                     b.select(b.greater(g_norm, 0.0), b.div(w_norm, g_norm), 1.0), 1.0)
    return b.assign(var, b.sub(var, b.mul(b.mul(lr, ratio), update)))


@expander("ClipByNormNoDivSum")
def clip_by_norm_no_div_sum(b, x, threshold, zero, floor):
    # g = x > thr; max(g ? sqrt(g ? x : zero) : x, floor)
    g = b.greater(x, threshold)
    return b.maximum(b.select(g, b.sqrt(b.select(g, x, zero)), x), floor)
