// The run-time choice of kernels/cpu/float_gemm.hpp's level and its scalar reference.
#include "kernels/cpu/float_gemm.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/cpu/float_dot.hpp"

namespace qforge {

namespace {
void check_float_type(QType t) {
    if (static_cast<size_t>(t) >= kQTypeCount || !qtype_traits(t).is_float)
        throw Error("float_matmul: quant type code " + std::to_string(static_cast<unsigned>(t)) +
                    " is not a float row type (f32, f16, bf16)");
}
void check_level(Isa isa) {
    if (isa > cpu_isa())
        throw Error("float_matmul: level " + std::string(isa_name(isa)) +
                    " requested, this process runs at most " + std::string(isa_name(cpu_isa())));
}
}  // namespace

void FloatTokens::prepare(Isa isa, const float* x, uint64_t ldx, uint64_t k, uint64_t n) {
    check_level(isa);
    isa_ = isa, x_ = x, ldx_ = ldx, k_ = k, n_ = n;
    if (isa == Isa::scalar || k == 0) return;
    packed_ld_ = detail::packed_token_ld(k);
    packed_.resize(n * packed_ld_);
    (isa == Isa::avx512 ? detail::pack_tokens_avx512 : detail::pack_tokens_avx2)(x, ldx, k, n,
                                                                                 packed_.data());
}

void float_matmul_prepared(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                           const FloatTokens& x, uint64_t t0, uint64_t t1, float* out,
                           uint64_t ldo) {
    check_float_type(t);
    if (t1 > x.n())
        throw Error("float_matmul: tokens up to " + std::to_string(t1) + " of " +
                    std::to_string(x.n()) + " prepared");
    if (r0 >= r1 || t0 >= t1) return;
    const uint64_t k = x.k();
    switch (k == 0 ? Isa::scalar : x.isa()) {
        case Isa::avx512:
            return detail::float_gemm_avx512(t, w, stride, r0, r1, x.packed(), k, t0, t1, out, ldo);
        case Isa::avx2:
            return detail::float_gemm_avx2(t, w, stride, r0, r1, x.packed(), k, t0, t1, out, ldo);
        case Isa::scalar:
            break;
    }
    for (uint64_t tok = t0; tok < t1; ++tok)
        for (uint64_t r = r0; r < r1; ++r)
            out[(tok - t0) * ldo + (r - r0)] =
                dot_row_scalar(t, w + r * stride, x.x() + tok * x.ldx(), k);
}

void float_matmul_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                      const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1,
                      float* out, uint64_t ldo) {
    check_float_type(t);
    check_level(isa);
    if (r0 >= r1 || t0 >= t1) return;
    thread_local FloatTokens tokens;  // the one-call form packs only the tokens it reads
    tokens.prepare(isa, x + t0 * ldx, ldx, k, t1 - t0);
    float_matmul_prepared(t, w, stride, r0, r1, tokens, 0, t1 - t0, out, ldo);
}

void float_matmul(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                  const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                  uint64_t ldo) {
    float_matmul_isa(cpu_isa(), t, w, stride, r0, r1, x, ldx, k, t0, t1, out, ldo);
}

}  // namespace qforge
