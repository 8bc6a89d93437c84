"""The simulator's UB-to-UB ``Gather`` (the count form of the A2 headers): each destination
element is the source element at a byte offset read from a uint32 table. With a table of
transposed places it is an in-UB transpose of float32 data (the headers' ``Transpose`` takes
only 16x16 blocks of 2-byte types). Checked strictly: offsets in bytes that are whole elements
inside the source, an aligned base offset, a count within both operands and the repeat
limit, no destination overlapping an operand; a kernel breaking a rule is refused naming its
line."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from graphkernel.codegen.sim.runner import SimulatorError, build, launch

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
UB = 196_352
R, C = 8, 16  # a [R, C] tile transposed to [C, R]


def gather_kernel(name: str, ctype: str, n: int, count: int, base: int = 0,
                  dst_at: str = "bd") -> str:
    """x (n of ctype) and a table (n of uint32) -> UB; y[i] = x at byte base + table[i]
    (``count`` elements, written to buffer ``dst_at``); y -> GM."""
    return f"""
extern "C" __global__ __aicore__ void {name}(GM_ADDR x, GM_ADDR t, GM_ADDR y) {{
    GlobalTensor<{ctype}> gx; gx.SetGlobalBuffer((__gm__ {ctype}*)x, {n});
    GlobalTensor<uint32_t> gt; gt.SetGlobalBuffer((__gm__ uint32_t*)t, {n});
    GlobalTensor<{ctype}> gy; gy.SetGlobalBuffer((__gm__ {ctype}*)y, {n});
    TPipe pipe;
    TBuf<TPosition::VECCALC> bs, bt, bd;
    pipe.InitBuffer(bs, {n} * sizeof({ctype}));
    pipe.InitBuffer(bt, {n} * sizeof(uint32_t));
    pipe.InitBuffer(bd, {n} * sizeof({ctype}));
    LocalTensor<{ctype}> ls = bs.Get<{ctype}>();
    LocalTensor<uint32_t> lt = bt.Get<uint32_t>();
    LocalTensor<{ctype}> ld = {dst_at}.Get<{ctype}>();
    DataCopy(ls, gx, {n});
    DataCopy(lt, gt, {n});
    TEventID e = pipe.FetchEventID(HardEvent::MTE2_V);
    SetFlag<HardEvent::MTE2_V>(e); WaitFlag<HardEvent::MTE2_V>(e);
    Gather(ld, ls, lt, {base}, {count});
    TEventID f = pipe.FetchEventID(HardEvent::V_MTE3);
    SetFlag<HardEvent::V_MTE3>(f); WaitFlag<HardEvent::V_MTE3>(f);
    DataCopy(gy, ld, {n});
}}
static void gk_sim_call_{name}(uint8_t** a) {{ {name}(a[0], a[1], a[2]); }}
GK_SIM_LAUNCHER({name}, 3)
"""


KERNELS = {  # name -> (C type, elements, count, base offset, destination buffer)
    "gather_f32": ("float", R * C, R * C, 0, "bd"),
    "gather_f16": ("half", 16 * 16, 16 * 16, 0, "bd"),
    "gather_base": ("float", R * C, R * C, 6, "bd"),
    "gather_count": ("float", R * C, R * C + 8, 0, "bd"),
    "gather_inplace": ("float", R * C, R * C, 0, "bs"),
    "gather_i64": ("int64_t", R * C, R * C, 0, "bd"),
}
LINE = 18  # the Gather call's line in gather_kernel


@functools.cache
def _lib():
    return build([gather_kernel(k, *v) for k, v in KERNELS.items()])


def transposed_table(rows: int, cols: int, itemsize: int) -> np.ndarray:
    """Byte offsets such that out[j, i] = x[i, j] for x of [rows, cols]: out is [cols, rows]."""
    j, i = np.meshgrid(np.arange(cols), np.arange(rows), indexing="ij")
    return ((i * cols + j) * itemsize).astype(np.uint32).reshape(-1)


def _run(name: str, x: np.ndarray, table: np.ndarray) -> np.ndarray:
    y = np.zeros_like(x)
    launch(_lib(), name, [x, table, y], 1, UB)
    return y


def test_a_float32_tile_is_transposed_in_ub():
    x = np.arange(R * C, dtype=np.float32) * 0.5 - 3
    y = _run("gather_f32", x, transposed_table(R, C, 4))
    np.testing.assert_array_equal(y.reshape(C, R), x.reshape(R, C).T)


def test_a_half_tile_is_transposed_in_ub():
    x = (np.arange(256) % 97).astype(np.float16)
    y = _run("gather_f16", x, transposed_table(16, 16, 2))
    np.testing.assert_array_equal(y.reshape(16, 16), x.reshape(16, 16).T)


def _refused(name: str, table: np.ndarray, dtype=np.float32) -> str:
    n = KERNELS[name][1]
    with pytest.raises(SimulatorError) as e:
        _run(name, np.zeros(n, dtype), table)
    text = str(e.value)
    assert text.startswith(f"{name}: line {LINE}: "), text
    return text


def test_an_offset_inside_an_element_is_refused():
    table = transposed_table(R, C, 4)
    table[5] += 2  # half way into a float
    assert "Gather offset 322 (element 5) is not a multiple of 4 bytes" in _refused(
        "gather_f32", table)


def test_an_offset_outside_the_source_is_refused():
    table = transposed_table(R, C, 4)
    table[-1] = R * C * 4  # one element past the end of the source buffer
    assert "lies outside src's 512 bytes" in _refused("gather_f32", table)


def test_a_misaligned_base_offset_is_refused():
    text = _refused("gather_base", transposed_table(R, C, 4))
    assert "srcBaseOffset 6 is not a multiple of 4" in text


def test_a_count_beyond_the_operands_is_refused():
    text = _refused("gather_count", transposed_table(R, C, 4))
    assert "Gather count 136 exceeds the elements of src (128)" in text


def test_a_destination_over_its_source_is_refused():
    text = _refused("gather_inplace", transposed_table(R, C, 4))
    assert "destination sharing UB with an operand" in text


def test_an_eight_byte_type_is_refused():
    with pytest.raises(SimulatorError) as e:
        _run("gather_i64", np.zeros(R * C, np.int64), transposed_table(R, C, 8))
    assert "Gather" in str(e.value) and "int64_t" in str(e.value)
