"""JSON text indented as ``json.dumps(obj, indent=..., default=...)`` writes it, faster.

With an indent, the standard library encodes in Python through nested generators (its C
encoder serves only unindented text): every piece of text passes up through one generator
per level of nesting. A kernel project's manifest at 100k nodes is ~2 million values, and
that encoder took most of the time of writing the project. ``dumps`` below writes the same
text, character for character, by one recursive walk appending to a list (the strings are
still escaped by the standard library's C function), joined in batches as it grows (the
standard library lists every piece before joining them: ~100 MB for that manifest).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

_INF = float("inf")
BATCH = 65536  # pieces joined at once (after an element of a list or a dict)


def _float(o: float) -> str:
    if o != o:
        return "NaN"
    if o == _INF:
        return "Infinity"
    if o == -_INF:
        return "-Infinity"
    return float.__repr__(o)


def _key(k: Any) -> str:
    """A dictionary key as the standard library spells it (before quoting)."""
    if isinstance(k, str):
        return k
    if isinstance(k, float):
        return _float(k)
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int):
        return int.__repr__(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def dumps(obj: Any, indent: int = 2, default: Callable[[Any], Any] | None = None) -> str:
    """``json.dumps(obj, indent=indent, default=default)`` (ASCII, NaN allowed, keys in
    their order); containers nested in themselves are not detected."""
    done: list[str] = []  # pieces joined in batches: a few strings, not millions of small ones
    dump(obj, done.append, indent, default)
    return "".join(done)


def dump(obj: Any, write: Callable[[str], Any], indent: int = 2,
         default: Callable[[Any], Any] | None = None) -> None:
    """The text of ``dumps``, handed to ``write`` in batches as it is made (a large document
    is written out without its whole text ever held)."""
    out: list[str] = []  # pieces not yet joined
    step = " " * indent

    def flush() -> None:
        write("".join(out))
        out.clear()

    def container(open_: str, close: str, items, nl: str, keyed: bool) -> None:
        """A list's elements or (``keyed``) a dict's items, one per indented line."""
        inner = nl + step
        sep = "," + inner
        first = True
        for x in items:
            out.append((open_ + inner) if first else sep)
            first = False
            if keyed:
                out.append(_quote(_key(x[0])) + ": ")
                x = x[1]
            value(x, inner)
            if len(out) >= BATCH:
                flush()
        out.append(open_ + close if first else nl + close)

    def value(o: Any, nl: str) -> None:
        if isinstance(o, str):
            out.append(_quote(o))
        elif o is None:
            out.append("null")
        elif o is True:
            out.append("true")
        elif o is False:
            out.append("false")
        elif isinstance(o, int):
            out.append(int.__repr__(o))
        elif isinstance(o, float):
            out.append(_float(o))
        elif isinstance(o, (list, tuple)):
            container("[", "]", o, nl, False)
        elif isinstance(o, dict):
            container("{", "}", o.items(), nl, True)
        elif default is not None:
            value(default(o), nl)
        else:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    value(obj, "\n")
    flush()


def dump_lines(obj: Any, write: Callable[[str], Any],
               default: Callable[[Any], Any] | None = None) -> None:
    """``obj`` as JSON for a large document read by programs and, now and then, by people: a
    top-level object one key per line, a list or object under it one element per line, each
    element on its line as the standard library's C encoder writes it (``", "`` and
    ``": "`` between items; ASCII, NaN allowed, ``default`` for other objects). Written to
    ``write`` in batches: ten times faster than an indented dump, and about half its size."""
    enc = json.JSONEncoder(separators=(", ", ": "), default=default).encode
    if type(obj) is not dict or not obj:
        write(enc(obj))
        return
    first = True
    for k, v in obj.items():
        write(("{\n  " if first else ",\n  ") + _quote(_key(k)) + ": ")
        first = False
        if type(v) is dict and v:
            items = [_quote(_key(a)) + ": " + enc(b) for a, b in v.items()]
        elif type(v) in (list, tuple) and v:
            items = [enc(x) for x in v]
        else:
            write(enc(v))
            continue
        write(("{" if type(v) is dict else "[") + "\n    ")
        for i in range(0, len(items), 4096):
            write((",\n    " if i else "") + ",\n    ".join(items[i:i + 4096]))
        write("\n  " + ("}" if type(v) is dict else "]"))
    write("\n}")
