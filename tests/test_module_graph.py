"""The module graph has no cycles: every import, at module level or inside a function, points
down the layers (tensor types -> op registry -> op definitions -> IR -> passes -> entry
points), so a module can be read and tested without the ones above it."""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, Path]:
    """graphkernel's packages and where they live in the source tree (pyproject's map)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: ROOT / name.replace(".", "/") for name in cfg["packages"]}
    dirs |= {name: ROOT / d for name, d in cfg.get("package-dir", {}).items()}
    return dirs


def modules() -> dict[str, Path]:
    found = {}
    for pkg, d in package_dirs().items():
        for f in d.glob("*.py"):
            found[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (they never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def import_graph() -> nx.DiGraph:
    """Each graphkernel module -> the modules it imports (anywhere in it); a copy of the one
    scan of the sources a test run makes."""
    return _scanned_import_graph().copy()


# the tests reading the scan run on one pytest-xdist worker, which scans once
SCAN = pytest.mark.xdist_group("module_graph_scan")


@functools.cache
def _scanned_import_graph() -> nx.DiGraph:
    mods = modules()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        package = mod if path.stem == "__init__" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{up}.{base}" if base else up
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = owner(name)
                # the package __init__ runs before any of its modules: importing a module
                # from it is the package's own business, not an edge back
                if target and target != mod and not (mod == "graphkernel" and
                                                     target.startswith("graphkernel.")):
                    g.add_edge(mod, target)
    return g


@SCAN
def test_the_scan_sees_the_modules_and_their_imports():
    g = import_graph()
    assert len(g) > 80 and g.has_edge("graphkernel.ir", "graphkernel.ops")
    assert g.has_edge("graphkernel.passes.split", "graphkernel.kernels")


@SCAN
def test_no_import_cycles():
    g = import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_bisect_and_verify_are_modules():
    import types

    import graphkernel

    assert isinstance(graphkernel.bisect, types.ModuleType)
    assert isinstance(graphkernel.verify, types.ModuleType)
    assert callable(graphkernel.bisect.bisect) and callable(graphkernel.bisect.verify)


def test_architecture_doc_names_files_that_exist():
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"\b((?:graphkernel|passes|codegen|expanders|patterns)"
                           r"/[\w/]*\.(?:py|h|yaml))", text))
    assert len(named) > 20, named
    missing = sorted(f for f in named if not (ROOT / f).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


LAYERS_ABOVE_CORE = ("graphkernel.codegen", "graphkernel.passes", "graphkernel.patterns")


def _module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, dotted name) of each import the module runs when it is imported: its top-level
    statements, into ``if``/``try`` blocks but not functions, classes or TYPE_CHECKING."""
    out = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def test_the_core_imports_no_backend_or_rules_at_module_level():
    """The core — graphkernel/ but its frontends, and but the package's __init__, which
    imports everything to register it — imports none of codegen/, passes/ or patterns/ when
    it is imported: what it needs of them (the target, the passes' records) it is handed,
    or asks for inside the function that needs it."""
    home = ROOT / "graphkernel"
    core = {m: p for m, p in modules().items() if p.parent in (home, home / "opdefs")
            and p != home / "__init__.py"}
    assert "graphkernel.flags" in core and "graphkernel.pipeline" in core
    bad = [f"{m}:{line} imports {name}" for m, p in sorted(core.items())
           for line, name in _module_level_imports(ast.parse(p.read_text()))
           if name.startswith(LAYERS_ABOVE_CORE)]
    assert not bad, "the core imports layers above it at module level: " + "; ".join(bad)


def test_the_layering_scan_sees_module_level_imports():
    tree = ast.parse("from graphkernel.codegen.targets import load\n"
                     "def f():\n    from graphkernel.passes import x\n"
                     "try:\n    import graphkernel.patterns.base\nexcept ImportError:\n    pass\n")
    assert [n for _, n in _module_level_imports(tree)] == [
        "graphkernel.codegen.targets.load", "graphkernel.patterns.base"]
