"""The torch.compile backend never raises where eager runs: what it cannot take runs through
torch with its reason logged and counted; its own failures are bug reports in the log and
an eager fallback (or, strict, an exception); custom ops of any namespace run through
torch."""

from __future__ import annotations

import logging

import pytest

from tests.training import step

torch = pytest.importorskip("torch")

import graphkernel.torch as gt  # noqa: E402
from graphkernel.frontends import fx, torch_backend  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_torch")]  # torch.compile of programs

LENIENT = {"strict": False}  # graphkernel's own failures fall back (the user's default)


def _compiled(fn, *args, **options):
    """(eager's result, the compiled one's, stats) of one call."""
    want = fn(*args)
    got = torch.compile(fn, backend="graphkernel", options=options)(*args)
    return want, got, gt.stats()


def _g(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- graphs it cannot take
CANNOT_TAKE = {
    # (call, arguments, the reason's start)
    # (complex products, polar, views and forward FFTs lower to real pairs:
    # tests/test_torch_complex.py; an inverse real FFT does not)
    "irfft": (lambda x: torch.fft.irfft(torch.fft.rfft(x)) * 2, (_g(16),),
              "complex values: aten._fft_c2r.default has no lowering"),
    "linalg.inv": (lambda x: torch.linalg.inv(x + 4 * torch.eye(3)) + 1, (_g(3, 3),),
                   "effect tokens (aten._linalg_check_errors.default"),
    "hash (uint64)": (lambda x: torch.hash_tensor(x + 1), (_g(4, 3),),
                      "torch dtype torch.uint64"),
    # a tensor read as a number while tracing (OpInfo's narrow with a tensor start): the
    # graph's own data decides, not a failure of graphkernel's (strict does not raise it)
    "narrow (tensor start)": (lambda x, s: torch.narrow(x, 0, s, 2) * 2,
                              (_g(5, 3), torch.tensor(1)), "a data-dependent value"),
}


def test_as_strided_reads_the_programs_memory_not_a_row_major_copy():
    """``as_strided`` reads the storage under its input by the strides it is given (a
    Longformer's overlapping chunks, taken from a view of transposed heads): the elements
    lying there in the traced program's layout, gathered (no Opaque op), are the ones eager
    reads."""
    def chunks(x, w):
        h = (x @ w).transpose(0, 1)  # (heads*batch, seq, dim) from (seq, ...): not row-major
        h = h.reshape(6, 8, 4).view(6, 2, 4, 4)
        size, stride = list(h.size()), list(h.stride())
        size[1], stride[1] = 3, stride[1] // 2  # overlapping chunks of half a chunk's step
        return h.as_strided(size=size, stride=stride).sum(-1) * 2

    x, w = _g(8, 6, 4), _g(4, 4, seed=1)
    want, got, s = _compiled(chunks, x, w)
    torch.testing.assert_close(got, want)
    assert s["bugs"] == 0 and s["launches"]["opaque"] == 0 and s["fallbacks"] == {}, s


def test_as_strided_reading_outside_its_input_runs_the_graph_through_torch(caplog):
    """An ``as_strided`` reading memory between its input's elements (of the larger tensor
    the input views) reads what no input of the op carries: the graph runs through torch,
    with the reason logged, and matches eager."""
    def between(x, w):
        h = (x @ w).transpose(0, 1)[:, 1::2]  # every other row of a transposed product
        return h.as_strided((6, 3, 4), (h.stride(0), 4, 1), 2).sum(-1) * 2

    x, w = _g(8, 6, 4), _g(4, 4, seed=1)
    with caplog.at_level(logging.WARNING, logger="graphkernel.torch"):
        want, got, s = _compiled(between, x, w)
    torch.testing.assert_close(got, want)
    (reason, count), = s["graphs_through_torch"].items()
    assert "as_strided reads memory outside its input" in reason and s["bugs"] == 0


@pytest.mark.parametrize("case", sorted(CANNOT_TAKE))
def test_a_graph_it_cannot_take_runs_through_torch_with_one_logged_reason(case, caplog):
    fn, args, why = CANNOT_TAKE[case]
    with caplog.at_level(logging.WARNING, logger="graphkernel.torch"):
        want, got, s = _compiled(fn, *args)  # strict: these are no failures of graphkernel's
    torch.testing.assert_close(got, want)
    assert s["bugs"] == 0
    (reason, count), = s["graphs_through_torch"].items()
    assert reason.startswith(why) and count == 1
    said = [r.getMessage() for r in caplog.records if "runs through torch" in r.getMessage()]
    assert len(said) == 1 and reason in said[0]


@pytest.mark.parametrize("dims", [0, -1, [0]])
def test_reductions_of_a_scalar_over_explicit_dims_compile(dims):
    x = torch.tensor(2.5)

    def fn(x):
        return (torch.logsumexp(x, dims), torch.sum(x, dim=dims, keepdim=True),
                torch.mean(x, dim=dims), torch.amax(x, dims), x.squeeze(dims))

    want, got, s = _compiled(fn, x)
    torch.testing.assert_close(got, want)
    assert s["graphs_through_torch"] == {} and s["fallbacks"] == {}
    assert s["launches"]["vector"] >= 1  # graphkernel's own kernel


def test_ordered_comparisons_of_booleans_compile():
    # LongT5's local attention compares a bool mask with 0; graphkernel's ordered comparisons
    # take numbers: booleans compare as 0 and 1 (int8, or torch's promotion with a scalar)
    m = torch.tensor([[True, False, True], [False, False, True]])
    x = _g(2, 3)

    def fn(m, x):
        return (m > 0, (m >= m.flip(-1)) | (m < 1), m.flip(0) <= m, m > 0.5, m < True,
                torch.where(m > 0, x, -x))

    want, got, s = _compiled(fn, m, x)
    torch.testing.assert_close(got, want)
    assert s["graphs_through_torch"] == {} and s["fallbacks"] == {}


# ------------------------------------------------------------------ custom ops
@torch.library.custom_op("gk_test::scaled_shift", mutates_args=())
def scaled_shift(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + 1


@scaled_shift.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _backward(ctx, g):
    return g * ctx.scale, None


def _setup(ctx, inputs, output):
    ctx.scale = inputs[1]


scaled_shift.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("gk_test::clip_", mutates_args=("x",))
def clip_(x: torch.Tensor) -> None:
    x.clamp_(-0.5, 0.5)


@clip_.register_fake
def _(x):
    return None


def test_a_custom_op_of_any_namespace_runs_through_torch_and_is_listed(caplog):
    def fn(x):
        return scaled_shift(torch.tanh(x), 3.0).exp() + 1

    with caplog.at_level(logging.WARNING, logger="graphkernel.fx"), torch.no_grad():
        want, got, s = _compiled(fn, _g(4, 8))
    torch.testing.assert_close(got, want)
    assert list(s["fallbacks"]) == ["gk_test.scaled_shift.default"]
    assert "namespace 'gk_test'" in s["fallbacks"]["gk_test.scaled_shift.default"]
    assert s["launches"]["opaque"] == 1 and s["launches"]["vector"] >= 1
    assert any("Fallback gk_test.scaled_shift.default" in r.getMessage()
               for r in caplog.records)


def test_a_custom_op_trains_through_torch_with_eager_gradients():
    w = torch.nn.Parameter(_g(8, 8))

    def fn(x):
        return scaled_shift(x @ w, 0.5).sigmoid().sum()

    x = _g(3, 8)
    fn(x).backward()
    want = w.grad.clone()
    w.grad = None
    torch.compile(fn, backend="graphkernel")(x).backward()
    torch.testing.assert_close(w.grad, want)
    s = gt.stats()
    assert {g["role"] for g in s["per_graph"]} == {"forward", "backward"}
    assert "gk_test.scaled_shift.default" in s["fallbacks"] and s["graphs_through_torch"] == {}


def test_a_mutating_custom_op_runs_through_torch():
    def fn(x):
        y = x * 2
        clip_(y)
        return y + 1

    with torch.no_grad():
        want, got, s = _compiled(fn, _g(4, 4))
    torch.testing.assert_close(got, want)
    assert s["graphs_through_torch"] == {} and s["launches"]["vector"] >= 1
    (why,) = s["fallbacks"].values()  # functionalized: one op of the graph
    assert why.startswith("gk_test.clip_.default, a custom op that writes its inputs")


# ------------------------------------------------------------- graphkernel's failures
def _broken_cse(monkeypatch):
    """A failure inside a built-in pass, as a bug in it would raise."""
    import graphkernel.passes.cse as cse

    def broken(node):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cse, "node_key", broken)


def test_a_failing_pass_is_a_bug_report_and_the_graph_runs_through_torch(monkeypatch, caplog):
    _broken_cse(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="graphkernel.torch"):
        want, got, s = _compiled(lambda x: torch.relu(x * 2 + 1), _g(4, 8), **LENIENT)
    torch.testing.assert_close(got, want)
    assert s["bugs"] == 1 and s["graphs_through_torch"] == {"bug in graphkernel (the pipeline)": 1}
    (rec,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "bug in graphkernel" in rec.getMessage() and "pass cse" in rec.getMessage()
    assert rec.exc_info is not None  # the traceback, for the report


def test_strict_raises_graphkernel_s_own_failure(monkeypatch):
    _broken_cse(monkeypatch)
    with pytest.raises(Exception, match="pass cse .*ZeroDivisionError"):
        _compiled(lambda x: torch.relu(x * 2 + 1), _g(4, 8), strict=True)


def test_the_test_suite_runs_strict(monkeypatch):
    assert torch_backend._strict({})  # tests/conftest.py sets GRAPHKERNEL_TORCH_STRICT
    monkeypatch.delenv(gt.STRICT_ENV)
    assert not torch_backend._strict({}) and torch_backend._strict({"strict": True})


def test_a_failing_import_handler_runs_its_op_through_torch(monkeypatch, caplog):
    def broken(c):
        return c.arg(0).shape[7]  # an IndexError, as a handler's bug raises

    monkeypatch.setitem(fx.ATEN, "aten.sin.default", broken)
    with caplog.at_level(logging.ERROR):
        want, got, s = _compiled(lambda x: torch.sin(x) * 2, _g(4, 8), **LENIENT)
    torch.testing.assert_close(got, want)
    assert s["bugs"] == 1 and "IndexError" in s["fallbacks"]["aten.sin.default"]
    assert s["launches"]["opaque"] == 1 and s["launches"]["vector"] >= 1
    with pytest.raises(Exception, match="tuple index out of range"):
        torch._dynamo.reset()
        torch.compile(lambda x: torch.sin(x) * 2, backend="graphkernel",
                      options={"strict": True})(_g(4, 8))


def test_a_compiled_graph_failing_at_run_time_runs_through_torch_from_then_on(monkeypatch,
                                                                              caplog):
    from graphkernel.interpreter import Interpreter

    calls = []

    def broken(self, feeds):
        calls.append(1)
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(Interpreter, "run", broken)
    f = torch.compile(lambda x: torch.relu(x * 2 + 1), backend="graphkernel", options=LENIENT)
    with caplog.at_level(logging.ERROR, logger="graphkernel.torch"):
        for seed in range(3):
            x = _g(4, 8, seed=seed)
            torch.testing.assert_close(f(x), torch.relu(x * 2 + 1))
    assert len(calls) == 1  # tried once, then torch's
    assert gt.stats()["bugs"] == 1
    assert "running the compiled graph failed: RuntimeError: a kernel failed" in caplog.text


def test_an_error_eager_raises_too_is_raised_as_eager_raises_it():
    def fn(x, idx):
        return torch.gather(x * 2, 0, idx)

    x, idx = _g(3, 4), torch.tensor([[5, 0, 0, 0]])
    with pytest.raises(RuntimeError) as eager:
        fn(x, idx)
    with pytest.raises(RuntimeError) as compiled:
        torch.compile(fn, backend="graphkernel", options=LENIENT)(x, idx)
    assert str(compiled.value) == str(eager.value)
    assert gt.stats()["bugs"] == 0  # the program's error, not graphkernel's


# ------------------------------------------------------------- PyTorch's OpInfo samples
OPINFO_SUBSET = ("fft.rfft", "view_as_complex", "polar", "linalg.inv", "logsumexp",
                 "nn.functional.linear_cross_entropy", "hash_tensor", "sum", "softmax",
                 "empty_like", "nn.functional.gelu")


def test_opinfo_samples_neither_raise_nor_mismatch():
    """A representative subset of ``python benchmarks/opinfo.py`` (the whole table is in
    benchmarks/RESULTS.md): complex and unsigned results, effect tokens, a custom op of
    torch's own, reductions of scalars, uninitialised results, plain fused ops."""
    pytest.importorskip("expecttest")  # (op_db imports it: the dev extra)
    from benchmarks import opinfo

    ops = {opinfo.full_name(op): op for op in opinfo.opinfos(
        "^(" + "|".join(OPINFO_SUBSET).replace(".", r"\.") + ")$")}
    assert sorted(ops) == sorted(OPINFO_SUBSET)
    rows = {}
    for name, op in ops.items():
        (sample,) = opinfo.samples(op, 1)
        out = opinfo.check_sample(op, sample)
        assert out is not None and out.row not in ("raised", "mismatched"), (name, out)
        rows[name] = out.row
    assert rows["linalg.inv"] == "graph through torch"
    # (a forward FFT lowers to DFT products: tests/test_torch_complex.py)
    assert rows["fft.rfft"] == rows["softmax"] == rows["logsumexp"] == "own kernels"


# ------------------------------------------------- mixture-of-experts decoders (transformers)
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "olmoe"])
def test_moe_decoders_with_transformers_custom_ops_match_eager_and_train(name):
    """transformers' MoE decoders (tiny configs, library defaults) call its custom op
    ``transformers::grouped_mm_fallback`` (and its backward): recognised by its contract as
    the vendor's grouped product (an extern launch), not refused; the model compiles, its
    output matches eager and so do one training step's gradients. (A custom op graphkernel
    does not recognise runs through torch: the tests above.)"""
    import copy
    import sys
    import warnings
    from pathlib import Path

    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from export_models import families

    warnings.simplefilter("ignore")
    build, inputs = families()[name]
    model, args = build(), inputs()
    with torch.no_grad():
        want = model(*args)
        got = torch.compile(model, backend="graphkernel")(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    s = gt.stats()
    assert "transformers.grouped_mm_fallback.default" not in s["fallbacks"]
    assert s["graphs_through_torch"] == {} and s["bugs"] == 0
    assert s["launches"]["cube"] > 0 and s["launches"]["extern"] > 0

    torch._dynamo.reset()
    gt.reset_stats()
    model.train()
    twin = copy.deepcopy(model)

    want_out, want_grads = step(model, model, args)
    got_out, got_grads = step(twin, torch.compile(twin, backend="graphkernel"), args)
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=2e-5)
    for k, g in want_grads.items():
        assert (g is None) == (got_grads[k] is None), k
        if g is not None:
            torch.testing.assert_close(got_grads[k], g, rtol=1e-3, atol=1e-5, msg=k)
    s = gt.stats()
    assert {g["role"] for g in s["per_graph"]} == {"forward", "backward"}
    assert "transformers.grouped_mm_fallback_backward.default" not in s["fallbacks"]
    assert s["graphs_through_torch"] == {} and s["bugs"] == 0


def test_an_in_process_custom_op_graph_saved_to_a_file_is_data_and_refused(tmp_path):
    """The graph the program built runs its custom op; the same graph read back from a file
    is data, and a file may name only reviewed ATen operators."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from graphkernel.errors import GraphKernelError
    from graphkernel.frontends.json_format import load_graph, save_graph
    from graphkernel.interpreter import Interpreter

    x = _g(2, 3)
    g = fx.import_fx(make_fx(lambda x: scaled_shift(x, 2.0) * 3)(x), [x])
    (out,) = Interpreter(g).run({g.inputs[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), (x * 2 + 1) * 3)
    save_graph(g, tmp_path / "g.json")
    with pytest.raises(GraphKernelError, match="'gk_test.scaled_shift.default': namespace "
                                               "'gk_test' is not accepted"):
        load_graph(tmp_path / "g.json")


def test_dynamos_restart_signal_is_not_a_failure(monkeypatch):
    """AOT autograd raises ``RestartAnalysis`` (``TensorifyScalarRestartAnalysis``: a Python
    scalar tracing turned into a tensor) to make Dynamo trace the frame again with the scalar
    specialised. The backend lets it through, as Inductor does: caught as a failure, the
    graph ran through torch (DeBERTa under dynamic=True: 62 launches, all Opaque)."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    real, calls = torch_backend._aot, []

    def restart_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise TensorifyScalarRestartAnalysis
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_backend, "_aot", restart_once)
    want, got, stats = _compiled(lambda x: torch.relu(x) * 2 + 1, _g(4, 8), **LENIENT)
    torch.testing.assert_close(got, want)
    assert len(calls) == 2 and not stats["graphs_through_torch"]
    assert stats["launches"]["opaque"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
def test_a_symbolic_size_read_as_a_number_is_computed_in_the_graph(dtype):
    """``torch.tensor(x.size(-1))`` under dynamic=True is ``scalar_tensor`` of a symbolic
    size: the graph computes it (a count of ones) instead of sending the whole graph through
    torch (an op run through torch cannot take a symbolic size)."""
    def f(x):
        n = torch.tensor(x.size(-1), dtype=dtype)
        return torch.softmax(x / torch.sqrt(n.to(x.dtype)), -1) + n.to(x.dtype)

    c = torch.compile(f, backend="graphkernel", dynamic=True)
    for size in (8, 13, 24):
        x = _g(3, size, seed=size)
        torch.testing.assert_close(c(x), f(x))
    stats = gt.stats()
    assert not stats["graphs_through_torch"] and stats["launches"]["opaque"] == 0
    assert stats["graphs"] == 1 and stats["recompiles"] == 0
