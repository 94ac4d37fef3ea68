// The avx2 level's quantized products (qdot_avx2_kernels.hpp has them and their design) and the
// AVX2 activation quantizer.
#include "kernels/cpu/qdot_avx2.hpp"

#include <limits>

#include "kernels/cpu/qdot_avx2_kernels.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

QF_AVX2 void quantize_activation_blocks_avx2(const float* x, uint64_t blocks, int8_t* q, float* d,
                                             int32_t* s) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 flt_max = _mm256_set1_ps(std::numeric_limits<float>::max());
    for (uint64_t b = 0; b < blocks; ++b) {
        const float* xb = x + kBlock * b;
        __m256 v[4], amax = _mm256_setzero_ps();
        int finite = 0xff;
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            const __m256 a = _mm256_and_ps(v[i], abs_mask);
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, flt_max, _CMP_LE_OQ));  // NaN: false
            amax = _mm256_max_ps(amax, a);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float m = _mm_cvtss_f32(h);
        const float db = m / 127.0f;
        int8_t* qb = q + kBlock * b;
        if (finite != 0xff || !(db > 0.0f)) {  // the scalar version's special cases
            std::memset(qb, 0, kBlock);
            d[b] = finite != 0xff ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
            s[b] = 0;
            continue;
        }
        const __m256 dv = _mm256_set1_ps(db), lo = _mm256_set1_ps(-127.0f),
                     hi = _mm256_set1_ps(127.0f);
        __m256i c[4];
        for (int i = 0; i < 4; ++i) {
            const __m256 r = _mm256_round_ps(_mm256_div_ps(v[i], dv),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            c[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
        }
        const __m256i sum32 =
            _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
        __m128i t =
            _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        // packs work within 128-bit lanes: (0 1 | 2 3) then a dword permute restores the order.
        const __m256i p16a = _mm256_packs_epi32(c[0], c[1]), p16b = _mm256_packs_epi32(c[2], c[3]);
        const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        const __m256i ordered =
            _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), ordered);
        d[b] = db;
        s[b] = _mm_cvtsi128_si32(t);
    }
}

const QKernelRow& avx2_kernels() {
    static constexpr QKernelRow row = avx2_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

#else  // no x86: the table never selects this level

void quantize_activation_blocks_avx2(const float*, uint64_t, int8_t*, float*, int32_t*) {}
const QKernelRow& avx2_kernels() {
    static constexpr QKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
