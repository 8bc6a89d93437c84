"""The kernel project a compile writes for the CANN toolchain: each kernel's CPU-model driver
(run here in graphkernel's simulator, which provides tikicpulib's launch surface) and the
CMake that builds the kernels for the target's parts or the drivers against tikicpulib
(configured here against a stand-in CANN tree: the toolchain itself is not installed)."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from graphkernel.cli import main
from graphkernel.codegen import harness, targets
from graphkernel.codegen.sim.runner import HEADER_DIR

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def project(example: str, tmp: str) -> Path:
    out = Path(tmp) / example
    assert main(["compile", str(ROOT / "examples" / f"{example}.json"), "-o", str(out), "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("projects"))
    return lambda example: project(example, tmp)


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_every_kernel_has_a_driver_and_its_data(projects):
    for example in ("layernorm_residual", "mlp_gelu"):
        out = projects(example)
        m = manifest(out)
        for k, entry in zip(m["kernels"], m["cpu_model"], strict=True):
            assert entry["kernel"] == k["name"] and entry["note"] == ""
            driver = out / entry["driver"]
            text = driver.read_text()
            mode = {"vector": "AIV_MODE", "mix": "MIX_MODE", "cube": "AIC_MODE"}[k["kind"]]
            assert f"AscendC::SetKernelMode(KernelMode::{mode});" in text
            assert f"ICPU_RUN_KF({k['name']}, blockDim," in text
            data = out / "kernels" / harness.FOLDER / k["name"]
            files = sorted(p.name for p in data.iterdir())
            assert files == sorted([f"input{i}.bin" for i in range(len(k["inputs"]))] +
                                   [f"expected{i}.bin" for i in range(len(k["outputs"]))])
            assert f"{harness.FOLDER}/{k['name']}/input0.bin" in " ".join(m["files"])


def sim_driver(out: Path, name: str, tmp: Path) -> Path:
    """The kernel, its host tiling and its driver in one program over the simulator."""
    kernels = out / "kernels"
    src = tmp / f"{name}_run.cpp"
    src.write_text("\n".join([
        "#define GK_SIM 1", '#include "ascendc_sim.h"', "using namespace AscendC;",
        f'#include "{kernels}/{name}_tiling.h"', f'#include "{kernels}/{name}_tiling.cpp"',
        f'#include "{kernels}/{name}.cpp"', f'#include "{kernels}/cpu/{name}_cpu.cpp"', ""]))
    exe = tmp / name
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", f"-I{HEADER_DIR}",
                    f"-I{kernels}", str(src), "-o", str(exe)], check=True)
    return exe


@pytest.mark.sim
@pytest.mark.parametrize("example", ["layernorm_residual", "mlp_gelu"])
def test_the_driver_runs_its_kernel_and_compares_with_the_interpreter(example, projects,
                                                                        tmp_path):
    """Under the simulator's stand-in for tikicpulib the driver reads the interpreter's
    inputs, runs the kernel on every block the tiling asks for and matches the expected
    outputs; a changed expected output is reported (exit 1, the first differing element)."""
    out = projects(example)
    (k,) = manifest(out)["kernels"]
    exe = sim_driver(out, k["name"], tmp_path)
    data = tmp_path / "data"
    shutil.copytree(out / "kernels" / harness.FOLDER / k["name"], data)
    ok = subprocess.run([str(exe), str(data)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count(": OK") == len(k["outputs"]), ok.stdout
    want = data / "expected0.bin"
    dt = np.dtype(harness.DType(k["outputs"][0]["dtype"]).np)
    values = np.frombuffer(want.read_bytes(), dt).copy()
    values[3] += dt.type(1.0)
    want.write_bytes(values.tobytes())
    bad = subprocess.run([str(exe), str(data)], capture_output=True, text=True)
    assert bad.returncode == 1 and "1 of" in bad.stdout and "first at 3:" in bad.stdout, \
        bad.stdout
    (data / "input0.bin").write_bytes(b"\0" * 8)
    short = subprocess.run([str(exe), str(data)], capture_output=True, text=True)
    assert short.returncode == 1 and "does not hold" in short.stderr


# ----------------------------------------------------------------------------- CMake
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
# A stand-in for CANN's kernel CMake: the two functions the generated CMake calls, recording
# their arguments (the real ones drive the device compiler).
FAKE_ASCENDC = """
function(ascendc_library name type)
  file(WRITE ${CMAKE_BINARY_DIR}/ascendc_library.txt "${name};${type};${ARGN}")
endfunction()
function(ascendc_include_directories name scope)
  file(WRITE ${CMAKE_BINARY_DIR}/ascendc_include.txt "${ARGN}")
endfunction()
"""


def fake_cann(root: Path, cmake_dir: str = "compiler/tikcpp") -> Path:
    (root / cmake_dir / "ascendc_kernel_cmake").mkdir(parents=True)
    (root / cmake_dir / "ascendc_kernel_cmake" / "ascendc.cmake").write_text(FAKE_ASCENDC)
    tiling = root / "compiler" / "tikcpp" / "tikcfw" / "kernel_tiling"
    tiling.mkdir(parents=True)
    (tiling / "kernel_tiling.h").write_text("#pragma once\n")
    return root


def configure(kernels: Path, build: Path, *defs: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cmake", "-S", str(kernels), "-B", str(build), *defs],
                          capture_output=True, text=True)


@needs_cmake
@pytest.mark.slow
@pytest.mark.parametrize("cmake_dir", ["compiler/tikcpp", "tools/tikcpp"])
def test_the_device_build_finds_cann_where_each_version_installs_it(projects, tmp_path,
                                                                     cmake_dir):
    out = projects("mlp_gelu")
    cann = fake_cann(tmp_path / "cann", cmake_dir)
    build = tmp_path / "build"
    r = configure(out / "kernels", build, f"-DASCEND_CANN_PACKAGE_PATH={cann}")
    assert r.returncode == 0, r.stderr
    (k,) = manifest(out)["kernels"]
    lib = (build / "ascendc_library.txt").read_text().split(";")
    assert lib[:2] == ["graphkernel_kernels", "SHARED"] and lib[2:] == [f"{k['name']}.cpp"]
    cache = (build / "CMakeCache.txt").read_text()
    assert "SOC_VERSION:STRING=ascend910b1" in cache  # the first part of target ascend910b
    assert f"GK_TILING_INCLUDE:PATH={cann}/compiler/tikcpp/tikcfw" in cache


@needs_cmake
@pytest.mark.slow
def test_soc_version_must_be_a_part_of_the_target(projects, tmp_path):
    out = projects("layernorm_residual")
    cann = fake_cann(tmp_path / "cann")
    ok = configure(out / "kernels", tmp_path / "b1", f"-DASCEND_CANN_PACKAGE_PATH={cann}",
                   "-DSOC_VERSION=Ascend910B2")  # CANN's names are case-blind
    assert ok.returncode == 0, ok.stderr
    bad = configure(out / "kernels", tmp_path / "b2", f"-DASCEND_CANN_PACKAGE_PATH={cann}",
                    "-DSOC_VERSION=ascend910b")
    assert bad.returncode != 0
    parts = " ".join(targets.load("ascend910b").soc_versions)
    assert "SOC_VERSION ascend910b is not a part of target ascend910b" in bad.stderr
    assert parts.split()[0] in bad.stderr
    bare = tmp_path / "bare"  # the tiling header but no kernel CMake
    (bare / "compiler" / "tikcpp" / "tikcfw" / "kernel_tiling").mkdir(parents=True)
    (bare / "compiler" / "tikcpp" / "tikcfw" / "kernel_tiling" / "kernel_tiling.h").touch()
    none = configure(out / "kernels", tmp_path / "b3", f"-DASCEND_CANN_PACKAGE_PATH={bare}")
    assert none.returncode != 0 and "ascendc.cmake is not under" in none.stderr
    (tmp_path / "empty").mkdir()
    empty = configure(out / "kernels", tmp_path / "b4",
                      f"-DASCEND_CANN_PACKAGE_PATH={tmp_path / 'empty'}")
    assert empty.returncode != 0 and "kernel_tiling/kernel_tiling.h is not under" in empty.stderr


@needs_cmake
@pytest.mark.slow
def test_the_cpu_model_build_makes_one_test_per_driver(projects, tmp_path):
    """-DGK_CPU_MODEL=ON: each kernel's driver is a program linked with tikicpulib's target
    for the part (a stand-in target here) and a ctest test run on its data folder."""
    out = projects("mlp_gelu")
    cann = fake_cann(tmp_path / "cann")
    cfg = cann / "tools" / "tikicpulib" / "lib" / "cmake"
    cfg.mkdir(parents=True)
    (cfg / "tikicpulib-config.cmake").write_text(
        "add_library(gk_fake_tikicpulib INTERFACE)\n"
        "add_library(tikicpulib::ascend910B1 ALIAS gk_fake_tikicpulib)\n")
    build = tmp_path / "build"
    r = configure(out / "kernels", build, f"-DASCEND_CANN_PACKAGE_PATH={cann}",
                  "-DGK_CPU_MODEL=ON")
    assert r.returncode == 0, r.stderr
    (k,) = manifest(out)["kernels"]
    tests = subprocess.run(["ctest", "--test-dir", str(build), "-N"], capture_output=True,
                           text=True).stdout
    assert f"Test #1: {k['name']}" in tests
    assert not (build / "ascendc_library.txt").exists()  # no device build in this mode
