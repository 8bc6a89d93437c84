"""Composite ops' own references against torch (forward ops and autograd gradients)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_op
from tests.expanders.cases import CONVS

torch = pytest.importorskip("torch")
F = torch.nn.functional


def t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), want.detach().numpy(), rtol=rtol,
                               atol=atol)


X = np.random.default_rng(7).uniform(-5, 5, (4, 16)).astype(np.float32)
X[0, :6] = [0.0, -0.0, 25.0, -25.0, 1e-30, -1e-30]


@pytest.mark.parametrize("op,attrs,fn", [
    ("GeLU", {"approximate": "none"}, lambda x: F.gelu(x)),
    ("GeLU", {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    ("SiLU", {}, F.silu),
    ("Sigmoid", {}, torch.sigmoid),
    ("ReLU", {}, F.relu),
    ("LeakyReLU", {"alpha": 0.2}, lambda x: F.leaky_relu(x, 0.2)),
    ("Elu", {"alpha": 0.7}, lambda x: F.elu(x, 0.7)),
    ("Softplus", {"beta": 2.0, "threshold": 10.0}, lambda x: F.softplus(x, 2.0, 10.0)),
    ("HSwish", {}, F.hardswish),
    ("HSigmoid", {}, F.hardsigmoid),
    ("HShrink", {"lambd": 0.7}, lambda x: F.hardshrink(x, 0.7)),
    ("ClampScalar", {"min": -1.0, "max": 2.0}, lambda x: torch.clamp(x, -1.0, 2.0)),
    ("Cosh", {}, torch.cosh), ("Sinh", {}, torch.sinh), ("Asinh", {}, torch.asinh),
    ("Softmax", {"axis": -1}, lambda x: F.softmax(x, -1)),
    ("LogSoftmax", {"axis": 0}, lambda x: F.log_softmax(x, 0)),
])
def test_activation_references(op, attrs, fn):
    close(run_op(op, [X.astype(np.float64)], attrs), fn(t(X)))


def test_fast_gelu_is_x_sigmoid_1702x():
    close(run_op("FastGeLU", [X.astype(np.float64)]), t(X) * torch.sigmoid(1.702 * t(X)))


def test_layer_norm_and_rms_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 8))
    g, b = rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
    y, mean, var = run_op("LayerNorm", [x, g, b], {"begin_norm_axis": 1, "begin_params_axis": 1,
                                                   "epsilon": 1e-5})
    close(y, F.layer_norm(t(x), (5, 8), t(g), t(b), 1e-5))
    close(mean, t(x).mean((1, 2), keepdim=True))
    close(var, t(x).var((1, 2), unbiased=False, keepdim=True))
    w = rng.standard_normal(8)
    y, rstd = run_op("RMSNorm", [x, w], {"epsilon": 1e-6})
    close(y, F.rms_norm(t(x), (8,), t(w), 1e-6))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses(reduction):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 6)) * 4, rng.integers(0, 2, (4, 6)).astype(np.float64)
    w, pw = rng.uniform(0.5, 2, 6), rng.uniform(0.5, 2, 6)
    got = run_op("BCEWithLogitsLoss", [x, y, w, pw], {"reduction": reduction})
    close(got, F.binary_cross_entropy_with_logits(t(x), t(y), t(w), reduction=reduction,
                                                  pos_weight=t(pw)))
    p = rng.uniform(0.01, 0.99, (4, 6))
    got = run_op("BinaryCrossEntropy", [p, y, np.broadcast_to(w, (4, 6)).copy()],
                 {"reduction": reduction})
    close(got, F.binary_cross_entropy(t(p), t(y), t(np.broadcast_to(w, (4, 6)).copy()),
                                      reduction=reduction))
    close(run_op("SigmoidCrossEntropyWithLogits", [x, y]),
          F.binary_cross_entropy_with_logits(t(x), t(y), reduction="none"))


def grad_of(fn, x):
    xt = t(x).requires_grad_(True)
    y = fn(xt)
    dy = torch.from_numpy(np.random.default_rng(3).standard_normal(y.shape))
    (gx,) = torch.autograd.grad(y, xt, dy)
    return y.detach(), dy, gx


@pytest.mark.parametrize("op,fn,attrs,args", [
    ("GeLUGrad", lambda x: F.gelu(x), {"approximate": "none"}, "dy x y"),
    ("GeLUGrad", lambda x: F.gelu(x, approximate="tanh"), {"approximate": "tanh"}, "dy x y"),
    ("SiLUGrad", F.silu, {}, "dy x"),
    ("FastGeLUGrad", lambda x: x * torch.sigmoid(1.702 * x), {}, "dy x"),
    ("ReluGrad", F.relu, {}, "dy x"),
    ("SigmoidGrad", torch.sigmoid, {}, "y dy"),
    ("TanhGrad", torch.tanh, {}, "y dy"),
    ("SoftplusGrad", lambda x: F.softplus(x, 1.5, 8.0), {"beta": 1.5, "threshold": 8.0}, "dy x"),
    ("SoftmaxGrad", lambda x: F.softmax(x, -1), {"axis": -1}, "y dy"),
    ("LogSoftmaxGrad", lambda x: F.log_softmax(x, -1), {"axis": -1}, "y dy"),
])
def test_grads_match_autograd(op, fn, attrs, args):
    x = X.astype(np.float64)
    y, dy, gx = grad_of(fn, x)
    env = {"x": x, "y": y.numpy(), "dy": dy.numpy()}
    close(run_op(op, [env[a] for a in args.split()], attrs), gx, rtol=1e-6, atol=1e-9)


def test_sqrt_and_rsqrt_grads():
    x = np.random.default_rng(4).uniform(0.2, 4, (3, 5))
    for op, fn in (("SqrtGrad", torch.sqrt), ("RsqrtGrad", torch.rsqrt)):
        y, dy, gx = grad_of(fn, x)
        close(run_op(op, [y.numpy(), dy.numpy()]), gx, rtol=1e-6)


def test_layer_norm_grad_matches_autograd():
    rng = np.random.default_rng(5)
    x, g, b = rng.standard_normal((3, 4, 8)), rng.standard_normal(8), rng.standard_normal(8)
    xt, gt, bt = t(x).requires_grad_(), t(g).requires_grad_(), t(b).requires_grad_()
    y = F.layer_norm(xt, (8,), gt, bt, 1e-5)
    dy = torch.from_numpy(rng.standard_normal(y.shape))
    dx, dg, db = torch.autograd.grad(y, (xt, gt, bt), dy)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    got = run_op("LayerNormGrad", [dy.numpy(), x, var, mean, g], {"epsilon": 1e-5})
    for a, w in zip(got, (dx, dg, db), strict=True):
        close(a, w, rtol=1e-6, atol=1e-9)


def test_bias_add_and_grad():
    rng = np.random.default_rng(6)
    x, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3)
    close(run_op("BiasAdd", [x, b], {"data_format": "NCHW"}), t(x) + t(b).reshape(1, 3, 1, 1))
    close(run_op("BiasAddGrad", [x], {"data_format": "NCHW"}), t(x).sum((0, 2, 3)))


def test_batch_norm_inference_and_training_match_torch():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 5, 6)) * 3 + 7  # a large mean: the centred variance
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    close(run_op("BatchNorm", [x, w, b, rm, rv], {"epsilon": 1e-3}),
          F.batch_norm(t(x), t(rm), t(rv), t(w), t(b), False, 0.1, 1e-3))
    trm, trv = t(rm).clone(), t(rv).clone()
    want = F.batch_norm(t(x), trm, trv, t(w), t(b), True, 0.3, 1e-5)  # updates trm, trv
    y, mean, rstd, new_m, new_v = run_op("BatchNormTraining", [x, w, b, rm, rv],
                                         {"momentum": 0.3})
    close(y, want)
    close(mean, t(x).mean((0, 2, 3)))
    close(rstd, 1 / torch.sqrt(t(x).var((0, 2, 3), unbiased=False) + 1e-5))
    close(new_m, trm)
    close(new_v, trv)


def test_batch_norm_grad_matches_autograd():
    rng = np.random.default_rng(9)
    x, w, b = rng.standard_normal((3, 4, 5, 2)), rng.standard_normal(4), rng.standard_normal(4)
    xt, wt, bt = t(x).requires_grad_(), t(w).requires_grad_(), t(b).requires_grad_()
    y = F.batch_norm(xt, None, None, wt, bt, True, 0.1, 1e-5)
    dy = torch.from_numpy(rng.standard_normal(y.shape))
    want = torch.autograd.grad(y, (xt, wt, bt), dy)
    mean = x.mean((0, 2, 3))
    rstd = 1 / np.sqrt(x.var((0, 2, 3)) + 1e-5)
    got = run_op("BatchNormGrad", [dy.numpy(), x, w, mean, rstd])
    for a, e in zip(got, want, strict=True):
        close(a, e, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_grads_match_autograd(name):
    """Both gradients of a convolution against autograd through torch's (uneven pads: the
    input padded first, as torch's convolution pads evenly)."""
    a = CONVS[name]["Conv2DBackpropInput"].attrs
    k = CONVS[name]["Conv2DBackpropFilter"].attrs["filter_size"]
    rng = np.random.default_rng(10)
    x, w = rng.standard_normal(a["input_size"]), rng.standard_normal(k)
    xt, wt = t(x).requires_grad_(), t(w).requires_grad_()
    pt, pl, pb, pr = a["pads"]
    y = F.conv2d(F.pad(xt, (pl, pr, pt, pb)), wt, stride=a["strides"],
                 dilation=a["dilations"], groups=a["group"])
    dy = torch.from_numpy(rng.standard_normal(y.shape))
    dx, dw = torch.autograd.grad(y, (xt, wt), dy)
    geometry = {n: a[n] for n in ("strides", "pads", "dilations", "group")}
    close(run_op("Conv2DBackpropInput", [dy.numpy(), w], a), dx, rtol=1e-9, atol=1e-12)
    close(run_op("Conv2DBackpropFilter", [dy.numpy(), x], {**geometry, "filter_size": k}), dw,
          rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("op,second,size,want", [
    ("Conv2DBackpropInput", (6, 4, 3, 3), {"input_size": [2, 4, 9, 8]}, "is not the output"),
    ("Conv2DBackpropFilter", (2, 4, 9, 8), {"filter_size": [6, 4, 3, 3]}, "is not the output"),
    ("Conv2DBackpropInput", (6, 4, 3, 3), {"input_size": [2, 6, 9, 8], "group": 2},
     "does not fit group 2"),
])
def test_convolution_grads_refuse_a_dy_of_another_convolution(op, second, size, want):
    """dy [2, 6, 4, 4] is no output of that convolution (stride 2 over 9 x 8 gives 5 x 4), or
    the weight does not fit the group: one ShapeError saying so, at the graph's construction."""
    from graphkernel.errors import ShapeError
    from tests.conftest import single_op_graph

    arrays = [np.zeros((2, 6, 4, 4), np.float32), np.zeros(second, np.float32)]
    with pytest.raises(ShapeError, match=want):
        single_op_graph(op, arrays, {"strides": [2, 2], "pads": [1, 1, 1, 1], **size})
