// The AVX2 float GEMM of kernels/cpu/float_gemm.hpp (lanes along k), written over a vector type V
// (internal to kernels/cpu). Each level's translation unit defines QF_GEMM_TARGET (its target
// attribute) and V before instantiating gemm<V>; everything here has internal linkage, so no copy
// compiled for one level can be picked by the linker for another.
//
// V provides: reg (the vector type), kLanes (8 or 16 floats), kRows x kTokens (the register
// tile: one accumulator per (row, token), plus kRows weight vectors and one activation vector,
// must fit the level's registers), zero, load, store, fma (one fused multiply-add per lane) and
// fma8 (the same on lanes 0-7 only, the others kept: dot_row's 8-blocks, which go into its
// accumulator 0 alone).
//
// Layout. A (row, token) output's partial sums are one record of 32 floats, [acc0 | acc1 | acc2 |
// acc3] of dot_row's four 8-lane accumulators. A chain group is kLanes consecutive floats of it
// (AVX2: one accumulator, four groups) and covers the same kLanes
// floats of every 32-step of k, so group c of step s reads w and x at 32 s + kLanes c: the groups
// together read each cache line once. The products enter each lane in dot_row's order (step by
// step, then the 8-blocks into acc0), each lane's sum staying in a register within a block of k
// and in the record, unrounded, between blocks, so the record ends equal to dot_row's four
// accumulators and the output to dot_row.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#ifndef QF_GEMM_TARGET
#error "define QF_GEMM_TARGET (the level's target attribute) before including float_gemm_x86.hpp"
#endif

namespace qforge::detail {

namespace {

constexpr uint64_t kStep = 32;  // floats per step of dot_row's four 8-lane accumulators
// Steps per block of k: 512 floats, so a token tile's activations (6 tokens x 2 KiB) and a row
// tile's weights stay in L1 while the row tiles of a panel pass.
constexpr uint64_t kBlockSteps = 16;
// Rows widened to f32 per panel: up to 16 rows of k floats (360 KiB at k = 5632) stay in L2 while
// every token tile of the call passes them, so each weight is widened once per call. A panel is a
// whole number of register tiles (AVX2: 15 rows of 3; a 16th row ran as a 1-row tile, at a third
// of the tile's rate, 7% of an f16 prefill).
constexpr uint64_t kPanelRows = 16;
template <class V>
constexpr uint64_t panel_rows() {
    return kPanelRows / V::kRows * V::kRows;
}

// One register tile's work: rows w + i * wld (i < RM) against tokens x + j * xld (j < TN), steps
// [s0, s1) and then `eights` 8-blocks, into records part + i * pld + j * kStep.
struct Tile {
    const float* w;
    uint64_t wld;
    const float* x;
    uint64_t xld;
    uint64_t s0, s1, eights;
    float* part;
    uint64_t pld;
    bool first;  // the records start at zero (the call's first block of k)
};

template <class V, int RM, int TN>
QF_GEMM_TARGET void tile_product(const Tile& t) {
    constexpr uint64_t groups = kStep / V::kLanes;
    for (uint64_t c = 0; c < groups; ++c) {
        const uint64_t lane0 = c * V::kLanes;
        typename V::reg acc[RM][TN];
#pragma GCC unroll 8
        for (int i = 0; i < RM; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < TN; ++j)
                acc[i][j] = t.first ? V::zero()
                                    : V::load(t.part + static_cast<uint64_t>(i) * t.pld +
                                              static_cast<uint64_t>(j) * kStep + lane0);
        // The packed rows are group-major within a block of k (interleave_groups): group c's
        // lanes of the block's steps lie together.
        const uint64_t base = t.s0 * kStep + lane0 * (t.s1 - t.s0);
        for (uint64_t s = 0; s < t.s1 - t.s0; ++s) {
            const uint64_t at = base + s * V::kLanes;
            typename V::reg wv[RM];
#pragma GCC unroll 8
            for (int i = 0; i < RM; ++i)
                wv[i] = V::load(t.w + static_cast<uint64_t>(i) * t.wld + at);
#pragma GCC unroll 8
            for (int j = 0; j < TN; ++j) {
                const typename V::reg xv = V::load(t.x + static_cast<uint64_t>(j) * t.xld + at);
#pragma GCC unroll 8
                for (int i = 0; i < RM; ++i) acc[i][j] = V::fma(wv[i], xv, acc[i][j]);
            }
        }
        if (c == 0)
            for (uint64_t e = 0; e < t.eights; ++e) {
                const uint64_t at = t.s1 * kStep + 8 * e;
#pragma GCC unroll 8
                for (int i = 0; i < RM; ++i)
#pragma GCC unroll 8
                    for (int j = 0; j < TN; ++j)
                        acc[i][j] = V::fma8(t.w + static_cast<uint64_t>(i) * t.wld + at,
                                            t.x + static_cast<uint64_t>(j) * t.xld + at, acc[i][j]);
            }
#pragma GCC unroll 8
        for (int i = 0; i < RM; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < TN; ++j)
                V::store(t.part + static_cast<uint64_t>(i) * t.pld +
                             static_cast<uint64_t>(j) * kStep + lane0,
                         acc[i][j]);
    }
}

// tile_product for every partial tile shape: entry (rows - 1) * kTokens + (tokens - 1).
template <class V, size_t... I>
constexpr auto tile_table(std::index_sequence<I...>) {
    return std::array<void (*)(const Tile&), sizeof...(I)>{
        &tile_product<V, static_cast<int>(I) / V::kTokens + 1,
                      static_cast<int>(I) % V::kTokens + 1>...};
}

// dot_row's finish on a record: (acc0 + acc1) + (acc2 + acc3), the lane tree
// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), then the last k mod 8 products one by one
// (float_dot.cpp's dot_avx2, instruction for instruction: as scalar code it was 5% slower in a
// 128 x 128 x 2048 product; no contraction in this library, so w * x is rounded, then added).
QF_GEMM_TARGET inline float finish(const float* rec, const float* w, const float* x, uint64_t k) {
    const __m256 a01 = _mm256_add_ps(_mm256_loadu_ps(rec), _mm256_loadu_ps(rec + 8));
    const __m256 a23 = _mm256_add_ps(_mm256_loadu_ps(rec + 16), _mm256_loadu_ps(rec + 24));
    const __m256 s = _mm256_add_ps(a01, a23);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float sum = _mm_cvtss_f32(h);
    for (uint64_t i = k / 8 * 8; i < k; ++i) sum += w[i] * x[i];
    return sum;
}

// Rearranges whole steps [0, steps) of a packed row, block of k by block of k (kBlockSteps steps,
// the last one shorter), so that the lanes each chain group reads lie together: element 32 s + g
// (s in the block [s0, s1), g < 32, group c = g / lanes) moves to 32 s0 + lanes (c (s1 - s0) + s -
// s0) + g % lanes. A group's pass over a block then reads one contiguous run per row and token
// instead of a quarter (AVX2) or half of every step's two lines, which the hardware prefetcher
// followed badly (float prefill at half the FMA peak on Zen 3). The 8-blocks and the last k mod 8
// floats keep their places; only addresses change, no sum.
template <class V>
QF_GEMM_TARGET inline void interleave_groups(float* row, uint64_t steps) {
    constexpr uint64_t lanes = V::kLanes, groups = kStep / lanes;
    alignas(64) float block[kBlockSteps * kStep];
    for (uint64_t s0 = 0; s0 < steps; s0 += kBlockSteps) {
        const uint64_t n = std::min(steps, s0 + kBlockSteps) - s0;
        float* at = row + s0 * kStep;
        std::memcpy(block, at, sizeof(float) * n * kStep);
        for (uint64_t s = 0; s < n; ++s)
            for (uint64_t c = 0; c < groups; ++c)
                std::memcpy(at + lanes * (c * n + s), block + s * kStep + c * lanes,
                            sizeof(float) * lanes);
    }
}

// Rows [r0, r1) times tokens [t0, t1) (float_gemm.hpp's contract; t is f32, f16 or bf16, k >= 1).
// The tokens are packed once per call and each panel of panel_rows() rows
// widened once, both 64-byte aligned with a row length rounded up to 16 floats; per panel, tiles
// of kTokens tokens; per token tile, blocks of k; per block, the panel's register tiles.
template <class V>
QF_GEMM_TARGET void gemm(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                         const float* x, uint64_t ldx, uint64_t k, uint64_t t0, uint64_t t1,
                         float* out, uint64_t ldo) {
    static constexpr auto table = tile_table<V>(std::make_index_sequence<V::kRows * V::kTokens>());
    constexpr uint64_t rows = V::kRows, tokens = V::kTokens, pld = tokens * kStep;
    thread_local std::vector<float> panel_buf, part_buf, x_buf;
    const uint64_t steps = k / kStep, eights = k % kStep / 8, wld = (k + 15) / 16 * 16 + 16;
    constexpr uint64_t panel_n = panel_rows<V>();
    float* part = aligned_floats(part_buf, panel_n * pld);
    float* panel = aligned_floats(panel_buf, panel_n * wld);
    float* xs = aligned_floats(x_buf, (t1 - t0) * wld);
    const uint64_t xld = wld;
    for (uint64_t tok = t0; tok < t1; ++tok) {
        std::memcpy(xs + (tok - t0) * wld, x + tok * ldx, 4 * k);
        interleave_groups<V>(xs + (tok - t0) * wld, steps);
    }
    for (uint64_t pb = r0; pb < r1; pb += panel_n) {
        const uint64_t pe = std::min(r1, pb + panel_n);
        for (uint64_t r = pb; r < pe; ++r) {
            float_row_to_f32(Isa::avx2, t, w + r * stride, panel + (r - pb) * wld, k);
            interleave_groups<V>(panel + (r - pb) * wld, steps);
        }
        for (uint64_t tb = t0; tb < t1; tb += tokens) {
            const uint64_t te = std::min(t1, tb + tokens);
            const float* xt = xs + (tb - t0) * xld;
            uint64_t s0 = 0;
            do {  // blocks of k; the last one also takes the 8-blocks (k < 32: only they)
                const uint64_t s1 = std::min(steps, s0 + kBlockSteps);
                for (uint64_t ib = pb; ib < pe; ib += rows) {
                    const uint64_t ie = std::min(pe, ib + rows);
                    const Tile tile{
                        panel + (ib - pb) * wld, wld, xt,     xld, s0, s1, s1 == steps ? eights : 0,
                        part + (ib - pb) * pld,  pld, s0 == 0};
                    table[(ie - ib - 1) * tokens + (te - tb - 1)](tile);
                }
                s0 = s1;
            } while (s0 < steps);
            for (uint64_t tok = tb; tok < te; ++tok)
                for (uint64_t r = pb; r < pe; ++r)
                    out[(tok - t0) * ldo + (r - r0)] =
                        finish(part + (r - pb) * pld + (tok - tb) * kStep, panel + (r - pb) * wld,
                               xt + (tok - tb) * xld, k);
        }
    }
}

}  // namespace

}  // namespace qforge::detail

#endif  // __x86_64__
