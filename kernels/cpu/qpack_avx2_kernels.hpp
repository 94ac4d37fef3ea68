// The avx2 level's products on packed rows (kernels/cpu/qpack.hpp, the layout the avx512 kernels
// read): each 64-byte vector of a tile is two 32-byte halves, rows 0-7 and rows 8-15, and each
// half is multiplied with one row per 32-bit lane, so every output is the scalar reference's own
// sequence of roundings (qmatmul_scalar, int8 mode) and equals it bit for bit:
//
//   acc = 0; for each block b of 32 weights, in order:
//       isum = sum_i code_i q_i - zero * sum_i q_i           (an exact integer)
//       acc = acc + fl(fl(scale * d_b) * float(isum))
//       super-block types (q4k_g32): acc = acc - fl(min * fl(d_b * float(sum_i q_i)))
//
// A block's integer, per half and token: vector j of the block holds in lane l the 4 bytes of
// row l that meet activations 4j .. 4j + 3 (8-bit types) or, 4-bit types, 4j .. 4j + 3 in their
// low nibbles and 16 + 4j .. 19 + 4j in their high ones; each meets that activation dword
// broadcast to every lane.
//   - 4-bit codes (0..15) go into maddubs as unsigned bytes against the signed activations; each
//     int16 holds two products (at most 2 * 15 * 127 = 3810), and the eight vectors' int16 sums
//     stay below 8 * 3810 = 30480 < 2^15, so they are added as int16 and widened once (madd with
//     ones): the block's sum_i code_i q_i in each row's lane. The zero is subtracted after
//     conversion, zero * sum q with one fused multiply-add: both are integers below 2^24 (a
//     damaged zero of 255 times 32 * 127), so the float is the exact integer isum.
//   - 8-bit codes are signed: maddubs takes |w| (128 for a code of -128, which GGUF Q8_0
//     imports carry) against the activation with w's sign, at most 2 * 128 * 127 per int16, so
//     each vector is widened on its own and the eight are added as int32.
// Rows go a tile (16 rows) at a time against tiles of up to 16 tokens; per block, each half's code
// vectors are split once and serve every token of the tile (kernels/README.md, "Zen 3: 16-token
// tiles, one broadcast for both halves": against tiles of 4 they cut a 16-token product by a
// fifth). Neither
// the token tiles, the split of rows over threads nor prefill versus decode can change a bit. The
// avx512 level sends its one- and two-token products of some types here too (qdot.cpp,
// decode_kernel: measured faster). Included by two translation units (as qdot_avx2_kernels.hpp is):
// qpack_avx2.cpp (maddubs) and qpack_avx_vnni.cpp (QF_INT8_VNNI: AVX-VNNI's vpdpbusd, the same
// int32 sums, so the same bits), each defining QF_AVX2 first; everything here has internal linkage.
// The bits also rest on -ffp-contract=off (kernels/CMakeLists.txt): the scale products and the
// add are separate instructions, as the reference's.
#pragma once

#include <algorithm>
#include <utility>

#include "kernels/cpu/qdot_avx2.hpp"
#include "kernels/cpu/qdot_x86.hpp"
#include "kernels/cpu/qpack.hpp"

#if defined(__x86_64__)

namespace qforge::detail {

namespace {

#if QF_INT8_VNNI
constexpr bool kVnni = true;  // vpdpbusd: int32 sums throughout
#else
constexpr bool kVnni = false;
#endif
constexpr int kHalves = 2;                      // 8-row halves of a 16-row tile
constexpr uint64_t kHalfRows = kPackLanes / 2;  // rows per ymm: one per dword lane
constexpr int kTileTokens = 16;                 // tokens per tile
constexpr int kBothHalvesTokens = 2;            // tiles of up to this many tokens go half by half
// How far ahead of each block its stream is prefetched, into L1 (the avx512 kernel's distance).
constexpr uint64_t kAhead = 4096;

// The activations of a tile's tokens.
template <int NT>
struct Tokens {
    const int8_t* q[NT];   // codes(t)
    const float* d[NT];    // scales(t)
    const int32_t* s[NT];  // sums(t)
};

// One weight group's scales and zeros for one half, as floats.
struct HalfMeta {
    __m256 scale, zero;
    __m256 min;  // super-block types: the block's min (d_min * mn), else unused
};

// Half h's 8 fp16 scales of a group at `scales` (and, for types that store them, its zeros at
// `zeros`).
template <QType T>
QF_AVX2 inline HalfMeta half_meta(const uint8_t* scales, const uint8_t* zeros, int h) {
    HalfMeta m;
    m.scale = _mm256_cvtph_ps(
        _mm_load_si128(reinterpret_cast<const __m128i*>(scales + 2 * kHalfRows * h)));
    if constexpr (Kind<T>::zero_stored)
        m.zero = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros + kHalfRows * h))));
    else
        m.zero = _mm256_set1_ps(static_cast<float>(Kind<T>::implicit_zero));
    return m;
}

// The fp16 in the low (high = false) or high half of each dword lane, as floats.
QF_AVX2 inline __m256 half_lanes(__m256i v, bool high) {
    v = high ? _mm256_srli_epi32(v, 16) : _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    // Dwords below 2^16 pack to words exactly; per 128-bit lane [v0..3 v0..3 | v4..7 v4..7].
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(w));
}

// Super-block types: the first nb blocks' scales and mins of half h from a chunk's meta (the 16
// rows' records as 4 vectors, vector j holding dword j of row l's record in lane l: dword 0 is d
// and dmin, block i's 6-bit scale and min the 12 bits from bit 12 i of dwords 1-3); d * sc and
// dmin * mn are exact, as row_group_scale's and row_group_min's.
QF_AVX2 inline void super_half_meta(const uint8_t* meta, int h, uint64_t nb, HalfMeta* m) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j)
        v[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(meta + 64 * j + 32 * h));
    const __m256 d = half_lanes(v[0], false), dmin = half_lanes(v[0], true);
    const __m256i m6 = _mm256_set1_epi32(63);
    for (uint64_t b = 0; b < nb; ++b) {
        const unsigned bit = static_cast<unsigned>(12 * b), j = 1 + bit / 32, sh = bit % 32;
        __m256i x = _mm256_srli_epi32(v[j], static_cast<int>(sh));
        if (sh + 12 > 32)
            x = _mm256_or_si256(x, _mm256_slli_epi32(v[j + 1], static_cast<int>(32 - sh)));
        m[b].scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(x, m6)));
        m[b].min =
            _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 6), m6)));
        m[b].zero = _mm256_setzero_ps();
    }
}

// Activation dword j of block b of a token, in every lane.
QF_AVX2 inline __m256i dword(const int8_t* q, uint64_t b, int j) {
    int32_t v;
    std::memcpy(&v, q + kBlock * b + 4 * static_cast<uint64_t>(j), 4);
    return _mm256_set1_epi32(v);
}

// A token's block scale d and code sum (as a float: exact, below 2^24) in every lane.
struct TokenBlock {
    __m256 d, s;
};
template <int NT>
QF_AVX2 inline TokenBlock token_block(const Tokens<NT>& x, int t, uint64_t b) {
    return {_mm256_set1_ps(x.d[t][b]), _mm256_set1_ps(static_cast<float>(x.s[t][b]))};
}

// The reference's step for one block of 8 rows and one token, from the block's integer sums:
// acc += (scale * d) * (isum - zero * sum q), super-block types minus min * (d * sum q).
template <QType T>
QF_AVX2 inline void step(__m256i sums, const HalfMeta& m, const TokenBlock& tb, __m256& acc) {
    __m256 isum = _mm256_cvtepi32_ps(sums);
    if constexpr (Kind<T>::zero_stored || Kind<T>::implicit_zero != 0)  // exact: header
        isum = _mm256_fnmadd_ps(m.zero, tb.s, isum);
    const __m256 cs = _mm256_mul_ps(m.scale, tb.d);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(cs, isum));
    if constexpr (Kind<T>::super)  // minus min * (d * sum q), the reference's roundings
        acc = _mm256_sub_ps(acc, _mm256_mul_ps(m.min, _mm256_mul_ps(tb.d, tb.s)));
}

// Block b of one half (its vectors of 32 bytes, 64 bytes apart, from v) against NT tokens:
// acc[t] += the block's step of the reference's sum.
template <QType T, int NT>
QF_AVX2 inline void half_block(const uint8_t* v, const HalfMeta& m, uint64_t b, const Tokens<NT>& x,
                               __m256 (&acc)[NT]) {
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // maddubs path only
    __m256i sums[NT];
    if constexpr (Kind<T>::q4) {
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        __m256i lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {
            const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(v + 64 * j));
            lo[j] = _mm256_and_si256(c, m4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
        }
        for (int t = 0; t < NT; ++t) {
#if QF_INT8_VNNI
            __m256i s32 = _mm256_setzero_si256();
            for (int j = 0; j < 4; ++j) {
                s32 = _mm256_dpbusd_avx_epi32(s32, lo[j], dword(x.q[t], b, j));
                s32 = _mm256_dpbusd_avx_epi32(s32, hi[j], dword(x.q[t], b, 4 + j));
            }
            sums[t] = s32;
#else
            __m256i s16 = _mm256_maddubs_epi16(lo[0], dword(x.q[t], b, 0));
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], dword(x.q[t], b, 4)));
            for (int j = 1; j < 4; ++j) {
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[j], dword(x.q[t], b, j)));
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[j], dword(x.q[t], b, 4 + j)));
            }
            sums[t] = _mm256_madd_epi16(s16, ones);
#endif
        }
    } else {
        __m256i u[8];
        for (int j = 0; j < 8; ++j)
            u[j] = _mm256_abs_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(v + 64 * j)));
        for (int t = 0; t < NT; ++t) {
            __m256i s32 = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(v + 64 * j));
                const __m256i a = _mm256_sign_epi8(dword(x.q[t], b, j), w);
#if QF_INT8_VNNI
                s32 = _mm256_dpbusd_avx_epi32(s32, u[j], a);
#else
                s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], a), ones));
#endif
            }
            sums[t] = s32;
        }
    }
    for (int t = 0; t < NT; ++t) step<T>(sums[t], m, token_block(x, t, b), acc[t]);
}

// Block b of both halves against the first n of NT tokens (more than kBothHalvesTokens; n at run
// time: the partial sums and accumulators live in memory either way, 2 x 16 vectors each, so
// one instantiation serves every n): each activation dword is broadcast once for the 16 rows
// instead of once per half. Both halves' code vectors do not
// fit the 16 registers with the broadcasts, so the block goes in two passes over the tokens, its
// first 4 dwords (4-bit: the low nibbles; 8-bit: vectors 0-3) and then the rest, each token's
// partial sums kept between them (exact integers: the order of their adds changes no bit). On a
// Zen 3 the broadcasts, not the multiplies, bounded a 16-token product (kernels/README.md).
template <QType T, int NT>
QF_AVX2 inline void both_halves_block(const uint8_t* v, const HalfMeta (&m)[kHalves], uint64_t b,
                                      const Tokens<NT>& x, int n, __m256 (&acc)[kHalves][NT]) {
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // maddubs path only
    // 4-bit types without VNNI: int16 sums (the 8 products of a half stay below 2^15, as in
    // half_block), widened once at the end; else int32.
    constexpr bool kWords = Kind<T>::q4 && !kVnni;
    __m256i part[kHalves][NT];
    for (int pass = 0; pass < 2; ++pass) {
        __m256i u[kHalves][4];  // 4-bit: nibbles of vectors 0-3; 8-bit: |w| of vectors 4 pass + j
        for (int h = 0; h < kHalves; ++h)
            for (int j = 0; j < 4; ++j) {
                const int vj = Kind<T>::q4 ? j : 4 * pass + j;
                const __m256i c = _mm256_load_si256(
                    reinterpret_cast<const __m256i*>(v + 32 * static_cast<uint64_t>(h) + 64 * vj));
                if constexpr (Kind<T>::q4)
                    u[h][j] = _mm256_and_si256(pass == 0 ? c : _mm256_srli_epi16(c, 4),
                                               _mm256_set1_epi8(0x0f));
                else
                    u[h][j] = _mm256_abs_epi8(c);
            }
        for (int t = 0; t < n; ++t)
            for (int j = 0; j < 4; ++j) {
                const __m256i d = dword(x.q[t], b, 4 * pass + j);
                for (int h = 0; h < kHalves; ++h) {
                    __m256i prod;
                    if constexpr (Kind<T>::q4) {
#if QF_INT8_VNNI
                        prod = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u[h][j], d);
#else
                        prod = _mm256_maddubs_epi16(u[h][j], d);
#endif
                    } else {
                        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(
                            v + 32 * static_cast<uint64_t>(h) + 64 * (4 * pass + j)));
                        const __m256i sa = _mm256_sign_epi8(d, w);
#if QF_INT8_VNNI
                        prod = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u[h][j], sa);
#else
                        prod = _mm256_madd_epi16(_mm256_maddubs_epi16(u[h][j], sa), ones);
#endif
                    }
                    __m256i& p = part[h][t];
                    if (pass == 0 && j == 0)
                        p = prod;
                    else
                        p = kWords ? _mm256_add_epi16(p, prod) : _mm256_add_epi32(p, prod);
                }
            }
    }
    for (int t = 0; t < n; ++t) {
        const TokenBlock tb = token_block(x, t, b);  // once for both halves
        for (int h = 0; h < kHalves; ++h)
            step<T>(kWords ? _mm256_madd_epi16(part[h][t], ones) : part[h][t], m[h], tb, acc[h][t]);
    }
}

// Both halves (8 rows each) of tile `tile` against tokens [tok, tok + n) into out[h][t], block
// by block, each block's lines read once: one or two tokens (n == NT) half by half (half_block),
// up to NT = kTileTokens with each activation dword broadcast once for both (both_halves_block).
template <QType T, int NT>
QF_AVX2 void tile_tokens(const QPackLayout& pl, const uint8_t* tile, const QActivations& a,
                         uint64_t tok, int n, __m256 (&out)[kHalves][NT]) {
    constexpr int NH = kHalves;
    Tokens<NT> x;
    __m256 acc[NH][NT];
    for (int t = 0; t < n; ++t) {
        x.q[t] = a.codes(tok + static_cast<uint64_t>(t));
        x.d[t] = a.scales(tok + static_cast<uint64_t>(t));
        x.s[t] = a.sums(tok + static_cast<uint64_t>(t));
        for (auto& h : acc) h[t] = _mm256_setzero_ps();
    }
    constexpr uint64_t gb = Kind<T>::group_blocks;
    HalfMeta m[NH]{};
    [[maybe_unused]] HalfMeta super[NH][kPackChunkBlocks];  // super-block types: per chunk
    if constexpr (gb == 0 && !Kind<T>::super)               // the per-row scales' header
        for (int h = 0; h < NH; ++h) m[h] = half_meta<T>(tile, nullptr, h);
    for (uint64_t c = 0; c < pl.chunks; ++c) {
        const uint8_t* chunk = tile + pl.header + c * pl.chunk_bytes;
        const uint64_t nb = pl.chunk_blocks(c);
        const uint64_t meta_bytes = pl.meta_bytes(nb);
        const uint8_t* codes = chunk + meta_bytes;
        if constexpr (Kind<T>::super)
            for (int h = 0; h < NH; ++h) super_half_meta(chunk, h, nb, super[h]);
        for (uint64_t i = 0; i < nb; ++i) {
            if constexpr (Kind<T>::super)
                for (int h = 0; h < NH; ++h) m[h] = super[h][i];
            else if constexpr (gb != 0)
                if (i % gb == 0) {
                    const uint8_t* meta = chunk + i / gb * pl.group_meta;
                    for (int h = 0; h < NH; ++h)
                        m[h] = half_meta<T>(meta, meta + 2 * kPackLanes, h);
                }
            const uint8_t* block = codes + i * pl.block_bytes;
            // The block's lines kAhead on, and at a chunk's start its meta's.
            for (uint64_t line = 0; line < pl.block_bytes; line += 64)
                _mm_prefetch(reinterpret_cast<const char*>(block + kAhead + line), _MM_HINT_T0);
            if (i == 0)
                for (uint64_t line = 0; line < meta_bytes; line += 64)
                    _mm_prefetch(reinterpret_cast<const char*>(chunk + kAhead + line), _MM_HINT_T0);
            if constexpr (NT > kBothHalvesTokens)
                both_halves_block<T, NT>(block, m, c * kPackChunkBlocks + i, x, n, acc);
            else
                for (int h = 0; h < NH; ++h)
                    half_block<T, NT>(block + 32 * static_cast<uint64_t>(h), m[h],
                                      c * kPackChunkBlocks + i, x, acc[h]);
        }
    }
    for (int h = 0; h < NH; ++h)
        for (int t = 0; t < n; ++t) out[h][t] = acc[h][t];
}

// Tokens [tok, tok + n) of tile `i`, n <= NT; rows [r0, r1) of it stored.
template <QType T, int NT>
QF_AVX2 void tile_store(const QPackedRows& m, uint64_t i, const QActivations& a, uint64_t tok,
                        int n, uint64_t r0, uint64_t r1, float* out, uint64_t ldo) {
    __m256 sums[kHalves][NT];
    tile_tokens<T, NT>(m.layout(), m.tile(i), a, tok, n, sums);
    const uint64_t first = i * kPackLanes;
    const uint64_t lo = std::max(first, r0), hi = std::min(first + kPackLanes, r1);
    if (lo == first && hi == first + kPackLanes) {  // the whole tile: straight to the outputs
        for (int t = 0; t < n; ++t)
            for (int h = 0; h < kHalves; ++h)
                _mm256_storeu_ps(out + static_cast<uint64_t>(t) * ldo + (first - r0) +
                                     kHalfRows * static_cast<uint64_t>(h),
                                 sums[h][t]);
        return;
    }
    alignas(32) float lanes[NT][kPackLanes];
    for (int h = 0; h < kHalves; ++h)
        for (int t = 0; t < n; ++t)
            _mm256_store_ps(lanes[t] + kHalfRows * static_cast<uint64_t>(h), sums[h][t]);
    for (int t = 0; t < n; ++t)
        std::copy(lanes[t] + (lo - first), lanes[t] + (hi - first),
                  out + static_cast<uint64_t>(t) * ldo + (lo - r0));
}

// Rows [r0, r1) against tokens [t0, t1), a tile of rows against up to kTileTokens tokens at a
// time: one or two tokens (the decode of one or two sequences) with their own instantiations,
// the accumulators in registers; more through the one instantiation for any n.
template <QType T>
void packed_rows(const QPackedRows& m, uint64_t r0, uint64_t r1, const QActivations& a, uint64_t t0,
                 uint64_t t1, float* out, uint64_t ldo) {
    for (uint64_t i = r0 / kPackLanes; i * kPackLanes < r1; ++i)
        for (uint64_t tok = t0; tok < t1; tok += kTileTokens) {
            const int n = static_cast<int>(std::min<uint64_t>(kTileTokens, t1 - tok));
            float* o = out + (tok - t0) * ldo;
            static_assert(kBothHalvesTokens == 2);
            if (n == 1)
                tile_store<T, 1>(m, i, a, tok, n, r0, r1, o, ldo);
            else if (n == 2)
                tile_store<T, 2>(m, i, a, tok, n, r0, r1, o, ldo);
            else
                tile_store<T, kTileTokens>(m, i, a, tok, n, r0, r1, o, ldo);
        }
}

// 4-bit types with integer codes (q4_g*, q4s_g*, q4k_g32) and 8-bit types; level tables keep
// the row layout's kernels at this level.
template <QType T>
constexpr QPackedKernel packed_entry() {
    if constexpr (qtype_is_quantized(T) && (Kind<T>::q4 || Kind<T>::q8) && !Kind<T>::levels)
        return packed_rows<T>;
    else
        return nullptr;
}

template <size_t... I>
constexpr QPackedKernelRow packed_row(std::index_sequence<I...>) {
    return {{packed_entry<kQTypes[I].type>()...}};
}

}  // namespace

}  // namespace qforge::detail

#endif  // __x86_64__
