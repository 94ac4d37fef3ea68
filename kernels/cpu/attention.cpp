// Attention products (attention.hpp): the scalar reference, written as the runtime computed them
// before (float_dot.hpp's dot_short and axpy), and the AVX2/FMA version every x86 level above
// scalar runs.
#include "kernels/cpu/attention.hpp"

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

QF_ATTN_AVX2 void head_mix_avx2(const float* p, uint64_t ld, uint64_t group, uint64_t hd,
                                const float* values, uint64_t stride, uint64_t n, float* out) {
    // Heads in fours: 4 heads x 2 chunks is 8 accumulators beside the 2 value vectors, within the
    // 16 ymm registers.
    for (uint64_t g = 0; g < group; g += 4) {
        const float* pg = p + g * ld;
        float* og = out + g * hd;
        switch (group - g) {
            case 1:
                mix_heads<1>(pg, ld, hd, values, stride, n, og);
                break;
            case 2:
                mix_heads<2>(pg, ld, hd, values, stride, n, og);
                break;
            case 3:
                mix_heads<3>(pg, ld, hd, values, stride, n, og);
                break;
            default:
                mix_heads<4>(pg, ld, hd, values, stride, n, og);
                break;
        }
    }
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
    if (isa >= Isa::avx2) return head_mix_avx2(p, ld, group, hd, values, stride, n, out);
#endif
    head_mix_scalar(p, ld, group, hd, values, stride, n, out);
}

}  // namespace qforge
