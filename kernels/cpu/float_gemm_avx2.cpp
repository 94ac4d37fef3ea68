// The AVX2/FMA/F16C level of kernels/cpu/float_gemm.hpp: one weight row per lane, 8 rows per ymm
// (float_gemm_rows.hpp has the layout and why every output is dot_row's bits). A register tile is
// 3 row groups (24 rows) x 4 tokens: 12 accumulators, 3 weight vectors and one broadcast
// activation, the 16 ymm registers. It replaced a k-in-lanes tile (one register per dot_row
// accumulator, 3 rows x 4 tokens: 3 weight and 4 activation loads per 12 FMAs as well, but a lane
// tree per output and the partial sums parked per chain group) that ran at 58% of the FMA peak
// on a Zen 4 core (`gemm/f16/2048x2048/m:128/threads:1` at QFORGE_ISA=avx2: 33.8 GMAC/s).
#include <cstdint>
#include <cstring>

#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QF_ROWS_TARGET QF_AVX2
#include "kernels/cpu/float_gemm_rows.hpp"
#endif

namespace qforge::detail {

#if defined(__x86_64__)
namespace {

using rows::Block;
using rows::kChains;
using rows::kGroupStride;
using rows::panel_start;

// r[i] = row i (8 floats) -> r[c] = column c (8 rows).
QF_AVX2 inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    // Per 4 rows h: u[4h + c] holds column c (low 128 bits) and c + 4 (high) of those rows.
    for (int h = 0; h < 2; ++h) {
        const __m256 lo0 = t[4 * h], hi0 = t[4 * h + 1], lo1 = t[4 * h + 2], hi1 = t[4 * h + 3];
        u[4 * h + 0] = _mm256_shuffle_ps(lo0, lo1, 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(lo0, lo1, 0xee);
        u[4 * h + 2] = _mm256_shuffle_ps(hi0, hi1, 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(hi0, hi1, 0xee);
    }
    for (int c = 0; c < 4; ++c) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

// Elements [j, j + 8) of a float row (type T) widened to f32 exactly.
template <QType T>
QF_AVX2 inline __m256 load8(const uint8_t* row, uint64_t j) {
    if constexpr (T == QType::f32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + j);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * j));
    if constexpr (T == QType::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Elements [j, j + 8) of 8 weight rows as 8 column vectors of 8 rows; a row group of fewer rows
// repeats its last row (lanes whose outputs are not stored).
template <QType T>
QF_AVX2 inline void load_columns(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t j,
                                 __m256 col[8]) {
    for (uint64_t i = 0; i < 8; ++i) col[i] = load8<T>(w + std::min(i, rows - 1) * stride, j);
    transpose8(col);
}

struct Ymm {
    using reg = __m256;
    static constexpr uint64_t kLanes = 8;
    static constexpr int kGroups = 3, kTokens = 4;
    QF_AVX2 static reg zero() { return _mm256_setzero_ps(); }
    QF_AVX2 static reg load(const float* p) { return _mm256_load_ps(p); }
    QF_AVX2 static void store(float* p, reg v) { _mm256_store_ps(p, v); }
    QF_AVX2 static reg set1(float v) { return _mm256_set1_ps(v); }
    QF_AVX2 static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
    QF_AVX2 static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
    QF_AVX2 static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    QF_AVX2 static void store_rows(float* out, reg v, uint64_t n) {
        if (n == kLanes) return _mm256_storeu_ps(out, v);
        alignas(32) float lanes[kLanes];
        _mm256_store_ps(lanes, v);
        std::memcpy(out, lanes, 4 * n);
    }

    // The weights of one row tile (rows [0, rows) of w, `groups` row groups) for one block of k
    // (32-steps [s0, s0 + b.steps), then b.eights 8-blocks at element e0) into `panel`: position
    // p of chain g of row group gi at panel[(gi * kGroupStride + panel_start(b, g) + p) * 8].
    template <QType T>
    QF_AVX2 static void pack_weights(const uint8_t* w, uint64_t stride, uint64_t rows,
                                     uint64_t groups, uint64_t s0, const Block& b, uint64_t e0,
                                     float* panel) {
        __m256 col[8];
        for (uint64_t gi = 0; gi < groups; ++gi) {
            const uint8_t* g_rows = w + gi * kLanes * stride;
            const uint64_t n = std::min<uint64_t>(kLanes, rows - gi * kLanes);
            float* at = panel + gi * kGroupStride * kLanes;
            for (uint64_t s = 0; s < b.steps; ++s)
                for (uint64_t q = 0; q < 4; ++q) {  // chains 8q .. 8q + 7
                    load_columns<T>(g_rows, stride, n, kChains * (s0 + s) + 8 * q, col);
                    for (uint64_t c = 0; c < 8; ++c)
                        _mm256_store_ps(at + (panel_start(b, 8 * q + c) + s) * kLanes, col[c]);
                }
            for (uint64_t e = 0; e < b.eights; ++e) {
                load_columns<T>(g_rows, stride, n, e0 + 8 * e, col);
                for (uint64_t g = 0; g < 8; ++g)
                    _mm256_store_ps(at + (panel_start(b, g) + b.steps + e) * kLanes, col[g]);
            }
        }
    }

    // The last k mod 8 weights (`tails`, from element j) of the tile's row groups: element j + e
    // of group gi at tail[(e * groups + gi) * 8].
    template <QType T>
    QF_AVX2 static void pack_tail(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t groups,
                                  uint64_t j, uint64_t tails, float* tail) {
        for (uint64_t gi = 0; gi < groups; ++gi)
            for (uint64_t l = 0; l < kLanes; ++l) {
                const uint64_t r = std::min(gi * kLanes + l, rows - 1);
                float v[8];
                row_to_f32(T, w + r * stride + j * (qtype_traits(T).bits / 8), v, tails);
                for (uint64_t e = 0; e < tails; ++e) tail[(e * groups + gi) * kLanes + l] = v[e];
            }
    }

    static void pack_token(const float* x, uint64_t steps, uint64_t s0, const Block& b, float* at) {
        rows::pack_token_scalar(x, steps, s0, 0, b, at);
    }
};

}  // namespace
#endif

void pack_tokens_avx2(const float* x, uint64_t ldx, uint64_t k, uint64_t n, float* packed) {
#if defined(__x86_64__)
    rows::pack_tokens<Ymm>(x, ldx, k, n, packed);
#else
    (void)x, (void)ldx, (void)k, (void)n, (void)packed;
#endif
}

void float_gemm_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                     const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                     uint64_t ldo) {
#if defined(__x86_64__)
    rows::gemm<Ymm>(t, w, stride, r0, r1, packed, k, t0, t1, out, ldo);
#else
    (void)t, (void)w, (void)stride, (void)r0, (void)r1, (void)packed, (void)k, (void)t0, (void)t1,
        (void)out, (void)ldo;
#endif
}

}  // namespace qforge::detail
