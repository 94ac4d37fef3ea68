// The AVX-512 level of kernels/cpu/float_gemm.hpp: one weight row per lane, 16 rows per zmm
// (float_gemm_rows.hpp has the layout and why every output is dot_row's bits). A register tile is
// 3 row groups (48 rows) x 8 tokens: 24 accumulators, 3 weight vectors and one broadcast
// activation, 24 FMAs per 3 vector loads and 8 broadcasts. In L1 this tile ran at ~80% of the
// machine's FMA peak (207 of 257 GFLOP/s on one Zen 5 core) where a k-in-lanes tile (4 weight and
// 6 activation vector loads per 24 FMAs) ran at 55%.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's masked AVX-512 intrinsics self-initialise their "undefined" operands, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define QF_ROWS_TARGET QF_AVX512
#include "kernels/cpu/float_gemm_rows.hpp"
#endif

namespace qforge::detail {

#if defined(__x86_64__)
namespace {

using rows::Block;
using rows::kChains;
using rows::kGroupStride;
using rows::panel_start;
constexpr uint64_t kLanes = 16;  // rows per zmm

// 16 f16 or bf16 values widened to f32 (exact).
template <QType T>
QF_AVX512 inline __m512 widen16(__m256i h) {
    if constexpr (T == QType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Elements [j, j + 16) of a float row (type T) widened to f32 exactly; with a mask, only its
// lanes (the others zero).
template <QType T>
QF_AVX512 inline __m512 load_row(const uint8_t* row, uint64_t j, __mmask16 m = 0xffff) {
    if constexpr (T == QType::f32) return _mm512_maskz_loadu_ps(m, row + 4 * j);
    return widen16<T>(_mm256_maskz_loadu_epi16(m, row + 2 * j));
}

// r[i] = row i (16 floats) -> r[c] = column c (16 rows).
QF_AVX512 inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    // Per 4 rows q: u[4q + c] holds column c, c + 4, c + 8, c + 12 of those rows (128-bit lanes).
    for (int q = 0; q < 4; ++q) {
        const __m512d a = _mm512_castps_pd(t[4 * q]), b = _mm512_castps_pd(t[4 * q + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * q + 2]), d = _mm512_castps_pd(t[4 * q + 3]);
        u[4 * q + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        r[c + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}

// Columns [j, j + count) (count <= 16) of 16 weight rows as column vectors
// of 16 rows. A row group of fewer rows repeats its last row (lanes whose outputs are not stored).
template <QType T>
QF_AVX512 inline void load_columns(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t j,
                                   uint64_t count, __m512 col[16]) {
#pragma GCC unroll 16
    for (uint64_t i = 0; i < 16; ++i) {
        const uint8_t* row = w + std::min(i, rows - 1) * stride;
        col[i] = load_row<T>(row, j, static_cast<__mmask16>((1u << count) - 1));
    }
    transpose16(col);
}

// Elements [j, j + 32) of 16 rows of 16-bit floats (f16 or bf16) as 32 column vectors of 16 rows,
// widened to f32. The transpose runs on the 16-bit values (half the shuffles of a transpose after
// widening): pairs of rows interleaved as 16-bit, then 32-bit, then 64-bit units, so that each
// 128-bit lane holds 8 rows of one element, and a two-source permute joins rows 0-7 and 8-15.
template <QType T>
QF_AVX512 inline void load_columns_32(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t j,
                                      __m512 col[32]) {
    __m512i r[16], a[16];
#pragma GCC unroll 16
    for (uint64_t i = 0; i < 16; ++i)
        r[i] = _mm512_loadu_si512(w + std::min(i, rows - 1) * stride + 2 * j);
    // a[2p] / a[2p + 1]: rows 2p, 2p + 1 of elements 8L + 0..3 / 8L + 4..7 (lane L), 32-bit units.
    for (int p = 0; p < 8; ++p) {
        a[2 * p] = _mm512_unpacklo_epi16(r[2 * p], r[2 * p + 1]);
        a[2 * p + 1] = _mm512_unpackhi_epi16(r[2 * p], r[2 * p + 1]);
    }
    // b[4q + m]: rows 4q..4q + 3 of elements 8L + 2m, 8L + 2m + 1, 64-bit units.
    __m512i b[16];
    for (int q = 0; q < 4; ++q) {
        const __m512i lo0 = a[4 * q], hi0 = a[4 * q + 1], lo1 = a[4 * q + 2], hi1 = a[4 * q + 3];
        b[4 * q + 0] = _mm512_unpacklo_epi32(lo0, lo1);
        b[4 * q + 1] = _mm512_unpackhi_epi32(lo0, lo1);
        b[4 * q + 2] = _mm512_unpacklo_epi32(hi0, hi1);
        b[4 * q + 3] = _mm512_unpackhi_epi32(hi0, hi1);
    }
    const __m512i low = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    const __m512i high = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    for (int m = 0; m < 4; ++m)
        for (int p = 0; p < 2; ++p) {
            // Lane L: element 8L + 2m + p of rows 0-7 (x) and of rows 8-15 (y).
            const __m512i x =
                p ? _mm512_unpackhi_epi64(b[m], b[4 + m]) : _mm512_unpacklo_epi64(b[m], b[4 + m]);
            const __m512i y = p ? _mm512_unpackhi_epi64(b[8 + m], b[12 + m])
                                : _mm512_unpacklo_epi64(b[8 + m], b[12 + m]);
            const __m512i e01 = _mm512_permutex2var_epi64(x, low, y);   // elements 2m+p, 8+2m+p
            const __m512i e23 = _mm512_permutex2var_epi64(x, high, y);  // 16+2m+p, 24+2m+p
            const int g = 2 * m + p;
            col[g] = widen16<T>(_mm512_castsi512_si256(e01));
            col[8 + g] = widen16<T>(_mm512_extracti64x4_epi64(e01, 1));
            col[16 + g] = widen16<T>(_mm512_castsi512_si256(e23));
            col[24 + g] = widen16<T>(_mm512_extracti64x4_epi64(e23, 1));
        }
}

// The weights of one row tile (rows [0, rows) of w, `groups` row groups) for one block of k
// (32-steps [s0, s0 + b.steps), then b.eights 8-blocks at element e0) into `panel`: position p
// of chain g of row group gi at panel[(gi * kGroupStride + panel_start(b, g) + p) * 16].
template <QType T>
QF_AVX512 void pack_weights(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t groups,
                            uint64_t s0, const Block& b, uint64_t e0, float* panel) {
    __m512 col[16];
    for (uint64_t gi = 0; gi < groups; ++gi) {
        const uint8_t* g_rows = w + gi * kLanes * stride;
        const uint64_t n = std::min<uint64_t>(kLanes, rows - gi * kLanes);
        for (uint64_t s = 0; s < b.steps; ++s)
            if constexpr (T != QType::f32) {
                __m512 col32[32];
                load_columns_32<T>(g_rows, stride, n, kChains * (s0 + s), col32);
#pragma GCC unroll 32
                for (uint64_t g = 0; g < kChains; ++g)
                    _mm512_store_ps(panel + (gi * kGroupStride + panel_start(b, g) + s) * kLanes,
                                    col32[g]);
            } else
                for (uint64_t half = 0; half < 2; ++half) {
                    load_columns<T>(g_rows, stride, n, kChains * (s0 + s) + 16 * half, 16, col);
#pragma GCC unroll 16
                    for (uint64_t c = 0; c < 16; ++c) {
                        const uint64_t g = 16 * half + c;
                        _mm512_store_ps(
                            panel + (gi * kGroupStride + panel_start(b, g) + s) * kLanes, col[c]);
                    }
                }
        for (uint64_t e = 0; e < b.eights; ++e) {
            load_columns<T>(g_rows, stride, n, e0 + 8 * e, 8, col);
            for (uint64_t g = 0; g < 8; ++g)
                _mm512_store_ps(
                    panel + (gi * kGroupStride + panel_start(b, g) + b.steps + e) * kLanes, col[g]);
        }
    }
}

// The last k mod 8 weights (`tails`, from element j) of the tile's row groups: element j + e of
// group gi at tail[(e * groups + gi) * 16].
template <QType T>
QF_AVX512 void pack_tail(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t groups,
                         uint64_t j, uint64_t tails, float* tail) {
    __m512 col[16];
    for (uint64_t gi = 0; gi < groups; ++gi) {
        load_columns<T>(w + gi * kLanes * stride, stride,
                        std::min<uint64_t>(kLanes, rows - gi * kLanes), j, tails, col);
        for (uint64_t e = 0; e < tails; ++e)
            _mm512_store_ps(tail + (e * groups + gi) * kLanes, col[e]);
    }
}

// One token's block of k in chain-major order (rows::pack_token_scalar's layout), 16 steps at a
// time as a 16 x 16 transpose per half step.
QF_AVX512 inline void pack_token(const float* x, uint64_t steps, uint64_t s0, const Block& b,
                                 float* at) {
    uint64_t s = 0;
    for (; s + 16 <= b.steps; s += 16)
        for (uint64_t half = 0; half < 2; ++half) {
            __m512 v[16];
            for (uint64_t i = 0; i < 16; ++i)
                v[i] = _mm512_loadu_ps(x + kChains * (s0 + s + i) + 16 * half);
            transpose16(v);
            for (uint64_t c = 0; c < 16; ++c)
                _mm512_storeu_ps(at + b.start(16 * half + c) + s, v[c]);
        }
    rows::pack_token_scalar(x, steps, s0, s, b, at);
}

struct Zmm {
    using reg = __m512;
    static constexpr uint64_t kLanes = 16;
    static constexpr int kGroups = 3, kTokens = 8;
    QF_AVX512 static reg zero() { return _mm512_setzero_ps(); }
    QF_AVX512 static reg load(const float* p) { return _mm512_load_ps(p); }
    QF_AVX512 static void store(float* p, reg v) { _mm512_store_ps(p, v); }
    QF_AVX512 static reg set1(float v) { return _mm512_set1_ps(v); }
    QF_AVX512 static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
    QF_AVX512 static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
    QF_AVX512 static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    QF_AVX512 static void store_rows(float* out, reg v, uint64_t n) {
        _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << n) - 1), v);
    }
    template <QType T>
    QF_AVX512 static void pack_weights(const uint8_t* w, uint64_t stride, uint64_t rows,
                                       uint64_t groups, uint64_t s0, const Block& b, uint64_t e0,
                                       float* panel) {
        qforge::detail::pack_weights<T>(w, stride, rows, groups, s0, b, e0, panel);
    }
    template <QType T>
    QF_AVX512 static void pack_tail(const uint8_t* w, uint64_t stride, uint64_t rows,
                                    uint64_t groups, uint64_t j, uint64_t tails, float* tail) {
        qforge::detail::pack_tail<T>(w, stride, rows, groups, j, tails, tail);
    }
    QF_AVX512 static void pack_token(const float* x, uint64_t steps, uint64_t s0, const Block& b,
                                     float* at) {
        qforge::detail::pack_token(x, steps, s0, b, at);
    }
};

}  // namespace
#endif

void pack_tokens_avx512(const float* x, uint64_t ldx, uint64_t k, uint64_t n, float* packed) {
#if defined(__x86_64__)
    rows::pack_tokens<Zmm>(x, ldx, k, n, packed);
#else
    (void)x, (void)ldx, (void)k, (void)n, (void)packed;
#endif
}

void float_gemm_avx512(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                       const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                       uint64_t ldo) {
#if defined(__x86_64__)
    rows::gemm<Zmm>(t, w, stride, r0, r1, packed, k, t0, t1, out, ldo);
#else
    (void)t, (void)w, (void)stride, (void)r0, (void)r1, (void)packed, (void)k, (void)t0, (void)t1,
        (void)out, (void)ldo;
#endif
}

}  // namespace qforge::detail
