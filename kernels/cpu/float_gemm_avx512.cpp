// The AVX-512 level of kernels/cpu/float_gemm.hpp: 16-lane chain groups (dot_row's accumulators
// 0|1 and 2|3), register tiles of 4 rows x 6 tokens (24 accumulators, 4 weight vectors and one
// activation vector of the 32 zmm registers). The same FMAs on the same lanes in the same order
// as AVX2, so the bits are dot_row's (AVX2) ones: a 16-lane accumulator only pairs two of them.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's masked AVX-512 intrinsics self-initialise their "undefined" operands, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define QF_GEMM_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#include "kernels/cpu/float_gemm_x86.hpp"

#include "kernels/cpu/float_dot.hpp"

namespace qforge::detail {

#if defined(__x86_64__)
namespace {
struct Avx512Vector {
    using reg = __m512;
    static constexpr uint64_t kLanes = 16;
    static constexpr int kRows = 4, kTokens = 6;
    QF_GEMM_TARGET static reg zero() { return _mm512_setzero_ps(); }
    QF_GEMM_TARGET static reg load(const float* p) { return _mm512_loadu_ps(p); }
    QF_GEMM_TARGET static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
    QF_GEMM_TARGET static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    // dot_row's 8-blocks go into accumulator 0 alone: lanes 0-7, lanes 8-15 (acc1) kept.
    QF_GEMM_TARGET static reg fma8(const float* w, const float* x, reg acc) {
        constexpr __mmask16 low = 0x00ff;
        return _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(low, w), _mm512_maskz_loadu_ps(low, x),
                                     acc, low);
    }
};
}  // namespace
#endif

void float_gemm_avx512(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                       const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1,
                       float* out, uint64_t ldo) {
#if defined(__x86_64__)
    gemm<Avx512Vector>(t, w, stride, r0, r1, x, ldx, k, t0, t1, out, ldo);
#else
    float_gemm_avx2(t, w, stride, r0, r1, x, ldx, k, t0, t1, out, ldo);
#endif
}

}  // namespace qforge::detail
