"""Extern kernels: vendor operators the compiled graph calls as they are, not generated.

``FusedAttention`` is CANN's FlashAttentionScore, exposed to PyTorch as
``torch_npu.npu_fusion_attention(query, key, value, head_num, input_layout, pse=None,
padding_mask=None, atten_mask=None, scale=1., keep_prob=1., pre_tockens=2147483647,
next_tockens=2147483647, ..., sparse_mode=0)``, which returns the attention output, then
softmax_max, softmax_sum (what a ``stats`` node also returns), softmax_out and the dropout
seed/offset/numels. ``FusedAttentionGrad`` is its gradient, FlashAttentionScoreGrad,
``torch_npu.npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *,
pse=None, padding_mask=None, atten_mask=None, softmax_max=None, softmax_sum=None,
softmax_in=None, attention_in=None, scale_value=1., keep_prob=1., pre_tockens=2147483647,
next_tockens=2147483647, inner_precise=0, ..., sparse_mode=0)``, which returns dq, dk, dv
and dpse. ``call`` describes the call a device build makes (the operator, its arguments,
which graph value is which operand); the code generator does not generate it, and the
simulator checks it against the op's numpy reference (graphkernel/opdefs/attention.py). The
cost model prices the products on the cube unit and the softmax work on the vector unit
(``cube_flops``, ``vector_repeats``).
"""

from __future__ import annotations

import math
from typing import Any

from graphkernel.fusion import SYMBOL_SIZE
from graphkernel.ir import Node
from graphkernel.opdefs.attention import mask_kinds, split_dims

OPERATORS = {"FusedAttention": "torch_npu.npu_fusion_attention",
             "FusedAttentionGrad": "torch_npu.npu_fusion_attention_grad",
             "GroupedMatMul": "torch_npu.npu_grouped_matmul",
             "GroupedMatMulWeightGrad": "torch_npu.npu_grouped_matmul",
             "MoeInitRouting": "torch_npu.npu_moe_init_routing",
             "MoeComputeExpertTokens": "torch_npu.npu_moe_compute_expert_tokens",
             "MoeFinalizeRouting": "torch_npu.npu_moe_finalize_routing",
             "MoeGatingTopKSoftmax": "torch_npu.npu_moe_gating_top_k_softmax_v2",
             "MoeGatingTopK": "torch_npu.npu_moe_gating_top_k"}
ACLNN = {"FusedAttention": "aclnnFlashAttentionScore",
         "FusedAttentionGrad": "aclnnFlashAttentionScoreGrad",
         "GroupedMatMul": "aclnnGroupedMatmul", "GroupedMatMulWeightGrad": "aclnnGroupedMatmul",
         "MoeInitRouting": "aclnnMoeInitRouting",
         "MoeComputeExpertTokens": "aclnnMoeComputeExpertTokens",
         "MoeFinalizeRouting": "aclnnMoeFinalizeRouting",
         "MoeGatingTopKSoftmax": "aclnnMoeGatingTopKSoftmaxV2",
         "MoeGatingTopK": "aclnnMoeGatingTopK"}
GROUPED = ("GroupedMatMul", "GroupedMatMulWeightGrad")
GATING = ("MoeGatingTopKSoftmax", "MoeGatingTopK")  # routers: scores, ranking, top-k
# a mixture of experts' token routing (graphkernel/opdefs/experts.py): operands and results
# by role, in the operator's order; no products, the permutation is data movement
ROUTING = {"MoeInitRouting": (["x", "row_idx", "expert_idx"],
                              ["expanded_x", "expanded_row_idx", "expanded_expert_idx"]),
           "MoeComputeExpertTokens": (["sorted_expert_for_source_row"], ["expert_tokens"]),
           "MoeFinalizeRouting": (["expanded_permuted_rows", "skip1", "bias", "scales",
                                   "expanded_src_to_dst_row", "export_for_source_row"],
                                  ["out"])}
SOFTMAX_PASSES = 5  # max, subtract, exp, sum, divide over every score
# the gradient: the probabilities again (subtract, exp, divide), dS = P * (dP - delta)
# (subtract, multiply) and the scaled dS for both products
GRAD_PASSES = 6
PRODUCTS = {"FusedAttention": 2, "FusedAttentionGrad": 5}  # Q·Kᵀ, P·V; + dY·Vᵀ, dS·K, dSᵀ·Q
GRAD_ROLES = ["query", "key", "value", "dy", "attention_in", "softmax_max", "softmax_sum"]


def is_extern(node: Node) -> bool:
    return node.op in OPERATORS


def _int(d) -> int:
    return d if isinstance(d, int) else SYMBOL_SIZE


def _dims(node: Node) -> tuple[int, int, int, int, int, int]:
    """(B, N1, N2, S1, S2, D) of a FusedAttention, symbols as SYMBOL_SIZE."""
    layout, n1 = node.attrs["layout"], node.attrs["head_num"]
    b, _, s1, d = split_dims(node.inputs[0].type, layout, n1)
    _, n2, s2, _ = split_dims(node.inputs[1].type, layout, None, head_size=d)
    return _int(b), n1, _int(n2), _int(s1), _int(s2), _int(d)


def _grouped_call(node: Node) -> dict[str, Any]:
    """A mixture of experts' grouped products as the vendor's GroupedMatmul: one input and
    one output tensor (``split_item`` 3), ``group_list`` the groups' running row counts
    (``group_list_type`` 0); the products split the rows (M, ``group_type`` 0), or for the
    weights' gradient the rows as the reduced axis K (``group_type`` 2)."""
    grad = node.op == "GroupedMatMulWeightGrad"
    roles = ["x", "dy", "group_list"] if grad else ["x", "weight", "group_list"]
    out = node.outputs[0]
    return {"node": node.name, "kind": "extern", "operator": OPERATORS[node.op],
            "aclnn": ACLNN[node.op],
            "arguments": {"split_item": 3, "group_type": 2 if grad else 0,
                          "group_list_type": 0},
            "operands": [{"role": r, "value": v.name, "dtype": str(v.dtype),
                          "shape": list(v.type.shape)} for r, v in zip(roles, node.inputs,
                                                                       strict=True)],
            "result": {"role": "dw" if grad else "y", "value": out.name, "dtype": str(out.dtype),
                       "shape": list(out.type.shape)}}


def _routing_call(node: Node) -> dict[str, Any]:
    """A routing operator's call: MoeInitRouting's ``active_num`` is every token (no
    capacity drop), MoeComputeExpertTokens' ``num_expert`` the experts, and
    MoeFinalizeRouting's optional ``skip2`` is None (int32 index operands, as the operators
    take them)."""
    roles, results = ROUTING[node.op]
    args: dict[str, Any] = {}
    if node.op == "MoeInitRouting":
        args["active_num"] = node.inputs[2].shape[0]
    elif node.op == "MoeComputeExpertTokens":
        args["num_expert"] = node.attrs["experts"]
    else:
        args["skip2"] = None
    outs = [{"role": r, "value": v.name, "dtype": str(v.dtype), "shape": list(v.type.shape)}
            for r, v in zip(results, node.outputs, strict=True)]
    return {"node": node.name, "kind": "extern", "operator": OPERATORS[node.op],
            "aclnn": ACLNN[node.op], "arguments": args,
            "operands": [{"role": r, "value": v.name, "dtype": str(v.dtype),
                          "shape": list(v.type.shape)} for r, v in zip(roles, node.inputs,
                                                                       strict=True)],
            "result": outs[0], "results": outs}


def _gating_call(node: Node) -> dict[str, Any]:
    """A router's softmax and TopK as MoeGatingTopKSoftmaxV2: no ``finished`` rows, the
    softmax itself not returned (``output_softmax`` False)."""
    (x,) = node.inputs
    outs = [{"role": r, "value": v.name, "dtype": str(v.dtype), "shape": list(v.type.shape)}
            for r, v in zip(["y", "expert_idx"], node.outputs, strict=True)]
    return {"node": node.name, "kind": "extern", "operator": OPERATORS[node.op],
            "aclnn": ACLNN[node.op],
            "arguments": {"k": node.attrs["k"], "renorm": node.attrs["renorm"],
                          "finished": None, "output_softmax": False},
            "operands": [{"role": "x", "value": x.name, "dtype": str(x.dtype),
                          "shape": list(x.type.shape)}],
            "result": outs[0], "results": outs}


def _group_gating_call(node: Node) -> dict[str, Any]:
    """A group-limited router as MoeGatingTopK: ``renorm`` 0 (the scores computed, then
    ranked: the only order the operator takes), the scores themselves not returned
    (``out_flag`` False)."""
    a = node.attrs
    outs = [{"role": r, "value": v.name, "dtype": str(v.dtype), "shape": list(v.type.shape)}
            for r, v in zip(["y", "expert_idx"], node.outputs, strict=True)]
    return {"node": node.name, "kind": "extern", "operator": OPERATORS[node.op],
            "aclnn": ACLNN[node.op],
            "arguments": {"k": a["k"], "k_group": a["k_group"], "group_count": a["group_count"],
                          "group_select_mode": a["group_select_mode"], "renorm": 0,
                          "norm_type": a["norm_type"], "out_flag": False,
                          "routed_scaling_factor": a["routed_scaling_factor"],
                          "eps": a["eps"]},
            "operands": [{"role": r, "value": v.name, "dtype": str(v.dtype),
                          "shape": list(v.type.shape)}
                         for r, v in zip(["x", "bias"], node.inputs, strict=True)],
            "result": outs[0], "results": outs}


def call(node: Node) -> dict[str, Any]:
    """The vendor call a device build makes for ``node``: operator, arguments, operands."""
    if node.op == "MoeGatingTopKSoftmax":
        return _gating_call(node)
    if node.op == "MoeGatingTopK":
        return _group_gating_call(node)
    if node.op in GROUPED:
        return _grouped_call(node)
    if node.op in ROUTING:
        return _routing_call(node)
    a = node.attrs
    _, n1, n2, *_ = _dims(node)
    grad = node.op == "FusedAttentionGrad"
    roles = [*(GRAD_ROLES if grad else ["query", "key", "value"]), *mask_kinds(a["mask"])]
    # causal: leftUpCausal (sparse_mode 2), or with a window the band (sparse_mode 4: keys
    # i - pre_tockens .. i + next_tockens), with the operator's compressed mask (bool
    # [2048, 2048], 1 above the diagonal) as its atten_mask, a constant of the device build
    causal = {"atten_mask": "compressed causal [2048, 2048]"} if a.get("causal") else {}
    window = a.get("window") or 0
    sparse = 4 if window else 2 if causal else 0
    results = (["dq", "dk", "dv"] if grad else
               ["attention_out", "softmax_max", "softmax_sum"][:len(node.outputs)])
    outs = [{"role": r, "value": v.name, "dtype": str(v.dtype), "shape": list(v.type.shape)}
            for r, v in zip(results, node.outputs, strict=True)]
    return {"node": node.name, "kind": "extern", "operator": OPERATORS[node.op],
            "aclnn": ACLNN[node.op],
            "arguments": {"head_num": n1, "input_layout": a["layout"],
                          "scale_value" if grad else "scale": a["scale"],
                          "keep_prob": 1.0, "pre_tockens": window - 1 if window else 2147483647,
                          "next_tockens": 0 if window else 2147483647, "sparse_mode": sparse,
                          # informational: the operator reads N2 from the key's shape
                          "kv_head_num": n2} | causal,
            "operands": [{"role": r, "value": v.name, "dtype": str(v.dtype),
                          "shape": list(v.type.shape)} for r, v in zip(roles, node.inputs,
                                                                       strict=True)],
            "result": outs[0] | {"layout": a["layout"]},
            "results": [o | ({"layout": a["layout"]} if grad or i == 0 else {})
                        for i, o in enumerate(outs)]}


def cube_flops(node: Node) -> float:
    """fp16-equivalent cube flops of the products (2·S1·S2·D each per head: Q·Kᵀ and P·V;
    the gradient's Q·Kᵀ again, dY·Vᵀ, Pᵀ·dY, dS·K and dSᵀ·Q); fp32 operands count twice, as
    the cube runs them at half rate. Grouped products: 2·S·K·N over all the groups; token
    routing and gating: none."""
    if node.op in ROUTING or node.op in GATING:
        return 0.0
    if node.op in GROUPED:
        x, y = node.inputs[0].type, node.outputs[0].type
        s, k = _int(x.shape[0]), _int(x.shape[1])
        n = _int(y.shape[-1])
        rate = 2 if x.dtype.itemsize >= 4 else 1
        return 2.0 * s * k * n * rate
    b, n1, _, s1, s2, d = _dims(node)
    rate = 2 if node.inputs[0].dtype.itemsize >= 4 else 1
    return PRODUCTS[node.op] * 2.0 * b * n1 * s1 * s2 * d * rate


def vector_repeats(node: Node, repeat_bytes: int) -> int:
    """The softmax's vector repeats: its passes over every fp32 score (the gradient's:
    the probabilities recomputed and dS); none for grouped products; token routing: a pass
    over each result (rows moved, and summed back per token); gating: the softmax's passes
    over the logits."""
    if node.op in GROUPED:
        return 0
    if node.op in GATING:
        return SOFTMAX_PASSES * math.ceil(
            math.prod(_int(d) for d in node.inputs[0].type.shape) * 4 / repeat_bytes)
    if node.op in ROUTING:
        return sum(math.ceil(math.prod(_int(d) for d in v.type.shape) * 4 / repeat_bytes)
                   for v in node.outputs)
    b, n1, _, s1, s2, _ = _dims(node)
    passes = GRAD_PASSES if node.op == "FusedAttentionGrad" else SOFTMAX_PASSES
    return passes * math.ceil(b * n1 * s1 * s2 * 4 / repeat_bytes)
