"""Shared helpers: build a one-node graph, run it, and compare with an independent result."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from graphkernel import Graph, TensorType, pipeline, registry
from graphkernel.interpreter import Interpreter
from graphkernel.ir import DType


def single_op_graph(op: str, arrays, attrs=None, shapes=None) -> Graph:
    g = Graph(f"single_{op}")
    ins = []
    for i, a in enumerate(arrays):
        shape = shapes[i] if shapes is not None else a.shape
        ins.append(g.add_input(f"in{i}", TensorType(tuple(shape), DType.parse(a.dtype))))
    node = g.add_node(op, ins, attrs or {})
    g.set_outputs(node.outputs)
    g.validate()
    return g


def run_op(op: str, arrays, attrs=None, shapes=None, compute_dtype=None):
    """Run one op; also check the result's shape and dtype equal the inferred type."""
    g = single_op_graph(op, arrays, attrs, shapes)
    outs = Interpreter(g, compute_dtype).run({f"in{i}": a for i, a in enumerate(arrays)})
    if compute_dtype is None:
        for v, o in zip(g.outputs, outs, strict=True):
            assert o.dtype == v.type.dtype.np, (op, o.dtype, v.type)
            if v.type.is_static:
                assert o.shape == v.type.shape, (op, o.shape, v.type)
    return outs if len(outs) > 1 else outs[0]


TOL = {np.dtype(np.float16): (2e-3, 1e-3), np.dtype(np.float32): (1e-5, 1e-6),
       np.dtype(np.float64): (1e-12, 1e-12)}


def assert_close(actual, expected, dtype=None):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    dt = np.dtype(dtype) if dtype is not None else actual.dtype
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if dt.kind in "iub":
        np.testing.assert_array_equal(actual, expected)
        return
    if dt == DType.bfloat16.np:
        rtol, atol = 1e-2, 1e-2
    else:
        rtol, atol = TOL.get(dt, (1e-5, 1e-6))
    np.testing.assert_allclose(actual.astype(np.float64), np.asarray(expected, np.float64),
                               rtol=rtol, atol=atol, equal_nan=True)


# Every pass's output is validated in tests; a broken invariant names the pass.
registry.register_hook(pipeline.Validation())


@pytest.fixture(autouse=True)
def _no_flag_env(monkeypatch):
    """Tests see no AUTOFUSE_FLAGS/MS_DEV_GRAPH_KERNEL_FLAGS from the developer's shell, and
    run the torch backend strict."""
    for var in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "MS_DEV_GRAPH_KERNEL_FLAGS"):
        monkeypatch.delenv(var, raising=False)
    # the torch.compile backend raises its own failures in tests instead of running the graph
    # through torch (a test that checks the fallback passes options={"strict": False})
    monkeypatch.setenv("GRAPHKERNEL_TORCH_STRICT", "1")


@pytest.fixture
def fresh_torch():
    """Dynamo's caches and graphkernel.torch's statistics reset around a test, so it counts
    its own graphs only."""
    import torch

    import graphkernel.torch as gt

    torch._dynamo.reset()
    gt.reset_stats()
    yield
    torch._dynamo.reset()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def temp_pass():
    """Register a pass for one test only."""
    from graphkernel import registry
    from graphkernel.registry import register_pass

    added = []

    def add(name, **kw):
        def deco(fn):
            register_pass(name, **kw)(fn)
            added.append(name)
            return fn
        return deco

    yield add
    for name in added:
        registry.PASSES.pop(name, None)


def _shared_module_fixture(item) -> bool:
    """Whether ``item`` reads a module-scoped fixture (a simulator library, compiled models)
    that the tests of its module share."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope == "module" for name in info.names_closure
               for d in info.name2fixturedefs.get(name, ()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``sim`` and ``e2e`` tests are ``slow`` too, and ``sim`` tests need g++. Under
    pytest-xdist (``--dist loadgroup``), the tests of a module that share a module-scoped
    fixture form one group, run by one worker: the fixture is built once, not once per
    worker."""
    no_gpp = pytest.mark.skip(reason="needs g++ (the simulator compiles kernels with it)")
    have_gpp = shutil.which("g++") is not None
    for item in items:
        if item.get_closest_marker("sim") or item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("sim") and not have_gpp:
            item.add_marker(no_gpp)
        if _shared_module_fixture(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
