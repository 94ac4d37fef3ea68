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

#endif

}  // namespace

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
