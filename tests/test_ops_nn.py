"""MatMul, BatchMatMul, Conv2D and pooling against torch."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel.errors import ShapeError
from tests.conftest import assert_close, run_op

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul(ta, tb, dtype, rng):
    a = rng.standard_normal((5, 3) if ta else (3, 5)).astype(dtype)
    b = rng.standard_normal((4, 5) if tb else (5, 4)).astype(dtype)
    got = run_op("MatMul", [a, b], {"transpose_a": ta, "transpose_b": tb})
    ta_, tb_ = torch.from_numpy(a).double(), torch.from_numpy(b).double()
    want = (ta_.T if ta else ta_) @ (tb_.T if tb else tb_)
    assert_close(got, want.numpy().astype(dtype))


def test_batch_matmul_broadcasts_batch_dims(rng):
    a = rng.standard_normal((2, 1, 3, 5)).astype(np.float32)
    b = rng.standard_normal((4, 4, 5)).astype(np.float32)
    got = run_op("BatchMatMul", [a, b], {"transpose_b": True})
    want = torch.from_numpy(a) @ torch.from_numpy(b).transpose(-1, -2)
    assert got.shape == (2, 4, 3, 4)
    assert_close(got, want.numpy())
    with pytest.raises(ShapeError, match="contraction"):
        run_op("BatchMatMul", [a, b])


@pytest.mark.parametrize("stride,pads,dil,group", [((1, 1), (0, 0, 0, 0), (1, 1), 1),
                                                   ((2, 2), (1, 1, 1, 1), (1, 1), 1),
                                                   ((1, 2), (0, 1, 0, 1), (2, 1), 2),
                                                   ((1, 1), (1, 1, 1, 1), (1, 1), 4)])
def test_conv2d(stride, pads, dil, group, rng):
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4 // group, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    got = run_op("Conv2D", [x, w, bias], {"strides": list(stride), "pads": list(pads),
                                          "dilations": list(dil), "group": group})
    xp = F.pad(torch.from_numpy(x), (pads[1], pads[3], pads[0], pads[2]))
    want = F.conv2d(xp, torch.from_numpy(w), torch.from_numpy(bias), stride=stride,
                    dilation=dil, groups=group)
    assert_close(got, want.numpy().astype(np.float32))


@pytest.mark.parametrize("stride,pads,group", [((1, 1), (0, 0, 0, 0), 1), ((2, 1), (1, 0, 2, 3), 2),
                                               ((1, 1), (3, 3, 3, 3), 4)])
def test_conv2d_nhwc_is_the_nchw_convolution_transposed(stride, pads, group, rng):
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4 // group, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    attrs = {"strides": list(stride), "pads": list(pads), "group": group}
    want = run_op("Conv2D", [x, w, bias], attrs)
    got = run_op("Conv2D", [x.transpose(0, 2, 3, 1), w, bias], attrs | {"data_format": "NHWC"})
    assert got.shape == want.shape[:1] + want.shape[2:] + want.shape[1:2]
    assert_close(got, want.transpose(0, 2, 3, 1))
    with pytest.raises(ShapeError, match="input channels 8 "):
        run_op("Conv2D", [x, w], attrs | {"data_format": "NHWC"})  # C from the last axis: 8


@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("k,s,p", [((3, 3), (2, 2), (1, 1, 1, 1)), ((2, 2), (2, 2), (0, 0, 0, 0)),
                                   ((3, 2), (2, 1), (0, 1, 0, 1))])
def test_max_pool(ceil, k, s, p, rng):
    x = rng.standard_normal((1, 3, 7, 8)).astype(np.float32)
    got = run_op("MaxPool", [x], {"kernel_size": list(k), "strides": list(s), "pads": list(p),
                                  "ceil_mode": ceil})
    want = F.max_pool2d(torch.from_numpy(x), k, s, padding=(p[0], p[1]), ceil_mode=ceil)
    assert_close(got, want.numpy())


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("ceil", [False, True])
def test_avg_pool(include_pad, ceil, rng):
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    got = run_op("AvgPool", [x], {"kernel_size": [3, 3], "strides": [2, 2],
                                  "pads": [1, 1, 1, 1], "ceil_mode": ceil,
                                  "count_include_pad": include_pad})
    want = F.avg_pool2d(torch.from_numpy(x), 3, 2, padding=1, ceil_mode=ceil,
                        count_include_pad=include_pad)
    assert_close(got, want.numpy())
