// The bf16-activation mode of kernels/cpu/bf16_gemm.hpp: packing, the activations' rounding and
// the AVX-512 BF16 kernel.
//
// Register tile: G tiles of 16 rows (G <= 3) x NT tokens (NT <= 8), one accumulator per (tile,
// token): per pair, G vector loads, NT broadcast pairs and G x NT vdpbf16ps. Pairs go in blocks
// of kBlockPairs; between blocks each accumulator waits, as the f32 value it is, in a small
// buffer (storing an f32 and loading it back changes no bit), so a row triple's block of weights
// (3 x 1024 x 64 bytes) stays in L2 while every token tile passes over it.
#include "kernels/cpu/bf16_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/isa.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_AVX512_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace qforge {

namespace {

constexpr uint64_t kLanes = 16;
constexpr uint64_t kPairBytes = 64;     // one pair of 16 rows
constexpr uint64_t kBlockPairs = 1024;  // pairs per block of k
constexpr int kMaxGroups = 3;           // tiles per register tile
constexpr int kMaxTokens = 8;           // tokens per register tile

}  // namespace

bool bf16_dot_available() { return cpu_isa() >= Isa::avx512 && cpu_has_avx512_bf16(); }

Bf16PackedRows::Bf16PackedRows(uint64_t rows, uint64_t k) : rows_(rows), k_(k) {
    if (rows == 0 || k == 0)
        throw Error("bf16 packed rows: " + std::to_string(rows) + " rows of " + std::to_string(k) +
                    " weights: nothing to pack");
    data_ = stream_buffer(tiles() * tile_bytes(), "bf16 packed rows");
}

void Bf16PackedRows::pack(const uint8_t* w, uint64_t stride, uint64_t tile0, uint64_t tile1) {
    const uint64_t np = pairs();
    for (uint64_t tile = tile0; tile < tile1; ++tile) {
        uint8_t* out = data_.get() + tile * tile_bytes();
        std::memset(out, 0, tile_bytes());
        for (uint64_t l = 0; l < kLanes && tile * kLanes + l < rows_; ++l) {
            const uint8_t* row = w + (tile * kLanes + l) * stride;
            for (uint64_t p = 0; p < np; ++p)
                std::memcpy(out + p * kPairBytes + 4 * l, row + 4 * p,
                            2 * p + 1 < k_ ? 4 : 2);  // a last odd weight pairs with zero
        }
    }
}

void Bf16Tokens::prepare(const float* x, uint64_t n, uint64_t k) {
    n_ = n;
    k_ = k;
    const uint64_t np = (k + 1) / 2;
    p_.assign(n * np, 0);
    for (uint64_t t = 0; t < n; ++t)
        for (uint64_t i = 0; i < k; ++i)
            p_[t * np + i / 2] |= static_cast<uint32_t>(f32_to_bf16(x[t * k + i]))
                                  << (16 * (i % 2));
}

#if defined(__x86_64__)
namespace {

// Pairs [p0, p0 + np) of tiles `tile` (G of them) against tokens x[0..NT): acc[g][t] in and out.
template <int G, int NT>
QF_AVX512_BF16 void tile_block(const uint8_t* const (&tile)[kMaxGroups], uint64_t p0, uint64_t np,
                               const uint32_t* const (&x)[kMaxTokens], __m512 (&acc)[G][NT]) {
    for (uint64_t p = p0; p < p0 + np; ++p) {
        __m512bh w[G];
        for (int g = 0; g < G; ++g)
            w[g] = reinterpret_cast<__m512bh>(
                _mm512_load_si512(reinterpret_cast<const __m512i*>(tile[g] + p * kPairBytes)));
        for (int t = 0; t < NT; ++t) {
            const __m512bh xp =
                reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[t][p])));
            for (int g = 0; g < G; ++g) acc[g][t] = _mm512_dpbf16_ps(acc[g][t], w[g], xp);
        }
    }
}

// Tokens [t0, t0 + NT) against the G tiles over pairs [p0, p0 + np), the accumulators from and
// back to sums[t][g] (zeros when first).
template <int G, int NT>
QF_AVX512_BF16 void token_tile(const uint8_t* const (&tile)[kMaxGroups], uint64_t p0, uint64_t np,
                               const Bf16Tokens& xs, uint64_t t0, bool first, __m512* sums) {
    __m512 acc[G][NT];
    const uint32_t* x[kMaxTokens] = {};
    for (int t = 0; t < NT; ++t) {
        x[t] = xs.pairs(t0 + static_cast<uint64_t>(t));
        for (int g = 0; g < G; ++g)
            acc[g][t] = first ? _mm512_setzero_ps() : _mm512_load_ps(&sums[t * kMaxGroups + g]);
    }
    tile_block<G, NT>(tile, p0, np, x, acc);
    for (int t = 0; t < NT; ++t)
        for (int g = 0; g < G; ++g) _mm512_store_ps(&sums[t * kMaxGroups + g], acc[g][t]);
}

template <int G, int NT>
QF_AVX512_BF16 void token_tile_dispatch(const uint8_t* const (&tile)[kMaxGroups], uint64_t p0,
                                        uint64_t np, const Bf16Tokens& xs, uint64_t t0, int nt,
                                        bool first, __m512* sums) {
    if constexpr (NT > 1)
        if (nt < NT) return token_tile_dispatch<G, NT - 1>(tile, p0, np, xs, t0, nt, first, sums);
    token_tile<G, NT>(tile, p0, np, xs, t0, first, sums);
}

template <int G>
QF_AVX512_BF16 void groups_product(const Bf16PackedRows& w, uint64_t tile0, uint64_t r0,
                                   uint64_t r1, const Bf16Tokens& xs, uint64_t t0, uint64_t t1,
                                   float* out, uint64_t ldo) {
    const uint64_t n = t1 - t0, np = w.pairs();
    const uint8_t* tile[kMaxGroups] = {};
    for (int g = 0; g < G; ++g) tile[g] = w.tile(tile0 + static_cast<uint64_t>(g));
    struct alignas(64) Lanes {
        float v[kLanes];
    };
    thread_local std::vector<Lanes> buffer;
    if (buffer.size() < n * kMaxGroups) buffer.resize(n * kMaxGroups);
    auto* sums = reinterpret_cast<__m512*>(buffer.data());
    for (uint64_t p0 = 0; p0 < np; p0 += kBlockPairs) {
        const uint64_t nb = std::min(kBlockPairs, np - p0);
        for (uint64_t t = 0; t < n; t += kMaxTokens) {
            const int nt = static_cast<int>(std::min<uint64_t>(kMaxTokens, n - t));
            token_tile_dispatch<G, kMaxTokens>(tile, p0, nb, xs, t0 + t, nt, p0 == 0,
                                               sums + t * kMaxGroups);
        }
    }
    // Lane l of tile g is row 16 (tile0 + g) + l: the rows of [r0, r1) among them.
    for (int g = 0; g < G; ++g) {
        const uint64_t first = (tile0 + static_cast<uint64_t>(g)) * kLanes;
        const uint64_t lo = std::max(first, r0) - first, hi = std::min(r1 - first, kLanes);
        for (uint64_t t = 0; t < n; ++t) {
            alignas(64) float lanes[kLanes];
            _mm512_store_ps(lanes, sums[t * kMaxGroups + static_cast<uint64_t>(g)]);
            std::copy(lanes + lo, lanes + hi, out + t * ldo + (first + lo - r0));
        }
    }
}

void bf16_matmul_avx512(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, const Bf16Tokens& xs,
                        uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const uint64_t last = (r1 - 1) / kLanes;
    for (uint64_t tile0 = r0 / kLanes; tile0 <= last; tile0 += kMaxGroups) {
        const uint64_t g = std::min<uint64_t>(kMaxGroups, last + 1 - tile0);
        if (g == 3)
            groups_product<3>(w, tile0, r0, r1, xs, t0, t1, out, ldo);
        else if (g == 2)
            groups_product<2>(w, tile0, r0, r1, xs, t0, t1, out, ldo);
        else
            groups_product<1>(w, tile0, r0, r1, xs, t0, t1, out, ldo);
    }
}

}  // namespace
#endif

void bf16_matmul(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, const Bf16Tokens& x,
                 uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    if (!bf16_dot_available())
        throw Error("bf16 activations need the avx512 level and AVX-512 BF16; this process runs " +
                    cpu_isa_description());
    if (x.k() != w.k() || r1 > w.rows() || t1 > x.tokens())
        throw Error("bf16_matmul: rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                    ") and tokens up to " + std::to_string(t1) + " of k = " +
                    std::to_string(x.k()) + " asked of " + std::to_string(w.rows()) + " rows of " +
                    std::to_string(w.k()) + " and " + std::to_string(x.tokens()) + " tokens");
    if (r0 >= r1 || t0 >= t1) return;
#if defined(__x86_64__)
    bf16_matmul_avx512(w, r0, r1, x, t0, t1, out, ldo);
#endif
}

}  // namespace qforge
