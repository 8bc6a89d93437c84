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
import json
import math
import os
import typing
import weakref
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

import numpy as np
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from graphkernel import limits, ops
from graphkernel.errors import FormatError, GraphKernelError, did_you_mean
from graphkernel.fileio import (
    DocumentError,
    MappedData,
    NpzError,
    NpzFile,
    map_file,
    mapped_view,
    open_regular,
    read_document,
    release_freed_memory,
    source_of,
)
from graphkernel.frontends.opaque import file_problem as opaque_file_problem
from graphkernel.ir import DType, Graph, TensorType
from graphkernel.outputs import share_file, write_file, write_stream

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
    # strict: a file gives each field exactly its type (no "yes" or 1 for a bool, no true,
    # "16" or 16.0 for a byte offset), as the attributes are checked (``_strict``)
    model_config = ConfigDict(extra="forbid", strict=True)


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
    key: str | None = None  # a member of an .npz data file
    offset: int | None = None  # where its bytes start in a raw data file
    file: str | None = None  # which data file (default: the first)


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
    data_file: str | list[str] | None = None
    inputs: list[InputSpec] = []
    constants: list[ConstSpec] = []
    nodes: list[NodeSpec] = []
    outputs: list[str] = Field(min_length=1)


# --------------------------------------------------------------------- save
def _encode_scalar(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


class _Sharing:
    """The model data files a saved graph shares instead of copying: an unchanged constant
    (still a view of the file it was loaded from: ``fileio.source_of``) is referenced in a
    file of the graph's folder that is that data file (``outputs.share_file``), named after
    the graph (``<stem>.weights.npz``, ``<stem>.weights-2.bin``, ...)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: dict[int, str] = {}  # id of a map -> the shared file's name
        self.maps: list[MappedData] = []
        # id of an array asked about -> (the array, its reference): the writer asks of each
        # array twice (which data files the graph names, then what to write for it)
        self.seen: dict[int, tuple[np.ndarray, dict[str, Any] | None]] = {}

    def reference(self, arr: np.ndarray) -> dict[str, Any] | None:
        """``file`` and ``key`` (a whole .npz member) or ``offset`` of ``arr``'s bytes, when
        ``arr`` is still a view of a model's data file."""
        known = self.seen.get(id(arr))
        if known is not None and known[0] is arr:
            return None if known[1] is None else dict(known[1])
        ref = self._reference(arr)
        self.seen[id(arr)] = (arr, ref)
        return None if ref is None else dict(ref)

    def _reference(self, arr: np.ndarray) -> dict[str, Any] | None:
        found = source_of(arr)
        if found is None:
            return None
        mm, offset = found
        if offset < 0 or offset + arr.nbytes > len(mm):
            return None
        name = self.names.get(id(mm))
        if name is None:
            i = len(self.maps)
            suffix = ".npz" if mm.members else ".bin"
            name = f"{self.path.stem}.weights{'' if i == 0 else f'-{i + 1}'}{suffix}"
            self.names[id(mm)] = name
            self.maps.append(mm)
        member = mm.members.get(offset)
        if member is not None and member[1] == arr.nbytes and (
                member[2] == arr.dtype or member[2] == np.uint16
                and arr.dtype == DType.bfloat16.np):
            return {"file": name, "key": member[0]}
        return {"file": name, "offset": offset}

    def write(self) -> list[Path]:
        return [share_file(self.path.with_name(self.names[id(mm)]), mm.fd, mm.path)
                for mm in self.maps]


def _encode_attr(value: Any, where: Any, side: dict[str, np.ndarray] | None = None,
                 shared: _Sharing | None = None) -> Any:
    """The file form of an attribute value; ``where`` names it in an error: a text, or the
    node it belongs to (its text made only when there is an error to report)."""
    cls = type(value)
    if cls is int or cls is str or cls is bool or value is None:  # (most attributes)
        return value
    if cls is list and all(type(v) is int for v in value):
        return value
    if isinstance(value, Graph):
        return {"graph": graph_to_dict(value, nested=True, side=side, shared=shared)}
    if isinstance(value, np.ndarray):
        spec: dict[str, Any] = {"dtype": DType.parse(value.dtype).value,
                                "shape": list(value.shape)}
        if side is not None and value.size > INLINE_LIMIT:
            spec |= _stored(side, shared, value)
        else:
            spec["data"] = _const_data(value)
        return {"tensor": spec}
    if isinstance(value, DType):
        return value.value
    if isinstance(value, TensorType):
        return {"shape": list(value.shape), "dtype": value.dtype.value}
    if isinstance(value, list | tuple):
        return [_encode_attr(v, where, side, shared) for v in value]
    if isinstance(value, dict):
        return {k: _encode_attr(v, where, side, shared) for k, v in value.items()}
    if isinstance(value, float):
        return _encode_scalar(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, np.generic):
        return _encode_scalar(value.item())
    at = where if isinstance(where, str) else f"node '{where.name}' ({where.op})"
    raise FormatError(f"{at}: attribute value {value!r} (a {type(value).__name__}) cannot be "
                      "saved to a graph file")


def _stored(side: dict[str, np.ndarray], shared: _Sharing | None, arr: np.ndarray
            ) -> dict[str, Any]:
    """Where a large array's values go: a reference to the model's data file it is still a
    view of (when sharing), else a new member of the graph's own .npz."""
    if shared is not None and (ref := shared.reference(arr)) is not None:
        return ref
    key = f"c{len(side)}"
    side[key] = arr.view(np.uint16) if arr.dtype == DType.bfloat16.np else arr
    return {"key": key}


def _const_data(arr: np.ndarray) -> list[Any]:
    if arr.size == 1 and arr.dtype.kind in "fiub" and arr.dtype.names is None \
            and arr.dtype != _BF16:  # (most inline constants: a scalar, read as one)
        x = arr.reshape(-1).tolist()
        return x if arr.dtype.kind != "f" or math.isfinite(x[0]) else [_encode_scalar(x[0])]
    dt = DType.parse(arr.dtype)
    if dt.is_int or dt is DType.bool or dt.is_float and dt is not DType.bfloat16 \
            and np.isfinite(arr).all():
        return arr.reshape(-1).tolist()
    flat = arr.astype(np.float64) if dt is DType.bfloat16 else arr
    return [_encode_scalar(x) for x in flat.reshape(-1).tolist()]


_BF16 = DType.bfloat16.np


@functools.cache
def _dtype_name(dt: np.dtype) -> str:
    """The file's name of a numpy dtype (``DType.parse``, remembered: asked per constant)."""
    return DType.parse(dt).value


def _constant_spec(n: Any, side: dict[str, np.ndarray] | None, shared: _Sharing | None
                   ) -> dict[str, Any]:
    arr = n.attrs["value"]
    spec: dict[str, Any] = {"name": n.name, "shape": list(arr.shape),
                            "dtype": _dtype_name(arr.dtype)}
    if side is not None and arr.size > INLINE_LIMIT:
        spec |= _stored(side, shared, arr)
    else:
        spec["data"] = _const_data(arr)
    return spec


def _node_spec(n: Any, side: dict[str, np.ndarray] | None, shared: _Sharing | None
               ) -> dict[str, Any]:
    opaque = n.op == "Opaque"
    if opaque and n.attrs.get("fn") is not None and not n.attrs.get("spec"):
        raise FormatError(f"node '{n.name}' ({n.op}): holds an in-memory Python callable and "
                          "no saveable spec")
    attrs = {}
    for k, v in n.attrs.items():
        cls = type(v)
        if cls is int or cls is str or cls is bool or v is None:  # (most: as they are)
            attrs[k] = v
        elif cls is Graph:  # (a kernel's body)
            attrs[k] = {"graph": graph_to_dict(v, nested=True, side=side, shared=shared)}
        elif not (opaque and k == "fn"):
            attrs[k] = _encode_attr(v, n, side, shared)
    node: dict[str, Any] = {"name": n.name, "op": n.op,
                            "inputs": [v.name for v in n.inputs],
                            "outputs": [{"name": v.name, "shape": list(v.type.shape),
                                         "dtype": v.type.dtype._value_} for v in n.outputs]}
    if attrs:
        node["attrs"] = attrs
    if n.origin != (n.name,):
        node["origin"] = list(n.origin)
    return node


def _inputs_spec(graph: Graph) -> list[dict[str, Any]]:
    return [{"name": v.name, "shape": list(v.type.shape), "dtype": v.type.dtype._value_}
            | ({"mutable": True} if v.mutable else {}) for v in graph.inputs]


def graph_to_dict(graph: Graph, nested: bool = False,
                  side: dict[str, np.ndarray] | None = None,
                  shared: _Sharing | None = None) -> dict[str, Any]:
    """The file form of ``graph``; large constants go to ``side`` when given (or, with
    ``shared``, are references to the model data files they are still views of). Outputs
    are written under their names (an aliased output as an Identity named after it)."""
    graph = graph.with_output_values_named()
    out: dict[str, Any] = {} if nested else {"format": FORMAT}
    out["name"] = graph.name
    out["inputs"] = _inputs_spec(graph)
    consts, nodes = _split_constants(graph)
    out["constants"] = [_constant_spec(n, side, shared) for n in consts]
    out["nodes"] = [_node_spec(n, side, shared) for n in nodes]
    out["outputs"] = [v.name for v in graph.outputs]
    return out


def _split_constants(graph: Graph) -> tuple[list[Any], list[Any]]:
    """The graph's nodes in order: those written as ``constants`` (a Constant named as its
    value, of no other origin), and the others (nodes like any other)."""
    consts, nodes = [], []
    for n in graph.nodes:
        if n.op == "Constant" and n.outputs[0].name == n.name and n.origin == (n.name,):
            consts.append(n)
        else:
            nodes.append(n)
    return consts, nodes


def _large_arrays(graph: Graph) -> Iterator[np.ndarray]:
    """The arrays of ``graph`` (subgraphs included) that go to a data file."""
    for n in graph.nodes:
        for k, v in n.attrs.items():
            cls = type(v)
            if cls is int or cls is str or cls is bool or v is None or k == "fn":
                continue
            yield from _arrays_in(v)


def _arrays_in(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, np.ndarray):
        if value.size > INLINE_LIMIT:
            yield value
    elif isinstance(value, Graph):
        yield from _large_arrays(value)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _arrays_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _arrays_in(v)


def save_graph(graph: Graph, path: str | os.PathLike, *, share_data: bool = False
               ) -> list[Path]:
    """Write ``graph`` as JSON or YAML (by extension); returns the files written. Large
    constants go to ``<stem>.npz`` beside it. ``share_data``: those still as they were
    loaded from a model's data file are not copied but referenced in that file, which the
    graph's folder shares (``<stem>.weights.npz``: a hard link to it, or a copy made by the
    kernel where no link can be made); only new or changed constants go to ``<stem>.npz``.
    A JSON file is written piece by piece (the text of the whole graph is never held)."""
    path = Path(path)
    if path.suffix not in (".json", ".yaml", ".yml"):
        raise FormatError(f"{path}: unknown graph file extension {path.suffix!r} "
                          "(accepted: .json, .yaml, .yml)")
    graph = graph.with_output_values_named()
    side: dict[str, np.ndarray] = {}
    shared = _Sharing(path) if share_data else None
    own = False
    for arr in _large_arrays(graph):  # which data files the graph names (they come first)
        if shared is None or shared.reference(arr) is None:
            own = True
    files = ([path.with_suffix(".npz").name] if own else []) \
        + ([] if shared is None else [shared.names[id(mm)] for mm in shared.maps])
    head: dict[str, Any] = {"format": FORMAT, "name": graph.name}
    if files:
        head["data_file"] = files[0] if len(files) == 1 else files
    if path.suffix == ".json":
        def put(f: BinaryIO) -> None:
            for piece in _json_pieces(graph, head, side, shared):
                f.write(piece.encode())

        write_stream(path, put)
    else:
        doc = head | {k: v for k, v in graph_to_dict(graph, side=side, shared=shared).items()
                      if k not in head}
        write_file(path, yaml.safe_dump(doc, sort_keys=False, default_flow_style=None,
                                        width=100).encode())
    written = [path]
    if side:
        written.append(write_stream(path.with_suffix(".npz"), lambda f: _write_npz(f, side)))
    if shared is not None:
        written += shared.write()
    return written


def _json_pieces(graph: Graph, head: dict[str, Any], side: dict[str, np.ndarray],
                 shared: _Sharing | None) -> Iterator[str]:
    """The JSON text of the graph's document, one input, constant or node at a time, each on
    one line (encoded by the standard library's C encoder: a large graph is written in a
    fraction of the time an indented dump takes, and in half the bytes)."""
    def items(key: str, values: Iterator[Any]) -> Iterator[str]:
        first = True
        for v in values:
            yield (f"{_compact(key)}: [\n  " if first else ",\n  ") + _compact(v)
            first = False
        yield f"{_compact(key)}: []" if first else "\n ]"

    consts, nodes = _split_constants(graph)
    parts = [iter([f"{_compact(k)}: {_compact(v)}"]) for k, v in head.items()]
    parts += [items("inputs", iter(_inputs_spec(graph))),
              items("constants", (_constant_spec(n, side, shared) for n in consts)),
              items("nodes", (_node_spec(n, side, shared) for n in nodes)),
              items("outputs", (v.name for v in graph.outputs))]
    yield "{\n "
    for i, part in enumerate(parts):
        if i:
            yield ",\n "
        yield from part
    yield "\n}\n"


# (no check for containers holding themselves: every container encoded is one the writer
# built for the file from the graph, or an attribute's list of ints; the check is a tenth of
# the encoder's time)
_compact = json.JSONEncoder(separators=(", ", ": "), allow_nan=False,
                            check_circular=False).encode


def _write_npz(f: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """Arrays as ``numpy.savez`` writes them (members stored uncompressed, ZIP64), written
    into ``f`` one at a time."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, value in arrays.items():
            with zf.open(f"{key}.npy", "w", force_zip64=True) as m:
                np.lib.format.write_array(m, np.asanyarray(value), allow_pickle=False)


# --------------------------------------------------------------------- load
def _loc(loc: tuple) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _decode_scalars(data: list[Any], dtype: DType, where: str) -> list[Any]:
    if {type(x) for x in data} <= {int, float}:  # (plain numbers: as they are)
        return data
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


def _decode_attr(value: Any, where: str, base: Path | None, data: DataFiles | None) -> Any:
    if isinstance(value, dict) and set(value) == {"graph"}:
        return graph_from_dict(value["graph"], where=where + ".graph", base=base, nested=True,
                               data=data)
    if isinstance(value, dict) and set(value) == {"tensor"} and isinstance(value["tensor"], dict):
        t = value["tensor"]
        unknown = set(t) - {"dtype", "shape", "data", "key", "file", "offset"}
        if unknown or not isinstance(t.get("dtype"), str):
            raise FormatError(f"{where}.tensor: expected {{dtype, shape, data | key | offset}} "
                              f"with a dtype name, got {sorted(t)}")
        shape = t.get("shape", [])
        if not isinstance(shape, list) or any(_static_dim_problem(d) for d in shape):
            raise FormatError(f"{where}.tensor.shape: expected a list of ints in "
                              f"0..{limits.MAX_DIM}, got {shape!r}")
        if (p := limits.numel_problem(tuple(shape))) is not None:
            raise FormatError(f"{where}.tensor.shape: {p}")
        dt = _dtype(t["dtype"], where + ".tensor.dtype")
        if "key" in t or "offset" in t:
            arr = _stored_array(data, t, shape, dt, f"{where}.tensor")
        else:
            if not isinstance(t.get("data", []), list) or "file" in t:
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
                    nested: bool = False, data: DataFiles | None = None) -> Graph:
    """Build a Graph from the file form; errors name ``where`` and the JSON path. A document
    of the plain types JSON gives, within the limits, is read as it is; any other (a value of
    another type, a breach) goes through the pydantic model, whose error names the field."""
    if not isinstance(doc, dict):
        raise FormatError(f"{where}: expected an object with 'format', 'inputs', 'nodes', "
                          f"'outputs', got {type(doc).__name__}")
    if not nested and "format" not in doc:
        raise FormatError(f"{where}: missing 'format' (expected \"{FORMAT}\")")
    spec = doc if _plain_graph(doc, 1) else _validated(doc, where, nested)
    if data is None and spec.get("data_file"):
        with DataFiles(spec["data_file"], base, where) as files:
            return _build(spec, where, base, nested, files)
    return _build(spec, where, base, nested, data)


def _validated(doc: dict, where: str, nested: bool) -> dict[str, Any]:
    """``doc`` checked by the pydantic model (nesting first, for a top-level document), in
    the plain form ``_build`` reads; or the FormatError naming the first problem."""
    if not nested and (problem := limits.check_document(doc, limits.MAX_DEPTH)) is not None:
        raise FormatError(f"{where}: refused: {problem}")
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
    return spec.model_dump()


# ----------------------------------------------------- the plain document, read as it is
_GRAPH_KEYS = frozenset(GraphSpec.model_fields)
_INPUT_KEYS = frozenset(InputSpec.model_fields)
_CONST_KEYS = frozenset(ConstSpec.model_fields)
_NODE_KEYS = frozenset(NodeSpec.model_fields)
_OUTPUT_KEYS = frozenset(OutputSpec.model_fields)


def _name_ok(x: Any) -> bool:
    return type(x) is str and limits.name_problem(x) is None


@functools.lru_cache(maxsize=4096)
def _symbol_ok(d: str) -> bool:
    return limits.dim_problem(d) is None


def _shape_ok(shape: Any, static: bool) -> bool:
    if type(shape) is not list:
        return False
    for d in shape:
        if type(d) is int:
            if not 0 <= d <= limits.MAX_DIM:
                return False
        elif static or type(d) is not str or not _symbol_ok(d):
            return False
    return True


def _depth_ok(value: Any, depth: int) -> bool:
    """No list or object in ``value`` (itself at ``depth``) is nested past the limit."""
    if type(value) is dict:
        items: Any = value.values()
    elif type(value) is list:
        items = value
    else:
        return True
    if depth > limits.MAX_DEPTH:
        return False
    return all(_depth_ok(v, depth + 1) for v in items
               if type(v) is dict or type(v) is list)


def _plain_graph(doc: dict, depth: int) -> bool:
    """Whether ``doc`` (a graph object at nesting ``depth``) is exactly what the pydantic
    model accepts unchanged: the fields it knows, of exactly their types (no coercion), names
    and dims within the limits, no list or object nested past the limit. Anything else (a
    bool where an int goes, an unknown field, ...) is left to the model, which names it."""
    if not _GRAPH_KEYS.issuperset(doc) or doc.get("format", FORMAT) != FORMAT \
            or type(doc.get("format", FORMAT)) is not str or not _name_ok(doc.get("name", "g")):
        return False
    files = doc.get("data_file")
    if files is not None and type(files) is not str and not (
            type(files) is list and files and all(type(f) is str for f in files)):
        return False
    inputs, consts, nodes = doc.get("inputs", []), doc.get("constants", []), doc.get("nodes", [])
    outputs = doc.get("outputs")
    if type(inputs) is not list or type(consts) is not list or type(nodes) is not list \
            or type(outputs) is not list or not outputs or depth + 5 > limits.MAX_DEPTH:
        return False
    if not all(type(o) is str for o in outputs):
        return False
    for inp in inputs:
        if type(inp) is not dict or not _INPUT_KEYS.issuperset(inp) or len(inp) < 3 \
                or not _name_ok(inp.get("name")) or type(inp.get("dtype")) is not str \
                or not _shape_ok(inp.get("shape"), False) \
                or type(inp.get("mutable", False)) is not bool:
            return False
    for c in consts:
        if type(c) is not dict or not _CONST_KEYS.issuperset(c) or not _name_ok(c.get("name")) \
                or type(c.get("dtype")) is not str or not _shape_ok(c.get("shape"), True):
            return False
        values, key = c.get("data"), c.get("key")
        if not (values is None or type(values) is list and _depth_ok(values, depth + 3)) \
                or not (key is None or type(key) is str) \
                or not (c.get("file") is None or type(c["file"]) is str) \
                or not (c.get("offset") is None or type(c["offset"]) is int):
            return False
    for ns in nodes:
        if type(ns) is not dict or not _NODE_KEYS.issuperset(ns) or not _name_ok(ns.get("name")) \
                or type(ns.get("op")) is not str:
            return False
        ins, outs = ns.get("inputs", []), ns.get("outputs")
        attrs, origin = ns.get("attrs", {}), ns.get("origin")
        if type(ins) is not list or type(outs) is not list or type(attrs) is not dict \
                or not all(type(i) is str for i in ins):
            return False
        for o in outs:
            if type(o) is dict:
                if len(o) != 3 or not _OUTPUT_KEYS.issuperset(o) or not _name_ok(o["name"]) \
                        or type(o["dtype"]) is not str or not _shape_ok(o["shape"], False):
                    return False
            elif not _name_ok(o):
                return False
        if origin is not None and (type(origin) is not list
                                   or not all(_name_ok(o) for o in origin)):
            return False
        for k, v in attrs.items():
            if type(k) is not str:
                return False
            if type(v) is dict and len(v) == 1 and type(v.get("graph")) is dict:
                if not _plain_graph(v["graph"], depth + 5):
                    return False
            elif (type(v) is dict or type(v) is list) and not _depth_ok(v, depth + 4):
                return False
    return True


# ------------------------------------------------------------------------ building
def _build(spec: dict[str, Any], where: str, base: Path | None, nested: bool,
           data: DataFiles | None) -> Graph:
    g = Graph(spec.get("name", "graph"))
    for i, inp in enumerate(spec.get("inputs", ())):
        w = f"{where}: inputs[{i}]"
        dt = _dtype(inp["dtype"], w + ".dtype")  # (its error names the field already)
        try:
            g.add_input(inp["name"], TensorType(tuple(inp["shape"]), dt),
                        inp.get("mutable", False))
        except GraphKernelError as e:
            raise FormatError(f"{w}: {e}") from None
    for i, c in enumerate(spec.get("constants", ())):
        w = f"{where}: constants[{i}] ('{c['name']}')"
        dt = _dtype(c["dtype"], w + ".dtype")
        shape = c["shape"]
        if (p := limits.numel_problem(tuple(shape))) is not None:
            raise FormatError(f"{w}: {p}")
        if c.get("key") is not None or c.get("offset") is not None:
            if c.get("data") is not None:
                raise FormatError(f"{w}: give 'data' (inline values) or 'key'/'offset' (in a "
                                  "data file), not both")
            arr = _stored_array(data, c, shape, dt, w)
        elif c.get("data") is not None:
            vals = _decode_scalars(c["data"], dt, w)
            arr = np.array(vals, dtype=np.float64 if dt is DType.bfloat16 else dt.np).astype(dt.np)
        else:
            raise FormatError(f"{w}: needs 'data' (inline values), 'key' (an .npz member) or "
                              "'offset' (in a raw data file)")
        n = math.prod(shape)
        if arr.size != n:
            raise FormatError(f"{w}: shape {shape} needs {n} values, got {arr.size}")
        if _new_constant(g, c["name"], arr.reshape(shape)):
            continue
        try:
            g.add_node("Constant", [], {"value": arr.reshape(shape)}, name=c["name"])
        except GraphKernelError as e:
            raise FormatError(f"{w}: {e}") from None
    values = g._values
    for i, ns in _dependency_order(spec.get("nodes", []), where, g):
        if _repeated_node(g, ns, values) is not None:
            continue
        w = f"{where}: nodes[{i}] ('{ns['name']}')"
        op = ns["op"]
        if not ops.exists(op):
            raise FormatError(f"{w}.op: unknown op {op!r}"
                              + did_you_mean(op, [o.name for o in ops.all_ops()])
                              + "; run `graphkernel ops` to list them all")
        opdef = ops.get(op)
        inputs = [g.value(name) for name in ns.get("inputs", ())]
        attrs = {k: _decode_attr(v, f"{w}.attrs.{k}", base, data)
                 for k, v in ns.get("attrs", {}).items()}
        _check_attr_types(opdef, attrs, w)
        if opdef.name == "Opaque" and (p := opaque_file_problem(attrs)) is not None:
            raise FormatError(f"{w}.attrs.spec: {p}")
        outs = ns["outputs"]
        names = [o if type(o) is str else o["name"] for o in outs]
        try:
            node = g.add_node(op, inputs, attrs, name=ns["name"], origin=ns.get("origin"),
                              output_names=names if names else None)
        except GraphKernelError as e:
            raise FormatError(f"{w}: {e}") from None
        if len(node.outputs) != len(outs):
            raise FormatError(f"{w}.outputs: op {node.op} has {len(node.outputs)} outputs, the "
                              f"file lists {len(outs)}")
        _remember_node(ns, node)
        for j, (o, v) in enumerate(zip(outs, node.outputs, strict=True)):
            if type(o) is not str and (o["dtype"] != v.type.dtype._value_
                                       or tuple(o["shape"]) != v.type.shape):
                declared = TensorType(tuple(o["shape"]),
                                      _dtype(o["dtype"], f"{w}.outputs[{j}].dtype"))
                if declared != v.type:
                    raise FormatError(f"{w}.outputs[{j}]: declared type {declared} differs from "
                                      f"the inferred {v.type}")
    for i, name in enumerate(spec["outputs"]):
        if not g.has_value(name):
            raise FormatError(f"{where}: outputs[{i}]: unknown value {name!r}"
                              + did_you_mean(name, g._values))
    g.set_outputs([g.value(n) for n in spec["outputs"]])
    if len(g) == 0:
        raise FormatError(f"{where}: the graph has no nodes and computes nothing; add nodes "
                          "(or constants) that produce its outputs")
    if not nested and (problem := limits.check_graph(g)) is not None:
        raise FormatError(f"{where}: {problem}")
    return g


# A node of the file as the checks made it, by (op, attributes as the file gives them, input
# types): its op's own name, its attributes checked and with their defaults, whether they
# hold a list (copied per node), its output types (and as a file declares them). A repeated
# layer's nodes are each built
# from the first one's checks (attribute types, the op's schema, the types it infers), all a
# function of that key. Attributes other than plain values (tensors, subgraphs) and Opaque
# nodes (whose spec names a file) are never keyed.
_NODES: dict[tuple, tuple[str, dict[str, Any], bool, tuple[TensorType, ...], list]] = {}
_NODES_KEPT = 4096


def _node_key(ns: dict[str, Any], inputs: list[Any]) -> tuple | None:
    attrs = ns.get("attrs")
    frozen = ops.frozen_attrs(attrs) if attrs else ()
    if frozen is None or ns["op"] == "Opaque":
        return None
    return (ns["op"], frozen, tuple([v.type for v in inputs]))


def _remember_node(ns: dict[str, Any], node: Any) -> None:
    """Keep what checking and building ``node`` (from the file's ``ns``) found, for
    ``_repeated_node``."""
    key = _node_key(ns, node.inputs)
    if key is None or ops.frozen_attrs(node.attrs) is None:
        return
    if len(_NODES) >= _NODES_KEPT:
        _NODES.clear()
    has_list = any(_holds_list(v) for v in node.attrs.values())
    types = tuple([v.type for v in node.outputs])
    _NODES[key] = (node.op, {k: _fresh(v) for k, v in node.attrs.items()}, has_list, types,
                   [(t.dtype._value_, list(t.shape)) for t in types])


def _repeated_node(g: Graph, ns: dict[str, Any], values: dict[str, Any]) -> Any:
    """The node ``ns`` added to ``g`` when an equal one (``_NODES``) was checked before and
    its names are new and as many as its outputs; else None (and nothing added: the node
    then goes through every check, which names what is wrong)."""
    try:
        inputs = [values[name] for name in ns.get("inputs", ())]
    except KeyError:
        return None
    key = _node_key(ns, inputs)
    known = None if key is None else _NODES.get(key)
    if known is None:
        return None
    op, attrs, has_list, types, declared = known
    name, outs = ns["name"], ns["outputs"]
    if name in g._node_names or len(outs) != len(types):
        return None
    names = [o if type(o) is str else o["name"] for o in outs]
    for o, vname, (dtype, shape) in zip(outs, names, declared):
        if vname in values or type(o) is not str and (o["dtype"] != dtype
                                                      or o["shape"] != shape):
            return None  # (a name taken, or a declared type to compare: the checks say)
    if len(set(names)) != len(names):
        return None
    attrs = {k: _fresh(v) for k, v in attrs.items()} if has_list else dict(attrs)
    origin = ns.get("origin")
    return g._add_raw(op, name, inputs, attrs, (name,) if origin is None else tuple(origin),
                      list(zip(names, types)))


def _new_constant(g: Graph, name: str, arr: np.ndarray) -> bool:
    """Add a Constant of ``arr`` (an array of a supported dtype, as the file's constants are
    read) named ``name`` and nothing else checked, when the name is new: ``add_node``'s
    schema would keep the same array, and its type is inferred as ``add_node`` infers it.
    False (nothing added) otherwise: ``add_node`` then says what is wrong."""
    if name in g._node_names or name in g._values:
        return False
    attrs = {"value": arr}
    try:
        (t,) = ops.get("Constant").infer_types([], attrs)
    except GraphKernelError:
        return False
    g._add_raw("Constant", name, [], attrs, (name,), [(name, t)])
    return True


def _holds_list(v: Any) -> bool:
    return type(v) is list or type(v) is tuple and any(_holds_list(x) for x in v)


def _fresh(v: Any) -> Any:
    """``v`` with every list in it a new list (no two nodes share a mutable value)."""
    if type(v) is list:
        return [_fresh(x) for x in v]
    if type(v) is tuple:
        return tuple(_fresh(x) for x in v)
    return v


class DataFiles:
    """The data files of a graph file (``data_file``: one name or a list), each a regular
    file next to the graph file (a name, never a path elsewhere, never a symbolic link),
    opened when the graph is read and memory-mapped. A constant names a member of an .npz
    archive by ``key``, or bytes of any data file (raw little-endian data, such as ONNX
    external data) by ``offset``; by ``file`` which of them (default: the first)."""

    def __init__(self, names: str | list[str], base: Path | None, where: str) -> None:
        self.names = [names] if isinstance(names, str) else list(names)
        self.where = where
        self.npz: dict[str, NpzFile] = {}
        self.not_npz: dict[str, NpzError] = {}
        self.raw: dict[str, MappedData | None] = {}
        if not self.names or len(set(self.names)) != len(self.names):
            raise FormatError(f"{where}: data_file: give one file name or a list of distinct "
                              f"names, got {self.names!r}")
        try:
            for name in self.names:
                self._open(name, base)
        except BaseException:
            self.close()
            raise

    def _open(self, name: str, base: Path | None) -> None:
        if name in (".", "..") or os.path.basename(name) != name or "\\" in name \
                or limits.name_problem(name) is not None:
            raise FormatError(f"{self.where}: data_file {name!r} must be the name of a file next "
                              "to the graph file (no folders, no '..')")
        path = (base or Path(".")) / name
        try:
            try:
                z = self.npz[name] = NpzFile(path, follow_links=False, mapped=True)
                self.raw[name] = z.mapped
            except NpzError as e:  # raw data (named by offset), or a key's error
                self.not_npz[name] = e
                with open_regular(path, follow_links=False) as f:
                    self.raw[name] = map_file(f, path)
        except OSError as e:
            raise FormatError(f"{self.where}: data_file {name!r} cannot be read: "
                              f"{e.strerror or e}") from None

    def __enter__(self) -> DataFiles:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for z in self.npz.values():
            z.close()

    def file(self, name: Any, where: str) -> str:
        """The data file a constant names (the first when it names none)."""
        if name is None:
            return self.names[0]
        if name not in self.names:
            raise FormatError(f"{where}.file: {name!r} is not one of the graph's data files "
                              f"({', '.join(self.names)})")
        return name

    def archive(self, name: str) -> NpzFile:
        z = self.npz.get(name)
        if z is None:
            raise FormatError(f"{self.where}: data_file {name!r} cannot be read: "
                              f"{self.not_npz[name]}")
        return z


def _stored_array(data: DataFiles | None, spec: dict[str, Any], shape: list[int], dt: DType,
                  where: str) -> np.ndarray:
    """A constant's values in a data file: the .npz member ``key``, or the bytes at
    ``offset`` of a raw file; exactly the bytes its ``shape`` and ``dt`` need, in ``dt``
    (bfloat16 is stored as its uint16 bits)."""
    stored = np.dtype(np.uint16) if dt is DType.bfloat16 else dt.np
    nbytes = math.prod(shape) * stored.itemsize
    if data is None:
        what = "key" if spec.get("key") is not None else "offset"
        raise FormatError(f"{where}.{what}: {spec.get(what)!r} is not in the data file (the "
                          "graph names no data_file)")
    name = data.file(spec.get("file"), where)
    if spec.get("offset") is not None:
        offset = spec["offset"]
        if spec.get("key") is not None:
            raise FormatError(f"{where}: give 'key' (an .npz member) or 'offset' (bytes of a "
                              "data file), not both")
        mm = data.raw[name]
        size = 0 if mm is None else len(mm)
        if type(offset) is not int or offset < 0 or offset + nbytes > size:
            raise FormatError(f"{where}.offset: {offset!r} + the {nbytes:,} bytes its shape "
                              f"{shape} of {dt.value} needs is past the end of {name!r} "
                              f"({size:,} bytes)")
        if nbytes == 0:
            arr = np.zeros(shape, stored)
        else:
            arr = mapped_view(mm, offset, nbytes, stored, tuple(shape))
    else:
        key = spec["key"]
        z = data.archive(name)
        if not isinstance(key, str) or key not in z:
            raise FormatError(f"{where}.key: {key!r} is not in the data file"
                              + did_you_mean(str(key), z.names()))
        try:
            arr = z.read(key, nbytes, stored)
        except NpzError as e:
            raise FormatError(f"{where}.key: data file {z.path.name!r}: {e}") from None
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


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@functools.cache
def _attr_rule(op: str, key: str) -> tuple[TypeAdapter, bool, str, bool] | None:
    """How attribute ``key`` of ``op`` is checked: its strict adapter, whether a string is a
    symbolic dim in it, its type as a message names it, and whether a float is accepted
    where no string is (then ``"nan"``, ``"inf"`` and ``"-inf"``, as ``save_graph`` writes
    non-finite floats, are read back as those floats). None: not checked here."""
    field = ops.get(op).attrs.model_fields.get(key)
    if field is None:
        return None  # an unknown attribute: the op's own check names it
    annotation = field.annotation
    adapter = _strict_adapter(annotation)
    if adapter is None:
        return None
    leaves = _leaves(annotation)
    text = str(annotation).replace("typing.", "")
    text = getattr(annotation, "__name__", text) if "[" not in text else text
    return adapter, int in leaves and str in leaves, text, float in leaves and str not in leaves


def _nonfinite(value: Any) -> Any:
    """``value`` with the strings naming non-finite floats read as those floats."""
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    if isinstance(value, list):
        return [_nonfinite(v) for v in value]
    return value


def _check_attr_types(opdef: Any, attrs: dict[str, Any], where: str) -> None:
    """A file's attribute values have exactly their declared types; a string where an int or
    a symbol is accepted (a shape entry) is a symbolic dim and must be a valid one."""
    for key, value in attrs.items():
        rule = _attr_rule(opdef.name, key)
        if rule is None:
            continue
        adapter, dims, text, floats = rule
        if floats:
            value = attrs[key] = _nonfinite(value)
        try:
            adapter.validate_python(value)
        except ValidationError:
            raise FormatError(f"{where}.attrs.{key}: expected {text}, got {value!r}") from None
        if dims:
            for d in value if isinstance(value, list) else [value]:
                if isinstance(d, str) and (p := limits.dim_problem(d)) is not None:
                    raise FormatError(f"{where}.attrs.{key}: {p}")


def _dependency_order(nodes: list[dict[str, Any]], where: str, g: Graph
                      ) -> list[tuple[int, dict[str, Any]]]:
    """Nodes in dependency order (the file may list them in any order); cycles and
    dangling names are errors that name the nodes. A file listing each node after the nodes
    it reads (as ``save_graph`` writes them) is taken in its order, at one look per name."""
    known = set(g._values)
    for ns in nodes:
        if not known.issuperset(ns.get("inputs", ())):
            break
        for o in ns["outputs"]:
            name = o if type(o) is str else o["name"]
            if name in known:
                break
            known.add(name)
        else:
            continue
        break
    else:
        return list(enumerate(nodes))
    producer: dict[str, int] = {}
    for i, ns in enumerate(nodes):
        for o in ns["outputs"]:
            name = o if type(o) is str else o["name"]
            if name in producer or g.has_value(name):
                raise FormatError(f"{where}: nodes[{i}] ('{ns['name']}').outputs: value "
                                  f"{name!r} is defined twice")
            producer[name] = i
    known = set(g._values) | set(producer)
    deps: dict[int, set[int]] = {}
    for i, ns in enumerate(nodes):
        deps[i] = set()
        for j, name in enumerate(ns.get("inputs", ())):
            if name not in known:
                raise FormatError(f"{where}: nodes[{i}] ('{ns['name']}').inputs[{j}]: {name!r} "
                                  "is dangling: not a graph input, constant or node output"
                                  + did_you_mean(name, known))
            if name in producer:
                deps[i].add(producer[name])
    order, done, visiting = [], set(), []
    state: dict[int, int] = {}
    for root in range(len(nodes)):
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
                path = " -> ".join(nodes[k]["name"] for k in cyc)
                raise FormatError(f"{where}: nodes form a cycle: {path}; a node must not depend "
                                  "on its own output")
            elif state.get(nxt) != 2:
                state[nxt] = 1
                visiting.append(nxt)
                stack.append((nxt, iter(sorted(deps[nxt]))))
    return [(i, nodes[i]) for i in order]


# the graphs ``load_graph`` built, only by adding inputs and then each node after those it
# reads (``Graph.settle``'s ``built_in_order``), while anything else holds them
BUILT_IN_ORDER: weakref.WeakSet[Graph] = weakref.WeakSet()


def load_graph(path: str | os.PathLike) -> Graph:
    """Load a .json/.yaml/.yml graph file. Its constants in an .npz or raw data file are
    memory-mapped where they can be (see ``DataFiles``): read-only views of the file."""
    from graphkernel.pipeline import collector_paused

    path = Path(path)
    with collector_paused():  # (a document and a graph of many small objects, nothing to free)
        try:
            doc = read_document(path, limits.MAX_GRAPH_FILE_BYTES, walk=False)
        except FileNotFoundError:
            raise FormatError(f"{path}: no such file") from None
        except OSError as e:
            raise FormatError(f"{path}: cannot be read: {e.strerror or e}") from None
        except DocumentError as e:
            kind = ("invalid YAML" if path.suffix != ".json" else "invalid JSON") if e.syntax \
                else "refused"
            raise FormatError(f"{path}{e.pos}: {kind}: {e.detail}") from None
        g = graph_from_dict(doc, where=str(path), base=path.parent)
    BUILT_IN_ORDER.add(g)  # (``_build`` only adds: inputs, then nodes in dependency order)
    del doc
    release_freed_memory()  # (the document's text and strings, freed now)
    return g
