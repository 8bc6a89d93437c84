"""Composite activations (expanded by expanders/activations.py)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from graphkernel.opdefs.composite import elementwise, erf, sigmoid
from graphkernel.ops import Attrs


class GeLUAttrs(Attrs):
    approximate: Literal["none", "tanh"] = "none"


class AlphaAttrs(Attrs):
    alpha: float = 0.01


class EluAttrs(Attrs):
    alpha: float = 1.0


class SoftplusAttrs(Attrs):
    beta: float = 1.0
    threshold: float = 20.0


class LambdAttrs(Attrs):
    lambd: float = 0.5


class ClampAttrs(Attrs):
    min: float | None = None
    max: float | None = None


def gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def fast_gelu(x):
    return x * np.exp(0.851 * (x - np.abs(x))) / (1 + np.exp(-1.702 * np.abs(x)))


def softplus(x, beta=1.0, threshold=20.0):
    bx = beta * x
    return np.where(bx > threshold, x, np.log1p(np.exp(np.minimum(bx, threshold))) / beta)


def clamp(x, min=None, max=None):  # noqa: A002 - MindSpore's attribute names
    if min is not None:
        x = np.maximum(x, min)
    if max is not None:
        x = np.minimum(x, max)
    return x


A = "activation"
elementwise("GeLU", 1, gelu, GeLUAttrs, aliases=("Gelu",), category=A)
elementwise("FastGeLU", 1, fast_gelu, aliases=("FastGelu",), category=A)
elementwise("SiLU", 1, lambda x: x * sigmoid(x), aliases=("Swish",), category=A)
elementwise("Sigmoid", 1, sigmoid, category=A)
elementwise("ReLU", 1, lambda x: np.maximum(x, 0), aliases=("Relu",), cls="numeric", category=A)
elementwise("LeakyReLU", 1, lambda x, alpha: np.where(x >= 0, x, alpha * x), AlphaAttrs,
            aliases=("LeakyReLUExt", "LeakyRelu"), category=A)
elementwise("Elu", 1, lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)), EluAttrs,
            aliases=("EluExt",), category=A)
elementwise("Softplus", 1, softplus, SoftplusAttrs, aliases=("SoftplusExt",), category=A)
elementwise("HSwish", 1, lambda x: x * np.clip(x + 3, 0, 6) / 6, aliases=("HardSwish",),
            category=A)
elementwise("HSigmoid", 1, lambda x: np.clip(x + 3, 0, 6) / 6, category=A)
elementwise("HShrink", 1, lambda x, lambd: np.where(np.abs(x) > lambd, x, 0), LambdAttrs,
            category=A)
elementwise("ClampScalar", 1, clamp, ClampAttrs, cls="numeric", category=A,
            scalars=("min", "max"))
elementwise("Cosh", 1, np.cosh, category=A)
elementwise("Sinh", 1, np.sinh, category=A)
elementwise("Acosh", 1, np.arccosh, aliases=("AcoshExt",), category=A)
elementwise("Asinh", 1, np.arcsinh, aliases=("AsinhExt",), category=A)
