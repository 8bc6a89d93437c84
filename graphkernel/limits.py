"""The documented bounds on what a model or flags file may hold, and their checks.

A model file and a flags file come from other people: they are data, read within these
limits, and every breach is one clear error (exit status 2) that names the item and the
limit. docs/security.md lists them for users; this module is the single place they live.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from graphkernel.errors import shown

# Files
MAX_GRAPH_FILE_BYTES = 256 * 2**20  # a .json/.yaml graph (large constants live in its .npz)
MAX_ONNX_FILE_BYTES = 2**31  # an .onnx file (protobuf's own limit; large weights go outside)
MAX_MANIFEST_BYTES = 256 * 2**20  # an output folder's manifest.json, read to clean it
MAX_FLAGS_FILE_BYTES = 2**20  # a JSON/YAML flags file, an AutoFuse skip list
MAX_DEPTH = 64  # nesting of lists/objects in a JSON/YAML document
MAX_YAML_ALIASES = 1000  # `*alias` references in one YAML document
MAX_YAML_VALUES = 1_000_000  # values in a YAML document that uses aliases, aliases expanded
MAX_YAML_EXPANDED_CHARS = 16 * 2**20  # text of those values (and keys), aliases expanded
MAX_NPZ_DIRECTORY_BYTES = 64 * 2**20  # the member directory of a .npz (read whole on opening)

# Tensors
MAX_DIM = 2**31 - 1  # a static dim (Ascend tiling arithmetic is 32-bit)
MAX_NUMEL = 2**40  # elements of one statically shaped tensor
MAX_RANK = 32  # dims of one tensor (numpy 1.x holds at most 32)
MAX_DIM_FACTORS = 16  # factors of one symbolic dim ("4*s0*s1" has 3)

# Flags
MAX_FLAG_STRING = 64 * 2**10  # one flag string (--flags, AUTOFUSE_FLAGS, ...)
MAX_FLAG_VALUE = 4096  # one flag's value
MAX_INT_DIGITS = 18  # an integer flag value, a --dims size

SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIGITS = re.compile(r"[0-9]+")
# Unicode categories a name may not contain: controls (terminal escapes, NUL), format
# characters (bidirectional overrides, zero-width joiners), surrogates, line separators.
_BAD_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a graph, node, value or kernel, or None when it can."""
    if not isinstance(name, str):
        return f"a name must be a string, got {type(name).__name__}"
    if not name:
        return "a name must not be empty"
    if name.isprintable():  # (no control, format, surrogate or separator character but ' ')
        return None
    for ch in name:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            return (f"name {name!r} contains the control character U+{ord(ch):04X}; names "
                    "may hold any printable characters")
    return None


def dim_problem(dim: Any) -> str | None:
    """Why ``dim`` is not a valid dim of a file's tensor type, or None when it is.

    A dim is an int in 0..MAX_DIM, or a symbolic dim: a symbol ``[A-Za-z_][A-Za-z0-9_]*``
    or a product of an integer and symbols (``"4*s0"``)."""
    if isinstance(dim, bool) or not isinstance(dim, int | str):
        return f"dim {dim!r} must be an int or a symbol such as 'batch'"
    if isinstance(dim, int):
        if not 0 <= dim <= MAX_DIM:
            return f"dim {dim} is outside 0..{MAX_DIM}"
        return None
    return _symbol_problem(dim)


@functools.lru_cache(maxsize=4096)
def _symbol_problem(dim: str) -> str | None:
    """``dim_problem`` of a symbolic dim (a model repeats a few: checked once each)."""
    parts = dim.replace(" ", "").split("*")
    if len(parts) > MAX_DIM_FACTORS:
        return (f"dim {shown(dim)!r} is a product of {len(parts):,} factors, above the limit of "
                f"{MAX_DIM_FACTORS}")
    for part in parts:
        if _DIGITS.fullmatch(part):
            if len(part) > MAX_INT_DIGITS or int(part) > MAX_DIM:
                return f"dim {dim!r}: factor {part} is above {MAX_DIM}"
        elif not SYMBOL.fullmatch(part):
            return (f"dim {dim!r} is not a symbol ([A-Za-z_][A-Za-z0-9_]*, such as 'batch') "
                    "or a product of an integer and symbols ('4*s0')")
    return None


def numel_problem(shape: tuple[Any, ...]) -> str | None:
    """Why a static shape holds too many elements, or None."""
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        n *= d
    if n > MAX_NUMEL:
        return f"shape {list(shape)} holds {n:,} elements, above the limit of {MAX_NUMEL:,}"
    return None


def check_graph(graph: Any) -> str | None:
    """The first problem with a loaded graph's names and types (subgraphs included):
    a name with control characters, a dim out of bounds, a tensor too large."""
    if (p := name_problem(graph.name)) is not None:
        return f"graph name: {p}"
    for v in graph.inputs:
        if (p := _value_problem(v)) is not None:
            return f"input {v.name!r}: {p}"
    for n in graph.nodes:
        if (p := name_problem(n.name)) is not None:
            return f"node name: {p}"
        for o in n.origin:
            if (p := name_problem(o)) is not None:
                return f"node {n.name!r}: origin: {p}"
        for v in n.outputs:
            if (p := _value_problem(v)) is not None:
                return f"node {n.name!r}: output {v.name!r}: {p}"
        sub = n.attrs.get("subgraph") if n.op == "GraphKernel" else None
        if sub is not None and (p := check_graph(sub)) is not None:
            return f"node {n.name!r}: subgraph: {p}"
    return None


def _value_problem(v: Any) -> str | None:
    if (p := name_problem(v.name)) is not None:
        return p
    return _type_problem(v.type)


@functools.lru_cache(maxsize=4096)
def _type_problem(t: Any) -> str | None:
    """A tensor type's rank, dims and size against the limits (a graph repeats a few types:
    each is checked once)."""
    if t.rank > MAX_RANK:
        return f"rank {t.rank:,} is above the limit of {MAX_RANK} dims"
    for d in t.shape:
        if (p := dim_problem(d)) is not None:
            return p
    return numel_problem(t.shape)


def check_document(doc: Any, max_depth: int = MAX_DEPTH, max_values: int | None = None,
                   max_chars: int | None = None) -> str | None:
    """Walk a parsed JSON/YAML document without recursion: too deep, or (with ``max_values``
    and ``max_chars``) too many values, or too much text in them, once YAML aliases are
    expanded (an alias repeats its target: a short file can name a long string a million
    times)."""
    stack = [(doc, 1)]
    count = chars = 0
    while stack:
        obj, depth = stack.pop()
        count += 1
        if max_values is not None and count > max_values:
            return (f"the document expands to more than {max_values:,} values (YAML aliases "
                    "repeat their target; an alias bomb is refused)")
        if max_chars is not None:
            chars += len(obj) if isinstance(obj, str) else 1
            if isinstance(obj, dict):
                chars += sum(len(k) if isinstance(k, str) else 1 for k in obj)
            if chars > max_chars:
                return (f"the document expands to more than {max_chars:,} characters of text "
                        "(YAML aliases repeat their target; an alias bomb is refused)")
        if isinstance(obj, dict):
            children: Any = obj.values()
        elif isinstance(obj, list):
            children = obj
        else:
            continue
        if depth > max_depth:
            return f"lists and objects are nested more than {max_depth} deep"
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list)
                     or max_values is not None)
    return None
