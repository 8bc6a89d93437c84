"""The matmul tiler: every constraint of the reference over a sweep of shapes and dtypes, the
traffic it reports against a walk of the base tiles, its choice of split, and refusals."""

from __future__ import annotations

import itertools

import pytest

from graphkernel.codegen import targets
from graphkernel.codegen.cube.tiling import NoTiling, gm_bytes, tile, violations

SPEC = targets.load("ascend910b")
SHAPES = [(1, 1, 1), (1, 4096, 11008), (17, 33, 65), (64, 64, 64), (128, 768, 768),
          (200, 3072, 768), (4096, 4096, 4096), (2048, 50257, 768), (16, 16, 100000),
          (333, 1, 4099)]
DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4, "int8": 1}


def _walk(t, a: int, b: int) -> int:
    """GM bytes read, walking every core's base tiles in its iterate order with an explicit
    L1 of ``depthA1``/``depthB1`` base tiles holding whole K panels (LRU), streaming what
    does not fit — written apart from the tiler's closed form."""
    K, bk = t.Ka, t.baseK
    kt = -(-K // bk)
    total = 0
    for i, j in itertools.product(range(t.coresM), range(t.coresN)):
        sm = min(t.singleCoreM, t.M - i * t.singleCoreM)
        sn = min(t.singleCoreN, t.N - j * t.singleCoreN)
        if sm <= 0 or sn <= 0:
            continue
        tiles_m = [min(t.baseM, sm - m) for m in range(0, sm, t.baseM)]
        tiles_n = [min(t.baseN, sn - n) for n in range(0, sn, t.baseN)]
        l1 = {"a": [], "b": []}
        cap = {"a": t.depthA1 // kt, "b": t.depthB1 // kt}
        pairs = ([(m, n) for n in range(len(tiles_n)) for m in range(len(tiles_m))]
                 if t.iterateOrder == 0 else
                 [(m, n) for m in range(len(tiles_m)) for n in range(len(tiles_n))])
        for m, n in pairs:
            loads = [("b", n, tiles_n[n] * K * b), ("a", m, tiles_m[m] * K * a)]
            for side, key, nbytes in loads if t.iterateOrder == 0 else loads[::-1]:
                held = l1[side]  # the outer operand's panel first
                if key in held:
                    held.remove(key)
                    held.append(key)
                    continue
                total += nbytes
                if cap[side]:
                    held.append(key)
                    del held[:-cap[side]]
    return total


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_tiling_of_the_sweep_satisfies_the_constraints(dtype):
    size = DTYPES[dtype]
    for (M, N, K), batch in itertools.product(SHAPES, (1, 3)):
        t = tile(M, N, K, size, size, 4 if size != 2 else 2, SPEC, batch=batch)
        assert violations(t, size, size, 4 if size != 2 else 2, SPEC) == [], (M, N, K)
        assert t.baseK % SPEC.cube_k_align(size) == 0
        assert t.usedCoreNum == min(SPEC.aic_cores, batch * t.coresM * t.coresN)
        assert t.split_bytes == batch * (M * K * t.coresN + K * N * t.coresM) * size
        assert t.gm_bytes >= t.split_bytes >= batch * (M * K + K * N) * size
        assert t.gm_bytes == batch * _walk(t, size, size) == gm_bytes(t, size, size)


def test_int8_base_k_is_whole_32_element_fractals():
    t = tile(64, 64, 100, 1, 1, 4, SPEC)
    assert t.baseK % 32 == 0 and violations(t, 1, 1, 4, SPEC) == []


def test_the_split_minimises_modeled_time_then_traffic():
    """A skinny product is split along N only (A is one row: re-reading it is free, B is
    read once whatever the split); a square one uses every cube core."""
    t = tile(1, 4096, 11008, 2, 2, 2, SPEC)
    assert t.coresM == 1 and t.usedCoreNum == SPEC.aic_cores
    assert t.split_bytes == (11008 * 24 + 11008 * 4096) * 2
    sq = tile(4096, 4096, 4096, 2, 2, 2, SPEC)
    assert sq.usedCoreNum == SPEC.aic_cores
    assert sq.modeled_us >= 2 * 4096 ** 3 / (SPEC.cube_tflops * 1e6)  # the cube's bound
    one_core = SPEC.model_dump() | {"aic_cores": 1, "cube_tflops": SPEC.cube_tflops / 24}
    one = tile(4096, 4096, 4096, 2, 2, 2, targets.Target.model_validate(one_core))
    assert one.usedCoreNum == 1 and one.modeled_us > 10 * sq.modeled_us


def test_the_epilogue_reservation_shrinks_the_c_tile():
    free = tile(1024, 1024, 1024, 2, 2, 4, SPEC)
    tight = tile(1024, 1024, 1024, 2, 2, 4, SPEC, ub_reserved=SPEC.ub_bytes - 20000)
    assert tight.transLength <= 20000 < free.transLength
    assert violations(tight, 2, 2, 4, SPEC, ub_reserved=SPEC.ub_bytes - 20000) == []


def test_a_bias_row_is_counted_in_l1_and_traffic():
    t = tile(256, 512, 256, 2, 2, 2, SPEC, bias=True)
    assert t.isBias == 1 and violations(t, 2, 2, 2, SPEC) == []
    assert t.gm_bytes > tile(256, 512, 256, 2, 2, 2, SPEC).gm_bytes


def test_violations_name_each_broken_constraint():
    import dataclasses

    t = tile(512, 512, 512, 2, 2, 2, SPEC)
    bad = dataclasses.replace(t, baseM=t.baseM + 8, baseK=512, depthA1=1000)
    found = " | ".join(violations(bad, 2, 2, 2, SPEC))
    for what in ("not multiples of 16", "half of L0A", "exceed L1"):
        assert what in found


def test_nothing_fits_is_a_clear_refusal():
    tiny = targets.Target.model_validate(SPEC.model_dump() | {"l0a_bytes": 1024})
    with pytest.raises(NoTiling, match=r"no base tile of a 64x64x64 matmul \(4-byte operands\) "
                                       r"fits the target ascend910b: L0A 1024"):
        tile(64, 64, 64, 4, 4, 4, tiny)
    with pytest.raises(NoTiling, match="K = 0"):
        tile(4, 4, 0, 2, 2, 2, SPEC)
