// Prefill products of float rows (f32, f16, bf16) with several tokens: a register-blocked GEMM
// whose every output is, bit for bit, the dot_row of its row and token at the same level
// (float_dot.hpp), so prefill equals decode and no split of rows or tokens over threads or tiles
// changes a bit.
//
// dot_row's order is fixed by the row length alone: lane l of accumulator a (a = 0..3, 8 lanes
// each) sums w[32 s + 8 a + l] x[32 s + 8 a + l] over the 32-steps s in order, the last < 4
// whole 8-blocks go into accumulator 0, then (a0 + a1) + (a2 + a3), a fixed lane tree and the
// last < 8 products one by one. Those 32 lane sums are independent chains, so the GEMM may
// compute them in any interleaving and on any register lanes. Both levels put rows in lanes
// (float_gemm_rows.hpp): one register per chain of 8 rows (avx2, float_gemm_avx2.cpp: 24 rows x
// 4 tokens per register tile) or 16 rows (avx512, float_gemm_avx512.cpp: 48 rows x 8 tokens) and
// one token, over the weights transposed once per (row tile, block of k) and the tokens packed
// once per call in the same chain-major order.
// Both keep partial sums unrounded between blocks of k and finish each output with dot_row's own
// adds, lane tree and tail; each weight is widened to f32 (exact) once per call and reused by
// every token of it.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/qtype.hpp"
#include "kernels/cpu/isa.hpp"

namespace qforge {

// out[(tok - t0) * ldo + (r - r0)] = dot_row(t, row r, x + tok * ldx, k) for rows [r0, r1) and
// tokens [t0, t1). w: float rows of k elements, `stride` bytes apart. Throws qforge::Error for a
// type that is not a float row type.
void float_matmul(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                  const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                  uint64_t ldo);
// float_matmul at a given level (scalar: dot_row_scalar per output; avx2 and avx512: dot_row's
// AVX2 bits). Throws qforge::Error for a level above cpu_isa().
void float_matmul_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                      const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1,
                      float* out, uint64_t ldo);

// Tokens prepared once for many float_matmul calls on the same activations (the CPU backend
// prepares them per product, before its threads split the rows): avx2 and avx512 pack them in
// their chain-major order (float_gemm_rows.hpp), the scalar level reads x in place.
class FloatTokens {
  public:
    // x: n tokens of k floats, ldx apart; read now (avx2, avx512) or by each call (scalar), so x
    // must outlive the calls.
    void prepare(Isa isa, const float* x, uint64_t ldx, uint64_t k, uint64_t n);
    Isa isa() const { return isa_; }
    uint64_t k() const { return k_; }
    uint64_t n() const { return n_; }
    const float* x() const { return x_; }
    uint64_t ldx() const { return ldx_; }
    const float* packed() const { return packed_.data(); }  // avx2+: token t at packed_ld() * t
    uint64_t packed_ld() const { return packed_ld_; }

  private:
    Isa isa_ = Isa::scalar;
    const float* x_ = nullptr;
    uint64_t ldx_ = 0, k_ = 0, n_ = 0, packed_ld_ = 0;
    std::vector<float> packed_;
};

// float_matmul on prepared tokens [t0, t1) of x, at x.isa(). Throws qforge::Error for a type that
// is not a float row type or tokens past x.n().
void float_matmul_prepared(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                           const FloatTokens& x, uint64_t t0, uint64_t t1, float* out,
                           uint64_t ldo);

namespace detail {
// n floats of v starting on a 64-byte boundary (v grows as needed): the level kernels' packed
// buffers (a vector load that splits a cache line costs a second access; unaligned operands
// measured 1.4x slower).
inline float* aligned_floats(std::vector<float>& v, uint64_t n) {
    v.resize(n + 16);
    const auto at = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (64 - at % 64) % 64 / sizeof(float);
}

// The level kernels (float_gemm_avx2.cpp, float_gemm_avx512.cpp), same contract, k >= 1, on
// tokens packed by the level's pack_tokens_*: n tokens of x into `packed`, packed_token_ld(k)
// floats apart (the same layout at both levels); the kernel reads tokens [t0, t1) of them.
// A packed token: its chain-major blocks of k, then the last k mod 8 floats as they are, then
// padding (so tokens are not a multiple of the L1 set stride apart).
inline uint64_t packed_token_ld(uint64_t k) { return (k + 15) / 16 * 16 + 16; }
void float_gemm_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                     const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                     uint64_t ldo);
void pack_tokens_avx2(const float* x, uint64_t ldx, uint64_t k, uint64_t n, float* packed);
void pack_tokens_avx512(const float* x, uint64_t ldx, uint64_t k, uint64_t n, float* packed);
void float_gemm_avx512(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                       const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                       uint64_t ldo);
}  // namespace detail

}  // namespace qforge
