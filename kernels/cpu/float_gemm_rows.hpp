// The float GEMM with one weight row per lane (kernels/cpu/float_gemm.hpp), for a vector level V:
// float_gemm_avx512.cpp (16 rows per zmm) and float_gemm_avx2.cpp (8 rows per ymm) include it
// after defining QF_ROWS_TARGET, their target attribute.
//
// dot_row (float_dot.hpp, AVX2) sums k products in 32 independent chains: chain g (0..31) is
// lane g % 8 of accumulator g / 8 and takes the elements 32 s + g of every whole 32-step s in
// order, then (g < 8 only) the elements 32 steps + 8 e + g of the last < 4 whole 8-blocks;
// (c0..7 + c8..15) + (c16..23 + c24..31) lane by lane, the lane tree ((0 + 4) + (2 + 6)) +
// ((1 + 5) + (3 + 7)) and the last k mod 8 products one by one finish it.
//
// Here a register holds one chain of V::kLanes rows (lane = row) for one token. A register tile
// is V::kGroups row groups x V::kTokens tokens: per position kGroups weight loads, kTokens
// broadcast activations and kGroups * kTokens FMAs. Each lane sees its row's products in
// dot_row's order with dot_row's roundings, and the finish runs dot_row's adds lane by lane, so
// every output is dot_row's bits at every level.
//
// Layout. Weights are widened to f32 and transposed once per (row tile, block of k) into a
// chain-major panel (V::pack_weights): per row group, chain g's positions in the block one after
// another (kLanes floats each), so a g pass reads one contiguous run per row group. Tokens are
// packed once per call in the same chain-major order (V::pack_token). Between blocks of k each
// (token, row group, chain) keeps its unrounded partial sum in memory; with one block, only the
// current token tile's.
//
// V provides: reg, kLanes, kGroups, kTokens; zero, load/store (aligned), set1, add, mul, fma;
// store_rows(out, v, n) (the first n lanes); pack_weights<T>, pack_tail<T> and pack_token below.
#pragma once

#ifndef QF_ROWS_TARGET
#error "define QF_ROWS_TARGET (the level's target attribute) before including float_gemm_rows.hpp"
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "formats/qtype.hpp"
#include "kernels/cpu/float_gemm.hpp"

namespace qforge::detail::rows {

constexpr uint64_t kChains = 32;  // dot_row's 4 accumulators x 8 lanes
// 32-steps per block of k: a row tile's block (48 rows x 2048 floats, 384 KiB at avx512) stays
// in L2 while every token tile of the call passes it.
constexpr uint64_t kBlockSteps = 64;

// The chains' positions within a block of `steps` 32-steps (plus, in the last block, the `eights`
// 8-blocks of chains 0..7): chain g starts at start(g) and has length(g) positions.
struct Block {
    uint64_t steps, eights;
    uint64_t length(uint64_t g) const { return steps + (g < 8 ? eights : 0); }
    uint64_t start(uint64_t g) const { return g * steps + std::min<uint64_t>(g, 8) * eights; }
};

// A chain's first position in a row tile's panel: one position of padding per chain, so the 32
// chains of a step, written together by the pack, do not all map to one L1 set (a chain's run of
// 64 positions x 3 row groups was 12 KiB, a multiple of the set stride: the pack took 19% of a
// 2048 x 2048 x 128-token avx512 product, 13% with the padding).
inline uint64_t panel_start(const Block& b, uint64_t g) { return b.start(g) + g; }
// Positions per row group in a panel: a block's and its padding.
constexpr uint64_t kGroupStride = kChains * (kBlockSteps + 1) + 24;

// Blocks of k: [s0, s0 + kBlockSteps) 32-steps each; the last also takes the 8-blocks (k < 32:
// only they).
inline uint64_t block_count(uint64_t k) {
    return std::max<uint64_t>(1, (k / kChains + kBlockSteps - 1) / kBlockSteps);
}
inline Block block_at(uint64_t k, uint64_t bi) {
    const uint64_t steps = k / kChains, s0 = bi * kBlockSteps;
    return Block{std::min(steps, s0 + kBlockSteps) - s0,
                 bi + 1 == block_count(k) ? k % kChains / 8 : 0};
}

// One token's block of k (32-steps [s0, s0 + b.steps) of x, then b.eights 8-blocks at element
// 32 steps) in chain-major order, one float at a time: position p of chain g at
// at[b.start(g) + p] (V::pack_token's reference and its remainder).
inline void pack_token_scalar(const float* x, uint64_t steps, uint64_t s0, uint64_t s,
                              const Block& b, float* at) {
    for (; s < b.steps; ++s)
        for (uint64_t g = 0; g < kChains; ++g) at[b.start(g) + s] = x[kChains * (s0 + s) + g];
    for (uint64_t e = 0; e < b.eights; ++e)
        for (uint64_t g = 0; g < 8; ++g)
            at[b.start(g) + b.steps + e] = x[kChains * steps + 8 * e + g];
}

template <class V>
QF_ROWS_TARGET void pack_tokens(const float* x, uint64_t ldx, uint64_t k, uint64_t n,
                                float* packed) {
    const uint64_t steps = k / kChains, body = k / 8 * 8, blocks = block_count(k);
    for (uint64_t tok = 0; tok < n; ++tok) {
        const float* src = x + tok * ldx;
        float* dst = packed + tok * packed_token_ld(k);
        for (uint64_t bi = 0; bi < blocks; ++bi)
            V::pack_token(src, steps, bi * kBlockSteps, block_at(k, bi),
                          dst + kChains * bi * kBlockSteps);
        std::memcpy(dst + body, src + body, 4 * (k - body));
    }
}

// One register tile over one block: row groups [0, G) of the panel (kGroupStride positions
// apart) against tokens [0, T) (packed, xld floats apart, at the block's start), every chain;
// partial sums at part[tok * pld + (group * 32 + g) * kLanes].
struct Tile {
    const float* panel;
    const float* x;
    uint64_t xld;
    Block b;
    float* part;
    uint64_t pld;
    bool first;  // the partial sums start at zero (the call's first block of k)
};

template <class V, int G, int T>
QF_ROWS_TARGET void tile_product(const Tile& t) {
    using reg = typename V::reg;
    constexpr uint64_t L = V::kLanes;
    for (uint64_t g = 0; g < kChains; ++g) {
        const uint64_t start = t.b.start(g), n = t.b.length(g);
        float* part = t.part + g * L;
        reg acc[G][T];
#pragma GCC unroll 8
        for (int i = 0; i < G; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < T; ++j)
                acc[i][j] = t.first ? V::zero() : V::load(part + j * t.pld + i * kChains * L);
        const float* w = t.panel + panel_start(t.b, g) * L;
        const float* x = t.x + start;
        for (uint64_t p = 0; p < n; ++p) {
            reg wv[G];
#pragma GCC unroll 8
            for (int i = 0; i < G; ++i) wv[i] = V::load(w + (i * kGroupStride + p) * L);
#pragma GCC unroll 8
            for (int j = 0; j < T; ++j) {
                const reg xv = V::set1(x[j * t.xld + p]);
#pragma GCC unroll 8
                for (int i = 0; i < G; ++i) acc[i][j] = V::fma(wv[i], xv, acc[i][j]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < G; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < T; ++j) V::store(part + j * t.pld + i * kChains * L, acc[i][j]);
    }
}

template <class V, size_t... I>
constexpr auto tile_table(std::index_sequence<I...>) {
    return std::array<void (*)(const Tile&), sizeof...(I)>{
        &tile_product<V, static_cast<int>(I) / V::kTokens + 1,
                      static_cast<int>(I) % V::kTokens + 1>...};
}

// dot_row's finish for kLanes rows of one token: c[g] the 32 chain sums (lane = row), then the
// last k mod 8 products (tail[e]: element k / 8 * 8 + e of the rows) added one by one.
template <class V>
QF_ROWS_TARGET inline typename V::reg finish(const float* c, const float* tail, uint64_t groups,
                                             const float* x, uint64_t tails) {
    using reg = typename V::reg;
    constexpr uint64_t L = V::kLanes;
    reg s[8];
    for (uint64_t l = 0; l < 8; ++l)
        s[l] = V::add(V::add(V::load(c + l * L), V::load(c + (8 + l) * L)),
                      V::add(V::load(c + (16 + l) * L), V::load(c + (24 + l) * L)));
    reg sum = V::add(V::add(V::add(s[0], s[4]), V::add(s[2], s[6])),
                     V::add(V::add(s[1], s[5]), V::add(s[3], s[7])));
    for (uint64_t e = 0; e < tails; ++e)
        sum = V::add(sum, V::mul(V::load(tail + e * groups * L), V::set1(x[e])));
    return sum;
}

template <class V>
QF_ROWS_TARGET void gemm(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                         const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                         uint64_t ldo) {
    constexpr uint64_t L = V::kLanes;
    constexpr uint64_t kGroups = V::kGroups, kTokens = V::kTokens;
    static constexpr auto table = tile_table<V>(std::make_index_sequence<kGroups * kTokens>());
    constexpr uint64_t tile_rows = kGroups * L;
    const uint64_t steps = k / kChains, body = k / 8 * 8, tails = k - body, m = t1 - t0;
    const auto pack = t == QType::f32   ? V::template pack_weights<QType::f32>
                      : t == QType::f16 ? V::template pack_weights<QType::f16>
                                        : V::template pack_weights<QType::bf16>;
    const auto pack_t = t == QType::f32   ? V::template pack_tail<QType::f32>
                        : t == QType::f16 ? V::template pack_tail<QType::f16>
                                          : V::template pack_tail<QType::bf16>;
    const uint64_t blocks = block_count(k);
    thread_local std::vector<float> panel_buf, tail_buf, part_buf;
    float* panel = aligned_floats(panel_buf, kGroups * kGroupStride * L);
    float* tail = aligned_floats(tail_buf, 8 * tile_rows);
    const uint64_t pld = kGroups * kChains * L;  // a token's partial sums
    // Partial sums per token between blocks of k; with one block only per token tile (reused, so
    // they stay in L1 instead of streaming the whole call's through L2).
    float* part =
        aligned_floats(part_buf, (blocks == 1 ? std::min<uint64_t>(m, kTokens) : m) * pld);
    const uint64_t xld = packed_token_ld(k);
    const float* xs = packed + t0 * xld;
    const uint64_t token_tiles = (m + kTokens - 1) / kTokens;
    for (uint64_t rb = r0; rb < r1; rb += tile_rows) {
        const uint64_t rows = std::min(r1, rb + tile_rows) - rb;
        const uint64_t groups = (rows + L - 1) / L;
        const uint8_t* w_tile = w + rb * stride;
        for (uint64_t bi = 0; bi < blocks; ++bi) {
            const uint64_t s0 = bi * kBlockSteps;
            const Block b = block_at(k, bi);
            pack(w_tile, stride, rows, groups, s0, b, kChains * steps, panel);
            if (bi + 1 == blocks && tails) pack_t(w_tile, stride, rows, groups, body, tails, tail);
            const bool last = bi + 1 == blocks;
            for (uint64_t tt = 0; tt < token_tiles; ++tt) {
                const uint64_t tb = tt * kTokens, te = std::min(m, tb + kTokens);
                const Tile tile{panel,  xs + tb * xld + kChains * s0,        xld,
                                b,      part + (blocks == 1 ? 0 : tb) * pld, pld,
                                bi == 0};
                table[(groups - 1) * kTokens + (te - tb - 1)](tile);
                if (last)  // the tile's outputs while its partial sums are in L1
                    for (uint64_t tok = tb; tok < te; ++tok)
                        for (uint64_t gi = 0; gi < groups; ++gi) {
                            const auto sum =
                                finish<V>(tile.part + (tok - tb) * pld + gi * kChains * L,
                                          tail + gi * L, groups, xs + tok * xld + body, tails);
                            const uint64_t r = rb + gi * L;
                            V::store_rows(out + tok * ldo + (r - r0), sum,
                                          std::min<uint64_t>(L, r1 - r));
                        }
            }
        }
    }
}

}  // namespace qforge::detail::rows
