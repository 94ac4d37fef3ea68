// The AMX kernel of kernels/cpu/bf16_gemm.hpp (bf16_gemm_amx.cpp), for bf16_gemm.cpp only.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cpu/bf16_gemm.hpp"

namespace qforge::detail {

// Where the tokens' pairs are. `rows`: token t's pairs at rows + t * stride (words), read there
// directly as the A operand when `stride` is a whole number of 16-pair steps and 32 tokens from
// the group's first exist (the pairs past w.pairs() up to the stride then zero); otherwise `copy`
// writes token t's w.pairs() pairs to dst (the low half the even element).
struct AmxTokens {
    const uint32_t* rows = nullptr;
    uint64_t stride = 0;
    std::function<void(uint64_t t, uint32_t* dst)> copy;
};

// out[(t - t0) * ldo + (r - r0)] = row r of w . token t, for rows [r0, r1) and tokens [t0, t1),
// both non-empty; the caller has checked the shapes and that cpu_uses_amx_bf16().
void bf16_product_amx(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, uint64_t t0, uint64_t t1,
                      const AmxTokens& tokens, float* out, uint64_t ldo);

}  // namespace qforge::detail
