// Elementwise functions (activation.hpp): the scalar reference, written as the runtime computed
// them before, and the 8-lane AVX2/FMA version every x86 level above scalar runs.
#include "kernels/cpu/activation.hpp"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qforge {

namespace {

void silu_mul_scalar(const float* gate, const float* up, float* out, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void exp_shifted_scalar(float* s, uint64_t n, float shift) {
    for (uint64_t i = 0; i < n; ++i) s[i] = std::exp(s[i] - shift);
}

float lanes_total(const float (&p)[8]) {
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

void softmax_scalar(float* s, uint64_t n) {
    const float m = *std::max_element(s, s + n);
    exp_shifted_scalar(s, n, m);
    float part[8] = {};
    for (uint64_t i = 0; i < n; ++i) part[i % 8] += s[i];
    const float inv = 1.0f / lanes_total(part);
    for (uint64_t i = 0; i < n; ++i) s[i] *= inv;
}

#if defined(__x86_64__)

#define QF_ACT_AVX2 __attribute__((target("avx2,fma")))

// exp on 8 lanes. x = k ln2 + r with k = round(x log2 e) and r = x - k ln2 in two steps (ln2's
// high part has 9 significant bits, so k * ln2_hi is exact for |k| <= 2^15); exp(r) on
// [-ln2/2, ln2/2] by the degree-5 minimax polynomial of Cephes' expf (1 + r + r^2 P(r), relative
// error below 2^-23 there); times 2^k built in the exponent field. x is clamped to [-87.34,
// 88.376] first so k stays in [-126, 127]; outside it the result is set to 0 or +inf.
QF_ACT_AVX2 inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f), hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y =
        _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    __m256 v = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    v = _mm256_blendv_ps(v, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN stays NaN
}

// f on every 8-lane group of [0, n); a last partial group through a zero-padded copy, the same
// lane operations, so no element's value depends on where it lies.
template <class F>
QF_ACT_AVX2 inline void by_vectors(uint64_t n, F f) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) f(i, 8);
    if (i < n) f(i, n - i);
}

QF_ACT_AVX2 inline __m256 load_part(const float* p, uint64_t m) {
    if (m == 8) return _mm256_loadu_ps(p);
    alignas(32) float b[8] = {};
    std::copy(p, p + m, b);
    return _mm256_load_ps(b);
}

QF_ACT_AVX2 inline void store_part(float* p, uint64_t m, __m256 v) {
    if (m == 8) return _mm256_storeu_ps(p, v);
    alignas(32) float b[8];
    _mm256_store_ps(b, v);
    std::copy(b, b + m, p);
}

QF_ACT_AVX2 void silu_mul_avx2(const float* gate, const float* up, float* out, uint64_t n) {
    by_vectors(n, [&](uint64_t i, uint64_t m) QF_ACT_AVX2 {
        const __m256 g = load_part(gate + i, m), u = load_part(up + i, m);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        store_part(out + i, m, _mm256_mul_ps(s, u));
    });
}

QF_ACT_AVX2 void exp_shifted_avx2(float* s, uint64_t n, float shift) {
    const __m256 sh = _mm256_set1_ps(shift);
    by_vectors(n, [&](uint64_t i, uint64_t m) QF_ACT_AVX2 {
        store_part(s + i, m, exp8(_mm256_sub_ps(load_part(s + i, m), sh)));
    });
}

QF_ACT_AVX2 void softmax_avx2(float* s, uint64_t n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mv);
    float m = *std::max_element(lanes, lanes + 8);
    for (; i < n; ++i) m = std::max(m, s[i]);
    const __m256 sh = _mm256_set1_ps(m), index = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 sum = _mm256_setzero_ps();
    by_vectors(n, [&](uint64_t j, uint64_t c) QF_ACT_AVX2 {
        __m256 e = exp8(_mm256_sub_ps(load_part(s + j, c), sh));
        store_part(s + j, c, e);
        if (c < 8)  // lanes past n add nothing
            e = _mm256_and_ps(
                e, _mm256_cmp_ps(index, _mm256_set1_ps(static_cast<float>(c)), _CMP_LT_OQ));
        sum = _mm256_add_ps(sum, e);
    });
    float part[8];
    _mm256_storeu_ps(part, sum);
    const __m256 inv = _mm256_set1_ps(1.0f / lanes_total(part));
    by_vectors(n, [&](uint64_t j, uint64_t c) QF_ACT_AVX2 {
        store_part(s + j, c, _mm256_mul_ps(load_part(s + j, c), inv));
    });
}

#endif

}  // namespace

void softmax(Isa isa, float* s, uint64_t n) {
#if defined(__x86_64__)
    if (isa >= Isa::avx2) return softmax_avx2(s, n);
#endif
    softmax_scalar(s, n);
}

void silu_mul(Isa isa, const float* gate, const float* up, float* out, uint64_t n) {
#if defined(__x86_64__)
    if (isa >= Isa::avx2) return silu_mul_avx2(gate, up, out, n);
#endif
    silu_mul_scalar(gate, up, out, n);
}

void exp_shifted(Isa isa, float* s, uint64_t n, float shift) {
#if defined(__x86_64__)
    if (isa >= Isa::avx2) return exp_shifted_avx2(s, n, shift);
#endif
    exp_shifted_scalar(s, n, shift);
}

void rms_norm_row(const float* x, const float* w, uint64_t d, double eps, float* y,
                  bool accumulate) {
    double p[8] = {};
    uint64_t i = 0;
    for (; i + 8 <= d; i += 8)
        for (int k = 0; k < 8; ++k) p[k] += static_cast<double>(x[i + k]) * x[i + k];
    for (int k = 0; i < d; ++i, ++k) p[k] += static_cast<double>(x[i]) * x[i];
    const double ss = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    const auto scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    if (accumulate)
        for (i = 0; i < d; ++i) y[i] += w[i] * (x[i] * scale);
    else
        for (i = 0; i < d; ++i) y[i] = w[i] * (x[i] * scale);
}

}  // namespace qforge
