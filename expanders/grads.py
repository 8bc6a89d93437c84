"""Expansions of the gradient ops of training graphs."""

from __future__ import annotations

import math

from graphkernel.expanders.base import NUMERIC, expander, static_dims
from graphkernel.opdefs.arithmetic import channel_axis
from graphkernel.opdefs.norms import ln_axes, softmax_axes

SQRT_HALF = 1 / math.sqrt(2)
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
GELU_CUBIC = 0.044715


@expander("ReluGrad", dtypes=NUMERIC, fp32_inside=False)
def relu_grad(b, dy, x):
    return b.select(b.greater(x, 0), dy, 0)  # x > 0 ? dy : 0


@expander("SigmoidGrad")
def sigmoid_grad(b, y, dy):
    return b.mul(b.mul(dy, y), b.sub(1.0, y))  # dy y (1 - y)


@expander("TanhGrad")
def tanh_grad(b, y, dy):
    return b.mul(dy, b.sub(1.0, b.square(y)))  # dy (1 - y^2)


@expander("SqrtGrad")
def sqrt_grad(b, y, dy):
    return b.div(dy, b.mul(y, 2.0))  # dy / (2 y)


@expander("RsqrtGrad")
def rsqrt_grad(b, y, dy):
    return b.mul(b.mul(dy, b.mul(b.square(y), y)), -0.5)  # -0.5 dy y^3


@expander("GeLUGrad")
def gelu_grad(b, dy, x, y, *, approximate):
    if approximate == "tanh":
        # t = tanh(u), u = sqrt(2/pi)(x + 0.044715 x^3):
        # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        x2 = b.square(x)
        t = b.tanh(b.mul(b.add(x, b.mul(b.mul(x2, x), GELU_CUBIC)), SQRT_2_OVER_PI))
        du = b.mul(b.add(b.mul(x2, 3 * GELU_CUBIC), 1.0), SQRT_2_OVER_PI)
        left = b.mul(b.add(t, 1.0), 0.5)
        right = b.mul(b.mul(b.mul(x, b.sub(1.0, b.square(t))), du), 0.5)
        return b.mul(dy, b.add(left, right))
    # d/dx = Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)), phi = exp(-x^2/2)/sqrt(2 pi)
    cdf = b.mul(b.add(b.erf(b.mul(x, SQRT_HALF)), 1.0), 0.5)
    pdf = b.mul(b.exp(b.mul(b.square(x), -0.5)), INV_SQRT_2PI)
    return b.mul(dy, b.add(cdf, b.mul(x, pdf)))


def _sigmoid_grad_form(b, dy, x, scale):
    # d/dx [x sigmoid(k x)] = s + k x s (1 - s), s = sigmoid(k x)
    s = b.sigmoid(b.mul(x, scale) if scale != 1.0 else x)
    inner = b.mul(b.mul(b.mul(x, s), b.sub(1.0, s)), scale) if scale != 1.0 else \
        b.mul(b.mul(x, s), b.sub(1.0, s))
    return b.mul(dy, b.add(s, inner))


@expander("FastGeLUGrad")
def fast_gelu_grad(b, dy, x):
    return _sigmoid_grad_form(b, dy, x, 1.702)  # FastGeLU(x) = x sigmoid(1.702 x)


@expander("SiLUGrad")
def silu_grad(b, dy, x):
    return _sigmoid_grad_form(b, dy, x, 1.0)  # dy (s + x s (1 - s))


@expander("SoftplusGrad")
def softplus_grad(b, dy, x, *, beta, threshold):
    bx = b.mul(x, beta)
    return b.select(b.greater(bx, threshold), dy, b.mul(dy, b.sigmoid(bx)))


@expander("SigmoidCrossEntropyWithLogitsGrad")
def sigmoid_ce_grad(b, x, y, dout):
    return b.mul(b.sub(b.sigmoid(x), y), dout)  # (sigmoid(x) - y) dout


@expander("BiasAddGrad", dtypes=NUMERIC)
def bias_add_grad(b, dy, *, data_format):
    c = channel_axis(dy.type.rank, data_format)
    return b.reduce_sum(dy, [i for i in range(dy.type.rank) if i != c])


@expander("SoftmaxGrad")
def softmax_grad(b, y, dy, *, axis):
    axes = list(softmax_axes(y.type.rank, axis))
    return b.mul(b.sub(dy, b.reduce_sum(b.mul(dy, y), axes, keep_dims=True)), y)


@expander("LogSoftmaxGrad")
def log_softmax_grad(b, y, dy, *, axis):
    axes = list(softmax_axes(y.type.rank, axis))
    return b.sub(dy, b.mul(b.exp(y), b.reduce_sum(dy, axes, keep_dims=True)))


@expander("LayerNormGrad", validators=[static_dims(
    lambda n: ln_axes(n.inputs[1].type.rank, n.attrs)[0], "normalized dims")])
def layer_norm_grad(b, dy, x, var, mean, gamma, *, begin_norm_axis, begin_params_axis, epsilon):
    # xhat = (x - mean) rstd; g = dy gamma;
    # dx = rstd/N (N g - sum(g) - xhat sum(g xhat)); dgamma = sum_batch(dy xhat); dbeta = sum(dy)
    axes, p = ln_axes(x.type.rank, {"begin_norm_axis": begin_norm_axis,
                                    "begin_params_axis": begin_params_axis})
    n = 1
    for a in axes:
        n *= x.shape[a]
    rstd = b.rsqrt(b.add(var, epsilon))
    xhat = b.mul(b.sub(x, mean), rstd)
    g = b.mul(dy, gamma)
    sum_g = b.reduce_sum(g, axes, keep_dims=True)
    sum_gx = b.reduce_sum(b.mul(g, xhat), axes, keep_dims=True)
    inner = b.sub(b.sub(b.mul(g, float(n)), sum_g), b.mul(xhat, sum_gx))
    dx = b.mul(b.mul(rstd, 1.0 / n), inner)
    batch = list(range(p))
    dgamma = b.reduce_sum(b.mul(dy, xhat), batch) if batch else b.mul(dy, xhat)
    dbeta = b.reduce_sum(dy, batch) if batch else b.identity(dy)
    return [dx, dgamma, dbeta]


@expander("WeightNormGrad")
def weight_norm_grad(b, dw, v, g, norms, *, dim):
    # dg = sum(dw v) / |v|; dv = g / |v| (dw - v dg / |v|)
    axes = [a for a in range(v.type.rank) if dim == -1 or a != dim % v.type.rank]
    dot = b.reduce_sum(b.mul(dw, v), axes, keep_dims=True)
    norms = b.reshape(norms, list(dot.type.shape))
    dg = b.div(dot, norms)
    scale = b.div(b.reshape(g, list(dot.type.shape)), norms)
    dv = b.mul(scale, b.sub(dw, b.mul(v, b.div(dg, norms))))
    return [dv, b.reshape(dg, list(g.type.shape))]


def _regroup(b, x, split: list[int], perm: list[int], out: list[int]):
    """x reshaped to ``split``, permuted by ``perm`` and merged to ``out``."""
    return b.reshape(b.op("Transpose", b.reshape(x, split), perm=perm), out)


def _zero_insert(b, y, s: list[int]):
    """[N, M, OH, OW] with s-1 zeros after every element along OH and OW: [N, M, OH*s, OW*s]
    (a transposed convolution's input, built from Concats with zeros)."""
    for axis, step in enumerate(s):
        if step == 1:
            continue
        shape = list(y.shape)
        part = b.op("ExpandDims", y, axis=[3 + axis])
        zeros = b.broadcast_to(b.const(0, like=y), [*shape[:3 + axis], step - 1,
                                                     *shape[3 + axis:]])
        both = b.op("Concat", part, zeros, axis=3 + axis)
        shape[2 + axis] *= step
        y = b.reshape(both, shape)
    return y


# fp32_inside=False: the convolutions take fp16/bf16 as they are (the cube accumulates in
# fp32) and everything else only moves elements
@expander("Conv2DBackpropInput", fp32_inside=False)
def conv2d_backprop_input(b, dy, w, *, input_size, strides, pads, dilations, group):
    # dx = the correlation of the zero-inserted dy with the flipped, group-transposed weight
    # (a transposed convolution written as a plain one): dy gets s-1 zeros between elements,
    # d(k-1) - pad_begin rows before it and as many after as make H (cropped where negative)
    m, cg, kh, kw = w.shape
    g = group
    wt = _regroup(b, w, [g, m // g, cg, kh, kw], [0, 2, 1, 3, 4], [g * cg, m // g, kh, kw])
    wt = b.op("StridedSlice", wt, begin=[-1, -1], end=[-kh - 1, -kw - 1], strides=[-1, -1],
              axes=[2, 3])
    z = _zero_insert(b, dy, strides)
    before, after, crop = [], [], []
    for i, k in enumerate((kh, kw)):
        size = z.shape[2 + i]
        lo = dilations[i] * (k - 1) - pads[i]  # the window reaches this far before row 0
        hi = input_size[2 + i] - size + pads[i]  # H + pad_begin - OH s (pad_end set OH)
        crop.append((max(-lo, 0), size - max(-hi, 0)))
        before.append(max(lo, 0))
        after.append(max(hi, 0))
    if any(lo or hi != z.shape[2 + i] for i, (lo, hi) in enumerate(crop)):
        z = b.op("StridedSlice", z, begin=[lo for lo, _ in crop], end=[hi for _, hi in crop],
                 strides=[1, 1], axes=[2, 3])
    return b.op("Conv2D", z, wt, strides=[1, 1], dilations=list(dilations), group=g,
                pads=[*before, *after])


@expander("Conv2DBackpropFilter", fp32_inside=False)
def conv2d_backprop_filter(b, dy, x, *, filter_size, strides, pads, dilations, group):
    # dw = a convolution of x (channels as the batch, the batch as the channels) by dy,
    # striding by the dilation and dilating by the stride; the padded input may hold more
    # windows than the kernel has taps, which are cut off
    n, ch, h, wd = x.shape
    m, oh, ow = dy.shape[1:]
    g = group
    xt = _regroup(b, x, [n, g, ch // g, h, wd], [2, 1, 0, 3, 4], [ch // g, g * n, h, wd])
    dyt = _regroup(b, dy, [n, g, m // g, oh, ow], [1, 2, 0, 3, 4], [m, n, oh, ow])
    dw = b.op("Conv2D", xt, dyt, strides=list(dilations), dilations=list(strides), group=g,
              pads=list(pads))
    if list(dw.shape[2:]) != list(filter_size[2:]):
        dw = b.op("StridedSlice", dw, begin=[0, 0], end=list(filter_size[2:]), strides=[1, 1],
                  axes=[2, 3])
    return b.op("Transpose", dw, perm=[1, 0, 2, 3])
