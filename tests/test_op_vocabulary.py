"""Every op name the code compares a node's op with is a registered op: a misspelt name in
``node.op == "Reshap"`` would silently never match, so the comparisons are read from the
source (an AST scan) and each name is looked up in the op registry. The op sets with a
meaning of their own (views, cube ops, products) are traits on the op definitions."""

from __future__ import annotations

import ast
import functools

import pytest

from graphkernel import ops
from tests.test_module_graph import modules

# torch.fx's own node kinds, compared with ``node.op`` where FX graphs are read (a frontend's
# local ``op`` is its source format's op type, not ours: only ``x.op`` counts there)
FX_NODE_OPS = frozenset({"placeholder", "get_attr", "call_function", "call_method",
                         "call_module", "output"})
FX_MODULES = frozenset({"graphkernel.frontends.fx", "graphkernel.frontends.torch_backend",
                        "graphkernel.frontends.complex_lowering",
                        "graphkernel.frontends.expert_segments", "graphkernel.torch"})


def _strings(node: ast.AST, consts: dict[str, ast.AST]) -> list[str] | None:
    """The string constants ``node`` stands for: a literal, a set/tuple/list of them, a
    ``frozenset({...})``, a module constant holding one of those; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        out = []
        for e in node.elts:
            got = _strings(e.value if isinstance(e, ast.Starred) else e, consts)
            if got is None:
                return None
            out += got
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in ("frozenset", "set", "tuple") and len(node.args) == 1:
        return _strings(node.args[0], consts)
    if isinstance(node, ast.Name) and node.id in consts:
        return _strings(consts[node.id], consts)
    return None


def compared_ops(source: str, locals_too: bool = True) -> list[tuple[int, str]]:
    """(line, name) of every string a node's op (``x.op``; with ``locals_too`` a local named
    ``op`` as well) is compared with in ``source``."""

    def _is_op(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "op") or (
            locals_too and isinstance(node, ast.Name) and node.id == "op")

    tree = ast.parse(source)
    consts = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            a, b = sides[i], sides[i + 1]
            if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                continue
            other = b if _is_op(a) else a if _is_op(b) and isinstance(op, (ast.Eq, ast.NotEq)) \
                else None
            names = _strings(other, consts) if other is not None else None
            found += [(node.lineno, s) for s in names or ()]
    return found


def _scan() -> list[tuple[str, int, str]]:
    """(module, line, name) of every op comparison in graphkernel's sources (scanned once a
    test run)."""
    return list(_scanned())


# the tests reading the scan run on one pytest-xdist worker, which scans once
SCAN = pytest.mark.xdist_group("op_vocabulary_scan")


@functools.cache
def _scanned() -> tuple[tuple[str, int, str], ...]:
    out = []
    for mod, path in sorted(modules().items()):
        frontend = mod.startswith("graphkernel.frontends")
        for line, name in compared_ops(path.read_text(), locals_too=not frontend):
            if mod in FX_MODULES and name in FX_NODE_OPS:
                continue
            out.append((mod, line, name))
    return tuple(out)


@SCAN
def test_the_scan_finds_the_comparisons():
    found = _scan()
    assert len(found) > 150
    assert ("graphkernel.kernels", "GraphKernel") in {(m, n) for m, _, n in found}


@SCAN
def test_every_compared_op_name_is_a_registered_op():
    bad = [f"{mod}:{line}: {name!r}" for mod, line, name in _scan()
           if not ops.exists(name) or ops.canonical(name) != name]
    assert not bad, "op names that are no registered op's canonical name: " + ", ".join(bad)


@pytest.mark.parametrize("code", [
    'if n.op == "Reshap": pass',
    'x = [m for m in g if m.op in ("Add", "Mull")]',
    'SET = frozenset({"Exp", "Expp"})\nok = node.op not in SET',
    'if "Lg" == v.producer.op: pass',
])
def test_a_misspelt_op_name_is_found(code):
    names = [name for _, name in compared_ops(code)]
    assert any(not ops.exists(n) for n in names), names


def test_traits_are_on_the_op_definitions():
    assert set(ops.VIEW_OPS) == {"Reshape", "ExpandDims", "Squeeze", "Identity"}
    assert set(ops.RESHAPE_OPS) == {"Reshape", "ExpandDims", "Squeeze"}
    assert set(ops.CUBE_OPS) == {"MatMul", "BatchMatMul", "Conv2D"}
    assert set(ops.PRODUCT_OPS) == {"MatMul", "BatchMatMul"}
    assert ops.get("Conv2D").unit == ops.CUBE and ops.get("Exp").unit == ops.VECTOR


def test_an_op_set_follows_registrations():
    before = len(ops.VIEW_OPS)
    name = "TestOnlyViewOp"
    opdef = ops.OpDef(name, ops.OpKind.RESHAPE, (1, 1), lambda ts, a: list(ts),
                      lambda xs, a, c: xs[0], view=True)
    ops.register(opdef)
    try:
        assert name in ops.VIEW_OPS and len(ops.VIEW_OPS) == before + 1
        assert name in ops.RESHAPE_OPS and name not in ops.CUBE_OPS
    finally:
        ops._unregister(name)
    assert name not in ops.VIEW_OPS
    with pytest.raises(TypeError):
        ops.VIEW_OPS.add("Exp")  # an op joins by its definition only
