"""matmul_depth: epilogue fusion of a matmul with the elementwise work on its result."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, need, pattern

MATMULS = ("MatMul", "BatchMatMul")
EPILOGUE_KINDS = (OpKind.RESHAPE, OpKind.ELEMWISE, OpKind.BROADCAST)


def _epilogue_area(a) -> bool:
    """One MatMul/BatchMatMul, and besides it only elementwise work and views (the epilogue
    fused so far) or Transposes (of its operands, folded into isTrans)."""
    mms = [n for n in a.nodes if n.op in MATMULS]
    return len(mms) == 1 and all(
        n.op in MATMULS or n.op == "Transpose" or ops.get(n.op).kind in EPILOGUE_KINDS
        for n in a.nodes)


@pattern("matmul_depth", order=100, direction="bwd", mode="depth")
def matmul_depth(model, a):
    """A matmul area (a MatMul or BatchMatMul, alone or with the epilogue fused so far) fuses
    with its consumer areas when every one is elementwise or broadcast: the bias, scale,
    mask, activation, residual add or cast run on each tile of the product in one MIX kernel
    (the codegen may decline an epilogue outside its model: the kernel is then split into a
    cube kernel and a vector one, with the reason). Applied again to the merged area, it
    takes the epilogue's next consumer."""
    if not _epilogue_area(a):
        return None
    cons, _ = model.consumers(a)
    if not cons:
        return None
    last = next(n for n in a.nodes if n.op in MATMULS).outputs[0].type.shape[-1]
    return fuse_if(model, "matmul_depth", [a, *cons],
                   [cond for c in cons for cond in _epilogue_conditions(model, c, last)])


def _epilogue_conditions(model, c, last) -> list:
    """A consumer area the epilogue may take: elementwise or broadcast work only, its views
    keeping the product's last axis (the epilogue runs on tiles of the product's rows)."""
    views = [n for n in c.nodes if ops.get(n.op).kind == OpKind.RESHAPE]
    return [
        need(lambda: model.kind(c) <= OpKind.BROADCAST,
             lambda: f"kind mismatch: consumer {c.name} is {model.kind(c).name}"),
        need(lambda: all(ops.get(n.op).kind in EPILOGUE_KINDS for n in c.nodes),
             lambda: f"consumer {c.name} holds more than elementwise work"),
        need(lambda: all(v.outputs[0].type.shape[-1:] == (last,) for v in views),
             lambda: f"consumer {c.name} views the product with another last axis"),
    ]
