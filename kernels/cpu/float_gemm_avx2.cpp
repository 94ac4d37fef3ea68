// The AVX2/FMA/F16C level of kernels/cpu/float_gemm.hpp: 8-lane chain groups (one of dot_row's
// accumulators each), register tiles of 3 rows x 4 tokens (12 accumulators, 3 weight vectors and
// one activation vector: the 16 ymm registers).
#define QF_GEMM_TARGET __attribute__((target("avx2,fma,f16c")))
#include "kernels/cpu/float_gemm_x86.hpp"

#include "kernels/cpu/float_dot.hpp"

namespace qforge::detail {

#if defined(__x86_64__)
namespace {
struct Avx2Vector {
    using reg = __m256;
    static constexpr uint64_t kLanes = 8;
    static constexpr int kRows = 3, kTokens = 4;
    QF_GEMM_TARGET static reg zero() { return _mm256_setzero_ps(); }
    QF_GEMM_TARGET static reg load(const float* p) { return _mm256_loadu_ps(p); }
    QF_GEMM_TARGET static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
    QF_GEMM_TARGET static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    // A chain group is one accumulator: dot_row's 8-blocks are a whole-register FMA.
    QF_GEMM_TARGET static reg fma8(const float* w, const float* x, reg acc) {
        return _mm256_fmadd_ps(_mm256_loadu_ps(w), _mm256_loadu_ps(x), acc);
    }
};
}  // namespace
#endif

void float_gemm_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                     const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                     uint64_t ldo) {
#if defined(__x86_64__)
    gemm<Avx2Vector>(t, w, stride, r0, r1, x, ldx, k, t0, t1, out, ldo);
#else
    for (uint64_t tok = t0; tok < t1; ++tok)
        for (uint64_t r = r0; r < r1; ++r)
            out[(tok - t0) * ldo + (r - r0)] = dot_row_scalar(t, w + r * stride, x + tok * ldx, k);
#endif
}

}  // namespace qforge::detail
