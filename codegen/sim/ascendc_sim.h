// graphkernel's clean-room CPU simulator of the Ascend C API subset its code generator emits.
//
// Written from the documented semantics (see the project's Ascend C reference), not from any
// vendor source. It is strict on purpose, so that code which would misbehave on the device
// fails here: the Unified Buffer budget over all InitBuffer calls, 32-byte alignment of UB
// tensors, DataCopy lengths that are not 32-byte multiples, DataCopyPad limits, queue
// discipline (order, depth, use after FreeTensor), repeat limits, GM and UB bounds, and the
// ordering of the core's pipes: every UB byte remembers the pipe that last wrote it (and the
// pipes that read it since), and an access from another pipe with no sync in between
// (SetFlag/WaitFlag, PipeBarrier<PIPE_ALL>, a queue's hand-over of its tile) is an error.
// Every error names the kernel and the source line of the offending call. GM bytes read and
// written, scalar UB accesses, syncs and vector instructions are counted per block. A
// KERNEL_TYPE_MIX_AIC_1_2 launch runs both vector cores of each block and its cube core, with
// the system variables the A2 headers define (GetBlockIdx, GetSubBlockIdx, GetTaskRatio).
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __aicore__
#define __gm__
using GM_ADDR = uint8_t*;
using half = _Float16;

struct bfloat16_t {
    uint16_t bits;
    bfloat16_t() : bits(0) {}
    bfloat16_t(float f) {  // round to nearest even, as the hardware cast does
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) { bits = 0x7fc0; return; }
        u += 0x7fffu + ((u >> 16) & 1u);
        bits = static_cast<uint16_t>(u >> 16);
    }
    operator float() const {
        uint32_t u = static_cast<uint32_t>(bits) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

namespace AscendC {

constexpr uint32_t BLOCK_BYTES = 32;
constexpr uint32_t REPEAT_BYTES = 256;   // one vector repeat: 8 blocks of 32 bytes
constexpr int64_t MAX_REPEAT = 255;      // repeats one instruction may issue
constexpr uint32_t MAX_BLOCK_COUNT = 4095;
constexpr uint32_t MAX_PAD_BYTES = 32;
constexpr int EVENT_IDS = 8;             // event ids per HardEvent (0-7 on A2)
using loc = std::source_location;

struct SimError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------- pipes
// The instruction pipes of a core. The cube pipes are named (events and barriers know them)
// though no cube instruction is simulated yet.
enum PipeType { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };
using pipe_t = PipeType;
constexpr int NPIPES = PIPE_ALL;
inline const char* pipe_name(int p) {
    static const char* names[] = {"PIPE_S", "PIPE_V", "PIPE_M", "PIPE_MTE1", "PIPE_MTE2",
                                  "PIPE_MTE3", "PIPE_FIX", "PIPE_ALL"};
    return names[p];
}

// HardEvent SRC_DST: WaitFlag makes the DST pipe wait for the SRC pipe's work issued before
// the matching SetFlag. The documented pairs:
#define GK_SIM_EVENTS(X)                                                                      \
    X(MTE2_V, MTE2, V) X(V_MTE3, V, MTE3) X(V_S, V, S) X(S_V, S, V) X(MTE2_S, MTE2, S)        \
    X(S_MTE2, S, MTE2) X(MTE3_S, MTE3, S) X(S_MTE3, S, MTE3) X(MTE3_MTE2, MTE3, MTE2)         \
    X(MTE2_MTE3, MTE2, MTE3) X(V_MTE2, V, MTE2) X(MTE3_V, MTE3, V) X(V_V, V, V) X(M_V, M, V) \
    X(V_M, V, M) X(MTE1_M, MTE1, M) X(M_MTE1, M, MTE1) X(MTE2_MTE1, MTE2, MTE1)
enum class HardEvent {
#define GK_SIM_X(name, src, dst) name,
    GK_SIM_EVENTS(GK_SIM_X)
#undef GK_SIM_X
};
struct EventInfo {
    const char* name;
    int src;
    int dst;
};
constexpr EventInfo EVENT_INFO[] = {
#define GK_SIM_X(name, src, dst) {#name, PIPE_##src, PIPE_##dst},
    GK_SIM_EVENTS(GK_SIM_X)
#undef GK_SIM_X
};
constexpr int NEVENTS = sizeof(EVENT_INFO) / sizeof(EVENT_INFO[0]);

struct EventSlot {
    bool allocated = false;    // AllocEventID holds it
    bool pending = false;      // SetFlag done, WaitFlag not yet
    uint32_t line = 0;         // of the pending SetFlag
    uint32_t snap[NPIPES] = {};  // what the source pipe had completed at SetFlag
};

// One simulated core: its block (the launch's AI Core index), which core of the block it is,
// its Unified Buffer, its pipes' ordering and its counters. A KERNEL_TYPE_MIX_AIC_1_2 launch
// runs three per block: vector cores (AIV) 0 and 1 and the cube core (AIC), whose run stops at
// its first REGIST_MATMUL_OBJ (the Matmul server; matmul_sim.h). Other launches run one vector
// core per block (sub 0).
struct Core {
    std::string kernel;
    int32_t block_idx = 0;        // the block: get_block_idx() in [0, blockDim)
    int32_t block_num = 1;        // blockDim
    int32_t sub = 0;              // the vector core of the block (get_subblockid())
    bool aic = false;             // the cube core of a MIX launch
    std::vector<uint32_t> regs;   // where each REGIST_MATMUL_OBJ this core reached is
    std::vector<uint8_t> ub;
    size_t ub_used = 0;           // UB the live TPipe has reserved
    size_t ub_peak = 0;           // the most any TPipe of this core reserved
    int live_pipes = 0;           // TPipes constructed and not yet destroyed
    uint64_t gm_read = 0;
    uint64_t gm_written = 0;
    // the launch's GM arguments (each one buffer of `arg_bytes` bytes) and the bytes read of
    // each, so a read is counted against the input it reads
    uint8_t** args = nullptr;
    const uint64_t* arg_bytes = nullptr;
    std::vector<uint64_t> arg_reads;
    // the block that wrote each byte of each argument in this launch (-1: none; shared by the
    // launch's cores, which run one after another; none for a SuperKernel, whose SyncAll
    // orders its cores' writes and reads)
    std::vector<std::vector<int32_t>>* writers = nullptr;
    uint64_t scalar_ops = 0;   // GetValue/SetValue (scalar pipe) of UB or GM
    uint64_t syncs = 0;        // SetFlag/WaitFlag pairs and PipeBarrier<PIPE_ALL>
    uint64_t vector_ops = 0;   // vector instructions issued
    // the Matmul API (matmul_sim.h): GM bytes per operand (A, B, bias read; C written), the
    // object in use (none after End) and the system workspace
    uint64_t mm_bytes[4] = {};
    const void* mm_active = nullptr;
    int mm_open = 0;              // objects registered that have not called End()
    uint32_t mm_open_line = 0;    // where the last of them was registered
    uint8_t* sys_workspace = nullptr;  // the launch's workspace argument
    // GM writes into the workspace (offset, bytes, the writing instruction's number): a Matmul
    // operand the kernel wrote there (a convolution's im2col panel) is checked against them
    std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> ws_writes;
    int kernel_type = -1;         // KERNEL_TASK_TYPE_DEFAULT's value (-1: none declared)
    // Instructions are numbered in program order (a sequence shared by all pipes).
    // known[d][s]: pipe d's next instruction is ordered after pipe s's instructions up to
    // this number (through events and barriers). Everything before `base` (earlier cores
    // and launches on this thread) counts as complete.
    uint32_t base = 0;
    uint32_t known[NPIPES][NPIPES] = {};
    std::vector<uint32_t> lines;  // the source line of each instruction after base
    EventSlot events[NEVENTS][EVENT_IDS];
    void* pipe = nullptr;         // the TPipe constructed last (GetTPipePtr)
};
inline thread_local Core* g_core = nullptr;
inline thread_local uint32_t g_seq = 0;  // the last instruction's number (Instr.seq)

// A core's number among a launch's cores that write GM (block * 2 + vector core), and its
// name in messages.
inline int32_t writer_id(const Core& c) { return c.block_idx * 2 + c.sub; }
inline std::string writer_name(int32_t id) {
    return "block " + std::to_string(id / 2) + " (vector core " + std::to_string(id % 2) + ")";
}

// GM bytes read at `at`: counted in all and against the argument whose buffer holds them.
// Bytes another block wrote in this launch are refused: the cores of a launch are not
// synchronised with each other, so nothing orders that write before this read.
inline void count_read(const void* at, uint64_t bytes) {
    Core& c = *g_core;
    c.gm_read += bytes;
    const uint8_t* p = static_cast<const uint8_t*>(at);
    for (size_t i = 0; i < c.arg_reads.size(); ++i)
        if (p >= c.args[i] && p < c.args[i] + c.arg_bytes[i]) {
            c.arg_reads[i] += bytes;
            if (c.writers != nullptr && !(*c.writers)[i].empty()) {
                const auto& w = (*c.writers)[i];
                const uint64_t first = p - c.args[i];
                const uint64_t last = std::min<uint64_t>(first + bytes, c.arg_bytes[i]);
                for (uint64_t k = first; k < last; ++k)
                    if (w[k] >= 0 && w[k] != writer_id(c))
                        throw SimError(c.kernel + ": " + writer_name(writer_id(c)) +
                                       " reads byte " + std::to_string(k) + " of argument " +
                                       std::to_string(i) + ", which " + writer_name(w[k]) +
                                       " wrote in this launch (the cores of a launch are not "
                                       "synchronised: a core may read back only what it "
                                       "wrote itself)");
            }
            return;
        }
}

// GM bytes written at `at`: which block wrote them, for the reads above.
inline void count_write(const void* at, uint64_t bytes) {
    Core& c = *g_core;
    c.gm_written += bytes;
    const uint8_t* q = static_cast<const uint8_t*>(at);
    const size_t ws = c.arg_reads.size() >= 2 ? c.arg_reads.size() - 2 : 0;
    if (c.sys_workspace != nullptr && ws > 0 && q >= c.sys_workspace &&
        q < c.sys_workspace + c.arg_bytes[ws])  // (the instruction writing is the last issued)
        c.ws_writes.emplace_back(q - c.sys_workspace, bytes, g_seq);
    if (c.writers == nullptr) return;
    const uint8_t* p = static_cast<const uint8_t*>(at);
    for (size_t i = 0; i < c.arg_reads.size(); ++i)
        if (p >= c.args[i] && p < c.args[i] + c.arg_bytes[i]) {
            auto& w = (*c.writers)[i];
            if (w.empty()) w.assign(c.arg_bytes[i], -1);
            const uint64_t first = p - c.args[i];
            const uint64_t last = std::min<uint64_t>(first + bytes, c.arg_bytes[i]);
            for (uint64_t k = first; k < last; ++k) {
                if (w[k] >= 0 && w[k] != writer_id(c))
                    throw SimError(c.kernel + ": " + writer_name(writer_id(c)) +
                                   " writes byte " + std::to_string(k) + " of argument " +
                                   std::to_string(i) + ", which " + writer_name(w[k]) +
                                   " wrote in this launch (two cores write the same output: "
                                   "their order on the device is undefined)");
                w[k] = writer_id(c);
            }
            return;
        }
}

[[noreturn]] inline void fail(const std::string& what, const loc& where) {
    std::string k = g_core ? g_core->kernel : std::string("?");
    throw SimError(k + ": line " + std::to_string(where.line()) + ": " + what);
}

// What every UB byte remembers for the pipe checks: the last write (its instruction and
// pipe), the pipes a queue handed the byte to since, and the last read by each pipe whose
// reads a later write could overtake. Scalar reads are not tracked: the scalar unit issues
// every instruction in program order and a GetValue returns its value before anything after
// it is issued, so no later write can overtake it. One per thread, reused by every core.
constexpr int READERS[] = {PIPE_V, PIPE_MTE3};
constexpr int NREADERS = 2;
struct UbShadow {
    std::vector<uint32_t> wseq;
    std::vector<uint8_t> wpipe;
    std::vector<uint8_t> grant;
    std::vector<uint32_t> rseq[NREADERS];
    void grow(size_t n) {
        if (n <= wseq.size()) return;
        wseq.resize(n, 0);
        wpipe.resize(n, 0);
        grant.resize(n, 0);
        for (auto& r : rseq) r.resize(n, 0);
    }
    void clear() {
        std::fill(wseq.begin(), wseq.end(), 0u);
        for (auto& r : rseq) std::fill(r.begin(), r.end(), 0u);
    }
};
inline thread_local UbShadow g_shadow;

inline int reader_slot(int pipe) {
    for (int k = 0; k < NREADERS; ++k)
        if (READERS[k] == pipe) return k;
    return -1;
}

// The instruction being executed: its pipe, its number, where it is in the source.
struct Instr {
    int pipe;
    uint32_t seq;
    loc where;
};
inline Instr issue(int pipe, const loc& where) {
    g_core->lines.push_back(where.line());
    return Instr{pipe, ++g_seq, where};
}
// The kernel types a kernel declares (KERNEL_TASK_TYPE_DEFAULT): which cores run it. A
// cube-only kernel has no vector unit, a vector-only one no cube core for a Matmul object.
enum KernelMetaType {
    KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1, KERNEL_TYPE_MIX_AIC_1_2
};
inline void declare_kernel_type(KernelMetaType t) { g_core->kernel_type = t; }
inline Instr vec(const loc& where) {
    if (g_core->kernel_type == KERNEL_TYPE_AIC_ONLY)
        fail("a vector instruction in a kernel declared KERNEL_TYPE_AIC_ONLY (the cube core "
             "has no vector unit)", where);
    if (g_core->aic)
        fail("a vector instruction on the cube core of a MIX launch (before its "
             "REGIST_MATMUL_OBJ, where the cube core leaves the function: it has no vector "
             "unit)", where);
    ++g_core->vector_ops;
    return issue(PIPE_V, where);
}
inline uint32_t line_of(uint32_t seq) {
    const Core& c = *g_core;
    return seq > c.base && seq - c.base <= c.lines.size() ? c.lines[seq - c.base - 1] : 0;
}
inline std::string sync_hint(int src, int dst) {
    if (src == PIPE_V && dst == PIPE_V) return "PipeBarrier<PIPE_V>";
    for (const auto& e : EVENT_INFO)
        if (e.src == src && e.dst == dst)
            return std::string("SetFlag/WaitFlag<HardEvent::") + e.name +
                   ">, or PipeBarrier<PIPE_ALL>";
    return "PipeBarrier<PIPE_ALL>";
}

// Whether pipe p's accesses need a sync after pipe w's to the same bytes: always across
// pipes; on one pipe only for the vector unit, whose instructions may overlap unless a
// PipeBarrier<PIPE_V> separates two that touch the same buffer (the scalar and copy pipes
// complete their instructions in order).
inline bool needs_sync(int w, int p) { return w != p || p == PIPE_V; }

// The access of UB byte b by the instruction `in` comes after the last write of b, unless
// that write was by a pipe `in` must sync with and nothing orders `in` after it.
inline void after_write(size_t b, const Instr& in, const char* verb) {
    const UbShadow& sh = g_shadow;
    const int p = in.pipe, w = sh.wpipe[b];
    if (needs_sync(w, p) && g_core->known[p][w] < sh.wseq[b] && !((sh.grant[b] >> p) & 1u))
        fail(std::string(pipe_name(p)) + verb + std::to_string(b) + " that " + pipe_name(w) +
                 " wrote at line " + std::to_string(line_of(sh.wseq[b])) +
                 ", with no sync in between (" + sync_hint(w, p) + ")",
             in.where);
}

// A read of UB bytes [b0, b0 + len) by the instruction `in`.
inline void ub_read(size_t b0, size_t len, const Instr& in) {
    UbShadow& sh = g_shadow;
    for (size_t b = b0; b < b0 + len; ++b) after_write(b, in, " reads UB byte ");
    const int k = reader_slot(in.pipe);
    if (k >= 0) std::fill(sh.rseq[k].begin() + b0, sh.rseq[k].begin() + b0 + len, in.seq);
}

// A write of UB bytes [b0, b0 + len): after the other pipes' writes and tracked reads of
// them (write after write, write after read).
inline void ub_write(size_t b0, size_t len, const Instr& in) {
    UbShadow& sh = g_shadow;
    const Core& c = *g_core;
    const int p = in.pipe;
    for (size_t b = b0; b < b0 + len; ++b) {
        after_write(b, in, " overwrites UB byte ");
        for (int k = 0; k < NREADERS; ++k) {
            const int q = READERS[k];
            if (needs_sync(q, p) && c.known[p][q] < sh.rseq[k][b] && sh.rseq[k][b] != in.seq)
                fail(std::string(pipe_name(p)) + " overwrites UB byte " + std::to_string(b) +
                         " that " + pipe_name(q) + " reads at line " +
                         std::to_string(line_of(sh.rseq[k][b])) +
                         ", with no sync in between (" + sync_hint(q, p) + ")",
                     in.where);
        }
    }
    std::fill(sh.wseq.begin() + b0, sh.wseq.begin() + b0 + len, in.seq);
    std::fill(sh.wpipe.begin() + b0, sh.wpipe.begin() + b0 + len, static_cast<uint8_t>(p));
    std::fill(sh.grant.begin() + b0, sh.grant.begin() + b0 + len, uint8_t{0});
    for (auto& r : sh.rseq) std::fill(r.begin() + b0, r.begin() + b0 + len, 0u);
}

// A queue hands its tile over (DeQue): the consumer pipe may use what the producer wrote.
inline void ub_hand_over(size_t b0, size_t len, int producer, int consumer) {
    UbShadow& sh = g_shadow;
    for (size_t b = b0; b < b0 + len; ++b)
        if (sh.wpipe[b] == producer) sh.grant[b] |= static_cast<uint8_t>(1u << consumer);
}

// A freed queue buffer is allocated again: the consumer's use of its last tile is complete
// before the producer fills it (the queue orders the reuse of its buffers).
inline void ub_reclaim(size_t b0, size_t len, int producer, int consumer) {
    UbShadow& sh = g_shadow;
    const int k = reader_slot(consumer);
    for (size_t b = b0; b < b0 + len; ++b) {
        if (k >= 0) sh.rseq[k][b] = 0;
        if (sh.wpipe[b] == consumer || sh.wpipe[b] == producer) sh.wseq[b] = 0;
    }
}

// The system variables as the A2 headers define them (dav_c220 kernel_operator_sys_var_impl.h):
// GetTaskRatio() is get_subblockdim() on a vector core (2 in a MIX_AIC_1_2 launch, else 1) and
// 1 on the cube core; GetBlockIdx() is get_block_idx() * GetTaskRatio() + get_subblockid() on a
// vector core (so [0, 2 * blockDim) in a MIX_AIC_1_2 launch) and get_block_idx() on the cube
// core; GetBlockNum() is get_block_num(), the launch's blockDim, on both.
inline int32_t GetTaskRatio() {
    return !g_core->aic && g_core->kernel_type == KERNEL_TYPE_MIX_AIC_1_2 ? 2 : 1;
}
inline int32_t GetSubBlockNum() { return GetTaskRatio(); }
inline int32_t GetSubBlockIdx() { return g_core->aic ? 0 : g_core->sub; }
inline int32_t GetBlockIdx() {
    return g_core->aic ? g_core->block_idx : g_core->block_idx * GetTaskRatio() + g_core->sub;
}
inline int32_t GetBlockNum() { return g_core->block_num; }
// The user's part of the launch's workspace. As in the devkit's CPU-debug build, the
// workspace argument itself: the Matmul model keeps nothing in the system workspace.
inline GM_ADDR GetUserWorkspace(GM_ADDR workspace, loc where = loc::current()) {
    if (workspace == nullptr) fail("GetUserWorkspace of a null workspace", where);
    return workspace;
}

// All-core synchronisation. Only a SuperKernel launch runs its cores as threads; elsewhere
// the cores run one after another and a barrier among them would deadlock on the device.
inline thread_local std::barrier<>* g_barrier = nullptr;
inline void SyncAll(loc where = loc::current()) {
    if (g_barrier == nullptr) {
        if (g_core->block_num > 1)
            fail("SyncAll in a kernel not launched as a SuperKernel", where);
        return;
    }
    g_barrier->arrive_and_wait();
}
// An instruction-cache preload hint: no effect on results.
inline void ICachePreLoad(int64_t) {}

enum class QuePosition { VECIN, VECOUT, VECCALC };
enum class TPosition { VECIN, VECOUT, VECCALC, GM, TSCM };
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class ReduceOrder { ORDER_VALUE_INDEX, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };

// PipeBarrier<P>: P's instructions so far complete before its next one (for PIPE_V: vector
// instructions with a data dependency); PIPE_ALL: every pipe's before any pipe's next.
template <PipeType P>
inline void PipeBarrier(loc where = loc::current()) {
    if constexpr (P == PIPE_S) {
        fail("PipeBarrier<PIPE_S> is a hardware error (the scalar pipe is ordered by the "
             "hardware)", where);
    } else {
        Core& c = *g_core;
        const Instr in = issue(P == PIPE_ALL ? PIPE_S : P, where);
        if constexpr (P == PIPE_ALL) {
            ++c.syncs;
            for (auto& row : c.known)
                for (auto& k : row) k = in.seq;
        } else {
            c.known[P][P] = in.seq;
        }
    }
}

// An event id. Ids come from the pipe (FetchEventID/AllocEventID), never from literals: this
// type has no constructor from an integer, and an integer passed to SetFlag/WaitFlag fails.
class TEventID {
public:
    TEventID() = default;  // no id yet
    static TEventID sim_make(int evt, int id) {
        TEventID e;
        e.evt_ = static_cast<int8_t>(evt);
        e.id_ = static_cast<int8_t>(id);
        return e;
    }
    int evt() const { return evt_; }
    int id() const { return id_; }

private:
    int8_t evt_ = -1;
    int8_t id_ = -1;
};
using event_t = TEventID;

inline EventSlot& event_slot(int evt, const TEventID& id, const char* call, const loc& where) {
    if (id.evt() < 0)
        fail(std::string(call) + "<HardEvent::" + EVENT_INFO[evt].name +
                 "> with an id not taken from the pipe (FetchEventID/AllocEventID)", where);
    if (id.evt() != evt)
        fail(std::string(call) + "<HardEvent::" + EVENT_INFO[evt].name + "> with an id taken for " +
                 EVENT_INFO[id.evt()].name, where);
    return g_core->events[evt][id.id()];
}

// SetFlag<E>(id) on E's source pipe; WaitFlag<E>(id) holds E's destination pipe until then.
template <HardEvent E>
void SetFlag(TEventID id, loc where = loc::current()) {
    constexpr int ev = static_cast<int>(E);
    EventSlot& s = event_slot(ev, id, "SetFlag", where);
    if (s.pending)
        fail(std::string("SetFlag<HardEvent::") + EVENT_INFO[ev].name + ">(" +
                 std::to_string(id.id()) + ") again while the SetFlag at line " +
                 std::to_string(s.line) + " waits for its WaitFlag", where);
    Core& c = *g_core;
    const int src = EVENT_INFO[ev].src;
    const Instr in = issue(src, where);
    for (int p = 0; p < NPIPES; ++p) s.snap[p] = c.known[src][p];
    s.snap[src] = in.seq;
    s.pending = true;
    s.line = where.line();
    ++c.syncs;
}
template <HardEvent E>
void WaitFlag(TEventID id, loc where = loc::current()) {
    constexpr int ev = static_cast<int>(E);
    EventSlot& s = event_slot(ev, id, "WaitFlag", where);
    const int dst = EVENT_INFO[ev].dst;
    if (!s.pending)
        fail(std::string("WaitFlag<HardEvent::") + EVENT_INFO[ev].name + ">(" +
                 std::to_string(id.id()) + ") with no SetFlag before it: " + pipe_name(dst) +
                 " would wait forever", where);
    Core& c = *g_core;
    issue(dst, where);
    for (int p = 0; p < NPIPES; ++p) c.known[dst][p] = std::max(c.known[dst][p], s.snap[p]);
    s.pending = false;
}
template <HardEvent E>
void SetFlag(int64_t, loc where = loc::current()) {
    fail("SetFlag with a literal event id: take ids from the pipe (FetchEventID/AllocEventID)",
         where);
}
template <HardEvent E>
void WaitFlag(int64_t, loc where = loc::current()) {
    fail("WaitFlag with a literal event id: take ids from the pipe (FetchEventID/AllocEventID)",
         where);
}

// ------------------------------------------------------------------------ GM
template <typename T>
class GlobalTensor {
public:
    void SetGlobalBuffer(__gm__ T* ptr, uint64_t size) { base_ = ptr; size_ = size; off_ = 0; }
    GlobalTensor operator[](uint64_t offset) const {
        GlobalTensor g = *this;
        g.off_ = off_ + offset;
        return g;
    }
    T* addr() const { return base_ + off_; }
    void check(uint64_t first, uint64_t count, const loc& where) const {
        if (base_ == nullptr) fail("GlobalTensor used before SetGlobalBuffer", where);
        if (off_ + first + count > size_) {
            fail("GM access [" + std::to_string(off_ + first) + ", " +
                 std::to_string(off_ + first + count) + ") is out of bounds of a buffer of " +
                 std::to_string(size_) + " elements", where);
        }
    }
    // A scalar read of GM (the scalar pipe; GM ordering is not simulated).
    T GetValue(uint64_t i, loc where = loc::current()) const {
        check(i, 1, where);
        issue(PIPE_S, where);
        ++g_core->scalar_ops;
        count_read(addr() + i, sizeof(T));
        return addr()[i];
    }

private:
    T* base_ = nullptr;
    uint64_t size_ = 0;
    uint64_t off_ = 0;
};

// ------------------------------------------------------------------------ UB
enum class BufState { FREE, ALLOCATED, ENQUEUED, DEQUEUED, SCRATCH };
struct BufRec {
    size_t offset;
    size_t bytes;
    BufState state;
    uint64_t gen;
};

template <typename T>
class LocalTensor {
public:
    LocalTensor() = default;
    LocalTensor(BufRec* rec, uint64_t gen, size_t elem_off = 0)
        : rec_(rec), gen_(gen), elem_off_(elem_off) {}
    LocalTensor operator[](uint64_t offset) const {
        return LocalTensor(rec_, gen_, elem_off_ + offset);
    }
    // The same bytes seen as another element type.
    template <typename U>
    LocalTensor<U> ReinterpretCast() const {
        return LocalTensor<U>(rec_, gen_, elem_off_ * sizeof(T) / sizeof(U));
    }
    // Checks a use of [0, count) from this view (aligned to `align` bytes: 32 for a vector
    // operand) and returns the data pointer.
    T* use(uint64_t count, const loc& where, size_t align = BLOCK_BYTES) const {
        if (rec_ == nullptr) fail("LocalTensor used before allocation", where);
        if (rec_->gen != gen_ || rec_->state == BufState::FREE)
            fail("use of a LocalTensor after FreeTensor", where);
        if (rec_->state == BufState::ENQUEUED)
            fail("use of a LocalTensor that is enqueued (DeQue it first)", where);
        size_t begin = byte_at(0);
        if (begin % align)
            fail("UB operand at byte " + std::to_string(begin) + " is not " +
                 std::to_string(align) + "-byte aligned", where);
        if ((elem_off_ + count) * sizeof(T) > rec_->bytes)
            fail("UB access of " + std::to_string(count) + " elements at " +
                 std::to_string(elem_off_) + " overruns a buffer of " +
                 std::to_string(rec_->bytes) + " bytes", where);
        return reinterpret_cast<T*>(g_core->ub.data() + begin);
    }
    // use(), as read / written by the instruction `in` (the pipe checks).
    const T* rd(uint64_t count, const Instr& in) const {
        T* p = use(count, in.where);
        ub_read(byte_at(0), count * sizeof(T), in);
        return p;
    }
    T* wr(uint64_t count, const Instr& in) const {
        T* p = use(count, in.where);
        ub_write(byte_at(0), count * sizeof(T), in);
        return p;
    }
    // The UB byte of element i of this view.
    size_t byte_at(uint64_t i) const { return rec_->offset + (elem_off_ + i) * sizeof(T); }
    // Scalar access (the scalar pipe).
    T GetValue(uint64_t i, loc where = loc::current()) const {
        T& e = use_elem(i, where);
        ++g_core->scalar_ops;
        ub_read(byte_at(i), sizeof(T), issue(PIPE_S, where));
        return e;
    }
    void SetValue(uint64_t i, T v, loc where = loc::current()) const {
        T& e = use_elem(i, where);
        ++g_core->scalar_ops;
        ub_write(byte_at(i), sizeof(T), issue(PIPE_S, where));
        e = v;
    }
    BufRec* rec() const { return rec_; }
    uint64_t gen() const { return gen_; }
    // Bytes of the buffer from this view on.
    size_t bytes_left() const { return rec_ ? rec_->bytes - elem_off_ * sizeof(T) : 0; }

private:
    T& use_elem(uint64_t i, const loc& where) const {
        if (rec_ == nullptr || rec_->gen != gen_ || rec_->state == BufState::FREE)
            fail("use of a LocalTensor after FreeTensor", where);
        if ((elem_off_ + i + 1) * sizeof(T) > rec_->bytes)
            fail("UB element " + std::to_string(elem_off_ + i) + " is out of bounds", where);
        return reinterpret_cast<T*>(g_core->ub.data() + rec_->offset)[elem_off_ + i];
    }
    BufRec* rec_ = nullptr;
    uint64_t gen_ = 0;
    size_t elem_off_ = 0;
};

class TPipe;

// The pipes a queue hands its tiles between: VECIN from the GM->UB copies to the vector
// unit, VECOUT from the vector unit to the UB->GM copies.
constexpr int que_producer(QuePosition p) {
    return p == QuePosition::VECIN ? PIPE_MTE2 : p == QuePosition::VECOUT ? PIPE_V : -1;
}
constexpr int que_consumer(QuePosition p) {
    return p == QuePosition::VECIN ? PIPE_V : p == QuePosition::VECOUT ? PIPE_MTE3 : -1;
}

template <QuePosition P, int32_t DEPTH>
class TQue {
public:
    template <typename T>
    LocalTensor<T> AllocTensor(loc where = loc::current()) {
        for (auto& b : bufs_) {
            if (b->state == BufState::FREE) {
                b->state = BufState::ALLOCATED;
                b->gen += 1;
                // a refill after this queue's own previous tile (not the first fill, which
                // may follow another kernel's use of the bytes)
                if (que_producer(P) >= 0 && b->gen > 1)
                    ub_reclaim(b->offset, b->bytes, que_producer(P), que_consumer(P));
                return LocalTensor<T>(b.get(), b->gen);
            }
        }
        if (bufs_.empty()) fail("AllocTensor on a queue without InitBuffer", where);
        fail("AllocTensor with no free buffer (all " + std::to_string(bufs_.size()) +
             " are in use: FreeTensor them first)", where);
    }
    template <typename T>
    void EnQue(const LocalTensor<T>& t, loc where = loc::current()) {
        if (!owns(t.rec())) fail("EnQue of a tensor from another queue", where);
        if (t.rec()->gen != t.gen() || t.rec()->state != BufState::ALLOCATED)
            fail("EnQue of a tensor that is not freshly allocated", where);
        if (static_cast<int32_t>(fifo_.size()) >= DEPTH)
            fail("EnQue beyond the queue depth " + std::to_string(DEPTH), where);
        t.rec()->state = BufState::ENQUEUED;
        fifo_.push_back(t.rec());
    }
    template <typename T>
    LocalTensor<T> DeQue(loc where = loc::current()) {
        if (fifo_.empty()) fail("DeQue on an empty queue (EnQue first)", where);
        BufRec* b = fifo_.front();
        fifo_.erase(fifo_.begin());
        b->state = BufState::DEQUEUED;
        if constexpr (que_producer(P) >= 0)
            ub_hand_over(b->offset, b->bytes, que_producer(P), que_consumer(P));
        return LocalTensor<T>(b, b->gen);
    }
    template <typename T>
    void FreeTensor(const LocalTensor<T>& t, loc where = loc::current()) {
        if (!owns(t.rec())) fail("FreeTensor of a tensor from another queue", where);
        if (t.rec()->gen != t.gen() || t.rec()->state == BufState::FREE)
            fail("FreeTensor of a tensor that was already freed", where);
        if (t.rec()->state == BufState::ENQUEUED)
            fail("FreeTensor of a tensor still enqueued", where);
        t.rec()->state = BufState::FREE;
    }

private:
    friend class TPipe;
    bool owns(BufRec* r) const {
        for (auto& b : bufs_) if (b.get() == r) return true;
        return false;
    }
    std::vector<std::unique_ptr<BufRec>> bufs_;
    std::vector<BufRec*> fifo_;
};

template <TPosition P>
class TBuf {
public:
    template <typename T>
    LocalTensor<T> Get(loc where = loc::current()) {
        if (!rec_) fail("TBuf::Get before InitBuffer", where);
        return LocalTensor<T>(rec_.get(), rec_->gen);
    }

private:
    friend class TPipe;
    std::unique_ptr<BufRec> rec_;
};

class TPipe {
public:
    // A kernel's TPipe takes the UB from its start: a SuperKernel's next sub-kernel reuses the
    // bytes the previous one used (the pipe checks then see any access the seam leaves
    // unordered). One TPipe at a time.
    TPipe(loc where = loc::current()) {
        if (g_core == nullptr) return;
        if (g_core->live_pipes > 0) fail("a second TPipe while another is alive", where);
        ++g_core->live_pipes;
        g_core->ub_used = 0;
        g_core->pipe = this;
    }
    ~TPipe() {
        if (g_core != nullptr && g_core->pipe == this) {
            --g_core->live_pipes;
            g_core->pipe = nullptr;
        }
    }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;
    template <QuePosition P, int32_t D>
    void InitBuffer(TQue<P, D>& q, int32_t num, uint32_t bytes, loc where = loc::current()) {
        if (num <= 0) fail("InitBuffer with " + std::to_string(num) + " buffers", where);
        for (int32_t i = 0; i < num; ++i) {
            q.bufs_.push_back(std::make_unique<BufRec>(
                BufRec{reserve(bytes, where), round32(bytes), BufState::FREE, 0}));
        }
    }
    template <TPosition P>
    void InitBuffer(TBuf<P>& b, uint32_t bytes, loc where = loc::current()) {
        b.rec_ = std::make_unique<BufRec>(
            BufRec{reserve(bytes, where), round32(bytes), BufState::SCRATCH, 1});
    }
    // An event id for E that no AllocEventID holds (not reserved: for a SetFlag followed by
    // its WaitFlag).
    TEventID FetchEventID(HardEvent evt, loc where = loc::current()) {
        const int ev = static_cast<int>(evt);
        for (int i = 0; i < EVENT_IDS; ++i)
            if (!g_core->events[ev][i].allocated) return TEventID::sim_make(ev, i);
        fail(std::string("FetchEventID: every id of HardEvent::") + EVENT_INFO[ev].name +
             " is allocated", where);
    }
    template <HardEvent E>
    TEventID FetchEventID(loc where = loc::current()) { return FetchEventID(E, where); }
    template <HardEvent E>
    TEventID AllocEventID(loc where = loc::current()) {
        const int ev = static_cast<int>(E);
        for (int i = 0; i < EVENT_IDS; ++i) {
            if (!g_core->events[ev][i].allocated) {
                g_core->events[ev][i].allocated = true;
                return TEventID::sim_make(ev, i);
            }
        }
        fail(std::string("AllocEventID: all ") + std::to_string(EVENT_IDS) +
             " ids of HardEvent::" + EVENT_INFO[ev].name + " are allocated", where);
    }
    template <HardEvent E>
    void ReleaseEventID(TEventID id, loc where = loc::current()) {
        EventSlot& s = event_slot(static_cast<int>(E), id, "ReleaseEventID", where);
        if (!s.allocated) fail("ReleaseEventID of an id AllocEventID did not give", where);
        if (s.pending) fail("ReleaseEventID of an id whose SetFlag has no WaitFlag yet", where);
        s.allocated = false;
    }

private:
    static size_t round32(size_t b) { return (b + BLOCK_BYTES - 1) / BLOCK_BYTES * BLOCK_BYTES; }
    size_t reserve(uint32_t bytes, const loc& where) {
        size_t off = g_core->ub_used;
        size_t need = round32(bytes);
        if (off + need > g_core->ub.size())
            fail("UB overflow: InitBuffer needs " + std::to_string(off + need) +
                 " bytes in all, the Unified Buffer has " + std::to_string(g_core->ub.size()),
                 where);
        g_core->ub_used = off + need;
        g_core->ub_peak = std::max(g_core->ub_peak, g_core->ub_used);
        g_shadow.grow(off + need);
        return off;
    }
};
inline TPipe* GetTPipePtr() { return static_cast<TPipe*>(g_core->pipe); }

// ---------------------------------------------------------------- data moves
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count,
              loc where = loc::current()) {
    const Instr in = issue(PIPE_MTE2, where);
    if ((count * sizeof(T)) % BLOCK_BYTES)
        fail("DataCopy of " + std::to_string(count * sizeof(T)) +
             " bytes is not a multiple of 32 (use DataCopyPad)", where);
    src.check(0, count, where);
    std::memcpy(dst.wr(count, in), src.addr(), count * sizeof(T));
    count_read(src.addr(), count * sizeof(T));
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count,
              loc where = loc::current()) {
    const Instr in = issue(PIPE_MTE3, where);
    if ((count * sizeof(T)) % BLOCK_BYTES)
        fail("DataCopy of " + std::to_string(count * sizeof(T)) +
             " bytes is not a multiple of 32 (use DataCopyPad)", where);
    dst.check(0, count, where);
    std::memcpy(dst.addr(), src.rd(count, in), count * sizeof(T));
    count_write(dst.addr(), count * sizeof(T));
}

struct DataCopyExtParams {
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;   // bytes
    uint32_t srcStride = 0;  // GM side: bytes; UB side: 32-byte blocks
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
    bool isPad = false;
    uint8_t leftPadding = 0;   // elements
    uint8_t rightPadding = 0;  // elements
    T paddingValue = T();
};

inline void check_pad_params(const DataCopyExtParams& p, size_t elem, const loc& where) {
    if (p.blockCount == 0 || p.blockCount > MAX_BLOCK_COUNT)
        fail("DataCopyPad blockCount " + std::to_string(p.blockCount) + " is outside 1..4095",
             where);
    if (p.blockLen == 0 || p.blockLen % elem)
        fail("DataCopyPad blockLen " + std::to_string(p.blockLen) +
             " bytes is not a positive multiple of the element size", where);
}

// GM -> UB: each block lands 32-byte aligned in UB; padding fills up to the aligned length.
template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                 const DataCopyExtParams& p, const DataCopyPadExtParams<T>& pad,
                 loc where = loc::current()) {
    const Instr in = issue(PIPE_MTE2, where);
    check_pad_params(p, sizeof(T), where);
    if ((pad.leftPadding + pad.rightPadding) * sizeof(T) > MAX_PAD_BYTES)
        fail("DataCopyPad padding exceeds 32 bytes", where);
    size_t n = p.blockLen / sizeof(T);
    size_t row = (pad.leftPadding + n + pad.rightPadding) * sizeof(T);
    size_t row_blocks = (row + BLOCK_BYTES - 1) / BLOCK_BYTES + p.dstStride;
    size_t ub_elems = (p.blockCount * row_blocks * BLOCK_BYTES) / sizeof(T);
    T* out = dst.use(ub_elems - p.dstStride * BLOCK_BYTES / sizeof(T), where);
    size_t gm_step = (p.blockLen + p.srcStride) / sizeof(T);
    if (p.srcStride % sizeof(T)) fail("DataCopyPad srcStride is not whole elements", where);
    size_t aligned = ((row + BLOCK_BYTES - 1) / BLOCK_BYTES * BLOCK_BYTES) / sizeof(T);
    for (size_t b = 0; b < p.blockCount; ++b) {
        src.check(b * gm_step, n, where);
        size_t first = b * row_blocks * BLOCK_BYTES / sizeof(T);
        ub_write(dst.byte_at(first), aligned * sizeof(T), in);
        T* r = out + first;
        for (size_t i = 0; i < aligned; ++i) r[i] = pad.paddingValue;
        std::memcpy(r + pad.leftPadding, src.addr() + b * gm_step, p.blockLen);
        count_read(src.addr() + b * gm_step, p.blockLen);
    }
}

// UB -> GM: blocks read 32-byte aligned from UB, written with a GM byte stride.
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                 const DataCopyExtParams& p, loc where = loc::current()) {
    const Instr in = issue(PIPE_MTE3, where);
    check_pad_params(p, sizeof(T), where);
    size_t n = p.blockLen / sizeof(T);
    size_t row_blocks = (p.blockLen + BLOCK_BYTES - 1) / BLOCK_BYTES + p.srcStride;
    const T* inp = src.use((p.blockCount - 1) * row_blocks * BLOCK_BYTES / sizeof(T) + n, where);
    if (p.dstStride % sizeof(T)) fail("DataCopyPad dstStride is not whole elements", where);
    size_t gm_step = (p.blockLen + p.dstStride) / sizeof(T);
    for (size_t b = 0; b < p.blockCount; ++b) {
        dst.check(b * gm_step, n, where);
        size_t first = b * row_blocks * BLOCK_BYTES / sizeof(T);
        ub_read(src.byte_at(first), p.blockLen, in);
        std::memcpy(dst.addr() + b * gm_step, inp + first, p.blockLen);
        count_write(dst.addr() + b * gm_step, p.blockLen);
    }
}

// ------------------------------------------------- the real API's type rules
// Facts of the Ascend C devkit's implementation for the A2/A3 vector unit (dav-c220): the
// element types each instruction the generator uses takes, and which Cast pairs exist with
// which round modes. On the device a kernel breaking one does not compile (no instruction for
// the type), or stops in a debug build and computes garbage in a release one; here it is an
// error naming the line, so a kernel that passes the simulator also type-checks against the
// real headers.
template <typename... Ts>
struct Types {};
using ArithTypes = Types<half, float, int16_t, int32_t>;  // Add Sub Mul Max Min, Adds Muls Maxs Mins
using FloatTypes = Types<half, float>;  // Div, Exp Ln Abs Sqrt Rsqrt Reciprocal, reductions,
                                        // Compare, Select, the high-level math
using ReluTypes = Types<half, float, int32_t>;
using DupTypes = Types<half, bfloat16_t, int16_t, uint16_t, int32_t, uint32_t, float>;
using BrcbTypes = Types<int16_t, uint16_t, int32_t, uint32_t, half, bfloat16_t, float>;

template <typename T>
constexpr const char* type_name() {
    if constexpr (std::is_same_v<T, half>) return "half";
    else if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, bfloat16_t>) return "bfloat16_t";
    else if constexpr (std::is_same_v<T, int8_t>) return "int8_t";
    else if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
    else if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
    else if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
    else if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
    else if constexpr (std::is_same_v<T, uint32_t>) return "uint32_t";
    else if constexpr (std::is_same_v<T, int64_t>) return "int64_t";
    else if constexpr (std::is_same_v<T, uint64_t>) return "uint64_t";
    else return "another type";
}

// An instruction `api` on elements of T: one of the types the device's instruction takes.
template <typename T, typename... Ok>
inline void takes(Types<Ok...>, const char* api, const loc& where) {
    if constexpr (!(std::is_same_v<T, Ok> || ...)) {
        std::string ok;
        ((ok += (ok.empty() ? "" : ", ") + std::string(type_name<Ok>())), ...);
        fail(std::string(api) + " on " + type_name<T>() + ": the vector unit's " + api +
                 " takes " + ok,
             where);
    }
}

constexpr uint32_t mode_bit(RoundMode m) { return 1u << static_cast<int>(m); }
inline const char* mode_name(int m) {
    static const char* names[] = {"CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL",
                                  "CAST_ROUND", "CAST_TRUNC", "CAST_ODD"};
    return names[m];
}

// The round modes of a Cast from S to D (a bit each), 0 when the vector unit has no such
// Cast: the pairs of the devkit's CheckCastDatatype, each with the modes its instructions
// have. There is no Cast between uint8_t (bool) and float: bytes go through half. A float
// to float Cast rounds to an integral value and takes no CAST_NONE; int32_t -> half is a
// dequantising cast (SetDeqScale), not modelled.
template <typename S, typename D>
constexpr uint32_t cast_modes() {
    constexpr uint32_t N = mode_bit(RoundMode::CAST_NONE);
    constexpr uint32_t R = mode_bit(RoundMode::CAST_RINT) | mode_bit(RoundMode::CAST_FLOOR) |
                           mode_bit(RoundMode::CAST_CEIL) | mode_bit(RoundMode::CAST_ROUND) |
                           mode_bit(RoundMode::CAST_TRUNC);  // the rounding modes
    constexpr uint32_t O = mode_bit(RoundMode::CAST_ODD);
    using std::is_same_v;
    if constexpr (is_same_v<S, half>) {
        if constexpr (is_same_v<D, float>) return N;
        if constexpr (is_same_v<D, int32_t> || is_same_v<D, int16_t>) return R;
        if constexpr (is_same_v<D, int8_t> || is_same_v<D, uint8_t>) return R | N;
    } else if constexpr (is_same_v<S, float>) {
        if constexpr (is_same_v<D, half>) return R | O | N;
        if constexpr (is_same_v<D, float> || is_same_v<D, bfloat16_t> ||
                      is_same_v<D, int32_t> || is_same_v<D, int16_t> ||
                      is_same_v<D, int64_t>) return R;
    } else if constexpr (is_same_v<S, bfloat16_t>) {
        if constexpr (is_same_v<D, float>) return N;
        if constexpr (is_same_v<D, int32_t>) return R;
    } else if constexpr (is_same_v<S, uint8_t> || is_same_v<S, int8_t>) {
        if constexpr (is_same_v<D, half>) return N;
    } else if constexpr (is_same_v<S, int16_t>) {
        if constexpr (is_same_v<D, half>) return R | N;
        if constexpr (is_same_v<D, float>) return N;
    } else if constexpr (is_same_v<S, int32_t>) {
        if constexpr (is_same_v<D, float>) return R | N;
        if constexpr (is_same_v<D, int16_t> || is_same_v<D, int64_t>) return N;
    } else if constexpr (is_same_v<S, int64_t>) {
        if constexpr (is_same_v<D, int32_t>) return N;
        if constexpr (is_same_v<D, float>) return R;
    }
    return 0;
}

template <typename S, typename... Ds>
std::string casts_from(Types<Ds...>) {
    std::string out;
    ((out += cast_modes<S, Ds>() ? (out.empty() ? "" : ", ") + std::string(type_name<Ds>())
                                 : std::string()),
     ...);
    return out.empty() ? "nothing" : out;
}

template <typename S, typename D>
void check_cast(RoundMode mode, const loc& where) {
    constexpr uint32_t ok = cast_modes<S, D>();
    const std::string pair = std::string(type_name<S>()) + " to " + type_name<D>();
    if constexpr (ok == 0) {
        fail("Cast from " + pair + ": the vector unit has no such cast (from " +
                 type_name<S>() + " it casts to " +
                 casts_from<S>(Types<half, float, bfloat16_t, int8_t, uint8_t, int16_t,
                                     int32_t, int64_t>{}) +
                 ")",
             where);
    } else if (!(ok & mode_bit(mode))) {
        std::string modes;
        for (int m = 0; m < 7; ++m)
            if (ok & (1u << m)) modes += (modes.empty() ? "" : ", ") + std::string(mode_name(m));
        fail("Cast from " + pair + " with RoundMode::" + mode_name(static_cast<int>(mode)) +
                 ": that cast takes " + modes,
             where);
    }
}

// ------------------------------------------------------------- vector unit
#define GK_SIM_BINARY(NAME, EXPR, TYPES)                                                    \
    template <typename T>                                                                   \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, \
              int32_t count, loc where = loc::current()) {                                  \
        takes<T>(TYPES{}, #NAME, where);                                                    \
        const Instr in = vec(where);                                                        \
        const T* x = a.rd(count, in);                                                       \
        const T* y = b.rd(count, in);                                                       \
        T* z = dst.wr(count, in);                                                           \
        for (int32_t i = 0; i < count; ++i) {                                               \
            float l = static_cast<float>(x[i]), r = static_cast<float>(y[i]);               \
            z[i] = static_cast<T>(EXPR);                                                    \
        }                                                                                   \
    }
// The binary and tensor-scalar ops, each with its float expression (l, r: the operands; s:
// the scalar) and the element types it takes, for the count forms here and the mask/repeat
// forms below.
#define GK_SIM_BINARY_OPS(X)                                                                \
    X(Add, l + r, ArithTypes) X(Sub, l - r, ArithTypes) X(Mul, l * r, ArithTypes)           \
    X(Div, l / r, FloatTypes) X(Max, (l > r ? l : r), ArithTypes)                           \
    X(Min, (l < r ? l : r), ArithTypes)
#define GK_SIM_SCALAR_OPS(X)                                                                \
    X(Adds, l + s, ArithTypes) X(Muls, l * s, ArithTypes) X(Maxs, (l > s ? l : s), ArithTypes) \
    X(Mins, (l < s ? l : s), ArithTypes)
GK_SIM_BINARY_OPS(GK_SIM_BINARY)
#undef GK_SIM_BINARY

// And/Or: 16-bit integers only (wider words are passed as twice as many int16).
#define GK_SIM_BITWISE(NAME, OP)                                                            \
    template <typename T>                                                                   \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, \
              int32_t count, loc where = loc::current()) {                                  \
        static_assert(std::is_same_v<T, int16_t> || std::is_same_v<T, uint16_t>,           \
                      #NAME " takes int16_t/uint16_t tensors");                            \
        const Instr in = vec(where);                                                        \
        const T* x = a.rd(count, in);                                                       \
        const T* y = b.rd(count, in);                                                       \
        T* z = dst.wr(count, in);                                                           \
        for (int32_t i = 0; i < count; ++i) z[i] = static_cast<T>(x[i] OP y[i]);           \
    }
GK_SIM_BITWISE(And, &)
GK_SIM_BITWISE(Or, |)
#undef GK_SIM_BITWISE

#define GK_SIM_SCALAR(NAME, EXPR, TYPES)                                                \
    template <typename T>                                                               \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, T scalar, int32_t count, \
              loc where = loc::current()) {                                             \
        takes<T>(TYPES{}, #NAME, where);                                                \
        const Instr in = vec(where);                                                    \
        const T* x = a.rd(count, in);                                                   \
        T* z = dst.wr(count, in);                                                       \
        float s = static_cast<float>(scalar);                                           \
        for (int32_t i = 0; i < count; ++i) {                                           \
            float l = static_cast<float>(x[i]);                                         \
            z[i] = static_cast<T>(EXPR);                                                \
        }                                                                               \
    }
GK_SIM_SCALAR_OPS(GK_SIM_SCALAR)
#undef GK_SIM_SCALAR

// dst[i] = f(a[i]) for count elements, computed in float.
template <typename T, typename F>
void map_unary(const LocalTensor<T>& dst, const LocalTensor<T>& a, int32_t count,
               const Instr& in, F f) {
    const T* x = a.rd(count, in);
    T* z = dst.wr(count, in);
    for (int32_t i = 0; i < count; ++i) z[i] = static_cast<T>(f(static_cast<float>(x[i])));
}

#define GK_SIM_UNARY(NAME, EXPR, TYPES)                                                  \
    template <typename T>                                                                \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, int32_t count,          \
              loc where = loc::current()) {                                              \
        takes<T>(TYPES{}, #NAME, where);                                                 \
        map_unary(dst, a, count, vec(where), [](float v) { return EXPR; });              \
    }
GK_SIM_UNARY(Exp, std::exp(v), FloatTypes)
GK_SIM_UNARY(Ln, std::log(v), FloatTypes)
GK_SIM_UNARY(Abs, std::fabs(v), FloatTypes)
GK_SIM_UNARY(Sqrt, std::sqrt(v), FloatTypes)
GK_SIM_UNARY(Rsqrt, 1.0f / std::sqrt(v), FloatTypes)
GK_SIM_UNARY(Reciprocal, 1.0f / v, FloatTypes)
GK_SIM_UNARY(Relu, (v > 0.0f ? v : 0.0f), ReluTypes)
#undef GK_SIM_UNARY

template <typename T>
void Duplicate(const LocalTensor<T>& dst, T scalar, int32_t count, loc where = loc::current()) {
    takes<T>(DupTypes{}, "Duplicate", where);
    T* z = dst.wr(count, vec(where));
    for (int32_t i = 0; i < count; ++i) z[i] = scalar;
}

template <typename T>
constexpr bool is_float_type() {
    return std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>;
}

// A Cast the vector unit has (check_cast). float -> float rounds to an integral value by the
// mode; a narrowing float cast rounds to nearest even (CAST_NONE / CAST_RINT, the modes
// simulated for it); integer destinations round by the mode (CAST_NONE: toward zero).
template <typename D, typename S>
void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode mode, int32_t count,
          loc where = loc::current()) {
    check_cast<S, D>(mode, where);
    const Instr in = vec(where);
    const S* x = src.rd(count, in);
    D* z = dst.wr(count, in);
    constexpr bool integral = !is_float_type<D>() || std::is_same_v<D, S>;
    if (!integral && mode != RoundMode::CAST_NONE && mode != RoundMode::CAST_RINT)
        fail("Cast to another float type with a rounding mode other than CAST_NONE/CAST_RINT "
             "is not simulated", where);
    for (int32_t i = 0; i < count; ++i) {
        float v = static_cast<float>(x[i]);
        if (integral) {
            switch (mode) {
                case RoundMode::CAST_FLOOR: v = std::floor(v); break;
                case RoundMode::CAST_CEIL: v = std::ceil(v); break;
                case RoundMode::CAST_ROUND: v = std::round(v); break;
                case RoundMode::CAST_RINT: v = std::nearbyint(v); break;
                case RoundMode::CAST_TRUNC: v = std::trunc(v); break;
                default: if (!is_float_type<D>()) v = std::trunc(v); break;
            }
        }
        z[i] = static_cast<D>(v);
    }
}

enum class CMPMODE { LT, GT, EQ, LE, GE, NE };
enum class SELMODE { VSEL_CMPMASK_SPR, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };

// Bit i of dst (a bit mask, 8 elements per byte) = a[i] <mode> b[i]. count * sizeof(T) must
// be a multiple of 256 bytes (whole repeats).
template <typename T>
void Compare(const LocalTensor<uint8_t>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,
             CMPMODE mode, uint32_t count, loc where = loc::current()) {
    if (mode == CMPMODE::EQ)  // equality also of int32_t; the orderings of half and float
        takes<T>(Types<half, float, int32_t>{}, "Compare (CMPMODE::EQ)", where);
    else
        takes<T>(FloatTypes{}, "Compare", where);
    if ((count * sizeof(T)) % 256)
        fail("Compare of " + std::to_string(count * sizeof(T)) +
             " bytes is not a multiple of 256 (whole repeats)", where);
    const Instr in = vec(where);
    const T* x = a.rd(count, in);
    const T* y = b.rd(count, in);
    uint8_t* m = dst.wr(count / 8, in);
    for (uint32_t i = 0; i < count / 8; ++i) m[i] = 0;
    for (uint32_t i = 0; i < count; ++i) {
        float l = static_cast<float>(x[i]), r = static_cast<float>(y[i]);
        bool bit = false;
        switch (mode) {
            case CMPMODE::LT: bit = l < r; break;
            case CMPMODE::GT: bit = l > r; break;
            case CMPMODE::EQ: bit = l == r; break;
            case CMPMODE::LE: bit = l <= r; break;
            case CMPMODE::GE: bit = l >= r; break;
            case CMPMODE::NE: bit = l != r; break;
        }
        if (bit) m[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
}

// dst[i] = bit i of mask ? a[i] : b[i] (tensor-tensor mode).
template <typename T>
void Select(const LocalTensor<T>& dst, const LocalTensor<uint8_t>& mask, const LocalTensor<T>& a,
            const LocalTensor<T>& b, SELMODE mode, uint32_t count, loc where = loc::current()) {
    takes<T>(FloatTypes{}, "Select", where);
    if (mode != SELMODE::VSEL_TENSOR_TENSOR_MODE)
        fail("Select with two tensors needs VSEL_TENSOR_TENSOR_MODE", where);
    const Instr in = vec(where);
    const uint8_t* m = mask.rd((count + 7) / 8, in);
    const T* x = a.rd(count, in);
    const T* y = b.rd(count, in);
    T* z = dst.wr(count, in);
    for (uint32_t i = 0; i < count; ++i) z[i] = (m[i / 8] >> (i % 8)) & 1u ? x[i] : y[i];
}

// dst[i] = bit i of mask ? a[i] : scalar (tensor-scalar mode).
template <typename T>
void Select(const LocalTensor<T>& dst, const LocalTensor<uint8_t>& mask, const LocalTensor<T>& a,
            T scalar, SELMODE mode, uint32_t count, loc where = loc::current()) {
    takes<T>(FloatTypes{}, "Select", where);
    if (mode != SELMODE::VSEL_TENSOR_SCALAR_MODE)
        fail("Select with a scalar needs VSEL_TENSOR_SCALAR_MODE", where);
    const Instr in = vec(where);
    const uint8_t* m = mask.rd((count + 7) / 8, in);
    const T* x = a.rd(count, in);
    T* z = dst.wr(count, in);
    for (uint32_t i = 0; i < count; ++i) z[i] = (m[i / 8] >> (i % 8)) & 1u ? x[i] : scalar;
}

// Reductions of `count` elements to dst[0]; the work buffer must hold count elements. The
// vector unit reduces pairwise (a tree over the elements), not left to right; so does this.
#define GK_SIM_REDUCE(NAME, COMBINE)                                                       \
    template <typename T>                                                                  \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work, \
              int32_t count, loc where = loc::current()) {                                 \
        takes<T>(FloatTypes{}, #NAME, where);                                              \
        if (count <= 0) fail(#NAME " of " + std::to_string(count) + " elements", where);   \
        const Instr in = vec(where);                                                       \
        const T* x = src.rd(count, in);                                                    \
        work.wr(count, in);                                                                \
        T* z = dst.wr(1, in);                                                              \
        std::vector<float> v(x, x + count);                                                \
        for (size_t n = v.size(); n > 1; n = (n + 1) / 2) {                                \
            for (size_t i = 0; i < n / 2; ++i) {                                           \
                float l = v[2 * i], r = v[2 * i + 1];                                      \
                v[i] = static_cast<float>(static_cast<T>(COMBINE));  /* T's precision */  \
            }                                                                              \
            if (n % 2) v[n / 2] = v[n - 1];                                                \
        }                                                                                  \
        z[0] = static_cast<T>(v[0]);                                                       \
    }
GK_SIM_REDUCE(ReduceSum, l + r)
GK_SIM_REDUCE(ReduceMax, (std::isnan(l) || l > r ? l : r))
GK_SIM_REDUCE(ReduceMin, (std::isnan(l) || l < r ? l : r))
#undef GK_SIM_REDUCE

// High-level math with a caller-provided scratch buffer of at least count * 4 bytes.
#define GK_SIM_TMP_UNARY(NAME, EXPR)                                                       \
    template <typename T>                                                                  \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src,                        \
              const LocalTensor<uint8_t>& tmp, int32_t count, loc where = loc::current()) { \
        takes<T>(FloatTypes{}, #NAME, where);                                              \
        const Instr in = vec(where);                                                       \
        tmp.wr(static_cast<uint64_t>(count) * 4, in);                                      \
        map_unary(dst, src, count, in, [](float v) { return EXPR; });                      \
    }
GK_SIM_TMP_UNARY(Erf, std::erf(v))
GK_SIM_TMP_UNARY(Erfc, std::erfc(v))
GK_SIM_TMP_UNARY(Sin, std::sin(v))
GK_SIM_TMP_UNARY(Cos, std::cos(v))
GK_SIM_TMP_UNARY(Tan, std::tan(v))
GK_SIM_TMP_UNARY(Asin, std::asin(v))
GK_SIM_TMP_UNARY(Acos, std::acos(v))
GK_SIM_TMP_UNARY(Atan, std::atan(v))
GK_SIM_TMP_UNARY(Tanh, std::tanh(v))
GK_SIM_TMP_UNARY(Sigmoid, 1.0f / (1.0f + std::exp(-v)))
#undef GK_SIM_TMP_UNARY

// Power: x^e elementwise, a tensor or a scalar exponent, with the same scratch contract.
template <typename T>
void Power(const LocalTensor<T>& dst, const LocalTensor<T>& x, const LocalTensor<T>& e,
           const LocalTensor<uint8_t>& tmp, int32_t count, loc where = loc::current()) {
    takes<T>(FloatTypes{}, "Power", where);
    const Instr in = vec(where);
    tmp.wr(static_cast<uint64_t>(count) * 4, in);
    const T* a = x.rd(count, in);
    const T* b = e.rd(count, in);
    T* z = dst.wr(count, in);
    for (int32_t i = 0; i < count; ++i)
        z[i] = static_cast<T>(std::pow(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
template <typename T>
void Power(const LocalTensor<T>& dst, const LocalTensor<T>& x, T e,
           const LocalTensor<uint8_t>& tmp, int32_t count, loc where = loc::current()) {
    takes<T>(FloatTypes{}, "Power", where);
    const Instr in = vec(where);
    tmp.wr(static_cast<uint64_t>(count) * 4, in);
    float s = static_cast<float>(e);
    map_unary(dst, x, count, in, [s](float v) { return std::pow(v, s); });
}


// ------------------------------------------------- mask/repeat instruction forms
// One instruction issues `repeat` (0..255) repeats of up to 256 bytes; within a repeat the
// first `mask` elements (contiguous mask mode) are taken from 8 blocks of 32 bytes, block k
// at k * blkStride blocks from the repeat's start, repeat r at r * repStride blocks. The
// device's stride fields are 8-bit (repeat strides and the binary form's block strides) or
// 16-bit (the unary form's and Brcb's block strides): a value that does not fit would be cut
// silently there, so the simulator refuses it where the parameters are built.
inline uint32_t stride_field(int64_t v, int64_t max, const char* what, const loc& where) {
    if (v < 0 || v > max)
        fail(std::string(what) + " " + std::to_string(v) + " is outside 0.." +
             std::to_string(max), where);
    return static_cast<uint32_t>(v);
}

struct BinaryRepeatParams {
    BinaryRepeatParams(int64_t dstBlk = 1, int64_t src0Blk = 1, int64_t src1Blk = 1,
                       int64_t dstRep = 8, int64_t src0Rep = 8, int64_t src1Rep = 8,
                       loc where = loc::current())
        : dstBlkStride(stride_field(dstBlk, 255, "dstBlkStride", where)),
          src0BlkStride(stride_field(src0Blk, 255, "src0BlkStride", where)),
          src1BlkStride(stride_field(src1Blk, 255, "src1BlkStride", where)),
          dstRepStride(stride_field(dstRep, 255, "dstRepStride", where)),
          src0RepStride(stride_field(src0Rep, 255, "src0RepStride", where)),
          src1RepStride(stride_field(src1Rep, 255, "src1RepStride", where)) {}
    uint32_t dstBlkStride, src0BlkStride, src1BlkStride, dstRepStride, src0RepStride,
        src1RepStride;
};

struct UnaryRepeatParams {
    UnaryRepeatParams(int64_t dstBlk = 1, int64_t srcBlk = 1, int64_t dstRep = 8,
                      int64_t srcRep = 8, loc where = loc::current())
        : dstBlkStride(stride_field(dstBlk, 65535, "dstBlkStride", where)),
          srcBlkStride(stride_field(srcBlk, 65535, "srcBlkStride", where)),
          dstRepStride(stride_field(dstRep, 255, "dstRepStride", where)),
          srcRepStride(stride_field(srcRep, 255, "srcRepStride", where)) {}
    uint32_t dstBlkStride, srcBlkStride, dstRepStride, srcRepStride;
};

struct BrcbRepeatParams {
    BrcbRepeatParams(int64_t dstBlk = 1, int64_t dstRep = 8, loc where = loc::current())
        : dstBlkStride(stride_field(dstBlk, 65535, "dstBlkStride", where)),
          dstRepStride(stride_field(dstRep, 65535, "dstRepStride", where)) {}
    uint32_t dstBlkStride, dstRepStride;
};

inline void check_repeat(int64_t repeat, const loc& where) {
    if (repeat < 0 || repeat > MAX_REPEAT)
        fail("repeat " + std::to_string(repeat) + " is outside 0..255", where);
}
template <typename T>
void check_mask(int64_t mask, const loc& where) {
    constexpr int64_t per = REPEAT_BYTES / sizeof(T);
    if (mask < 1 || mask > per)
        fail("mask " + std::to_string(mask) + " is outside 1.." + std::to_string(per) +
             " (elements of one 256-byte repeat)", where);
}

// The elements a strided operand touches: element e of repeat r.
template <typename T>
struct Strided {
    static constexpr uint64_t EB = BLOCK_BYTES / sizeof(T);  // elements per block
    const LocalTensor<T>& t;
    uint64_t blk, rep;
    uint64_t index(int64_t r, uint64_t e) const {
        return static_cast<uint64_t>(r) * rep * EB + (e / EB) * blk * EB + e % EB;
    }
    // Checks the extent [0, last touched element] (alignment, bounds); returns the data.
    T* data(int64_t repeat, uint64_t mask, const loc& where, size_t align = BLOCK_BYTES) const {
        if (repeat == 0) return t.use(0, where, align);
        uint64_t last = 0;
        for (uint64_t e = 0; e < mask; ++e) last = std::max(last, index(repeat - 1, e));
        for (uint64_t e = 0; e < mask; ++e) last = std::max(last, index(0, e));
        return t.use(last + 1, where, align);
    }
    void read(int64_t r, uint64_t e, const Instr& in) const {
        ub_read(t.byte_at(index(r, e)), sizeof(T), in);
    }
    void write(int64_t r, uint64_t e, const Instr& in) const {
        ub_write(t.byte_at(index(r, e)), sizeof(T), in);
    }
};

// dst = a OP b, repeat by repeat (each repeat reads its operands before writing).
#define GK_SIM_BINARY_REPEAT(NAME, EXPR, TYPES)                                              \
    template <typename T>                                                                    \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,  \
              uint64_t mask, int64_t repeat, const BinaryRepeatParams& p,                    \
              loc where = loc::current()) {                                                  \
        takes<T>(TYPES{}, #NAME, where);                                                     \
        const Instr in = vec(where);                                                         \
        check_repeat(repeat, where);                                                         \
        check_mask<T>(static_cast<int64_t>(mask), where);                                    \
        Strided<T> D{dst, p.dstBlkStride, p.dstRepStride};                                   \
        Strided<T> A{a, p.src0BlkStride, p.src0RepStride};                                   \
        Strided<T> B{b, p.src1BlkStride, p.src1RepStride};                                   \
        const T* x = A.data(repeat, mask, where);                                            \
        const T* y = B.data(repeat, mask, where);                                            \
        T* z = D.data(repeat, mask, where);                                                  \
        float v[REPEAT_BYTES / sizeof(T)];                                                   \
        for (int64_t k = 0; k < repeat; ++k) {                                               \
            for (uint64_t e = 0; e < mask; ++e) {                                            \
                A.read(k, e, in);                                                            \
                B.read(k, e, in);                                                            \
                float l = static_cast<float>(x[A.index(k, e)]);                              \
                float r = static_cast<float>(y[B.index(k, e)]);                              \
                v[e] = EXPR;                                                                 \
            }                                                                                \
            for (uint64_t e = 0; e < mask; ++e) {                                            \
                D.write(k, e, in);                                                           \
                z[D.index(k, e)] = static_cast<T>(v[e]);                                     \
            }                                                                                \
        }                                                                                    \
    }
GK_SIM_BINARY_OPS(GK_SIM_BINARY_REPEAT)
#undef GK_SIM_BINARY_REPEAT

// dst = a OP scalar, repeat by repeat.
#define GK_SIM_SCALAR_REPEAT(NAME, EXPR, TYPES)                                              \
    template <typename T>                                                                    \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, T scalar, uint64_t mask,   \
              int64_t repeat, const UnaryRepeatParams& p, loc where = loc::current()) {      \
        takes<T>(TYPES{}, #NAME, where);                                                     \
        const Instr in = vec(where);                                                         \
        check_repeat(repeat, where);                                                         \
        check_mask<T>(static_cast<int64_t>(mask), where);                                    \
        Strided<T> D{dst, p.dstBlkStride, p.dstRepStride};                                   \
        Strided<T> A{a, p.srcBlkStride, p.srcRepStride};                                     \
        const T* x = A.data(repeat, mask, where);                                            \
        T* z = D.data(repeat, mask, where);                                                  \
        float s = static_cast<float>(scalar);                                                \
        float v[REPEAT_BYTES / sizeof(T)];                                                   \
        for (int64_t r = 0; r < repeat; ++r) {                                               \
            for (uint64_t e = 0; e < mask; ++e) {                                            \
                A.read(r, e, in);                                                            \
                float l = static_cast<float>(x[A.index(r, e)]);                              \
                v[e] = EXPR;                                                                 \
            }                                                                                \
            for (uint64_t e = 0; e < mask; ++e) {                                            \
                D.write(r, e, in);                                                           \
                z[D.index(r, e)] = static_cast<T>(v[e]);                                     \
            }                                                                                \
        }                                                                                    \
    }
GK_SIM_SCALAR_OPS(GK_SIM_SCALAR_REPEAT)
#undef GK_SIM_SCALAR_REPEAT
#undef GK_SIM_BINARY_OPS
#undef GK_SIM_SCALAR_OPS

// Brcb: each repeat takes 8 consecutive elements of src and fills one 32-byte block of dst
// with each (block k of repeat r at r * dstRepStride + k * dstBlkStride blocks; a block
// stride of 0 counts as 1). src and dst must not share memory.
template <typename T>
void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src, int64_t repeat,
          const BrcbRepeatParams& p, loc where = loc::current()) {
    takes<T>(BrcbTypes{}, "Brcb", where);
    const Instr in = vec(where);
    check_repeat(repeat, where);
    constexpr uint64_t EB = BLOCK_BYTES / sizeof(T);
    const uint64_t blk = p.dstBlkStride ? p.dstBlkStride : 1;
    const uint64_t n = 8 * static_cast<uint64_t>(repeat);
    const T* x = src.rd(n, in);
    const uint64_t last_block = repeat ? (repeat - 1) * p.dstRepStride + 7 * blk : 0;
    T* z = dst.use(repeat ? (last_block + 1) * EB : 0, where);
    const size_t s0 = src.byte_at(0), s1 = src.byte_at(n);
    const size_t d0 = dst.byte_at(0), d1 = dst.byte_at(repeat ? (last_block + 1) * EB : 0);
    if (repeat && s0 < d1 && d0 < s1) fail("Brcb with source and destination sharing UB", where);
    std::vector<T> vals(x, x + n);
    for (int64_t r = 0; r < repeat; ++r) {
        for (uint64_t k = 0; k < 8; ++k) {
            const uint64_t b = r * p.dstRepStride + k * blk;
            ub_write(dst.byte_at(b * EB), BLOCK_BYTES, in);
            for (uint64_t j = 0; j < EB; ++j) z[b * EB + j] = vals[r * 8 + k];
        }
    }
}

// BlockReduceMax: repeat r reduces each of its 8 blocks of 32 bytes (block k at k * srcBlkStride
// blocks, the repeat at r * srcRepStride blocks) over the elements the contiguous mask takes (the
// first `mask` of the repeat's) to one value, dst[r * dstRepStride * 8 + k] (dstRepStride counts
// a repeat's 8 results: 32 bytes of float, 16 of half); a block with no element in the mask
// writes nothing. The source starts on a 32-byte block, the destination on 32 bytes (float) or
// 16 (half): the public API's rules, checked here.
template <typename T>
void BlockReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t repeat,
                    int32_t mask, int32_t dstRepStride, int32_t srcBlkStride,
                    int32_t srcRepStride, loc where = loc::current()) {
    takes<T>(FloatTypes{}, "BlockReduceMax", where);
    const Instr in = vec(where);
    check_repeat(repeat, where);
    check_mask<T>(mask, where);
    constexpr uint64_t EB = BLOCK_BYTES / sizeof(T);
    Strided<T> S{src, stride_field(srcBlkStride, 255, "srcBlkStride", where),
                 stride_field(srcRepStride, 255, "srcRepStride", where)};
    const uint64_t dstep = stride_field(dstRepStride, 255, "dstRepStride", where) * 8;
    const uint64_t blocks = (static_cast<uint64_t>(mask) + EB - 1) / EB;
    const T* x = S.data(repeat, mask, where);
    const size_t dalign = sizeof(T) == 2 ? 16 : BLOCK_BYTES;
    T* z = dst.use(repeat ? (repeat - 1) * dstep + blocks : 0, where, dalign);
    std::vector<float> v(8);
    for (int64_t r = 0; r < repeat; ++r) {
        for (uint64_t k = 0; k < blocks; ++k) {
            float m = 0.0f;
            for (uint64_t e = k * EB; e < std::min<uint64_t>((k + 1) * EB, mask); ++e) {
                S.read(r, e, in);
                const float y = static_cast<float>(x[S.index(r, e)]);
                m = (e == k * EB || std::isnan(y) || y > m) && !std::isnan(m) ? y : m;
            }
            v[k] = m;
        }
        for (uint64_t k = 0; k < blocks; ++k) {
            ub_write(dst.byte_at(r * dstep + k), sizeof(T), in);
            z[r * dstep + k] = static_cast<T>(v[k]);
        }
    }
}

// Gather (the count form, UB to UB): dst[i] = the element of src at byte srcBaseOffset +
// srcOffset[i] of src (offsets in bytes, relative to src's start; the table is uint32).
// Checked as the A2 headers document it: element types of 2 and 4 bytes; dst, src and the
// table 32-byte aligned (vector operands); srcBaseOffset a multiple of sizeof(T) inside src;
// count at most the elements of src and of the table; the count form issues count / (256 /
// sizeof(T)) full repeats in one instruction, at most 255. Each gathered address must be a
// whole element of src (a multiple of sizeof(T), inside src's buffer): the instruction reads
// whatever lies there otherwise. dst sharing UB with src or the table is refused (what the
// instruction reads of bytes it is writing is not documented).
using GatherTypes = Types<int16_t, uint16_t, int32_t, uint32_t, half, bfloat16_t, float>;
template <typename T>
void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src,
            const LocalTensor<uint32_t>& srcOffset, uint32_t srcBaseOffset, uint32_t count,
            loc where = loc::current()) {
    takes<T>(GatherTypes{}, "Gather", where);
    const Instr in = vec(where);
    if (count == 0) fail("Gather of 0 elements", where);
    const uint64_t per_repeat = 256 / sizeof(T);
    if (count / per_repeat > 255)
        fail("Gather of " + std::to_string(count) + " elements: " +
             std::to_string(count / per_repeat) + " repeats in one instruction (at most 255)",
             where);
    const uint64_t src_elems = src.bytes_left() / sizeof(T);
    const uint64_t table = srcOffset.bytes_left() / sizeof(uint32_t);
    if (count > src_elems || count > table)
        fail("Gather count " + std::to_string(count) + " exceeds the elements of src (" +
             std::to_string(src_elems) + ") or of srcOffset (" + std::to_string(table) + ")",
             where);
    const uint64_t src_bytes = src_elems * sizeof(T);
    if (srcBaseOffset % sizeof(T) || srcBaseOffset >= src_bytes)
        fail("Gather srcBaseOffset " + std::to_string(srcBaseOffset) + " is not a multiple of " +
             std::to_string(sizeof(T)) + " inside src's " + std::to_string(src_bytes) + " bytes",
             where);
    const uint32_t* off = srcOffset.rd(count, in);
    const T* x = src.rd(src_elems, in);
    std::vector<T> vals(count);
    for (uint32_t i = 0; i < count; ++i) {
        const uint64_t at = static_cast<uint64_t>(srcBaseOffset) + off[i];
        if (at % sizeof(T))
            fail("Gather offset " + std::to_string(off[i]) + " (element " + std::to_string(i) +
                 ") is not a multiple of " + std::to_string(sizeof(T)) + " bytes", where);
        if (at + sizeof(T) > src_bytes)
            fail("Gather offset " + std::to_string(off[i]) + " (element " + std::to_string(i) +
                 ") lies outside src's " + std::to_string(src_bytes) + " bytes", where);
        vals[i] = x[at / sizeof(T)];
    }
    const size_t d0 = dst.byte_at(0), d1 = dst.byte_at(count);
    const bool on_src = d0 < src.byte_at(src_elems) && src.byte_at(0) < d1;
    const bool on_table = d0 < srcOffset.byte_at(count) && srcOffset.byte_at(0) < d1;
    if (on_src || on_table) fail("Gather with its destination sharing UB with an operand", where);
    T* z = dst.wr(count, in);
    for (uint32_t i = 0; i < count; ++i) z[i] = vals[i];
}

// WholeReduceSum/Max/Min: repeat r reduces its first `mask` elements (source blocks at
// srcBlkStride, repeats at srcRepStride blocks) to dst[r * dstRepStride]: pairwise, in T's
// precision, as ReduceSum. The source must be 32-byte aligned, the destination only
// element-aligned. The strides take the 8-bit range of the repeat parameters (the
// simulator's conservative reading). Max/Min are simulated with ReduceOrder::ORDER_ONLY_VALUE
// (one value per repeat).
template <typename T, typename C>
void whole_reduce(const char* name, const LocalTensor<T>& dst, const LocalTensor<T>& src,
                  int32_t mask, int64_t repeat, int32_t dstRepStride, int32_t srcBlkStride,
                  int32_t srcRepStride, const loc& where, C combine) {
    takes<T>(FloatTypes{}, name, where);
    const Instr in = vec(where);
    check_repeat(repeat, where);
    check_mask<T>(mask, where);
    Strided<T> S{src, stride_field(srcBlkStride, 255, "srcBlkStride", where),
                 stride_field(srcRepStride, 255, "srcRepStride", where)};
    const uint64_t dstep = stride_field(dstRepStride, 255, "dstRepStride", where);
    const T* x = S.data(repeat, mask, where);
    T* z = dst.use(repeat ? (repeat - 1) * dstep + 1 : 0, where, sizeof(T));
    std::vector<float> v(mask);
    for (int64_t r = 0; r < repeat; ++r) {
        for (int32_t e = 0; e < mask; ++e) {
            S.read(r, e, in);
            v[e] = static_cast<float>(x[S.index(r, e)]);
        }
        for (size_t n = v.size(); n > 1; n = (n + 1) / 2) {
            for (size_t i = 0; i < n / 2; ++i)
                v[i] = static_cast<float>(static_cast<T>(combine(v[2 * i], v[2 * i + 1])));
            if (n % 2) v[n / 2] = v[n - 1];
        }
        ub_write(dst.byte_at(r * dstep), sizeof(T), in);
        z[r * dstep] = static_cast<T>(v[0]);
        v.assign(mask, 0.0f);
    }
}
template <typename T>
void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t mask,
                    int64_t repeat, int32_t dstRepStride, int32_t srcBlkStride,
                    int32_t srcRepStride, loc where = loc::current()) {
    whole_reduce("WholeReduceSum", dst, src, mask, repeat, dstRepStride, srcBlkStride,
                 srcRepStride, where, [](float l, float r) { return l + r; });
}
#define GK_SIM_WHOLE_REDUCE(NAME, COMBINE)                                                   \
    template <typename T>                                                                    \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t mask,            \
              int64_t repeat, int32_t dstRepStride, int32_t srcBlkStride,                    \
              int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX,      \
              loc where = loc::current()) {                                                  \
        if (order != ReduceOrder::ORDER_ONLY_VALUE)                                          \
            fail(#NAME " is simulated with ReduceOrder::ORDER_ONLY_VALUE only", where);      \
        whole_reduce(#NAME, dst, src, mask, repeat, dstRepStride, srcBlkStride,              \
                     srcRepStride, where, [](float l, float r) { return COMBINE; });         \
    }
GK_SIM_WHOLE_REDUCE(WholeReduceMax, (std::isnan(l) || l > r ? l : r))
GK_SIM_WHOLE_REDUCE(WholeReduceMin, (std::isnan(l) || l < r ? l : r))
#undef GK_SIM_WHOLE_REDUCE

}  // namespace AscendC

namespace AscendC {
using KernelCall = void (*)(uint8_t**);

// One core of a launch: its own Unified Buffer and counters; returns the error, or "".
inline std::string run_core(KernelCall call, uint8_t** args, const uint64_t* arg_bytes,
                            int32_t nargs, const char* name, int32_t b, int32_t blocks,
                            uint64_t ub_bytes, Core& core, std::barrier<>* bar,
                            int32_t sub = 0, bool aic = false) {
    core.kernel = name;
    core.args = args;
    core.arg_bytes = arg_bytes;
    core.arg_reads.assign(nargs, 0);
    core.block_idx = b;
    core.block_num = blocks;
    core.sub = sub;
    core.aic = aic;
    core.sys_workspace = nargs >= 2 ? args[nargs - 2] : nullptr;
    core.ub.assign(ub_bytes, 0xA5);
    core.ws_writes.clear();
    g_core = &core;
    g_barrier = bar;
    // this thread's shadow of the UB is reused; numbers up to `base` count as complete
    if (g_seq > 0xF0000000u) {
        g_shadow.clear();
        g_seq = 0;
    }
    core.base = g_seq;
    for (auto& row : core.known)
        for (auto& k : row) k = core.base;
    std::string error;
    try {
        call(args);
        if (core.mm_open > 0)
            error = std::string(name) + ": line " + std::to_string(core.mm_open_line) +
                    ": a Matmul object registered here never called End() (the cube side "
                    "would wait for it forever)";
        for (int e = 0; e < NEVENTS && error.empty(); ++e)
            for (int i = 0; i < EVENT_IDS; ++i)
                if (core.events[e][i].pending) {
                    error = std::string(name) + ": line " +
                            std::to_string(core.events[e][i].line) + ": SetFlag<HardEvent::" +
                            EVENT_INFO[e].name + "> has no WaitFlag before the kernel ends";
                    break;
                }
    } catch (const std::exception& e) {
        error = e.what();
        if (bar != nullptr) bar->arrive_and_drop();  // the others must not wait for us
    }
    g_core = nullptr;
    g_barrier = nullptr;
    core.lines = {};
    return error;
}

// Run `blocks` cores of a kernel over its `nargs` GM arguments and add up their counters: GM
// bytes read, written, scalar UB/GM accesses, syncs, vector instructions, ..., then the bytes
// read of each argument (counters[NCOUNTERS + i]). Cores run one after another, or (a
// SuperKernel: `threads`) as threads with a real barrier for SyncAll.
constexpr int NCOUNTERS = 10;
inline int launch(KernelCall call, const char* name, int32_t kernel_nargs, uint8_t** args,
                  const uint64_t* arg_bytes, int32_t nargs, int32_t blocks, uint64_t ub_bytes,
                  uint64_t* counters, char* err, int32_t errlen, bool threads) {
    if (nargs != kernel_nargs) {
        std::snprintf(err, errlen, "%s: the kernel takes %d GM arguments, %d given", name,
                      kernel_nargs, nargs);
        return 1;
    }
    // a MIX_AIC_1_2 launch has three cores a block (vector cores 0 and 1, the cube core)
    std::vector<Core> cores(3 * static_cast<size_t>(blocks));
    std::vector<std::string> errors(cores.size());
    std::vector<std::vector<int32_t>> writers(nargs);
    if (!threads)
        for (auto& c : cores) c.writers = &writers;
    std::vector<bool> ran(cores.size(), false);
    if (threads) {
        std::barrier<> bar(blocks);
        std::vector<std::thread> pool;
        for (int32_t b = 0; b < blocks; ++b)
            pool.emplace_back([&, b] {
                errors[b] = run_core(call, args, arg_bytes, nargs, name, b, blocks, ub_bytes,
                                     cores[b], &bar);
            });
        for (auto& t : pool) t.join();
        for (int32_t b = 0; b < blocks; ++b) {
            ran[b] = true;
            if (errors[b].empty() && cores[b].kernel_type == KERNEL_TYPE_MIX_AIC_1_2)
                errors[b] = std::string(name) + ": a KERNEL_TYPE_MIX_AIC_1_2 kernel launched "
                            "with its cores as threads (a SuperKernel of vector kernels)";
        }
    } else {
        for (int32_t b = 0; b < blocks; ++b) {
            Core& v0 = cores[3 * b];
            errors[3 * b] = run_core(call, args, arg_bytes, nargs, name, b, blocks, ub_bytes,
                                     v0, nullptr);
            ran[3 * b] = true;
            if (!errors[3 * b].empty()) break;
            if (v0.kernel_type != KERNEL_TYPE_MIX_AIC_1_2) continue;
            // the block's second vector core, then its cube core
            for (int k = 1; k < 3 && errors[3 * b + k - 1].empty(); ++k) {
                errors[3 * b + k] = run_core(call, args, arg_bytes, nargs, name, b, blocks,
                                             ub_bytes, cores[3 * b + k], nullptr,
                                             k == 1 ? 1 : 0, k == 2);
                ran[3 * b + k] = true;
            }
            if (!errors[3 * b + 1].empty() || !errors[3 * b + 2].empty()) break;
            // The cube core serves each Matmul object it registers until both vector cores'
            // clients of it quit (the Matmul server counts a quit from each of the two), and a
            // vector core's request is served only by an object the cube core registered: the
            // three cores of a block must register the same objects, in the same order.
            const Core& v1 = cores[3 * b + 1];
            const Core& c = cores[3 * b + 2];
            auto seq = [](const Core& x) {
                std::string r;
                for (uint32_t l : x.regs)
                    r += (r.empty() ? "line " : ", line ") + std::to_string(l);
                return r.empty() ? std::string("none") : r;
            };
            if (v0.regs != c.regs || v1.regs != c.regs) {
                errors[3 * b] = std::string(name) + ": block " + std::to_string(b) +
                                " of a KERNEL_TYPE_MIX_AIC_1_2 launch: its cube core registers "
                                "Matmul objects at " + seq(c) + ", its vector cores at " +
                                seq(v0) + " and " + seq(v1) + " (the cube core serves an "
                                "object until both vector cores' clients quit: on the device "
                                "the block would hang; every core of a block must reach the "
                                "same REGIST_MATMUL_OBJ calls)";
                break;
            }
        }
    }
    for (size_t b = 0; b < cores.size(); ++b) {
        if (!errors[b].empty()) {
            std::strncpy(err, errors[b].c_str(), errlen - 1);
            err[errlen - 1] = 0;
            return 1;
        }
    }
    for (size_t b = 0; b < cores.size(); ++b) {
        if (!ran[b]) continue;
        counters[0] += cores[b].gm_read;
        counters[1] += cores[b].gm_written;
        counters[2] += cores[b].scalar_ops;
        counters[3] += cores[b].syncs;
        counters[4] += cores[b].vector_ops;
        if (cores[b].ub_peak > counters[5]) counters[5] = cores[b].ub_peak;
        for (int k = 0; k < 4; ++k) counters[6 + k] += cores[b].mm_bytes[k];
        for (int32_t i = 0; i < nargs; ++i) counters[NCOUNTERS + i] += cores[b].arg_reads[i];
    }
    return 0;
}
}  // namespace AscendC

#include "matmul_sim.h"

#define KERNEL_TASK_TYPE_DEFAULT(type) AscendC::declare_kernel_type(AscendC::type)

// ------------------------------------------------------ tikicpulib's launch surface
// A driver written for CANN's CPU model of the AI core (tikicpulib: GM buffers from GmAlloc,
// SetKernelMode, ICPU_RUN_KF(kernel, blockDim, args...)) runs its kernel in this simulator
// instead: each argument's size is that of the GmAlloc holding it (for the GM bounds and the
// read counts), the cores run one after another, and an error ends the program with the
// kernel's name and line, as the CPU model's checks do. The UB is the A2 devkit's figure.
enum class KernelMode { MIX_MODE = 0, AIC_MODE, AIV_MODE, MIX_AIC_1_1 };
namespace AscendC {
constexpr uint64_t CPU_MODEL_UB_BYTES = 192 * 1024 - 256;
struct GmBlock {
    uint8_t* p;
    size_t n;
};
inline std::vector<GmBlock>& gm_blocks() {
    static std::vector<GmBlock> blocks;
    return blocks;
}
inline void* GmAlloc(size_t n) {
    auto* p = static_cast<uint8_t*>(std::calloc(n ? n : 1, 1));
    gm_blocks().push_back({p, n});
    return p;
}
inline void GmFree(void* p) {
    auto& v = gm_blocks();
    v.erase(std::remove_if(v.begin(), v.end(), [p](const GmBlock& b) { return b.p == p; }),
            v.end());
    std::free(p);
}
inline KernelMode g_kernel_mode = KernelMode::MIX_MODE;
inline void SetKernelMode(KernelMode m) { g_kernel_mode = m; }

template <typename F, size_t... I>
void call_kf(F f, uint8_t** a, std::index_sequence<I...>) {
    f(a[I]...);
}
template <auto F, size_t N>
void kf_trampoline(uint8_t** a) {
    call_kf(F, a, std::make_index_sequence<N>{});
}
template <typename... A>
void run_kf(void (*entry)(uint8_t**), const char* name, uint32_t blocks, A... args) {
    constexpr int n = sizeof...(A);
    uint8_t* argv[n] = {reinterpret_cast<uint8_t*>(args)...};
    uint64_t bytes[n];
    for (int i = 0; i < n; ++i) {
        bytes[i] = 0;
        for (const GmBlock& b : gm_blocks())
            if (argv[i] >= b.p && argv[i] < b.p + (b.n ? b.n : 1)) bytes[i] = b.p + b.n - argv[i];
    }
    std::vector<uint64_t> counters(NCOUNTERS + n, 0);
    char err[4096] = "";
    if (launch(entry, name, n, argv, bytes, n, static_cast<int32_t>(blocks), CPU_MODEL_UB_BYTES,
               counters.data(), err, sizeof err, false) != 0) {
        std::fprintf(stderr, "%s\n", err);
        std::exit(1);
    }
}
}  // namespace AscendC
#define ICPU_RUN_KF(func, blocks, ...)                                                       \
    AscendC::run_kf(&AscendC::kf_trampoline<func, std::tuple_size_v<decltype(std::make_tuple( \
                        __VA_ARGS__))>>, #func, blocks, __VA_ARGS__)

// The runner's entries: a kernel source defines gk_sim_call_<KERNEL>(uint8_t** args) over
// NARGS GM arguments (each given with its size in bytes, for the per-argument read counts).
#define GK_SIM_LAUNCHER_ENTRY(KERNEL, NARGS, THREADS)                                         \
    extern "C" int gk_sim_launch_##KERNEL(uint8_t** args, const uint64_t* arg_bytes,          \
                                          int32_t nargs, int32_t blocks, uint64_t ub_bytes,   \
                                          uint64_t* counters, char* err, int32_t errlen) {    \
        return AscendC::launch(gk_sim_call_##KERNEL, #KERNEL, NARGS, args, arg_bytes, nargs,  \
                               blocks, ub_bytes, counters, err, errlen, THREADS);             \
    }
#define GK_SIM_LAUNCHER(KERNEL, NARGS) GK_SIM_LAUNCHER_ENTRY(KERNEL, NARGS, false)
// A SuperKernel's entry: every core a thread, SyncAll a real barrier among them.
#define GK_SIM_LAUNCHER_SYNC(KERNEL, NARGS) GK_SIM_LAUNCHER_ENTRY(KERNEL, NARGS, true)
