"""graphkernel's own graph file format (JSON or YAML), ``"format": "graphkernel/1"``.

See docs/graph-format.md. The file is validated with pydantic; every error names
the file and the JSON path of the offending field. Constants with more than
``INLINE_LIMIT`` elements go to a side ``.npz`` file named in ``data_file``.
Saving is atomic, and save -> load -> save reproduces the file exactly.

A graph file is data from someone else: it is read within the bounds of
``graphkernel.limits`` (size, nesting, YAML aliases, names, dims), its attribute
values must have exactly the types the op declares, and its ``data_file`` is a
file next to it, never a path elsewhere.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from graphkernel import limits, ops
from graphkernel.errors import FormatError, GraphKernelError, did_you_mean
from graphkernel.fileio import DocumentError, NpzError, NpzFile, read_document
from graphkernel.frontends.opaque import file_problem as opaque_file_problem
from graphkernel.ir import DType, Graph, TensorType
from graphkernel.outputs import write_file

FORMAT = "graphkernel/1"
INLINE_LIMIT = 64


def _check(problem: typing.Callable[[Any], str | None]) -> BeforeValidator:
    """A pydantic check of the raw value against one of graphkernel.limits' rules."""

    def check(v: Any) -> Any:
        if (p := problem(v)) is not None:
            raise ValueError(p)
        return v

    return BeforeValidator(check)


def _static_dim_problem(d: Any) -> str | None:
    if isinstance(d, str):
        return f"dim {d!r}: a constant's dims are ints"
    return limits.dim_problem(d)


Name = Annotated[str, _check(limits.name_problem)]
Dim = Annotated[int | str, _check(limits.dim_problem)]
StaticDim = Annotated[int, _check(_static_dim_problem)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(_Model):
    name: Name
    shape: list[Dim]
    dtype: str
    mutable: bool = False


class ConstSpec(_Model):
    name: Name
    shape: list[StaticDim]
    dtype: str
    data: list[Any] | None = None
    key: str | None = None  # entry in the side .npz file


class OutputSpec(_Model):
    name: Name
    shape: list[Dim]
    dtype: str


class NodeSpec(_Model):
    name: Name
    op: str
    inputs: list[str] = []
    outputs: list[Name | OutputSpec]
    attrs: dict[str, Any] = {}
    origin: list[Name] | None = None


class GraphSpec(_Model):
    format: Literal["graphkernel/1"] = FORMAT
    name: Name = "graph"
    data_file: str | None = None
    inputs: list[InputSpec] = []
    constants: list[ConstSpec] = []
    nodes: list[NodeSpec] = []
    outputs: list[str] = Field(min_length=1)


# --------------------------------------------------------------------- save
def _encode_scalar(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _encode_attr(value: Any, where: str, side: dict[str, np.ndarray] | None = None) -> Any:
    if isinstance(value, Graph):
        return {"graph": graph_to_dict(value, nested=True, side=side)}
    if isinstance(value, np.ndarray):
        spec: dict[str, Any] = {"dtype": DType.parse(value.dtype).value,
                                "shape": list(value.shape)}
        if side is not None and value.size > INLINE_LIMIT:
            spec["key"] = _side_key(side, value)
        else:
            spec["data"] = _const_data(value)
        return {"tensor": spec}
    if isinstance(value, DType):
        return value.value
    if isinstance(value, TensorType):
        return {"shape": list(value.shape), "dtype": value.dtype.value}
    if isinstance(value, list | tuple):
        return [_encode_attr(v, where, side) for v in value]
    if isinstance(value, dict):
        return {k: _encode_attr(v, where, side) for k, v in value.items()}
    if isinstance(value, float):
        return _encode_scalar(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, np.generic):
        return _encode_scalar(value.item())
    raise FormatError(f"{where}: attribute value {value!r} (a {type(value).__name__}) cannot be "
                      "saved to a graph file")


def _side_key(side: dict[str, np.ndarray], arr: np.ndarray) -> str:
    key = f"c{len(side)}"
    side[key] = arr.view(np.uint16) if arr.dtype == DType.bfloat16.np else arr
    return key


def _const_data(arr: np.ndarray) -> list[Any]:
    dt = DType.parse(arr.dtype)
    flat = arr.astype(np.float64) if dt is DType.bfloat16 else arr
    return [_encode_scalar(x) for x in flat.reshape(-1).tolist()]


def graph_to_dict(graph: Graph, nested: bool = False,
                  side: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """The file form of ``graph``; large constants go to ``side`` when given. Outputs are
    written under their names (an aliased output as an Identity named after it)."""
    graph = graph.with_output_values_named()
    out: dict[str, Any] = {} if nested else {"format": FORMAT}
    out["name"] = graph.name
    out["inputs"] = [{"name": v.name, "shape": list(v.type.shape), "dtype": v.type.dtype.value}
                     | ({"mutable": True} if v.mutable else {}) for v in graph.inputs]
    consts, nodes = [], []
    for n in graph.nodes:
        where = f"node '{n.name}' ({n.op})"
        if n.op == "Constant" and n.output.name == n.name and n.origin == (n.name,):
            arr = n.attrs["value"]
            spec: dict[str, Any] = {"name": n.name, "shape": list(arr.shape),
                                    "dtype": DType.parse(arr.dtype).value}
            if side is not None and arr.size > INLINE_LIMIT:
                spec["key"] = _side_key(side, arr)
            else:
                spec["data"] = _const_data(arr)
            consts.append(spec)
            continue
        if n.op == "Opaque" and n.attrs.get("fn") is not None and not n.attrs.get("spec"):
            raise FormatError(f"{where}: holds an in-memory Python callable and no saveable spec")
        attrs = {k: _encode_attr(v, where, side) for k, v in n.attrs.items()
                 if not (k == "fn" and n.op == "Opaque")}
        node: dict[str, Any] = {"name": n.name, "op": n.op,
                                "inputs": [v.name for v in n.inputs],
                                "outputs": [{"name": v.name, "shape": list(v.type.shape),
                                             "dtype": v.type.dtype.value} for v in n.outputs]}
        if attrs:
            node["attrs"] = attrs
        if n.origin != (n.name,):
            node["origin"] = list(n.origin)
        nodes.append(node)
    out["constants"] = consts
    out["nodes"] = nodes
    out["outputs"] = [v.name for v in graph.outputs]
    return out


def save_graph(graph: Graph, path: str | os.PathLike) -> list[Path]:
    """Write ``graph`` as JSON or YAML (by extension); returns the files written."""
    path = Path(path)
    side: dict[str, np.ndarray] = {}
    doc = graph_to_dict(graph, side=side)
    written = []
    if side:
        data_path = path.with_suffix(".npz")
        doc = {"format": doc["format"], "name": doc["name"], "data_file": data_path.name,
               **{k: v for k, v in doc.items() if k not in ("format", "name")}}
        buf = io.BytesIO()
        np.savez(buf, **side)
        write_file(data_path, buf.getvalue())
        written.append(data_path)
    if path.suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    elif path.suffix == ".json":
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    else:
        raise FormatError(f"{path}: unknown graph file extension {path.suffix!r} "
                          "(accepted: .json, .yaml, .yml)")
    write_file(path, text.encode())
    written.insert(0, path)
    return written


# --------------------------------------------------------------------- load
def _loc(loc: tuple) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _decode_scalars(data: list[Any], dtype: DType, where: str) -> list[Any]:
    out = []
    for i, x in enumerate(data):
        if isinstance(x, str):
            if x not in ("nan", "inf", "-inf") or not dtype.is_float:
                raise FormatError(f"{where}.data[{i}]: {x!r} is not a number (strings allowed "
                                  "only for 'nan', 'inf', '-inf' in float constants)")
            out.append(float(x))
        elif isinstance(x, bool | int | float):
            out.append(x)
        else:
            raise FormatError(f"{where}.data[{i}]: expected a number, got {x!r}")
    return out


def _decode_attr(value: Any, where: str, base: Path | None, data: NpzFile | None) -> Any:
    if isinstance(value, dict) and set(value) == {"graph"}:
        return graph_from_dict(value["graph"], where=where + ".graph", base=base, nested=True,
                               data=data)
    if isinstance(value, dict) and set(value) == {"tensor"} and isinstance(value["tensor"], dict):
        t = value["tensor"]
        unknown = set(t) - {"dtype", "shape", "data", "key"}
        if unknown or not isinstance(t.get("dtype"), str):
            raise FormatError(f"{where}.tensor: expected {{dtype, shape, data | key}} with a "
                              f"dtype name, got {sorted(t)}")
        shape = t.get("shape", [])
        if not isinstance(shape, list) or any(_static_dim_problem(d) for d in shape):
            raise FormatError(f"{where}.tensor.shape: expected a list of ints in "
                              f"0..{limits.MAX_DIM}, got {shape!r}")
        if (p := limits.numel_problem(tuple(shape))) is not None:
            raise FormatError(f"{where}.tensor.shape: {p}")
        dt = _dtype(t["dtype"], where + ".tensor.dtype")
        if "key" in t:
            arr = _data_array(data, t["key"], shape, dt, f"{where}.tensor.key")
        else:
            if not isinstance(t.get("data", []), list):
                raise FormatError(f"{where}.tensor.data: expected a list of numbers")
            arr = np.array(_decode_scalars(t.get("data", []), dt, where + ".tensor"),
                           dtype=np.float64 if dt is DType.bfloat16 else dt.np).astype(dt.np)
        try:
            return arr.reshape(shape)
        except ValueError:
            raise FormatError(f"{where}.tensor: {arr.size} values do not fill shape "
                              f"{shape}") from None
    if isinstance(value, list):
        return [_decode_attr(v, f"{where}[{i}]", base, data) for i, v in enumerate(value)]
    return value


def _dtype(name: Any, where: str) -> DType:
    try:
        return DType.parse(name)
    except GraphKernelError as e:
        raise FormatError(f"{where}: {e}") from None


def graph_from_dict(doc: Any, where: str = "graph", base: Path | None = None,
                    nested: bool = False, data: NpzFile | None = None) -> Graph:
    """Build a Graph from the file form; errors name ``where`` and the JSON path."""
    if not isinstance(doc, dict):
        raise FormatError(f"{where}: expected an object with 'format', 'inputs', 'nodes', "
                          f"'outputs', got {type(doc).__name__}")
    if not nested and "format" not in doc:
        raise FormatError(f"{where}: missing 'format' (expected \"{FORMAT}\")")
    try:
        spec = GraphSpec.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        if err["type"] == "too_short" and tuple(err["loc"]) == ("outputs",):
            msg = "the graph has no outputs; list the values it returns"
        if err["loc"] and err["loc"][0] == "format":
            msg = f"unsupported format {doc.get('format')!r} (expected \"{FORMAT}\")"
        raise FormatError(f"{where}: {_loc(err['loc'])}: {msg}") from None
    if spec.data_file and data is None:
        with _open_data_file(spec.data_file, base, where) as npz:
            return _build(spec, where, base, nested, npz)
    return _build(spec, where, base, nested, data)


def _build(spec: GraphSpec, where: str, base: Path | None, nested: bool,
           data: NpzFile | None) -> Graph:
    g = Graph(spec.name)
    for i, inp in enumerate(spec.inputs):
        w = f"{where}: inputs[{i}]"
        try:
            g.add_input(inp.name, TensorType(tuple(inp.shape), _dtype(inp.dtype, w + ".dtype")),
                        inp.mutable)
        except GraphKernelError as e:
            raise FormatError(f"{w}: {e}") from None
    for i, c in enumerate(spec.constants):
        w = f"{where}: constants[{i}] ('{c.name}')"
        dt = _dtype(c.dtype, w + ".dtype")
        if (p := limits.numel_problem(tuple(c.shape))) is not None:
            raise FormatError(f"{w}: {p}")
        if c.key is not None:
            arr = _data_array(data, c.key, c.shape, dt, f"{w}.key")
        elif c.data is not None:
            vals = _decode_scalars(c.data, dt, w)
            arr = np.array(vals, dtype=np.float64 if dt is DType.bfloat16 else dt.np).astype(dt.np)
        else:
            raise FormatError(f"{w}: needs 'data' (inline values) or 'key' (in the data file)")
        n = math.prod(c.shape)
        if arr.size != n:
            raise FormatError(f"{w}: shape {c.shape} needs {n} values, got {arr.size}")
        try:
            g.add_node("Constant", [], {"value": arr.reshape(c.shape)}, name=c.name)
        except GraphKernelError as e:
            raise FormatError(f"{w}: {e}") from None
    for i, ns in _dependency_order(spec, where, g):
        w = f"{where}: nodes[{i}] ('{ns.name}')"
        if not ops.exists(ns.op):
            raise FormatError(f"{w}.op: unknown op {ns.op!r}"
                              + did_you_mean(ns.op, [o.name for o in ops.all_ops()])
                              + "; run `graphkernel ops` to list them all")
        inputs = [g.value(name) for name in ns.inputs]
        attrs = {k: _decode_attr(v, f"{w}.attrs.{k}", base, data) for k, v in ns.attrs.items()}
        _check_attr_types(ops.get(ns.op), attrs, w)
        if ops.get(ns.op).name == "Opaque" and (p := opaque_file_problem(attrs)) is not None:
            raise FormatError(f"{w}.attrs.spec: {p}")
        names = [o if isinstance(o, str) else o.name for o in ns.outputs]
        try:
            node = g.add_node(ns.op, inputs, attrs, name=ns.name, origin=ns.origin,
                              output_names=names if names else None)
        except GraphKernelError as e:
            raise FormatError(f"{w}: {e}") from None
        if len(node.outputs) != len(ns.outputs):
            raise FormatError(f"{w}.outputs: op {node.op} has {len(node.outputs)} outputs, the "
                              f"file lists {len(ns.outputs)}")
        for j, (o, v) in enumerate(zip(ns.outputs, node.outputs, strict=True)):
            if isinstance(o, OutputSpec):
                declared = TensorType(tuple(o.shape), _dtype(o.dtype, f"{w}.outputs[{j}].dtype"))
                if declared != v.type:
                    raise FormatError(f"{w}.outputs[{j}]: declared type {declared} differs from "
                                      f"the inferred {v.type}")
    for i, name in enumerate(spec.outputs):
        if not g.has_value(name):
            raise FormatError(f"{where}: outputs[{i}]: unknown value {name!r}"
                              + did_you_mean(name, g._values))
    g.set_outputs([g.value(n) for n in spec.outputs])
    if len(g) == 0:
        raise FormatError(f"{where}: the graph has no nodes and computes nothing; add nodes "
                          "(or constants) that produce its outputs")
    if not nested and (problem := limits.check_graph(g)) is not None:
        raise FormatError(f"{where}: {problem}")
    return g


def _open_data_file(name: str, base: Path | None, where: str) -> NpzFile:
    """The side .npz: a regular file next to the graph file (a name, never a path elsewhere,
    and never a symbolic link), whose arrays are read when a constant names them."""
    if name in (".", "..") or os.path.basename(name) != name or "\\" in name \
            or limits.name_problem(name) is not None:
        raise FormatError(f"{where}: data_file {name!r} must be the name of a file next to the "
                          "graph file (no folders, no '..')")
    try:
        return NpzFile((base or Path(".")) / name, follow_links=False)
    except (OSError, NpzError) as e:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise FormatError(f"{where}: data_file {name!r} cannot be read: {detail}") from None


def _data_array(data: NpzFile | None, key: Any, shape: list[int], dt: DType,
                where: str) -> np.ndarray:
    """The array ``key`` of the data file, read within the bytes that ``shape`` and ``dt``
    need, in the declared dtype (bfloat16 is stored as its uint16 bits)."""
    if not isinstance(key, str) or data is None or key not in data:
        raise FormatError(f"{where}: {key!r} is not in the data file"
                          + ("" if data is None else did_you_mean(str(key), data.names())))
    stored = np.dtype(np.uint16) if dt is DType.bfloat16 else dt.np
    try:
        arr = data.read(key, math.prod(shape) * stored.itemsize, stored)
    except NpzError as e:
        raise FormatError(f"{where}: data file {data.path.name!r}: {e}") from None
    return arr.view(dt.np) if dt is DType.bfloat16 else arr


# Annotation leaves whose values a file must give exactly (no "yes" for a bool, no 1.0 for an
# int); attributes of other types (dtypes, tensors, subgraphs) have their own checks.
_PLAIN = (bool, int, float, str, type(None))


def _leaves(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return [str]
    args = typing.get_args(annotation)
    return [leaf for a in args for leaf in _leaves(a)] if args else [annotation]


@functools.cache
def _strict_adapter(annotation: Any) -> TypeAdapter | None:
    if not all(leaf in _PLAIN for leaf in _leaves(annotation)):
        return None
    return TypeAdapter(annotation, config=ConfigDict(strict=True))


def _check_attr_types(opdef: Any, attrs: dict[str, Any], where: str) -> None:
    """A file's attribute values have exactly their declared types; a string where an int or
    a symbol is accepted (a shape entry) is a symbolic dim and must be a valid one."""
    fields = opdef.attrs.model_fields
    for key, value in attrs.items():
        if key not in fields:
            continue  # an unknown attribute: the op's own check names it
        annotation = fields[key].annotation
        adapter = _strict_adapter(annotation)
        if adapter is None:
            continue
        try:
            adapter.validate_python(value)
        except ValidationError:
            text = str(annotation).replace("typing.", "")
            text = getattr(annotation, "__name__", text) if "[" not in text else text
            raise FormatError(f"{where}.attrs.{key}: expected {text}, got {value!r}") from None
        leaves = _leaves(annotation)
        if int in leaves and str in leaves:
            for d in value if isinstance(value, list) else [value]:
                if isinstance(d, str) and (p := limits.dim_problem(d)) is not None:
                    raise FormatError(f"{where}.attrs.{key}: {p}")


def _dependency_order(spec: GraphSpec, where: str, g: Graph) -> list[tuple[int, NodeSpec]]:
    """Nodes in dependency order (the file may list them in any order); cycles and
    dangling names are errors that name the nodes."""
    producer: dict[str, int] = {}
    for i, ns in enumerate(spec.nodes):
        for o in ns.outputs:
            name = o if isinstance(o, str) else o.name
            if name in producer or g.has_value(name):
                raise FormatError(f"{where}: nodes[{i}] ('{ns.name}').outputs: value {name!r} "
                                  "is defined twice")
            producer[name] = i
    known = set(g._values) | set(producer)
    deps: dict[int, set[int]] = {}
    for i, ns in enumerate(spec.nodes):
        deps[i] = set()
        for j, name in enumerate(ns.inputs):
            if name not in known:
                raise FormatError(f"{where}: nodes[{i}] ('{ns.name}').inputs[{j}]: {name!r} is "
                                  "dangling: not a graph input, constant or node output"
                                  + did_you_mean(name, known))
            if name in producer:
                deps[i].add(producer[name])
    order, done, visiting = [], set(), []
    state: dict[int, int] = {}
    for root in range(len(spec.nodes)):
        stack = [(root, iter(sorted(deps[root])))]
        if root in done:
            continue
        state[root] = 1
        visiting.append(root)
        while stack:
            i, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                visiting.pop()
                state[i] = 2
                done.add(i)
                order.append(i)
            elif state.get(nxt) == 1:
                cyc = visiting[visiting.index(nxt):] + [nxt]
                path = " -> ".join(spec.nodes[k].name for k in cyc)
                raise FormatError(f"{where}: nodes form a cycle: {path}; a node must not depend "
                                  "on its own output")
            elif state.get(nxt) != 2:
                state[nxt] = 1
                visiting.append(nxt)
                stack.append((nxt, iter(sorted(deps[nxt]))))
    return [(i, spec.nodes[i]) for i in order]


def load_graph(path: str | os.PathLike) -> Graph:
    """Load a .json/.yaml/.yml graph file."""
    path = Path(path)
    try:
        doc = read_document(path, limits.MAX_GRAPH_FILE_BYTES)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot be read: {e.strerror or e}") from None
    except DocumentError as e:
        kind = ("invalid YAML" if path.suffix != ".json" else "invalid JSON") if e.syntax \
            else "refused"
        raise FormatError(f"{path}{e.pos}: {kind}: {e.detail}") from None
    return graph_from_dict(doc, where=str(path), base=path.parent)
