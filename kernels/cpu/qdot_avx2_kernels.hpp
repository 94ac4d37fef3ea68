// The AVX2/FMA/F16C products of quantized rows with prepared activations (kernels/README.md has
// the design and the measurements), included by two translation units: qdot_avx2.cpp (the avx2
// level's row) and qdot_avx_vnni.cpp (the same kernels with AVX-VNNI's vpdpbusd for the int8
// dot products, QF_INT8_VNNI: the same integers, so the same bits; chosen at the avx2 level when
// the CPU has it). Each defines QF_AVX2 (its target attribute) first; everything here has
// internal linkage. Supported: every quantized type of formats/qtype.hpp, any k >= 1,
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
#pragma once

#include <limits>
#include <utility>

#include "kernels/cpu/qdot_avx2.hpp"
#include "kernels/cpu/qdot_x86.hpp"

#if defined(__x86_64__)

namespace qforge::detail {

namespace {

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
            const __m256 wz = superblock_offsets<T>(row, s, wsb);
            for (int t = 0; t < NT; ++t)
                acc[0][t] =
                    _mm256_fnmadd_ps(wz, _mm256_loadu_ps(x.sums[t] + kSuper * s), acc[0][t]);
        }
        for (int t = 0; t < NT; ++t)
            cs[t] = _mm256_mul_ps(wsb, _mm256_loadu_ps(x.d[t] + kSuper * s));
        // Written out, so every accumulator index and lane choice is a constant (a loop over the
        // pairs left acc[j % 2] in memory: each FMA a load and a store, 2x slower).
        const uint64_t p = kSuper / 2 * s;
        int8_pair<T, NT>(row, p, 0, cs, x, acc[0]);
        int8_pair<T, NT>(row, p + 1, 1, cs, x, acc[1]);
        int8_pair<T, NT>(row, p + 2, 2, cs, x, acc[0]);
        int8_pair<T, NT>(row, p + 3, 3, cs, x, acc[1]);
    }
    if (blocks % kSuper) int8_rest<T, NT>(row, x, blocks, acc);
    for (int t = 0; t < NT; ++t)
        out[static_cast<uint64_t>(t) * ldo] = hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
}

// Block b's codes minus its zero (level types: their levels) as 4 x 8 exact floats, weights 0-7,
// 8-15, 16-23, 24-31.
template <QType T>
QF_AVX2 inline void block_values(const Row& row, uint64_t b, __m256 f[4]) {
    if constexpr (Kind<T>::q3) {
        const __m256i c = q3_block_codes(row.codes, b);
        const __m256i z = _mm256_set1_epi32(block_zero<T>(row, b));
        const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
        const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
        for (int i = 0; i < 4; ++i)
            f[i] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[i]), z));
    } else if constexpr (Kind<T>::levels) {
        // The chunk's low and high nibbles, each replaced by its int8 level, widened.
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.codes + 16 * b));
        const __m128i lo = _mm_shuffle_epi8(level_table<T>(row), _mm_and_si128(v, m4));
        const __m128i hi =
            _mm_shuffle_epi8(level_table<T>(row), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; ++i) f[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]));
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
    alignas(32) float sc[kSuper], mins[kSuper] = {};
    for (uint64_t b = 0; b < blocks; ++b) {
        if (b % kSuper == 0) {
            prefetch_part(row, b / kSuper);
            if (b + kSuper <= blocks)
                _mm256_store_ps(sc, superblock_scales<T>(row, b / kSuper));
            else
                for (uint64_t i = 0; b + i < blocks; ++i) sc[i] = block_scale<T>(row, b + i);
            if constexpr (Kind<T>::super)
                for (uint64_t i = 0; i < kSuper && b + i < blocks; ++i)
                    mins[i] = block_offset<T>(row, b + i);
        }
        __m256 f[4];
        block_values<T>(row, b, f);
        __m256 ws = _mm256_broadcast_ss(&sc[b % kSuper]);
        if constexpr (Kind<T>::super) {
            // The exact weights scale * code - min (one rounding, as the reference), then
            // accumulated with a unit scale.
            const __m256 wm = _mm256_broadcast_ss(&mins[b % kSuper]);
            for (int i = 0; i < 4; ++i) f[i] = _mm256_fmsub_ps(f[i], ws, wm);
            ws = _mm256_set1_ps(1.0f);
        }
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
struct Avx2Tile {
    static constexpr int kTokens = 4;  // 16 ymm: 2 accumulators and a scale vector per token
    template <int NT>
    static void run(const Row& row, const QActivations& a, uint64_t tok, float* out, uint64_t ldo) {
        tile<T, NT>(row, a, tok, out, ldo);
    }
};

template <QType T>
void qmatmul_t(QType, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
               const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    qmatmul_rows<T, Avx2Tile<T>>(w, stride, r0, r1, a, t0, t1, out, ldo);
}

template <QType T>
QF_AVX2 void dequantize_t(QType, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                          float* out) {
    const QRowLayout l = *qtype_row_layout(T, k);
    const uint64_t blocks = (k + kBlock - 1) / kBlock;
    for (uint64_t r = 0; r < n; ++r) {
        const uint8_t* p = w + r * stride;
        Row row{p, p + l.scales_offset, p + l.zeros_offset, nullptr, 0, 0, 0, false};
        row.levels = reinterpret_cast<const int8_t*>(p + l.levels_offset);
        float* o = out + r * k;
        for (uint64_t b = 0; b < blocks; ++b) {
            __m256 f[4];
            block_values<T>(row, b, f);
            // scale * (code - zero), the reference's product: exact, so the same bits.
            const __m256 ws = _mm256_set1_ps(block_scale<T>(row, b));
            // Super-block types: scale * code - min, scale * code exact, so one rounding.
            const __m256 wm = _mm256_set1_ps(Kind<T>::super ? block_offset<T>(row, b) : 0.0f);
            for (int i = 0; i < 4; ++i)
                f[i] = Kind<T>::super ? _mm256_fmsub_ps(f[i], ws, wm) : _mm256_mul_ps(f[i], ws);
            if (kBlock * (b + 1) <= k) {
                for (int i = 0; i < 4; ++i) _mm256_storeu_ps(o + kBlock * b + 8 * i, f[i]);
            } else {
                alignas(32) float tmp[kBlock];
                for (int i = 0; i < 4; ++i) _mm256_store_ps(tmp + 8 * i, f[i]);
                std::copy(tmp, tmp + (k - kBlock * b), o + kBlock * b);
            }
        }
    }
}

// The level's row of kernels/cpu/qdot.cpp's table: every quantized type of the qtype table (built
// from it, so a new type cannot be left out), float types left to qdot.cpp.
template <QType T>
constexpr QKernels avx2_entry() {
    if constexpr (qtype_is_quantized(T))
        return {qmatmul_t<T>, dequantize_t<T>};
    else
        return {};
}

template <size_t... I>
constexpr QKernelRow avx2_row(std::index_sequence<I...>) {
    return {{avx2_entry<kQTypes[I].type>()...}};
}

}  // namespace

}  // namespace qforge::detail

#endif  // __x86_64__
