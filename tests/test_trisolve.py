"""Forward substitution as one op and one kernel: the row loop of the chunked delta rule
traced row by row (passes/trisolve.py) and ``linalg.solve_triangular`` (the torch frontend)
become one TriSolve (opdefs/trisolve.py), generated as a forward-substitution kernel
(codegen/trisolve.py) and checked in the simulator against float64 solves."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.api import load_config
from graphkernel.codegen import targets
from graphkernel.codegen.backend import render_all, run_sim, schedules
from graphkernel.codegen.sim.execute import SimLibrary
from graphkernel.codegen.trisolve import TriSolveSchedule
from graphkernel.interpreter import run_graph
from graphkernel.pipeline import BisectCounter, PassContext
from graphkernel.registry import PASSES

B = (2, 3)


def _op(g: Graph, op: str, *xs, **attrs):
    return g.add_node(op, list(xs), attrs).output


def _loop(n: int, form: str = "slices", first: int = 1, last: int | None = None,
          leak: int | None = None) -> Graph:
    """The row loop ``A[..., i, :i] += A[..., i, :i] @ A[..., :i, :i]`` for i = first ..
    last - 1 (default 1 .. n - 1), as the torch frontend imports Dynamo's trace of it: the
    row and the block read by slices (``slices``) or by Gathers of constant indices
    (``index``: an ``index_put``), the row written back by a Concat with its tail
    (``slices``) or a ScatterElements (``index``), then a Select of that row over the
    matrix. ``leak``: the matrix after step ``leak`` is a graph output too."""
    g = Graph(f"loop_{form}_{n}")
    a = g.add_input("a", TensorType((*B, n, n), "float32"))
    mask = np.triu(np.ones((n, n), bool))  # strictly lower A, as the references mask it
    M = _op(g, "Select", g.const(mask), g.const(np.float32(0)), a)
    outs = []
    for i in range(first, n if last is None else last):
        sq = _op(g, "Squeeze", _op(g, "StridedSlice", M, begin=[i], end=[i + 1], strides=[1],
                                   axes=[2]), axis=[2])
        if form == "slices":
            row = _op(g, "StridedSlice", sq, begin=[0], end=[i], strides=[1], axes=[2])
            sub = _op(g, "StridedSlice", M, begin=[0, 0], end=[i, i], strides=[1, 1],
                      axes=[2, 3])
        else:
            idx = g.const(np.arange(i, dtype=np.int64))
            row = _op(g, "Gather", sq, idx, axis=2)
            sub = _op(g, "Gather", _op(g, "Gather", M, idx, axis=2), idx, axis=3)
        row = _op(g, "Identity", row)  # (the clone)
        s = _op(g, "ReduceSum", _op(g, "Mul", _op(g, "ExpandDims", row, axis=[3]), sub),
                axis=[2], keep_dims=False)
        new = _op(g, "Add", row, s)
        if form == "slices":
            tail = _op(g, "StridedSlice", sq, begin=[i], end=[n], strides=[1], axes=[2])
            full = _op(g, "Concat", new, tail, axis=2)
        else:
            at = np.broadcast_to(np.arange(i, dtype=np.int64), (*B, i)).copy()
            full = _op(g, "ScatterElements", sq, g.const(at), new, axis=2)
        wide = _op(g, "BroadcastTo", _op(g, "ExpandDims", full, axis=[2]), shape=[*B, n, n])
        M = _op(g, "Select", g.const((np.arange(n) == i).reshape(1, 1, n, 1)), wide, M)
        if leak == i:
            outs.append(M)
    g.set_outputs([_op(g, "Add", M, g.const(np.eye(n, dtype=np.float32))), *outs])
    return g


def _run_pass(g: Graph) -> tuple[Graph, list[str]]:
    """The trisolve pass once on a copy: the graph and its notes."""
    g = g.copy()
    cfg = load_config("", env={})
    ctx = PassContext(cfg, BisectCounter(cfg.bisect_limit), lambda m: None,
                      targets.load(cfg.target))
    ctx.current_pass = "trisolve"
    res = PASSES["trisolve"].fn(g, ctx)
    g.validate()
    return g, res.notes


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes if n.op != "Constant"]


def _feeds(g: Graph, seed: int = 0, scale: float = 0.3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: (rng.standard_normal(tuple(v.shape)) * scale).astype(np.float32)
            for v in g.inputs}


@pytest.mark.parametrize("form", ["slices", "index"])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_the_row_loop_in_either_traced_form_is_one_trisolve(form, n):
    g = _loop(n, form)
    h, notes = _run_pass(g)
    assert _ops(h) == ["Select", "TriSolve", "Add"], _ops(h)
    assert f"({n - 1} rows" in notes[0]
    feeds = _feeds(g)
    want, got = run_graph(g, feeds), run_graph(h, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_loop_stopping_a_row_early_or_starting_late_is_left_with_the_reason():
    h, notes = _run_pass(_loop(6, last=5))
    assert "TriSolve" not in _ops(h) and "row 5 of 6" in notes[0], notes
    h, notes = _run_pass(_loop(6, first=2))
    assert "TriSolve" not in _ops(h) and not notes  # (no first row: nothing to start from)


def test_a_step_read_outside_the_loop_is_left_with_the_reason():
    h, notes = _run_pass(_loop(6, leak=3))
    assert "TriSolve" not in _ops(h)
    assert "graph output" in notes[0], notes


def test_a_product_other_than_the_rows_before_is_not_a_step():
    """Step 3 reads rows 1..3 instead of 0..2: the movement check refuses it (exact)."""
    g = _loop(5)
    sub = next(n for n in g.nodes if n.op == "StridedSlice" and n.attrs["end"] == [3, 3])
    sub.attrs["begin"], sub.attrs["end"] = [1, 0], [4, 3]
    h, notes = _run_pass(g)
    assert "TriSolve" not in _ops(h) and "row 3 of 5" in notes[0], notes


def test_the_compiled_loop_is_one_kernel():
    g = _loop(8)
    res = graphkernel.compile(g, "", env={})
    kernels = [n for n in res.graph.nodes if n.op == "GraphKernel"]
    assert [k.attrs["pattern"] for k in kernels].count("trisolve") == 1
    assert len(kernels) <= 3, [k.attrs["pattern"] for k in kernels]
    feeds = _feeds(g)
    np.testing.assert_allclose(run_graph(res.graph, feeds)[0], run_graph(g, feeds)[0],
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------- the torch frontend
@pytest.fixture(scope="module")
def compiled():
    """Three functions through torch.compile (graphkernel backend): the loop as the chunked
    delta rule writes it, and solve_triangular with the forward flags and with upper=True."""
    torch = pytest.importorskip("torch")
    import graphkernel.torch as gt

    n = 8

    def loop(k, b):
        attn = -(k @ k.transpose(-1, -2) * b[..., None])
        attn = attn.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool)), 0)
        for i in range(1, n):
            row = attn[..., i, :i].clone()
            sub = attn[..., :i, :i].clone()
            attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        return attn + torch.eye(n)

    def solve(a, x):
        return torch.linalg.solve_triangular(torch.tril(a, -1) + torch.eye(n), x,
                                             upper=False, unitriangular=True)

    def upper(a, x):
        return torch.linalg.solve_triangular(torch.triu(a, 1) + torch.eye(n), x,
                                             upper=True, unitriangular=True)

    g = torch.Generator().manual_seed(0)
    k, b = torch.randn(2, 3, n, 4, generator=g), torch.rand(2, 3, n, generator=g)
    a, x = torch.randn(2, 3, n, n, generator=g) * 0.3, torch.randn(2, 3, n, 5, generator=g)
    out = {}
    for name, fn, args in (("loop", loop, (k, b)), ("solve", solve, (a, x)),
                           ("upper", upper, (a, x))):
        torch._dynamo.reset()
        gt.reset_stats()
        with torch.no_grad():
            got = torch.compile(fn, backend="graphkernel")(*args)
            out[name] = (got, fn(*args), gt.stats())
    return out


@pytest.mark.parametrize("name", ["loop", "solve", "upper"])
def test_torch_compile_matches_eager(compiled, name):
    got, want, _ = compiled[name]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_the_traced_loop_is_a_few_launches(compiled):
    s = compiled["loop"][2]
    assert sum(s["launches"].values()) <= 4, s["launches"]  # base: 40 for 7 rows


def test_solve_triangular_is_one_kernel_and_other_flags_stay_torchs(compiled):
    s = compiled["solve"][2]
    assert s["launches"]["opaque"] == 0 and s["fallbacks"] == {}, s
    s = compiled["upper"][2]
    assert s["launches"]["opaque"] == 1, s
    why = s["fallbacks"]["aten.linalg_solve_triangular.default"]
    assert "upper=True" in why and s["bugs"] == 0, s


# ------------------------------------------------------------- the kernel
def _solve_graph(n: int, m: int, batch=(3,), m2: int = 0) -> Graph:
    """L^-1 X (and L^-1 X2, with ``m2`` columns, by the same TriSolve)."""
    g = Graph(f"solve_{n}_{m}_{m2}")
    L = g.add_input("L", TensorType((*batch, n, n), "float32"))
    X = g.add_input("X", TensorType((*batch, n, m), "float32"))
    xs = [X, g.add_input("X2", TensorType((*batch, n, m2), "float32"))] if m2 else [X]
    g.set_outputs(list(g.add_node("TriSolve", [L, *xs], {"form": "solve"}).outputs))
    return g


def _two_solves(chained: bool = False) -> Graph:
    """Two solve_triangular of one system (qwen3_next's new values and decayed keys); the
    second right-hand side computed from the first solution when ``chained``."""
    g = Graph("two_solves")
    L = g.add_input("L", TensorType((*B, 6, 6), "float32"))
    X = g.add_input("X", TensorType((*B, 6, 4), "float32"))
    y1 = _op(g, "TriSolve", L, X, form="solve")
    x2 = _op(g, "Mul", y1 if chained else X, g.const(np.float32(2)))
    y2 = _op(g, "TriSolve", L, x2, form="solve")
    g.set_outputs([y1, y2])
    return g


def test_solves_of_one_system_are_one_trisolve():
    g = _two_solves()
    h, notes = _run_pass(g)
    assert _ops(h) == ["Mul", "TriSolve"] and "2 right-hand sides" in notes[0], notes
    feeds = _feeds(g)
    for got, want in zip(run_graph(h, feeds), run_graph(g, feeds), strict=True):
        np.testing.assert_array_equal(got, want)  # each column: the same operations


def test_a_solve_of_another_solution_stays_apart():
    h, notes = _run_pass(_two_solves(chained=True))
    assert _ops(h).count("TriSolve") == 2 and not notes


def _rows_graph(n: int, batch=(2, 3)) -> Graph:
    g = Graph(f"rows_{n}")
    A = g.add_input("A", TensorType((*batch, n, n), "float32"))
    g.set_outputs([g.add_node("TriSolve", [A], {"form": "rows"}).output])
    return g


KERNEL_GRAPHS = [_solve_graph(64, 16), _solve_graph(5, 3, (2, 2)), _rows_graph(64, (4,)),
                 _rows_graph(7), _solve_graph(64, 16, (2,), m2=5)]


@pytest.fixture(scope="module")
def solved():
    results = [graphkernel.compile(g, "", env={}) for g in KERNEL_GRAPHS]
    lib = SimLibrary([r for res in results for r in render_all(schedules(res))])
    return results, lib


def _systems(kind: str, n: int, batch: int, rng) -> np.ndarray:
    """Strictly lower N of ``batch`` systems I + N: random, the delta rule's from random
    unit keys, all ones (a repeated token: equal keys, beta 1, no decay), 0.9 x ones, and
    random at scale 3 (ill-conditioned: solutions up to ~1e20)."""
    if kind == "random":
        N = rng.standard_normal((batch, n, n)) * 0.1
    elif kind == "delta":
        k = rng.standard_normal((batch, n, 8))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        N = 0.5 * k @ np.swapaxes(k, -1, -2)
    elif kind == "ones":
        N = np.ones((batch, n, n))
    elif kind == "ones09":
        N = 0.9 * np.ones((batch, n, n))
    else:
        N = rng.standard_normal((batch, n, n)) * 3.0
    return np.tril(N, -1)


def _fsub64(L: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``L^-1 X`` in float64 by forward substitution (a pivoting solve of an ill-conditioned
    triangular system is itself far off)."""
    Y = X.astype(np.float64).copy()
    for i in range(1, L.shape[-1]):
        Y[..., i, :] -= np.einsum("...k,...km->...m", L[..., i, :i], Y[..., :i, :])
    return Y


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.sim
@pytest.mark.parametrize("kind", ["random", "delta", "ones", "ones09", "ill"])
def test_the_kernel_solves_as_accurately_as_torch(solved, kind):
    """Both forms against a float64 solve, within a few times torch's float32 error (the
    same rows in the same order: forward substitution is backward stable)."""
    torch = pytest.importorskip("torch")
    results, lib = solved
    rng = np.random.default_rng(1)
    for g, res in zip(KERNEL_GRAPHS, results, strict=True):
        (s,) = [s for s in schedules(res).values() if isinstance(s, TriSolveSchedule)]
        n, batch = s.n, s.batch
        N = _systems(kind, n, batch, rng)
        eye = np.eye(n)
        if s.form == "solve":  # (several right-hand sides: solved side by side)
            ws = [w for _, w, _ in s.rhs]
            X = rng.standard_normal((batch, n, sum(ws)))
            L = (eye + N).astype(np.float32)
            parts = np.split(X.astype(np.float32), np.cumsum(ws)[:-1], axis=-1)
            feeds = {"L": L.reshape(g.inputs[0].shape)}
            feeds |= {v.name: p.reshape(v.shape) for v, p in zip(g.inputs[1:], parts,
                                                                   strict=True)}
            want = _fsub64(eye + N, X)
            ref = torch.linalg.solve_triangular(torch.from_numpy(L), torch.from_numpy(
                X.astype(np.float32)), upper=False, unitriangular=True).numpy()
        else:  # the loop's A = -N: (I - A)^-1 - I
            A = (-N).astype(np.float32)
            feeds = {"A": A.reshape(g.inputs[0].shape)}
            want = _fsub64(eye + N, np.broadcast_to(eye, N.shape)) - eye
            ref = (torch.linalg.solve_triangular(
                torch.from_numpy((eye + N).astype(np.float32)),
                torch.eye(n).expand(batch, n, n), upper=False, unitriangular=True)
                - torch.eye(n)).numpy()
        got, be = run_sim(res, feeds, library=lib)
        assert not be.unscheduled
        got = np.concatenate([np.asarray(x).reshape(batch, n, -1) for x in got], axis=-1)
        assert np.isfinite(got).all()
        assert _err(got, want) <= max(8 * _err(ref, want), 2e-6), (g.name, kind,
                                                                   _err(got, want),
                                                                   _err(ref, want))


@pytest.mark.sim
def test_the_kernel_reads_and_writes_each_system_once(solved):
    results, lib = solved
    res = results[0]  # 3 systems of 64 rows, 16 right-hand sides
    feeds = _feeds(KERNEL_GRAPHS[0])
    _, be = run_sim(res, feeds, library=lib)
    (st,) = be.stats.values()
    assert st.input_reads == [3 * 64 * 64 * 4, 3 * 64 * 16 * 4]
    assert st.gm_written == 3 * 64 * 16 * 4 and st.block_dim == 3


def test_a_system_too_large_for_the_ub_stays_an_op_with_the_reason():
    res = graphkernel.compile(_solve_graph(200, 64, (1,)), "", env={})
    assert [n.op for n in res.graph.nodes if n.op != "Constant"] == ["TriSolve"]
    (why,) = [a.reason for a in res.analyses.fusion_attempts if a.pattern == "trisolve"]
    assert "bytes of UB" in why
