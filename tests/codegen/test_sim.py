"""The CPU simulator: a hand-written Ascend C kernel runs and matches numpy; deliberately
broken kernels are caught with the documented errors naming kernel and line."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel.codegen.sim.runner import SimulatorError, build, launch

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
UB = 196_608

# z = exp(x) + y over n floats: tiles of TILE elements, double-buffered queues, the tile loop
# split over cores, tails moved with DataCopyPad.
ADD_EXP = r"""
struct AddExpTiling { uint32_t n; uint32_t per_core; uint32_t tile; };

class AddExp {
public:
    __aicore__ void Init(GM_ADDR x, GM_ADDR y, GM_ADDR z, const AddExpTiling& t) {
        t_ = t;
        begin_ = GetBlockIdx() * t.per_core;
        len_ = begin_ >= t.n ? 0 : (t.n - begin_ < t.per_core ? t.n - begin_ : t.per_core);
        xg_.SetGlobalBuffer((__gm__ float*)x, t.n);
        yg_.SetGlobalBuffer((__gm__ float*)y, t.n);
        zg_.SetGlobalBuffer((__gm__ float*)z, t.n);
        pipe_.InitBuffer(inx_, 2, t.tile * sizeof(float));
        pipe_.InitBuffer(iny_, 2, t.tile * sizeof(float));
        pipe_.InitBuffer(out_, 2, t.tile * sizeof(float));
    }
    __aicore__ void Process() {
        for (uint32_t off = 0; off < len_; off += t_.tile) {
            uint32_t cnt = len_ - off < t_.tile ? len_ - off : t_.tile;
            CopyIn(off, cnt); Compute(cnt); CopyOut(off, cnt);
        }
    }
private:
    __aicore__ void CopyIn(uint32_t off, uint32_t cnt) {
        LocalTensor<float> a = inx_.AllocTensor<float>();
        LocalTensor<float> b = iny_.AllocTensor<float>();
        DataCopyExtParams p{1, cnt * (uint32_t)sizeof(float), 0, 0, 0};
        DataCopyPadExtParams<float> pad{false, 0, 0, 0.0f};
        DataCopyPad(a, xg_[begin_ + off], p, pad);
        DataCopyPad(b, yg_[begin_ + off], p, pad);
        inx_.EnQue(a); iny_.EnQue(b);
    }
    __aicore__ void Compute(uint32_t cnt) {
        LocalTensor<float> a = inx_.DeQue<float>();
        LocalTensor<float> b = iny_.DeQue<float>();
        LocalTensor<float> c = out_.AllocTensor<float>();
        Exp(c, a, cnt);
        PipeBarrier<PIPE_V>();  // Add reads what Exp wrote
        Add(c, c, b, cnt);
        out_.EnQue(c);
        inx_.FreeTensor(a); iny_.FreeTensor(b);
    }
    __aicore__ void CopyOut(uint32_t off, uint32_t cnt) {
        LocalTensor<float> c = out_.DeQue<float>();
        DataCopyExtParams p{1, cnt * (uint32_t)sizeof(float), 0, 0, 0};
        DataCopyPad(zg_[begin_ + off], c, p);
        out_.FreeTensor(c);
    }
    AddExpTiling t_;
    uint32_t begin_ = 0, len_ = 0;
    TPipe pipe_;
    TQue<QuePosition::VECIN, 2> inx_, iny_;
    TQue<QuePosition::VECOUT, 2> out_;
    GlobalTensor<float> xg_, yg_, zg_;
};

extern "C" __global__ __aicore__ void add_exp(GM_ADDR x, GM_ADDR y, GM_ADDR z, GM_ADDR tiling) {
    AddExpTiling t;
    std::memcpy(&t, tiling, sizeof(t));
    AddExp k;
    k.Init(x, y, z, t);
    k.Process();
}
static void gk_sim_call_add_exp(uint8_t** a) { add_exp(a[0], a[1], a[2], a[3]); }
GK_SIM_LAUNCHER(add_exp, 4)
"""


def run_add_exp(n: int, cores: int, tile: int):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    z = np.zeros(n, np.float32)
    per_core = -(-n // cores)
    per_core = -(-per_core // 8) * 8  # each core starts 32-byte aligned in GM
    tiling = np.array([n, per_core, tile], np.uint32)
    counts = launch(build([ADD_EXP]), "add_exp", [x, y, z, tiling], cores, UB)
    return x, y, z, counts.gm_read, counts.gm_written


@pytest.mark.parametrize("n,cores,tile", [(4096, 48, 512), (1000, 8, 64), (37, 48, 64),
                                          (100_000, 48, 4096)])
def test_hand_written_kernel_matches_numpy_with_ideal_traffic(n, cores, tile):
    x, y, z, read, written = run_add_exp(n, cores, tile)
    np.testing.assert_allclose(z, np.exp(x) + y, rtol=1e-6, atol=1e-6)
    assert (read, written) == (2 * 4 * n, 4 * n)  # every byte in once, out once


def test_reads_are_counted_per_argument():
    """Each GM argument's bytes read, in argument order: x and y once each, nothing of the
    output (the tiling struct is copied by the entry, not through the GM API); a launch with
    a different number of arguments than the kernel takes is refused."""
    n = 1000
    x, y, z = (np.ones(n, np.float32) for _ in range(3))
    lib = build([ADD_EXP])
    counts = launch(lib, "add_exp", [x, y, z, np.array([n, 128, 64], np.uint32)], 8, UB)
    assert counts.reads == (4 * n, 4 * n, 0, 0)
    assert sum(counts.reads) == counts.gm_read
    with pytest.raises(SimulatorError, match="add_exp: the kernel takes 4 GM arguments, 3"):
        launch(lib, "add_exp", [x, y, z], 1, UB)


def test_gm_buffers_are_the_arrays_own_memory():
    """A 0-d view (a Squeeze of a [1, 1] array) is one contiguous element: the kernel reads
    and writes it in place; a strided array is refused, naming the kernel and the buffer."""
    lib = build([ADD_EXP])
    xs, ys, zs = (np.full((1, 1), v, np.float32) for v in (0.5, 2.0, 0.0))
    x, y, z = (a.squeeze() for a in (xs, ys, zs))  # views: their base is the [1, 1] array
    launch(lib, "add_exp", [x, y, z, np.array([1, 8, 64], np.uint32)], 1, UB)
    np.testing.assert_allclose(zs, np.exp(0.5) + 2.0, rtol=1e-6)  # written through the view
    strided = np.zeros(128, np.float32)[::2]
    with pytest.raises(SimulatorError, match=r"add_exp: GM buffer 1 .* must be a C-contiguous"):
        launch(lib, "add_exp", [np.zeros(64, np.float32), strided, np.zeros(64, np.float32),
                                np.array([64, 64, 64], np.uint32)], 1, UB)


def broken(body: str, name: str) -> str:
    return (f'extern "C" __global__ __aicore__ void {name}(GM_ADDR x) {{\n'
            f"    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);\n"
            f"    TPipe pipe; TQue<QuePosition::VECIN, 2> q;\n{body}\n}}\n"
            f"static void gk_sim_call_{name}(uint8_t** a) {{ {name}(a[0]); }}\n"
            f"GK_SIM_LAUNCHER({name}, 1)\n")


BROKEN = {
    "ub_overflow": ("    pipe.InitBuffer(q, 2, 100000);", "UB overflow: InitBuffer needs 200000"),
    "misaligned_copy": ("    pipe.InitBuffer(q, 1, 256);\n"
                        "    LocalTensor<float> t = q.AllocTensor<float>();\n"
                        "    DataCopy(t, g, 7);", "DataCopy of 28 bytes is not a multiple of 32"),
    "use_after_free": ("    pipe.InitBuffer(q, 1, 256);\n"
                       "    LocalTensor<float> t = q.AllocTensor<float>();\n"
                       "    q.FreeTensor(t);\n    Duplicate(t, 1.0f, 8);",
                       "use of a LocalTensor after FreeTensor"),
    "gm_out_of_bounds": ("    pipe.InitBuffer(q, 1, 512);\n"
                         "    LocalTensor<float> t = q.AllocTensor<float>();\n"
                         "    DataCopy(t, g[32], 64);", "GM access [32, 96) is out of bounds"),
    "queue_depth": ("    pipe.InitBuffer(q, 3, 64);\n"
                    "    q.EnQue(q.AllocTensor<float>()); q.EnQue(q.AllocTensor<float>());\n"
                    "    q.EnQue(q.AllocTensor<float>());", "EnQue beyond the queue depth 2"),
    "pad_limits": ("    pipe.InitBuffer(q, 1, 512);\n"
                   "    LocalTensor<float> t = q.AllocTensor<float>();\n"
                   "    DataCopyPad(t, g, DataCopyExtParams{5000, 4, 0, 0, 0},\n"
                   "                DataCopyPadExtParams<float>{});",
                   "blockCount 5000 is outside 1..4095"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_kernels_are_caught_with_kernel_and_line(name):
    body, message = BROKEN[name]
    src = broken(body, name)
    lib = build([src])
    with pytest.raises(SimulatorError) as e:
        launch(lib, name, [np.zeros(64, np.float32)], 1, UB)
    text = str(e.value)
    assert text.startswith(f"{name}: line ") and message in text, text
    # the line of the offending call in the kernel's own source
    line = int(text.split("line ")[1].split(":")[0])
    offending = next(i for i, ln in enumerate(src.splitlines(), start=1)
                     if ln.strip() == body.strip().splitlines()[-1].strip())
    if name != "pad_limits":  # a call spread over two lines reports the first or the last
        assert line == offending, (line, offending)


def test_a_build_split_into_parallel_parts_runs_the_same_kernels():
    """Sixteen kernels, built by one g++ run or by two in parallel (``--jobs``): every kernel
    is found and computes the same thing."""
    sources = [ADD_EXP.replace("add_exp", f"add_exp_{i}").replace("AddExp", f"AddExp{i}")
               for i in range(16)]
    one, two = build(sources, jobs=1), build(sources, jobs=2)
    assert len(one.parts) == 1 and len(two.parts) == 2
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    y = np.linspace(2, 0, 256, dtype=np.float32)
    tiling = np.array([256, 256, 64], np.uint32)
    for i in (0, 7, 15):
        outs = []
        for lib in (one, two):
            z = np.zeros(256, np.float32)
            launch(lib, f"add_exp_{i}", [x, y, z, tiling], 1, UB)
            outs.append(z)
        np.testing.assert_array_equal(outs[0], outs[1])
        np.testing.assert_allclose(outs[0], np.exp(x) + y, rtol=1e-6)
