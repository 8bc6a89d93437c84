"""Expansions of the activation family into basic ops."""

from __future__ import annotations

import math

from graphkernel.expanders.base import NUMERIC, expander

SQRT_HALF = 1 / math.sqrt(2)
SQRT_8_OVER_PI = math.sqrt(8 / math.pi)
GELU_CUBIC = 0.044715
# Abramowitz & Stegun 7.1.26: erf(x) ~ 1 - (a1 t + … + a5 t^5) exp(-x^2), t = 1 / (1 + p|x|)
AS_P = 0.3275911
AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
ERF_POLY_MAX_ABS_ERROR = 1.5e-7


@expander("GeLU")
def gelu(b, x, *, approximate):
    if approximate == "tanh":
        # x / (1 + exp(-sqrt(8/pi) * (x + 0.044715 x^3))), Ascend's cheaper form of the tanh GeLU
        inner = b.mul(b.add(x, b.mul(b.mul(b.square(x), x), GELU_CUBIC)), -SQRT_8_OVER_PI)
        return b.div(x, b.add(b.exp(inner), 1.0))
    # 0.5 x (1 + erf(x / sqrt(2)))
    return b.mul(b.mul(x, 0.5), b.add(b.erf(b.mul(x, SQRT_HALF)), 1.0))


@expander("FastGeLU")
def fast_gelu(b, x):
    # x exp(0.851 (x - |x|)) / (1 + exp(-1.702 |x|))
    ax = b.abs(x)
    num = b.mul(x, b.exp(b.mul(b.sub(x, ax), 0.851)))
    return b.div(num, b.add(b.exp(b.mul(ax, -1.702)), 1.0))


@expander("SiLU")
def silu(b, x):
    return b.mul(x, b.sigmoid(x))  # x * sigmoid(x)


@expander("Sigmoid")
def sigmoid(b, x):
    return b.sigmoid(x)  # 1 / (1 + exp(-x))


@expander("ReLU", dtypes=NUMERIC, fp32_inside=False)
def relu(b, x):
    return b.maximum(x, 0)  # max(x, 0)


@expander("LeakyReLU")
def leaky_relu(b, x, *, alpha):
    return b.select(b.greater_equal(x, 0.0), x, b.mul(x, alpha))  # x >= 0 ? x : alpha x


@expander("Elu")
def elu(b, x, *, alpha):
    return b.select(b.greater(x, 0.0), x, b.mul(b.expm1(x), alpha))  # x > 0 ? x : a(e^x - 1)


@expander("Softplus")
def softplus(b, x, *, beta, threshold):
    # beta x > threshold ? x : log(1 + exp(beta x)) / beta
    bx = b.mul(x, beta)
    soft = b.div(b.log1p(b.exp(b.minimum(bx, threshold))), beta)
    return b.select(b.greater(bx, threshold), x, soft)


def _relu6_shifted(b, x):
    return b.minimum(b.maximum(b.add(x, 3.0), 0.0), 6.0)  # min(max(x + 3, 0), 6)


@expander("HSwish")
def hswish(b, x):
    return b.mul(b.mul(x, _relu6_shifted(b, x)), 1 / 6)


@expander("HSigmoid")
def hsigmoid(b, x):
    return b.mul(_relu6_shifted(b, x), 1 / 6)


@expander("HShrink")
def hshrink(b, x, *, lambd):
    return b.select(b.greater(b.abs(x), lambd), x, 0.0)  # |x| > lambd ? x : 0


@expander("ClampScalar", dtypes=NUMERIC, fp32_inside=False)
def clamp_scalar(b, x, *, min, max):  # noqa: A002 - MindSpore's attribute names
    if min is not None:
        x = b.maximum(x, min)
    if max is not None:
        x = b.minimum(x, max)
    return x if min is not None or max is not None else b.identity(x)


@expander("Tanh", default=False, note="optional: Tanh is basic on Ascend")
def tanh(b, x):
    # 1 - 2 / (exp(2x) + 1): exp overflows to inf for large x and the result stays finite (1)
    return b.sub(1.0, b.div(2.0, b.add(b.exp(b.mul(x, 2.0)), 1.0)))


@expander("Erf", default=False,
          note=f"optional approximation: max abs error {ERF_POLY_MAX_ABS_ERROR:g} (A&S 7.1.26)")
def erf(b, x):
    ax = b.abs(x)
    t = b.reciprocal(b.add(b.mul(ax, AS_P), 1.0))
    poly = b.mul(t, AS_A[4])
    for a in reversed(AS_A[:4]):  # Horner: t (a1 + t (a2 + t (a3 + t (a4 + t a5))))
        poly = b.mul(b.add(poly, a), t)
    y = b.sub(1.0, b.mul(poly, b.exp(b.neg(b.square(x)))))
    return b.mul(b.sign(x), y)


@expander("Cosh")
def cosh(b, x):
    return b.mul(b.add(b.exp(x), b.exp(b.neg(x))), 0.5)  # (e^x + e^-x) / 2


@expander("Sinh")
def sinh(b, x):
    return b.mul(b.sub(b.exp(x), b.exp(b.neg(x))), 0.5)  # (e^x - e^-x) / 2


@expander("Acosh")
def acosh(b, x):
    return b.log(b.add(x, b.sqrt(b.sub(b.square(x), 1.0))))  # log(x + sqrt(x^2 - 1))


@expander("Asinh")
def asinh(b, x):
    # sign(x) log(|x| + sqrt(x^2 + 1))
    ax = b.abs(x)
    return b.mul(b.sign(x), b.log(b.add(ax, b.sqrt(b.add(b.square(ax), 1.0)))))
