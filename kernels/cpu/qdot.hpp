// Dequant-fused products of quantized rows (formats/qtype.hpp's layout) with activations: the
// packed codes are read once and dequantized in registers; float weights are never materialized.
//
// Two activation modes:
//   int8 (default)  each token's activations are quantized once per projection input to int8 in
//                   blocks of 32 (one float scale d = amax / 127 per block, and the block's code
//                   sum), so a block's product is an integer dot product (AVX2: maddubs/madd)
//                   scaled by d * scale: sum_g scale_g * sum_b d_b * (sum_i q_i a_i - zero_g *
//                   sum_i a_i). The cost in quality is measured as KL divergence (README).
//   f32             exact: the row's weights dequantized in registers times float activations.
//
// Each function has a scalar reference (_scalar) and faster versions per instruction-set level
// (kernels/cpu/isa.hpp: avx2, avx512), chosen at run time from one table of (qtype, level)
// kernels in qdot.cpp, built from formats/qtype.hpp's table. Every output element is one dot
// product whose summation order depends only on k and the level, never on the thread or the
// tile, so results are bit-identical for any thread count and for prefill versus decode. The
// avx512 level gives the avx2 level's bits (int8 products are exact integers and the float
// accumulation keeps avx2's order); scalar differs from both by float rounding only.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/qtype.hpp"
#include "kernels/cpu/isa.hpp"

namespace qforge {

// Activations of n tokens prepared for products with rows of k weights. Buffers are padded to a
// whole number of 32-blocks with zeros (codes past k dequantize to 0, so padding adds nothing).
class QActivations {
  public:
    enum class Mode : uint8_t { int8, f32 };

    // Prepares tokens [0, n) of x ([n][k], row-major). Reuses its buffers.
    void prepare(Mode mode, const float* x, uint64_t n, uint64_t k);

    Mode mode() const { return mode_; }
    uint64_t tokens() const { return n_; }
    uint64_t k() const { return k_; }
    uint64_t blocks() const { return blocks_; }  // ceil(k / 32)

    // int8 mode: codes [token][blocks * 32], scales and code sums [token][blocks]. The scales of
    // a token are zero-padded to a multiple of 8 blocks (the x86 kernels read a row's last < 8
    // blocks' scales as one 8-lane vector).
    const int8_t* codes(uint64_t t) const { return q_.data() + t * blocks_ * 32; }
    const float* scales(uint64_t t) const { return d_.data() + t * sums_stride(); }
    const int32_t* sums(uint64_t t) const { return s_.data() + t * blocks_; }
    // f32 mode: [token][blocks * 32].
    const float* floats(uint64_t t) const { return f_.data() + t * blocks_ * 32; }

    // int8 mode, the same values in the layouts the AVX2 kernels read (kernels/README.md):
    // pair_codes: codes(t) with each pair of blocks (2p, 2p + 1) stored as [2p: 0..15][2p+1:
    //     0..15][2p: 16..31][2p+1: 16..31], which is what one 32-byte load of two 4-bit chunks
    //     gives after splitting low and high nibbles (and a 3-bit chunk's bit planes after their
    //     shifts and masks); a last odd block stays in order.
    // scaled_sums: d * (code sum) per block, zero-padded to a multiple of 8 blocks.
    const int8_t* pair_codes(uint64_t t) const { return pq_.data() + t * blocks_ * 32; }
    const float* scaled_sums(uint64_t t) const { return ds_.data() + t * sums_stride(); }
    // quad_codes: the AVX-512 layout of the blocks in whole superblocks of 8 (the last < 8 are
    // read from pair_codes): blocks 4u .. 4u + 3, pairs 2u and 2u + 1, as [pair 2u's first 32
    // bytes][pair 2u + 1's first 32][2u's last 32][2u + 1's last 32], so one 64-byte load meets
    // the 4-bit codes' low nibbles of two pairs, the next their high ones. Built only when
    // cpu_isa() >= avx512 (empty otherwise).
    // Each token's quads start on a 64-byte boundary (a zmm load that splits a cache line costs a
    // second access).
    const int8_t* quad_codes(uint64_t t) const { return quad_base() + t * quad_stride(); }
    // The same quads with every code plus 128 as an unsigned byte (code XOR 0x80), for vpdpbusd
    // against signed 8-bit weights: sum (q + 128) w = sum q w + 128 sum w, and the kernel starts
    // each sum from -128 sum w, so the integer is the same exact one (qdot_avx512.cpp).
    const uint8_t* quad_codes_biased(uint64_t t) const {
        return reinterpret_cast<const uint8_t*>(quad_base() + (n_ + t) * quad_stride());
    }

  private:
    uint64_t sums_stride() const { return (blocks_ + 7) / 8 * 8; }
    uint64_t quad_stride() const { return blocks_ / 8 * 256; }  // whole superblocks only
    // qq_'s first 64-byte aligned byte (computed, so a copied QActivations stays right).
    const int8_t* quad_base() const {
        const auto at = reinterpret_cast<uintptr_t>(qq_.data());
        return qq_.data() + (64 - at % 64) % 64;
    }

    Mode mode_ = Mode::int8;
    uint64_t n_ = 0, k_ = 0, blocks_ = 0;
    std::vector<int8_t> q_;
    std::vector<float> d_;
    std::vector<int32_t> s_;
    std::vector<float> f_;
    std::vector<int8_t> pq_;
    std::vector<int8_t> qq_;
    std::vector<float> ds_;
};

// out[(t - t0) * ldo + (r - r0)] = row r of w . token t of a, for rows [r0, r1) and tokens
// [t0, t1). w: quantized rows of a.k() weights, `stride` bytes apart (qtype_row_bytes). Tiles over
// tokens internally so each block of codes is unpacked once per tile of tokens.
void qmatmul(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
             const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo);
void qmatmul_scalar(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                    const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo);
// qmatmul at a given level (the tests run every level the CPU has). Throws qforge::Error for a
// level above cpu_isa() or a type outside the qtype table.
void qmatmul_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                 const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo);

// Fast dequantization of n consecutive rows of k weights into out[n][k] (equal to
// dequantize_row_ref, bit for bit).
void dequantize_rows(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                     float* out);
void dequantize_rows_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t n,
                         uint64_t k, float* out);

}  // namespace qforge
