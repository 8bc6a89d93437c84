"""How Opaque nodes run: only what a model file may choose.

An Opaque node's ``spec`` comes from a model file, which is data: it may name an operator
of its framework, never code. So each executor accepts exactly one kind of thing and checks
it before anything is imported or called:

- ``aten``: ``spec.target`` is ``aten.<op>.<overload>`` or ``prims.<op>.<overload>`` and
  resolves to a real ``torch._ops.OpOverload`` of that namespace that returns tensors
  (``aten.save``, ``aten._print``, ``aten.warn`` … do not) and is not one of the few that
  reach the file system (``aten.from_file``). Arguments are plain values, input tensors
  (``{"in": i}``) and dtype names (``{"dtype": "float32"}``) looked up in a fixed table.
- ``onnx``: ``spec.node`` is one ONNX NodeProto whose op type exists in its standard
  domain (``ai.onnx``, ``ai.onnx.ml``, ``ai.onnx.preview.training``), in its subgraphs too,
  and none of whose tensors points at external data (a file).

``check_spec`` is the structural part (pure Python, run when the node is built from a file);
the executors add the part that needs the framework (run when the node first executes).
Anything refused is a ``GraphError`` that names what was refused and what is accepted.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphkernel.errors import GraphError
from graphkernel.opdefs.misc import register_opaque_impl

Run = Callable[[list[np.ndarray]], list[np.ndarray]]

# ------------------------------------------------------------------------- aten
ATEN_NAMESPACES = ("aten", "prims")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_ATEN_TARGET = re.compile(rf"({_IDENT})\.({_IDENT})\.({_IDENT})")
# ATen operators that read or create the file their string argument names.
ATEN_FILE_OPS = frozenset({"from_file"})

# The ATen overloads a model FILE may name (``aten.<op>.<overload>``): functional (no argument
# is written), returning tensors, each checking its indices and sizes against its inputs (an
# index out of range raises). Nothing with ``unsafe``, no uninitialised results (``empty``),
# no raw pointers or storage access, no file or random-number access. A graph the user's own
# program builds (torch.compile, the Python API) is code and may run any operator.
_REVIEWED = """
    # elementwise math
    abs.default acos.default acosh.default asin.default asinh.default atan.default
    atanh.default atan2.default ceil.default cos.default cosh.default erf.default
    erfc.default erfinv.default exp.default exp2.default expm1.default floor.default
    frac.default lgamma.default digamma.default log.default log10.default log1p.default
    log2.default neg.default reciprocal.default round.default round.decimals rsqrt.default
    sigmoid.default sign.default sin.default sinh.default sqrt.default tan.default
    tanh.default trunc.default isnan.default isinf.default isfinite.default
    nan_to_num.default logit.default sgn.default signbit.default hypot.default
    copysign.Tensor add.Tensor add.Scalar sub.Tensor sub.Scalar rsub.Tensor rsub.Scalar
    mul.Tensor mul.Scalar div.Tensor div.Scalar div.Tensor_mode div.Scalar_mode
    true_divide.Tensor floor_divide.default pow.Tensor_Tensor pow.Tensor_Scalar pow.Scalar
    remainder.Tensor remainder.Scalar fmod.Tensor fmod.Scalar maximum.default
    minimum.default fmax.default fmin.default clamp.default clamp.Tensor clamp_min.default
    clamp_max.default where.self where.ScalarSelf where.ScalarOther lerp.Scalar lerp.Tensor
    addcmul.default addcdiv.default eq.Tensor eq.Scalar ne.Tensor ne.Scalar lt.Tensor
    lt.Scalar le.Tensor le.Scalar gt.Tensor gt.Scalar ge.Tensor ge.Scalar
    logical_and.default logical_or.default logical_not.default logical_xor.default
    bitwise_and.Tensor bitwise_or.Tensor bitwise_xor.Tensor bitwise_not.default
    bitwise_and.Scalar bitwise_or.Scalar bitwise_xor.Scalar
    # activations
    relu.default gelu.default silu.default mish.default elu.default leaky_relu.default
    hardtanh.default hardsigmoid.default hardswish.default softplus.default celu.default
    selu.default prelu.default glu.default threshold.default softmax.int log_softmax.int
    _softmax.default _log_softmax.default
    # reductions, scans, sorting
    sum.default sum.dim_IntList mean.default mean.dim prod.default prod.dim_int amax.default
    amin.default max.default max.dim min.default min.dim argmax.default argmin.default
    cumsum.default cumprod.default logsumexp.default var.correction std.correction
    var_mean.correction all.default all.dim any.default any.dim sort.default sort.stable
    topk.default kthvalue.default median.default median.dim norm.ScalarOpt_dim
    linalg_vector_norm.default count_nonzero.default
    # indexing (each checks every index against its dim)
    gather.default index_select.default index.Tensor take.default scatter.src scatter.value
    scatter_add.default scatter_reduce.two index_add.default index_copy.default
    index_fill.int_Scalar masked_fill.Scalar masked_fill.Tensor embedding.default
    one_hot.default select_scatter.default slice_scatter.default
    # shapes and copies
    view.default reshape.default permute.default transpose.int t.default cat.default
    stack.default split.Tensor split_with_sizes.default chunk.default unbind.int
    slice.Tensor select.int squeeze.dim squeeze.dims unsqueeze.default expand.default
    flip.default roll.default repeat.default tile.default constant_pad_nd.default
    clone.default alias.default flatten.using_ints narrow.default tril.default triu.default
    diagonal.default
    # matrix products and networks
    mm.default bmm.default addmm.default baddbmm.default matmul.default linear.default
    dot.default convolution.default conv1d.default conv2d.default native_layer_norm.default
    layer_norm.default group_norm.default native_group_norm.default
    max_pool2d_with_indices.default avg_pool2d.default adaptive_avg_pool2d.default
    _adaptive_avg_pool2d.default upsample_nearest2d.vec upsample_bilinear2d.vec
    pixel_shuffle.default scaled_dot_product_attention.default
"""
FILE_ATEN_OVERLOADS = frozenset(f"aten.{w}" for line in _REVIEWED.splitlines()
                                if not line.lstrip().startswith("#") for w in line.split())
_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8",
           "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")


def _aten_target_problem(target: Any) -> str | None:
    if not isinstance(target, str):
        return f"spec.target must be a string, got {type(target).__name__}"
    m = _ATEN_TARGET.fullmatch(target)
    if m is None or any(p.startswith("__") for p in m.groups()):
        return (f"spec.target {target!r} is not an ATen operator overload (accepted: "
                "'aten.<op>.<overload>' or 'prims.<op>.<overload>', e.g. 'aten.add.Tensor')")
    if m.group(1) not in ATEN_NAMESPACES:
        return (f"spec.target {target!r}: namespace {m.group(1)!r} is not accepted (accepted: "
                f"{', '.join(ATEN_NAMESPACES)})")
    if m.group(2) in ATEN_FILE_OPS:
        return f"spec.target {target!r} reads or writes files and is never run from a model"
    return None


def _aten_arg_problem(a: Any, where: str) -> str | None:
    if a is None or isinstance(a, bool | int | float | str):
        return None
    if isinstance(a, list):
        for i, x in enumerate(a):
            if (p := _aten_arg_problem(x, f"{where}[{i}]")) is not None:
                return p
        return None
    if isinstance(a, dict) and set(a) == {"in"} and type(a["in"]) is int and a["in"] >= 0:
        return None
    if isinstance(a, dict) and set(a) == {"dtype"} and a["dtype"] in _DTYPES:
        return None
    return (f"{where}: {a!r} is not an argument (accepted: numbers, strings, lists, "
            f"{{'in': <input index>}}, {{'dtype': <one of {', '.join(_DTYPES)}>}})")


def check_aten_spec(spec: dict[str, Any]) -> str | None:
    """What is wrong with an ``aten`` spec's structure, or None."""
    if set(spec) - {"target", "args", "kwargs"}:
        return f"unknown spec keys {sorted(set(spec) - {'target', 'args', 'kwargs'})}"
    if (p := _aten_target_problem(spec.get("target"))) is not None:
        return p
    if not isinstance(spec.get("args", []), list):
        return "spec.args must be a list"
    kwargs = spec.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        return "spec.kwargs must be an object of named arguments"
    if (p := _aten_arg_problem(spec.get("args", []), "spec.args")) is not None:
        return p
    for k, v in kwargs.items():
        if (p := _aten_arg_problem(v, f"spec.kwargs.{k}")) is not None:
            return p
    return None


def file_problem(attrs: dict[str, Any]) -> str | None:
    """What a model file may not ask of an Opaque node with these attributes, or None: an
    ``aten`` spec naming an overload outside ``FILE_ATEN_OVERLOADS``. (A file is data; the
    same node built in-process runs whatever its program named.)"""
    spec = attrs.get("spec")
    if attrs.get("impl") != "aten" or not isinstance(spec, dict):
        return None
    if (p := check_aten_spec(spec)) is not None:
        return p
    target = spec["target"]
    if not target.startswith("aten.") or target not in FILE_ATEN_OVERLOADS:
        return (f"spec.target {target!r} is not one of the ATen operators a model file may "
                "run (functional, bounds-checked operators graphkernel has reviewed: "
                "graphkernel.frontends.opaque.FILE_ATEN_OVERLOADS, see docs/security.md); a "
                "graph your own program builds (torch.compile, the Python API) may run any")
    return None


def resolve_aten(target: str) -> Any:
    """The ``OpOverload`` named by ``target``, found by attribute lookup in the operator
    namespace only; nothing is called and no module is imported."""
    import torch

    if (p := _aten_target_problem(target)) is not None:
        raise GraphError(p)
    ns, op, overload = target.split(".")
    packet = getattr(getattr(torch.ops, ns), op, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise GraphError(f"spec.target {target!r}: {ns}.{op} is not an operator of {ns}")
    found = getattr(packet, overload, None) if overload in packet.overloads() else None
    if not isinstance(found, torch._ops.OpOverload) or found.namespace != ns:
        raise GraphError(f"spec.target {target!r}: {ns}.{op} has no overload {overload!r} "
                         f"(it has: {', '.join(packet.overloads())})")
    returns = found._schema.returns
    if not returns or not all("Tensor" in str(r.type) for r in returns):
        raise GraphError(f"spec.target {target!r} does not return tensors, so it is not a "
                         "tensor operation")
    return found


def _decode_arg(a: Any, xs: list[Any], dtypes: dict[str, Any]) -> Any:
    if isinstance(a, dict) and "in" in a:
        if a["in"] >= len(xs):
            raise GraphError(f"argument {{'in': {a['in']}}}: the node has {len(xs)} inputs")
        return xs[a["in"]]
    if isinstance(a, dict):
        return dtypes[a["dtype"]]
    if isinstance(a, list):
        return [_decode_arg(x, xs, dtypes) for x in a]
    return a


def aten_executor(spec: dict[str, Any]) -> Run:
    """Run one ATen operator overload (see the module docstring for what is accepted)."""
    import torch

    from graphkernel.frontends.fx import to_numpy, to_torch

    if (p := check_aten_spec(spec)) is not None:
        raise GraphError(p)
    op = resolve_aten(spec["target"])
    dtypes = {name: getattr(torch, name) for name in _DTYPES}

    def call(ts: list[Any]) -> list[Any]:
        args = _decode_arg(spec.get("args", []), ts, dtypes)
        kwargs = {k: _decode_arg(v, ts, dtypes) for k, v in spec.get("kwargs", {}).items()}
        out = op(*args, **kwargs)
        return [o for o in (out if isinstance(out, list | tuple) else [out]) if o is not None]

    def run(xs: list[np.ndarray], out_shapes: Sequence[tuple[int, ...]] | None = None
            ) -> list[np.ndarray]:
        ts = [to_torch(x) for x in xs]
        if out_shapes is not None:
            # the operator on shapes alone first (torch's meta device allocates nothing): a
            # file declaring 4 elements must not make it fill gigabytes (aten.repeat by 2^20,
            # 2^11) before the result is found to be of another shape
            try:
                metas = call([t.to("meta") for t in ts])
            except (NotImplementedError, RuntimeError, TypeError, ValueError, IndexError):
                metas = None  # (no meta kernel, or a size that depends on the values)
            for i, (m, want) in enumerate(zip(metas or [], out_shapes, strict=False)):
                if tuple(m.shape) != tuple(want):
                    raise GraphError(f"output {i} would have shape {list(m.shape)} (found "
                                     f"before running it), its type says {list(want)}")
        return [to_numpy(o) for o in call(ts)]

    run.takes_out_shapes = True  # type: ignore[attr-defined]
    return run


# ------------------------------------------------------------------------- onnx
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")
_EVALUATORS: dict[str, Any] = {}


def check_onnx_spec(spec: dict[str, Any]) -> str | None:
    """What is wrong with an ``onnx`` spec's structure, or None."""
    if set(spec) != {"node", "opsets"}:
        return f"spec must hold exactly 'node' and 'opsets', got {sorted(spec)}"
    if not isinstance(spec["node"], str):
        return "spec.node must be a base64 string (a serialized ONNX NodeProto)"
    opsets = spec["opsets"]
    if not isinstance(opsets, dict) or not all(
            isinstance(k, str) and type(v) is int and 1 <= v <= 1000 for k, v in opsets.items()):
        return "spec.opsets must map domain names to opset versions (ints)"
    return None


def _onnx_node_problem(node: Any, opsets: dict[str, int]) -> str | None:
    """A node (and the nodes of its subgraphs) outside the standard domains, or holding a
    tensor whose data would be read from a file."""
    import onnx

    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain not in ONNX_DOMAINS or domain not in opsets:
        return (f"ONNX node domain {node.domain!r} is not accepted (accepted: the standard "
                f"domains declared in spec.opsets: {', '.join(repr(d) for d in opsets)})")
    if not onnx.defs.has(node.op_type, domain):
        return f"{node.op_type!r} is not an operator of ONNX domain {node.domain or 'ai.onnx'!r}"
    for attr in node.attribute:
        tensors = list(attr.tensors) + ([attr.t] if attr.HasField("t") else [])
        for sp in list(attr.sparse_tensors) + ([attr.sparse_tensor]
                                               if attr.HasField("sparse_tensor") else []):
            tensors += [sp.values, sp.indices]
        if any(_external(t) for t in tensors):
            return f"attribute {attr.name!r} holds a tensor stored in an external file"
        for sub in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
            inits = list(sub.initializer) + [t for sp in sub.sparse_initializer
                                             for t in (sp.values, sp.indices)]
            if any(_external(t) for t in inits):
                return f"a subgraph of attribute {attr.name!r} has external data"
            for inner in sub.node:
                if (p := _onnx_node_problem(inner, opsets)) is not None:
                    return p
    return None


def _external(t: Any) -> bool:
    import onnx

    return t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data) > 0


def onnx_executor(spec: dict[str, Any]) -> Run:
    """Run one standard ONNX node with ``onnx.reference``."""
    from graphkernel.frontends.onnx import _require_onnx

    _require_onnx()
    import onnx
    from onnx.reference import ReferenceEvaluator

    if (p := check_onnx_spec(spec)) is not None:
        raise GraphError(p)
    key = spec["node"]
    if key not in _EVALUATORS:
        node = onnx.NodeProto()
        try:
            node.ParseFromString(base64.b64decode(spec["node"], validate=True))
        except (binascii.Error, ValueError, Exception) as e:  # protobuf's DecodeError too
            raise GraphError(f"spec.node is not a serialized ONNX NodeProto ({e})") from None
        opsets = {("" if k == "ai.onnx" else k): v for k, v in spec["opsets"].items()}
        if (p := _onnx_node_problem(node, opsets)) is not None:
            raise GraphError(p)
        _EVALUATORS[key] = (node, ReferenceEvaluator(node, opsets=opsets))
    node, ev = _EVALUATORS[key]
    names = [i for i in node.input if i]

    def run(xs: list[np.ndarray]) -> list[np.ndarray]:
        res = ev.run(None, dict(zip(names, xs, strict=True)))
        return [np.asarray(r) for r, o in zip(res, node.output, strict=False) if o]

    return run


register_opaque_impl("aten", aten_executor, check_aten_spec)
register_opaque_impl("onnx", onnx_executor, check_onnx_spec)
