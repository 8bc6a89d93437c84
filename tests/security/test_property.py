"""Property tests: whatever bytes or names a model file holds, the JSON loader raises only
graphkernel's own errors, and the CLI answers with exit 0 or 2, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphkernel.errors import GraphKernelError
from graphkernel.frontends.json_format import load_graph
from tests.security.conftest import graph_doc, snapshot

FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

# any JSON value, nested a little
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
FIELDS = ["name", "inputs", "nodes", "outputs", "format", "data_file"]
# random bytes, and the shapes of hostile files random bytes rarely hit: deep nesting, a
# hostile prefix on random text
NESTED = st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n) | st.integers(
    1, 50_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n)
BYTES = st.binary(max_size=300) | NESTED
HOSTILE = st.sampled_from(["../", "/", "..", "\x00", "\x1b[2J", "\u202e", "../../"])
NAMES = st.text(min_size=1, max_size=40) | st.builds(str.__add__, HOSTILE,
                                                     st.text(min_size=0, max_size=20))


def _load(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.json"
        path.write_bytes(data)
        try:
            load_graph(path)
        except GraphKernelError:
            pass


@FAST
@given(BYTES)
def test_random_bytes_load_or_give_a_graphkernel_error(data):
    _load(data)


@FAST
@given(st.sampled_from(FIELDS), JSON)
def test_any_value_in_any_field_loads_or_gives_a_graphkernel_error(field, value):
    _load(json.dumps(graph_doc() | {field: value}).encode())


@FAST
@given(st.sampled_from([("nodes", "name"), ("nodes", "attrs"), ("nodes", "op"),
                        ("nodes", "inputs"), ("inputs", "shape"), ("inputs", "dtype")]), JSON)
def test_any_value_in_a_node_or_type_loads_or_gives_a_graphkernel_error(where, value):
    doc = graph_doc()
    doc[where[0]][0][where[1]] = value
    _load(json.dumps(doc).encode())


@FAST
@given(BYTES | st.text(max_size=200).map(str.encode))
def test_the_cli_answers_random_bytes_without_a_traceback(cli, tmp_path, data):
    path = tmp_path / "m.json"
    path.write_bytes(data)
    rc, _, err = cli("info", path)
    assert rc in (0, 2) and "\x1b" not in err


@FAST
@given(NAMES, NAMES, NAMES)
def test_the_cli_compiles_any_names_inside_the_output_folder(cli, tmp_path, graph, node, value):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        work = Path(d)
        doc = graph_doc(name=graph, inputs=[{"name": value, "shape": [4], "dtype": "float32"}],
                        nodes=[{"name": node, "op": "Exp", "inputs": [value],
                                "outputs": [value + "_y"]}], outputs=[value + "_y"])
        (work / "m.json").write_text(json.dumps(doc))
        before = snapshot(work)
        rc, _, err = cli("compile", work / "m.json", "-o", work / "out", "-q")
        assert rc in (0, 2) and "\x1b" not in err, err
        assert all(p.startswith("out") for p in snapshot(work) - before)
        if rc == 0:
            assert (work / "out" / "manifest.json").is_file()
