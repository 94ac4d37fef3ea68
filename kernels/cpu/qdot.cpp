// Activation preparation, the scalar reference products and the run-time dispatch of
// kernels/cpu/qdot.hpp. The scalar versions are written for obviousness: one weight at a time,
// codes read through formats/qtype.hpp's accessors.
#include "kernels/cpu/qdot.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"
#include "kernels/cpu/qdot_avx2.hpp"
#include "kernels/cpu/qpack.hpp"

namespace qforge {

namespace {

constexpr uint64_t kBlock = 32;  // activation block: one float scale per 32 int8 codes

// One block of n <= 32 activations to int8: d = amax / 127, q = round(x / d) (to nearest even),
// s = sum of q. An all-zero block (or one whose d underflows to 0) gets d = 0 and zero codes; a
// block holding NaN or infinity gets d = NaN, so every product with it is NaN as in f32 mode.
void quantize_activation_block(const float* x, uint64_t n, int8_t* q, float* d, int32_t* s) {
    float amax = 0.0f;
    bool finite = true;
    for (uint64_t j = 0; j < n; ++j) {
        finite = finite && std::isfinite(x[j]);
        amax = std::max(amax, std::fabs(x[j]));
    }
    const float db = amax / 127.0f;
    int32_t sum = 0;
    if (finite && db > 0.0f) {
        for (uint64_t j = 0; j < n; ++j) {
            q[j] = static_cast<int8_t>(std::clamp(std::nearbyint(x[j] / db), -127.0f, 127.0f));
            sum += q[j];
        }
    }
    *d = !finite ? std::numeric_limits<float>::quiet_NaN() : (db > 0.0f ? db : 0.0f);
    *s = sum;
}

}  // namespace

void QActivations::prepare(Mode mode, const float* x, uint64_t n, uint64_t k) {
    resize(mode, n, k);
    prepare_tokens(x, 0, n);
}

void QActivations::resize(Mode mode, uint64_t n, uint64_t k) {
    mode_ = mode;
    n_ = n;
    k_ = k;
    blocks_ = (k + kBlock - 1) / kBlock;
    const uint64_t padded = blocks_ * kBlock;
    // The AMX kernel takes whole tiles of tokens only (qmatmul_packed_isa): fewer never need them.
    tiles_ = mode == Mode::int8 && n >= kTileTokens && cpu_uses_amx_int8();
    if (mode == Mode::f32) {
        f_.resize(n * padded);
        return;
    }
    q_.resize(n * padded);
    d_.resize(n * sums_stride());
    s_.resize(n * blocks_);
    pq_.resize(n * padded);
    ds_.resize(n * sums_stride());
    if (!tiles_) return;
    const uint64_t groups = (n + kTileTokens - 1) / kTileTokens;
    tq_.resize(groups * blocks_ * kTileTokens * kBlock);
    td_.resize(groups * blocks_ * kTileTokens);
    ts_.resize(td_.size());
    tds_.resize(td_.size());
}

void QActivations::prepare_tokens(const float* x, uint64_t t0, uint64_t t1) {
    const uint64_t k = k_, padded = blocks_ * kBlock;
    if (mode_ == Mode::f32) {
        for (uint64_t t = t0; t < t1; ++t) {
            float* f = f_.data() + t * padded;
            std::copy(x + t * k, x + t * k + k, f);
            std::fill(f + k, f + padded, 0.0f);
        }
        return;
    }
    const bool avx2 = cpu_has_avx2();
    for (uint64_t t = t0; t < t1; ++t) {
        const float* xt = x + t * k;
        int8_t* q = q_.data() + t * padded;
        float* d = d_.data() + t * sums_stride();
        int32_t* s = s_.data() + t * blocks_;
        // Zeros first: the padding past k, and the codes of a block of zeros or non-finite
        // values, which the quantizers leave unwritten.
        std::fill(q, q + padded, int8_t{0});
        std::fill(d + blocks_, d + sums_stride(), 0.0f);
        const uint64_t whole = avx2 ? k / kBlock : 0;  // the same bits either way
        if (whole) detail::quantize_activation_blocks_avx2(xt, whole, q, d, s);
        for (uint64_t b = whole; b < blocks_; ++b)
            quantize_activation_block(xt + b * kBlock, std::min(kBlock, k - b * kBlock),
                                      q + b * kBlock, d + b, s + b);
    }
    // The AVX2 layouts of the same values (qdot.hpp).
    for (uint64_t t = t0; t < t1; ++t) {
        std::fill(ds_.data() + t * sums_stride() + blocks_, ds_.data() + (t + 1) * sums_stride(),
                  0.0f);
        const int8_t* q = codes(t);
        int8_t* pq = pq_.data() + t * padded;
        for (uint64_t b = 0; b < blocks_; ++b) {
            const uint64_t p = b / 2;
            if (b + 1 == blocks_ && b % 2 == 0) {  // a last odd block: in order
                std::copy(q + b * kBlock, q + (b + 1) * kBlock, pq + b * kBlock);
                break;
            }
            const uint64_t half = b % 2;  // 0: the pair's first block, 1: its second
            std::copy(q + b * kBlock, q + b * kBlock + 16, pq + p * 64 + half * 16);
            std::copy(q + b * kBlock + 16, q + (b + 1) * kBlock, pq + p * 64 + 32 + half * 16);
        }
        for (uint64_t b = 0; b < blocks_; ++b)
            ds_[t * sums_stride() + b] = scales(t)[b] * static_cast<float>(sums(t)[b]);
    }
    if (!tiles_) return;
    for (uint64_t t = t0; t < t1; ++t) {
        const int8_t* q = codes(t);
        const float *d = scales(t), *ds = scaled_sums(t);
        const int32_t* s = sums(t);
        const uint64_t first = t / kTileTokens * blocks_ * kTileTokens + t % kTileTokens;
        for (uint64_t b = 0; b < blocks_; ++b) {
            const uint64_t at = first + b * kTileTokens;
            std::memcpy(tq_.data() + at * kBlock, q + b * kBlock, kBlock);
            td_[at] = d[b];
            ts_[at] = s[b];
            tds_[at] = ds[b];
        }
    }
}

void qmatmul_scalar(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                    const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    if (static_cast<size_t>(t) >= kQTypeCount)
        throw Error("qmatmul_scalar: quant type code " + std::to_string(static_cast<unsigned>(t)) +
                    " is not in the qtype table");
    const QTypeTraits& tr = qtype_traits(t);
    const uint64_t k = a.k();
    if (k == 0) {
        for (uint64_t tok = t0; tok < t1; ++tok)
            for (uint64_t r = r0; r < r1; ++r) out[(tok - t0) * ldo + (r - r0)] = 0.0f;
        return;
    }
    std::vector<float> wrow(k);
    for (uint64_t r = r0; r < r1; ++r) {
        const uint8_t* row = w + r * stride;
        if (tr.is_float && a.mode() == QActivations::Mode::f32) {  // float_dot's order
            for (uint64_t tok = t0; tok < t1; ++tok)
                out[(tok - t0) * ldo + (r - r0)] = dot_row_scalar(t, row, a.floats(tok), k);
            continue;
        }
        if (a.mode() == QActivations::Mode::f32 || tr.is_float) {
            // Exact weights (dequantization is exact), then one float product at a time.
            if (tr.is_float)
                row_to_f32(t, row, wrow.data(), k);
            else
                dequantize_row_ref(t, row, k, wrow.data());
            for (uint64_t tok = t0; tok < t1; ++tok) {
                float acc = 0.0f;
                if (a.mode() == QActivations::Mode::f32) {
                    const float* x = a.floats(tok);
                    for (uint64_t j = 0; j < k; ++j) acc += wrow[j] * x[j];
                } else {  // float rows times int8 activations: the dequantized d * q
                    for (uint64_t j = 0; j < k; ++j)
                        acc += wrow[j] *
                               (a.scales(tok)[j / kBlock] * static_cast<float>(a.codes(tok)[j]));
                }
                out[(tok - t0) * ldo + (r - r0)] = acc;
            }
            continue;
        }
        // int8 mode: per 32-block an exact integer dot product with the zero folded in, scaled
        // by the group's scale times the block's activation scale (super-block types: minus the
        // group's
        // min times the block's scaled code sum).
        const QRowLayout l = *qtype_row_layout(t, k);
        const int8_t* levels = row_levels(t, row, k);
        for (uint64_t tok = t0; tok < t1; ++tok) {
            const int8_t* q = a.codes(tok);
            float acc = 0.0f;
            for (uint64_t b = 0; b < a.blocks(); ++b) {
                const uint64_t g = b * kBlock / l.group;
                const int32_t z = row_group_zero(t, row, k, g);
                int32_t isum = 0;
                for (uint64_t i = b * kBlock; i < (b + 1) * kBlock; ++i)
                    // codes past k meet zero activations
                    isum += qtype_code_level(t, row_code(t, row, i), levels) * q[i];
                isum -= z * a.sums(tok)[b];
                const float s = row_group_scale(t, row, k, g);
                acc += (s * a.scales(tok)[b]) * static_cast<float>(isum);
                if (tr.super_block)  // w = scale * code - min: the min times the block's sum
                    acc -= row_group_min(t, row, k, g) *
                           (a.scales(tok)[b] * static_cast<float>(a.sums(tok)[b]));
            }
            out[(tok - t0) * ldo + (r - r0)] = acc;
        }
    }
}

namespace {

// Float rows at the AVX2 level and above: f32 mode through float_gemm's level kernel (each output
// dot_row's AVX2 bits); int8 mode has no vector kernel (float weights are dequantized-exact, so the
// scalar loop is the kernel).
template <Isa L>
void float_rows(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    if (a.mode() != QActivations::Mode::f32)
        return qmatmul_scalar(t, w, stride, r0, r1, a, t0, t1, out, ldo);
    float_matmul_isa(L, t, w, stride, r0, r1, a.floats(0), a.blocks() * kBlock, a.k(), t0, t1, out,
                     ldo);
}

void dequantize_rows_scalar(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                            float* out) {
    for (uint64_t r = 0; r < n; ++r) row_to_f32(t, w + r * stride, out + r * k, k);
}

// The one table of which kernel serves which (qtype, level). Level rows come from each level's
// translation unit, built there from formats/qtype.hpp's table; a cell a level leaves empty is
// served by the level below (float rows: float_rows at each level), and scalar serves
// every type, so every cell of every level names a kernel.
using KernelTable = std::array<detail::QKernelRow, kIsaCount>;

KernelTable build_kernel_table() {
    KernelTable table{};
    for (const QTypeTraits& row : kQTypes) {
        auto& cell = table[static_cast<size_t>(Isa::scalar)][static_cast<size_t>(row.type)];
        cell = {qmatmul_scalar, dequantize_rows_scalar};
    }
    // The avx2 row: with AVX-VNNI's vpdpbusd where the CPU has it (the same bits).
    const detail::QKernelRow* own[kIsaCount] = {
        nullptr, cpu_uses_avx_vnni() ? &detail::avx_vnni_kernels() : &detail::avx2_kernels(),
        &detail::avx512_kernels()};
    for (size_t level = 1; level < kIsaCount; ++level)
        for (const QTypeTraits& row : kQTypes) {
            const size_t i = static_cast<size_t>(row.type);
            detail::QKernels cell = (*own[level])[i];
            if (row.is_float)
                cell.qmatmul = static_cast<Isa>(level) == Isa::avx2 ? float_rows<Isa::avx2>
                                                                    : float_rows<Isa::avx512>;
            if (!cell.qmatmul) cell.qmatmul = table[level - 1][i].qmatmul;
            if (!cell.dequantize) cell.dequantize = table[level - 1][i].dequantize;
            table[level][i] = cell;
        }
    return table;
}

const detail::QKernels& kernels_for(Isa isa, QType t, const char* what) {
    static const KernelTable table = build_kernel_table();
    if (static_cast<size_t>(t) >= kQTypeCount)
        throw Error(std::string(what) + ": quant type code " +
                    std::to_string(static_cast<unsigned>(t)) + " is not in the qtype table");
    if (isa > cpu_isa())
        throw Error(std::string(what) + ": level " + std::string(isa_name(isa)) +
                    " requested, this process runs at most " + std::string(isa_name(cpu_isa())));
    return table[static_cast<size_t>(isa)][static_cast<size_t>(t)];
}

}  // namespace

void qmatmul_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                 const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const detail::QKernels& k = kernels_for(isa, t, "qmatmul");
    if (r0 >= r1 || t0 >= t1) return;
    if (a.k() == 0) return qmatmul_scalar(t, w, stride, r0, r1, a, t0, t1, out, ldo);
    k.qmatmul(t, w, stride, r0, r1, a, t0, t1, out, ldo);
}

void qmatmul(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
             const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    qmatmul_isa(cpu_isa(), t, w, stride, r0, r1, a, t0, t1, out, ldo);
}

namespace {

// The packed kernel of type t at level isa, or null.
detail::QPackedKernel packed_kernel(Isa isa, QType t) {
    if (isa > cpu_isa() || !qtype_is_quantized(t)) return nullptr;
    if (isa == Isa::avx512) return detail::avx512_packed_kernels()[static_cast<size_t>(t)];
    if (isa == Isa::avx2)
        return (cpu_uses_avx_vnni() ? detail::avx_vnni_packed_kernels()
                                    : detail::avx2_packed_kernels())[static_cast<size_t>(t)];
    return nullptr;
}

// One or two tokens at the avx512 level on AMD: the avx2 kernel (8 rows a ymm, the same scalar
// bits) where it measured faster on this project's Zen 4 (kernels/README.md, "avx2: packed rows"):
// q4_g* and q4s_g* at every shape (SmolLM2 q4_g128 decode 1.26x; two sequences 1.51x), q8* rows
// of k <= 1536 (SmolLM2's; at k = 2048 and 5632 the avx512 kernel stays, 1.07x, one stream of
// tiles on AMD: qdot_avx512.cpp's packed_token); super-block
// types stay on avx512, and types the avx2 kernel does not serve (q4nl) find none there. Three or
// more tokens measured even or slower there. On an Intel Xeon the avx512 kernel measured faster
// for every type, so other CPUs keep it: one token, reading two streams of tiles
// (kernels/README.md, "Decode: two streams"), TinyLlama-shape q4s_g32 42-43 tok/s against the avx2
// kernel's 34; two sequences (`qforge bench -b 2`, two rounds alternating) SmolLM2 q4_g128 554 /
// 695 against 512 / 596, q8_g32 290 / 324 against 224 / 314, TinyLlama-shape q4s_g32 85 / 88
// against 72 / 74, q8_g32 even (50-51).
constexpr uint64_t kAvx2DecodeTokens = 2;
constexpr uint64_t kAvx2DecodeMaxK8 = 1536;

detail::QPackedKernel decode_kernel(Isa isa, QType t, uint64_t k) {
    const QTypeTraits& tr = qtype_traits(t);
    const bool avx2 = isa == Isa::avx512 && cpu_is_amd() && !tr.super_block &&
                      (tr.bits == 4 || (tr.bits == 8 && k <= kAvx2DecodeMaxK8));
    if (avx2)
        if (const detail::QPackedKernel k2 = packed_kernel(Isa::avx2, t)) return k2;
    return packed_kernel(isa, t);
}

// Tokens from which the avx512 level's products on packed rows take AMX tiles (where the CPU has
// AMX-INT8): one whole tile of tokens. A tile multiplies 16 tokens whatever it holds, so fewer
// pay for 16: 8 sequences decoding together measured 0.91-0.94x the VNNI kernel with q4_g128
// (SmolLM2, TinyLlama shape), 16 measured 1.06-1.33x and 128-token prefill 1.5-1.7x (Intel Xeon,
// 2 threads, kernels/README.md "AMX-INT8"). A speed choice only: the bits are the same.
constexpr uint64_t kAmxMinTokens = QActivations::kTileTokens;

}  // namespace

bool qmatmul_packed_serves(Isa isa, QType t) { return packed_kernel(isa, t) != nullptr; }

void qmatmul_packed_isa(Isa isa, const QPackedRows& m, uint64_t r0, uint64_t r1,
                        const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const detail::QPackedKernel kernel = packed_kernel(isa, m.type());
    if (!kernel || a.mode() != QActivations::Mode::int8)
        throw Error(std::string("qmatmul_packed: no packed kernel for ") +
                    std::string(qtype_traits(m.type()).name) + " at level " +
                    std::string(isa_name(isa)) +
                    (a.mode() == QActivations::Mode::int8 ? "" : " in f32 mode"));
    if (a.k() != m.k() || r1 > m.rows())
        throw Error("qmatmul_packed: rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                    ") of k = " + std::to_string(a.k()) + " asked of a matrix of " +
                    std::to_string(m.rows()) + " rows of " + std::to_string(m.k()));
    if (r0 >= r1 || t0 >= t1) return;
    if (t1 - t0 <= kAvx2DecodeTokens)
        return decode_kernel(isa, m.type(), m.k())(m, r0, r1, a, t0, t1, out, ldo);
    if (isa == Isa::avx512 && t1 - t0 >= kAmxMinTokens && a.has_tiles() &&
        t0 % QActivations::kTileTokens == 0)
        if (const detail::QPackedKernel amx =
                detail::amx_packed_kernels()[static_cast<size_t>(m.type())])
            return amx(m, r0, r1, a, t0, t1, out, ldo);
    kernel(m, r0, r1, a, t0, t1, out, ldo);
}

void qmatmul_packed(const QPackedRows& m, uint64_t r0, uint64_t r1, const QActivations& a,
                    uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    qmatmul_packed_isa(cpu_isa(), m, r0, r1, a, t0, t1, out, ldo);
}

void dequantize_rows_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t n,
                         uint64_t k, float* out) {
    const detail::QKernels& kern = kernels_for(isa, t, "dequantize_rows");
    if (k == 0) return;
    kern.dequantize(t, w, stride, n, k, out);
}

void dequantize_rows(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                     float* out) {
    dequantize_rows_isa(cpu_isa(), t, w, stride, n, k, out);
}

}  // namespace qforge
