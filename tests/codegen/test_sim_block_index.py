"""The simulator's cores and system variables as the A2 headers define them
(impl/basic_api/dav_c220/kernel_operator_sys_var_impl.h): a KERNEL_TYPE_MIX_AIC_1_2 launch
runs two vector cores a block, on which GetBlockIdx() is ``block * 2 + sub-block`` and
GetBlockNum() the launch's blocks, plus the block's cube core up to its REGIST_MATMUL_OBJ; a
vector-only launch runs one vector core a block. Two cores writing the same GM bytes, and a
block whose cores reach different Matmul registrations (the cube core's server would wait
forever), are refused."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from graphkernel.codegen.sim.runner import SimulatorError, build, launch

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
UB = 196_352

# A one-fractal product's tiling, valid for the simulator's checks, covering 8 blocks.
TILING = """
    TCubeTiling t{};
    t.usedCoreNum = 8; t.M = t.N = t.Ka = t.Kb = t.singleCoreM = t.singleCoreN = 16;
    t.singleCoreK = t.baseM = t.baseN = t.baseK = 16; t.depthA1 = t.depthB1 = 1;
    t.stepM = t.stepN = t.stepKa = t.stepKb = 1;
"""
MM = """
    Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>,
           MatmulType<TPosition::GM, CubeFormat::ND, half>,
           MatmulType<TPosition::GM, CubeFormat::ND, half>,
           MatmulType<TPosition::GM, CubeFormat::ND, float>> mm;
"""
# Eight int32 at row `row` of out: GetBlockIdx, GetBlockNum, GetSubBlockIdx, GetTaskRatio,
# GetSubBlockNum (then zeros), through UB (the scalar pipe writes it, MTE3 copies it out).
WRITE = """
    TBuf<TPosition::VECCALC> b;
    pipe.InitBuffer(b, 32);
    LocalTensor<int32_t> v = b.Get<int32_t>();
    const int32_t vals[8] = {(int32_t)GetBlockIdx(), (int32_t)GetBlockNum(),
                             (int32_t)GetSubBlockIdx(), (int32_t)GetTaskRatio(),
                             (int32_t)GetSubBlockNum(), 0, 0, 0};
    for (int i = 0; i < 8; ++i) v.SetValue(i, vals[i]);
    TEventID e = pipe.FetchEventID(HardEvent::S_MTE3);
    SetFlag<HardEvent::S_MTE3>(e);
    WaitFlag<HardEvent::S_MTE3>(e);
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer((__gm__ int32_t*)out, 8 * 16);
    DataCopy(g[(uint64_t)(ROW) * 8], v, 8);
"""


def kernel(name: str, kind: str, body: str) -> str:
    return f"""
using namespace matmul;
extern "C" __global__ __aicore__ void {name}(GM_ADDR out, GM_ADDR ws, GM_ADDR tiling) {{
    KERNEL_TASK_TYPE_DEFAULT({kind});
    (void)ws; (void)tiling;
    TPipe pipe;
{body}
}}
static void gk_sim_call_{name}(uint8_t** a) {{ {name}(a[0], a[1], a[2]); }}
GK_SIM_LAUNCHER({name}, 3)
"""


def _mix(row: str, register: str = "REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);"
         ) -> str:
    return TILING + MM + f"    {register}\n    mm.End();\n" + WRITE.replace("ROW", row)


KERNELS = {
    "sv_aiv": ("KERNEL_TYPE_AIV_ONLY", WRITE.replace("ROW", "GetBlockIdx()")),
    "sv_mix": ("KERNEL_TYPE_MIX_AIC_1_2", _mix("GetBlockIdx()")),
    # the old MIX indexing's fault in its plainest form: both vector cores of a block take
    # the block's index as theirs and write the same row
    "sv_mix_by_block": ("KERNEL_TYPE_MIX_AIC_1_2", _mix("GetBlockIdx() / GetTaskRatio()")),
    # only vector core 0 registers: the cube core's server waits for core 1's quit forever
    "sv_mix_one_client": ("KERNEL_TYPE_MIX_AIC_1_2", _mix(
        "GetBlockIdx()", "if (GetSubBlockIdx() == 0) { REGIST_MATMUL_OBJ(&pipe, "
        "GetSysWorkSpacePtr(), mm, &t); } else { return; }")),
    # the cube core skips the registration its vector cores reach (a guard on GetBlockIdx(),
    # which is block on the cube core and block * 2 + sub-block on a vector core)
    "sv_mix_aiv_guard": ("KERNEL_TYPE_MIX_AIC_1_2", TILING + MM + """
    if (GetBlockIdx() < 2) {
        REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
        mm.End();
    }
""" + WRITE.replace("ROW", "GetBlockIdx()")),
    # a vector instruction before the registration: the cube core would run it
    "sv_mix_vector_first": ("KERNEL_TYPE_MIX_AIC_1_2", """
    TBuf<TPosition::VECCALC> d;
    pipe.InitBuffer(d, 256);
    LocalTensor<float> x = d.Get<float>();
    Duplicate(x, 1.0f, 64);
""" + _mix("GetBlockIdx()")),
}


@functools.cache
def _lib():
    return build([kernel(n, k, b) for n, (k, b) in KERNELS.items()])


def _run(name: str, blocks: int) -> np.ndarray:
    out = np.full((16, 8), -1, np.int32)
    ws = np.zeros(1024, np.uint8)
    tiling = np.zeros(8, np.uint8)
    launch(_lib(), name, [out, ws, tiling], blocks, UB)
    return out


def test_a_vector_only_launch_runs_one_vector_core_a_block():
    out = _run("sv_aiv", 3)
    assert out[:3, :5].tolist() == [[b, 3, 0, 1, 1] for b in range(3)]
    assert (out[3:] == -1).all()


def test_a_mix_launch_runs_two_vector_cores_a_block_with_the_headers_indices():
    """GetBlockIdx() on a vector core is block * GetTaskRatio() + GetSubBlockIdx(): the six
    vector cores of a 3-block launch are 0..5, GetBlockNum() is 3, the ratio 2."""
    out = _run("sv_mix", 3)
    assert out[:6, :5].tolist() == [[i, 3, i % 2, 2, 2] for i in range(6)]
    assert (out[6:] == -1).all()


@pytest.mark.parametrize(("name", "message"), [
    ("sv_mix_by_block", r"block 0 \(vector core 1\) writes byte 0 of argument 0, which block 0 "
                        r"\(vector core 0\) wrote in this launch \(two cores write the same"),
    ("sv_mix_one_client", r"block 0 of a KERNEL_TYPE_MIX_AIC_1_2 launch: its cube core "
                          r"registers Matmul objects at line \d+, its vector cores at line "
                          r"\d+ and none"),
    ("sv_mix_aiv_guard", r"block 1 of a KERNEL_TYPE_MIX_AIC_1_2 launch: its cube core "
                         r"registers Matmul objects at line \d+, its vector cores at none "
                         r"and none"),
    ("sv_mix_vector_first", "a vector instruction on the cube core"),
])
def test_a_mix_kernel_breaking_the_device_rules_is_refused(name, message):
    with pytest.raises(SimulatorError, match=message):
        _run(name, 3)
