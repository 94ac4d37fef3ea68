// The bf16 products of kernels/cpu/bf16_gemm.hpp on AMX tiles (tdpbf16ps).
//
// Operands. B, the rows: a packed tile's pairs [16s, 16s + 16) are a 16 x 64-byte B operand as
// they lie (row p of the operand: pair p of the 16 rows, lane l row l), and Bf16PackedRows rounds
// every tile up to whole steps with zero pairs. A, the tokens: 16 tokens' pairs of a step, one
// token a row; they are copied once per call into a panel of 32-token groups, each token's pairs
// contiguous and zero past k (and zero rows past the last token), so a step's A operand is 16
// rows of 64 bytes `stride` apart. Where the tokens already lie that way (Bf16Tokens whose k is a
// multiple of 32; the packed rows' row-major copy), whole groups are read in place.
//
// Register tiles: C0..C3 (f32 sums of 16 tokens x 16 rows): tokens 0-15 and 16-31 of a group
// against two row tiles; A0, A1 the group's two halves, B0, B1 the two row tiles. Per step 4
// loads and 4 tdpbf16ps (or, for short k, each half on its own with two sets of operand tiles:
// group_product). Row-tile pairs are the outer loop (their 2 x 16 steps x 1 KiB stay in L2 while
// every token group passes), token groups the inner one. Every C starts at zero and takes the
// steps in order, so an output's operations depend on k alone.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/alloc.hpp"
#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/bf16_gemm_amx.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_AMX __attribute__((target("amx-tile,amx-bf16,avx2,avx512f")))
#endif

namespace qforge::detail {

#if defined(__x86_64__)
namespace {

constexpr uint64_t kTile = 16;       // rows of a C, A or B operand; tokens and rows per tile
constexpr uint64_t kStepBytes = 64;  // one operand row: 16 pairs of bf16
constexpr uint64_t kGroup = 32;      // tokens per group: two A operands
constexpr uint64_t kHalfSteps = 24;  // group_product: halves up to this many steps

// C (0-3) and A (4, 5) tiles of m rows (m < 16: one token group smaller than a tile), B (6, 7)
// of 16; every tile 64 bytes a row. (With m = 16 every tile is 16 x 64 bytes, so half_product
// may use 1 and 3 as B operands.)
QF_AMX void configure(uint64_t m) {
    AmxTileConfig c;
    for (int i = 0; i < 8; ++i) {
        c.colsb[i] = kStepBytes;
        c.rows[i] = static_cast<uint8_t>(i < 6 ? m : kTile);
    }
    amx_load_config(c);
}

// Where a C tile goes: straight into the output (`ld` bytes a row) or into a 16 x 16 buffer.
struct Dest {
    float* at;
    uint64_t ld;
};

// One 16-token half (A at `a`) against row tiles b0 and b1: C0 and C2 only, the A and B operands
// of odd steps in a second set of tiles (4, 6, 7 and 5, 1, 3), so that one step's loads need not
// wait for the tile products still reading the step before's (the tiles are not renamed).
QF_AMX void half_product(const uint8_t* a, uint64_t a_stride, const uint8_t* b0, const uint8_t* b1,
                         uint64_t steps, const Dest& c0, const Dest& c2) {
    _tile_zero(0);
    _tile_zero(2);
    uint64_t s = 0;
    for (; s + 1 < steps; s += 2) {
        _tile_loadd(4, a + s * kStepBytes, a_stride);
        _tile_loadd(6, b0 + s * kTile * kStepBytes, kStepBytes);
        _tile_loadd(7, b1 + s * kTile * kStepBytes, kStepBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, a + (s + 1) * kStepBytes, a_stride);
        _tile_loadd(1, b0 + (s + 1) * kTile * kStepBytes, kStepBytes);
        _tile_loadd(3, b1 + (s + 1) * kTile * kStepBytes, kStepBytes);
        _tile_dpbf16ps(0, 5, 1);
        _tile_dpbf16ps(2, 5, 3);
    }
    if (s < steps) {
        _tile_loadd(4, a + s * kStepBytes, a_stride);
        _tile_loadd(6, b0 + s * kTile * kStepBytes, kStepBytes);
        _tile_loadd(7, b1 + s * kTile * kStepBytes, kStepBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 4, 7);
    }
    _tile_stored(0, c0.at, c0.ld);
    _tile_stored(2, c2.at, c2.ld);
}

// One group of 32 tokens (A at `a`, the second half 16 rows further) against row tiles b0 and b1
// (b1 may repeat b0 when the row tiles are odd): C 2h + u (tokens 16u.., row tile h) to d[2h + u].
// Up to kHalfSteps steps (k <= 768) each half of the group takes its own pass with two sets of
// operand tiles (half_product), re-reading the row pair's B operands (2 x steps KiB, within L1).
// Longer, the four C tiles of the group take one pass, each operand loaded just before its first
// product. One core of the Xeon, 512 tokens, GFLOP/s four-C vs halves: 1536 x 576 899 / 1021,
// 576 x 576 942 / 1121, 2048 x 768 696 / 810; 576 x 1536 1043 / 982, 1536 x 1536 1008 / 963
// (k = 2048: 736 / 823, 2048 x 5632 731 / 746: there the halves win again, the tokens' panel
// spilling L2; not chosen by a rule yet). The chain of every C is the steps in order: the same
// bits either way.
QF_AMX void group_product(const uint8_t* a, uint64_t a_stride, const uint8_t* b0, const uint8_t* b1,
                          uint64_t steps, const Dest (&d)[4]) {
    if (steps <= kHalfSteps) {
        half_product(a, a_stride, b0, b1, steps, d[0], d[2]);
        half_product(a + kTile * a_stride, a_stride, b0, b1, steps, d[1], d[3]);
        return;
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint8_t* a1 = a + kTile * a_stride;
    for (uint64_t s = 0; s < steps; ++s) {
        _tile_loadd(4, a + s * kStepBytes, a_stride);
        _tile_loadd(6, b0 + s * kTile * kStepBytes, kStepBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + s * kTile * kStepBytes, kStepBytes);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, a1 + s * kStepBytes, a_stride);
        _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, d[0].at, d[0].ld);
    _tile_stored(1, d[1].at, d[1].ld);
    _tile_stored(2, d[2].at, d[2].ld);
    _tile_stored(3, d[3].at, d[3].ld);
}

// Fewer than 16 tokens (decode: one): C0 and C2 of m rows from A0 against both row tiles, the
// weights (the bytes that matter when one token reads them) prefetched two steps ahead.
QF_AMX void small_group_product(const uint8_t* a, uint64_t a_stride, const uint8_t* b0,
                                const uint8_t* b1, uint64_t steps, const Dest (&d)[4]) {
    _tile_zero(0);
    _tile_zero(2);
    constexpr uint64_t kAhead = 2 * kTile * kStepBytes;
    for (uint64_t s = 0; s < steps; ++s) {
        const uint8_t* p0 = b0 + s * kTile * kStepBytes;
        const uint8_t* p1 = b1 + s * kTile * kStepBytes;
        if (s + 2 < steps)
            for (uint64_t l = 0; l < kTile * kStepBytes; l += 64) {
                _mm_prefetch(reinterpret_cast<const char*>(p0 + kAhead + l), _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(p1 + kAhead + l), _MM_HINT_T0);
            }
        _tile_loadd(4, a + s * kStepBytes, a_stride);
        _tile_loadd(6, p0, kStepBytes);
        _tile_loadd(7, p1, kStepBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 4, 7);
    }
    _tile_stored(0, d[0].at, d[0].ld);
    _tile_stored(2, d[2].at, d[2].ld);
}

QF_AMX void release() { _tile_release(); }

}  // namespace

void bf16_product_amx(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, uint64_t t0, uint64_t t1,
                      const AmxTokens& tokens, float* out, uint64_t ldo) {
    const uint64_t np = w.pairs(), steps = (np + kTile - 1) / kTile;
    const uint64_t n = t1 - t0, groups = (n + kGroup - 1) / kGroup;
    // Group g's A operand: in place where it can be, else copied into the panel.
    const bool whole_steps = tokens.rows && tokens.stride % kTile == 0;
    auto in_place = [&](uint64_t g) { return whole_steps && (g + 1) * kGroup <= n; };
    // The panel holds the copied groups: every group, or (whole steps) only a last partial one.
    const uint64_t stride = steps * kStepBytes;  // one token's pairs in the panel
    auto slot = [&](uint64_t g) { return whole_steps ? 0 : g; };
    const uint64_t needed = (whole_steps ? 1 : groups) * kGroup * stride;
    thread_local AlignedBytes panel;
    thread_local uint64_t panel_bytes = 0;
    if (panel_bytes < needed) {
        panel_bytes = needed;
        panel = stream_buffer(panel_bytes, "AMX token panel");
    }
    for (uint64_t g = 0; g < groups; ++g) {
        if (in_place(g)) continue;
        uint8_t* a = panel.get() + slot(g) * kGroup * stride;
        std::memset(a, 0, kGroup * stride);
        for (uint64_t t = g * kGroup; t < std::min(n, (g + 1) * kGroup); ++t) {
            auto* dst = reinterpret_cast<uint32_t*>(a + (t - g * kGroup) * stride);
            if (tokens.rows)
                std::memcpy(dst, tokens.rows + (t0 + t) * tokens.stride, np * 4);
            else
                tokens.copy(t0 + t, dst);
        }
    }
    auto operand = [&](uint64_t g) -> std::pair<const uint8_t*, uint64_t> {
        if (in_place(g))
            return {
                reinterpret_cast<const uint8_t*>(tokens.rows + (t0 + g * kGroup) * tokens.stride),
                tokens.stride * 4};
        return {panel.get() + slot(g) * kGroup * stride, stride};
    };

    alignas(64) float c[4][kTile][kTile];  // the C tiles that do not fit the output whole
    configure(std::min(n, kTile));
    const uint64_t first = r0 / kTile, last = (r1 - 1) / kTile;
    for (uint64_t j = first; j <= last; j += 2) {
        const bool pair = j + 1 <= last;
        const uint8_t* b0 = w.tile(j);
        const uint8_t* b1 = pair ? w.tile(j + 1) : b0;
        for (uint64_t g = 0; g < groups; ++g) {
            // C 2h + u: tokens g * 32 + 16u .. against the rows of tile j + h. A tile within the
            // tokens and rows asked for goes to the output; one that is not to c, copied below.
            Dest d[4];
            bool whole[4];
            for (uint64_t h = 0; h < 2; ++h)
                for (uint64_t u = 0; u < 2; ++u) {
                    const uint64_t i = 2 * h + u, t = g * kGroup + u * kTile;
                    const uint64_t row0 = (j + h) * kTile;
                    whole[i] =
                        (h == 0 || pair) && t + kTile <= n && row0 >= r0 && row0 + kTile <= r1;
                    d[i] = whole[i] ? Dest{out + t * ldo + (row0 - r0), ldo * sizeof(float)}
                                    : Dest{&c[i][0][0], kTile * sizeof(float)};
                }
            const auto [a, a_stride] = operand(g);
            if (n < kTile)
                small_group_product(a, a_stride, b0, b1, steps, d);
            else
                group_product(a, a_stride, b0, b1, steps, d);
            for (uint64_t h = 0; h < (pair ? 2u : 1u); ++h) {
                const uint64_t row0 = (j + h) * kTile;
                const uint64_t lo = std::max(row0, r0), hi = std::min(row0 + kTile, r1);
                for (uint64_t u = 0; u < 2; ++u) {
                    if (whole[2 * h + u]) continue;
                    for (uint64_t i = 0; i < kTile; ++i) {
                        const uint64_t t = g * kGroup + u * kTile + i;
                        if (t >= n) break;
                        std::copy(&c[2 * h + u][i][lo - row0], &c[2 * h + u][i][hi - row0],
                                  out + t * ldo + (lo - r0));
                    }
                }
            }
        }
    }
    release();
}

#endif

}  // namespace qforge::detail
