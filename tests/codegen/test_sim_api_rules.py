"""The simulator knows the real Ascend C API's type rules (dav-c220, the A2/A3 vector unit):
which Cast pairs exist with which round modes, which element types each vector instruction
takes, and the kernel types a kernel declares. A broken kernel is refused naming its line; the
allowed forms compute what the device computes."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from graphkernel.codegen.sim.runner import SimulatorError, build, launch

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
UB = 196_352
N = 64  # elements per case: whole 32-byte blocks of every type

C_TYPES = {"f32": "float", "f16": "half", "bf16": "bfloat16_t", "u8": "uint8_t",
           "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t"}
NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "u8": np.uint8,
      "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64}


def cast_kernel(name: str, src: str, dst: str, mode: str) -> str:
    """x (N of src) -> GM -> UB, Cast to dst with RoundMode::mode, UB -> y (N of dst)."""
    s, d = C_TYPES[src], C_TYPES[dst]
    return f"""
extern "C" __global__ __aicore__ void {name}(GM_ADDR x, GM_ADDR y) {{
    GlobalTensor<{s}> gx; gx.SetGlobalBuffer((__gm__ {s}*)x, {N});
    GlobalTensor<{d}> gy; gy.SetGlobalBuffer((__gm__ {d}*)y, {N});
    TPipe pipe;
    TBuf<TPosition::VECCALC> bs, bd;
    pipe.InitBuffer(bs, {N} * sizeof({s}));
    pipe.InitBuffer(bd, {N} * sizeof({d}));
    LocalTensor<{s}> ls = bs.Get<{s}>();
    LocalTensor<{d}> ld = bd.Get<{d}>();
    DataCopy(ls, gx, {N});
    TEventID e = pipe.FetchEventID(HardEvent::MTE2_V);
    SetFlag<HardEvent::MTE2_V>(e); WaitFlag<HardEvent::MTE2_V>(e);
    Cast(ld, ls, RoundMode::{mode}, {N});
    TEventID f = pipe.FetchEventID(HardEvent::V_MTE3);
    SetFlag<HardEvent::V_MTE3>(f); WaitFlag<HardEvent::V_MTE3>(f);
    DataCopy(gy, ld, {N});
}}
static void gk_sim_call_{name}(uint8_t** a) {{ {name}(a[0], a[1]); }}
GK_SIM_LAUNCHER({name}, 2)
"""


# (source, destination, mode) -> the refusal; the devkit's CheckCastDatatype and each pair's
# round modes (impl/basic_api/dav_c220/kernel_operator_vec_vconv_impl.h)
REFUSED_CASTS = {
    ("u8", "f32", "CAST_NONE"): "Cast from uint8_t to float: the vector unit has no such cast "
                                "(from uint8_t it casts to half)",
    ("f32", "u8", "CAST_RINT"): "Cast from float to uint8_t: the vector unit has no such cast "
                                "(from float it casts to half, float, bfloat16_t, int16_t, "
                                "int32_t, int64_t)",
    ("bf16", "u8", "CAST_RINT"): "Cast from bfloat16_t to uint8_t: the vector unit has no such",
    ("f32", "f32", "CAST_NONE"): "Cast from float to float with RoundMode::CAST_NONE: that "
                                 "cast takes CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, "
                                 "CAST_TRUNC",
    ("f32", "bf16", "CAST_NONE"): "Cast from float to bfloat16_t with RoundMode::CAST_NONE",
    ("f16", "i32", "CAST_NONE"): "Cast from half to int32_t with RoundMode::CAST_NONE",
    ("f16", "f32", "CAST_RINT"): "Cast from half to float with RoundMode::CAST_RINT: that cast "
                                 "takes CAST_NONE",
    ("i32", "f16", "CAST_NONE"): "Cast from int32_t to half: the vector unit has no such cast",
}
# allowed casts and what they give (numpy's rounding of the same values)
ALLOWED_CASTS = {
    ("u8", "f16", "CAST_NONE"): lambda x: x.astype(np.float16),
    ("f16", "f32", "CAST_NONE"): lambda x: x.astype(np.float32),
    ("f16", "u8", "CAST_RINT"): lambda x: np.rint(x).astype(np.uint8),
    ("f32", "f16", "CAST_RINT"): lambda x: x.astype(np.float16),
    ("f32", "bf16", "CAST_RINT"): lambda x: x.astype(ml_dtypes.bfloat16),
    ("f32", "f32", "CAST_FLOOR"): np.floor,
    ("f32", "i32", "CAST_TRUNC"): lambda x: np.trunc(x).astype(np.int32),
    ("bf16", "f32", "CAST_NONE"): lambda x: x.astype(np.float32),
}


def _name(key: tuple[str, str, str]) -> str:
    return "cast_" + "_".join(key).lower()


@functools.cache
def _casts():
    return build([cast_kernel(_name(k), *k) for k in [*REFUSED_CASTS, *ALLOWED_CASTS]])


def _input(src: str) -> np.ndarray:
    if src in ("u8", "i8", "i16", "i32", "i64"):
        return (np.arange(N) % 4).astype(NP[src])  # 0..3: bytes of bools and small integers
    return np.linspace(-3.7, 3.7, N).astype(NP[src])


@pytest.mark.parametrize("key", list(REFUSED_CASTS), ids=["-".join(k) for k in REFUSED_CASTS])
def test_a_cast_the_device_does_not_have_is_refused_with_its_line(key):
    src, dst, _ = key
    y = np.zeros(N, NP[dst])
    with pytest.raises(SimulatorError) as e:
        launch(_casts(), _name(key), [_input(src), y], 1, UB)
    text = str(e.value)
    assert text.startswith(f"{_name(key)}: line 14: ") and REFUSED_CASTS[key] in text, text


@pytest.mark.parametrize("key", list(ALLOWED_CASTS), ids=["-".join(k) for k in ALLOWED_CASTS])
def test_the_casts_the_device_has_compute_what_it_computes(key):
    src, dst, _ = key
    x = _input(src)
    y = np.zeros(N, NP[dst])
    launch(_casts(), _name(key), [x, y], 1, UB)
    np.testing.assert_array_equal(y, ALLOWED_CASTS[key](x))


def test_a_bool_byte_reaches_float_through_half():
    """The route bool data must take: uint8 -> half -> float is exact for 0/1 (and small
    integers); the direct cast does not exist."""
    x = _input("u8")
    h, f = np.zeros(N, np.float16), np.zeros(N, np.float32)
    lib = _casts()
    launch(lib, _name(("u8", "f16", "CAST_NONE")), [x, h], 1, UB)
    launch(lib, _name(("f16", "f32", "CAST_NONE")), [h, f], 1, UB)
    np.testing.assert_array_equal(f, x.astype(np.float32))


def op_kernel(name: str, ctype: str, body: str, kernel_type: str = "") -> str:
    """A kernel running ``body`` on UB tensors a, b, c of ``ctype`` (N elements each, zeros)
    and a byte mask m."""
    declare = f"    KERNEL_TASK_TYPE_DEFAULT({kernel_type});\n" if kernel_type else ""
    return f"""
extern "C" __global__ __aicore__ void {name}(GM_ADDR x) {{
{declare}    (void)x;
    TPipe pipe;
    TBuf<TPosition::VECCALC> ba, bb, bc, bm, bw;
    pipe.InitBuffer(ba, 1024); pipe.InitBuffer(bb, 1024); pipe.InitBuffer(bc, 1024);
    pipe.InitBuffer(bm, 256); pipe.InitBuffer(bw, 1024);
    LocalTensor<{ctype}> a = ba.Get<{ctype}>(), b = bb.Get<{ctype}>(), c = bc.Get<{ctype}>();
    LocalTensor<uint8_t> m = bm.Get<uint8_t>(), w = bw.Get<uint8_t>();
    (void)a; (void)b; (void)c; (void)m; (void)w;
    {body}
}}
static void gk_sim_call_{name}(uint8_t** a) {{ {name}(a[0]); }}
GK_SIM_LAUNCHER({name}, 1)
"""


# name -> (element type, the call, the refusal): each instruction on a type its dav-c220
# implementation does not take (its static_asserts and the API's type checks)
REFUSED_OPS = {
    "exp_bf16": ("bfloat16_t", "Exp(c, a, 64);",
                 "Exp on bfloat16_t: the vector unit's Exp takes half, float"),
    "div_i32": ("int32_t", "Div(c, a, b, 64);", "Div on int32_t: the vector unit's Div takes "
                                               "half, float"),
    "add_u8": ("uint8_t", "Add(c, a, b, 64);", "Add on uint8_t: the vector unit's Add takes "
                                              "half, float, int16_t, int32_t"),
    "muls_bf16": ("bfloat16_t", "Muls(c, a, bfloat16_t(2.0f), 64);",
                  "Muls on bfloat16_t: the vector unit's Muls takes half, float, int16_t, "
                  "int32_t"),
    "max_repeat_bf16": ("bfloat16_t", "Max(c, a, b, 64, 1, BinaryRepeatParams());",
                        "Max on bfloat16_t"),
    "relu_i16": ("int16_t", "Relu(c, a, 64);", "Relu on int16_t: the vector unit's Relu takes "
                                              "half, float, int32_t"),
    "compare_lt_i32": ("int32_t", "Compare(m, a, b, CMPMODE::LT, 64);",
                       "Compare on int32_t: the vector unit's Compare takes half, float"),
    "select_i32": ("int32_t", "Select(c, m, a, b, SELMODE::VSEL_TENSOR_TENSOR_MODE, 64);",
                   "Select on int32_t: the vector unit's Select takes half, float"),
    "duplicate_u8": ("uint8_t", "Duplicate(c, (uint8_t)1, 64);",
                     "Duplicate on uint8_t: the vector unit's Duplicate takes half, bfloat16_t, "
                     "int16_t, uint16_t, int32_t, uint32_t, float"),
    "brcb_u8": ("uint8_t", "Brcb(c, a, 1, BrcbRepeatParams(1, 8));",
                "Brcb on uint8_t: the vector unit's Brcb takes int16_t, uint16_t, int32_t"),
    "reduce_sum_i32": ("int32_t", "ReduceSum(c, a, b, 64);",
                       "ReduceSum on int32_t: the vector unit's ReduceSum takes half, float"),
    "whole_reduce_i16": ("int16_t", "WholeReduceSum(c, a, 64, 1, 1, 1, 8);",
                         "WholeReduceSum on int16_t"),
    "sigmoid_bf16": ("bfloat16_t", "Sigmoid(c, a, w, 64);",
                     "Sigmoid on bfloat16_t: the vector unit's Sigmoid takes half, float"),
}
# the same instructions on types they take run
ALLOWED_OPS = {
    "compare_eq_i32": ("int32_t", "Compare(m, a, b, CMPMODE::EQ, 64);"),
    "duplicate_bf16": ("bfloat16_t", "Duplicate(c, bfloat16_t(1.0f), 64);"),
    "add_i16": ("int16_t", "Add(c, a, b, 64);"),
    "brcb_f16": ("half", "Brcb(c, a, 1, BrcbRepeatParams(1, 8));"),
}
KERNEL_TYPES = {
    "aic_only_vector": ("float", "Exp(c, a, 64);", "KERNEL_TYPE_AIC_ONLY",
                        "a vector instruction in a kernel declared KERNEL_TYPE_AIC_ONLY"),
}


@functools.cache
def _ops():
    srcs = [op_kernel(k, t, body) for k, (t, body, _) in REFUSED_OPS.items()]
    srcs += [op_kernel(k, t, body) for k, (t, body) in ALLOWED_OPS.items()]
    srcs += [op_kernel(k, t, body, kt) for k, (t, body, kt, _) in KERNEL_TYPES.items()]
    srcs.append(op_kernel("aiv_only_vector", "float", "Exp(c, a, 64);", "KERNEL_TYPE_AIV_ONLY"))
    return build(srcs)


@pytest.mark.parametrize("name", sorted(REFUSED_OPS))
def test_an_instruction_on_a_type_it_does_not_take_is_refused(name):
    _, body, message = REFUSED_OPS[name]
    with pytest.raises(SimulatorError) as e:
        launch(_ops(), name, [np.zeros(8, np.float32)], 1, UB)
    text = str(e.value)
    line = op_kernel(name, *REFUSED_OPS[name][:2]).splitlines().index(f"    {body}") + 1
    assert text.startswith(f"{name}: line {line}: ") and message in text, text


@pytest.mark.parametrize("name", sorted(ALLOWED_OPS))
def test_the_types_an_instruction_takes_run(name):
    launch(_ops(), name, [np.zeros(8, np.float32)], 1, UB)


def test_a_kernel_type_excludes_the_other_cores_instructions():
    with pytest.raises(SimulatorError, match=KERNEL_TYPES["aic_only_vector"][3]):
        launch(_ops(), "aic_only_vector", [np.zeros(8, np.float32)], 1, UB)
    launch(_ops(), "aiv_only_vector", [np.zeros(8, np.float32)], 1, UB)  # the vector cores'
