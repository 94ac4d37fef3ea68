// AVX-512 F/BW/VL + VNNI products of quantized rows with int8 activations: the AVX2 kernel's
// arithmetic (qdot_avx2.cpp's header comment) in 512-bit registers, with vpdpbusd in place of
// vpmaddubsw + vpaddw + vpmaddwd. The results are the AVX2 kernel's, bit for bit:
//   - integers: vpdpbusd adds the four byte products of each dword lane into it without
//     saturation, so each int32 lane holds the same exact sum as AVX2's maddubs/madd lanes (the
//     same four weights of each block half, both halves; AVX2's int16 steps cannot saturate);
//   - floats: one 16-lane accumulator per token whose lanes 0-7 are AVX2's acc0 and 8-15 its
//     acc1. A superblock's pairs (0, 1) go in with one FMA, then pairs (2, 3): lane by lane the
//     same roundings in the same order as AVX2's (zero correction, pair 0, pair 2 in acc0; pair
//     1, pair 3 in acc1), the zero correction masked to lanes 0-7. The last < 8 blocks run
//     AVX2's own tail on the two halves, then acc0 + acc1 and the same lane tree.
// Where the order could not be kept it is not: nothing here reorders a float sum, so no part of
// this level differs from AVX2. f32-activation mode and dequantize_rows stay AVX2's kernels
// (their products are float and a wider accumulator would reorder them).
#include "kernels/cpu/qdot_avx2.hpp"

#include <utility>

// GCC 12's AVX-512 intrinsics build their "undefined" operands by self-initialisation, which
// -W(maybe-)uninitialized reports inside the system header once inlined (a known false positive:
// every lane those operands hold is masked off or overwritten).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/cpu/qdot_x86.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

namespace {

#define QF_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// Pairs 2u and 2u + 1 of superblock s (blocks 8s + 4u .. 8s + 4u + 3) of one row against NT
// tokens; cs[t]: the superblock's 8 combined scales in lanes 0-7.
template <QType T, int NT>
QF_AVX512 inline void int8_quad(const Row& row, uint64_t s, uint64_t u, const __m512* cs,
                                const int8_t* const* quad, const uint8_t* const* biased,
                                __m512* acc) {
    const uint8_t* codes = row.codes;
    const uint64_t p = kSuper / 2 * s + 2 * u;  // the first pair
    // Lanes 0-7: pair 2u's scales (blocks 4u, 4u + 1, four lanes each); 8-15: pair 2u + 1's.
    const int b = static_cast<int>(4 * u);
    const __m512i lanes = _mm512_setr_epi32(b, b, b, b, b + 1, b + 1, b + 1, b + 1, b + 2, b + 2,
                                            b + 2, b + 2, b + 3, b + 3, b + 3, b + 3);
    if constexpr (Kind<T>::unsigned_codes) {
        __m512i lo, hi;  // [pair p's low halves | p + 1's], [p's high halves | p + 1's]
        if constexpr (Kind<T>::q3) {
            __m256i lo0, hi0, lo1, hi1;
            q3_pair_codes(codes, p, lo0, hi0);
            q3_pair_codes(codes, p + 1, lo1, hi1);
            lo = _mm512_inserti64x4(_mm512_castsi256_si512(lo0), lo1, 1);
            hi = _mm512_inserti64x4(_mm512_castsi256_si512(hi0), hi1, 1);
        } else {
            const __m512i m4 = _mm512_set1_epi8(0x0f);
            const __m512i v = _mm512_loadu_si512(codes + 32 * p);
            lo = _mm512_and_si512(v, m4);
            hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        for (int t = 0; t < NT; ++t) {
            const int8_t* x = quad[t] + 256 * s + 128 * u;
            __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x));
            isum = _mm512_dpbusd_epi32(isum, hi, _mm512_loadu_si512(x + 64));
            acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(lanes, cs[t]), _mm512_cvtepi32_ps(isum),
                                     acc[t]);
        }
    } else {
        // Codes of 4 blocks in order: 128-bit lanes c0 c16 c32 c48 | c64 c80 c96 c112; the pair
        // order wants the first halves (c0 c32 c64 c96) and the last halves (c16 c48 c80 c112).
        // Level types: pairs p and p + 1 as 4-bit chunks, their low nibbles (the pair order's
        // first halves) and high nibbles each replaced by its level, so already in that order.
        __m512i wa, wb;
        if constexpr (Kind<T>::levels) {
            const __m512i m4 = _mm512_set1_epi8(0x0f);
            const __m512i table = _mm512_broadcast_i32x4(level_table<T>(row));
            const __m512i v = _mm512_loadu_si512(codes + 32 * p);
            wa = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
            wb = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
        } else {
            const __m512i v0 = _mm512_loadu_si512(codes + 64 * p);
            const __m512i v1 = _mm512_loadu_si512(codes + 64 * p + 64);
            wa = _mm512_shuffle_i32x4(v0, v1, 0x88);
            wb = _mm512_shuffle_i32x4(v0, v1, 0xdd);
        }
        // vpdpbusd multiplies unsigned by signed bytes: the activations come biased to q + 128
        // (0x01..0xff: q is in [-127, 127]) and every sum starts from -128 * (the dword's four
        // weights), so it ends on sum q w, the same exact integer as AVX2's. No term can
        // overflow: |start| <= 128 * 8 * 128 and each step adds at most 4 * 255 * 128 per lane.
        const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
        const __m512i start = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wa), bias, wb));
        for (int t = 0; t < NT; ++t) {
            const uint8_t* x = biased[t] + 256 * s + 128 * u;
            __m512i isum = _mm512_dpbusd_epi32(start, _mm512_loadu_si512(x), wa);
            isum = _mm512_dpbusd_epi32(isum, _mm512_loadu_si512(x + 64), wb);
            acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(lanes, cs[t]), _mm512_cvtepi32_ps(isum),
                                     acc[t]);
        }
    }
}

template <QType T, int NT>
QF_AVX512 void int8_tile(const Row& row, const QActivations& a, uint64_t tok, float* out,
                         uint64_t ldo) {
    const uint64_t blocks = a.blocks();
    Int8Tokens<NT> x;
    const int8_t* quad[NT];
    const uint8_t* biased[NT];
    __m512 acc[NT], cs[NT];  // acc lanes 0-7: AVX2's acc0, 8-15: its acc1
    for (int t = 0; t < NT; ++t) {
        x.q[t] = a.pair_codes(tok + t);
        x.d[t] = a.scales(tok + t);
        x.sums[t] = a.scaled_sums(tok + t);
        quad[t] = a.quad_codes(tok + t);
        biased[t] = a.quad_codes_biased(tok + t);
        acc[t] = _mm512_setzero_ps();
    }
    const uint64_t full = blocks / kSuper;
    for (uint64_t s = 0; s < full; ++s) {
        prefetch_part(row, s);
        const __m256 wsb = superblock_scales<T>(row, s);
        if constexpr (Kind<T>::unsigned_codes) {
            const __m256 wz = superblock_offsets<T>(row, s, wsb);
            for (int t = 0; t < NT; ++t)
                acc[t] = _mm512_mask3_fnmadd_ps(
                    _mm512_zextps256_ps512(wz),
                    _mm512_zextps256_ps512(_mm256_loadu_ps(x.sums[t] + kSuper * s)), acc[t],
                    0x00ff);
        }
        for (int t = 0; t < NT; ++t)
            cs[t] =
                _mm512_zextps256_ps512(_mm256_mul_ps(wsb, _mm256_loadu_ps(x.d[t] + kSuper * s)));
        int8_quad<T, NT>(row, s, 0, cs, quad, biased, acc);
        int8_quad<T, NT>(row, s, 1, cs, quad, biased, acc);
    }
    __m256 halves[2][NT];
    for (int t = 0; t < NT; ++t) {
        halves[0][t] = _mm512_castps512_ps256(acc[t]);
        halves[1][t] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1));
    }
    if (blocks % kSuper) int8_rest<T, NT>(row, x, blocks, halves);
    for (int t = 0; t < NT; ++t)
        out[static_cast<uint64_t>(t) * ldo] = hsum(_mm256_add_ps(halves[0][t], halves[1][t]));
}

template <QType T>
struct Avx512Tile {
    // 32 zmm: per token an accumulator and a scale vector, the rest for the row's codes and the
    // products. 8 tokens per unpacked chunk: 1.07x to 1.2x faster than 4 (kernels/README.md).
    static constexpr int kTokens = 8;
    template <int NT>
    static void run(const Row& row, const QActivations& a, uint64_t tok, float* out, uint64_t ldo) {
        int8_tile<T, NT>(row, a, tok, out, ldo);
    }
};

template <QType T>
void qmatmul_t(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
               const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    if (a.mode() != QActivations::Mode::int8)  // f32 mode: AVX2's kernel (header comment)
        return avx2_kernels()[static_cast<size_t>(T)].qmatmul(t, w, stride, r0, r1, a, t0, t1, out,
                                                              ldo);
    qmatmul_rows<T, Avx512Tile<T>>(w, stride, r0, r1, a, t0, t1, out, ldo);
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

#else  // no x86: the table never selects this level

const QKernelRow& avx512_kernels() {
    static constexpr QKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
