"""Export a (fused) graph as ONNX for viewing in netron.

Every op becomes a node of the custom domain ``graphkernel`` (op type = graphkernel's op
name); every GraphKernel node becomes a node of the domain ``graphkernel.kernels`` whose
body is an ONNX function holding the kernel's ops, so netron shows the kernels and opens
them. Attribute types ONNX has no form for (dtypes, symbolic dims, nested dicts) are carried
as strings. The file is for looking at, not for running elsewhere.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from graphkernel.errors import FrontendError
from graphkernel.ir import DType, Graph, Node, TensorType

OPS_DOMAIN = "graphkernel"
KERNEL_DOMAIN = "graphkernel.kernels"

_TO_ONNX = {DType.float32: 1, DType.uint8: 2, DType.int8: 3, DType.int16: 5, DType.int32: 6,
            DType.int64: 7, DType.bool: 9, DType.float16: 10, DType.float64: 11,
            DType.bfloat16: 16}


def _value_info(helper, name: str, t: TensorType):
    dims = [d if isinstance(d, int) else str(d) for d in t.shape]
    return helper.make_tensor_value_info(name, _TO_ONNX[t.dtype], dims)


def _attribute(helper, key: str, value: Any):
    """An ONNX attribute, or a string attribute for types ONNX cannot hold."""
    if value is None or key in ("subgraph", "fn"):
        return None
    if isinstance(value, bool):
        return helper.make_attribute(key, int(value))
    if isinstance(value, int | float | str):
        return helper.make_attribute(key, value)
    if isinstance(value, np.ndarray):
        from onnx import numpy_helper

        arr = value.astype(np.float32) if value.dtype == DType.bfloat16.np else value
        return helper.make_attribute(key, numpy_helper.from_array(arr, key))
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in value):
        return helper.make_attribute(key, value)
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return helper.make_attribute(key, value)
    if isinstance(value, DType):
        return helper.make_attribute(key, value.value)
    return helper.make_attribute(key, json.dumps(value, default=str))


def _node(helper, n: Node, domain: str = OPS_DOMAIN, op_type: str | None = None):
    attrs = [a for k, v in n.attrs.items() if (a := _attribute(helper, k, v)) is not None]
    node = helper.make_node(op_type or n.op, [v.name for v in n.inputs],
                            [v.name for v in n.outputs], name=n.name, domain=domain)
    node.attribute.extend(attrs)
    if n.origin != (n.name,):
        node.doc_string = "origin: " + ", ".join(n.origin)
    return node


def to_onnx(graph: Graph) -> Any:
    try:
        from onnx import helper, numpy_helper
    except ImportError:
        raise FrontendError("--export-onnx needs the onnx package: "
                            "pip install 'graphkernel[onnx]'") from None
    graph = graph.with_output_values_named()  # every output under the user's name
    nodes, inits, functions, infos = [], [], [], []
    for n in graph.nodes:
        if n.op == "Constant":
            arr = n.attrs["value"]
            arr = arr.astype(np.float32) if arr.dtype == DType.bfloat16.np else arr
            inits.append(numpy_helper.from_array(np.asarray(arr), n.outputs[0].name))
            continue
        if n.op == "GraphKernel":
            sub = n.subgraph
            body = [_node(helper, m) for m in sub.nodes if m.op != "Constant"]
            consts = [helper.make_node("Constant", [], [m.outputs[0].name], name=m.name,
                                       value=numpy_helper.from_array(np.asarray(
                                           m.attrs["value"], np.float32
                                           if m.attrs["value"].dtype == DType.bfloat16.np
                                           else m.attrs["value"].dtype)))
                      for m in sub.nodes if m.op == "Constant"]
            functions.append(helper.make_function(
                KERNEL_DOMAIN, n.name, [v.name for v in sub.inputs],
                [v.name for v in sub.outputs], consts + body,
                [helper.make_opsetid("", 17), helper.make_opsetid(OPS_DOMAIN, 1)],
                doc_string=f"pattern: {n.attrs['pattern']}; origin: {', '.join(n.origin)}"))
            kn = helper.make_node(n.name, [v.name for v in n.inputs],
                                  [v.name for v in n.outputs], name=n.name, domain=KERNEL_DOMAIN)
            kn.doc_string = f"pattern: {n.attrs['pattern']}"
            nodes.append(kn)
        else:
            nodes.append(_node(helper, n))
        infos += [_value_info(helper, v.name, v.type) for v in n.outputs]
    g = helper.make_graph(nodes, graph.name,
                          [_value_info(helper, v.name, v.type) for v in graph.inputs],
                          [_value_info(helper, v.name, v.type) for v in graph.outputs],
                          initializer=inits, value_info=infos)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(OPS_DOMAIN, 1),
                                                helper.make_opsetid(KERNEL_DOMAIN, 1)],
                              functions=functions, producer_name="graphkernel")
    model.ir_version = 8
    return model


def export_onnx(graph: Graph, path: str | os.PathLike) -> str:
    from graphkernel.outputs import write_file

    model = to_onnx(graph)
    write_file(path, model.SerializeToString())
    return str(path)
