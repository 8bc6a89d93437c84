"""The real-header check: finding the Ascend C headers, reading g++'s diagnostics back to the
kernel line that caused them, and — where the headers are present (GRAPHKERNEL_ASCEND_HEADERS
or a CANN install) — every kernel of the examples, the model zoo and the code generator's
test cases type-checked against the real API."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path

import pytest

import graphkernel
from graphkernel.cli import main
from graphkernel.codegen import realcheck
from graphkernel.codegen.backend import render_all, schedules
from graphkernel.errors import ConfigError
from tests.codegen.cases import pattern_cases, single_op_cases

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.json")) + sorted(
    (ROOT / "examples" / "models").glob("*.json"))


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("// a marker\n")


def header_tree(root: Path, *, tiling: bool = True, stub: bool = True) -> Path:
    """The four sets as a user may lay them out (the real headers' marker files only)."""
    touch(root / "asc-devkit" / "include" / "kernel_operator.h")
    (root / "asc-devkit" / "include" / "basic_api").mkdir()
    touch(root / "asc-devkit" / "include" / "adv_api" / "matmul" / "matmul_intf.h")
    touch(root / "cpudebug" / "include" / "tikicpulib.h")
    if stub:
        touch(root / "cann" / "stub_fun.h")
    if tiling:
        touch(root / "gen" / "kernel_tiling" / "kernel_tiling.h")
    return root


def test_headers_are_found_in_any_layout_of_the_four_sets(tmp_path):
    h = realcheck.find_headers(header_tree(tmp_path / "h"), env={})
    assert h.devkit == tmp_path / "h" / "asc-devkit"
    assert h.tikicpulib == tmp_path / "h" / "cpudebug" / "include"
    assert h.stub_fun == tmp_path / "h" / "cann"
    assert h.tiling == tmp_path / "h" / "gen"
    assert h.matmul == tmp_path / "h" / "asc-devkit" / "include"
    assert h.origin == f"--ascend-headers {tmp_path / 'h'}" and h.securec is None
    # the tikicpulib headers come first: their stub_def.h defines what the API's headers use
    dirs = h.include_dirs(None)
    assert dirs[0] == h.tikicpulib and dirs.index(h.devkit) < dirs.index(h.devkit / "include")
    by_env = realcheck.find_headers(env={realcheck.ENV: str(tmp_path / "h")})
    assert by_env.devkit == h.devkit and by_env.origin.startswith(realcheck.ENV)


def test_a_cann_install_is_searched_where_cann_puts_the_headers(tmp_path):
    home = tmp_path / "ascend-toolkit" / "latest"
    header_tree(home / "x86_64-linux" / "asc", tiling=False, stub=False)
    touch(home / "tools" / "tikicpulib" / "lib" / "include" / "stub_fun.h")
    touch(home / "x86_64-linux" / "ascendc" / "include" / "highlevel_api" / "kernel_tiling" /
          "kernel_tiling.h")
    touch(home / "include" / "securec.h")
    h = realcheck.find_headers(env={"ASCEND_HOME_PATH": str(home)})
    assert h.stub_fun == home / "tools" / "tikicpulib" / "lib" / "include"
    assert h.tiling == home / "x86_64-linux" / "ascendc" / "include" / "highlevel_api"
    assert h.securec == home / "include" and h.origin == f"ASCEND_HOME_PATH={home}"
    assert realcheck.find_headers(env={}) is None  # nothing given: nothing found


def test_a_folder_lacking_a_set_names_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"missing stub_fun.h .*; kernel_tiling/kernel_tiling"
                                          r".h \(installed with CANN; from a devkit checkout, "
                                          r"generate it with .*gen_kernel_tiling_data_def.py"):
        realcheck.find_headers(header_tree(tmp_path / "h", tiling=False, stub=False), env={})
    with pytest.raises(ConfigError, match="not a folder"):
        realcheck.find_headers(tmp_path / "nowhere", env={})
    with pytest.raises(ConfigError, match="no Ascend C headers under it"):
        realcheck.find_headers(env={"ASCEND_TOOLKIT_HOME": str(tmp_path)})


# g++'s output for a run of two kernels (the shapes of its diagnostics, paths shortened)
DIAGNOSTICS = """\
In file included from {h}/kernel_operator.h:26,
                 from {k}/a.cpp:5:
{h}/kernel_check_copy.h:160:24: warning: narrowing conversion [-Wnarrowing]
{k}/a.cpp:21:20: warning: 'void SetSysWorkspace(uint8_t*)' is deprecated [-Wdeprecated-declarations]
{h}/vconv_impl.h: In instantiation of 'void AscendC::CastImpl(T*, U*) [with T = float]':
{h}/vconv_intf_impl.h:191:13:   required from 'void AscendC::Cast(...)'
{k}/b.cpp:40:9:   required from here
{h}/vconv_impl.h:1006:35: error: no matching function for call to 'CastIntrinsicsImpl(float*&)'
{h}/vconv_impl.h:29:24: note: candidate: 'void AscendC::CastIntrinsicsImpl(half*, int32_t*)'
{k}/b.cpp:52:1: error: 'Foo' was not declared in this scope
"""


def test_diagnostics_are_read_back_to_the_kernel_line(tmp_path):
    a, b = (realcheck.Unit(n, "vector", tmp_path / f"{n}.cpp") for n in "ab")
    text = DIAGNOSTICS.format(h="/opt/devkit", k=tmp_path)
    errors, deprecated, unattributed = realcheck._diagnostics(
        text, {a.source.resolve(): a, b.source.resolve(): b})
    # an error inside a header belongs to the kernel line that instantiated it; the first
    # error of a kernel is the one reported
    assert errors == {b: "b.cpp:40: no matching function for call to "
                         "'CastIntrinsicsImpl(float*&)' (in vconv_impl.h:1006)"}
    assert [d.split(": warning")[0] for d in deprecated[a]] == ["a.cpp:21"]
    assert not unattributed
    _, _, lost = realcheck._diagnostics("/opt/x.h:3:1: error: boom\n", {})
    assert lost  # an error tied to no kernel: the run is repeated kernel by kernel


def test_the_command_says_how_to_give_the_headers(tmp_path, capsys, monkeypatch):
    for var in (realcheck.ENV, *realcheck.CANN_ENV):
        monkeypatch.delenv(var, raising=False)
    assert main(["realcheck", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no Ascend C headers" in err and "--ascend-headers" in err and "ASCEND_HOME_PATH" in err
    assert main(["realcheck", str(tmp_path), "--ascend-headers", str(header_tree(
        tmp_path / "h"))]) == 2
    assert "no manifest.json" in capsys.readouterr().err


# ------------------------------------------------------------- with the real headers
@functools.cache
def headers() -> realcheck.Headers | None:
    try:
        return realcheck.find_headers()
    except ConfigError:
        return None


needs_headers = pytest.mark.skipif(
    headers() is None or shutil.which("g++") is None,
    reason="no Ascend C headers: set GRAPHKERNEL_ASCEND_HEADERS to a folder with the devkit, "
           "tikicpulib's headers, stub_fun.h and kernel_tiling/ (or source CANN's set_env.sh)")


def rendered_cases(cases) -> list:
    """The rendered kernels of each pattern case, compiled under its flags."""
    return [r for c in cases
            for r in render_all(schedules(graphkernel.compile(c.graph, c.flags, env={})))]


def assert_all_compile(rendered) -> None:
    """Every rendered kernel type-checks against the real headers, in the vector mode and as
    host tiling at least."""
    results = realcheck.check_rendered(rendered, headers())
    assert {r.mode for r in results} >= {"vector", "host"}
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)


@needs_headers
@pytest.mark.slow
def test_the_examples_and_the_zoo_compile_against_the_real_headers(tmp_path):
    """Every distinct kernel (vector, cube, MIX, host tiling, CPU-model driver) of the examples
    and the zoo exports at each opt level (opt_level 1 keeps the attention masks' bool loads
    in kernels of their own), in each of its modes: no error and no deprecated call."""
    units: dict[tuple[str, str], realcheck.Unit] = {}
    runs = [(m, f"--opt_level={level}") for level in (1, 2, 3) for m in EXAMPLES]
    # and a SuperKernel (over BERT's vector kernels)
    runs.append((ROOT / "examples" / "models" / "bert.json",
                 "--opt_level=3 --enable_super_kernel"))
    for i, (model, flags) in enumerate(runs):
        out = tmp_path / f"{model.stem}{i}"
        assert main(["compile", str(model), "-o", str(out), "-q", "--flags", flags]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        for u in realcheck.project_units(out / "kernels", manifest):
            units.setdefault((u.name, u.kind), u)
    results = realcheck.check(list(units.values()), headers())
    kinds = {u.kind for u in units.values()}
    assert {"vector", "cube", "mix", "host", "driver"} <= kinds
    assert any(u.alone and u.kind == "vector" for u in units.values())  # the SuperKernel
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert {r.mode for r in results} == {"vector", "cube", "mix", "host"}


@functools.cache
def case_kernels() -> dict[str, tuple]:
    """Each distinct kernel of the code generator's test cases (vector: single ops, patterns,
    the mask graphs and fuzz seeds kept as tests, the pools' window kernels; cube: the Matmul
    API cases; MIX: a product with each epilogue, the convolution blocks through the
    pipeline and the kxk convolutions' implicit-GEMM kernels; product groups of cube and
    MIX products): name -> (rendered, case ids)."""
    from graphkernel.codegen.legalize import check
    from tests.codegen import test_cnn_kernels as cnn
    from tests.codegen import test_conv_kernels as conv
    from tests.codegen import test_fuzz_sim as fz
    from tests.codegen import test_matmul_group as grp
    from tests.codegen import test_matmul_kernels as mm
    from tests.codegen import test_window_kernels as win
    from tests.fuzz.generator import random_case

    runs = [(c.id, c.graph, c.flags) for c in single_op_cases() + pattern_cases() + mm.CASES
            + cnn.CASES + [cnn.POOL] + cnn.SE + win.CASES + win.BAND_CASES + grp.CASES]
    runs += [(name, build()[0], "") for name, build in fz.MASK_GRAPHS.items()]
    runs += [(f"conv-{name}", g, conv.FLAGS.get(name, "")) for name, (g, _) in conv.CASES.items()]
    for name, (seed, level) in fz.REAL_API_SEEDS.items():
        case = random_case(seed, level, fz.CI_MAX_OPS)
        runs.append((f"fuzz-{name}", case.graph, case.flags))
    out: dict[str, tuple] = {}
    for cid, graph, flags in runs:
        res = graphkernel.compile(graph, flags, env={})
        for r in render_all(schedules(res)):
            out.setdefault(r.name, (r, []))[1].append(cid)
    for name, epilogue in mm.MIX.items():
        a, b, op, tb = mm.SHAPES.get(name, ((50, 90), (90, 70), "MatMul", False))
        _, _, k = mm._mix(name, a, b, epilogue, mm.DTYPES.get(name, "float16"), op=op, tb=tb)
        for r in render_all({k.name + name: check(k, mm.SPEC)}):
            out.setdefault(r.name, (r, []))[1].append(f"mix-{name}")
    return out


@needs_headers
@pytest.mark.slow
def test_every_codegen_case_compiles_against_the_real_headers():
    """A kernel the simulator passes passes the real headers too: every kernel of the code
    generator's test cases (which the simulator runs in test_codegen) compiles in each of its
    modes, with no deprecated call."""
    kernels = case_kernels()
    results = realcheck.check_rendered([r for r, _ in kernels.values()], headers())
    assert {r.unit.kind for r in results} >= {"vector", "cube", "mix"}
    failed = [f"{r.line()} (cases: {', '.join(kernels.get(r.unit.name, (None, []))[1][:3])})"
              for r in results if not r.ok]
    assert not failed, "\n".join(failed)


@needs_headers
@pytest.mark.slow
def test_a_broken_kernel_is_reported_at_its_line(tmp_path):
    """Two kernels sharing a Cast the API does not have (g++ reports the broken template
    once: the second shows when the first is set aside) and a deprecated call: each kernel
    fails at its own line."""
    (r, _) = next(v for k, v in case_kernels().items() if k.startswith("gk_single_node_exp_"))
    text = r.files[f"{r.name}.cpp"]
    lines = text.splitlines()
    where = next(i for i, ln in enumerate(lines) if "KERNEL_TASK_TYPE_DEFAULT(" in ln)
    anchor = lines[where]
    at = where + 2  # the line after the anchor
    bad = ("    { TPipe p; TBuf<TPosition::VECCALC> b; p.InitBuffer(b, 1024); "
           "Cast(b.Get<float>(), b.Get<uint8_t>(), RoundMode::CAST_NONE, 64); }")
    units = []
    for n, extra in (("k1", bad), ("k2", bad), ("k3", "    SetSysWorkspace(workspace);")):
        folder = tmp_path / n
        folder.mkdir()
        for f, t in r.files.items():
            (folder / f.replace(r.name, n)).write_text(t.replace(r.name, n).replace(
                anchor, anchor + "\n" + extra))
        units.append(realcheck.Unit(n, "vector", folder / f"{n}.cpp"))
    results = {r.unit.name: r for r in realcheck.check(units, headers()) if r.mode == "vector"}
    for n in ("k1", "k2"):
        error = results[n].error
        assert error.startswith(f"{n}.cpp:{at}: no matching function for call to "), error
        assert "CastIntrinsicsImpl(float*&, unsigned char*&" in error, error
    assert results["k3"].error is None and results["k3"].deprecated[0].startswith(f"k3.cpp:{at}:")
    assert "SetSysWorkspace" in results["k3"].deprecated[0] and not results["k3"].ok


def test_the_result_cache_does_not_depend_on_the_folder():
    """A check of the same kernels from another temporary folder is read from the cache."""
    # the first of case_kernels(), from its first case alone (not every case compiled)
    first = single_op_cases()[0]
    r = render_all(schedules(graphkernel.compile(first.graph, first.flags, env={})))[0]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        ua = realcheck.write_units([r], [], Path(a))
        ub = realcheck.write_units([r], [], Path(b))
        keys = [realcheck._closure(u) for u in ua], [realcheck._closure(u) for u in ub]
        assert keys[0] == keys[1]


def test_a_target_without_a_recipe_is_refused_with_the_reason(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", str(ROOT / "examples" / "layernorm_residual.json"), "-o", str(out),
                 "-q", "--flags", "--target=ascend950"]) == 0
    capsys.readouterr()
    assert main(["realcheck", str(out), "--ascend-headers",
                 str(header_tree(tmp_path / "h"))]) == 2
    assert "no real-header recipe for NPU architecture 3510" in capsys.readouterr().err


@needs_headers
@pytest.mark.slow
def test_the_simulators_ub_gather_has_the_real_apis_form(tmp_path):
    """The in-UB Gather as the simulator takes it (float32 data, a uint32 byte-offset table,
    a base offset and a count) compiles against the real headers inside a generated kernel.
    (Its type, alignment and offset rules are run-time asserts there: the simulator's to
    check.)"""
    from graphkernel import Graph, TensorType

    g = Graph("gather_form")
    x = g.add_input("x", TensorType((4, 64), "float32"))
    g.set_outputs([g.add_node("Add", [g.add_node("Exp", [x]).output, x]).output])
    (r,) = render_all(schedules(graphkernel.compile(g, "", env={})))
    text = r.files[f"{r.name}.cpp"]
    anchor = next(ln for ln in text.splitlines() if "KERNEL_TASK_TYPE_DEFAULT(" in ln)
    form = ("    {{ TPipe p; TBuf<TPosition::VECCALC> a, o, d; p.InitBuffer(a, 1024); "
            "p.InitBuffer(o, 512); p.InitBuffer(d, 1024); Gather(d.Get<{t}>(), a.Get<{t}>(), "
            "o.Get<uint32_t>(), (uint32_t)0, (uint32_t)128); }}")
    units = []
    for n, t in (("g_f32", "float"),):
        folder = tmp_path / n
        folder.mkdir()
        for f, body in r.files.items():
            (folder / f.replace(r.name, n)).write_text(body.replace(r.name, n).replace(
                anchor, anchor + "\n" + form.format(t=t)))
        units.append(realcheck.Unit(n, "vector", folder / f"{n}.cpp"))
    results = {x.unit.name: x for x in realcheck.check(units, headers()) if x.mode == "vector"}
    assert results["g_f32"].ok, results["g_f32"].line()


@needs_headers
def test_an_int64_input_converted_on_loading_compiles_against_the_real_headers():
    """int64 positions loaded and cast to float32 (``Cast(..., RoundMode::CAST_RINT)``, the
    int64 -> float cast of the A2/A3 vector unit) type-check against the real API, in every
    mode of the kernel."""
    (case,) = [c for c in pattern_cases() if c.id == "rotary-tables-int64-positions"]
    rendered = render_all(schedules(graphkernel.compile(case.graph, case.flags, env={})))
    assert len(rendered) == 1
    assert "RoundMode::CAST_RINT" in "".join(rendered[0].files.values())
    assert_all_compile(rendered)


@needs_headers
def test_lookup_and_split_kernels_compile_against_the_real_headers():
    """The lookup's scalar read of an int64 and an int32 index from GM (GlobalTensor's
    GetValue) and its per-row DataCopyPad from the table, and a Split's parts stored by runs
    of rows, type-check against the real API, in every mode of the kernel, with its host
    tiling."""
    cases = [c for c in pattern_cases() if c.id.startswith(("embedding-lookup",
                                                            "split-parts"))]
    assert len(cases) == 3
    rendered = rendered_cases(cases)
    texts = ["".join(r.files.values()) for r in rendered]
    assert sum("GetValue(r0 + i)" in t for t in texts) == 2
    assert sum("a part of a Split" in t for t in texts) == 1
    assert_all_compile(rendered)


@needs_headers
def test_banded_window_kernels_compile_against_the_real_headers():
    """A channels-last depthwise convolution over a symbolic length (bands of output pixels
    with their halo, the band's rows counted at run time, GM sizes from the tiling), an NCHW
    one and a max pool over a symbolic batch (the planes counted by the host) and their host tiling
    type-check against the real API, in every mode of the kernel."""
    from tests.codegen import test_window_kernels as win

    rendered = rendered_cases(win.BAND_CASES)
    assert len(rendered) == len(win.BAND_CASES)
    texts = ["".join(r.files.values()) for r in rendered]
    assert sum("in bands of at most" in t for t in texts) == 2
    assert sum("(uint64_t)shapes[0] * 8ull" in t for t in texts) == 2
    assert_all_compile(rendered)


@needs_headers
def test_scan_readout_kernels_compile_against_the_real_headers():
    """A scan's kernel that reduces each row of its tile (the selective scan's readout:
    ``RowReduce`` in the loop over the rows, one value per row stored per tile) and the
    whole-row column tile of its host tiling type-check against the real API."""
    cases = [c for c in pattern_cases() if c.id.startswith("scan-readout-")]
    assert len(cases) == 4
    rendered = rendered_cases(cases)
    readouts = [r for r in rendered if r.schedule.whole_row_tiles]
    assert len(readouts) == 4
    assert all("RowReduce(" in "".join(r.files.values()) for r in readouts)
    assert_all_compile(rendered)


@needs_headers
def test_two_pass_kernels_over_the_rows_compile_against_the_real_headers():
    """A reduction over middle or leading axes broadcast back in one kernel (the second
    pass's ``Compute2`` and its pass-selected loads and stores; the global response norm's
    reduction of the reduced row in ``Finish``, read by the scalar unit) type-checks against
    the real API."""
    cases = [c for c in pattern_cases() if c.id.startswith("middle-reduce-back-")]
    assert len(cases) == 7
    rendered = rendered_cases(cases)
    two = [r for r in rendered if r.schedule.second]
    assert len(two) == 7 and sum(bool(r.schedule.late_reduces) for r in two) == 5
    assert all("Compute2(" in "".join(r.files.values()) for r in two)
    assert_all_compile(rendered)


@needs_headers
def test_a_gated_scan_with_its_softplus_compiles_against_the_real_headers():
    """The scan's kernel computing the softplus of a per-channel parameter broadcast to the
    scan's shape (scan_prologue: a comparison and a Select in the scan's kernel) type-checks
    against the real API."""
    from tests.passes.test_scan_prologue import _gated

    res = graphkernel.compile(_gated(), "--opt_level=2", env={})
    rendered = render_all(schedules(res))
    assert len(rendered) == 1
    assert_all_compile(rendered)


@needs_headers
def test_loop_scan_kernels_compile_against_the_real_headers():
    """The kernel running a recurrence's step body down its rows (a Scan with
    combine="loop": its ``ScanLoopN`` helper, the states in rows of UB) type-checks against
    the real API, for a body of four states and one of two."""
    from tests.passes.test_scan_loop_states import _gated, _wkv

    rendered = [r for g in (_wkv(), _gated())
                for r in render_all(schedules(graphkernel.compile(g, "--opt_level=2",
                                                                  env={})))]
    assert sum("ScanLoop0(" in "".join(r.files.values()) for r in rendered) == 2
    assert_all_compile(rendered)


@needs_headers
def test_in_place_slice_kernels_compile_against_the_real_headers():
    """A slice's columns split into heads (one strided view), and a part loaded in place by
    the two kernels that read it (passes/recompute.py), type-check against the real API."""
    cases = [c for c in pattern_cases() if c.id in ("slice-then-head-split",
                                                     "slice-read-in-place-by-two-kernels")]
    assert len(cases) == 2
    rendered = rendered_cases(cases)
    assert_all_compile(rendered)


@needs_headers
def test_in_ub_transpose_kernels_compile_against_the_real_headers():
    """The in-UB transpose's table built by the scalar unit (LocalTensor SetValue) and its
    count-form Gather, of a stored value and of a loaded input (and of inputs a LayerNorm
    then reduces by rows), type-check against the real API in every mode of the kernel,
    with the one-tile host tiling."""
    cases = [c for c in pattern_cases() if c.id.startswith("ub-transpose-")]
    assert len(cases) == 4
    rendered = rendered_cases(cases)
    assert len(rendered) == 4 and all(r.schedule.single_tile for r in rendered)
    texts = ["".join(r.files.values()) for r in rendered]
    assert all("Gather(" in t and ".SetValue(" in t for t in texts)
    assert_all_compile(rendered)


@needs_headers
def test_convolution_kernels_compile_against_the_real_headers():
    """The kxk convolutions' MIX kernels (codegen/cube/conv.py: the im2col panel built with
    Gather into the user workspace, GetTaskRatio's block index, the Matmul object reading it
    from GM) type-check against the real API in every mode of the kernel, with their host
    tiling."""
    from tests.codegen import test_conv_kernels as conv

    rendered = []
    for name, (g, _) in conv.CASES.items():
        rendered += render_all(schedules(graphkernel.compile(g, conv.FLAGS.get(name, ""),
                                                             env={})))
    assert len(rendered) == len(conv.CASES)
    assert all("GetUserWorkspace(workspace)" in r.files[f"{r.name}.cpp"] for r in rendered)
    results = realcheck.check_rendered(rendered, headers())
    assert {r.mode for r in results} >= {"mix", "host"}
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)


@needs_headers
def test_a_rotary_kernel_storing_its_result_head_transposed_compiles_against_the_real_headers():
    """Rotary's column slices with a second output stored through the head transpose's map
    (strided stores of its rows) type-check against the real API."""
    cases = [c for c in pattern_cases() if c.id == "rotary-stored-head-transposed"]
    assert len(cases) == 1
    rendered = rendered_cases(cases)
    assert len(rendered) == 1
    assert_all_compile(rendered)


@needs_headers
def test_block_tile_and_int32_column_kernels_compile_against_the_real_headers():
    """A channel norm whose row tile is the whole block (the host tiling's block-tile branch:
    rt = M, the columns that fit beside every row) and an int32 index loaded as one value per
    row and cast to float32 (``Cast`` of the column) type-check against the real API."""
    cases = [c for c in pattern_cases() if c.id in ("block-tile-channel-norm-3x37x300",
                                                    "int32-index-per-row-37x5")]
    assert len(cases) == 2
    rendered = rendered_cases(cases)
    assert any(r.schedule.block_tile for r in rendered)
    texts = ["".join(r.files.values()) for r in rendered]
    assert sum("a row tile holds every row of its block" in t for t in texts) == 1
    assert_all_compile(rendered)


@needs_headers
def test_forward_substitution_kernels_compile_against_the_real_headers():
    """The forward-substitution kernel (codegen/trisolve.py) of both forms — a system with
    its right-hand sides, and the row recurrence of one matrix — type-checks against the real
    API: DataCopyPad of rows, scalar GetValue of the coefficients, Muls/Add/Sub of counts."""
    from tests.test_trisolve import KERNEL_GRAPHS

    rendered = [r for g in KERNEL_GRAPHS
                for r in render_all(schedules(graphkernel.compile(g, "", env={})))]
    assert {r.schedule.form for r in rendered} == {"solve", "rows"}
    assert_all_compile(rendered)
