"""json_text.dumps writes what json.dumps writes with an indent, character for character."""

from __future__ import annotations

import enum
import json

import numpy as np
import pytest

from graphkernel import json_text


class Level(enum.IntEnum):
    HIGH = 3


class Name(str):
    pass


CASES = [
    {},
    [],
    "plain",
    {"a": [1, 2.5, -0.0, 1e300, float("nan"), float("inf"), -float("inf")], "b": {}, "c": []},
    {"nested": [{"x": [[], {}, [None, True, False]], "y": "é ünïcode \u2603 \"q\" \\ \n\t"}]},
    {7: "int key", 2.5: "float key", True: "t", False: "f", None: "n", "s": ("a", "tuple")},
    {"np": [np.int64(7), np.float32(0.1), np.float64(0.25), np.bool_(True)], "path": Name("n")},
    {"enum": Level.HIGH, "set": {1}},
    [[[[1]]], [{"deep": [{"deeper": {}}]}]],
    # lists of strings and integers only (written at once) beside lists that only look so
    {"shape": ["16*b", 64, -3, 10**30], "names": ["a", "é\n"], "lists": [[1, 2], ["x"], []],
     "mixed": [1, True, Name("n"), Level.HIGH, "s", np.int64(2)], "tuple": ("a", 1)},
]


@pytest.mark.parametrize("indent", [1, 2, 4])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_text_as_the_standard_library(case, indent):
    obj = CASES[case]
    assert json_text.dumps(obj, indent=indent, default=str) == \
        json.dumps(obj, indent=indent, default=str)


def test_without_default_an_unknown_object_is_refused_as_json_does():
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_text.dumps({"x": object()})
    with pytest.raises(TypeError, match="keys must be"):
        json_text.dumps({(1, 2): 1})


def test_pieces_joined_in_batches_give_the_same_text(monkeypatch):
    monkeypatch.setattr(json_text, "BATCH", 3)
    obj = {"rows": [{"k": i, "v": [i, {"w": str(i)}]} for i in range(50)], "end": []}
    assert json_text.dumps(obj, indent=2) == json.dumps(obj, indent=2)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_line_per_entry_is_the_same_document(case):
    """``dump_lines`` writes the document ``json.dumps`` writes (parsed, they are equal), a
    line per key of the top-level object and per element of the lists and objects below."""
    pieces: list[str] = []
    json_text.dump_lines(CASES[case], pieces.append, default=str)
    text = "".join(pieces)
    want = json.dumps(CASES[case], default=str)
    assert json.loads(text) == json.loads(want) or "NaN" in want
    if isinstance(CASES[case], dict) and CASES[case]:
        top = json.loads(want)
        assert text.count("\n") == len(top) + 1 + sum(
            len(v) + 1 for v in top.values() if isinstance(v, list | dict) and v)


def test_a_line_per_entry_in_batches(monkeypatch):
    doc = {"instances": [{"node": f"n{i}", "shape": [i, 2]} for i in range(10_000)],
           "digests": {f"f{i}": "0" * 64 for i in range(5000)}}
    pieces: list[str] = []
    json_text.dump_lines(doc, pieces.append)
    assert len(pieces) > 4 and max(map(len, pieces)) < 400_000
    assert json.loads("".join(pieces)) == doc
