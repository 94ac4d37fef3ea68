// bf16 weights times activations rounded to bf16, with AVX-512 BF16's vdpbf16ps: an opt-in,
// inexact mode for bf16 models (CpuBackendOptions::bf16_activations, `--bf16-activations`). The
// exact mode (float_gemm.hpp's dot_row bits, activations in f32) stays the default.
//
// What the mode changes. Each activation is rounded to bf16 (round to nearest even; 8
// significant bits, so |x - bf16(x)| <= 2^-8 |x|); the weights are bf16 already, so every
// product w * bf16(x) is exact in f32, and vdpbf16ps adds two of them per lane per instruction
// (denormal bf16 inputs and f32 results are flushed to zero, as the instruction defines). A
// product's error is then at most 2^-8 sum |w x| from the activations plus (k + 5) 2^-24 sum |w x|
// from the f32 sums (tests/kernels_bf16_gemm_test.cpp); KL divergence against exact activations
// is measured in kernels/README.md, "bf16 activations".
//
// Order. Row r's output is one chain per lane: acc = 0; for each pair p of weights (2p, 2p + 1)
// in order, acc = vdpbf16ps(acc, w pair, x pair); rows sit in lanes, 16 to a vector. So an
// output's operations depend only on k, never on the row or token tile, the thread, or prefill
// versus decode (one token is a 1-token tile): bit-identical across all of them on one CPU.
// The weights are repacked once, at load, 16 rows to a tile with each pair of a row in its lane
// (`Bf16PackedRows`), so neither decode nor prefill transposes anything.
//
// On AMX (cpu_uses_amx_bf16(): tdpbf16ps on 16 x 16 tiles of f32 sums, Intel since Sapphire Rapids)
// the chain is the tiles' instead: acc = 0; for each step s of 16 pairs, in order, acc =
// tdpbf16ps(acc, the token's pairs 16s .. 16s + 15, the row's same pairs), the instruction adding
// the step's 32 exact products in its own fixed order (flushing denormals likewise). Again an
// output's operations depend only on k, so the same promises hold on one CPU; the two kernels'
// bits differ in the last places (both within the bound below), and `Bf16Kernel` picks one for
// tests. The packed rows serve both: a tile's pairs are the tiles' B operand as they lie.
//
// The calibration pass (quant/) uses the same chain for its products in bf16 mode: weights
// packed from f32 (`pack_f32`), and Gram matrices x^T x of chunks of calibration rows
// (`pack_columns`, `bf16_gram`), whose inputs are then rounded to bf16 like the activations.
#pragma once

#include <cstdint>
#include <vector>

#include "core/alloc.hpp"
#include "kernels/cpu/isa.hpp"

namespace qforge {

// Whether this process can run the mode: the avx512 level in use and AVX-512 BF16 on the CPU.
bool bf16_dot_available();

// Which instructions multiply: vdpbf16ps on 16 lanes, or AMX tiles (tdpbf16ps). The default,
// bf16_kernel(), is amx where cpu_uses_amx_bf16().
enum class Bf16Kernel : uint8_t { avx512, amx };
Bf16Kernel bf16_kernel();
// The kernels this process can run (what the tests compare): avx512, and amx where it is used.
std::vector<Bf16Kernel> bf16_kernels();

// out[i] = f32_to_bf16(x[i]) for i < n (core/half.hpp's bits, NaN kept a NaN; 16 at a time at
// the avx512 level: `isa`, for tests of each level).
void f32_to_bf16_array(const float* x, uint64_t n, uint16_t* out, Isa isa = cpu_isa());

// bf16 rows [rows][k] (2 bytes per weight, rows `stride` bytes apart) repacked: tile i holds rows
// 16 i .. 16 i + 15, and for each pair p the 16 rows' weights (2p, 2p + 1) as one 64-byte vector
// (lane l: row 16 i + l, weight 2p in the low half). Rows past the last, a last odd weight and
// the pairs that round a tile up to a whole number of 16-pair steps (AMX's operand) are zero.
class Bf16PackedRows {
  public:
    Bf16PackedRows() = default;
    // row_major_copy: also keep each row's pairs contiguous, zero up to whole 16-pair steps
    // (pack_columns fills it; bf16_gram on AMX reads its tokens there in place).
    Bf16PackedRows(uint64_t rows, uint64_t k, bool row_major_copy = false);
    // The same shape change in place: the buffers are kept where they are big enough (a buffer
    // packed again and again, as the Hessian's chunks are, then faults in no fresh pages), and
    // zeroed as the constructor leaves them.
    void reshape(uint64_t rows, uint64_t k, bool row_major_copy = false);
    // Packs tiles [tile0, tile1) (callers may split them over threads).
    void pack(const uint8_t* w, uint64_t stride, uint64_t tile0, uint64_t tile1);
    // The same from f32 rows [rows][k], `ld` floats apart, each weight rounded to bf16.
    void pack_f32(const float* w, uint64_t ld, uint64_t tile0, uint64_t tile1);
    // The columns of x [k][ld] (k rows of at least rows() floats) as the rows: row r is column r
    // of x, rounded to bf16 (for the Gram matrix x^T x: bf16_gram); the row-major copy too.
    void pack_columns(const float* x, uint64_t ld, uint64_t tile0, uint64_t tile1,
                      Isa isa = cpu_isa());

    uint64_t rows() const { return rows_; }
    uint64_t k() const { return k_; }
    uint64_t pairs() const { return (k_ + 1) / 2; }
    uint64_t tiles() const { return (rows_ + 15) / 16; }
    uint64_t tile_bytes() const { return tile_bytes_of(k_); }
    const uint8_t* tile(uint64_t i) const { return data_.get() + i * tile_bytes(); }
    // The row-major copy (null without one): row r's pairs at row_major() + r * row_stride().
    const uint32_t* row_major() const {
        return reinterpret_cast<const uint32_t*>(rows_data_.get());
    }
    uint64_t row_stride() const { return tile_bytes() / 64; }

  private:
    // A tile of rows of k weights: its pairs in whole 16-pair steps of 64 bytes.
    static uint64_t tile_bytes_of(uint64_t k) { return ((k + 1) / 2 + 15) / 16 * 16 * 64; }

    uint64_t rows_ = 0, k_ = 0;
    uint64_t data_bytes_ = 0, rows_data_bytes_ = 0;  // the buffers' sizes
    AlignedBytes data_, rows_data_;
};

// n tokens of k activations rounded to bf16 (round to nearest even, NaN kept a NaN), as pairs:
// token t's pair p is one 32-bit word, weight 2p's activation in its low half, a last odd one
// paired with zero.
class Bf16Tokens {
  public:
    void prepare(const float* x, uint64_t n, uint64_t k);  // resize(n, k), fill(x, 0, n)
    void resize(uint64_t n, uint64_t k);
    // Tokens [t0, t1) from x [n][k] (x points at token 0; callers may split tokens over threads).
    void fill(const float* x, uint64_t t0, uint64_t t1);
    uint64_t tokens() const { return n_; }
    uint64_t k() const { return k_; }
    const uint32_t* pairs(uint64_t t) const { return p_.data() + t * ((k_ + 1) / 2); }

  private:
    uint64_t n_ = 0, k_ = 0;
    std::vector<uint32_t> p_;
};

// out[(t - t0) * ldo + (r - r0)] = row r of w . token t of x in this mode, for rows [r0, r1)
// (any r0; tiles start at multiples of 16) and tokens [t0, t1). Throws qforge::Error when
// bf16_dot_available() is false, `kernel` is amx where cpu_uses_amx_bf16() is false, or k differs.
void bf16_matmul(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, const Bf16Tokens& x,
                 uint64_t t0, uint64_t t1, float* out, uint64_t ldo,
                 Bf16Kernel kernel = bf16_kernel());

// The Gram matrix of w's rows: out[(t - t0) * ldo + (r - r0)] = row r . row t, for rows
// [r0, r1) and t in [t0, t1): bf16_matmul's chain with w's rows as the tokens (the same bits as
// bf16_matmul against a Bf16Tokens holding them). With w from pack_columns(x), the (r, t) entry
// of x^T x. Throws as bf16_matmul.
void bf16_gram(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, uint64_t t0, uint64_t t1,
               float* out, uint64_t ldo, Bf16Kernel kernel = bf16_kernel());

}  // namespace qforge
