// AVX2/FMA/F16C products of quantized rows with prepared activations (kernels/README.md has the
// design and the measurements). Supported: every quantized type of formats/qtype.hpp, any k >= 1,
// both activation modes. Each (row, token) output is computed by one fixed sequence of vector
// operations that depends only on k, whichever tile of rows and tokens it is computed in, so the
// results are bit-identical for any split of rows or tokens.
//
// int8 mode, per row and token, two 8-lane float accumulators (two FMA chains: one chain ran at
// its 4-cycle latency, 1.4x slower in decode), acc0 for a superblock's pairs 0 and 2, acc1 for 1
// and 3:
//   for each superblock of 8 activation blocks (256 weights):
//     acc0 -= (scale * zero) [8 lanes, one per block] * (d * code sum) [8 lanes]  (4-, 3-bit)
//     for each pair of blocks: 64 weights, one 32-byte load of two 4-bit chunks (or two 8-bit
//       blocks), split into low and high nibbles (3-bit: half a 48-byte chunk, its two planes
//       shifted and masked into the same order); maddubs/madd against the pair-ordered int8
//       activations give 8 int32 partial sums, lanes 0-3 from the first block, 4-7 from the
//       second; acc += (scale * d) [those lanes, from one 8-lane product per superblock] *
//       float(partial sums)
//   the last < 8 blocks the same way (pairs, then one odd block over all 8 lanes, into acc0);
//   then acc0 + acc1, and its lanes added in float_dot's fixed tree.
// f32 mode, per block of 32: the codes minus the zero as 4 x 8 floats (exact), a block sum
// p = ((c0 x0 + c1 x1) + c2 x2) + c3 x3 lane-wise, acc += scale * p; the same final tree.
#include "kernels/cpu/qdot_avx2.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>

#include "core/half.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_X86 1
#endif

namespace qforge::detail {

#ifdef QF_X86

namespace {

#define QF_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr uint64_t kBlock = 32;  // weights per activation block and per code chunk
constexpr uint64_t kSuper = 8;   // blocks per superblock: one 8-lane vector of their scales
constexpr int kTokenTile = 4;    // tokens sharing one unpacked code chunk in prefill
constexpr uint64_t kRowTileBytes = 64 * 1024;  // weights kept hot in L2 while token tiles pass
// Decode streams rows from DRAM. The hardware prefetcher alone loses the stream at every row's
// scales and zeros (measured: q4_g32 at k = 5632 ran at a third of its speed), so while a row
// is computed a row ahead is prefetched, spread evenly over the row's superblocks: its scale and
// zero lines first (its first superblock needs them at once), then its codes.
// Into L2 (T1) for 4- and 3-bit rows and long 8-bit rows (q4_g32 at 4096x14336: 1.8x faster
// than into L1, q8: 1.4x), the row at least kPrefetchL2Bytes ahead: one row (1216 bytes at
// q4_g32, k = 2048) is less than DRAM latency times one core's rate, and a TinyLlama-shape q4
// decode ran 1.15x to 1.2x faster 6 KiB ahead than one row ahead (4 and 8 KiB: in between;
// measured side by side, kernels/README.md). Into L1 (T0) for 8-bit rows of up to
// kPrefetchL1Weights (q8 at 4096x4096 and 576x1536: 1.3x to 1.4x faster than into L2), one row
// ahead (two: 0.92x, L1 is small).
constexpr uint64_t kPrefetchL1Weights = 4096;
constexpr uint64_t kPrefetchL2Bytes = 6144;

template <QType T>
struct Kind {
    static constexpr bool q4 = qtype_traits(T).bits == 4;
    static constexpr bool q3 = qtype_traits(T).bits == 3;
    static constexpr bool q8 = qtype_traits(T).bits == 8;
    static constexpr bool unsigned_codes = !qtype_traits(T).signed_codes;  // q4 and q3
    static constexpr bool zero_stored = !qtype_traits(T).symmetric;
    static constexpr int32_t implicit_zero = qtype_traits(T).implicit_zero;
    static constexpr uint64_t group_blocks = qtype_traits(T).group / kBlock;  // 0: one per row
};

// One quantized row: its codes, fp16 scales and (asymmetric types) uint8 zeros, and the row to
// prefetch while this one is computed (null: none).
struct Row {
    const uint8_t* codes;
    const uint8_t* scales;
    const uint8_t* zeros;
    const uint8_t* ahead;
    uint64_t lines;      // cache lines per row
    uint64_t meta_line;  // the first line holding scales (they and the zeros run to the end)
    uint64_t step;       // lines to prefetch per superblock: lines / superblocks, rounded up
    bool to_l1;          // prefetch into L1 (T0) rather than L2 (T1)
};

__attribute__((always_inline)) QF_AVX2 inline void prefetch_line(const uint8_t* p, bool to_l1) {
    if (to_l1)
        _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    else
        _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}

// Prefetches the part for superblock u of the row ahead: its scale and zero lines first, then
// its codes in order. Always inlined: GCC treats a function whose only effect is
// __builtin_prefetch as const and deletes calls to it.
__attribute__((always_inline)) QF_AVX2 inline void prefetch_part(const Row& row, uint64_t u) {
    if (!row.ahead) return;
    const uint64_t step = row.step;
    const uint64_t meta = row.lines - row.meta_line;
    for (uint64_t v = u * step; v < std::min(row.lines, (u + 1) * step); ++v)
        prefetch_line(row.ahead + 64 * (v < meta ? row.meta_line + v : v - meta), row.to_l1);
}

template <QType T>
inline uint64_t group_of_block(uint64_t b) {
    if constexpr (Kind<T>::group_blocks == 0)
        return 0;
    else
        return b / Kind<T>::group_blocks;
}

template <QType T>
inline float block_scale(const Row& row, uint64_t b) {
    uint16_t h;
    std::memcpy(&h, row.scales + 2 * group_of_block<T>(b), 2);
    return f16_to_f32(h);
}

template <QType T>
inline int32_t block_zero(const Row& row, uint64_t b) {
    if constexpr (Kind<T>::zero_stored)
        return row.zeros[group_of_block<T>(b)];
    else
        return Kind<T>::implicit_zero;
}

// The scales of superblock s's 8 blocks, one per lane (groups of 64 or 128 repeat their scale).
template <QType T>
QF_AVX2 inline __m256 superblock_scales(const Row& row, uint64_t s) {
    constexpr uint64_t gb = Kind<T>::group_blocks;
    if constexpr (gb == 0) {
        uint16_t h;
        std::memcpy(&h, row.scales, 2);
        return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
    } else if constexpr (gb == 1) {
        return _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.scales + 16 * s)));
    } else if constexpr (gb == 2) {
        const __m128 f =
            _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.scales + 8 * s)));
        return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f),
                                        _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    } else {
        static_assert(gb == 4, "groups are 32, 64 or 128 weights, or one per row");
        int32_t v;
        std::memcpy(&v, row.scales + 4 * s, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(v));
        return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f),
                                        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    }
}

// The zero points of superblock s's 8 blocks as floats (4-bit types).
template <QType T>
QF_AVX2 inline __m256 superblock_zeros(const Row& row, uint64_t s) {
    constexpr uint64_t gb = Kind<T>::group_blocks;
    if constexpr (!Kind<T>::zero_stored) {
        return _mm256_set1_ps(static_cast<float>(Kind<T>::implicit_zero));
    } else if constexpr (gb == 1) {
        const __m128i z = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.zeros + 8 * s));
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z));
    } else {
        static_assert(gb == 2 || gb == 4, "asymmetric types have groups of 32, 64 or 128");
        int32_t v = 0;
        std::memcpy(&v, row.zeros + (kSuper / gb) * s, kSuper / gb);
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128(v)));
        const __m256i idx = gb == 2 ? _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)
                                    : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        return _mm256_permutevar8x32_ps(f, idx);
    }
}

// Lanes 0-3 take lane 2j of v, lanes 4-7 lane 2j + 1: the scales of pair j's two blocks.
QF_AVX2 inline __m256 pair_lanes(__m256 v, uint64_t j) {
    const int a = static_cast<int>(2 * j), b = a + 1;
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(a, a, a, a, b, b, b, b));
}

QF_AVX2 inline float hsum(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

// 3-bit codes: 48-byte chunks of 128 weights (blocks 4c .. 4c + 3), a 32-byte plane of the low
// two bits and a 16-byte plane of the high bits (formats/qtype.hpp, q3_code_position).
constexpr uint64_t kQ3ChunkBytes = sizeof(Q3Chunk);  // 48: the 2-bit plane, then the high plane
constexpr uint64_t kQ3ChunkBlocks = kQ3CodeChunk / kBlock;

// Per-lane shift counts: c in the low 128-bit lane, c + 1 in the high one (the pair's second
// block has its high bits one place up).
QF_AVX2 inline __m256i q3_lane_counts(int c) {
    return _mm256_setr_epi32(c, c, c, c, c + 1, c + 1, c + 1, c + 1);
}

// Pair p's codes (blocks 2p, 2p + 1) in pair order, as int8_pair's q4 split gives them: lo =
// [2p: 0..15][2p+1: 0..15], hi = [2p: 16..31][2p+1: 16..31]. The pair is half of chunk p / 2: its
// low bits are the plane shifted by 0 and 2 (first half) or 4 and 6; its high bits, high-plane
// bits (0, 1) and (2, 3) or (4, 5) and (6, 7) per lane, are moved to bit 2 with one variable shift
// per lane (bits 0 and 1 need a left shift). Dword shifts move bits across bytes, but bit 2 of
// each byte only ever receives a bit of the same byte.
QF_AVX2 inline void q3_pair_codes(const uint8_t* codes, uint64_t p, __m256i& lo, __m256i& hi) {
    const uint8_t* c = codes + kQ3ChunkBytes * (p / 2);
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
    const __m256i h = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + offsetof(Q3Chunk, high))));
    __m256i vlo, vhi, hlo, hhi;
    if (p % 2 == 0) {
        vlo = v;
        vhi = _mm256_srli_epi16(v, 2);
        hlo = _mm256_sllv_epi32(h, _mm256_setr_epi32(2, 2, 2, 2, 1, 1, 1, 1));
        hhi = _mm256_srlv_epi32(h, q3_lane_counts(0));
    } else {
        vlo = _mm256_srli_epi16(v, 4);
        vhi = _mm256_srli_epi16(v, 6);
        hlo = _mm256_srlv_epi32(h, q3_lane_counts(2));
        hhi = _mm256_srlv_epi32(h, q3_lane_counts(4));
    }
    lo = _mm256_or_si256(_mm256_and_si256(vlo, m3), _mm256_and_si256(hlo, m4));
    hi = _mm256_or_si256(_mm256_and_si256(vhi, m3), _mm256_and_si256(hhi, m4));
}

// Block b's 32 codes in order (weights 0..15 in the low lane, 16..31 in the high one): a last odd
// block in int8 mode, and f32 mode's and dequantize_rows' unpacking. Each byte's bit is tested
// with a per-lane mask (any of the 8 positions, so no shift direction to choose).
QF_AVX2 inline __m256i q3_block_codes(const uint8_t* codes, uint64_t b) {
    const uint8_t* c = codes + kQ3ChunkBytes * (b / kQ3ChunkBlocks);
    const int r = static_cast<int>(b % kQ3ChunkBlocks);
    const int ls = 4 * (r / 2), hb = r % 2 + 4 * (r / 2);  // weights 16..31: 2 more for both
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16 * (r % 2)));
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + offsetof(Q3Chunk, high)));
    const __m256i low_counts = _mm256_setr_epi32(ls, ls, ls, ls, ls + 2, ls + 2, ls + 2, ls + 2);
    const __m256i low = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set_m128i(v, v), low_counts),
                                         _mm256_set1_epi8(3));
    const __m256i bit = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(4 << hb)),
                                         _mm_set1_epi8(static_cast<char>(1 << hb)));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_set_m128i(h, h), bit), bit);
    return _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(4)));
}

// Activation pointers of a tile's tokens (int8 mode).
template <int NT>
struct Int8Tokens {
    const int8_t* q[NT];    // pair_codes
    const float* d[NT];     // block scales
    const float* sums[NT];  // scaled_sums
};

// Pair p (blocks 2p, 2p + 1) of one row against NT tokens; cs[t]: the 8 blocks' combined scales
// (weight scale * activation scale) of the superblock holding the pair, which is its j-th.
template <QType T, int NT>
QF_AVX2 inline void int8_pair(const uint8_t* codes, uint64_t p, uint64_t j, const __m256* cs,
                              const Int8Tokens<NT>& x, __m256* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (Kind<T>::unsigned_codes) {
        __m256i lo, hi;
        if constexpr (Kind<T>::q3) {
            q3_pair_codes(codes, p, lo, hi);
        } else {
            const __m256i m4 = _mm256_set1_epi8(0x0f);
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * p));
            lo = _mm256_and_si256(v, m4);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        for (int t = 0; t < NT; ++t) {
            const __m256i alo =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 64 * p));
            const __m256i ahi =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 64 * p + 32));
            // 15 * 127 * 2 per int16 from each half: the sum cannot saturate.
            const __m256i s16 =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
            const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
            acc[t] = _mm256_fmadd_ps(pair_lanes(cs[t], j), sum, acc[t]);
        }
    } else {
        // Signed codes: |w| * (a with w's sign), at most 128 * 127 * 2 per int16 (code -128,
        // which GGUF Q8_0 and GPTQ 8-bit imports carry, is |w| = 128 as an unsigned byte).
        const uint8_t* c = codes + 64 * p;
        const __m256i wa = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(c + 32),
                                               reinterpret_cast<const __m128i*>(c));
        const __m256i wb = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(c + 48),
                                               reinterpret_cast<const __m128i*>(c + 16));
        const __m256i ua = _mm256_abs_epi8(wa), ub = _mm256_abs_epi8(wb);
        for (int t = 0; t < NT; ++t) {
            const __m256i alo =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 64 * p));
            const __m256i ahi =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 64 * p + 32));
            const __m256i sa =
                _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(alo, wa)), ones);
            const __m256i sb =
                _mm256_madd_epi16(_mm256_maddubs_epi16(ub, _mm256_sign_epi8(ahi, wb)), ones);
            const __m256 sum = _mm256_cvtepi32_ps(_mm256_add_epi32(sa, sb));
            acc[t] = _mm256_fmadd_ps(pair_lanes(cs[t], j), sum, acc[t]);
        }
    }
}

// A last odd block b (codes and activations in order) over all 8 lanes; cs[t]: its combined
// scale in every lane.
template <QType T, int NT>
QF_AVX2 inline void int8_single(const uint8_t* codes, uint64_t b, const __m256* cs,
                                const Int8Tokens<NT>& x, __m256* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i w;
    if constexpr (Kind<T>::q3) {
        w = q3_block_codes(codes, b);
    } else if constexpr (Kind<T>::q4) {
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b));
        w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    } else {
        w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * b));
    }
    for (int t = 0; t < NT; ++t) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 32 * b));
        __m256i s16;
        if constexpr (Kind<T>::unsigned_codes)
            s16 = _mm256_maddubs_epi16(w, a);
        else
            s16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        acc[t] = _mm256_fmadd_ps(cs[t], sum, acc[t]);
    }
}

// One row against NT consecutive tokens from `tok`; out[t * ldo]. Each (row, token) accumulator
// sees the same operations whatever NT is: tokens only interleave independent chains.
template <QType T, int NT>
QF_AVX2 void int8_tile(const Row& row, const QActivations& a, uint64_t tok, float* out,
                       uint64_t ldo) {
    const uint64_t blocks = a.blocks();
    Int8Tokens<NT> x;
    __m256 acc[2][NT], cs[NT];  // pairs 0 and 2 of a superblock into acc[0], 1 and 3 into acc[1]
    for (int t = 0; t < NT; ++t) {
        x.q[t] = a.pair_codes(tok + t);
        x.d[t] = a.scales(tok + t);
        x.sums[t] = a.scaled_sums(tok + t);
        acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    }
    const uint64_t full = blocks / kSuper;
    for (uint64_t s = 0; s < full; ++s) {
        prefetch_part(row, s);
        const __m256 wsb = superblock_scales<T>(row, s);
        if constexpr (Kind<T>::unsigned_codes) {
            const __m256 wz = _mm256_mul_ps(wsb, superblock_zeros<T>(row, s));
            for (int t = 0; t < NT; ++t)
                acc[0][t] =
                    _mm256_fnmadd_ps(wz, _mm256_loadu_ps(x.sums[t] + kSuper * s), acc[0][t]);
        }
        for (int t = 0; t < NT; ++t)
            cs[t] = _mm256_mul_ps(wsb, _mm256_loadu_ps(x.d[t] + kSuper * s));
        for (uint64_t j = 0; j < kSuper / 2; ++j)
            int8_pair<T, NT>(row.codes, kSuper / 2 * s + j, j, cs, x, acc[j % 2]);
    }
    if (const uint64_t rest = blocks - full * kSuper; rest > 0) {
        prefetch_part(row, full);
        // The same products as the vector path (fp16 to float is exact; scale * zero is exact).
        alignas(32) float sc[kSuper] = {}, sz[kSuper] = {}, cst[NT][kSuper] = {};
        for (uint64_t b = 0; b < rest; ++b) {
            sc[b] = block_scale<T>(row, full * kSuper + b);
            sz[b] = sc[b] * static_cast<float>(block_zero<T>(row, full * kSuper + b));
            for (int t = 0; t < NT; ++t) cst[t][b] = sc[b] * x.d[t][full * kSuper + b];
        }
        if constexpr (Kind<T>::unsigned_codes) {
            const __m256 wz = _mm256_load_ps(sz);
            for (int t = 0; t < NT; ++t)
                acc[0][t] =
                    _mm256_fnmadd_ps(wz, _mm256_loadu_ps(x.sums[t] + kSuper * full), acc[0][t]);
        }
        for (int t = 0; t < NT; ++t) cs[t] = _mm256_load_ps(cst[t]);
        for (uint64_t j = 0; j < rest / 2; ++j)
            int8_pair<T, NT>(row.codes, kSuper / 2 * full + j, j, cs, x, acc[j % 2]);
        if (rest % 2) {
            for (int t = 0; t < NT; ++t) cs[t] = _mm256_set1_ps(cst[t][rest - 1]);
            int8_single<T, NT>(row.codes, blocks - 1, cs, x, acc[0]);
        }
    }
    for (int t = 0; t < NT; ++t)
        out[static_cast<uint64_t>(t) * ldo] = hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
}

// Block b's codes minus its zero as 4 x 8 exact floats, weights 0-7, 8-15, 16-23, 24-31.
template <QType T>
QF_AVX2 inline void block_values(const Row& row, uint64_t b, __m256 f[4]) {
    if constexpr (Kind<T>::q3) {
        const __m256i c = q3_block_codes(row.codes, b);
        const __m256i z = _mm256_set1_epi32(block_zero<T>(row, b));
        const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
        const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
        for (int i = 0; i < 4; ++i)
            f[i] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[i]), z));
    } else if constexpr (Kind<T>::q4) {
        // Each code byte widened to a dword holds weight i (low nibble) and i + 16 (high).
        const __m256i m4 = _mm256_set1_epi32(0x0f);
        const __m256i z = _mm256_set1_epi32(block_zero<T>(row, b));
        const uint8_t* c = row.codes + 16 * b;
        const __m256i b0 =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
        const __m256i b1 =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8)));
        f[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m4), z));
        f[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m4), z));
        f[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), z));
        f[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), z));
    } else {
        const uint8_t* c = row.codes + 32 * b;
        for (int i = 0; i < 4; ++i)
            f[i] = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8 * i))));
    }
}

template <QType T, int NT>
QF_AVX2 void f32_tile(const Row& row, const QActivations& a, uint64_t tok, float* out,
                      uint64_t ldo) {
    const uint64_t blocks = a.blocks();
    const float* x[NT];
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) {
        x[t] = a.floats(tok + t);
        acc[t] = _mm256_setzero_ps();
    }
    alignas(32) float sc[kSuper];
    for (uint64_t b = 0; b < blocks; ++b) {
        if (b % kSuper == 0) {
            prefetch_part(row, b / kSuper);
            if (b + kSuper <= blocks)
                _mm256_store_ps(sc, superblock_scales<T>(row, b / kSuper));
            else
                for (uint64_t i = 0; b + i < blocks; ++i) sc[i] = block_scale<T>(row, b + i);
        }
        __m256 f[4];
        block_values<T>(row, b, f);
        const __m256 ws = _mm256_broadcast_ss(&sc[b % kSuper]);
        for (int t = 0; t < NT; ++t) {
            const float* xb = x[t] + kBlock * b;
            __m256 p = _mm256_mul_ps(f[0], _mm256_loadu_ps(xb));
            p = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(xb + 8), p);
            p = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(xb + 16), p);
            p = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(xb + 24), p);
            acc[t] = _mm256_fmadd_ps(ws, p, acc[t]);
        }
    }
    for (int t = 0; t < NT; ++t) out[static_cast<uint64_t>(t) * ldo] = hsum(acc[t]);
}

template <QType T, int NT>
QF_AVX2 void tile(const Row& row, const QActivations& a, uint64_t tok, float* out, uint64_t ldo) {
    if (a.mode() == QActivations::Mode::int8)
        int8_tile<T, NT>(row, a, tok, out, ldo);
    else
        f32_tile<T, NT>(row, a, tok, out, ldo);
}

template <QType T>
void qmatmul_t(const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1, const QActivations& a,
               uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const QRowLayout l = *qtype_row_layout(T, a.k());
    // Row r, prefetching a row `ahead` while it is computed.
    Row proto{};
    proto.lines = l.row_bytes / 64;
    proto.meta_line = l.scales_offset / 64;
    const uint64_t supers = (a.blocks() + kSuper - 1) / kSuper;
    proto.step = (proto.lines + supers - 1) / supers;
    proto.to_l1 = Kind<T>::q8 && a.k() <= kPrefetchL1Weights;
    const uint64_t ahead =
        proto.to_l1 ? 1 : std::max<uint64_t>(1, (kPrefetchL2Bytes + stride - 1) / stride);
    auto row_at = [&](uint64_t r) {
        Row row = proto;
        row.codes = w + r * stride;
        row.scales = row.codes + l.scales_offset;
        row.zeros = row.codes + l.zeros_offset;
        row.ahead = r + ahead < r1 ? row.codes + ahead * stride : nullptr;
        return row;
    };
    if (t1 - t0 == 1) {
        for (uint64_t r = r0; r < r1; ++r) tile<T, 1>(row_at(r), a, t0, out + (r - r0), ldo);
        return;
    }
    // Prefill: a tile of rows stays in L2 while every tile of tokens passes over it, so each code
    // chunk is read from memory once and unpacked once per kTokenTile tokens.
    const uint64_t rows_per_tile = std::max<uint64_t>(1, kRowTileBytes / stride);
    for (uint64_t rb = r0; rb < r1; rb += rows_per_tile) {
        const uint64_t re = std::min(r1, rb + rows_per_tile);
        for (uint64_t tt = t0; tt < t1; tt += kTokenTile) {
            const uint64_t nt = std::min<uint64_t>(kTokenTile, t1 - tt);
            float* o = out + (tt - t0) * ldo;
            for (uint64_t r = rb; r < re; ++r) {
                switch (nt) {
                    case 4:
                        tile<T, 4>(row_at(r), a, tt, o + (r - r0), ldo);
                        break;
                    case 3:
                        tile<T, 3>(row_at(r), a, tt, o + (r - r0), ldo);
                        break;
                    case 2:
                        tile<T, 2>(row_at(r), a, tt, o + (r - r0), ldo);
                        break;
                    default:
                        tile<T, 1>(row_at(r), a, tt, o + (r - r0), ldo);
                        break;
                }
            }
        }
    }
}

template <QType T>
QF_AVX2 void dequantize_t(const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k, float* out) {
    const QRowLayout l = *qtype_row_layout(T, k);
    const uint64_t blocks = (k + kBlock - 1) / kBlock;
    for (uint64_t r = 0; r < n; ++r) {
        const uint8_t* p = w + r * stride;
        const Row row{p, p + l.scales_offset, p + l.zeros_offset, nullptr, 0, 0, 0, false};
        float* o = out + r * k;
        for (uint64_t b = 0; b < blocks; ++b) {
            __m256 f[4];
            block_values<T>(row, b, f);
            // scale * (code - zero), the reference's product: exact, so the same bits.
            const __m256 ws = _mm256_set1_ps(block_scale<T>(row, b));
            if (kBlock * (b + 1) <= k) {
                for (int i = 0; i < 4; ++i)
                    _mm256_storeu_ps(o + kBlock * b + 8 * i, _mm256_mul_ps(f[i], ws));
            } else {
                alignas(32) float tmp[kBlock];
                for (int i = 0; i < 4; ++i) _mm256_store_ps(tmp + 8 * i, _mm256_mul_ps(f[i], ws));
                std::copy(tmp, tmp + (k - kBlock * b), o + kBlock * b);
            }
        }
    }
}

}  // namespace

QF_AVX2 void quantize_activation_blocks_avx2(const float* x, uint64_t blocks, int8_t* q, float* d,
                                             int32_t* s) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 flt_max = _mm256_set1_ps(std::numeric_limits<float>::max());
    for (uint64_t b = 0; b < blocks; ++b) {
        const float* xb = x + kBlock * b;
        __m256 v[4], amax = _mm256_setzero_ps();
        int finite = 0xff;
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            const __m256 a = _mm256_and_ps(v[i], abs_mask);
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, flt_max, _CMP_LE_OQ));  // NaN: false
            amax = _mm256_max_ps(amax, a);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float m = _mm_cvtss_f32(h);
        const float db = m / 127.0f;
        int8_t* qb = q + kBlock * b;
        if (finite != 0xff || !(db > 0.0f)) {  // the scalar version's special cases
            std::memset(qb, 0, kBlock);
            d[b] = finite != 0xff ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
            s[b] = 0;
            continue;
        }
        const __m256 dv = _mm256_set1_ps(db), lo = _mm256_set1_ps(-127.0f),
                     hi = _mm256_set1_ps(127.0f);
        __m256i c[4];
        for (int i = 0; i < 4; ++i) {
            const __m256 r = _mm256_round_ps(_mm256_div_ps(v[i], dv),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            c[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
        }
        const __m256i sum32 =
            _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
        __m128i t =
            _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        // packs work within 128-bit lanes: (0 1 | 2 3) then a dword permute restores the order.
        const __m256i p16a = _mm256_packs_epi32(c[0], c[1]), p16b = _mm256_packs_epi32(c[2], c[3]);
        const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        const __m256i ordered =
            _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), ordered);
        d[b] = db;
        s[b] = _mm_cvtsi128_si32(t);
    }
}

bool qdot_avx2_supports(QType t) { return qtype_is_quantized(t); }

#define QF_QTYPE_CASES(X) \
    X(q8) X(q8_g32) X(q8_g128) X(q4_g32) X(q4_g64) X(q4_g128) X(q4s_g32) X(q4s_g64) X(q4s_g128)
#define QF_Q3_QTYPE_CASES(X) X(q3_g32) X(q3_g128)

void qmatmul_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                  const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    switch (t) {
#define X(name)       \
    case QType::name: \
        return qmatmul_t<QType::name>(w, stride, r0, r1, a, t0, t1, out, ldo);
        QF_QTYPE_CASES(X)
        QF_Q3_QTYPE_CASES(X)
#undef X
        default:
            return;
    }
}

void dequantize_rows_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                          float* out) {
    switch (t) {
#define X(name)       \
    case QType::name: \
        return dequantize_t<QType::name>(w, stride, n, k, out);
        QF_QTYPE_CASES(X)
        QF_Q3_QTYPE_CASES(X)
#undef X
        default:
            return;
    }
}

#else  // no x86: the dispatch never calls these

bool qdot_avx2_supports(QType) { return false; }
void quantize_activation_blocks_avx2(const float*, uint64_t, int8_t*, float*, int32_t*) {}
void qmatmul_avx2(QType, const uint8_t*, uint64_t, uint64_t, uint64_t, const QActivations&,
                  uint64_t, uint64_t, float*, uint64_t) {}
void dequantize_rows_avx2(QType, const uint8_t*, uint64_t, uint64_t, uint64_t, float*) {}

#endif

}  // namespace qforge::detail
