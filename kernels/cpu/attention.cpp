// Attention products (attention.hpp): the scalar reference, written as the runtime computed them
// before (float_dot.hpp's dot_short and axpy), the AVX2/FMA version, and an AVX-512 mix that runs
// the same operations per output (the same bits) with more of them per instruction.
#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/float_dot.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qforge {

namespace {

void head_scores_scalar(const float* q, uint64_t group, uint64_t hd, const float* keys,
                        uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld) {
    for (uint64_t g = 0; g < group; ++g)
        for (uint64_t j = 0; j < n; ++j)
            scores[g * ld + j] = dot_short(q + g * hd, keys + j * stride, hd) * scale;
}

void head_mix_scalar(const float* p, uint64_t ld, uint64_t group, uint64_t hd, const float* values,
                     uint64_t stride, uint64_t n, float* out) {
    for (uint64_t j = 0; j < n; ++j)
        for (uint64_t g = 0; g < group; ++g)
            axpy(p[g * ld + j], values + j * stride, out + g * hd, hd);
}

#if defined(__x86_64__)

#define QF_ATTN_AVX2 __attribute__((target("avx2,fma")))

// The heads [g, g + NG) of a group's mix (mix_heads, mix_heads16), chosen by NG from a table.
using MixHeads = void (*)(const float*, uint64_t, uint64_t, const float*, uint64_t, uint64_t,
                          float*);

// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)): dot_short's tree over the 8 lanes.
QF_ATTN_AVX2 inline float lane_tree(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

// One query head against NJ keys: NJ independent 8-lane FMA chains over hd's whole 8-blocks, the
// lane tree, then the last hd mod 8 products one at a time, then times scale.
template <int NJ>
QF_ATTN_AVX2 inline void scores_tile(const float* q, uint64_t hd, const float* keys,
                                     uint64_t stride, float scale, float* scores) {
    __m256 acc[NJ];
    for (int j = 0; j < NJ; ++j) acc[j] = _mm256_setzero_ps();
    const uint64_t whole = hd / 8 * 8;
    for (uint64_t i = 0; i < whole; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < NJ; ++j)
            acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + j * stride + i), acc[j]);
    }
    for (int j = 0; j < NJ; ++j) {
        float s = lane_tree(acc[j]);
        for (uint64_t i = whole; i < hd; ++i) s += q[i] * keys[j * stride + i];
        scores[j] = s * scale;
    }
}

QF_ATTN_AVX2 void head_scores_avx2(const float* q, uint64_t group, uint64_t hd, const float* keys,
                                   uint64_t stride, uint64_t n, float scale, float* scores,
                                   uint64_t ld) {
    constexpr uint64_t kKeys = 8;  // chains in flight: 8 FMAs cover the FMA latency twice over
    for (uint64_t g = 0; g < group; ++g) {
        uint64_t j = 0;
        for (; j + kKeys <= n; j += kKeys)
            scores_tile<kKeys>(q + g * hd, hd, keys + j * stride, stride, scale,
                               scores + g * ld + j);
        for (; j < n; ++j)
            scores_tile<1>(q + g * hd, hd, keys + j * stride, stride, scale, scores + g * ld + j);
    }
}

// NG heads' outputs, C 8-float chunks of each from `at`, kept in registers over the n positions:
// out = fma(p, v, out), one rounding per position, positions in order.
template <int NG, int C>
QF_ATTN_AVX2 inline void mix_tile(const float* p, uint64_t ld, uint64_t hd, const float* values,
                                  uint64_t stride, uint64_t n, uint64_t at, float* out) {
    __m256 acc[NG][C];
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) acc[g][c] = _mm256_loadu_ps(out + g * hd + at + 8 * c);
    for (uint64_t j = 0; j < n; ++j) {
        __m256 v[C];
        for (int c = 0; c < C; ++c) v[c] = _mm256_loadu_ps(values + j * stride + at + 8 * c);
        for (int g = 0; g < NG; ++g) {
            const __m256 b = _mm256_set1_ps(p[g * ld + j]);
            for (int c = 0; c < C; ++c) acc[g][c] = _mm256_fmadd_ps(b, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + g * hd + at + 8 * c, acc[g][c]);
}

template <int NG>
QF_ATTN_AVX2 void mix_heads(const float* p, uint64_t ld, uint64_t hd, const float* values,
                            uint64_t stride, uint64_t n, float* out) {
    uint64_t at = 0;
    for (; at + 16 <= hd; at += 16) mix_tile<NG, 2>(p, ld, hd, values, stride, n, at, out);
    if (at + 8 <= hd) {
        mix_tile<NG, 1>(p, ld, hd, values, stride, n, at, out);
        at += 8;
    }
    for (uint64_t g = 0; g < NG; ++g)  // the last hd mod 8 elements: the same fused steps
        for (uint64_t i = at; i < hd; ++i)
            for (uint64_t j = 0; j < n; ++j)
                out[g * hd + i] = std::fma(p[g * ld + j], values[j * stride + i], out[g * hd + i]);
}

// Heads in fours: 4 heads x 2 chunks is 8 accumulators beside the 2 value vectors, within the
// 16 ymm registers.
QF_ATTN_AVX2 void head_mix_avx2(const float* p, uint64_t ld, uint64_t group, uint64_t hd,
                                const float* values, uint64_t stride, uint64_t n, float* out) {
    static constexpr MixHeads kHeads[] = {mix_heads<1>, mix_heads<2>, mix_heads<3>, mix_heads<4>};
    for (uint64_t g = 0; g < group; g += 4)
        kHeads[std::min<uint64_t>(group - g, 4) - 1](p + g * ld, ld, hd, values, stride, n,
                                                     out + g * hd);
}

// The avx512 level's mix: mix_tile's operations per output (so avx2's bits) on 16 lanes, one pass
// over the positions for a whole 64-float head (SmolLM2 serving 16 streams: the mix's share of
// the time 9.1% -> 6.4%). Its scores are avx2's: grouping the heads that share a key, with 32 ymm
// registers, measured no faster.
#define QF_ATTN_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl")))

// NG heads' outputs, C 16-float chunks of each from `at`: mix_tile's steps on 16 lanes.
template <int NG, int C>
QF_ATTN_AVX512 inline void mix_tile16(const float* p, uint64_t ld, uint64_t hd, const float* values,
                                      uint64_t stride, uint64_t n, uint64_t at, float* out) {
    __m512 acc[NG][C];
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_loadu_ps(out + g * hd + at + 16 * c);
    for (uint64_t j = 0; j < n; ++j) {
        __m512 v[C];
        for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_ps(values + j * stride + at + 16 * c);
        for (int g = 0; g < NG; ++g) {
            const __m512 b = _mm512_set1_ps(p[g * ld + j]);
            for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(b, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * hd + at + 16 * c, acc[g][c]);
}

template <int NG>
QF_ATTN_AVX512 void mix_heads16(const float* p, uint64_t ld, uint64_t hd, const float* values,
                                uint64_t stride, uint64_t n, float* out) {
    uint64_t at = 0;
    for (; at + 64 <= hd; at += 64) mix_tile16<NG, 4>(p, ld, hd, values, stride, n, at, out);
    if (at + 32 <= hd) {
        mix_tile16<NG, 2>(p, ld, hd, values, stride, n, at, out);
        at += 32;
    }
    if (at + 16 <= hd) {
        mix_tile16<NG, 1>(p, ld, hd, values, stride, n, at, out);
        at += 16;
    }
    if (at + 8 <= hd) {
        mix_tile<NG, 1>(p, ld, hd, values, stride, n, at, out);
        at += 8;
    }
    for (uint64_t g = 0; g < NG; ++g)
        for (uint64_t i = at; i < hd; ++i)
            for (uint64_t j = 0; j < n; ++j)
                out[g * hd + i] = std::fma(p[g * ld + j], values[j * stride + i], out[g * hd + i]);
}

// Heads in fours: 4 heads x 4 chunks is 16 accumulators beside the 4 value vectors.
QF_ATTN_AVX512 void head_mix_avx512(const float* p, uint64_t ld, uint64_t group, uint64_t hd,
                                    const float* values, uint64_t stride, uint64_t n, float* out) {
    static constexpr MixHeads kHeads[] = {mix_heads16<1>, mix_heads16<2>, mix_heads16<3>,
                                          mix_heads16<4>};
    for (uint64_t g = 0; g < group; g += 4)
        kHeads[std::min<uint64_t>(group - g, 4) - 1](p + g * ld, ld, hd, values, stride, n,
                                                     out + g * hd);
}

#endif

}  // namespace

void head_scores(Isa isa, const float* q, uint64_t group, uint64_t hd, const float* keys,
                 uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld) {
#if defined(__x86_64__)
    if (isa >= Isa::avx2) return head_scores_avx2(q, group, hd, keys, stride, n, scale, scores, ld);
#endif
    head_scores_scalar(q, group, hd, keys, stride, n, scale, scores, ld);
}

void head_mix(Isa isa, const float* p, uint64_t ld, uint64_t group, uint64_t hd,
              const float* values, uint64_t stride, uint64_t n, float* out) {
#if defined(__x86_64__)
    if (isa >= Isa::avx512) return head_mix_avx512(p, ld, group, hd, values, stride, n, out);
    if (isa >= Isa::avx2) return head_mix_avx2(p, ld, group, hd, values, stride, n, out);
#endif
    head_mix_scalar(p, ld, group, hd, values, stride, n, out);
}

}  // namespace qforge
