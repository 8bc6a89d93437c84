"""Input specs for every expandable op: shapes, value domains and attributes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# value domains: "any" includes edge values (0, -0, denormals, large |x|)
DOMAINS = {"any": (-4.0, 4.0), "pos": (0.1, 4.0), "ge1": (1.0, 5.0), "prob": (0.02, 0.98),
           "unit": (0.0, 1.0), "small": (-1.0, 1.0), "one": (0.9, 1.1)}
EDGES = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-30, 30.0, -30.0, 12.0, -12.0], np.float64)


@dataclass
class Case:
    shapes: list[tuple]          # one per input; str dims are symbolic
    domains: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)  # concrete sizes of symbols
    mutable: tuple[int, ...] = ()


U = [(3, 33)], ["any"]


def unary(domain="any", **attrs) -> list[Case]:
    return [Case([(3, 33)], [domain], attrs), Case([("n", 7)], [domain], attrs, {"n": 5}),
            Case([()], [domain], attrs), Case([(2, 0, 4)], [domain], attrs)]


def binary(d0="any", d1="any", **attrs) -> list[Case]:
    return [Case([(4, 9), (4, 9)], [d0, d1], attrs),
            Case([(2, "n", 8), (8,)], [d0, d1], attrs, {"n": 3})]


def conv_grads(x: tuple, w: tuple, s=(1, 1), pads=(0, 0, 0, 0), d=(1, 1), g=1
               ) -> dict[str, Case]:
    """Both gradient ops of one NCHW convolution of ``x`` by ``w``: dy's shape is the forward
    output's (PyTorch's rule: floor((H + pads - d (k - 1) - 1) / s) + 1). Values in [-1, 1]:
    the edge values (30 x 30) would put terms of 900 into the sums, whose fp32 rounding then
    depends on the summation order by more than an elementwise tolerance."""
    out = [(x[2 + i] + pads[i] + pads[2 + i] - d[i] * (w[2 + i] - 1) - 1) // s[i] + 1
           for i in (0, 1)]
    dy = (x[0], w[0], *out)
    attrs = {"strides": list(s), "pads": list(pads), "dilations": list(d), "group": g}
    return {"Conv2DBackpropInput": Case([dy, w], ["small", "small"],
                                        {**attrs, "input_size": list(x)}),
            "Conv2DBackpropFilter": Case([dy, x], ["small", "small"],
                                         {**attrs, "filter_size": list(w)})}


CONVS = {
    "strided_padded": conv_grads((2, 4, 9, 8), (6, 4, 3, 3), (2, 2), (1, 1, 1, 1)),
    "grouped_dilated": conv_grads((2, 6, 9, 8), (6, 3, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 2),
    "depthwise": conv_grads((2, 6, 7, 10), (6, 1, 7, 5), (3, 2), (3, 1, 3, 1), (1, 2), 6),
    "1d_as_2d": conv_grads((2, 6, 1, 12), (6, 2, 1, 4), (1, 1), (0, 2, 0, 2), g=3),
    "uneven_pads_rows_skipped": conv_grads((1, 3, 8, 7), (4, 3, 2, 3), (3, 2), (0, 1, 2, 0)),
    "stride_past_kernel": conv_grads((2, 4, 7, 7), (8, 4, 1, 1), (2, 2)),
    "groups_narrowing": conv_grads((1, 8, 6, 6), (4, 2, 3, 3), (2, 1), (1, 0, 1, 0), (1, 2), 4),
}

SCALAR = (1,)
CASES: dict[str, list[Case]] = {
    "GeLU": unary(approximate="none") + unary(approximate="tanh"),
    "FastGeLU": unary(), "SiLU": unary(), "Sigmoid": unary(), "ReLU": unary(),
    "LeakyReLU": unary(alpha=0.2), "Elu": unary(alpha=0.7),
    "Softplus": unary(beta=2.0, threshold=10.0) + unary(),
    "HSwish": unary(), "HSigmoid": unary(), "HShrink": unary(lambd=0.7),
    "ClampScalar": unary(min=-0.5, max=1.5) + unary(max=0.3),
    "Tanh": unary(), "Erf": unary(), "Cosh": unary("small"), "Sinh": unary("small"),
    "Acosh": unary("ge1"), "Asinh": unary(),
    "AddN": [Case([(3, 5)] * 3, ["any"] * 3), Case([(2, 1), (1, 4)], ["any"] * 2)],
    "BiasAdd": [Case([(2, 3, 4, 5), (3,)], ["any", "any"], {"data_format": "NCHW"}),
                Case([("b", 6), (6,)], ["any", "any"], {"data_format": "ND"}, {"b": 3})],
    "Square": unary(), "SquaredDifference": binary(),
    "Addcmul": [Case([(3, 4)] * 3, ["any"] * 3, {"value": 0.5})],
    "FusedMulAdd": [Case([(3, 4), (4,), (3, 1)], ["any"] * 3)],
    "DivMod": [Case([(5, 6), (5, 6)], ["any", "pos"])],
    "ReduceMean": [Case([(4, 6, 5)], ["any"], {"axis": [-1], "keep_dims": True}),
                   Case([("b", 6, 5)], ["any"], {"axis": [1, 2]}, {"b": 3})],
    "Tile": [Case([(2, 3)], ["any"], {"multiples": [2, 1, 3]})],
    "RepeatInterleaveInt": [Case([(2, 3)], ["any"], {"repeats": 3, "axis": -1})],
    "OnesLike": unary(), "ZerosLike": unary(), "FillV2": unary(value=2.5),
    "LayerNorm": [Case([("b", 8, 32), (32,), (32,)], ["any", "one", "small"],
                       {"begin_norm_axis": -1, "begin_params_axis": -1}, {"b": 2}),
                  Case([(2, 4, 6), (4, 6), (4, 6)], ["any", "one", "small"],
                       {"begin_norm_axis": 1, "begin_params_axis": 1, "epsilon": 1e-3})],
    "BatchNorm": [Case([(2, 3, 4, 5), (3,), (3,), (3,), (3,)],
                       ["any", "one", "small", "small", "pos"], {"epsilon": 1e-3}),
                  Case([("b", 6, 7), (6,), (6,), (6,), (6,)], ["any", "any", "any", "any", "pos"],
                       {}, {"b": 2})],
    "BatchNormTraining": [Case([(2, 3, 4, 5), (3,), (3,), (3,), (3,)],
                               ["any", "one", "small", "small", "pos"], {"momentum": 0.2}),
                          Case([(4, 6, 7), (6,), (6,)], ["any", "any", "any"],
                               {"epsilon": 1e-3}),
                          # a weight standardisation's: each channel one row of [1, C, K]
                          Case([(1, 6, 12), (6,), (6,), (6,), (6,)],
                               ["any", "one", "small", "small", "pos"], {"momentum": 0.1})],
    "BatchNormGrad": [Case([(2, 3, 4, 5), (2, 3, 4, 5), (3,), (3,), (3,)],
                           ["any", "any", "one", "small", "pos"]),
                      Case([(1, 6, 12), (1, 6, 12), (6,), (6,), (6,)],
                           ["any", "any", "one", "small", "pos"])],
    "RMSNorm": [Case([("b", 16), (16,)], ["any", "one"], {}, {"b": 3})],
    "Softmax": [Case([(3, 40)], ["any"], {"axis": -1}), Case([("b", 5, 6)], ["any"],
                                                              {"axis": [1, 2]}, {"b": 2}),
                # axes of 1 after the normalized one (dropped and restored by the expansion)
                Case([("b", 9, 1)], ["any"], {"axis": 1}, {"b": 6}),
                Case([(2, 5, 3, 1, 1)], ["any"], {"axis": [1, 2]})],
    "LogSoftmax": [Case([(3, 40)], ["any"], {"axis": 1}), Case([(4, 7)], ["any"], {"axis": 0}),
                   Case([(4, 7, 1)], ["any"], {"axis": -2})],
    "SigmoidCrossEntropyWithLogits": binary("any", "unit"),
    "BCEWithLogitsLoss": [Case([(4, 5), (4, 5), (5,), (5,)], ["any", "unit", "pos", "pos"],
                               {"reduction": r}) for r in ("mean", "sum", "none")],
    "BinaryCrossEntropy": [Case([(4, 5), (4, 5), (4, 5)], ["prob", "unit", "pos"],
                                {"reduction": "mean"}),
                           Case([(6,), (6,)], ["prob", "unit"], {"reduction": "none"})],
    "ReluGrad": binary(), "SigmoidGrad": binary("unit", "any"), "TanhGrad": binary("small"),
    "SqrtGrad": binary("pos"), "RsqrtGrad": binary("pos"),
    "GeLUGrad": [Case([(3, 8)] * 3, ["any"] * 3, {"approximate": a}) for a in ("none", "tanh")],
    "FastGeLUGrad": binary(), "SiLUGrad": binary(),
    "SoftplusGrad": binary(beta=1.5, threshold=8.0),
    "BiasAddGrad": [Case([(2, 3, 4, 5)], ["any"], {"data_format": "NCHW"}),
                    Case([(6, 7)], ["any"], {"data_format": "ND"})],
    "SoftmaxGrad": [Case([(3, 9), (3, 9)], ["unit", "any"], {"axis": -1})],
    "LogSoftmaxGrad": [Case([(3, 9), (3, 9)], ["small", "any"], {"axis": -1})],
    "LayerNormGrad": [Case([(2, 4, 8), (2, 4, 8), (2, 4, 1), (2, 4, 1), (8,)],
                           ["any", "any", "pos", "small", "one"],
                           {"begin_norm_axis": -1, "begin_params_axis": -1})],
    "SigmoidCrossEntropyWithLogitsGrad": [Case([(4, 6)] * 3, ["any", "unit", "any"])],
    "WeightNormGrad": [Case([(4, 3, 5), (4, 3, 5), (4, 1, 1), (4, 1, 1)],
                            ["any", "any", "any", "pos"], {"dim": 0}),
                       Case([(6, 5), (6, 5), (1, 5), (5,)], ["any", "any", "any", "pos"],
                            {"dim": 1}),
                       Case([(3, 4), (3, 4), (), ()], ["any", "any", "any", "pos"],
                            {"dim": -1})],
    "Conv2DBackpropInput": [c["Conv2DBackpropInput"] for c in CONVS.values()],
    "Conv2DBackpropFilter": [c["Conv2DBackpropFilter"] for c in CONVS.values()],
    "AssignAdd": [Case([(3, 4), (3, 4)], ["any", "any"], mutable=(0,))],
    "ApplyMomentum": [Case([(5,), (5,), SCALAR, (5,), SCALAR], ["any", "any", "unit", "any",
                                                                "unit"],
                           {"use_nesterov": n}, mutable=(0, 1)) for n in (False, True)],
    "Adam": [Case([(6,), (6,), (6,), SCALAR, SCALAR, SCALAR, SCALAR, SCALAR, SCALAR, (6,)],
                  ["any", "any", "pos", "unit", "unit", "unit", "unit", "unit", "unit", "any"],
                  {"use_nesterov": n}, mutable=(0, 1, 2)) for n in (False, True)],
    "AdamWeightDecay": [Case([(6,), (6,), (6,)] + [SCALAR] * 5 + [(6,)],
                             ["any", "any", "pos"] + ["unit"] * 5 + ["any"], mutable=(0, 1, 2))],
    "AdamApplyOneWithDecay": [Case([(6,), (6,), (6,), (6,)] + [SCALAR] * 7,
                                   ["any", "pos", "any", "any"] + ["unit"] * 7)],
    "AdamApplyOneWithDecayAssign": [Case([(6,), (6,), (6,), (6,)] + [SCALAR] * 7,
                                         ["any", "pos", "any", "any"] + ["unit"] * 7,
                                         mutable=(1, 2, 3))],
    "LambApplyOptimizerAssign": [Case([(6,), (6,), (6,), (6,)] + [SCALAR] * 8,
                                      ["any", "pos", "any", "any"] + ["unit"] * 4
                                      + ["unit", "ge1", "unit", "unit"], mutable=(1, 2))],
    "LambApplyWeightAssign": [Case([SCALAR, SCALAR, SCALAR, (6,), (6,)],
                                   ["any", "any", "unit", "any", "any"], mutable=(4,))],
    "ClipByNormNoDivSum": [Case([(4, 5), SCALAR, SCALAR, SCALAR],
                                ["any", "small", "small", "small"])],
}


def make_inputs(case: Case, dtype, rng, edges: bool = True) -> list[np.ndarray]:
    out = []
    for shape, dom in zip(case.shapes, case.domains, strict=True):
        conc = tuple(case.dims.get(d, d) if isinstance(d, str) else d for d in shape)
        lo, hi = DOMAINS[dom]
        x = rng.uniform(lo, hi, conc)
        if dom == "unit" and rng.random() < 0.5:
            x = np.round(x)  # labels: 0/1
        if edges and dom == "any" and x.size >= len(EDGES) + 2:
            x.reshape(-1)[: len(EDGES)] = EDGES
        out.append(np.asarray(x).astype(dtype))
    return out
