"""The simulator's Matmul API model, through hand-written kernels (tests/codegen/data/
matmul_cases.cpp): products against numpy for each dtype, transpose, bias, tails and both
ways out (IterateAll to GM, Iterate/GetTensorC into UB then a vector epilogue); the GM bytes
it counts per operand against the tiler's model; and each misuse a clear error."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from graphkernel.codegen import targets
from graphkernel.codegen.cube.tiling import gm_bytes, tile, violations
from graphkernel.codegen.sim.runner import SimulatorError, build, launch

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
SPEC = targets.load("ascend910b")
SOURCE = Path(__file__).parent / "data" / "matmul_cases.cpp"
KERNELS = {"f16": (np.float16, np.float16), "bf16": (ml_dtypes.bfloat16, np.float32),
           "f32": (np.float32, np.float32), "i8": (np.int8, np.int32)}
FIELDS = ["usedCoreNum", "M", "N", "Ka", "Kb", "singleCoreM", "singleCoreN", "singleCoreK",
          "baseM", "baseN", "baseK", "depthA1", "depthB1", "stepM", "stepN", "stepKa", "stepKb",
          "isBias", "iterateOrder", "transLength"]
ITERATE, BIAS, AFTER_END, SECOND, SMALL_UB, TAIL_OOB = 1, 2, 4, 8, 16, 32
ORG_SAME, ORG_SHORT, ORG_LATE = 64, 128, 256


@functools.cache
def _lib():
    glue = "".join(f"static void gk_sim_call_mm_{k}(uint8_t** a) {{ mm_{k}(a[0], a[1], a[2], "
                   f"a[3], a[4], a[5]); }}\nGK_SIM_LAUNCHER(mm_{k}, 6)\n" for k in KERNELS)
    return build([SOURCE.read_text() + glue])


def _run(kind: str, t, a, b, bias=None, trans_a=False, trans_b=False, mode=0):
    """Launch one block per core of the tiling's split; returns (C, counts)."""
    ab, cb = KERNELS[kind]
    c = np.zeros((t.M, t.N), cb)
    bias = np.zeros(t.N, np.int32 if kind == "i8" else np.float32) if bias is None else bias
    head = np.array([getattr(t, f) for f in FIELDS], np.int32)
    case = np.concatenate([head, np.array([t.coresM, t.coresN, trans_a, trans_b, mode, 0, 0, 0],
                                          np.int32)])
    counts = launch(_lib(), f"mm_{kind}", [np.ascontiguousarray(a, ab),
                                           np.ascontiguousarray(b, ab), bias, c,
                                           np.zeros(32, np.uint8), case.view(np.uint8)],
                    t.coresM * t.coresN, SPEC.ub_bytes)
    return c, counts


def _operands(kind: str, M: int, N: int, K: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind == "i8":
        return rng.integers(-8, 8, (M, K)), rng.integers(-8, 8, (K, N))
    ab = KERNELS[kind][0]
    return (rng.standard_normal((M, K)).astype(ab), rng.standard_normal((K, N)).astype(ab))


@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("trans_a, trans_b, mode", [
    (False, False, 0), (True, False, ITERATE), (False, True, BIAS), (True, True,
                                                                       ITERATE | BIAS)])
def test_products_match_numpy(kind, trans_a, trans_b, mode):
    """Unaligned M, N, K (tails in every block), several cores, each transpose, both ways
    out: fp32 accumulation (int32 for int8) rounded once to C's type."""
    M, N, K = 50, 70, 90
    size = np.dtype(KERNELS[kind][0]).itemsize
    t = tile(M, N, K, size, size, np.dtype(KERNELS[kind][1]).itemsize, SPEC, bias=True)
    t = dataclasses.replace(t, baseM=16, baseN=32, coresM=2, coresN=2, usedCoreNum=4,
                            singleCoreM=32, singleCoreN=48)
    a, b = _operands(kind, M, N, K)
    bias = (np.arange(N) % 5).astype(np.int32 if kind == "i8" else np.float32)
    ga = a.T.copy() if trans_a else a
    gb = b.T.copy() if trans_b else b
    c, _ = _run(kind, t, ga, gb, bias if mode & BIAS else None, trans_a, trans_b, mode)
    acc = np.int64 if kind == "i8" else np.float64
    want = a.astype(acc) @ b.astype(acc) + (bias if mode & BIAS else 0)
    want = (want * (2 if mode & ITERATE else 1)).astype(np.float32).astype(KERNELS[kind][1])
    tol = {"f16": 2e-3, "bf16": 1e-5, "f32": 1e-5, "i8": 0}[kind]
    np.testing.assert_allclose(c.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol * np.abs(want.astype(np.float64)).max())


@pytest.mark.parametrize("M, N, K, change", [
    (130, 200, 1200, {}),
    (1, 4096, 512, {}),
    # one core walking many base tiles: L1 holds every A panel, B's stream, or neither
    (96, 80, 200, dict(depthA1=6 * 13, depthB1=13, iterateOrder=0)),
    (96, 80, 200, dict(depthA1=13, depthB1=2, iterateOrder=1)),
    (96, 80, 200, dict(depthA1=2, depthB1=2, iterateOrder=0)),
], ids=["split", "skinny", "a_resident", "b_streamed", "streamed"])
def test_gm_bytes_per_operand_match_the_tiler(M, N, K, change):
    _traffic(M, N, K, change)


def _traffic(M, N, K, change):
    """Run a product with the tiler's tiling (or ``change``d); check the counted GM bytes
    against the tiler's model and the result against numpy; return the counts."""
    t = tile(M, N, K, 2, 2, 2, SPEC)
    if change:  # 6 x 5 base tiles of 16 x 16, 13 K steps of 16 per panel
        t = dataclasses.replace(t, coresM=1, coresN=1, usedCoreNum=1, singleCoreM=M,
                                singleCoreN=N, baseM=16, baseN=16, baseK=16, **change)
    assert not violations(t, 2, 2, 2, SPEC)
    a, b = _operands("f16", M, N, K)
    c, counts = _run("f16", t, a, b)
    assert counts.mm_a + counts.mm_b == gm_bytes(t, 2, 2)
    assert counts.mm_c == M * N * 2 and counts.gm_written == M * N * 2
    np.testing.assert_allclose(c, (a.astype(np.float32) @ b.astype(np.float32)).astype(
        np.float16), rtol=5e-3, atol=0.05)
    return counts


def test_the_l1_model_changes_the_traffic():
    """The same product read with every A panel resident, then with both streamed: the
    second reads A once per N tile and B once per M tile (the figures the tiler reports)."""
    size = 2 * 200
    kept = _traffic(96, 80, 200, dict(
        depthA1=6 * 13, depthB1=13, iterateOrder=0))
    streamed = _traffic(96, 80, 200, dict(
        depthA1=2, depthB1=2, iterateOrder=0))
    assert (kept.mm_a, kept.mm_b) == (96 * size, 80 * size)
    assert (streamed.mm_a, streamed.mm_b) == (5 * 96 * size, 6 * 80 * size)


def _err(t, mode=0, match=""):
    a, b = _operands("f16", t.M, t.N, t.Ka)
    with pytest.raises(SimulatorError, match=match) as e:
        _run("f16", t, a, b, mode=mode)
    assert "mm_f16: line" in str(e.value)


BASE = dataclasses.replace(tile(64, 64, 64, 2, 2, 2, SPEC), coresM=1, coresN=1,
                           usedCoreNum=1, singleCoreM=64, singleCoreN=64)


@pytest.mark.parametrize("change, match", [
    (dict(baseM=256, baseN=256, baseK=16), "baseM\\*baseN\\*4 = 262144 bytes overflows L0C"),
    (dict(baseM=24), "baseM 24 / baseN .* not positive multiples of the 16-element fractal"),
    (dict(baseK=8), "baseK 8 is not a multiple of 16 for 2-byte operands"),
    (dict(baseM=256, baseK=128), "exceeds half of L0A"),
    (dict(depthA1=200, depthB1=200), "bytes of L1, which has 524288"),
    (dict(singleCoreK=32), "K is split"),
], ids=["l0c", "base_m", "base_k", "l0a", "l1", "k_split"])
def test_a_tiling_breaking_a_limit_is_refused(change, match):
    _err(dataclasses.replace(BASE, **change), match="TCubeTiling: .*" + match)


@pytest.mark.parametrize("mode, match", [
    (ITERATE | AFTER_END, "Iterate after End"),
    (SECOND, "SetTensorA on a second Matmul object while another has not called End"),
    (ITERATE | SMALL_UB, "GetTensorC into a UB tensor of 4096 bytes: a base tile of 64 x 64 "
                         "needs 8192"),
], ids=["after_end", "second_object", "small_ub"])
def test_misuse_of_the_object_is_refused(mode, match):
    _err(dataclasses.replace(BASE, baseM=64, baseN=64), mode, match)


def test_row_pitches_set_by_set_org_shape_are_checked():
    """SetOrgShape gives the operands' and C's row pitches (strided products,
    codegen/cube/strided.py): the tiling's own shapes compute the same product; a pitch
    shorter than the block's row (rows overlapping) is refused, and so is SetOrgShape after
    the tensors (the API takes it before SetTensorA/SetTensorB)."""
    a, b = _operands("f16", 64, 64, 64)
    want, _ = _run("f16", BASE, a, b)
    got, _ = _run("f16", BASE, a, b, mode=ORG_SAME)
    np.testing.assert_array_equal(got, want)
    _err(BASE, ORG_SHORT, "SetOrgShape: A's \\(orgKa\\) row pitch 32 is shorter than the "
                          "block's row of 64 elements")
    _err(BASE, ORG_LATE, "Iterate before SetTensorA and SetTensorB")


def test_a_tail_past_the_operands_is_out_of_bounds():
    """The last core's SetTail claims a whole block where M ends first: its reads of A run
    past the buffer."""
    t = dataclasses.replace(BASE, M=40, singleCoreM=32, coresM=2, usedCoreNum=2, baseM=16)
    _err(t, TAIL_OOB, "GM access .* out of bounds")
    _run("f16", t, *_operands("f16", 40, 64, 64))  # the right tails run


def test_a_launch_with_more_blocks_than_the_tilings_cores_is_refused():
    """A block the tiling's usedCoreNum does not count must not register the Matmul object
    (it would compute a block no core owns): a product launched on one block more than its
    tiling uses fails in the simulator, naming the block."""
    M, N, K = 50, 70, 90
    t = tile(M, N, K, 2, 2, 2, SPEC)
    t = dataclasses.replace(t, baseM=16, baseN=32, coresM=2, coresN=2, usedCoreNum=3,
                            singleCoreM=32, singleCoreN=48)
    a, b = _operands("f16", M, N, K)
    with pytest.raises(SimulatorError, match="usedCoreNum 3 does not cover block 3"):
        _run("f16", t, a, b)
