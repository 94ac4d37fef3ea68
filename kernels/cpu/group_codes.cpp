// group_codes (group_codes.hpp): scalar, AVX2 and AVX-512 versions of qtype_quantize_value over
// a run of weights.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/cpu/group_codes.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qforge {

namespace {

// The grid's constants for the vector versions: code = clamp(round((w + add) / scale) + zero).
struct Uniform {
    float scale, add, zero, lo, hi;
};

// Types whose codes are a rounded quotient (everything but the level tables), with the scale
// nonzero (a zero scale gives every weight the same code, below).
Uniform uniform(QType t, const QGroupParams& p) {
    if (qtype_has_super_blocks(t))  // w = scale * code - min
        return {p.scale, p.min, 0.0f, 0.0f, static_cast<float>(qtype_max_code(t))};
    return {p.scale, 0.0f, static_cast<float>(p.zero), static_cast<float>(qtype_min_code(t)),
            static_cast<float>(qtype_max_code(t))};
}

#if defined(__x86_64__)

// qtype_quantize_value adds the min only for super-block types; adding 0.0f to a finite w is
// exact except that -0.0f becomes +0.0f, which rounds, clamps and truncates to the same code.
__attribute__((target("avx2,fma"))) void codes_avx2(const Uniform& u, const float* w, uint64_t n,
                                                    int32_t* codes) {
    const __m256 scale = _mm256_set1_ps(u.scale), add = _mm256_set1_ps(u.add),
                 zero = _mm256_set1_ps(u.zero), lo = _mm256_set1_ps(u.lo),
                 hi = _mm256_set1_ps(u.hi);
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 r = _mm256_div_ps(_mm256_add_ps(_mm256_loadu_ps(w + j), add), scale);
        r = _mm256_add_ps(_mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero);
        r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), _mm256_cvttps_epi32(r));
    }
    for (; j < n; ++j) {
        const float r = std::nearbyint((w[j] + u.add) / u.scale) + u.zero;
        codes[j] = static_cast<int32_t>(std::min(std::max(r, u.lo), u.hi));
    }
}

__attribute__((target("avx2,fma,avx512f"))) void codes_avx512(const Uniform& u, const float* w,
                                                              uint64_t n, int32_t* codes) {
    const __m512 scale = _mm512_set1_ps(u.scale), add = _mm512_set1_ps(u.add),
                 zero = _mm512_set1_ps(u.zero), lo = _mm512_set1_ps(u.lo),
                 hi = _mm512_set1_ps(u.hi);
    for (uint64_t j = 0; j < n; j += 16) {
        const auto m = static_cast<__mmask16>(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1);
        __m512 r = _mm512_div_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(m, w + j), add), scale);
        r = _mm512_add_ps(_mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          zero);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        _mm512_mask_storeu_epi32(codes + j, m, _mm512_cvttps_epi32(r));
    }
}

// One term of group_error (the scalar expression; `code` from qtype_quantize_value).
inline double error_term(QType t, const QGroupParams& p, float w, const double* a, uint64_t j,
                         int32_t code) {
    const double d =
        static_cast<double>(w) - static_cast<double>(qtype_dequantize_value(t, p, code));
    return (a ? a[j] : 1.0) * d * d;
}

// group_error's terms [from, n) added to sum (the scalar version, and the vector ones' tails).
void error_tail(QType t, const QGroupParams& p, const float* w, const double* a, uint64_t from,
                uint64_t n, InterleavedSum& sum) {
    for (uint64_t j = from; j < n; ++j)
        sum.add(j, error_term(t, p, w[j], a, j, qtype_quantize_value(t, p, w[j])));
}

// Uniform grids: deq = scale * (code - zero) - min, the code as an integral float (r - zero is
// the exact integer code - zero); 8 terms per step, lanes j mod 8 of two 4-double accumulators.
__attribute__((target("avx2,fma"))) double error_avx2(QType t, const QGroupParams& p,
                                                      const Uniform& u, const float* w,
                                                      const double* a, uint64_t n) {
    const __m256 scale = _mm256_set1_ps(u.scale), add = _mm256_set1_ps(u.add),
                 zero = _mm256_set1_ps(u.zero), lo = _mm256_set1_ps(u.lo),
                 hi = _mm256_set1_ps(u.hi), dscale = _mm256_set1_ps(p.scale),
                 dzero = _mm256_set1_ps(static_cast<float>(p.zero)), dmin = _mm256_set1_ps(p.min);
    __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 wv = _mm256_loadu_ps(w + j);
        __m256 r = _mm256_div_ps(_mm256_add_ps(wv, add), scale);
        r = _mm256_add_ps(_mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero);
        r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
        const __m256 deq = _mm256_sub_ps(_mm256_mul_ps(dscale, _mm256_sub_ps(r, dzero)), dmin);
        for (int h = 0; h < 2; ++h) {
            const __m128 wh = h ? _mm256_extractf128_ps(wv, 1) : _mm256_castps256_ps128(wv);
            const __m128 qh = h ? _mm256_extractf128_ps(deq, 1) : _mm256_castps256_ps128(deq);
            const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(wh), _mm256_cvtps_pd(qh));
            const __m256d av = a ? _mm256_loadu_pd(a + j + 4 * h) : _mm256_set1_pd(1.0);
            acc[h] = _mm256_add_pd(acc[h], _mm256_mul_pd(_mm256_mul_pd(av, d), d));
        }
    }
    InterleavedSum sum;
    _mm256_storeu_pd(sum.s, acc[0]);
    _mm256_storeu_pd(sum.s + 4, acc[1]);
    error_tail(t, p, w, a, j, n, sum);
    return sum.total();
}

// 16 terms per step: lanes j mod 8 of one 8-double accumulator, the low 8 weights first.
__attribute__((target("avx2,fma,avx512f"))) double error_avx512(QType t, const QGroupParams& p,
                                                                const Uniform& u, const float* w,
                                                                const double* a, uint64_t n) {
    const __m512 scale = _mm512_set1_ps(u.scale), add = _mm512_set1_ps(u.add),
                 zero = _mm512_set1_ps(u.zero), lo = _mm512_set1_ps(u.lo),
                 hi = _mm512_set1_ps(u.hi), dscale = _mm512_set1_ps(p.scale),
                 dzero = _mm512_set1_ps(static_cast<float>(p.zero)), dmin = _mm512_set1_ps(p.min);
    __m512d acc = _mm512_setzero_pd();
    uint64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 wv = _mm512_loadu_ps(w + j);
        __m512 r = _mm512_div_ps(_mm512_add_ps(wv, add), scale);
        r = _mm512_add_ps(_mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          zero);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        const __m512 deq = _mm512_sub_ps(_mm512_mul_ps(dscale, _mm512_sub_ps(r, dzero)), dmin);
        for (int h = 0; h < 2; ++h) {
            const __m256 wh = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wv), 1))
                                : _mm512_castps512_ps256(wv);
            const __m256 qh = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(deq), 1))
                                : _mm512_castps512_ps256(deq);
            const __m512d d = _mm512_sub_pd(_mm512_cvtps_pd(wh), _mm512_cvtps_pd(qh));
            const __m512d av = a ? _mm512_loadu_pd(a + j + 8 * h) : _mm512_set1_pd(1.0);
            acc = _mm512_add_pd(acc, _mm512_mul_pd(_mm512_mul_pd(av, d), d));
        }
    }
    InterleavedSum sum;
    _mm512_storeu_pd(sum.s, acc);
    error_tail(t, p, w, a, j, n, sum);
    return sum.total();
}

#endif

// code_moments' sums, one InterleavedSum each (s, sc, scc, sw, swc).
struct MomentSums {
    InterleavedSum m[5];
    void add(uint64_t j, double c, double x, double a) {
        m[0].add(j, a);
        m[1].add(j, a * c);
        m[2].add(j, a * c * c);
        m[3].add(j, a * x);
        m[4].add(j, a * x * c);
    }
    CodeMoments total() const {
        return {m[0].total(), m[1].total(), m[2].total(), m[3].total(), m[4].total()};
    }
};

void moments_tail(const int32_t* codes, int32_t offset, const float* w, const double* a,
                  uint64_t from, uint64_t n, MomentSums& sums) {
    for (uint64_t j = from; j < n; ++j)
        sums.add(j, static_cast<double>(codes[j] - offset), static_cast<double>(w[j]),
                 a ? a[j] : 1.0);
}

#if defined(__x86_64__)

// 8 points per step: lanes j mod 8 of one 8-double accumulator per sum (the same roundings).
__attribute__((target("avx2,fma,avx512f"))) CodeMoments moments_avx512(
    const int32_t* codes, int32_t offset, const float* w, const double* a, uint64_t n) {
    __m512d acc[5];
    for (auto& v : acc) v = _mm512_setzero_pd();
    const __m256i off = _mm256_set1_epi32(offset);
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m512d c = _mm512_cvtepi32_pd(
            _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j)), off));
        const __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(w + j));
        const __m512d av = a ? _mm512_loadu_pd(a + j) : _mm512_set1_pd(1.0);
        const __m512d ac = _mm512_mul_pd(av, c), ax = _mm512_mul_pd(av, x);
        acc[0] = _mm512_add_pd(acc[0], av);
        acc[1] = _mm512_add_pd(acc[1], ac);
        acc[2] = _mm512_add_pd(acc[2], _mm512_mul_pd(ac, c));
        acc[3] = _mm512_add_pd(acc[3], ax);
        acc[4] = _mm512_add_pd(acc[4], _mm512_mul_pd(ax, c));
    }
    MomentSums sums;
    for (int i = 0; i < 5; ++i) _mm512_storeu_pd(sums.m[i].s, acc[i]);
    moments_tail(codes, offset, w, a, j, n, sums);
    return sums.total();
}

// The same with two 4-double halves per sum (lanes j mod 8 in 0..3, then 4..7).
__attribute__((target("avx2,fma"))) CodeMoments moments_avx2(const int32_t* codes, int32_t offset,
                                                             const float* w, const double* a,
                                                             uint64_t n) {
    __m256d acc[5][2];
    for (auto& v : acc) v[0] = v[1] = _mm256_setzero_pd();
    const __m128i off = _mm_set1_epi32(offset);
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int h = 0; h < 2; ++h) {
            const uint64_t i = j + 4 * static_cast<uint64_t>(h);
            const __m256d c = _mm256_cvtepi32_pd(
                _mm_sub_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)), off));
            const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(w + i));
            const __m256d av = a ? _mm256_loadu_pd(a + i) : _mm256_set1_pd(1.0);
            const __m256d ac = _mm256_mul_pd(av, c), ax = _mm256_mul_pd(av, x);
            acc[0][h] = _mm256_add_pd(acc[0][h], av);
            acc[1][h] = _mm256_add_pd(acc[1][h], ac);
            acc[2][h] = _mm256_add_pd(acc[2][h], _mm256_mul_pd(ac, c));
            acc[3][h] = _mm256_add_pd(acc[3][h], ax);
            acc[4][h] = _mm256_add_pd(acc[4][h], _mm256_mul_pd(ax, c));
        }
    MomentSums sums;
    for (int i = 0; i < 5; ++i) {
        _mm256_storeu_pd(sums.m[i].s, acc[i][0]);
        _mm256_storeu_pd(sums.m[i].s + 4, acc[i][1]);
    }
    moments_tail(codes, offset, w, a, j, n, sums);
    return sums.total();
}

#endif

}  // namespace

CodeMoments code_moments_isa(Isa isa, const int32_t* codes, int32_t offset, const float* w,
                             const double* a, uint64_t n) {
    if (isa > cpu_isa())
        throw Error("code_moments: level " + std::string(isa_name(isa)) +
                    " requested, this process runs at most " + std::string(isa_name(cpu_isa())));
#if defined(__x86_64__)
    if (isa == Isa::avx512) return moments_avx512(codes, offset, w, a, n);
    if (isa == Isa::avx2) return moments_avx2(codes, offset, w, a, n);
#endif
    MomentSums sums;
    moments_tail(codes, offset, w, a, 0, n, sums);
    return sums.total();
}

CodeMoments code_moments(const int32_t* codes, int32_t offset, const float* w, const double* a,
                         uint64_t n) {
    return code_moments_isa(cpu_isa(), codes, offset, w, a, n);
}

double group_error_isa(Isa isa, QType t, const QGroupParams& p, const float* w, const double* a,
                       uint64_t n) {
    if (isa > cpu_isa())
        throw Error("group_error: level " + std::string(isa_name(isa)) +
                    " requested, this process runs at most " + std::string(isa_name(cpu_isa())));
#if defined(__x86_64__)
    if (!qtype_has_levels(t) && p.scale != 0.0f && isa != Isa::scalar) {
        const Uniform u = uniform(t, p);
        return isa == Isa::avx512 ? error_avx512(t, p, u, w, a, n) : error_avx2(t, p, u, w, a, n);
    }
#endif
    InterleavedSum sum;
    error_tail(t, p, w, a, 0, n, sum);
    return sum.total();
}

double group_error(QType t, const QGroupParams& p, const float* w, const double* a, uint64_t n) {
    return group_error_isa(cpu_isa(), t, p, w, a, n);
}

void group_codes_isa(Isa isa, QType t, const QGroupParams& p, const float* w, uint64_t n,
                     int32_t* codes) {
    if (isa > cpu_isa())
        throw Error("group_codes: level " + std::string(isa_name(isa)) +
                    " requested, this process runs at most " + std::string(isa_name(cpu_isa())));
    if (qtype_has_levels(t) || p.scale == 0.0f || isa == Isa::scalar) {
        for (uint64_t j = 0; j < n; ++j) codes[j] = qtype_quantize_value(t, p, w[j]);
        return;
    }
#if defined(__x86_64__)
    const Uniform u = uniform(t, p);
    if (isa == Isa::avx512) return codes_avx512(u, w, n, codes);
    return codes_avx2(u, w, n, codes);
#else
    for (uint64_t j = 0; j < n; ++j) codes[j] = qtype_quantize_value(t, p, w[j]);
#endif
}

void group_codes(QType t, const QGroupParams& p, const float* w, uint64_t n, int32_t* codes) {
    group_codes_isa(cpu_isa(), t, p, w, n, codes);
}

}  // namespace qforge
