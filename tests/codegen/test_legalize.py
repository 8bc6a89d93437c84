"""Legalisation (codegen/legalize.py): the generator's refusals carry what callers act on as
data, and the codegen pass only orchestrates."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFUSALS = ("Unsupported", "NeedsPhases", "cls")


def _refusals_naming_without_about(source: str) -> list[int]:
    """Lines of refusals whose message spells a ``.name`` but whose ``about`` is missing."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in REFUSALS and node.args
                and isinstance(node.args[0], ast.JoinedStr)):
            continue
        names = any(isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Attribute)
                    and v.value.attr == "name" for v in node.args[0].values)
        if names and not any(k.arg == "about" for k in node.keywords):
            bad.append(node.lineno)
    return bad


def test_every_refusal_naming_something_of_the_kernel_says_so():
    """A refusal is carried over to kernels of equal body only when it names none of the
    kernel's nodes or values, which the refusal states (``about``), not its text."""
    files = sorted((ROOT / "codegen").rglob("*.py"))
    assert len(files) > 20
    bad = [f"{f.relative_to(ROOT)}:{line}" for f in files
           for line in _refusals_naming_without_about(f.read_text())]
    assert not bad, f"refusals naming a node or value without about=: {bad}"


def test_the_scan_sees_a_refusal_without_about():
    assert _refusals_naming_without_about(
        'raise Unsupported(f"output {v.name} is odd", node=n)') == [1]
    assert _refusals_naming_without_about(
        'raise Unsupported(f"output {v.name} is odd", node=n, about=(v,))') == []


def test_the_pass_keeps_no_generator_logic():
    """What the generator accepts, the split limits and the refusal carry-over live in the
    code generator; the pass reads them from there."""
    src = (ROOT / "passes" / "codegen.py").read_text()
    tree = ast.parse(src)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert not defined & {"check", "check_once", "_refusal", "_split_around", "_cube_groups"}
    assert "depth[id(k)] < 3" not in src and "legalize.MAX_SPLIT_DEPTH" in src
