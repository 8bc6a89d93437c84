// hand-written kernels exercising the simulator's Matmul model
struct MmCase {
    TCubeTiling t;
    int32_t coresM, coresN, transA, transB, mode, tailM, tailN, pad;
};
enum { ITERATE = 1, BIAS = 2, AFTER_END = 4, SECOND = 8, SMALL_UB = 16, TAIL_OOB = 32,
       ORG_SAME = 64, ORG_SHORT = 128, ORG_LATE = 256 };

template <typename T, typename C, typename BiasT>
void mm_case(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws, GM_ADDR tiling) {
    using namespace matmul;
    MmCase k;
    std::memcpy(&k, tiling, sizeof(k));
    (void)ws;  // the system workspace comes from the launch
    TPipe pipe;
    GlobalTensor<T> ga, gb;
    GlobalTensor<C> gc;
    GlobalTensor<BiasT> gbias;
    ga.SetGlobalBuffer((__gm__ T*)a, (uint64_t)k.t.M * k.t.Ka);
    gb.SetGlobalBuffer((__gm__ T*)b, (uint64_t)k.t.Kb * k.t.N);
    gc.SetGlobalBuffer((__gm__ C*)c, (uint64_t)k.t.M * k.t.N);
    gbias.SetGlobalBuffer((__gm__ BiasT*)bias, (uint64_t)k.t.N);
    using AT = MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
    using BT = MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
    using CT_ = MatmulType<TPosition::GM, CubeFormat::ND, C>;
    using BiasT_ = MatmulType<TPosition::GM, CubeFormat::ND, BiasT>;
    Matmul<AT, BT, CT_, BiasT_> mm;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &k.t);
    TQue<QuePosition::VECOUT, 2> outQ;
    const uint32_t tile = k.t.baseM * k.t.baseN * sizeof(C);
    pipe.InitBuffer(outQ, 2, (k.mode & SMALL_UB) ? tile / 2 : tile);
    int32_t i = GetBlockIdx() / k.coresN, j = GetBlockIdx() % k.coresN;
    int32_t m0 = i * k.t.singleCoreM, n0 = j * k.t.singleCoreN;
    int32_t tm = std::min(k.t.singleCoreM, k.t.M - m0), tn = std::min(k.t.singleCoreN, k.t.N - n0);
    if (k.mode & TAIL_OOB) tm = k.t.singleCoreM;  // the last core's block runs past M
    uint64_t offA = k.transA ? m0 : (uint64_t)m0 * k.t.Ka;
    uint64_t offB = k.transB ? (uint64_t)n0 * k.t.Kb : n0;
    // the original shapes (row pitches): as the tiling's, or A's rows shorter than K
    if (k.mode & ORG_SAME) mm.SetOrgShape(k.t.M, k.t.N, k.t.Ka, k.t.Kb, k.t.N);
    if (k.mode & ORG_SHORT) mm.SetOrgShape(k.t.M, k.t.N, k.t.Ka / 2, k.t.Kb, k.t.N);
    mm.SetTensorA(ga[offA], k.transA);
    mm.SetTensorB(gb[offB], k.transB);
    if (k.mode & ORG_LATE) mm.SetOrgShape(k.t.M, k.t.N, k.t.Ka, k.t.Kb);  // after the tensors
    if (k.mode & BIAS) mm.SetBias(gbias[n0]); else mm.DisableBias();
    mm.SetTail(tm, tn);
    if (!(k.mode & ITERATE)) {
        mm.IterateAll(gc[(uint64_t)m0 * k.t.N + n0]);
    } else {
        // tiles in the tiling's order, copied out row by row at their place in C
        const int32_t tilesM = (tm + k.t.baseM - 1) / k.t.baseM;
        const int32_t tilesN = (tn + k.t.baseN - 1) / k.t.baseN;
        int32_t idx = 0;
        while (mm.Iterate()) {
            int32_t ti = k.t.iterateOrder == 0 ? idx % tilesM : idx / tilesN;
            int32_t tj = k.t.iterateOrder == 0 ? idx / tilesM : idx % tilesN;
            ++idx;
            LocalTensor<C> out = outQ.AllocTensor<C>();
            mm.GetTensorC(out);
            Muls(out, out, (C)2, k.t.baseM * k.t.baseN);  // an epilogue on the tile
            outQ.EnQue(out);
            LocalTensor<C> o = outQ.DeQue<C>();
            int32_t rows = std::min(k.t.baseM, tm - ti * k.t.baseM);
            int32_t cols = std::min(k.t.baseN, tn - tj * k.t.baseN);
            DataCopyExtParams p{(uint16_t)rows, (uint32_t)(cols * sizeof(C)),
                                (uint32_t)((k.t.baseN * sizeof(C) - (cols * sizeof(C) + 31) / 32 * 32) / 32),
                                (uint32_t)((k.t.N - cols) * sizeof(C)), 0};
            DataCopyPad(gc[(uint64_t)(m0 + ti * k.t.baseM) * k.t.N + n0 + tj * k.t.baseN], o, p);
            outQ.FreeTensor(o);
        }
    }
    if (k.mode & SECOND) {
        Matmul<AT, BT, CT_, BiasT_> other;
        REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), other, &k.t);
        other.SetTensorA(ga, false);
    }
    mm.End();
    if (k.mode & AFTER_END) mm.Iterate();
}
extern "C" __global__ __aicore__ void mm_f16(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws, GM_ADDR t) { mm_case<half, half, float>(a, b, bias, c, ws, t); }
extern "C" __global__ __aicore__ void mm_bf16(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws, GM_ADDR t) { mm_case<bfloat16_t, float, float>(a, b, bias, c, ws, t); }
extern "C" __global__ __aicore__ void mm_f32(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws, GM_ADDR t) { mm_case<float, float, float>(a, b, bias, c, ws, t); }
extern "C" __global__ __aicore__ void mm_i8(GM_ADDR a, GM_ADDR b, GM_ADDR bias, GM_ADDR c, GM_ADDR ws, GM_ADDR t) { mm_case<int8_t, int32_t, int32_t>(a, b, bias, c, ws, t); }
