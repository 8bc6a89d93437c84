"""A readable one-line-per-node text form of a graph (used by str(graph) and dumps)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphkernel.tensor_types import DType, TensorType

if TYPE_CHECKING:  # the IR prints itself through this module
    from graphkernel.ir import Graph, Node


# Attribute values printed by ``repr`` as they are (exact types: bool is an int, a DType a str)
_PLAIN = frozenset({int, float, str})
_TYPE_TEXTS: dict[tuple, str] = {}  # (shape, dtype name) -> the type as printed
_TYPE_TEXTS_KEPT = 4096


def type_text(t: TensorType) -> str:
    """``str(t)``, remembered: a graph's values share a few types, each printed many times
    (keyed by shape and dtype name: a tuple of them hashes and compares without a Python
    call)."""
    key = (t.shape, t.dtype._value_)
    text = _TYPE_TEXTS.get(key)
    if text is None:
        if len(_TYPE_TEXTS) >= _TYPE_TEXTS_KEPT:
            _TYPE_TEXTS.clear()
        text = _TYPE_TEXTS[key] = str(t)
    return text


def format_attr(value: Any) -> str:
    kind = type(value)  # the common exact types first
    if kind in _PLAIN:
        return repr(value)
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join([format_attr(v) for v in value]) + "]"
    if isinstance(value, np.ndarray):
        dt = DType.parse(value.dtype).value
        if value.size <= 8:
            items = ", ".join([repr(x.item()) for x in value.reshape(-1)])
            return f"{dt}{list(value.shape)}[{items}]"
        return f"{dt}{list(value.shape)}"
    if isinstance(value, DType):
        return value.value
    if isinstance(value, TensorType):
        return str(value)
    if callable(value):
        return "<callable>"
    return repr(value)


def format_node(node: Node, indent: str = "  ") -> str:
    outs = ", ".join([f"%{v.name}: {type_text(v.type)}" for v in node.outputs])
    ins = ", ".join(["%" + v.name for v in node.inputs])
    shown = [f"{k}={format_attr(v)}" for k, v in node.attrs.items()
             if k != "subgraph" and v is not None]
    attrs = " {" + ", ".join(shown) + "}" if shown else ""
    origin = "" if node.origin == (node.name,) else f"  origin=[{', '.join(node.origin)}]"
    line = f"{indent}{node.name}: {outs} = {node.op}({ins}){attrs}{origin}"
    if node.op == "GraphKernel":
        line += "\n" + format_graph(node.subgraph, indent + "    ")
    return line


def format_graph(graph: Graph, indent: str = "") -> str:
    params = ", ".join([f"%{v.name}: {type_text(v.type)}{' mutable' if v.mutable else ''}"
                        for v in graph.inputs])
    lines = [f"{indent}graph {graph.name}({params}) {{"]
    lines += [format_node(n, indent + "  ") for n in graph.nodes]
    lines.append(f"{indent}  return " + ", ".join(["%" + v.name for v in graph.outputs]))
    lines.append(indent + "}")
    return "\n".join(lines)
