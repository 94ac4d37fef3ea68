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
// tile, so results are bit-identical for any thread count and for prefill versus decode. In int8
// mode the avx512 level gives the scalar reference's bits (one row per lane, the reference's own
// roundings in its order), and so does the avx2 level on packed rows (qmatmul_packed); avx2's
// row kernels differ from both by float rounding only. In f32 mode avx512 is avx2's kernel.
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
    // The same in two steps, so threads can share the second: sizes the buffers for n tokens of
    // k, then prepares tokens [t0, t1) of x (each token's rows only, so disjoint ranges may run
    // at once).
    void resize(Mode mode, uint64_t n, uint64_t k);
    void prepare_tokens(const float* x, uint64_t t0, uint64_t t1);

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

    // int8 mode, 16 or more tokens, where cpu_uses_amx_int8(): the AMX kernel's operands: tokens in
    // groups of kTileTokens (16), group g's block b a contiguous [16 tokens][32 codes]
    // (tile_codes), and the same tokens' scales, code sums and scaled sums of that block as runs of
    // 16 (the rows of a last partial group past the last token hold anything: products of them are
    // never read). has_tiles() says whether they were prepared.
    static constexpr uint64_t kTileTokens = 16;
    bool has_tiles() const { return tiles_; }
    const int8_t* tile_codes(uint64_t g, uint64_t b) const {
        return tq_.data() + (g * blocks_ + b) * kTileTokens * 32;
    }
    const float* tile_scales(uint64_t g, uint64_t b) const {
        return td_.data() + (g * blocks_ + b) * kTileTokens;
    }
    const int32_t* tile_sums(uint64_t g, uint64_t b) const {
        return ts_.data() + (g * blocks_ + b) * kTileTokens;
    }
    const float* tile_scaled_sums(uint64_t g, uint64_t b) const {
        return tds_.data() + (g * blocks_ + b) * kTileTokens;
    }

  private:
    uint64_t sums_stride() const { return (blocks_ + 7) / 8 * 8; }

    Mode mode_ = Mode::int8;
    uint64_t n_ = 0, k_ = 0, blocks_ = 0;
    std::vector<int8_t> q_;
    std::vector<float> d_;
    std::vector<int32_t> s_;
    std::vector<float> f_;
    std::vector<int8_t> pq_;
    std::vector<float> ds_;
    bool tiles_ = false;
    std::vector<int8_t> tq_;
    std::vector<float> td_, tds_;
    std::vector<int32_t> ts_;
};

// Rows per call that the fastest level computes together (avx512: two groups of 16 lanes); calls
// on whole multiples of it waste no lanes. Any split gives the same bits.
inline constexpr uint64_t kQmatmulRowGrain = 32;

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

// Rows repacked at load for the x86 kernels (kernels/cpu/qpack.hpp).
class QPackedRows;
// Whether qmatmul_packed_isa serves type t at level isa (<= cpu_isa()): avx512, every type with
// a packed layout; avx2, q8*, q4_g*, q4s_g* and q4k_g32 (the level's kernels for the others read
// rows).
bool qmatmul_packed_serves(Isa isa, QType t);
// qmatmul on packed rows, int8 mode, at level isa: rows [r0, r1) of m (any r0; multiples of 16
// waste no lanes) against tokens [t0, t1), the bits of qmatmul_scalar on the same rows at every
// level. Throws qforge::Error where qmatmul_packed_serves(isa, m.type()) is false, or in f32 mode.
void qmatmul_packed_isa(Isa isa, const QPackedRows& m, uint64_t r0, uint64_t r1,
                        const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo);
// The same at cpu_isa().
void qmatmul_packed(const QPackedRows& m, uint64_t r0, uint64_t r1, const QActivations& a,
                    uint64_t t0, uint64_t t1, float* out, uint64_t ldo);

// Fast dequantization of n consecutive rows of k weights into out[n][k] (equal to
// dequantize_row_ref, bit for bit).
void dequantize_rows(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                     float* out);
void dequantize_rows_isa(Isa isa, QType t, const uint8_t* w, uint64_t stride, uint64_t n,
                         uint64_t k, float* out);

}  // namespace qforge
