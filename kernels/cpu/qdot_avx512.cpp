// AVX-512 F/BW/VL + VNNI products of quantized rows with int8 activations, computed 16 rows at a
// time with one row per 32-bit lane, so every output is the scalar reference's own sequence of
// roundings (qmatmul_scalar, int8 mode) and equals it bit for bit:
//
//   acc = 0; for each block b of 32 weights, in order:
//       isum = sum_i code_i q_i - zero * sum_i q_i           (an exact integer)
//       acc = acc + fl(fl(scale * d_b) * float(isum))       (two roundings and an add)
//       super-block types: acc = acc - fl(min * fl(d_b * float(sum_i q_i)))
//
// How a block's integer is formed (kernels/README.md, "avx512: one row per lane"):
//   - Repack. 16 rows' codes of one block are transposed so that vector j (j = 0..7) holds
//     weights 4j..4j+3 of each row in that row's lane: 4-bit types without a per-row table
//     transpose the packed bytes and then split nibbles, the others unpack each row to 32 bytes in
//     weight order (q3 bit planes, level tables, q8 bytes) and transpose those. Bytes become the
//     unsigned u = code - zero + 128 (signed codes and levels: code + 128); unsigned codes with
//     no stored zero (and stored-zero types for a few tokens) go in as they are.
//   - Products. vpdpbusd multiplies unsigned bytes (u) by signed ones (the token's int8
//     activations, 4 bytes broadcast to every lane) and adds each lane's four products into its
//     dword without saturation. Starting each lane from -128 sum_i q_i (raw codes: -zero sum_i
//     q_i, or 0 and the zero subtracted after conversion, exactly), eight vpdpbusd end on
//     sum_i (code_i - zero) q_i: the reference's integer. No partial sum can overflow:
//     |start| <= 128 * 32 * 127 and each step adds at most 4 * 255 * 127.
//   - Scales, zeros and super-block scales/mins of a whole chunk of 8 blocks come from each
//     row's values transposed to lanes; a partial last chunk, and types with one scale per row,
//     gather them (each gather reads a dword that ends inside the row, never past it).
// Rows are computed two groups (32 rows) at a time against tiles of 1, 2, 4 or 8 tokens: per
// token and block 16 vpdpbusd share two weight vectors, and each weight vector serves every token
// of the tile. Blocks go in chunks of 8: a chunk of 32 rows is repacked once (into 11 KiB that stay
// in L1) and then every token tile passes over it, its accumulators kept between chunks in a small
// buffer. One token (decode) takes no chunk buffer: 4-bit, 3-bit and level types send each
// block's vectors straight into vpdpbusd (fused_chunk_token), 8-bit types multiply each row in its
// own layout and reduce the lanes (q8_block_sums); on packed rows it reads two tiles side by side,
// one from each half of the call's range (packed_token). Since each lane is one
// row's own sequence of operations on the same exact integers, neither the tiles, the chunks, the
// path, the split of rows over threads nor prefill versus decode can change a bit.
// The bits also rest on -ffp-contract=off (kernels/CMakeLists.txt): GCC's vector multiply and
// add intrinsics are plain operators it would otherwise fuse. f32 mode and dequantize_rows stay
// AVX2's kernels.
#include "kernels/cpu/qdot_avx2.hpp"
#include "kernels/cpu/qpack.hpp"

#include <climits>
#include <utility>
#include <vector>

#include "kernels/cpu/qdot_avx512_blocks.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

namespace {

constexpr int kMaxTokens = 8;  // tokens per tile

// The transpose below leaves input row i in lane kFeed[i] (and kFeed is its own inverse), so
// feeding lane l's row as input kFeed[l] puts every row in its own lane.
constexpr int kFeed[kLanes] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

// v[j] lane l = dword j of rows[kFeed[l]] (16 rows of 8 dwords to 8 vectors of 16 lanes).
QF_AVX512 inline void transpose_rows(const __m256i (&rows)[kLanes], __m512i (&v)[8]) {
    __m512i z[8], a[8];
    // 128-bit lanes of z[i]: row i dwords 0-3, 4-7; row i + 8 dwords 0-3, 4-7.
    for (int i = 0; i < 8; ++i)
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(rows[i]), rows[i + 8], 1);
    for (int i = 0; i < 8; i += 2) {  // [r_i c0, r_i+1 c0, r_i c1, r_i+1 c1], [.. c2 .. c3]
        a[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        a[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    __m512i b[8];  // b[c + 4h]: column c (or c + 4 in the odd 128-bit lanes) of rows 4h .. 4h + 3
    for (int h = 0; h < 2; ++h) {
        b[4 * h + 0] = _mm512_unpacklo_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 1] = _mm512_unpackhi_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 2] = _mm512_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
        b[4 * h + 3] = _mm512_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
    }
    // 128-bit lanes of b[c]: rows 0-3 col c, rows 0-3 col c + 4, rows 8-11 col c, rows 8-11
    // col c + 4; of b[c + 4] the same for rows 4-7 and 12-15. Inputs in lane order 0-3, 8-11,
    // 4-7, 12-15: kFeed.
    for (int c = 0; c < 4; ++c) {
        v[c] = _mm512_shuffle_i32x4(b[c], b[c + 4], 0x88);      // lanes 0, 2 of each
        v[c + 4] = _mm512_shuffle_i32x4(b[c], b[c + 4], 0xdd);  // lanes 1, 3 of each
    }
}

// 16 rows of one type: lane l is row min(r0 + l, last).
template <QType T>
struct Group {
    const uint8_t* base;  // row r0
    const uint8_t* row[kLanes];
    __m512i offsets;  // each lane's row, in bytes from base
    __m128i table;    // level types with a table shared by all rows
};

template <QType T>
QF_AVX512 inline Group<T> make_group(const uint8_t* w, uint64_t stride, uint64_t r0,
                                     uint64_t last) {
    Group<T> g;
    g.base = w + r0 * stride;
    alignas(64) int32_t off[kLanes];
    for (uint64_t l = 0; l < kLanes; ++l) {
        const uint64_t r = std::min(r0 + l, last);
        g.row[l] = w + r * stride;
        off[l] = static_cast<int32_t>((r - r0) * stride);
    }
    g.offsets = _mm512_load_si512(off);
    if constexpr (Kind<T>::levels && !Kind<T>::row_levels)
        g.table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qtype_traits(T).levels));
    else
        g.table = _mm_setzero_si128();
    return g;
}

// Each lane's dword at byte `at` of its row.
template <QType T>
QF_AVX512 inline __m512i gather(const Group<T>& g, uint64_t at) {
    return _mm512_i32gather_epi32(g.offsets, g.base + at, 1);
}

// Block b's 32 raw codes of one row in weight order: unsigned codes (q4, q3), signed weights (q8)
// or levels (level types).
template <QType T>
QF_AVX512 inline __m256i block_codes(const uint8_t* row, const QRowLayout& l, __m128i table,
                                     uint64_t b) {
    if constexpr (Kind<T>::q3) {
        return q3_block_codes(row, b);
    } else if constexpr (Kind<T>::q4) {
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * b));
        const __m256i w =
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
        if constexpr (Kind<T>::row_levels)
            table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + l.levels_offset));
        if constexpr (Kind<T>::levels)
            return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), w);
        return w;
    } else {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * b));
    }
}

// Codes that enter vpdpbusd as they are (unsigned codes with no stored zero: q4s and the
// super-block types), their zero left to each sum's start; every other type's bytes are biased
// to u = code - zero + 128 and each sum starts from -128 sum q.
template <QType T>
constexpr bool kRawCodes = Kind<T>::unsigned_codes && !Kind<T>::zero_stored;
template <QType T>
constexpr int32_t kStartZero = kRawCodes<T> ? Kind<T>::implicit_zero : 128;
// Whether a chunk's code vectors get their byte bias added before the products of several tokens:
// never raw codes; stored zeros when the chunk is biased (kRawZeroTokens), implicit ones always.
template <QType T>
constexpr bool adds_bias(bool biased) {
    return !kRawCodes<T> && (biased || !Kind<T>::zero_stored);
}

// Types with stored zeros: the products of a few tokens take the codes as they are and subtract
// zero * sum q from each converted sum (both are integers below 2^24, so the float result is the
// same exact integer); more tokens take biased codes (an add per code vector, paid once for all
// tokens, against a multiply-add per token and block).
constexpr uint64_t kRawZeroTokens = 4;

// v[j] lane l = dword j of the 16 bytes at rows[l] + at: a 4 x 4 dword transpose in each 128-bit
// lane (rows 4L .. 4L + 3 in lane L), rows in lane order.
QF_AVX512 inline void transpose_dwords(const uint8_t* const (&rows)[kLanes], uint64_t at,
                                       __m512i (&v)[4]) {
    __m512i z[4];
    for (int i = 0; i < 4; ++i) {
        auto row = [&](int lane) {
            return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i + 4 * lane] + at));
        };
        z[i] = _mm512_castsi128_si512(row(0));
        z[i] = _mm512_inserti32x4(z[i], row(1), 1);
        z[i] = _mm512_inserti32x4(z[i], row(2), 2);
        z[i] = _mm512_inserti32x4(z[i], row(3), 3);
    }
    const __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(z[2], z[3]), a3 = _mm512_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm512_unpacklo_epi64(a0, a2);
    v[1] = _mm512_unpackhi_epi64(a0, a2);
    v[2] = _mm512_unpacklo_epi64(a1, a3);
    v[3] = _mm512_unpackhi_epi64(a1, a3);
}

// A whole chunk's (8 blocks, one superblock) scales, mins and zero biases of group g, one 16-lane
// vector per block. Super-block types transpose the 16 records and cut each block's 6-bit scale
// and min out of them (q4k_g32 one-token products in L2: 1.7x faster than the route below);
// the others take each row's 8 values as one 8-lane vector (qdot_x86.hpp's superblock helpers,
// the AVX2 kernel's) and transpose those, cheaper than 8 rounds of gathers (1.4x).
template <QType T>
QF_AVX512 inline void chunk_meta(const Group<T>& g, const QRowLayout& l, uint64_t s, PackedBlock* p,
                                 uint64_t p_stride, __m512i (&bias)[kChunkBlocks]) {
    if constexpr (Kind<T>::super) {
        __m512i v[4];
        transpose_dwords(g.row, l.scales_offset + sizeof(QSuperRecord) * s, v);
        super_meta(v, kChunkBlocks, p, p_stride);
        return;
    }
    __m256i scale_rows[kLanes], other_rows[kLanes];  // other: zeros (floats)
    for (uint64_t i = 0; i < kLanes; ++i) {
        Row row{};
        row.codes = g.row[kFeed[i]];
        row.scales = row.codes + l.scales_offset;
        row.zeros = row.codes + l.zeros_offset;
        scale_rows[i] = _mm256_castps_si256(superblock_scales<T>(row, s));
        if constexpr (Kind<T>::zero_stored)
            other_rows[i] = _mm256_castps_si256(superblock_zeros<T>(row, s));
    }
    __m512i v[8];
    transpose_rows(scale_rows, v);
    for (uint64_t b = 0; b < kChunkBlocks; ++b) p[b * p_stride].scale = _mm512_castsi512_ps(v[b]);
    if constexpr (Kind<T>::zero_stored) {
        transpose_rows(other_rows, v);
        for (uint64_t b = 0; b < kChunkBlocks; ++b) {
            p[b * p_stride].zero = _mm512_castsi512_ps(v[b]);
            bias[b] = zero_bias(_mm512_cvtps_epi32(p[b * p_stride].zero));
        }
    }
}

// Lines [first, first + count) of the `bytes` bytes from p (counting the line its last byte
// may spill into), into L1. Always inlined: GCC treats a function whose only effect is a
// prefetch as const and deletes calls to it.
__attribute__((always_inline)) QF_AVX512 inline void prefetch_lines(const uint8_t* p,
                                                                    uint64_t bytes, uint64_t first,
                                                                    uint64_t count) {
    const uint64_t lines = bytes == 0 ? 0 : bytes / 64 + 1;
    for (uint64_t j = first; j < lines && j - first < count; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(p + 64 * j), _MM_HINT_T0);
}

// Lines [0, lines) from p, prefetched into L1 in `parts` even portions, portion i at a time:
// spread over a chunk's work instead of issued at its start, where a burst of misses filled the
// miss buffers and stalled the prefetch instructions themselves (kPackedAhead).
// Portions of ceil(lines / parts) lines (the last ones shorter or empty): one division per
// chunk, where two per portion (per block, at one token) cost 7% of a one-token product's time.
struct Prefetch {
    const uint8_t* p = nullptr;
    uint64_t lines = 0;
    uint64_t per = 0;
    Prefetch() = default;
    Prefetch(const uint8_t* at, uint64_t n, uint64_t parts)
        : p(at), lines(n), per((n + parts - 1) / parts) {}
    QF_AVX512 void portion(uint64_t i) const {
        for (uint64_t l = i * per, e = std::min(lines, l + per); l < e; ++l)
            _mm_prefetch(reinterpret_cast<const char*>(p + 64 * l), _MM_HINT_T0);
    }
};

// Per lane: the fp16 at byte `at` of its row (read as the high half of the dword ending there).
template <QType T>
QF_AVX512 inline __m512 gather_half(const Group<T>& g, uint64_t at) {
    const __m512i x = _mm512_srli_epi32(gather(g, at - 2), 16);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x));
}

// Block b of group g into p. The scales (and zeros) of a weight group are gathered when b starts
// it; `scale` and `bias` keep them for its later blocks.
// Block b's codes of the 16 rows of g, transposed (header comment), before the bias.
template <QType T>
QF_AVX512 inline void block_vectors(const Group<T>& g, const QRowLayout& l, uint64_t b,
                                    __m512i (&u)[8]) {
    if constexpr (Kind<T>::q4 && !Kind<T>::row_levels) {
        // 4-bit codes with no per-row table: the 16 bytes of each row hold weight i in byte i's
        // low nibble and i + 16 in its high one, so dword j holds weights 4j..4j+3 and
        // 16+4j..16+4j+3. Transposing the packed dwords (a 4 x 4 transpose in each 128-bit lane,
        // rows 4L..4L+3 in lane L) and then splitting nibbles costs less than half of unpacking
        // each row first (in-cache decode: kernels/README.md).
        __m512i v[4];
        transpose_dwords(g.row, 16 * b, v);
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        for (int j = 0; j < 4; ++j) {
            u[j] = _mm512_and_si512(v[j], m4);
            u[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m4);
        }
        if constexpr (Kind<T>::levels) {
            const __m512i table = _mm512_broadcast_i32x4(g.table);
            for (auto& x : u) x = _mm512_shuffle_epi8(table, x);
        }
    } else {
        __m256i rows[kLanes];
        for (uint64_t i = 0; i < kLanes; ++i)
            rows[i] = block_codes<T>(g.row[kFeed[i]], l, g.table, b);
        transpose_rows(rows, u);
    }
}

// The scales (mins, zero biases) of block b of group g, gathered lane by lane: a partial last
// chunk's blocks (chunk_meta reads whole superblocks). A weight group's are gathered at its first
// block or the chunk's (`first`); `scale` and `bias` keep them for its later blocks.
template <QType T>
QF_AVX512 inline void gather_meta(const Group<T>& g, const QRowLayout& l, uint64_t b, bool first,
                                  PackedBlock& p, __m512& scale, __m512& zero, __m512i& bias) {
    if constexpr (Kind<T>::super) {
        // The record of superblock b / 8 (QSuperRecord): d and dmin, then 12 bits per block.
        const uint64_t rec = l.scales_offset + sizeof(QSuperRecord) * (b / kSuper);
        const __m512i dd = gather(g, rec);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        const uint64_t bit = 12 * (b % kSuper), at = 4 + bit / 8;
        // The 16-bit window at byte `at` is the high half of the dword ending there.
        const __m512i v =
            _mm512_srli_epi32(gather(g, rec + at - 2), static_cast<unsigned>(16 + bit % 8));
        const __m512i m6 = _mm512_set1_epi32(63);
        p.scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(v, m6)));
        p.min =
            _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 6), m6)));
    } else {
        constexpr uint64_t gb = Kind<T>::group_blocks;
        if (first || (gb != 0 && b % gb == 0)) {
            const uint64_t grp = group_of_block<T>(b);
            scale = gather_half(g, l.scales_offset + 2 * grp);
            if constexpr (Kind<T>::zero_stored) {
                // The zero is the top byte of the dword ending at it.
                const __m512i z = _mm512_srli_epi32(gather(g, l.zeros_offset + grp - 3), 24);
                zero = _mm512_cvtepi32_ps(z);
                bias = zero_bias(z);
            }
        }
        p.scale = scale;
        p.zero = zero;
    }
}

// acc + the products of w's unsigned bytes with the 4 signed bytes at `four`, broadcast to every
// lane: vpdpbusd with an embedded broadcast, the broadcast done by the load. GCC emits a
// separate vpbroadcastd per dword instead, an operation on the vector pipes the products share:
// the tile's loop from L1, 16 tokens, Zen 4: 112-124 -> 126-134 GMAC/s.
QF_AVX512 inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t* four) {
    asm("vpdpbusd %2%{1to16%}, %1, %0"
        : "+v"(acc)
        : "v"(w), "m"(*reinterpret_cast<const int32_t*>(four)));
    return acc;
}

// Blocks [b0, b0 + nb) of the packed chunk against NT tokens from tok: acc[t][g] holds the
// running sums of token t's lanes of group g. pf's (if any) portion part + i before block i.
template <QType T, int NT, bool Biased, class Codes>
QF_AVX512 inline void chunk_tokens(const PackedBlock (*pk)[kGroups], const Codes& codes,
                                   uint64_t b0, uint64_t nb, const QActivations& a, uint64_t tok,
                                   __m512 (&acc)[NT][kGroups], const Prefetch* pf, uint64_t part) {
    constexpr int32_t zero = Kind<T>::zero_stored ? (Biased ? 128 : 0) : kStartZero<T>;
    for (uint64_t i = 0; i < nb; ++i) {
        if (pf)
            for (uint64_t g = 0; g < kGroups; ++g) pf[g].portion(part + i);
        const uint64_t b = b0 + i;
        __m512i isum[NT][kGroups];
        const int8_t* x[NT];
        for (int t = 0; t < NT; ++t) {
            const __m512i start = _mm512_set1_epi32(-zero * a.sums(tok + t)[b]);
            for (uint64_t g = 0; g < kGroups; ++g) isum[t][g] = start;
            x[t] = a.codes(tok + t) + kBlock * b;
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m512i w0 = codes(i, 0, j);
            const __m512i w1 = codes(i, 1, j);
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t) {  // activations 4j .. 4j + 3 of the block
                isum[t][0] = dpbusd_broadcast(isum[t][0], w0, x[t] + 4 * j);
                isum[t][1] = dpbusd_broadcast(isum[t][1], w1, x[t] + 4 * j);
            }
        }
        for (int t = 0; t < NT; ++t) {
            const __m512 d = _mm512_set1_ps(a.scales(tok + t)[b]);
            const __m512 qsum = _mm512_set1_ps(static_cast<float>(a.sums(tok + t)[b]));
            const __m512 ds = _mm512_set1_ps(a.scaled_sums(tok + t)[b]);
            for (uint64_t g = 0; g < kGroups; ++g)
                acc[t][g] = block_step<T, !Biased>(acc[t][g], isum[t][g], pk[i][g], d, qsum, ds);
        }
    }
}

// 8-bit types, one token: the integer sums sum_i (w_i + 128) q_i of blocks b and, when `two`,
// b + 1 of g's 16 rows, row l in lane l, without the repack. Each row's 64 bytes (w XOR 0x80)
// meet the token's 64 in one vpdpbusd, and the 16 rows' 16 lanes are reduced by a tree of
// unpacks, lane shuffles and adds: 44 operations per 16 rows and 2 blocks, against 32 shuffles per
// block for the transpose (q8 decode in L2: kernels/README.md). The same exact integers, so the
// same bits.
template <QType T>
QF_AVX512 inline void q8_block_sums(const Group<T>& g, uint64_t b, bool two, __m512i x, __m512i& sb,
                                    __m512i& sb1) {
    const __mmask64 m = two ? ~__mmask64{0} : __mmask64{0xffffffffu};
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i r[kLanes];
    for (uint64_t i = 0; i < kLanes; ++i) {
        const __m512i w = _mm512_maskz_loadu_epi8(m, g.row[i] + kBlock * b);
        r[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w, flip), x);
    }
    // Per 128-bit lane L (a quarter: L0, L1 block b's halves, L2, L3 block b + 1's), rows 2p and
    // 2p + 1: [2p: 0 + 2, 2p + 1: 0 + 2, 2p: 1 + 3, 2p + 1: 1 + 3].
    __m512i s2[8];
    for (int p = 0; p < 8; ++p)
        s2[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]),
                                 _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]));
    // Rows 4q .. 4q + 3, each its quarter's sum, in lane order.
    __m512i s4[4];
    for (int q = 0; q < 4; ++q)
        s4[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(s2[2 * q], s2[2 * q + 1]),
                                 _mm512_unpackhi_epi64(s2[2 * q], s2[2 * q + 1]));
    // [rows 4q..: b, rows 4q..: b + 1, rows 4q + 4..: b, rows 4q + 4..: b + 1]
    __m512i f[2];
    for (int h = 0; h < 2; ++h)
        f[h] = _mm512_add_epi32(_mm512_shuffle_i32x4(s4[2 * h], s4[2 * h + 1], 0x88),
                                _mm512_shuffle_i32x4(s4[2 * h], s4[2 * h + 1], 0xdd));
    const __m512i f0 = f[0], f1 = f[1];
    sb = _mm512_shuffle_i32x4(f0, f1, 0x88);
    sb1 = _mm512_shuffle_i32x4(f0, f1, 0xdd);
}

// 8-bit types, one token: blocks [b0, b0 + nb) of the chunk (scales in pk) added into sums.
template <QType T>
QF_AVX512 void q8_chunk_token(const Group<T> (&groups)[kGroups], const PackedBlock (*pk)[kGroups],
                              uint64_t b0, uint64_t nb, const QActivations& a, uint64_t tok,
                              __m512* sums, uint64_t ng) {
    __m512 acc[kGroups];
    for (uint64_t g = 0; g < ng; ++g) acc[g] = _mm512_load_ps(&sums[g]);
    for (uint64_t i = 0; i < nb; i += 2) {
        const uint64_t b = b0 + i;
        const bool two = i + 1 < nb;
        const __m512i x = _mm512_maskz_loadu_epi8(two ? ~__mmask64{0} : __mmask64{0xffffffffu},
                                                  a.codes(tok) + kBlock * b);
        __m512i isum[2][kGroups];
        for (uint64_t g = 0; g < ng; ++g)
            q8_block_sums<T>(groups[g], b, two, x, isum[0][g], isum[1][g]);
        for (uint64_t h = 0; h < (two ? 2u : 1u); ++h) {
            const __m512i start = _mm512_set1_epi32(-128 * a.sums(tok)[b + h]);
            const __m512 d = _mm512_set1_ps(a.scales(tok)[b + h]);
            for (uint64_t g = 0; g < ng; ++g)
                acc[g] = block_step<T, false>(acc[g], _mm512_add_epi32(isum[h][g], start),
                                              pk[i + h][g], d, _mm512_setzero_ps(),
                                              _mm512_setzero_ps());  // no zeros, no mins
        }
    }
    for (uint64_t g = 0; g < ng; ++g) _mm512_store_ps(&sums[g], acc[g]);
}

// One token without the chunk buffer: each block's vectors go straight into vpdpbusd, from
// vectors(g, i, u) (block b0 + i of group g). At one token the repack has no tokens to share it,
// and storing and reloading its vectors cost a fifth of the time (TinyLlama-shape decode). Rows in
// their own layout take this for 4-bit, 3-bit and level types (8-bit types: q8_chunk_token);
// packed rows for every type.
template <QType T, class Vectors>
QF_AVX512 void fused_chunk_token(Vectors&& vectors, const PackedBlock (*pk)[kGroups], uint64_t b0,
                                 uint64_t nb, const QActivations& a, uint64_t tok, __m512* sums,
                                 uint64_t ng, const Prefetch (&pf)[kGroups] = {}) {
    // One token: stored zeros are subtracted as floats (kRawZeroTokens), so only the level types'
    // signed bytes need a bias.
    constexpr bool flip = !kRawCodes<T> && !Kind<T>::zero_stored;
    constexpr int32_t start_zero = Kind<T>::zero_stored ? 0 : kStartZero<T>;
    __m512 acc[kGroups];
    for (uint64_t g = 0; g < ng; ++g) acc[g] = _mm512_load_ps(&sums[g]);
    for (uint64_t i = 0; i < nb; ++i) {
        for (const auto& f : pf) f.portion(i);
        const uint64_t b = b0 + i;
        const int8_t* x = a.codes(tok) + kBlock * b;
        const __m512i start = _mm512_set1_epi32(-start_zero * a.sums(tok)[b]);
        const __m512 d = _mm512_set1_ps(a.scales(tok)[b]);
        const __m512 qsum = _mm512_set1_ps(static_cast<float>(a.sums(tok)[b]));
        const __m512 ds = _mm512_set1_ps(a.scaled_sums(tok)[b]);
        for (uint64_t g = 0; g < ng; ++g) {
            __m512i u[8];
            vectors(g, i, u);
            // Two chains of four vpdpbusd (one of eight waited on its latency), added at the end.
            __m512i part[2] = {start, _mm512_setzero_si512()};
            for (int j = 0; j < 8; ++j) {
                int32_t four;
                std::memcpy(&four, x + 4 * j, 4);
                const __m512i w =
                    flip ? _mm512_xor_si512(u[j], _mm512_set1_epi8(static_cast<char>(0x80))) : u[j];
                part[j % 2] = _mm512_dpbusd_epi32(part[j % 2], w, _mm512_set1_epi32(four));
            }
            const __m512i isum = _mm512_add_epi32(part[0], part[1]);
            acc[g] = block_step<T, true>(acc[g], isum, pk[i][g], d, qsum, ds);
        }
    }
    for (uint64_t g = 0; g < ng; ++g) _mm512_store_ps(&sums[g], acc[g]);
}

// Block i's code vector j of group g, as chunk_tokens multiplies it: from the chunk buffer.
struct BufferedCodes {
    const PackedBlock (*pk)[kGroups];
    QF_AVX512 __m512i operator()(uint64_t i, uint64_t g, int j) const {
        return _mm512_load_si512(&pk[i][g].u[j]);
    }
};

// A tile of NT tokens over one chunk: the running sums from (and back to) sums[t][g], from zero
// at a row's first chunk (b0 = 0).
template <QType T, int NT, bool Biased, class Codes>
QF_AVX512 void chunk_tile(const PackedBlock (*pk)[kGroups], const Codes& codes, uint64_t b0,
                          uint64_t nb, const QActivations& a, uint64_t tok, __m512* sums,
                          const Prefetch* pf, uint64_t part) {
    __m512 acc[NT][kGroups];
    for (int t = 0; t < NT; ++t)
        for (uint64_t g = 0; g < kGroups; ++g)
            acc[t][g] = b0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(&sums[kGroups * t + g]);
    chunk_tokens<T, NT, Biased>(pk, codes, b0, nb, a, tok, acc, pf, part);
    for (int t = 0; t < NT; ++t)
        for (uint64_t g = 0; g < kGroups; ++g) _mm512_store_ps(&sums[kGroups * t + g], acc[t][g]);
}

// The tiles token_tiles splits n tokens into.
constexpr uint64_t token_tile_count(uint64_t n) {
    return n / kMaxTokens + (n % kMaxTokens) / 4 + (n % 4) / 2 + n % 2;
}

// The token tiles over whose blocks a chunk's prefetches are spread (prefetch_parts): enough to
// issue them a few lines at a time; past them, tiles of many tokens skip the calls.
constexpr uint64_t kPrefetchTiles = 4;
constexpr uint64_t prefetch_parts(uint64_t n, uint64_t nb) {
    return std::min(token_tile_count(n), kPrefetchTiles) * nb;
}

// Every token of [t0, t0 + n) over one chunk, in tiles of 8, 4, 2 and 1; pf's portion
// i * nb + j before block j of tile i < kPrefetchTiles (pf's parts: prefetch_parts(n, nb)).
template <QType T, bool Biased, class Codes>
QF_AVX512 void token_tiles(const PackedBlock (*pk)[kGroups], const Codes& codes, uint64_t b0,
                           uint64_t nb, const QActivations& a, uint64_t t0, uint64_t n,
                           __m512* sums, const Prefetch (&pf)[kGroups] = {}) {
    // Tile i's prefetch (none past kPrefetchTiles) and its first portion.
    auto pf_of = [&](uint64_t i) { return i < kPrefetchTiles && pf[0].lines ? pf : nullptr; };
    uint64_t t = 0, i = 0;
    for (; t + kMaxTokens <= n; t += kMaxTokens, ++i)
        chunk_tile<T, kMaxTokens, Biased>(pk, codes, b0, nb, a, t0 + t, sums + kGroups * t,
                                          pf_of(i), i * nb);
    if (n - t >= 4) {
        chunk_tile<T, 4, Biased>(pk, codes, b0, nb, a, t0 + t, sums + kGroups * t, pf_of(i),
                                 i * nb);
        t += 4;
        ++i;
    }
    if (n - t >= 2) {
        chunk_tile<T, 2, Biased>(pk, codes, b0, nb, a, t0 + t, sums + kGroups * t, pf_of(i),
                                 i * nb);
        t += 2;
        ++i;
    }
    if (n - t >= 1)
        chunk_tile<T, 1, Biased>(pk, codes, b0, nb, a, t0 + t, sums + kGroups * t, pf_of(i),
                                 i * nb);
}

template <QType T>
QF_AVX512 void int8_rows(const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                         const QActivations& a, uint64_t t0, uint64_t t1, float* out,
                         uint64_t ldo) {
    const QRowLayout l = *qtype_row_layout(T, a.k());
    const uint64_t blocks = a.blocks(), n = t1 - t0;
    // Running sums per token and group, and one chunk of repacked blocks (per thread).
    __m512* sums = token_sums(n);
    alignas(64) PackedBlock pk[kChunkBlocks][kGroups];
    const bool biased = n > kRawZeroTokens;
    const bool direct = n == 1;  // q8_chunk_token or fused_chunk_token, no chunk buffer
    // Prefetching, into L1: the first rows of the call at once, and while each 16 or 32 rows are
    // computed the next as many, evenly over the blocks. They are one stretch of memory read a
    // few bytes per row at a time, which loses the hardware prefetcher (SmolLM2 q4_g128 decode, 2
    // threads: 127 tok/s without either, 281 with the second alone, 351 with both). Into L2
    // instead: 0.95x there, and 0.9x to 0.96x for one-token products from DRAM at 2048x5632 and
    // 4096x14336 (q4s_g32, q8_g32; one thread).
    // One token takes one group (16 rows) at a time: half as many rows streamed at once
    // (TinyLlama-shape q4_g32 decode 1.2x to 1.35x faster than two groups, SmolLM2 1.03x to 1.4x).
    const uint64_t ng = direct ? 1 : kGroups, span = ng * kLanes;
    prefetch_lines(w + r0 * stride, (std::min(r1, r0 + span) - r0) * stride, 0, ~0ull);
    for (uint64_t rg = r0; rg < r1; rg += span) {
        Group<T> groups[kGroups];
        for (uint64_t g = 0; g < ng; ++g)
            groups[g] = make_group<T>(w, stride, std::min(rg + g * kLanes, r1 - 1), r1 - 1);
        for (uint64_t i = 0; i < n * kGroups; ++i) sums[i] = _mm512_setzero_ps();
        __m512 scale[kGroups] = {}, zero[kGroups] = {};
        __m512i bias[kGroups];
        for (auto& bv : bias)
            bv = _mm512_set1_epi8(static_cast<char>(128 - Kind<T>::implicit_zero));
        const uint64_t next = std::min(r1, rg + span);
        const uint64_t ahead_bytes = (std::min(r1, next + span) - next) * stride;
        const uint64_t per_block = (ahead_bytes / 64 + 1 + blocks - 1) / blocks;
        for (uint64_t b0 = 0; b0 < blocks; b0 += kChunkBlocks) {
            const uint64_t nb = std::min(kChunkBlocks, blocks - b0);
            // Metadata first. Whole chunks read it per row and transpose it; a partial last one,
            // and types with one scale per row, gather it.
            const bool whole = nb == kChunkBlocks && (Kind<T>::super || Kind<T>::group_blocks);
            __m512i chunk_bias[kGroups][kChunkBlocks];
            for (uint64_t g = 0; g < ng; ++g) {
                for (auto& cb : chunk_bias[g]) cb = bias[g];
                if (whole)
                    chunk_meta<T>(groups[g], l, b0 / kChunkBlocks, &pk[0][g], kGroups,
                                  chunk_bias[g]);
                else
                    for (uint64_t i = 0; i < nb; ++i) {
                        gather_meta<T>(groups[g], l, b0 + i, i == 0, pk[i][g], scale[g], zero[g],
                                       bias[g]);
                        chunk_bias[g][i] = bias[g];
                    }
            }
            const bool chunk_biased = biased && zeros_biasable<T>(pk, nb, ng);
            for (uint64_t i = 0; i < nb; ++i) {
                const uint64_t b = b0 + i;
                prefetch_lines(w + next * stride, ahead_bytes, b * per_block, per_block);
                if (direct) continue;
                for (uint64_t g = 0; g < ng; ++g) {
                    block_vectors<T>(groups[g], l, b, pk[i][g].u);
                    if (adds_bias<T>(chunk_biased))
                        for (auto& u : pk[i][g].u) u = _mm512_add_epi8(u, chunk_bias[g][i]);
                }
            }
            if (direct) {
                if constexpr (Kind<T>::q8)
                    q8_chunk_token<T>(groups, pk, b0, nb, a, t0, sums, ng);
                else
                    fused_chunk_token<T>(
                        [&](uint64_t g, uint64_t i, __m512i(&u)[8]) {
                            block_vectors<T>(groups[g], l, b0 + i, u);
                        },
                        pk, b0, nb, a, t0, sums, ng);
            } else if (chunk_biased) {
                token_tiles<T, true>(pk, BufferedCodes{pk}, b0, nb, a, t0, n, sums);
            } else {
                token_tiles<T, false>(pk, BufferedCodes{pk}, b0, nb, a, t0, n, sums);
            }
        }
        store_lanes(sums, ng, rg, r0, r1, n, out, ldo);
    }
}

template <QType T>
void qmatmul_t(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
               const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    if (a.mode() != QActivations::Mode::int8)  // f32 mode: AVX2's kernel (header comment)
        return avx2_kernels()[static_cast<size_t>(T)].qmatmul(t, w, stride, r0, r1, a, t0, t1, out,
                                                              ldo);
    // Lanes address their rows by int32 byte offsets from a group's first row (the gathers):
    // rows longer than that allows (k in the hundreds of millions) take the scalar reference,
    // whose bits these are anyway.
    if ((kLanes - 1) * stride > static_cast<uint64_t>(INT32_MAX))
        return qmatmul_scalar(t, w, stride, r0, r1, a, t0, t1, out, ldo);
    int8_rows<T>(w, stride, r0, r1, a, t0, t1, out, ldo);
}

// ---- Packed rows (kernels/cpu/qpack.hpp) ----
// The same products on rows repacked at load: a block's vectors are loaded (4-bit: and split
// into nibbles) instead of gathered from 16 rows and transposed, and the scales and zeros come
// as 16-lane vectors; several tokens' tiles split the codes themselves (RegisterCodes, below; the
// level types above 16 tokens read them from the chunk buffer). Everything after (the token
// tiles, fused_chunk_token for one token, block_step) is the row layout's, so the bits are
// qmatmul_scalar's too.

// How far ahead of each chunk the packed kernel prefetches, into L1. A tile is one stream of
// bytes (and a thread's tiles follow each other), but the hardware prefetcher alone left the
// one-token product waiting on its loads: TinyLlama-shape q4s_g32 decode 36 tok/s without this,
// 57-67 with it, where the row layout's kernel ran 48-53 (2 threads, alternating; 2, 8, 12 and
// 16 KiB and prefetching into L2 measured no better within the host's noise).
// Each chunk's lines are issued in portions, one before each block of the first kPrefetchTiles
// token tiles (ceil(lines / parts) lines each, until the chunk's run out: at 16 tokens 2 per
// group for q4_g128, 3 for q8), not all at its start (Prefetch): at 16 tokens a burst of 66
// prefetches stalled on the full miss buffers, 17% of a 16-stream serve profile (Zen 4), and
// portions of ~9 lines per group (q4_g128), one per token tile, still left the products of 16
// tokens from DRAM 20-30% below their speed from L3 (per block: 2048x5632 m:16 1.13-1.42x,
// kernels/README.md "Prefetch per block").
constexpr uint64_t kPackedAhead = 4096;
// One token on CPUs other than AMD's: 1 KiB ahead (Intel Xeon, TinyLlama-shape q4s_g32 decode,
// two streams: 42.8-43.2 tok/s at 1 KiB, 40.9-41.7 at 2 KiB; one stream 25-26 at 4 KiB against
// 34-35 at 1-2 KiB).
constexpr uint64_t kTokenAhead = 1024;
// Several tokens on rows whose pair of tiles is at most kPairAheadMax bytes (k up to ~850 at 4
// bits: SmolLM2's q, k, v, o, gate and up) prefetch each chunk of the next pair, 2 tiles on: 4 KiB
// on lands in the pair's other tile, already on its way, and the next pair's second tile went
// unfetched until its loads. 16 tokens from DRAM, 2 threads, alternating: q4_g128 1536x576
// 1.05x, 576x576 1.08x (from L3 0.97-1.01x); engine 16 sequences 1.045x (6 rounds).
constexpr uint64_t kPairAheadMax = 16384;
inline uint64_t packed_ahead(const QPackLayout& pl, bool one_token) {
    if (one_token) return cpu_is_amd() ? kPackedAhead : kTokenAhead;
    return 2 * pl.tile_bytes <= kPairAheadMax ? 2 * pl.tile_bytes : kPackedAhead;
}

// Chunk c of a packed tile opened for one of the kGroups tiles a loop multiplies side by side:
// its blocks' meta unpacked into the chunk buffer's column p (biases into `bias`), its lines'
// prefetch set up in `parts` portions; returns where its codes start. One token (OneToken) takes
// the unbiased meta and its own prefetch distance.
template <QType T, bool OneToken>
QF_AVX512 inline const uint8_t* open_chunk(const uint8_t* tile, const QPackLayout& pl, uint64_t c,
                                           uint64_t nb, const GroupMeta& row, PackedBlock* p,
                                           __m512i (&bias)[kChunkBlocks], Prefetch& pf,
                                           uint64_t parts) {
    const uint8_t* chunk = tile + pl.header + c * pl.chunk_bytes;
    pf = {chunk + packed_ahead(pl, OneToken), pl.chunk_bytes / 64 + 1, parts};
    packed_chunk_meta<T, !OneToken>(chunk, pl, nb, row, p, kGroups, bias);
    return chunk + pl.meta_bytes(nb);
}

// Block i's code vector j of group g straight from the packed codes, split (and biased, as the
// chunk buffer's are) in registers by every token tile, instead of once per chunk into the chunk
// buffer: the buffer's stores and reloads cost more than the repeated splitting. 2048x5632
// products, 2 threads, from DRAM (qforge_kernels_bench, alternating), 16 tokens: q4_g32/g64/g128
// 1.16-1.22x, q8/q8_g32/q8_g128 1.18-1.21x, q4s_* 1.18-1.20x, q4k_g32 1.20x, q4nl_g32 1.04x;
// 32 tokens 1.07-1.26x; 128 tokens 1.03-1.08x, but the level types' table lookup per vector
// (q4nl_g32 0.96x), so those take the buffer above kLevelRegisterTokens.
constexpr uint64_t kLevelRegisterTokens = 16;
template <QType T, bool Biased>
struct RegisterCodes {
    const uint8_t* const (&codes)[kGroups];
    uint64_t block_bytes;
    __m128i table;
    const __m512i (*bias)[kGroups][kChunkBlocks];
    static constexpr bool kAdd = adds_bias<T>(Biased);
    QF_AVX512 __m512i operator()(uint64_t i, uint64_t g, int j) const {
        const __m512i u = packed_vector<T>(codes[g] + i * block_bytes, table, j);
        return kAdd ? _mm512_add_epi8(u, (*bias)[g][i]) : u;
    }
};

// One token (decode): the call's tiles as two runs, its first and second half, one tile of each
// multiplied side by side, so the bytes arrive in two streams: the memory system's prefetchers
// keep more lines in flight for two streams than for one (Intel Xeon, 2 threads: a float sum
// over 1 GiB read 21-25 GB/s as one stream a thread, 28-29 as four; TinyLlama-shape q4s_g32
// decode 34 -> 42-43 tok/s, kernels/README.md "Decode: two streams"); on AMD CPUs one run.
// Each tile takes the one-token path (fused_chunk_token) on its own, so the bits are unchanged.
template <QType T>
QF_AVX512 void packed_token(const QPackedRows& m, uint64_t r0, uint64_t r1, const QActivations& a,
                            uint64_t tok, float* out, uint64_t ldo) {
    const QPackLayout& pl = m.layout();
    __m128i table = _mm_setzero_si128();
    if constexpr (Kind<T>::levels)
        table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qtype_traits(T).levels));
    alignas(64) PackedBlock pk[kChunkBlocks][kGroups];
    const uint64_t first = r0 / kLanes, last = (r1 - 1) / kLanes;
    // Tiles of the first run; the second: the rest. On AMD one run: on the Zen 4 two streams
    // measured slower (TinyLlama-shape q8_g32 decode, whose k > 1536 rows take this kernel there,
    // 25.9 -> 27.8 tok/s with one run, medians of 6 alternating rounds, one run faster in each).
    const uint64_t half = cpu_is_amd() ? last - first + 1 : (last - first + 2) / 2;
    for (uint64_t j = 0; j < half; ++j) {
        const uint64_t index[kGroups] = {first + j, first + half + j};
        const uint64_t ng = index[1] <= last ? 2 : 1;
        const uint8_t* tile[kGroups];
        GroupMeta row[kGroups];
        for (uint64_t g = 0; g < ng; ++g) {
            tile[g] = m.tile(index[g]);
            row[g] = packed_row_meta<T>(tile[g]);
        }
        alignas(64) __m512 sums[kGroups] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (uint64_t c = 0; c < pl.chunks; ++c) {
            const uint64_t nb = pl.chunk_blocks(c);
            const uint8_t* codes[kGroups];
            __m512i chunk_bias[kGroups][kChunkBlocks];
            Prefetch pf[kGroups];
            for (uint64_t g = 0; g < ng; ++g)
                codes[g] = open_chunk<T, true>(tile[g], pl, c, nb, row[g], &pk[0][g], chunk_bias[g],
                                               pf[g], nb);
            fused_chunk_token<T>(
                [&](uint64_t g, uint64_t i, __m512i(&u)[8]) {
                    packed_vectors<T>(codes[g] + i * pl.block_bytes, table, u);
                },
                pk, c * kChunkBlocks, nb, a, tok, sums, ng, pf);
        }
        for (uint64_t g = 0; g < ng; ++g)
            store_lanes(sums + g, 1, index[g] * kLanes, r0, r1, 1, out, ldo);
    }
}

// Several tokens take two tiles (32 rows) at a time.
template <QType T>
QF_AVX512 void packed_rows(const QPackedRows& m, uint64_t r0, uint64_t r1, const QActivations& a,
                           uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const QPackLayout& pl = m.layout();
    const uint64_t n = t1 - t0;
    __m512* sums = token_sums(n);
    alignas(64) PackedBlock pk[kChunkBlocks][kGroups];
    const bool biased = n > kRawZeroTokens;
    constexpr uint64_t ng = kGroups, span = ng * kLanes;
    __m128i table = _mm_setzero_si128();
    if constexpr (Kind<T>::levels)
        table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qtype_traits(T).levels));
    for (uint64_t rg = r0 - r0 % kLanes; rg < r1; rg += span) {
        // Group g is tile rg / 16 + g; one past the matrix's end computes tile rg's rows again,
        // which are not stored.
        const uint8_t* tile[kGroups];
        GroupMeta row[kGroups];
        for (uint64_t g = 0; g < ng; ++g) {
            const uint64_t i = rg / kLanes + g;
            tile[g] = m.tile(i < m.tiles() ? i : rg / kLanes);
            row[g] = packed_row_meta<T>(tile[g]);
        }
        for (uint64_t c = 0; c < pl.chunks; ++c) {
            const uint64_t nb = pl.chunk_blocks(c), b0 = c * kChunkBlocks;
            const uint8_t* codes[kGroups];
            __m512i chunk_bias[kGroups][kChunkBlocks];
            Prefetch pf[kGroups];
            for (uint64_t g = 0; g < ng; ++g)
                codes[g] = open_chunk<T, false>(tile[g], pl, c, nb, row[g], &pk[0][g],
                                                chunk_bias[g], pf[g], prefetch_parts(n, nb));
            const bool chunk_biased = biased && zeros_biasable<T>(pk, nb, ng);
            if (!Kind<T>::levels || n <= kLevelRegisterTokens) {
                if (chunk_biased)
                    token_tiles<T, true>(
                        pk, RegisterCodes<T, true>{codes, pl.block_bytes, table, &chunk_bias}, b0,
                        nb, a, t0, n, sums, pf);
                else
                    token_tiles<T, false>(
                        pk, RegisterCodes<T, false>{codes, pl.block_bytes, table, &chunk_bias}, b0,
                        nb, a, t0, n, sums, pf);
                continue;
            }
            // Each block's vectors biased in registers, then stored once (biasing them in the
            // chunk buffer stored and reloaded every vector twice: l2/q4_g128 m:16 1.04x).
            for (uint64_t i = 0; i < nb; ++i)
                for (uint64_t g = 0; g < ng; ++g) {
                    __m512i u[8];
                    packed_vectors<T>(codes[g] + i * pl.block_bytes, table, u);
                    if (adds_bias<T>(chunk_biased))
                        for (auto& x : u) x = _mm512_add_epi8(x, chunk_bias[g][i]);
                    for (int j = 0; j < 8; ++j) _mm512_store_si512(&pk[i][g].u[j], u[j]);
                }
            if (chunk_biased)
                token_tiles<T, true>(pk, BufferedCodes{pk}, b0, nb, a, t0, n, sums, pf);
            else
                token_tiles<T, false>(pk, BufferedCodes{pk}, b0, nb, a, t0, n, sums, pf);
        }
        store_lanes(sums, ng, rg, r0, r1, n, out, ldo);
    }
}

template <QType T>
void qmatmul_packed_t(const QPackedRows& m, uint64_t r0, uint64_t r1, const QActivations& a,
                      uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    if (t1 - t0 == 1) return packed_token<T>(m, r0, r1, a, t0, out, ldo);
    packed_rows<T>(m, r0, r1, a, t0, t1, out, ldo);
}

template <QType T>
constexpr QPackedKernel packed_entry() {
    if constexpr (qtype_is_quantized(T) && (Kind<T>::q4 || Kind<T>::q8) && !Kind<T>::row_levels)
        return qmatmul_packed_t<T>;
    else
        return nullptr;
}

template <size_t... I>
constexpr QPackedKernelRow packed_row(std::index_sequence<I...>) {
    return {{packed_entry<kQTypes[I].type>()...}};
}

// The AVX-512 row of kernels/cpu/qdot.cpp's table, built from the qtype table: every quantized
// type's qmatmul; dequantization left to AVX2 (null).
template <QType T>
constexpr QKernels avx512_entry() {
    if constexpr (qtype_is_quantized(T))
        return {qmatmul_t<T>, nullptr};
    else
        return {};
}

template <size_t... I>
constexpr QKernelRow avx512_row(std::index_sequence<I...>) {
    return {{avx512_entry<kQTypes[I].type>()...}};
}

}  // namespace

const QKernelRow& avx512_kernels() {
    static constexpr QKernelRow row = avx512_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

const QPackedKernelRow& avx512_packed_kernels() {
    static constexpr QPackedKernelRow row = packed_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

#else  // no x86: the table never selects this level

const QKernelRow& avx512_kernels() {
    static constexpr QKernelRow row{};
    return row;
}

const QPackedKernelRow& avx512_packed_kernels() {
    static constexpr QPackedKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
