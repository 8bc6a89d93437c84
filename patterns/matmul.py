"""matmul_depth: epilogue fusion of a matmul with its single consumer."""

from __future__ import annotations

from graphkernel import ops
from graphkernel.ops import OpKind
from graphkernel.patterns.base import fuse_if, need, pattern


@pattern("matmul_depth", order=100, direction="bwd", mode="depth")
def matmul_depth(model, a):
    """A MatMul fuses with a single Add or Cast consumer; a BatchMatMul with a single
    ELEMWISE consumer (the codegen may decline it, leaving it unfused with a reason).
    Reshape views between the matmul and that consumer are looked through."""
    if a.ops != 1 or a.nodes[0].op not in ("MatMul", "BatchMatMul"):
        return None
    mm = a.nodes[0]
    users = mm.outputs[0].users
    cons, external = model.consumers(a)
    if len(users) != 1 or len(cons) != 1:
        return None
    user = users[0]
    # reshape views between the matmul and its epilogue are free: look through them
    while ops.get(user.op).kind == OpKind.RESHAPE and len(user.outputs[0].users) == 1:
        user = user.outputs[0].users[0]
    if mm.op == "MatMul":
        ok = user.op in ("Add", "Cast")
        why = f"a MatMul fuses only into an Add or Cast consumer, not {user.op}"
    else:
        ok = ops.get(user.op).kind == OpKind.ELEMWISE
        why = f"a BatchMatMul fuses only into an ELEMWISE consumer, not {user.op}"
    return fuse_if(model, "matmul_depth", [a, cons[0]], [
        need(lambda: not external and not model.is_output(a),
             lambda: f"{a.name} is used outside the kernel"),  # a = just the matmul
        need(lambda: ok, lambda: why),
        need(lambda: model.kind(cons[0]) <= OpKind.BROADCAST,
             lambda: f"kind mismatch: consumer {cons[0].name} is {model.kind(cons[0]).name}"),
    ])
