// The avx512 level's shared pieces (qdot_avx512.cpp's VNNI kernels, qdot_amx.cpp's AMX ones):
// 16 rows in the 16 lanes of a vector, a block's step of the scalar reference's sum (block_step:
// every kernel ends each block with it, which is why they all give qmatmul_scalar's bits), the
// packed layout's code vectors and scales (kernels/cpu/qpack.hpp), and the lanes' store into the
// output. Included by those two translation units only; everything here has internal linkage
// (as in qdot_x86.hpp), so the linker never picks a copy compiled for another target.
#pragma once

#include <algorithm>
#include <vector>

// GCC 12's AVX-512 intrinsics build their "undefined" operands by self-initialisation, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a known false positive:
// every lane those operands hold is masked off or overwritten). For the rest of the including
// translation unit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/cpu/qdot_x86.hpp"
#include "kernels/cpu/qpack.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

namespace {

#define QF_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

constexpr uint64_t kLanes = 16;       // rows per group: one per 32-bit lane
constexpr uint64_t kGroups = 2;       // groups computed together
constexpr uint64_t kChunkBlocks = 8;  // blocks repacked at a time

// One repacked block of 16 rows: u bytes (8 vectors, header comment), scales and mins per lane.
struct PackedBlock {
    __m512i u[8];
    __m512 scale;
    __m512 min;   // super-block types
    __m512 zero;  // types with stored zeros, as floats
};

// Bytes 128 - zero in every byte of each lane, from the zeros as int32 lanes.
QF_AVX512 inline __m512i zero_bias(__m512i z) {
    return _mm512_mullo_epi32(_mm512_sub_epi32(_mm512_set1_epi32(128), z),
                              _mm512_set1_epi32(0x01010101));
}

// The fp16 in the low (high = false) or high half of each lane, as floats.
QF_AVX512 inline __m512 half_lanes(__m512i v, bool high) {
    if (high) v = _mm512_srli_epi32(v, 16);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

// The scales and mins of the first nb blocks of a superblock from the 16 rows' records
// (QSuperRecord, 16 bytes) transposed: v[0] holds d and dmin, v[1..3] the 6-bit scales and mins,
// block i's 12 bits from bit 12 i of v[1..3].
QF_AVX512 inline void super_meta(const __m512i (&v)[4], uint64_t nb, PackedBlock* p,
                                 uint64_t p_stride) {
    const __m512 d = half_lanes(v[0], false), dmin = half_lanes(v[0], true);
    const __m512i m6 = _mm512_set1_epi32(63);
    for (uint64_t b = 0; b < nb; ++b) {
        const unsigned bit = static_cast<unsigned>(12 * b), j = 1 + bit / 32, sh = bit % 32;
        __m512i x = _mm512_srli_epi32(v[j], sh);
        if (sh + 12 > 32) x = _mm512_or_si512(x, _mm512_slli_epi32(v[j + 1], 32 - sh));
        // d * sc and dmin * mn: exact, as super_value's
        p[b * p_stride].scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(x, m6)));
        p[b * p_stride].min =
            _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(x, 6), m6)));
    }
}

// One block's step of the reference's sum, lane by lane: acc + fl(fl(scale * d) * float(isum))
// (RawZero: isum first less zero * sum q, exact), then for super-block types minus
// fl(min * ds). Every path below ends each block with this, so they all give the same bits.
template <QType T, bool RawZero>
QF_AVX512 inline __m512 block_step(__m512 acc, __m512i isum, const PackedBlock& p, __m512 d,
                                   [[maybe_unused]] __m512 qsum, [[maybe_unused]] __m512 ds) {
    __m512 sum = _mm512_cvtepi32_ps(isum);
    if constexpr (Kind<T>::zero_stored && RawZero)  // exact: integers below 2^24
        sum = _mm512_fnmadd_ps(p.zero, qsum, sum);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(p.scale, d), sum));
    if constexpr (Kind<T>::super) acc = _mm512_sub_ps(acc, _mm512_mul_ps(p.min, ds));
    return acc;
}

// A stored zero above 128 (outside every type's code range: only a damaged file has one) cannot
// be biased into a byte: a chunk with one takes the raw path, exact as well.
template <QType T>
QF_AVX512 inline bool zeros_biasable(const PackedBlock (*pk)[kGroups], uint64_t nb, uint64_t ng) {
    if constexpr (Kind<T>::zero_stored)
        for (uint64_t g = 0; g < ng; ++g)
            for (uint64_t i = 0; i < nb; ++i)
                if (_mm512_cmp_ps_mask(pk[i][g].zero, _mm512_set1_ps(128.0f), _CMP_GT_OQ))
                    return false;
    return true;
}

// Lane l of group g holds row rg + 16 g + l of every token (sums[ng * t + g]): the rows of
// [r0, r1) among them, stored at out[t * ldo + row - r0].
QF_AVX512 inline void store_lanes(const __m512* sums, uint64_t ng, uint64_t rg, uint64_t r0,
                                  uint64_t r1, uint64_t n, float* out, uint64_t ldo) {
    for (uint64_t g = 0; g < ng; ++g) {
        const uint64_t first = rg + g * kLanes;
        if (first >= r1) break;
        const uint64_t lo = std::max(first, r0) - first, hi = std::min(r1 - first, kLanes);
        const auto mask = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        for (uint64_t t = 0; t < n; ++t) {
            if (lo == 0) {
                _mm512_mask_storeu_ps(out + t * ldo + (first - r0), mask, sums[ng * t + g]);
                continue;
            }
            alignas(64) float lanes[kLanes];  // a tile that starts before r0 (packed rows)
            _mm512_store_ps(lanes, sums[ng * t + g]);
            std::copy(lanes + lo, lanes + hi, out + t * ldo);
        }
    }
}

// Running sums of n tokens' groups (two per token), per thread.
QF_AVX512 inline __m512* token_sums(uint64_t n) {
    struct alignas(64) Lanes {
        float v[kLanes];
    };
    thread_local std::vector<Lanes> buffer;
    if (buffer.size() < n * kGroups) buffer.resize(n * kGroups);
    return reinterpret_cast<__m512*>(buffer.data());
}

// Block vector j (before the bias) from a packed block's codes: 4-bit, the low nibbles of
// vector j (j < 4) or the high ones of vector j - 4, through the level table for level types.
template <QType T>
QF_AVX512 inline __m512i packed_vector(const uint8_t* codes, __m128i table, int j) {
    const auto* v = reinterpret_cast<const __m512i*>(codes);
    if constexpr (Kind<T>::q4) {
        const __m512i x = _mm512_load_si512(v + (j & 3));
        const __m512i u =
            _mm512_and_si512(j < 4 ? x : _mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0f));
        if constexpr (Kind<T>::levels) return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), u);
        return u;
    } else {
        return _mm512_load_si512(v + j);
    }
}

template <QType T>
QF_AVX512 inline void packed_vectors(const uint8_t* codes, __m128i table, __m512i (&u)[8]) {
    for (int j = 0; j < 8; ++j) u[j] = packed_vector<T>(codes, table, j);
}

// One weight group's 16 scales (and zeros, with their byte bias) from the packed meta at `at`.
struct GroupMeta {
    __m512 scale, zero;
    __m512i bias;
};
// Biased: also the zeros' byte bias (a vpmulld, which one token, subtracting its zeros as
// floats, does without).
template <QType T, bool Biased>
QF_AVX512 inline GroupMeta packed_group_meta(const uint8_t* at) {
    GroupMeta m;
    m.scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
    m.zero = _mm512_setzero_ps();
    m.bias = _mm512_set1_epi8(static_cast<char>(128 - Kind<T>::implicit_zero));
    if constexpr (Kind<T>::zero_stored) {
        const __m512i z = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 2 * kLanes)));
        m.zero = _mm512_cvtepi32_ps(z);
        if constexpr (Biased) m.bias = zero_bias(z);
    }
    return m;
}

// The meta a tile's chunks start from: per-row-scale types' header (their scales, zeros and
// biases); other types a zero scale and their implicit zero's bias (each group's or superblock's
// meta replaces the scale).
template <QType T>
QF_AVX512 inline GroupMeta packed_row_meta(const uint8_t* tile) {
    if constexpr (Kind<T>::group_blocks == 0 && !Kind<T>::super)
        return packed_group_meta<T, true>(tile);
    else
        return GroupMeta{_mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_set1_epi8(static_cast<char>(128 - Kind<T>::implicit_zero))};
}

// The chunk's nb blocks' scales (mins, zeros) into p[i * p_stride] and their biases; per-row
// types take the tile's `row` meta.
template <QType T, bool Biased>
QF_AVX512 inline void packed_chunk_meta(const uint8_t* meta, const QPackLayout& pl, uint64_t nb,
                                        const GroupMeta& row, PackedBlock* p, uint64_t p_stride,
                                        __m512i (&bias)[kChunkBlocks]) {
    if constexpr (Kind<T>::super) {
        const auto* v = reinterpret_cast<const __m512i*>(meta);
        const __m512i records[4] = {_mm512_load_si512(v), _mm512_load_si512(v + 1),
                                    _mm512_load_si512(v + 2), _mm512_load_si512(v + 3)};
        super_meta(records, nb, p, p_stride);
        for (uint64_t i = 0; i < nb; ++i) bias[i] = row.bias;
        return;
    }
    GroupMeta m = row;
    for (uint64_t i = 0; i < nb; ++i) {
        if (pl.group_blocks != 0 && i % pl.group_blocks == 0)
            m = packed_group_meta<T, Biased>(meta + i / pl.group_blocks * pl.group_meta);
        p[i * p_stride].scale = m.scale;
        p[i * p_stride].zero = m.zero;
        bias[i] = m.bias;
    }
}

}  // namespace

#endif  // __x86_64__

}  // namespace qforge::detail
