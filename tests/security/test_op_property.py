"""Property tests over the op table: for every registered op, graph files with random input
arities, ranks (0-d included), dtypes and attribute values drawn from the op's own
attribute schema go through every command that reads a model; each answers with exit 0
or one error line with exit 2 - never a traceback, never "a bug in graphkernel" (exit 3),
never a verify mismatch (exit 1)."""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphkernel import Graph, TensorType, ops
from graphkernel.cli import build_parser
from graphkernel.errors import GraphKernelError
from graphkernel.ir import DType

COMMANDS = [["info"], ["run"], ["compile", "-o", "{out}"], ["verify"], ["explain"], ["expand"],
            ["bisect"]]
DTYPES = [d.value for d in DType]
# ops whose attributes hold graphs, tensors or executors: built by code, covered elsewhere
SKIP = {"GraphKernel", "Opaque", "Constant"}
SETTINGS = settings(max_examples=6, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

INTS = st.sampled_from([0, 1, -1, 2, 3, -2, 4]) | st.integers(-2**40, 2**40)
FLOATS = st.sampled_from([0.0, 1.0, -1.5, 0.5]) | st.floats(allow_nan=True,
                                                             allow_infinity=True)


def values(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of an attribute's declared type, and a few of other types (refused cleanly)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return INTS
    if annotation is float:
        return FLOATS
    if annotation is str:
        return st.sampled_from(["", "none", "x"]) | st.text(max_size=6)
    if annotation is type(None):
        return st.none()
    if origin is typing.Literal:
        return st.sampled_from(list(args)) | st.text(max_size=4)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([values(a) for a in args])
    if origin is list:
        return st.lists(values(args[0]), max_size=4)
    if isinstance(annotation, type) and issubclass(annotation, DType):
        return st.sampled_from(DTYPES)
    return st.none()  # a tensor, a subgraph: not something a random file gives well


SHAPES = st.lists(st.sampled_from([1, 2, 3, 4, 0]), max_size=3)


@st.composite
def one_op_graph(draw: Any, op: ops.OpDef) -> dict[str, Any]:
    """Half the graphs are plausible (the op's arity, one shape and float dtype for every
    input, few attributes, small values) so that they reach the passes; the others are
    random in every part."""
    lo, hi = op.arity
    top = hi if hi is not None else lo + 2
    plausible = draw(st.booleans())
    n = draw(st.integers(lo, min(top, lo + 2)) if plausible else st.integers(max(0, lo - 1),
                                                                             top + 1))
    shape = draw(SHAPES)
    dtype = draw(st.sampled_from(["float32", "float16", "float32", "int32", "bool"] if plausible
                                 else DTYPES))
    inputs = []
    for i in range(n):
        same = plausible or draw(st.booleans()) or draw(st.booleans())
        inputs.append({"name": f"x{i}", "shape": shape if same else draw(SHAPES),
                       "dtype": dtype if same else draw(st.sampled_from(DTYPES))})
    attrs = {}
    for key, field in op.attrs.model_fields.items():
        if field.is_required() or draw(st.booleans()) and (not plausible or draw(st.booleans())):
            small = plausible and field.annotation in (int, list[int])
            attrs[key] = draw(st.sampled_from([0, 1, -1]) if field.annotation is int and small
                              else st.lists(st.sampled_from([0, 1, -1]), max_size=2) if small
                              else values(field.annotation))
    outputs = [f"y{j}" for j in range(_outputs(op, inputs, attrs) or draw(st.integers(1, 3)))]
    return {"format": "graphkernel/1", "name": "g",
            "inputs": inputs or [{"name": "unused", "shape": [2], "dtype": "float32"}],
            "nodes": [{"name": "n", "op": op.name, "inputs": [x["name"] for x in inputs],
                       "outputs": outputs, "attrs": attrs}], "outputs": outputs}


def _outputs(op: ops.OpDef, inputs: list[dict], attrs: dict) -> int:
    """How many outputs the op gives these inputs (0 when it refuses them), so that most
    graphs get past loading and reach the passes."""
    g = Graph("probe")
    try:
        ins = [g.add_input(x["name"], TensorType(tuple(x["shape"]), DType.parse(x["dtype"])))
               for x in inputs]
        return len(g.add_node(op.name, ins, attrs).outputs)
    except GraphKernelError:
        return 0


def _ops() -> list[str]:
    return [o.name for o in ops.all_ops() if o.name not in SKIP]


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()  # the real one (the name in graphkernel.cli is patched below)


@pytest.fixture(autouse=True)
def _one_parser(monkeypatch):
    """The commands' argument parser built once per process for this module's ~3,000
    in-process commands instead of once per command (argparse and the installed version's
    lookup, ~12 ms each); ``main`` parses each command line with it as with a fresh one
    (argparse keeps no state between parses, and the parser depends on nothing a graph file
    changes). Function-scoped, so the tests stay spread over the workers."""
    from graphkernel import cli

    monkeypatch.setattr(cli, "build_parser", _parser)


@pytest.mark.slow
@pytest.mark.parametrize("op_name", _ops())
def test_every_op_with_random_arities_and_attributes_through_every_command(cli, op_name):
    op = ops.get(op_name)

    @SETTINGS
    @given(one_op_graph(op))
    def check(doc: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.json"
            path.write_text(json.dumps(doc))
            for command in COMMANDS:
                argv = [a.replace("{out}", str(Path(d) / "out")) for a in command]
                rc, _, err = cli(argv[0], path, "-q", *argv[1:])
                lines = [ln for ln in err.splitlines() if ln.startswith("graphkernel: error:")]
                assert rc == 0 or (rc == 2 and len(lines) == 1), (command, rc, err[-1500:],
                                                                  json.dumps(doc)[:600])
                if rc == 2 and command == ["info"]:
                    return  # the model is refused: every other command refuses it alike

    check()
