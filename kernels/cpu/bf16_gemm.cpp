// The bf16-activation mode of kernels/cpu/bf16_gemm.hpp: packing, the activations' rounding and
// the AVX-512 BF16 kernel (the AMX one: bf16_gemm_amx.cpp).
//
// Register tile: G tiles of 16 rows (G <= 3) x NT tokens (NT <= 8), one accumulator per (tile,
// token): per pair, G vector loads, NT broadcast pairs and G x NT vdpbf16ps. Pairs go in blocks
// of kBlockPairs; between blocks each accumulator waits, as the f32 value it is, in a small
// buffer (storing an f32 and loading it back changes no bit), so a row triple's block of weights
// (3 x 1024 x 64 bytes) stays in L2 while every token tile passes over it.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's masked AVX-512 intrinsics self-initialise their "undefined" operands, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/cpu/bf16_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/bf16_gemm_amx.hpp"
#include "kernels/cpu/isa.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_AVX512_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")))
#define QF_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
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

Bf16Kernel bf16_kernel() { return cpu_uses_amx_bf16() ? Bf16Kernel::amx : Bf16Kernel::avx512; }

std::vector<Bf16Kernel> bf16_kernels() {
    std::vector<Bf16Kernel> v{Bf16Kernel::avx512};
    if (cpu_uses_amx_bf16()) v.push_back(Bf16Kernel::amx);
    return v;
}

#if defined(__x86_64__)
namespace {

// f32_to_bf16 on 16 lanes, in integer steps (the bits of core/half.hpp's definition; vcvtneps2bf16
// would flush denormals instead): the low 16 bits of each lane.
QF_AVX512 __m512i bf16_lanes(__m512 v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i bias =
        _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
    return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}

QF_AVX512 void f32_to_bf16_avx512(const float* x, uint64_t n, uint16_t* out) {
    for (uint64_t i = 0; i < n; i += kLanes) {
        const auto m = static_cast<__mmask16>(n - i >= kLanes ? 0xffffu : (1u << (n - i)) - 1);
        const __m512i b = bf16_lanes(_mm512_maskz_loadu_ps(m, x + i));
        _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(b));
    }
}

// r[c] = column c of the 16 x 16 dwords r (unpacks within 128-bit blocks, then block shuffles).
QF_AVX512 void transpose16(__m512i (&r)[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // r[4i + e], block b: column 4b + e of rows 4i .. 4i + 3
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) {
            t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
    }
}

// Tile `tile` of rows `rows` (lanes past it zero) from the columns of x [k][ld]: pair p, lane l
// holds columns 16 tile + l of x's rows 2p (low half) and 2p + 1 (high half; zero past k). With
// `row_major`, also row c's pairs at row_major + c * row_stride: each 16 pairs transposed, so
// the copy's last step is written whole (zero pairs past k).
// Pairs [pb, pe) only (pb a multiple of 16).
QF_AVX512 void pack_columns_avx512(const float* x, uint64_t ld, uint64_t rows, uint64_t k,
                                   uint64_t tile, uint64_t pb, uint64_t pe, uint8_t* out,
                                   uint32_t* row_major, uint64_t row_stride) {
    const uint64_t c0 = tile * kLanes, np = (k + 1) / 2, lanes = std::min(kLanes, rows - c0);
    const auto m = static_cast<__mmask16>(lanes == kLanes ? 0xffffu : (1u << lanes) - 1);
    for (uint64_t p0 = pb; p0 < pe; p0 += kLanes) {
        __m512i v[kLanes];
        for (uint64_t q = 0; q < kLanes; ++q) {
            const uint64_t p = p0 + q;
            if (p >= np) {
                v[q] = _mm512_setzero_si512();
                continue;
            }
            const __m512i lo = bf16_lanes(_mm512_maskz_loadu_ps(m, x + 2 * p * ld + c0));
            const __m512i hi = 2 * p + 1 < k
                                   ? bf16_lanes(_mm512_maskz_loadu_ps(m, x + (2 * p + 1) * ld + c0))
                                   : _mm512_setzero_si512();
            v[q] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                                   _mm512_slli_epi32(hi, 16));
            _mm512_store_si512(reinterpret_cast<__m512i*>(out + p * kPairBytes), v[q]);
        }
        if (!row_major) continue;
        transpose16(v);
        for (uint64_t l = 0; l < lanes; ++l)
            _mm512_storeu_si512(row_major + (c0 + l) * row_stride + p0, v[l]);
    }
}

}  // namespace
#endif

void f32_to_bf16_array(const float* x, uint64_t n, uint16_t* out, Isa isa) {
#if defined(__x86_64__)
    if (isa >= Isa::avx512) {
        f32_to_bf16_avx512(x, n, out);
        return;
    }
#endif
    for (uint64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

Bf16PackedRows::Bf16PackedRows(uint64_t rows, uint64_t k, bool row_major_copy) {
    reshape(rows, k, row_major_copy);
}

void Bf16PackedRows::reshape(uint64_t rows, uint64_t k, bool row_major_copy) {
    if (rows == 0 || k == 0)
        throw Error("bf16 packed rows: " + std::to_string(rows) + " rows of " + std::to_string(k) +
                    " weights: nothing to pack");
    // The new shape's sizes, then any larger buffers, before anything is changed: a failed
    // allocation leaves the object as it was (its shape still describing its buffers).
    const uint64_t tile_bytes = tile_bytes_of(k);
    const uint64_t data_bytes = (rows + 15) / 16 * tile_bytes;
    const uint64_t rows_bytes = row_major_copy ? rows * (tile_bytes / 64) * 4 : 0;
    AlignedBytes data, rows_data;
    if (data_bytes_ < data_bytes) data = stream_buffer(data_bytes, "bf16 packed rows");
    if (rows_data_bytes_ < rows_bytes) rows_data = stream_buffer(rows_bytes, "bf16 row-major rows");
    if (data) {
        data_ = std::move(data);
        data_bytes_ = data_bytes;
    }
    rows_ = rows;
    k_ = k;
    if (!row_major_copy) {
        rows_data_.reset();
        rows_data_bytes_ = 0;
        return;
    }
    if (rows_data) {
        rows_data_ = std::move(rows_data);
        rows_data_bytes_ = rows_bytes;
    }
    std::memset(rows_data_.get(), 0, rows_bytes);
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

void Bf16PackedRows::pack_f32(const float* w, uint64_t ld, uint64_t tile0, uint64_t tile1) {
    std::vector<uint16_t> row(k_);
    for (uint64_t tile = tile0; tile < tile1; ++tile) {
        uint8_t* out = data_.get() + tile * tile_bytes();
        std::memset(out, 0, tile_bytes());
        for (uint64_t l = 0; l < kLanes && tile * kLanes + l < rows_; ++l) {
            f32_to_bf16_array(w + (tile * kLanes + l) * ld, k_, row.data());
            for (uint64_t p = 0; p < pairs(); ++p)
                std::memcpy(out + p * kPairBytes + 4 * l, row.data() + 2 * p,
                            2 * p + 1 < k_ ? 4 : 2);
        }
    }
}

void Bf16PackedRows::pack_columns(const float* x, uint64_t ld, uint64_t tile0, uint64_t tile1,
                                  Isa isa) {
#if defined(__x86_64__)
    if (isa >= Isa::avx512) {
        // Runs of 16 pairs (32 rows of x) across every tile, the next run's rows prefetched
        // meanwhile: a tile's 16 columns of every row are one line of each of many rows, which
        // the hardware prefetchers do not fetch ahead (tile by tile over 1024 rows: 2.8 GB/s
        // read on one core of the Xeon; so: 5.2).
        constexpr uint64_t kRun = 16;
        auto* row_major = reinterpret_cast<uint32_t*>(rows_data_.get());
        const uint64_t c0 = tile0 * kLanes, c1 = std::min(rows_, tile1 * kLanes);
        for (uint64_t pb = 0; pb < pairs(); pb += kRun) {
            for (uint64_t r = 2 * (pb + kRun); r < std::min(k_, 2 * (pb + 2 * kRun)); ++r)
                for (uint64_t c = c0; c < c1; c += 16)
                    _mm_prefetch(reinterpret_cast<const char*>(x + r * ld + c), _MM_HINT_T0);
            for (uint64_t tile = tile0; tile < tile1; ++tile)
                pack_columns_avx512(x, ld, rows_, k_, tile, pb, std::min(pairs(), pb + kRun),
                                    data_.get() + tile * tile_bytes(), row_major, row_stride());
        }
        for (uint64_t tile = tile0; tile < tile1; ++tile)
            std::memset(data_.get() + tile * tile_bytes() + pairs() * kPairBytes, 0,
                        tile_bytes() - pairs() * kPairBytes);
        return;
    }
#endif
    for (uint64_t tile = tile0; tile < tile1; ++tile) {
        uint8_t* out = data_.get() + tile * tile_bytes();
        auto* row_major = reinterpret_cast<uint32_t*>(rows_data_.get());
        std::memset(out, 0, tile_bytes());
        for (uint64_t l = 0; l < kLanes && tile * kLanes + l < rows_; ++l)
            for (uint64_t i = 0; i < k_; ++i) {
                const uint16_t b = f32_to_bf16(x[i * ld + tile * kLanes + l]);
                std::memcpy(out + (i / 2) * kPairBytes + 4 * l + 2 * (i % 2), &b, 2);
                if (row_major)
                    std::memcpy(reinterpret_cast<uint8_t*>(
                                    row_major + (tile * kLanes + l) * row_stride() + i / 2) +
                                    2 * (i % 2),
                                &b, 2);
            }
    }
}

void Bf16Tokens::resize(uint64_t n, uint64_t k) {
    p_.resize(n * ((k + 1) / 2));  // first: a failed allocation leaves the shape as it was
    n_ = n;
    k_ = k;
}

void Bf16Tokens::fill(const float* x, uint64_t t0, uint64_t t1) {
    const uint64_t np = (k_ + 1) / 2;
    for (uint64_t t = t0; t < t1; ++t) {
        auto* out = reinterpret_cast<uint16_t*>(p_.data() + t * np);  // little-endian: 2p low
        f32_to_bf16_array(x + t * k_, k_, out);
        if (k_ % 2) out[k_] = 0;  // a last odd activation pairs with zero
    }
}

void Bf16Tokens::prepare(const float* x, uint64_t n, uint64_t k) {
    resize(n, k);
    fill(x, 0, n);
}

#if defined(__x86_64__)
namespace {

// Where token t's pairs are: at tokens->pairs(t), one word apart (Bf16Tokens), or, when `rows`
// is set, row t of those packed rows: lane t % 16 of tile t / 16, kLanes words apart.
struct TokenPairs {
    const Bf16Tokens* tokens = nullptr;
    const Bf16PackedRows* rows = nullptr;
    const uint32_t* at(uint64_t t) const {
        if (rows) return reinterpret_cast<const uint32_t*>(rows->tile(t / kLanes)) + t % kLanes;
        return tokens->pairs(t);
    }
};

// Pairs [p0, p0 + np) of tiles `tile` (G of them) against tokens x[0..NT), their pairs XS words
// apart: acc[g][t] in and out.
template <int G, int NT, int XS>
QF_AVX512_BF16 void tile_block(const uint8_t* const (&tile)[kMaxGroups], uint64_t p0, uint64_t np,
                               const uint32_t* const (&x)[kMaxTokens], __m512 (&acc)[G][NT]) {
    for (uint64_t p = p0; p < p0 + np; ++p) {
        __m512bh w[G];
        for (int g = 0; g < G; ++g)
            w[g] = reinterpret_cast<__m512bh>(
                _mm512_load_si512(reinterpret_cast<const __m512i*>(tile[g] + p * kPairBytes)));
        for (int t = 0; t < NT; ++t) {
            const __m512bh xp =
                reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[t][p * XS])));
            for (int g = 0; g < G; ++g) acc[g][t] = _mm512_dpbf16_ps(acc[g][t], w[g], xp);
        }
    }
}

// Tokens [t0, t0 + NT) against the G tiles over pairs [p0, p0 + np), the accumulators from and
// back to sums[t][g] (zeros when first).
template <int G, int NT, int XS>
QF_AVX512_BF16 void token_tile(const uint8_t* const (&tile)[kMaxGroups], uint64_t p0, uint64_t np,
                               const TokenPairs& xs, uint64_t t0, bool first, __m512* sums) {
    __m512 acc[G][NT];
    const uint32_t* x[kMaxTokens] = {};
    for (int t = 0; t < NT; ++t) {
        x[t] = xs.at(t0 + static_cast<uint64_t>(t));
        for (int g = 0; g < G; ++g)
            acc[g][t] = first ? _mm512_setzero_ps() : _mm512_load_ps(&sums[t * kMaxGroups + g]);
    }
    tile_block<G, NT, XS>(tile, p0, np, x, acc);
    for (int t = 0; t < NT; ++t)
        for (int g = 0; g < G; ++g) _mm512_store_ps(&sums[t * kMaxGroups + g], acc[g][t]);
}

template <int G, int NT, int XS>
QF_AVX512_BF16 void token_tile_dispatch(const uint8_t* const (&tile)[kMaxGroups], uint64_t p0,
                                        uint64_t np, const TokenPairs& xs, uint64_t t0, int nt,
                                        bool first, __m512* sums) {
    if constexpr (NT > 1)
        if (nt < NT)
            return token_tile_dispatch<G, NT - 1, XS>(tile, p0, np, xs, t0, nt, first, sums);
    token_tile<G, NT, XS>(tile, p0, np, xs, t0, first, sums);
}

template <int G, int XS>
QF_AVX512_BF16 void groups_product(const Bf16PackedRows& w, uint64_t tile0, uint64_t r0,
                                   uint64_t r1, const TokenPairs& xs, uint64_t t0, uint64_t t1,
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
            token_tile_dispatch<G, kMaxTokens, XS>(tile, p0, nb, xs, t0 + t, nt, p0 == 0,
                                                   sums + t * kMaxGroups);
        }
    }
    // Lane l of tile g is row 16 (tile0 + g) + l: the rows of [r0, r1) among them.
    for (int g = 0; g < G; ++g) {
        const uint64_t first = (tile0 + static_cast<uint64_t>(g)) * kLanes;
        const uint64_t lo = std::max(first, r0) - first, hi = std::min(r1 - first, kLanes);
        if (lo == 0) {  // lanes [0, hi) to out from row `first` on: one masked store
            const auto m = static_cast<__mmask16>(hi == kLanes ? 0xffffu : (1u << hi) - 1);
            for (uint64_t t = 0; t < n; ++t)
                _mm512_mask_storeu_ps(out + t * ldo + (first - r0), m,
                                      sums[t * kMaxGroups + static_cast<uint64_t>(g)]);
            continue;
        }
        for (uint64_t t = 0; t < n; ++t) {
            alignas(64) float lanes[kLanes];
            _mm512_store_ps(lanes, sums[t * kMaxGroups + static_cast<uint64_t>(g)]);
            std::copy(lanes + lo, lanes + hi, out + t * ldo + (first + lo - r0));
        }
    }
}

template <int XS>
void product_avx512(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, const TokenPairs& xs,
                    uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const uint64_t last = (r1 - 1) / kLanes;
    for (uint64_t tile0 = r0 / kLanes; tile0 <= last; tile0 += kMaxGroups) {
        const uint64_t g = std::min<uint64_t>(kMaxGroups, last + 1 - tile0);
        if (g == 3)
            groups_product<3, XS>(w, tile0, r0, r1, xs, t0, t1, out, ldo);
        else if (g == 2)
            groups_product<2, XS>(w, tile0, r0, r1, xs, t0, t1, out, ldo);
        else
            groups_product<1, XS>(w, tile0, r0, r1, xs, t0, t1, out, ldo);
    }
}

}  // namespace
#endif

namespace {

void require_bf16_dot(Bf16Kernel kernel) {
    if (!bf16_dot_available())
        throw Error("bf16 activations need the avx512 level and AVX-512 BF16; this process runs " +
                    cpu_isa_description());
    if (kernel == Bf16Kernel::amx && !cpu_uses_amx_bf16())
        throw Error("bf16 products on AMX asked of a process that does not use AMX: " +
                    cpu_isa_description());
}

}  // namespace

void bf16_matmul(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, const Bf16Tokens& x,
                 uint64_t t0, uint64_t t1, float* out, uint64_t ldo, Bf16Kernel kernel) {
    require_bf16_dot(kernel);
    if (x.k() != w.k() || r1 > w.rows() || t1 > x.tokens())
        throw Error("bf16_matmul: rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                    ") and tokens up to " + std::to_string(t1) + " of k = " +
                    std::to_string(x.k()) + " asked of " + std::to_string(w.rows()) + " rows of " +
                    std::to_string(w.k()) + " and " + std::to_string(x.tokens()) + " tokens");
    if (r0 >= r1 || t0 >= t1) return;
#if defined(__x86_64__)
    if (kernel == Bf16Kernel::amx) {
        detail::bf16_product_amx(w, r0, r1, t0, t1, {x.pairs(0), w.pairs(), {}}, out, ldo);
        return;
    }
    product_avx512<1>(w, r0, r1, TokenPairs{&x, nullptr}, t0, t1, out, ldo);
#endif
}

void bf16_gram(const Bf16PackedRows& w, uint64_t r0, uint64_t r1, uint64_t t0, uint64_t t1,
               float* out, uint64_t ldo, Bf16Kernel kernel) {
    require_bf16_dot(kernel);
    if (r1 > w.rows() || t1 > w.rows())
        throw Error("bf16_gram: rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                    ") against rows [" + std::to_string(t0) + ", " + std::to_string(t1) +
                    ") asked of " + std::to_string(w.rows()) + " rows");
    if (r0 >= r1 || t0 >= t1) return;
#if defined(__x86_64__)
    if (kernel == Bf16Kernel::amx) {
        const uint64_t np = w.pairs();
        detail::AmxTokens rows{w.row_major(), w.row_stride(), {}};
        if (!rows.rows)  // row t: lane t % 16 of its tile, a pair every 64 bytes
            rows.copy = [&](uint64_t t, uint32_t* dst) {
                const auto* src =
                    reinterpret_cast<const uint32_t*>(w.tile(t / kLanes)) + t % kLanes;
                for (uint64_t p = 0; p < np; ++p) dst[p] = src[p * kLanes];
            };
        detail::bf16_product_amx(w, r0, r1, t0, t1, rows, out, ldo);
        return;
    }
    product_avx512<static_cast<int>(kLanes)>(w, r0, r1, TokenPairs{nullptr, &w}, t0, t1, out, ldo);
#endif
}

}  // namespace qforge
