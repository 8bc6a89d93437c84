// graphkernel's clean-room model of the Matmul high-level API subset its generator emits.
//
// Written from the documented semantics (the project's Matmul reference), not from vendor
// code. Included by ascendc_sim.h. What it models:
//   - REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &tiling) registers an object with a
//     TCubeTiling, as the devkit's Matmul examples do: the system workspace is the one the
//     launch provides (GetSysWorkSpacePtr(); SetSysWorkspace is deprecated in the API and
//     refused here), and every registered object calls End() before the kernel returns (in
//     a MIX kernel the cube side serves the vector side's requests until End). The tiling
//     is checked against the A2 cube core's limits: fractal-aligned base
//     sizes, baseM*baseK*sizeof(A) <= L0A/2, baseK*baseN*sizeof(B) <= L0B/2 (double
//     buffered), baseM*baseN*4 <= L0C, the L1 depths (and the bias row) within L1, K not
//     split over cores;
//   - SetOrgShape(orgM, orgN, orgKa, orgKb, orgKc): the operands' and C's row pitches (before
//     SetTensorA/SetTensorB; each at least the block's row, so rows never overlap);
//   - SetTensorA/SetTensorB (isTrans only where the MatmulType declares it), SetBias (fp32)
//     or DisableBias, SetTail, then IterateAll(gmC) or `while (Iterate()) GetTensorC(ub)`,
//     and End. Batches are the kernel's loop: new tensors per batch element, End once;
//   - products of fp16/bf16 (or fp32) accumulated in fp32, int8 in int32, the bias added in
//     the accumulator, converted to C's type on the way out (round to nearest);
//   - operands in GM, row-major (ND) with the row pitches of the tiling's whole problem: A
//     [M, Ka] (transposed: [Ka, M]), B [Kb, N] (transposed: [N, Kb]), C [M, N], or those
//     SetOrgShape gave;
//   - the L1: a panel (a base tile row of A, baseM x K, or column of B, K x baseN) stays
//     resident while depthA1 / ceil(K / baseK) (resp. depthB1) panels fit, least recently
//     used out first; a panel that does not fit is streamed, read once per base tile. Base
//     tiles are walked M inside N (iterateOrder 0) or N inside M (1), the outer operand's
//     panel loaded first. GM bytes are counted per operand (codegen/cube/tiling.py models
//     the same rule);
//   - GetTensorC(ub) writes one baseM x baseN tile into UB, row-major with a row pitch of
//     baseN (a tail tile fills its top-left corner, the rest is zero). The API synchronises
//     its own transfer: it sets its cross-core flag on the vector pipe (so the vector unit's
//     earlier instructions, reads of the buffer included, are done before the cube core
//     writes) and waits for the tile before returning. So the tile counts as written by the
//     vector pipe and complete: the vector unit may read it at once, and rewrite the buffer
//     it read for the previous tile with no PipeBarrier<PIPE_V> in between.
//   - an operand the kernel itself wrote into the launch's workspace (a convolution's im2col
//     panel, built by the vector core with MTE3 copies): the request that makes the cube core
//     read it is the scalar unit's, so every MTE3 copy into the operand's block must be
//     complete before the first Iterate (SetFlag/WaitFlag<HardEvent::MTE3_S>), and nothing
//     may write into it again until Iterate has returned false (the cube core reads its
//     panels while it computes the tiles);
// A block registers an object only when the tiling's usedCoreNum counts it (a product group
// launches the most blocks any of its products uses; a block beyond a product's usedCoreNum
// skips that product, codegen/cube/group.py). A KERNEL_TYPE_MIX_AIC_1_2 launch runs the
// block's two vector cores, each a client of its own (the API is driven from the vector
// side; the cube core's server keeps a message queue per vector core), and the cube core up
// to its REGIST_MATMUL_OBJ, where it serves them and returns; the three must register the
// same objects (ascendc_sim.h, launch).
// Strict: a tiling breaking a limit, unaligned base sizes, a GetTensorC destination smaller
// than a base tile, any call after End, a second object used while another has not called
// End, SetTail beyond the single-core block, and GM reads or writes out of bounds (through
// SetTail or the offsets) are errors naming the kernel and the line.
#pragma once

// The tiling fields the generated kernels read (TCubeTiling's names; the host fills them by
// name, so the order here is the simulator's own).
struct TCubeTiling {
    int32_t usedCoreNum, M, N, Ka, Kb, singleCoreM, singleCoreN, singleCoreK;
    int32_t baseM, baseN, baseK, depthA1, depthB1, stepM, stepN, stepKa, stepKb;
    int32_t isBias, iterateOrder, transLength;
};

namespace matmul {
using namespace AscendC;

enum class CubeFormat { ND, NZ, ND_ALIGN };

// The A2 cube core's buffers (the device the simulator models, as for the UB).
constexpr uint64_t L1_BYTES = 512 * 1024;
constexpr uint64_t L0A_BYTES = 64 * 1024;
constexpr uint64_t L0B_BYTES = 64 * 1024;
constexpr uint64_t L0C_BYTES = 128 * 1024;
constexpr int32_t FRACTAL = 16;
constexpr int32_t K_BYTES = 32;

template <TPosition POS, CubeFormat FMT, typename T, bool TRANS = false>
struct MatmulType {
    using type = T;
    static constexpr TPosition pos = POS;
    static constexpr CubeFormat format = FMT;
    static constexpr bool isTrans = TRANS;
};

struct MatmulSimCfg {};  // the default configuration (the only one modelled)

template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE,
          class CFG = MatmulSimCfg>
class Matmul {
    using TA = typename A_TYPE::type;
    using TB = typename B_TYPE::type;
    using TC = typename C_TYPE::type;
    using TBias = typename BIAS_TYPE::type;
    using Acc = std::conditional_t<std::is_integral_v<TA>, int32_t, float>;
    static_assert(std::is_same_v<TA, TB>, "A and B have one element type");
    static_assert(A_TYPE::pos == TPosition::GM && B_TYPE::pos == TPosition::GM,
                  "the simulator models A and B in GM");

public:
    // Returns true on the cube core of a MIX launch: there REGIST_MATMUL_OBJ runs the Matmul
    // server, which serves the block's two vector cores until both quit, and then returns
    // from the function that registered (the devkit's REGIST_MATMUL_OBJ on ASCEND_IS_AIC).
    bool sim_register(TPipe* pipe, uint8_t* workspace, const TCubeTiling* tiling,
                      loc where = loc::current()) {
        if (pipe == nullptr) fail("REGIST_MATMUL_OBJ without a TPipe", where);
        if (g_core->kernel_type == KERNEL_TYPE_AIV_ONLY)
            fail("a Matmul object in a kernel declared KERNEL_TYPE_AIV_ONLY (no cube core "
                 "runs it: declare a MIX or AIC kernel type)", where);
        if (workspace == nullptr || workspace != g_core->sys_workspace)
            fail("REGIST_MATMUL_OBJ with a workspace other than the system workspace the "
                 "launch provides: pass GetSysWorkSpacePtr()", where);
        if (tiling == nullptr) fail("REGIST_MATMUL_OBJ without a TCubeTiling", where);
        t_ = *tiling;
        check_tiling(where);
        g_core->regs.push_back(where.line());
        if (g_core->aic) return true;
        if (!registered_) {
            ++g_core->mm_open;
            g_core->mm_open_line = where.line();
        }
        registered_ = true;
        tail_m_ = t_.singleCoreM;
        tail_n_ = t_.singleCoreN;
        tail_k_ = t_.singleCoreK;
        org_m_ = t_.M;
        org_n_ = t_.N;
        org_ka_ = t_.Ka;
        org_kb_ = t_.Kb;
        org_kc_ = t_.N;
        return false;
    }
    // The original shapes the API computes GM offsets from (row pitches, in elements): A
    // [orgM, orgKa] (stored transposed: [orgKa, orgM]), B [orgKb, orgN] (transposed: [orgN,
    // orgKb]), C rows of orgKc (0: orgN). Not the product's own extents (SetTail's, the
    // tiling's single-core block): set before SetTensorA/SetTensorB, which must follow it.
    void SetOrgShape(int orgM, int orgN, int orgKa, int orgKb, int orgKc = 0,
                     loc where = loc::current()) {
        claim("SetOrgShape", where);
        if (orgM < 1 || orgN < 1 || orgKa < 1 || orgKb < 1 || orgKc < 0)
            fail("SetOrgShape(" + std::to_string(orgM) + ", " + std::to_string(orgN) + ", " +
                 std::to_string(orgKa) + ", " + std::to_string(orgKb) + ", " +
                 std::to_string(orgKc) + "): extents must be positive", where);
        org_m_ = orgM;
        org_n_ = orgN;
        org_ka_ = orgKa;
        org_kb_ = orgKb;
        org_kc_ = orgKc ? orgKc : orgN;
        has_a_ = has_b_ = false;  // the API takes it before SetTensorA and SetTensorB
        restart();
    }
    void SetTensorA(const GlobalTensor<TA>& g, bool trans = false, loc where = loc::current()) {
        claim("SetTensorA", where);
        if (trans && !A_TYPE::isTrans)
            fail("SetTensorA(..., true) on an A whose MatmulType does not declare isTrans",
                 where);
        a_ = g;
        trans_a_ = trans;
        has_a_ = true;
        restart();
    }
    void SetTensorB(const GlobalTensor<TB>& g, bool trans = false, loc where = loc::current()) {
        claim("SetTensorB", where);
        if (trans && !B_TYPE::isTrans)
            fail("SetTensorB(..., true) on a B whose MatmulType does not declare isTrans",
                 where);
        b_ = g;
        trans_b_ = trans;
        has_b_ = true;
        restart();
    }
    void SetBias(const GlobalTensor<TBias>& g, loc where = loc::current()) {
        claim("SetBias", where);
        static_assert(std::is_same_v<TBias, float> || std::is_same_v<TBias, int32_t>,
                      "the bias is accumulated in L0C: fp32 (int32 for int8)");
        if (!t_.isBias) fail("SetBias with a tiling whose isBias is 0", where);
        bias_ = g;
        has_bias_ = true;
        restart();
    }
    void DisableBias(loc where = loc::current()) {
        claim("DisableBias", where);
        has_bias_ = false;
    }
    void SetTail(int32_t tailM = -1, int32_t tailN = -1, int32_t tailK = -1,
                 loc where = loc::current()) {
        claim("SetTail", where);
        const int32_t m = tailM < 0 ? t_.singleCoreM : tailM;
        const int32_t n = tailN < 0 ? t_.singleCoreN : tailN;
        const int32_t k = tailK < 0 ? t_.singleCoreK : tailK;
        if (m < 1 || n < 1 || k < 1 || m > t_.singleCoreM || n > t_.singleCoreN ||
            k > t_.singleCoreK)
            fail("SetTail(" + std::to_string(m) + ", " + std::to_string(n) + ", " +
                 std::to_string(k) + ") outside the single-core block " +
                 std::to_string(t_.singleCoreM) + " x " + std::to_string(t_.singleCoreN) +
                 " x " + std::to_string(t_.singleCoreK), where);
        tail_m_ = m;
        tail_n_ = n;
        tail_k_ = k;
        restart();
    }
    // Every base tile of the block to GM (C's row pitch: the tiling's N).
    void IterateAll(const GlobalTensor<TC>& c, uint8_t enAtomic = 0, loc where = loc::current()) {
        claim("IterateAll", where);
        ready(where);
        workspace_ready(where);
        if (enAtomic) fail("IterateAll with atomic accumulation is not modelled", where);
        const int32_t tiles = tiles_m() * tiles_n();
        std::vector<Acc> acc;
        for (int32_t i = 0; i < tiles; ++i) {
            auto [m0, n0, rows, cols] = tile_at(i);
            compute(m0, n0, rows, cols, acc, where);
            for (int32_t r = 0; r < rows; ++r) {
                const uint64_t off = static_cast<uint64_t>(m0 + r) * org_kc_ + n0;
                c.check(off, cols, where);
                for (int32_t q = 0; q < cols; ++q)
                    c.addr()[off + q] = convert(acc[r * cols + q]);
                count_write(c.addr() + off, cols * sizeof(TC));
            }
            const uint64_t bytes = static_cast<uint64_t>(rows) * cols * sizeof(TC);
            g_core->mm_bytes[3] += bytes;
        }
        next_ = tiles;
    }
    // The next base tile (false when the block is done); GetTensorC then moves it to UB.
    bool Iterate(bool enPartialSum = false, loc where = loc::current()) {
        claim("Iterate", where);
        ready(where);
        if (enPartialSum) fail("Iterate with partial sums is not modelled", where);
        if (next_ == 0) workspace_ready(where);
        else workspace_kept(where);
        if (next_ >= tiles_m() * tiles_n()) return false;
        auto [m0, n0, rows, cols] = tile_at(next_++);
        compute(m0, n0, rows, cols, cur_, where);
        cur_rows_ = rows;
        cur_cols_ = cols;
        have_tile_ = true;
        return true;
    }
    void GetTensorC(const LocalTensor<TC>& ub, uint8_t enAtomic = 0, bool enSequentialWrite = false,
                    loc where = loc::current()) {
        claim("GetTensorC", where);
        if (!have_tile_) fail("GetTensorC without a base tile (Iterate() first)", where);
        if (g_core->kernel_type == KERNEL_TYPE_AIC_ONLY)
            fail("GetTensorC into UB in a kernel declared KERNEL_TYPE_AIC_ONLY (UB is the "
                 "vector cores': declare KERNEL_TYPE_MIX_AIC_1_2)", where);
        if (enAtomic) fail("GetTensorC with atomic accumulation is not modelled", where);
        const uint64_t n = static_cast<uint64_t>(t_.baseM) * t_.baseN;
        if (ub.bytes_left() < n * sizeof(TC))
            fail("GetTensorC into a UB tensor of " + std::to_string(ub.bytes_left()) +
                 " bytes: a base tile of " + std::to_string(t_.baseM) + " x " +
                 std::to_string(t_.baseN) + " needs " + std::to_string(n * sizeof(TC)), where);
        // the API first sets its cross-core flag on the vector pipe (the cube core then writes
        // the tile): it is set once the vector unit's earlier instructions are done, so the
        // tile's buffer is not overwritten under a vector instruction still reading it
        const Instr in = issue(PIPE_V, where);
        g_core->known[PIPE_V][PIPE_V] = in.seq;
        TC* dst = ub.wr(n, in);
        for (uint64_t i = 0; i < n; ++i) dst[i] = TC(0);
        for (int32_t r = 0; r < cur_rows_; ++r)
            for (int32_t q = 0; q < cur_cols_; ++q)
                dst[r * t_.baseN + q] = convert(cur_[r * cur_cols_ + q]);
        // the API returns once the tile is in UB: the vector unit's next instruction is
        // ordered after this write (no PipeBarrier<PIPE_V> needed to read it)
        g_core->known[PIPE_V][PIPE_V] = in.seq;
        have_tile_ = false;
    }
    void End(loc where = loc::current()) {
        claim("End", where);
        ended_ = true;
        --g_core->mm_open;
        g_core->mm_active = nullptr;
    }

private:
    void check_tiling(const loc& where) const {
        const TCubeTiling& t = t_;
        auto bad = [&](const std::string& what) { fail("TCubeTiling: " + what, where); };
        const int32_t ka = std::max<int32_t>(FRACTAL, K_BYTES / sizeof(TA));
        if (t.baseM <= 0 || t.baseN <= 0 || t.baseK <= 0 || t.baseM % FRACTAL ||
            t.baseN % FRACTAL)
            bad("baseM " + std::to_string(t.baseM) + " / baseN " + std::to_string(t.baseN) +
                " are not positive multiples of the 16-element fractal");
        if (t.baseK % ka)
            bad("baseK " + std::to_string(t.baseK) + " is not a multiple of " +
                std::to_string(ka) + " for " + std::to_string(sizeof(TA)) + "-byte operands");
        const uint64_t a = static_cast<uint64_t>(t.baseM) * t.baseK * sizeof(TA);
        const uint64_t b = static_cast<uint64_t>(t.baseK) * t.baseN * sizeof(TB);
        const uint64_t c = static_cast<uint64_t>(t.baseM) * t.baseN * 4;
        if (a > L0A_BYTES / 2)
            bad("baseM*baseK*sizeof(A) = " + std::to_string(a) + " bytes exceeds half of L0A (" +
                std::to_string(L0A_BYTES / 2) + ", double buffered)");
        if (b > L0B_BYTES / 2)
            bad("baseK*baseN*sizeof(B) = " + std::to_string(b) + " bytes exceeds half of L0B (" +
                std::to_string(L0B_BYTES / 2) + ", double buffered)");
        if (c > L0C_BYTES)
            bad("baseM*baseN*4 = " + std::to_string(c) + " bytes overflows L0C (" +
                std::to_string(L0C_BYTES) + ")");
        if (t.depthA1 < 1 || t.depthB1 < 1) bad("depthA1 and depthB1 must be at least 1");
        const uint64_t l1 = a * t.depthA1 + b * t.depthB1 + (t.isBias ? t.baseN * 4ull : 0);
        if (l1 > L1_BYTES)
            bad("depthA1/depthB1 base tiles need " + std::to_string(l1) +
                " bytes of L1, which has " + std::to_string(L1_BYTES));
        if (t.Ka != t.Kb || t.singleCoreK != t.Ka)
            bad("K is split (Ka " + std::to_string(t.Ka) + ", Kb " + std::to_string(t.Kb) +
                ", singleCoreK " + std::to_string(t.singleCoreK) + ")");
        if (t.singleCoreM < 1 || t.singleCoreN < 1 || t.singleCoreM > t.M ||
            t.singleCoreN > t.N)
            bad("the single-core block " + std::to_string(t.singleCoreM) + " x " +
                std::to_string(t.singleCoreN) + " is not inside M x N");
        if (t.iterateOrder != 0 && t.iterateOrder != 1) bad("iterateOrder must be 0 or 1");
        // a block runs an object only when the tiling counts it among its cores (a kernel of
        // one product launches usedCoreNum blocks; a kernel of several products launches the
        // most any needs, and a block beyond a product's usedCoreNum skips that product)
        if (t.usedCoreNum < 1 || t.usedCoreNum <= g_core->block_idx)
            bad("usedCoreNum " + std::to_string(t.usedCoreNum) + " does not cover block " +
                std::to_string(g_core->block_idx) + " of the launch's " +
                std::to_string(g_core->block_num) + " (a block beyond the tiling's cores "
                "registers no object)");
    }
    // A call on this object: refused after End and while another object is in use.
    void claim(const char* what, const loc& where) {
        if (!registered_)
            fail(std::string(what) + " on a Matmul object not registered (REGIST_MATMUL_OBJ)",
                 where);
        if (ended_) fail(std::string(what) + " after End()", where);
        if (g_core->mm_active != nullptr && g_core->mm_active != this)
            fail(std::string(what) + " on a second Matmul object while another has not "
                 "called End()", where);
        g_core->mm_active = this;
    }
    void ready(const loc& where) const {
        if (!has_a_ || !has_b_) fail("Iterate before SetTensorA and SetTensorB", where);
        pitches_hold(where);
    }
    // B's block in the launch's workspace, as byte offsets [lo, hi) (lo == hi: elsewhere).
    std::pair<uint64_t, uint64_t> b_in_workspace() const {
        const Core& c = *g_core;
        const size_t ws = c.arg_reads.size() >= 2 ? c.arg_reads.size() - 2 : 0;
        const uint8_t* p = reinterpret_cast<const uint8_t*>(b_.addr());
        if (c.sys_workspace == nullptr || ws == 0 || p < c.sys_workspace ||
            p >= c.sys_workspace + c.arg_bytes[ws])
            return {0, 0};
        const uint64_t lo = p - c.sys_workspace;
        return {lo, lo + (b_at(tail_k_ - 1, tail_n_ - 1) + 1) * sizeof(TB)};
    }
    // The first Iterate of a block: the kernel's MTE3 copies into B's block are complete and
    // the scalar unit, which sends the request, has waited for them.
    void workspace_ready(const loc& where) {
        auto [lo, hi] = b_in_workspace();
        iter_seq_ = g_seq;
        if (lo == hi) return;
        Core& c = *g_core;
        for (const auto& [off, bytes, seq] : c.ws_writes)
            if (off < hi && lo < off + bytes && seq > c.known[PIPE_S][PIPE_MTE3])
                fail("Iterate reads B from the workspace, which an MTE3 copy (line " +
                     std::to_string(line_of(seq)) + ") writes with no SetFlag/WaitFlag"
                     "<HardEvent::MTE3_S> in between (the cube core would read the panel "
                     "before it is complete)", where);
        std::erase_if(c.ws_writes, [&](const auto& w) {
            return std::get<2>(w) <= c.known[PIPE_S][PIPE_MTE3]; });
    }
    // A later Iterate: nothing wrote into B's block since the first (the cube core may still
    // be reading it).
    void workspace_kept(const loc& where) const {
        auto [lo, hi] = b_in_workspace();
        if (lo == hi) return;
        for (const auto& [off, bytes, seq] : g_core->ws_writes)
            if (off < hi && lo < off + bytes && seq > iter_seq_)
                fail("B's block in the workspace is rewritten (line " +
                     std::to_string(line_of(seq)) + ") while the cube core reads it (before "
                     "Iterate returned false)", where);
    }
    void restart() {
        next_ = 0;
        have_tile_ = false;
        held_a_.clear();
        held_b_.clear();
    }
    int32_t tiles_m() const { return (tail_m_ + t_.baseM - 1) / t_.baseM; }
    int32_t tiles_n() const { return (tail_n_ + t_.baseN - 1) / t_.baseN; }
    std::tuple<int32_t, int32_t, int32_t, int32_t> tile_at(int32_t i) const {
        const int32_t m = t_.iterateOrder == 0 ? i % tiles_m() : i / tiles_n();
        const int32_t n = t_.iterateOrder == 0 ? i / tiles_m() : i % tiles_n();
        const int32_t m0 = m * t_.baseM, n0 = n * t_.baseN;
        return {m0, n0, std::min(t_.baseM, tail_m_ - m0), std::min(t_.baseN, tail_n_ - n0)};
    }
    // A panel load through L1: counted unless resident (least recently used out first).
    bool load(std::vector<int32_t>& held, int32_t key, int32_t depth) {
        const int32_t kt = (t_.singleCoreK + t_.baseK - 1) / t_.baseK;
        const size_t cap = static_cast<size_t>(depth / kt);
        auto it = std::find(held.begin(), held.end(), key);
        if (it != held.end()) {
            held.erase(it);
            held.push_back(key);
            return false;
        }
        if (cap > 0) {
            held.push_back(key);
            if (held.size() > cap) held.erase(held.begin());
        }
        return true;
    }
    void load_a(int32_t m0, int32_t rows, const loc& where) {
        if (!load(held_a_, m0, t_.depthA1)) return;
        for (int32_t r = 0; r < rows; ++r)
            for (int32_t k = 0; k < tail_k_; ++k) a_.check(a_at(m0 + r, k), 1, where);
        const uint64_t bytes = static_cast<uint64_t>(rows) * tail_k_ * sizeof(TA);
        count_read(a_.addr() + a_at(m0, 0), bytes);
        g_core->mm_bytes[0] += bytes;
    }
    void load_b(int32_t n0, int32_t cols, const loc& where) {
        if (!load(held_b_, n0, t_.depthB1)) return;
        for (int32_t q = 0; q < cols; ++q)
            for (int32_t k = 0; k < tail_k_; ++k) b_.check(b_at(k, n0 + q), 1, where);
        uint64_t bytes = static_cast<uint64_t>(cols) * tail_k_ * sizeof(TB);
        count_read(b_.addr() + b_at(0, n0), bytes);
        g_core->mm_bytes[1] += bytes;
        if (has_bias_) {  // the bias row comes with B's panel
            bias_.check(n0, cols, where);
            count_read(bias_.addr() + n0, cols * sizeof(TBias));
            g_core->mm_bytes[2] += cols * sizeof(TBias);
        }
    }
    uint64_t a_at(int64_t m, int64_t k) const {
        return trans_a_ ? k * org_m_ + m : m * org_ka_ + k;
    }
    uint64_t b_at(int64_t k, int64_t n) const {
        return trans_b_ ? n * org_kb_ + k : k * org_n_ + n;
    }
    // A block's rows must not overlap in GM: each row pitch spans the block's row (the ND
    // copy into L1 reads the rows at the pitch; C's rows are written at it).
    void pitches_hold(const loc& where) const {
        auto bad = [&](const char* what, int64_t pitch, int64_t row) {
            if (pitch < row)
                fail(std::string("SetOrgShape: ") + what + " row pitch " +
                     std::to_string(pitch) + " is shorter than the block's row of " +
                     std::to_string(row) + " elements (rows would overlap)", where);
        };
        bad(trans_a_ ? "A's (transposed, orgM)" : "A's (orgKa)", trans_a_ ? org_m_ : org_ka_,
            trans_a_ ? tail_m_ : tail_k_);
        bad(trans_b_ ? "B's (transposed, orgKb)" : "B's (orgN)", trans_b_ ? org_kb_ : org_n_,
            trans_b_ ? tail_k_ : tail_n_);
        bad("C's (orgKc)", org_kc_, tail_n_);
    }
    void compute(int32_t m0, int32_t n0, int32_t rows, int32_t cols, std::vector<Acc>& acc,
                 const loc& where) {
        if (t_.iterateOrder == 0) {
            load_b(n0, cols, where);
            load_a(m0, rows, where);
        } else {
            load_a(m0, rows, where);
            load_b(n0, cols, where);
        }
        acc.assign(static_cast<size_t>(rows) * cols, Acc(0));
        const TA* a = a_.addr();
        const TB* b = b_.addr();
        for (int32_t r = 0; r < rows; ++r)
            for (int32_t q = 0; q < cols; ++q) {
                Acc s = has_bias_ ? Acc(bias_.addr()[n0 + q]) : Acc(0);
                for (int32_t k = 0; k < tail_k_; ++k)
                    s += Acc(a[a_at(m0 + r, k)]) * Acc(b[b_at(k, n0 + q)]);
                acc[r * cols + q] = s;
            }
    }
    static TC convert(Acc v) { return TC(v); }

    TCubeTiling t_{};
    bool registered_ = false, ended_ = false;
    GlobalTensor<TA> a_;
    GlobalTensor<TB> b_;
    GlobalTensor<TBias> bias_;
    bool has_a_ = false, has_b_ = false, has_bias_ = false, trans_a_ = false, trans_b_ = false;
    int32_t tail_m_ = 0, tail_n_ = 0, tail_k_ = 0;
    int64_t org_m_ = 0, org_n_ = 0, org_ka_ = 0, org_kb_ = 0, org_kc_ = 0;  // row pitches
    int32_t next_ = 0;
    uint32_t iter_seq_ = 0;  // the instruction number at the block's first Iterate
    std::vector<int32_t> held_a_, held_b_;
    std::vector<Acc> cur_;
    int32_t cur_rows_ = 0, cur_cols_ = 0;
    bool have_tile_ = false;
};
}  // namespace matmul

namespace AscendC {
// The system workspace the Matmul API works in: the launch provides it (the kernel's
// workspace argument, whose start the runtime reserves for the API).
inline GM_ADDR GetSysWorkSpacePtr() { return g_core->sys_workspace; }
// Deprecated in the API ("will be removed in the next version"): refused.
inline void SetSysWorkspace(GM_ADDR, loc where = loc::current()) {
    fail("SetSysWorkspace is deprecated in the Ascend C API: the launch provides the system "
         "workspace; pass GetSysWorkSpacePtr() to REGIST_MATMUL_OBJ", where);
}
}  // namespace AscendC

#define REGIST_MATMUL_OBJ(pipe, workspace, mm, tiling) \
    if ((mm).sim_register((pipe), (workspace), (tiling))) return
