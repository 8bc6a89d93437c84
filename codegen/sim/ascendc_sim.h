// graphkernel's clean-room CPU simulator of the Ascend C API subset its code generator emits.
//
// Written from the documented semantics (see the project's Ascend C reference), not from any
// vendor source. It is strict on purpose, so that code which would misbehave on the device
// fails here: the Unified Buffer budget over all InitBuffer calls, 32-byte alignment of UB
// tensors, DataCopy lengths that are not 32-byte multiples, DataCopyPad limits, queue
// discipline (order, depth, use after FreeTensor), GM and UB bounds. Every error names the
// kernel and the source line of the offending call. GM bytes read and written are counted
// per block.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
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
constexpr uint32_t MAX_BLOCK_COUNT = 4095;
constexpr uint32_t MAX_PAD_BYTES = 32;
using loc = std::source_location;

struct SimError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// One simulated AI Vector core: its block index, its Unified Buffer and its counters.
struct Core {
    std::string kernel;
    int32_t block_idx = 0;
    int32_t block_num = 1;
    std::vector<uint8_t> ub;
    size_t ub_used = 0;
    uint64_t gm_read = 0;
    uint64_t gm_written = 0;
};
inline thread_local Core* g_core = nullptr;

[[noreturn]] inline void fail(const std::string& what, const loc& where) {
    std::string k = g_core ? g_core->kernel : std::string("?");
    throw SimError(k + ": line " + std::to_string(where.line()) + ": " + what);
}

inline int32_t GetBlockIdx() { return g_core->block_idx; }
inline int32_t GetBlockNum() { return g_core->block_num; }

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
enum class TPosition { VECIN, VECOUT, VECCALC };
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class HardEvent { V_MTE3, MTE2_V };
enum PipeType { PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
template <PipeType P> inline void PipeBarrier() {}

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
    T GetValue(uint64_t i, loc where = loc::current()) const {
        check(i, 1, where);
        g_core->gm_read += sizeof(T);
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
    // Checks a use of [0, count) from this view and returns the data pointer.
    T* use(uint64_t count, const loc& where) const {
        if (rec_ == nullptr) fail("LocalTensor used before allocation", where);
        if (rec_->gen != gen_ || rec_->state == BufState::FREE)
            fail("use of a LocalTensor after FreeTensor", where);
        if (rec_->state == BufState::ENQUEUED)
            fail("use of a LocalTensor that is enqueued (DeQue it first)", where);
        size_t begin = rec_->offset + elem_off_ * sizeof(T);
        if (begin % BLOCK_BYTES)
            fail("UB operand at byte " + std::to_string(begin) + " is not 32-byte aligned", where);
        if ((elem_off_ + count) * sizeof(T) > rec_->bytes)
            fail("UB access of " + std::to_string(count) + " elements at " +
                 std::to_string(elem_off_) + " overruns a buffer of " +
                 std::to_string(rec_->bytes) + " bytes", where);
        return reinterpret_cast<T*>(g_core->ub.data() + begin);
    }
    T GetValue(uint64_t i, loc where = loc::current()) const { return use_elem(i, where); }
    void SetValue(uint64_t i, T v, loc where = loc::current()) const {
        use_elem(i, where) = v;
    }
    BufRec* rec() const { return rec_; }
    uint64_t gen() const { return gen_; }

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

template <QuePosition P, int32_t DEPTH>
class TQue {
public:
    template <typename T>
    LocalTensor<T> AllocTensor(loc where = loc::current()) {
        for (auto& b : bufs_) {
            if (b->state == BufState::FREE) {
                b->state = BufState::ALLOCATED;
                b->gen += 1;
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
        return off;
    }
};

// ---------------------------------------------------------------- data moves
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count,
              loc where = loc::current()) {
    if ((count * sizeof(T)) % BLOCK_BYTES)
        fail("DataCopy of " + std::to_string(count * sizeof(T)) +
             " bytes is not a multiple of 32 (use DataCopyPad)", where);
    src.check(0, count, where);
    std::memcpy(dst.use(count, where), src.addr(), count * sizeof(T));
    g_core->gm_read += count * sizeof(T);
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count,
              loc where = loc::current()) {
    if ((count * sizeof(T)) % BLOCK_BYTES)
        fail("DataCopy of " + std::to_string(count * sizeof(T)) +
             " bytes is not a multiple of 32 (use DataCopyPad)", where);
    dst.check(0, count, where);
    std::memcpy(dst.addr(), src.use(count, where), count * sizeof(T));
    g_core->gm_written += count * sizeof(T);
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
    for (size_t b = 0; b < p.blockCount; ++b) {
        src.check(b * gm_step, n, where);
        T* r = out + b * row_blocks * BLOCK_BYTES / sizeof(T);
        size_t aligned = ((row + BLOCK_BYTES - 1) / BLOCK_BYTES * BLOCK_BYTES) / sizeof(T);
        for (size_t i = 0; i < aligned; ++i) r[i] = pad.paddingValue;
        std::memcpy(r + pad.leftPadding, src.addr() + b * gm_step, p.blockLen);
        g_core->gm_read += p.blockLen;
    }
}

// UB -> GM: blocks read 32-byte aligned from UB, written with a GM byte stride.
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                 const DataCopyExtParams& p, loc where = loc::current()) {
    check_pad_params(p, sizeof(T), where);
    size_t n = p.blockLen / sizeof(T);
    size_t row_blocks = (p.blockLen + BLOCK_BYTES - 1) / BLOCK_BYTES + p.srcStride;
    const T* in = src.use((p.blockCount - 1) * row_blocks * BLOCK_BYTES / sizeof(T) + n, where);
    if (p.dstStride % sizeof(T)) fail("DataCopyPad dstStride is not whole elements", where);
    size_t gm_step = (p.blockLen + p.dstStride) / sizeof(T);
    for (size_t b = 0; b < p.blockCount; ++b) {
        dst.check(b * gm_step, n, where);
        std::memcpy(dst.addr() + b * gm_step, in + b * row_blocks * BLOCK_BYTES / sizeof(T),
                    p.blockLen);
        g_core->gm_written += p.blockLen;
    }
}

// ------------------------------------------------------------- vector unit
#define GK_SIM_BINARY(NAME, EXPR)                                                           \
    template <typename T>                                                                   \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, \
              int32_t count, loc where = loc::current()) {                                  \
        const T* x = a.use(count, where);                                                   \
        const T* y = b.use(count, where);                                                   \
        T* z = dst.use(count, where);                                                       \
        for (int32_t i = 0; i < count; ++i) {                                               \
            float l = static_cast<float>(x[i]), r = static_cast<float>(y[i]);               \
            z[i] = static_cast<T>(EXPR);                                                    \
        }                                                                                   \
    }
GK_SIM_BINARY(Add, l + r)
GK_SIM_BINARY(Sub, l - r)
GK_SIM_BINARY(Mul, l * r)
GK_SIM_BINARY(Div, l / r)
GK_SIM_BINARY(Max, (l > r ? l : r))
GK_SIM_BINARY(Min, (l < r ? l : r))
#undef GK_SIM_BINARY

// And/Or: 16-bit integers only (wider words are passed as twice as many int16).
#define GK_SIM_BITWISE(NAME, OP)                                                            \
    template <typename T>                                                                   \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, \
              int32_t count, loc where = loc::current()) {                                  \
        static_assert(std::is_same_v<T, int16_t> || std::is_same_v<T, uint16_t>,           \
                      #NAME " takes int16_t/uint16_t tensors");                            \
        const T* x = a.use(count, where);                                                   \
        const T* y = b.use(count, where);                                                   \
        T* z = dst.use(count, where);                                                       \
        for (int32_t i = 0; i < count; ++i) z[i] = static_cast<T>(x[i] OP y[i]);           \
    }
GK_SIM_BITWISE(And, &)
GK_SIM_BITWISE(Or, |)
#undef GK_SIM_BITWISE

#define GK_SIM_SCALAR(NAME, EXPR)                                                       \
    template <typename T>                                                               \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, T scalar, int32_t count, \
              loc where = loc::current()) {                                             \
        const T* x = a.use(count, where);                                               \
        T* z = dst.use(count, where);                                                   \
        float s = static_cast<float>(scalar);                                           \
        for (int32_t i = 0; i < count; ++i) {                                           \
            float l = static_cast<float>(x[i]);                                         \
            z[i] = static_cast<T>(EXPR);                                                \
        }                                                                               \
    }
GK_SIM_SCALAR(Adds, l + s)
GK_SIM_SCALAR(Muls, l * s)
GK_SIM_SCALAR(Maxs, (l > s ? l : s))
GK_SIM_SCALAR(Mins, (l < s ? l : s))
#undef GK_SIM_SCALAR

// dst[i] = f(a[i]) for count elements, computed in float.
template <typename T, typename F>
void map_unary(const LocalTensor<T>& dst, const LocalTensor<T>& a, int32_t count,
               const loc& where, F f) {
    const T* x = a.use(count, where);
    T* z = dst.use(count, where);
    for (int32_t i = 0; i < count; ++i) z[i] = static_cast<T>(f(static_cast<float>(x[i])));
}

#define GK_SIM_UNARY(NAME, EXPR)                                                         \
    template <typename T>                                                                \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, int32_t count,          \
              loc where = loc::current()) {                                              \
        map_unary(dst, a, count, where, [](float v) { return EXPR; });                   \
    }
GK_SIM_UNARY(Exp, std::exp(v))
GK_SIM_UNARY(Ln, std::log(v))
GK_SIM_UNARY(Abs, std::fabs(v))
GK_SIM_UNARY(Sqrt, std::sqrt(v))
GK_SIM_UNARY(Rsqrt, 1.0f / std::sqrt(v))
GK_SIM_UNARY(Reciprocal, 1.0f / v)
GK_SIM_UNARY(Relu, (v > 0.0f ? v : 0.0f))
#undef GK_SIM_UNARY

template <typename T>
void Duplicate(const LocalTensor<T>& dst, T scalar, int32_t count, loc where = loc::current()) {
    T* z = dst.use(count, where);
    for (int32_t i = 0; i < count; ++i) z[i] = scalar;
}

template <typename T>
constexpr bool is_float_type() {
    return std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>;
}

// float -> float of the same type rounds to an integral value by the mode (CAST_NONE copies);
// a narrowing float cast rounds to nearest even (CAST_NONE / CAST_RINT, the only modes
// simulated for it); integer destinations round by the mode.
template <typename D, typename S>
void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode mode, int32_t count,
          loc where = loc::current()) {
    const S* x = src.use(count, where);
    D* z = dst.use(count, where);
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
    if ((count * sizeof(T)) % 256)
        fail("Compare of " + std::to_string(count * sizeof(T)) +
             " bytes is not a multiple of 256 (whole repeats)", where);
    const T* x = a.use(count, where);
    const T* y = b.use(count, where);
    uint8_t* m = dst.use(count / 8, where);
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
    if (mode != SELMODE::VSEL_TENSOR_TENSOR_MODE)
        fail("Select with two tensors needs VSEL_TENSOR_TENSOR_MODE", where);
    const uint8_t* m = mask.use((count + 7) / 8, where);
    const T* x = a.use(count, where);
    const T* y = b.use(count, where);
    T* z = dst.use(count, where);
    for (uint32_t i = 0; i < count; ++i) z[i] = (m[i / 8] >> (i % 8)) & 1u ? x[i] : y[i];
}

// dst[i] = bit i of mask ? a[i] : scalar (tensor-scalar mode).
template <typename T>
void Select(const LocalTensor<T>& dst, const LocalTensor<uint8_t>& mask, const LocalTensor<T>& a,
            T scalar, SELMODE mode, uint32_t count, loc where = loc::current()) {
    if (mode != SELMODE::VSEL_TENSOR_SCALAR_MODE)
        fail("Select with a scalar needs VSEL_TENSOR_SCALAR_MODE", where);
    const uint8_t* m = mask.use((count + 7) / 8, where);
    const T* x = a.use(count, where);
    T* z = dst.use(count, where);
    for (uint32_t i = 0; i < count; ++i) z[i] = (m[i / 8] >> (i % 8)) & 1u ? x[i] : scalar;
}

// Reductions of `count` elements to dst[0]; the work buffer must hold count elements. The
// vector unit reduces pairwise (a tree over the elements), not left to right; so does this.
#define GK_SIM_REDUCE(NAME, COMBINE)                                                       \
    template <typename T>                                                                  \
    void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& work, \
              int32_t count, loc where = loc::current()) {                                 \
        if (count <= 0) fail(#NAME " of " + std::to_string(count) + " elements", where);   \
        const T* x = src.use(count, where);                                                \
        work.use(count, where);                                                            \
        T* z = dst.use(1, where);                                                          \
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
        tmp.use(static_cast<uint64_t>(count) * 4, where);                                  \
        map_unary(dst, src, count, where, [](float v) { return EXPR; });                   \
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
    tmp.use(static_cast<uint64_t>(count) * 4, where);
    const T* a = x.use(count, where);
    const T* b = e.use(count, where);
    T* z = dst.use(count, where);
    for (int32_t i = 0; i < count; ++i)
        z[i] = static_cast<T>(std::pow(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
template <typename T>
void Power(const LocalTensor<T>& dst, const LocalTensor<T>& x, T e,
           const LocalTensor<uint8_t>& tmp, int32_t count, loc where = loc::current()) {
    tmp.use(static_cast<uint64_t>(count) * 4, where);
    float s = static_cast<float>(e);
    map_unary(dst, x, count, where, [s](float v) { return std::pow(v, s); });
}

}  // namespace AscendC

namespace AscendC {
using KernelCall = void (*)(uint8_t**);

// One core of a launch: its own Unified Buffer and counters; returns the error, or "".
inline std::string run_core(KernelCall call, uint8_t** args, const char* name, int32_t b,
                            int32_t blocks, uint64_t ub_bytes, Core& core,
                            std::barrier<>* bar) {
    core.kernel = name;
    core.block_idx = b;
    core.block_num = blocks;
    core.ub.assign(ub_bytes, 0xA5);
    g_core = &core;
    g_barrier = bar;
    std::string error;
    try {
        call(args);
    } catch (const std::exception& e) {
        error = e.what();
        if (bar != nullptr) bar->arrive_and_drop();  // the others must not wait for us
    }
    g_core = nullptr;
    g_barrier = nullptr;
    return error;
}

// Run `blocks` cores of a kernel and add up their GM traffic. Cores run one after another,
// or (a SuperKernel: `threads`) as threads with a real barrier for SyncAll.
inline int launch(KernelCall call, const char* name, uint8_t** args, int32_t blocks,
                  uint64_t ub_bytes, uint64_t* counters, char* err, int32_t errlen,
                  bool threads) {
    std::vector<Core> cores(blocks);
    std::vector<std::string> errors(blocks);
    if (threads) {
        std::barrier<> bar(blocks);
        std::vector<std::thread> pool;
        for (int32_t b = 0; b < blocks; ++b)
            pool.emplace_back([&, b] {
                errors[b] = run_core(call, args, name, b, blocks, ub_bytes, cores[b], &bar);
            });
        for (auto& t : pool) t.join();
    } else {
        for (int32_t b = 0; b < blocks; ++b) {
            errors[b] = run_core(call, args, name, b, blocks, ub_bytes, cores[b], nullptr);
            if (!errors[b].empty()) break;
        }
    }
    for (int32_t b = 0; b < blocks; ++b) {
        if (!errors[b].empty()) {
            std::strncpy(err, errors[b].c_str(), errlen - 1);
            err[errlen - 1] = 0;
            return 1;
        }
        counters[0] += cores[b].gm_read;
        counters[1] += cores[b].gm_written;
    }
    return 0;
}
}  // namespace AscendC

// The runner's entries: a kernel source defines gk_sim_call_<KERNEL>(uint8_t** args).
#define GK_SIM_LAUNCHER_ENTRY(KERNEL, THREADS)                                                \
    extern "C" int gk_sim_launch_##KERNEL(uint8_t** args, int32_t blocks, uint64_t ub_bytes,   \
                                          uint64_t* counters, char* err, int32_t errlen) {    \
        return AscendC::launch(gk_sim_call_##KERNEL, #KERNEL, args, blocks, ub_bytes,         \
                               counters, err, errlen, THREADS);                               \
    }
#define GK_SIM_LAUNCHER(KERNEL, NARGS) GK_SIM_LAUNCHER_ENTRY(KERNEL, false)
// A SuperKernel's entry: every core a thread, SyncAll a real barrier among them.
#define GK_SIM_LAUNCHER_SYNC(KERNEL, NARGS) GK_SIM_LAUNCHER_ENTRY(KERNEL, true)
