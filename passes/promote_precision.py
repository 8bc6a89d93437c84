"""promote_precision: inside kernels, compute fp16/bf16 in fp32 and round only at outputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphkernel.ir import DType, Graph, Node, Value
from graphkernel.ops import CUBE_OPS
from graphkernel.registry import PassResult

LOW = (DType.float16, DType.bfloat16)


# reductions are always promoted (a low-precision sum or product loses digits), whatever
# the blacklists say; views and casts are not computations
ALWAYS_PROMOTED = frozenset({"ReduceSum", "ReduceMean", "ReduceProd"})
NOT_COMPUTED = frozenset({"Constant", "Cast", "Reshape", "ExpandDims", "Squeeze", "Identity"})
# ops that move data only: beside a product in its kernel they are the product's addressing
# (codegen/cube/strided.py), no vector op to compute in fp32
MOVED = frozenset({"Transpose", "BroadcastTo", "Slice", "StridedSlice"})


def blacklisted(names: list[str]) -> Callable[[str], bool]:
    """Whether an op is on a precision blacklist (``all``: every op but the reductions that
    are always promoted)."""
    listed = frozenset(names)
    every = "all" in listed
    return lambda op: op not in ALWAYS_PROMOTED and (every or op in listed)


def _promote(kernel: Node, keep_low: Callable[[str], bool] = lambda op: False) -> Graph | None:
    """The kernel's body computed in fp32: low-precision values widened where a vector op
    first reads them, every vector op in fp32, casts to fp16/bf16 inside dropped, outputs
    rounded back to their dtype; cube ops, and the ops ``keep_low`` names (the precision
    blacklist), keep their operands' precision. None when no vector op inside computes in
    low precision."""
    sub = kernel.subgraph
    if not any(v.dtype in LOW for n in sub.nodes if n.op != "Constant" and n.op not in CUBE_OPS
               for v in n.outputs):
        return None
    if any(n.op in CUBE_OPS for n in sub.nodes) and any(n.op in MOVED for n in sub.nodes) \
            and all(n.op in CUBE_OPS or n.op in NOT_COMPUTED or n.op in MOVED
                    for n in sub.nodes):
        return None  # a product read and written through views: its addressing, no vector op
    outputs = {id(v) for v in sub.outputs}
    new = Graph(sub.name)
    vmap: dict[int, Value] = {id(v): new.add_input(v.name, v.type) for v in sub.inputs}
    wide: dict[int, Value] = {}
    narrow: dict[int, Value] = {}

    def narrow_to(x: Value, dtype: DType) -> Value:
        """``x`` in ``dtype`` again: the value it was widened from, or a cast."""
        if x.dtype == dtype:
            return x
        return narrow.get(id(x)) or new.add_node("Cast", [x], {"dtype": dtype.value}).output

    def widen(x: Value) -> Value:
        if x.dtype not in LOW:
            return x
        if id(x) not in wide:
            w = new.add_node("Cast", [x], {"dtype": "float32"},
                             name=new.fresh_name(f"{x.name}_fp32")).output
            wide[id(x)], narrow[id(w)] = w, x
        return wide[id(x)]

    for n in sub.nodes:
        if n.op == "Constant":
            val = np.asarray(n.attrs["value"])
            if n.outputs[0].dtype in LOW:
                val = val.astype(np.float32)
            vmap[id(n.outputs[0])] = new.add_node("Constant", [], {"value": val}, name=n.name,
                                                  origin=n.origin).output
            continue
        ins = [vmap[id(v)] for v in n.inputs]
        if n.op in CUBE_OPS or (keep_low(n.op) and any(
                v.dtype in LOW for v in (*n.inputs, *n.outputs))):
            # operands in their own precision: a cube op's, or a blacklisted op's
            ins = [narrow_to(x, v.dtype) for x, v in zip(ins, n.inputs, strict=True)]
        elif n.op == "Cast" and n.outputs[0].dtype in LOW and id(n.outputs[0]) not in outputs:
            vmap[id(n.outputs[0])] = widen(ins[0])  # an inner rounding: stay in fp32
            continue
        elif n.op == "Cast" and n.outputs[0].dtype == DType.float32:
            vmap[id(n.outputs[0])] = widen(ins[0])
            continue
        elif n.op != "Cast":
            ins = [widen(x) for x in ins]
        m = new.add_node(n.op, ins, dict(n.attrs), name=n.name, origin=n.origin)
        for old, nv in zip(n.outputs, m.outputs, strict=True):
            vmap[id(old)] = nv
    outs = []
    for v in sub.outputs:
        nv = vmap[id(v)]
        if nv.dtype != v.dtype:
            nv = new.add_node("Cast", [nv], {"dtype": v.dtype.value},
                              name=new.fresh_name(f"{v.name}_round")).output
        outs.append(nv)
    new.set_outputs(outs)
    new.remove_dead()
    return new


def promote_precision(graph, ctx) -> PassResult:
    """Inside each kernel, compute fp16/bf16 in fp32 and round only at the kernel's outputs
    (what the generated code does; AutoFuse's accuracy guarantee). enable_low_precision keeps
    the kernels in their input precision; the ops on precision_blacklist keep theirs inside
    promoted kernels, and a kernel whose ops are all on precision_blacklist_kernels is left
    as it is."""
    cfg = ctx.flags
    if cfg.enable_low_precision:
        return PassResult(False, 0, ["enable_low_precision: kernels keep fp16/bf16"])
    keep_low = blacklisted(cfg.precision_blacklist)
    whole = blacklisted(cfg.precision_blacklist_kernels)
    changed = 0
    notes = []
    for k in [n for n in graph.nodes if n.op == "GraphKernel"]:
        computed = [n.op for n in k.subgraph.nodes if n.op not in NOT_COMPUTED]
        if cfg.precision_blacklist_kernels and computed and all(whole(op) for op in computed):
            notes.append(f"{k.name} kept in low precision: every op in it is on "
                         "precision_blacklist_kernels")
            continue
        body = _promote(k, keep_low)
        if body is not None and ctx.should_apply(f"{k.name}: fp32 inside", [k]):
            k.attrs["subgraph"] = body
            changed += 1
    return PassResult(changed > 0, changed, notes)
