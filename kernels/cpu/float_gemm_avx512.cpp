// The AVX-512 level of kernels/cpu/float_gemm.hpp: one weight row per lane.
//
// dot_row (float_dot.hpp, AVX2) sums k products in 32 independent chains: chain g (0..31) is
// lane g % 8 of accumulator g / 8 and takes the elements 32 s + g of every whole 32-step s in
// order, then (g < 8 only) the elements 32 steps + 8 e + g of the last < 4 whole 8-blocks;
// (c0..7 + c8..15) + (c16..23 + c24..31) lane by lane, the lane tree ((0 + 4) + (2 + 6)) +
// ((1 + 5) + (3 + 7)) and the last k mod 8 products one by one finish it.
//
// Here a zmm register holds one chain of 16 rows (lane = row) for one token. A register tile is
// 3 row groups (48 rows) x 8 tokens: 24 accumulators, 3 weight vectors and one broadcast
// activation, 24 FMAs per 3 vector loads and 8 broadcasts. In L1 this tile ran at ~80% of the
// machine's FMA peak (207 of 257 GFLOP/s on one Zen 5 core) where the k-in-lanes tile that AVX2
// keeps (float_gemm_x86.hpp: 4 weight and 6 activation vector loads per 24 FMAs) ran at 55%.
// Each lane sees its row's products in dot_row's order with dot_row's roundings, and the finish
// runs dot_row's adds lane by lane on 16 rows at once, so every output is dot_row's bits.
//
// Layout. Weights are widened to f32 and transposed once per (row tile, block of k) into a
// chain-major panel: per row group, chain g's positions in the block one after another (16
// floats each), so a g pass reads one contiguous run per row group. Tokens are packed once per
// call in the same chain-major order. Between blocks of k each (token, row group, chain) keeps
// its unrounded partial sum in memory; with one block, only the current token tile's.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's masked AVX-512 intrinsics self-initialise their "undefined" operands, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

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
#define QF_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#endif

namespace qforge::detail {

#if defined(__x86_64__)
namespace {

constexpr uint64_t kChains = 32;  // dot_row's 4 accumulators x 8 lanes
constexpr uint64_t kLanes = 16;   // rows per zmm
constexpr int kGroups = 3;        // row groups per register tile (48 rows)
constexpr int kTokens = 8;        // tokens per register tile
// 32-steps per block of k: a row tile's block (48 rows x 2048 floats, 384 KiB) stays in L2 while
// every token tile of the call passes it.
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
// 2048 x 2048 x 128-token product, 13% with the padding).
inline uint64_t panel_start(const Block& b, uint64_t g) { return b.start(g) + g; }
// Positions per row group in a panel: a block's and its padding.
constexpr uint64_t kGroupStride = kChains * (kBlockSteps + 1) + 24;

// 16 f16 or bf16 values widened to f32 (exact).
template <QType T>
QF_AVX512 inline __m512 widen16(__m256i h) {
    if constexpr (T == QType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Elements [j, j + 16) of a float row (type T) widened to f32 exactly; with a mask, only its
// lanes (the others zero).
template <QType T>
QF_AVX512 inline __m512 load_row(const uint8_t* row, uint64_t j, __mmask16 m = 0xffff) {
    if constexpr (T == QType::f32) return _mm512_maskz_loadu_ps(m, row + 4 * j);
    return widen16<T>(_mm256_maskz_loadu_epi16(m, row + 2 * j));
}

// r[i] = row i (16 floats) -> r[c] = column c (16 rows).
QF_AVX512 inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    // Per 4 rows q: u[4q + c] holds column c, c + 4, c + 8, c + 12 of those rows (128-bit lanes).
    for (int q = 0; q < 4; ++q) {
        const __m512d a = _mm512_castps_pd(t[4 * q]), b = _mm512_castps_pd(t[4 * q + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * q + 2]), d = _mm512_castps_pd(t[4 * q + 3]);
        u[4 * q + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        r[c + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}

// Columns [j, j + count) (count <= 16) of 16 weight rows as column vectors
// of 16 rows. A row group of fewer rows repeats its last row (lanes whose outputs are not stored).
template <QType T>
QF_AVX512 inline void load_columns(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t j,
                                   uint64_t count, __m512 col[16]) {
#pragma GCC unroll 16
    for (uint64_t i = 0; i < 16; ++i) {
        const uint8_t* row = w + std::min(i, rows - 1) * stride;
        col[i] = load_row<T>(row, j, static_cast<__mmask16>((1u << count) - 1));
    }
    transpose16(col);
}

// Elements [j, j + 32) of 16 rows of 16-bit floats (f16 or bf16) as 32 column vectors of 16 rows,
// widened to f32. The transpose runs on the 16-bit values (half the shuffles of a transpose after
// widening): pairs of rows interleaved as 16-bit, then 32-bit, then 64-bit units, so that each
// 128-bit lane holds 8 rows of one element, and a two-source permute joins rows 0-7 and 8-15.
template <QType T>
QF_AVX512 inline void load_columns_32(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t j,
                                      __m512 col[32]) {
    __m512i r[16], a[16];
#pragma GCC unroll 16
    for (uint64_t i = 0; i < 16; ++i)
        r[i] = _mm512_loadu_si512(w + std::min(i, rows - 1) * stride + 2 * j);
    // a[2p] / a[2p + 1]: rows 2p, 2p + 1 of elements 8L + 0..3 / 8L + 4..7 (lane L), 32-bit units.
    for (int p = 0; p < 8; ++p) {
        a[2 * p] = _mm512_unpacklo_epi16(r[2 * p], r[2 * p + 1]);
        a[2 * p + 1] = _mm512_unpackhi_epi16(r[2 * p], r[2 * p + 1]);
    }
    // b[4q + m]: rows 4q..4q + 3 of elements 8L + 2m, 8L + 2m + 1, 64-bit units.
    __m512i b[16];
    for (int q = 0; q < 4; ++q) {
        const __m512i lo0 = a[4 * q], hi0 = a[4 * q + 1], lo1 = a[4 * q + 2], hi1 = a[4 * q + 3];
        b[4 * q + 0] = _mm512_unpacklo_epi32(lo0, lo1);
        b[4 * q + 1] = _mm512_unpackhi_epi32(lo0, lo1);
        b[4 * q + 2] = _mm512_unpacklo_epi32(hi0, hi1);
        b[4 * q + 3] = _mm512_unpackhi_epi32(hi0, hi1);
    }
    const __m512i low = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    const __m512i high = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    for (int m = 0; m < 4; ++m)
        for (int p = 0; p < 2; ++p) {
            // Lane L: element 8L + 2m + p of rows 0-7 (x) and of rows 8-15 (y).
            const __m512i x =
                p ? _mm512_unpackhi_epi64(b[m], b[4 + m]) : _mm512_unpacklo_epi64(b[m], b[4 + m]);
            const __m512i y = p ? _mm512_unpackhi_epi64(b[8 + m], b[12 + m])
                                : _mm512_unpacklo_epi64(b[8 + m], b[12 + m]);
            const __m512i e01 = _mm512_permutex2var_epi64(x, low, y);   // elements 2m+p, 8+2m+p
            const __m512i e23 = _mm512_permutex2var_epi64(x, high, y);  // 16+2m+p, 24+2m+p
            const int g = 2 * m + p;
            col[g] = widen16<T>(_mm512_castsi512_si256(e01));
            col[8 + g] = widen16<T>(_mm512_extracti64x4_epi64(e01, 1));
            col[16 + g] = widen16<T>(_mm512_castsi512_si256(e23));
            col[24 + g] = widen16<T>(_mm512_extracti64x4_epi64(e23, 1));
        }
}

// The weights of one row tile (rows [0, rows) of w, `groups` row groups) for one block of k
// (32-steps [s0, s0 + b.steps), then b.eights 8-blocks at element e0) into `panel`: position p
// of chain g of row group gi at panel[(gi * kGroupStride + panel_start(b, g) + p) * 16].
template <QType T>
QF_AVX512 void pack_weights(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t groups,
                            uint64_t s0, const Block& b, uint64_t e0, float* panel) {
    __m512 col[16];
    for (uint64_t gi = 0; gi < groups; ++gi) {
        const uint8_t* g_rows = w + gi * kLanes * stride;
        const uint64_t n = std::min<uint64_t>(kLanes, rows - gi * kLanes);
        for (uint64_t s = 0; s < b.steps; ++s)
            if constexpr (T != QType::f32) {
                __m512 col32[32];
                load_columns_32<T>(g_rows, stride, n, kChains * (s0 + s), col32);
#pragma GCC unroll 32
                for (uint64_t g = 0; g < kChains; ++g)
                    _mm512_store_ps(panel + (gi * kGroupStride + panel_start(b, g) + s) * kLanes,
                                    col32[g]);
            } else
                for (uint64_t half = 0; half < 2; ++half) {
                    load_columns<T>(g_rows, stride, n, kChains * (s0 + s) + 16 * half, 16, col);
#pragma GCC unroll 16
                    for (uint64_t c = 0; c < 16; ++c) {
                        const uint64_t g = 16 * half + c;
                        _mm512_store_ps(
                            panel + (gi * kGroupStride + panel_start(b, g) + s) * kLanes, col[c]);
                    }
                }
        for (uint64_t e = 0; e < b.eights; ++e) {
            load_columns<T>(g_rows, stride, n, e0 + 8 * e, 8, col);
            for (uint64_t g = 0; g < 8; ++g)
                _mm512_store_ps(
                    panel + (gi * kGroupStride + panel_start(b, g) + b.steps + e) * kLanes, col[g]);
        }
    }
}

// The last k mod 8 weights (`tails`, from element j) of the tile's row groups: element j + e of
// group gi at tail[(e * groups + gi) * 16].
template <QType T>
QF_AVX512 void pack_tail(const uint8_t* w, uint64_t stride, uint64_t rows, uint64_t groups,
                         uint64_t j, uint64_t tails, float* tail) {
    __m512 col[16];
    for (uint64_t gi = 0; gi < groups; ++gi) {
        load_columns<T>(w + gi * kLanes * stride, stride,
                        std::min<uint64_t>(kLanes, rows - gi * kLanes), j, tails, col);
        for (uint64_t e = 0; e < tails; ++e)
            _mm512_store_ps(tail + (e * groups + gi) * kLanes, col[e]);
    }
}

// One token's block of k (32-steps [s0, s0 + b.steps) of x, then b.eights 8-blocks at element
// 32 steps) in chain-major order: position p of chain g at at[b.start(g) + p]. 16 steps at a
// time as a 16 x 16 transpose per half step.
QF_AVX512 inline void pack_token(const float* x, uint64_t steps, uint64_t s0, const Block& b,
                                 float* at) {
    uint64_t s = 0;
    for (; s + 16 <= b.steps; s += 16)
        for (uint64_t half = 0; half < 2; ++half) {
            __m512 v[16];
            for (uint64_t i = 0; i < 16; ++i)
                v[i] = _mm512_loadu_ps(x + kChains * (s0 + s + i) + 16 * half);
            transpose16(v);
            for (uint64_t c = 0; c < 16; ++c)
                _mm512_storeu_ps(at + b.start(16 * half + c) + s, v[c]);
        }
    for (; s < b.steps; ++s)
        for (uint64_t g = 0; g < kChains; ++g) at[b.start(g) + s] = x[kChains * (s0 + s) + g];
    for (uint64_t e = 0; e < b.eights; ++e)
        for (uint64_t g = 0; g < 8; ++g)
            at[b.start(g) + b.steps + e] = x[kChains * steps + 8 * e + g];
}

// One register tile over one block: row groups [0, G) of the panel (kGroupStride positions
// apart) against tokens [0, T) (packed, xld floats apart, at the block's start), every chain;
// partial sums at part[tok * pld + (group * 32 + g) * 16].
struct Tile {
    const float* panel;
    const float* x;
    uint64_t xld;
    Block b;
    float* part;
    uint64_t pld;
    bool first;  // the partial sums start at zero (the call's first block of k)
};

template <int G, int T>
QF_AVX512 void tile_product(const Tile& t) {
    for (uint64_t g = 0; g < kChains; ++g) {
        const uint64_t start = t.b.start(g), n = t.b.length(g);
        float* part = t.part + g * kLanes;
        __m512 acc[G][T];
#pragma GCC unroll 8
        for (int i = 0; i < G; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < T; ++j)
                acc[i][j] = t.first ? _mm512_setzero_ps()
                                    : _mm512_load_ps(part + j * t.pld + i * kChains * kLanes);
        const float* w = t.panel + panel_start(t.b, g) * kLanes;
        const float* x = t.x + start;
        for (uint64_t p = 0; p < n; ++p) {
            __m512 wv[G];
#pragma GCC unroll 8
            for (int i = 0; i < G; ++i) wv[i] = _mm512_load_ps(w + (i * kGroupStride + p) * kLanes);
#pragma GCC unroll 8
            for (int j = 0; j < T; ++j) {
                const __m512 xv = _mm512_set1_ps(x[j * t.xld + p]);
#pragma GCC unroll 8
                for (int i = 0; i < G; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < G; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < T; ++j)
                _mm512_store_ps(part + j * t.pld + i * kChains * kLanes, acc[i][j]);
    }
}

template <size_t... I>
constexpr auto tile_table(std::index_sequence<I...>) {
    return std::array<void (*)(const Tile&), sizeof...(I)>{
        &tile_product<static_cast<int>(I) / kTokens + 1, static_cast<int>(I) % kTokens + 1>...};
}

// dot_row's finish for 16 rows of one token: c[g] the 32 chain sums (lane = row), then the last
// k mod 8 products (tail[e]: element k / 8 * 8 + e of the 16 rows) added one by one.
QF_AVX512 inline __m512 finish(const float* c, const float* tail, uint64_t groups, const float* x,
                               uint64_t tails) {
    __m512 s[8];
    for (int l = 0; l < 8; ++l)
        s[l] = _mm512_add_ps(
            _mm512_add_ps(_mm512_load_ps(c + l * kLanes), _mm512_load_ps(c + (8 + l) * kLanes)),
            _mm512_add_ps(_mm512_load_ps(c + (16 + l) * kLanes),
                          _mm512_load_ps(c + (24 + l) * kLanes)));
    __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[4]), _mm512_add_ps(s[2], s[6])),
                               _mm512_add_ps(_mm512_add_ps(s[1], s[5]), _mm512_add_ps(s[3], s[7])));
    for (uint64_t e = 0; e < tails; ++e)
        sum = _mm512_add_ps(
            sum, _mm512_mul_ps(_mm512_load_ps(tail + e * groups * kLanes), _mm512_set1_ps(x[e])));
    return sum;
}

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
// A packed token: the blocks' positions (block bi at kChains * kBlockSteps * bi), then the last
// k mod 8 floats as they are, then padding (so tokens are not a multiple of the L1 set stride
// apart).
inline uint64_t token_ld(uint64_t k) { return (k + 15) / 16 * 16 + 16; }

QF_AVX512 void pack_tokens(const float* x, uint64_t ldx, uint64_t k, uint64_t n, float* packed) {
    const uint64_t steps = k / kChains, body = k / 8 * 8, blocks = block_count(k);
    for (uint64_t tok = 0; tok < n; ++tok) {
        const float* src = x + tok * ldx;
        float* dst = packed + tok * token_ld(k);
        for (uint64_t bi = 0; bi < blocks; ++bi)
            pack_token(src, steps, bi * kBlockSteps, block_at(k, bi),
                       dst + kChains * bi * kBlockSteps);
        std::memcpy(dst + body, src + body, 4 * (k - body));
    }
}

QF_AVX512 void gemm(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                    const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                    uint64_t ldo) {
    static constexpr auto table = tile_table(std::make_index_sequence<kGroups * kTokens>());
    constexpr uint64_t tile_rows = kGroups * kLanes;
    const uint64_t steps = k / kChains, body = k / 8 * 8, tails = k - body, m = t1 - t0;
    const auto pack = t == QType::f32   ? pack_weights<QType::f32>
                      : t == QType::f16 ? pack_weights<QType::f16>
                                        : pack_weights<QType::bf16>;
    const auto pack_t = t == QType::f32   ? pack_tail<QType::f32>
                        : t == QType::f16 ? pack_tail<QType::f16>
                                          : pack_tail<QType::bf16>;
    const uint64_t blocks = block_count(k);
    thread_local std::vector<float> panel_buf, tail_buf, part_buf;
    float* panel = aligned_floats(panel_buf, kGroups * kGroupStride * kLanes);
    float* tail = aligned_floats(tail_buf, 8 * tile_rows);
    const uint64_t pld = kGroups * kChains * kLanes;  // a token's partial sums
    // Partial sums per token between blocks of k; with one block only per token tile (reused, so
    // they stay in L1 instead of streaming the whole call's through L2).
    float* part =
        aligned_floats(part_buf, (blocks == 1 ? std::min<uint64_t>(m, kTokens) : m) * pld);
    const uint64_t xld = token_ld(k);
    const float* xs = packed + t0 * xld;
    const uint64_t token_tiles = (m + kTokens - 1) / kTokens;
    for (uint64_t rb = r0; rb < r1; rb += tile_rows) {
        const uint64_t rows = std::min(r1, rb + tile_rows) - rb;
        const uint64_t groups = (rows + kLanes - 1) / kLanes;
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
                            const __m512 sum =
                                finish(tile.part + (tok - tb) * pld + gi * kChains * kLanes,
                                       tail + gi * kLanes, groups, xs + tok * xld + body, tails);
                            const uint64_t r = rb + gi * kLanes,
                                           n = std::min<uint64_t>(kLanes, r1 - r);
                            _mm512_mask_storeu_ps(out + tok * ldo + (r - r0),
                                                  static_cast<__mmask16>((1u << n) - 1), sum);
                        }
            }
        }
    }
}

}  // namespace
#endif

uint64_t tokens_ld_avx512(uint64_t k) {
#if defined(__x86_64__)
    return token_ld(k);
#else
    return k;
#endif
}

void pack_tokens_avx512(const float* x, uint64_t ldx, uint64_t k, uint64_t n, float* packed) {
#if defined(__x86_64__)
    pack_tokens(x, ldx, k, n, packed);
#else
    (void)x, (void)ldx, (void)k, (void)n, (void)packed;
#endif
}

void float_gemm_avx512(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                       const float* packed, uint64_t k, uint64_t t0, uint64_t t1, float* out,
                       uint64_t ldo) {
#if defined(__x86_64__)
    gemm(t, w, stride, r0, r1, packed, k, t0, t1, out, ldo);
#else
    (void)t, (void)w, (void)stride, (void)r0, (void)r1, (void)packed, (void)k, (void)t0, (void)t1,
        (void)out, (void)ldo;
#endif
}

}  // namespace qforge::detail
