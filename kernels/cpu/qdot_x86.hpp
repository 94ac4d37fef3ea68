// Building blocks shared by the x86 levels of kernels/cpu/qdot.hpp (internal to kernels/cpu):
// the row and superblock accessors, the int8 pair and single-block products with their
// activation layouts, the tail of a row (its last < 8 blocks), and the driver that walks rows and
// token tiles. Each level's translation unit (qdot_avx2.cpp, qdot_avx512.cpp) includes it; the
// helpers carry the AVX2 target attribute, so a level above AVX2 inlines them into its own
// functions, and everything here has internal linkage, so no copy compiled for one level can be
// picked by the linker for another.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/half.hpp"
#include "kernels/cpu/qdot.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

namespace qforge::detail {

namespace {

// The AVX2 helpers' target; qdot_avx_vnni.cpp defines it with avxvnni added first.
#ifndef QF_AVX2
#define QF_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif
// 1: the int8 products below use AVX-VNNI's vpdpbusd (VEX, 256-bit) instead of maddubs and madd.
// Every site's int16 pair sums are below 2^15 (said at each), so both give the same int32 sums.
#ifndef QF_INT8_VNNI
#define QF_INT8_VNNI 0
#endif

constexpr uint64_t kBlock = 32;  // weights per activation block and per code chunk
constexpr uint64_t kSuper = 8;   // blocks per superblock: one 8-lane vector of their scales
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
    // Non-uniform types: 4-bit codes index 16 int8 levels (a byte shuffle), then run as signed
    // int8 weights with no zero.
    static constexpr bool levels = qtype_traits(T).nonuniform;
    static constexpr bool row_levels = qtype_traits(T).row_levels;  // the row's own 16 levels
    // Codes multiplied as unsigned bytes, their zero subtracted after: q4 and q3.
    static constexpr bool unsigned_codes = !qtype_traits(T).signed_codes && !levels;
    // Super-block types: 6-bit scales and mins against fp16 d, dmin (QSuperRecord), no zeros.
    static constexpr bool super = qtype_traits(T).super_block != 0;
    static constexpr bool zero_stored = !qtype_traits(T).symmetric && !super;
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
    // int8 mode, a row whose last superblock is partial: tail_vectors of it, computed once per
    // row for a whole prefill (null: int8_rest computes them itself).
    const float* tail = nullptr;
    const int8_t* levels = nullptr;  // learned-table types: the row's 16 levels
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

// Super-block types: block b's 6-bit scale (which = 0) or min (which = 1) times the record's d
// (or dmin): exact products, so every path below sees the reference's values.
QF_AVX2 inline float super_value(const Row& row, uint64_t b, uint64_t which) {
    const uint8_t* rec = row.scales + sizeof(QSuperRecord) * (b / kSuper);
    uint16_t h;
    std::memcpy(&h, rec + 2 * which, 2);
    const uint8_t* sm = rec + offsetof(QSuperRecord, sm);
    const uint64_t bit = 12 * (b % kSuper) + 6 * which, at = bit / 8, shift = bit % 8;
    uint32_t v = sm[at] >> shift;
    if (shift > 2) v |= static_cast<uint32_t>(sm[at + 1]) << (8 - shift);
    return _cvtsh_ss(h) * static_cast<float>(v & 63u);
}

template <QType T>
QF_AVX2 inline float block_scale(const Row& row, uint64_t b) {
    if constexpr (Kind<T>::super) return super_value(row, b, 0);
    uint16_t h;
    std::memcpy(&h, row.scales + 2 * group_of_block<T>(b), 2);
    return f16_to_f32(h);
}

template <QType T>
QF_AVX2 inline int32_t block_zero(const Row& row, uint64_t b) {
    if constexpr (Kind<T>::zero_stored)
        return row.zeros[group_of_block<T>(b)];
    else
        return Kind<T>::implicit_zero;
}

// What block b subtracts per unit of activation: scale * zero, or a super-block type's min.
template <QType T>
QF_AVX2 inline float block_offset(const Row& row, uint64_t b) {
    if constexpr (Kind<T>::super)
        return super_value(row, b, 1);
    else
        return block_scale<T>(row, b) * static_cast<float>(block_zero<T>(row, b));
}

// A whole super-block record's 8 scales (which = 0) or mins (1), one per lane. Lane g's 12 bits
// start at bit 12 g of sm, so a 16-bit window from byte 4 + floor(1.5 g) of the record, shifted
// right by 4 for odd g, holds them (sc in bits 0-5, mn in 6-11).
QF_AVX2 inline __m256 super_lanes(const Row& row, uint64_t s, int which) {
    const uint8_t* rec = row.scales + sizeof(QSuperRecord) * s;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec));
    const __m128i win =
        _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11, 12, 13, 14, 14, 15));
    __m256i x =
        _mm256_srlv_epi32(_mm256_cvtepu16_epi32(win), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    if (which) x = _mm256_srli_epi32(x, 6);
    const __m256 code = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(63)));
    uint16_t h;
    std::memcpy(&h, rec + 2 * which, 2);
    return _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(h)), code);  // exact, as super_value
}

// The scales of superblock s's 8 blocks, one per lane (groups of 64 or 128 repeat their scale).
template <QType T>
QF_AVX2 inline __m256 superblock_scales(const Row& row, uint64_t s) {
    constexpr uint64_t gb = Kind<T>::group_blocks;
    if constexpr (Kind<T>::super) {
        return super_lanes(row, s, 0);
    } else if constexpr (gb == 0) {
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

// Superblock s's offsets (block_offset), one per lane, given its scales wsb.
template <QType T>
QF_AVX2 inline __m256 superblock_offsets(const Row& row, uint64_t s, __m256 wsb) {
    if constexpr (Kind<T>::super)
        return super_lanes(row, s, 1);
    else
        return _mm256_mul_ps(wsb, superblock_zeros<T>(row, s));
}

// Lanes 0-3 take lane 2j of v, lanes 4-7 lane 2j + 1: the scales of pair j's two blocks.
__attribute__((always_inline)) QF_AVX2 inline __m256 pair_lanes(__m256 v, uint64_t j) {
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

// Level types: the 16 levels as a byte table in each 128-bit lane, for vpshufb (a 4-bit index in
// each byte's low nibble, the high nibble masked off, picks its level).
template <QType T>
QF_AVX2 inline __m128i level_table(const Row& row) {
    if constexpr (Kind<T>::row_levels)
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.levels));
    else
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(qtype_traits(T).levels));
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
__attribute__((always_inline)) QF_AVX2 inline void int8_pair(const Row& row, uint64_t p, uint64_t j,
                                                             const __m256* cs,
                                                             const Int8Tokens<NT>& x, __m256* acc) {
    const uint8_t* codes = row.codes;
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // maddubs path only
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
#if QF_INT8_VNNI
            const __m256i s32 = _mm256_dpbusd_avx_epi32(
                _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, alo), hi, ahi);
#else
            const __m256i s16 =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
            const __m256i s32 = _mm256_madd_epi16(s16, ones);
#endif
            const __m256 sum = _mm256_cvtepi32_ps(s32);
            acc[t] = _mm256_fmadd_ps(pair_lanes(cs[t], j), sum, acc[t]);
        }
    } else {
        // Signed codes: |w| * (a with w's sign), at most 128 * 127 * 2 per int16 (code -128,
        // which GGUF Q8_0 and GPTQ 8-bit imports carry, is |w| = 128 as an unsigned byte).
        // Level types: the 4-bit split above, each nibble replaced by its level (|w| <= 127).
        __m256i wa, wb;
        if constexpr (Kind<T>::levels) {
            const __m256i m4 = _mm256_set1_epi8(0x0f);
            const __m256i table = _mm256_broadcastsi128_si256(level_table<T>(row));
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * p));
            wa = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4));
            wb = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        } else {
            const uint8_t* c = codes + 64 * p;
            wa = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(c + 32),
                                     reinterpret_cast<const __m128i*>(c));
            wb = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(c + 48),
                                     reinterpret_cast<const __m128i*>(c + 16));
        }
        const __m256i ua = _mm256_abs_epi8(wa), ub = _mm256_abs_epi8(wb);
        for (int t = 0; t < NT; ++t) {
            const __m256i alo =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 64 * p));
            const __m256i ahi =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 64 * p + 32));
#if QF_INT8_VNNI
            const __m256i s32 = _mm256_dpbusd_avx_epi32(
                _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ua, _mm256_sign_epi8(alo, wa)), ub,
                _mm256_sign_epi8(ahi, wb));
#else
            const __m256i sa =
                _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(alo, wa)), ones);
            const __m256i sb =
                _mm256_madd_epi16(_mm256_maddubs_epi16(ub, _mm256_sign_epi8(ahi, wb)), ones);
            const __m256i s32 = _mm256_add_epi32(sa, sb);
#endif
            const __m256 sum = _mm256_cvtepi32_ps(s32);
            acc[t] = _mm256_fmadd_ps(pair_lanes(cs[t], j), sum, acc[t]);
        }
    }
}

// A last odd block b (codes and activations in order) over all 8 lanes; cs[t]: its combined
// scale in every lane.
template <QType T, int NT>
__attribute__((always_inline)) QF_AVX2 inline void int8_single(const Row& row, uint64_t b,
                                                               const __m256* cs,
                                                               const Int8Tokens<NT>& x,
                                                               __m256* acc) {
    const uint8_t* codes = row.codes;
    [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // maddubs path only
    __m256i w;
    if constexpr (Kind<T>::q3) {
        w = q3_block_codes(codes, b);
    } else if constexpr (Kind<T>::q4) {
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b));
        w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
        if constexpr (Kind<T>::levels)
            w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(level_table<T>(row)), w);
    } else {
        w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * b));
    }
    for (int t = 0; t < NT; ++t) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 32 * b));
        const __m256i u = Kind<T>::unsigned_codes ? w : _mm256_abs_epi8(w);
        const __m256i v = Kind<T>::unsigned_codes ? a : _mm256_sign_epi8(a, w);
#if QF_INT8_VNNI
        const __m256i s32 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, v);
#else
        const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), ones);
#endif
        const __m256 sum = _mm256_cvtepi32_ps(s32);
        acc[t] = _mm256_fmadd_ps(cs[t], sum, acc[t]);
    }
}

// A row's last rest = blocks % 8 (> 0) blocks: their scales in tail[0 .. rest) and their offsets
// (block_offset) in tail[8 .. 8 + rest), the other lanes 0.
// The fp16 scales convert with F16C's vcvtph2ps (exact, as f16_to_f32; the software conversion's
// branches were 12% of a SmolLM2 decode at k = 576).
template <QType T>
QF_AVX2 inline void tail_vectors(const Row& row, uint64_t blocks, float* tail) {
    const uint64_t full = blocks / kSuper, rest = blocks - full * kSuper;
    for (uint64_t b = 0; b < rest; ++b) {
        const uint64_t block = full * kSuper + b;
        if constexpr (Kind<T>::super) {
            tail[b] = super_value(row, block, 0);
            tail[kSuper + b] = super_value(row, block, 1);
        } else {
            uint16_t h;
            std::memcpy(&h, row.scales + 2 * group_of_block<T>(block), 2);
            tail[b] = _cvtsh_ss(h);
            tail[kSuper + b] = tail[b] * static_cast<float>(block_zero<T>(row, block));
        }
    }
    for (uint64_t b = rest; b < kSuper; ++b) tail[b] = tail[kSuper + b] = 0.0f;
}

// The last rest = blocks % 8 (> 0) blocks of a row, after its `full` superblocks, into the same
// two accumulators: pairs, then a last odd block over all 8 lanes into acc[0]. The combined
// scales are the vector path's products (fp16 to float and scale * zero are exact; the
// activation scales are zero-padded to whole superblocks), so the lanes past the row are 0.
template <QType T, int NT>
__attribute__((always_inline)) QF_AVX2 inline void int8_rest(const Row& row,
                                                             const Int8Tokens<NT>& x,
                                                             uint64_t blocks,
                                                             __m256 (&acc)[2][NT]) {
    const uint64_t full = blocks / kSuper, rest = blocks - full * kSuper;
    prefetch_part(row, full);
    alignas(32) float own[2 * kSuper];
    const float* tail = row.tail;
    if (!tail) {
        tail_vectors<T>(row, blocks, own);
        tail = own;
    }
    if constexpr (Kind<T>::unsigned_codes) {
        const __m256 wz = _mm256_load_ps(tail + kSuper);
        for (int t = 0; t < NT; ++t)
            acc[0][t] = _mm256_fnmadd_ps(wz, _mm256_loadu_ps(x.sums[t] + kSuper * full), acc[0][t]);
    }
    const __m256 ws = _mm256_load_ps(tail);
    __m256 cs[NT];
    for (int t = 0; t < NT; ++t) cs[t] = _mm256_mul_ps(ws, _mm256_loadu_ps(x.d[t] + kSuper * full));
    // The pairs written out: constant accumulator indices keep acc in registers.
    const uint64_t p = kSuper / 2 * full, pairs = rest / 2;
    if (pairs > 0) int8_pair<T, NT>(row, p, 0, cs, x, acc[0]);
    if (pairs > 1) int8_pair<T, NT>(row, p + 1, 1, cs, x, acc[1]);
    if (pairs > 2) int8_pair<T, NT>(row, p + 2, 2, cs, x, acc[0]);
    if (rest % 2) {
        const __m256i last = _mm256_set1_epi32(static_cast<int>(rest - 1));
        for (int t = 0; t < NT; ++t) cs[t] = _mm256_permutevar8x32_ps(cs[t], last);
        int8_single<T, NT>(row, blocks - 1, cs, x, acc[0]);
    }
}

// Tokens [tok, tok + nt) of one row, nt < 2 NT, as tiles of NT, NT / 2, ..., 1 tokens (the
// binary digits of nt): each output is the same one sequence of operations whatever tile computes
// it, so the split changes no bit.
template <int NT, class Tile>
inline void run_token_tiles(const Row& row, const QActivations& a, uint64_t tok, uint64_t nt,
                            float* out, uint64_t ldo) {
    if (nt >= NT) {
        Tile::template run<NT>(row, a, tok, out, ldo);
        tok += NT;
        nt -= NT;
        out += NT * ldo;
    }
    if constexpr (NT > 1) run_token_tiles<NT / 2, Tile>(row, a, tok, nt, out, ldo);
}

// Rows [r0, r1) against tokens [t0, t1): Tile::run<NT>(row, a, tok, out, ldo) computes one row
// against NT tokens, NT a power of two up to Tile::kTokens (the level's token tile: as many
// tokens as its registers hold accumulators and scales for). Decode (one token) walks the rows;
// prefill keeps a tile of rows in L2 while every tile of tokens passes over it.
template <QType T, class Tile>
void qmatmul_rows(const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                  const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const QRowLayout l = *qtype_row_layout(T, a.k());
    // Row r, prefetching a row `ahead` while it is computed.
    Row proto{};
    // Rows are packed tight (any stride), so a row may start mid-line: one more line covers it.
    proto.lines = (l.row_bytes + 63) / 64 + (stride % 64 != 0);
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
        row.levels = reinterpret_cast<const int8_t*>(row.codes + l.levels_offset);
        row.ahead = r + ahead < r1 ? row.codes + ahead * stride : nullptr;
        return row;
    };
    const bool tails = a.mode() == QActivations::Mode::int8 && a.blocks() % kSuper != 0;
    if (t1 - t0 == 1) {
        // The next row's tail is gathered before this row runs: a tail gathered just before its
        // own row is read back while its scalar stores are still in flight (a failed store
        // forward, 14% of a SmolLM2 decode at k = 576).
        alignas(32) float next[2][2 * kSuper];
        if (tails && r0 < r1) tail_vectors<T>(row_at(r0), a.blocks(), next[0]);
        for (uint64_t r = r0; r < r1; ++r) {
            Row row = row_at(r);
            if (tails) {
                row.tail = next[(r - r0) % 2];
                if (r + 1 < r1) tail_vectors<T>(row_at(r + 1), a.blocks(), next[(r + 1 - r0) % 2]);
            }
            Tile::template run<1>(row, a, t0, out + (r - r0), ldo);
        }
        return;
    }
    // Prefill: a tile of rows stays in L2 while every tile of tokens passes over it, so each code
    // chunk is read from memory once and unpacked once per Tile::kTokens tokens.
    // A partial last superblock's scales and offsets are gathered once per row, not once per
    // tile of tokens: at k = 576 (18 blocks) gathering them per tile made a 1536 x 576, m = 128
    // product 1.17x (q8_g32) to 1.27x (q4s_g32) slower on AVX2, and q4k_g32 7x (its 6-bit
    // scales are decoded one by one).
    constexpr uint64_t tokens = Tile::kTokens;
    constexpr uint64_t kMaxTileRows = 512;
    const uint64_t rows_per_tile = std::clamp<uint64_t>(kRowTileBytes / stride, 1, kMaxTileRows);
    alignas(32) float tail[kMaxTileRows][2 * kSuper];
    for (uint64_t rb = r0; rb < r1; rb += rows_per_tile) {
        const uint64_t re = std::min(r1, rb + rows_per_tile);
        if (tails)
            for (uint64_t r = rb; r < re; ++r) tail_vectors<T>(row_at(r), a.blocks(), tail[r - rb]);
        for (uint64_t tt = t0; tt < t1; tt += tokens) {
            const uint64_t nt = std::min<uint64_t>(tokens, t1 - tt);
            float* o = out + (tt - t0) * ldo;
            for (uint64_t r = rb; r < re; ++r) {
                Row row = row_at(r);
                if (tails) row.tail = tail[r - rb];
                run_token_tiles<Tile::kTokens, Tile>(row, a, tt, nt, o + (r - r0), ldo);
            }
        }
    }
}

}  // namespace

}  // namespace qforge::detail

#endif
