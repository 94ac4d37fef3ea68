// Attention products (attention.hpp): the scalar reference, written as the runtime computed them
// before (float_dot.hpp's dot_short and axpy), the AVX2/FMA version, and an AVX-512 mix that runs
// the same operations per output (the same bits) with more of them per instruction.
#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/float_dot.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12's AVX-512 intrinsics (here _mm512_cvtph_ps) build their "undefined" operands by
// self-initialisation, which -W(maybe-)uninitialized reports inside the system header once
// inlined: the false positive qdot_avx512.cpp silences the same way.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace qforge {

namespace {

void head_scores_scalar(const float* q, uint64_t group, uint64_t hd, const float* keys,
                        uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld) {
    for (uint64_t g = 0; g < group; ++g)
        for (uint64_t j = 0; j < n; ++j)
            scores[g * ld + j] = dot_short(q + g * hd, keys + j * stride, hd) * scale;
}

void head_mix_scalar(const float* p, uint64_t ld, uint64_t group, uint64_t hd, const float* values,
                     uint64_t stride, uint64_t n, float* out) {
    for (uint64_t j = 0; j < n; ++j)
        for (uint64_t g = 0; g < group; ++g)
            axpy(p[g * ld + j], values + j * stride, out + g * hd, hd);
}

#if defined(__x86_64__)

#define QF_ATTN_AVX2 __attribute__((target("avx2,fma,f16c")))
// Inlined into each level's caller, so the avx512 level's copy has its 32 registers (a call
// to an avx2 copy spilled scores_tile<3, 8>'s accumulators).
#define QF_ATTN_INLINE inline __attribute__((always_inline))

// A cache row's elements as floats: f32 rows as they are, f16 rows widened (exactly) in
// registers, so an f16 cache's products are those of its rows widened first, bit for bit.
QF_ATTN_INLINE float widen(float x) { return x; }
QF_ATTN_INLINE float widen(uint16_t h) { return f16_to_f32(h); }
QF_ATTN_AVX2 QF_ATTN_INLINE __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
QF_ATTN_AVX2 QF_ATTN_INLINE __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// An Ahead's lines (from the line holding its first byte to the one holding its last) issued
// over `steps` calls of next(): by the i-th call at least i * lines / steps of them, rounded up,
// and all by the last (16.16 fixed point, no division per step).
class Spread {
  public:
    Spread(Ahead a, uint64_t steps)
        : p_(static_cast<const char*>(a.at) - reinterpret_cast<uintptr_t>(a.at) % 64),
          lines_(a.at && a.bytes && steps
                     ? (reinterpret_cast<uintptr_t>(a.at) % 64 + a.bytes + 63) / 64
                     : 0),
          step_(lines_ ? (lines_ << 16) / steps + 1 : 0) {}
    QF_ATTN_INLINE void next() {
        due_ += step_;
        for (; issued_ < lines_ && (issued_ << 16) < due_; ++issued_)
            _mm_prefetch(p_ + 64 * issued_, _MM_HINT_T1);
    }

  private:
    const char* p_;
    uint64_t lines_, step_, due_ = 0, issued_ = 0;
};

// The heads [g, g + NG) of a group's mix (mix_heads, mix_heads16), chosen by NG from a table.
template <class T>
using MixHeads = void (*)(const float*, uint64_t, uint64_t, const T*, uint64_t, uint64_t, float*,
                          Spread*);

// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)): dot_short's tree over the 8 lanes.
QF_ATTN_AVX2 QF_ATTN_INLINE float lane_tree(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

// The lane trees of eight accumulators at once, transposed: lane j of the result is
// lane_tree(acc[j]), the same additions in the same tree (float addition commutes, so which
// operand comes first does not change a bit). 22 shuffles and adds for eight trees, where eight
// lane_tree calls take 48.
QF_ATTN_AVX2 QF_ATTN_INLINE __m256 lane_trees8(const __m256 (&acc)[8]) {
    // [a: 0+4, 1+5, 2+6, 3+7 | b: the same] for the pairs (0, 1), (2, 3), (4, 5), (6, 7).
    __m256 h[4];
    for (int p = 0; p < 4; ++p)
        h[p] = _mm256_add_ps(_mm256_permute2f128_ps(acc[2 * p], acc[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(acc[2 * p], acc[2 * p + 1], 0x31));
    // [a: (0+4)+(2+6), (1+5)+(3+7), c: the same | b: .., d: ..] for (a, b, c, d) = (0, 1, 2, 3)
    // and (4, 5, 6, 7).
    __m256 m[2];
    for (int p = 0; p < 2; ++p)
        m[p] = _mm256_add_ps(_mm256_shuffle_ps(h[2 * p], h[2 * p + 1], 0x44),
                             _mm256_shuffle_ps(h[2 * p], h[2 * p + 1], 0xee));
    // [0, 2, 4, 6 | 1, 3, 5, 7], then in order.
    const __m256 t =
        _mm256_add_ps(_mm256_shuffle_ps(m[0], m[1], 0x88), _mm256_shuffle_ps(m[0], m[1], 0xdd));
    return _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// NG query heads against NJ keys: per (head, key) an 8-lane FMA chain over hd's whole 8-blocks,
// the lane tree, then the last hd mod 8 products one at a time, then times scale. Each key vector
// is loaded once for the NG heads, key after key in memory order. Loading the 8 keys' vectors at
// each offset in turn (one query load per 8 FMAs), as this did before, ran 1.2x faster from L1
// but 2.2x slower from DRAM (3 heads over 64 MiB of 16 KiB runs, one thread: 8.5 GB/s, against
// 18.8 in memory order), and in serving the keys come from DRAM (SmolLM2, 16 sequences at 256-320
// positions: decode 1.06x, 5 alternating runs).
template <int NG, int NJ, class T>
QF_ATTN_AVX2 QF_ATTN_INLINE void scores_tile(const float* q, uint64_t hd, const T* keys,
                                             uint64_t stride, float scale, float* scores,
                                             uint64_t ld) {
    __m256 acc[NG][NJ];
    for (int g = 0; g < NG; ++g)
        for (int j = 0; j < NJ; ++j) acc[g][j] = _mm256_setzero_ps();
    const uint64_t whole = hd / 8 * 8;
    for (int j = 0; j < NJ; ++j)
        for (uint64_t i = 0; i < whole; i += 8) {
            const __m256 kv = load8(keys + j * stride + i);
            for (int g = 0; g < NG; ++g)
                acc[g][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * hd + i), kv, acc[g][j]);
        }
    for (int g = 0; g < NG; ++g) {
        const float* qg = q + g * hd;
        float* sg = scores + g * ld;
        if constexpr (NJ == 8) {
            const __m256 s = lane_trees8(acc[g]);
            if (whole == hd) {
                _mm256_storeu_ps(sg, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
                continue;
            }
            alignas(32) float sums[8];
            _mm256_store_ps(sums, s);
            for (int j = 0; j < NJ; ++j) {
                for (uint64_t i = whole; i < hd; ++i)
                    sums[j] += qg[i] * widen(keys[j * stride + i]);
                sg[j] = sums[j] * scale;
            }
            continue;
        }
        for (int j = 0; j < NJ; ++j) {
            float s = lane_tree(acc[g][j]);
            for (uint64_t i = whole; i < hd; ++i) s += qg[i] * widen(keys[j * stride + i]);
            sg[j] = s * scale;
        }
    }
}

// Heads in NG's over each tile of 8 keys in turn, so the tile comes from memory once and from L1
// for the group's other heads.
template <int NG, class T>
QF_ATTN_AVX2 QF_ATTN_INLINE void scores_heads(const float* q, uint64_t group, uint64_t hd,
                                              const T* keys, uint64_t stride, uint64_t n,
                                              float scale, float* scores, uint64_t ld,
                                              Ahead ahead) {
    constexpr uint64_t kKeys = 8;  // chains in flight: 8 FMAs cover the FMA latency twice over
    Spread spread(ahead, n / kKeys + 1);
    uint64_t j = 0;
    for (; j + kKeys <= n; j += kKeys) {
        spread.next();
        const T* kj = keys + j * stride;
        uint64_t g = 0;
        for (; g + NG <= group; g += NG)
            scores_tile<NG, kKeys>(q + g * hd, hd, kj, stride, scale, scores + g * ld + j, ld);
        for (; g < group; ++g)
            scores_tile<1, kKeys>(q + g * hd, hd, kj, stride, scale, scores + g * ld + j, ld);
    }
    spread.next();
    for (; j < n; ++j)
        for (uint64_t g = 0; g < group; ++g)
            scores_tile<1, 1>(q + g * hd, hd, keys + j * stride, stride, scale, scores + g * ld + j,
                              ld);
}

template <class T>
QF_ATTN_AVX2 void head_scores_avx2(const float* q, uint64_t group, uint64_t hd, const T* keys,
                                   uint64_t stride, uint64_t n, float scale, float* scores,
                                   uint64_t ld, Ahead ahead) {
    scores_heads<1>(q, group, hd, keys, stride, n, scale, scores, ld, ahead);
}

// NG heads' outputs, C 8-float chunks of each from `at`, kept in registers over the n positions:
// out = fma(p, v, out), one rounding per position, positions in order.
template <int NG, int C, class T>
QF_ATTN_AVX2 inline void mix_tile(const float* p, uint64_t ld, uint64_t hd, const T* values,
                                  uint64_t stride, uint64_t n, uint64_t at, float* out,
                                  Spread* spread) {
    __m256 acc[NG][C];
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) acc[g][c] = _mm256_loadu_ps(out + g * hd + at + 8 * c);
    for (uint64_t j = 0; j < n; ++j) {
        if (spread) spread->next();
        __m256 v[C];
        for (int c = 0; c < C; ++c) v[c] = load8(values + j * stride + at + 8 * c);
        for (int g = 0; g < NG; ++g) {
            const __m256 b = _mm256_set1_ps(p[g * ld + j]);
            for (int c = 0; c < C; ++c) acc[g][c] = _mm256_fmadd_ps(b, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + g * hd + at + 8 * c, acc[g][c]);
}

// spread's lines go with the first pass over the positions.
template <int NG, class T>
QF_ATTN_AVX2 void mix_heads(const float* p, uint64_t ld, uint64_t hd, const T* values,
                            uint64_t stride, uint64_t n, float* out, Spread* spread) {
    uint64_t at = 0;
    for (; at + 16 <= hd; at += 16, spread = nullptr)
        mix_tile<NG, 2>(p, ld, hd, values, stride, n, at, out, spread);
    if (at + 8 <= hd) {
        mix_tile<NG, 1>(p, ld, hd, values, stride, n, at, out, spread);
        at += 8;
    }
    for (uint64_t g = 0; g < NG; ++g)  // the last hd mod 8 elements: the same fused steps
        for (uint64_t i = at; i < hd; ++i)
            for (uint64_t j = 0; j < n; ++j)
                out[g * hd + i] =
                    std::fma(p[g * ld + j], widen(values[j * stride + i]), out[g * hd + i]);
}

// Heads in fours: 4 heads x 2 chunks is 8 accumulators beside the 2 value vectors, within the
// 16 ymm registers.
template <class T>
QF_ATTN_AVX2 void head_mix_avx2(const float* p, uint64_t ld, uint64_t group, uint64_t hd,
                                const T* values, uint64_t stride, uint64_t n, float* out,
                                Ahead ahead) {
    static constexpr MixHeads<T> kHeads[] = {mix_heads<1, T>, mix_heads<2, T>, mix_heads<3, T>,
                                             mix_heads<4, T>};
    Spread spread(ahead, n);
    for (uint64_t g = 0; g < group; g += 4)
        kHeads[std::min<uint64_t>(group - g, 4) - 1](p + g * ld, ld, hd, values, stride, n,
                                                     out + g * hd, g == 0 ? &spread : nullptr);
}

// The avx512 level's mix: mix_tile's operations per output (so avx2's bits) on 16 lanes, one pass
// over the positions for a whole 64-float head (SmolLM2 serving 16 streams: the mix's share of
// the time 9.1% -> 6.4%). Its scores are avx2's operations, three heads per key tile in its 32
// registers.
#define QF_ATTN_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))

// NG heads' outputs, C 16-float chunks of each from `at`: mix_tile's steps on 16 lanes.
QF_ATTN_AVX512 QF_ATTN_INLINE __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
QF_ATTN_AVX512 QF_ATTN_INLINE __m512 load16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int NG, int C, class T>
QF_ATTN_AVX512 inline void mix_tile16(const float* p, uint64_t ld, uint64_t hd, const T* values,
                                      uint64_t stride, uint64_t n, uint64_t at, float* out,
                                      Spread* spread) {
    __m512 acc[NG][C];
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_loadu_ps(out + g * hd + at + 16 * c);
    for (uint64_t j = 0; j < n; ++j) {
        if (spread) spread->next();
        __m512 v[C];
        for (int c = 0; c < C; ++c) v[c] = load16(values + j * stride + at + 16 * c);
        for (int g = 0; g < NG; ++g) {
            const __m512 b = _mm512_set1_ps(p[g * ld + j]);
            for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(b, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * hd + at + 16 * c, acc[g][c]);
}

template <int NG, class T>
QF_ATTN_AVX512 void mix_heads16(const float* p, uint64_t ld, uint64_t hd, const T* values,
                                uint64_t stride, uint64_t n, float* out, Spread* spread) {
    uint64_t at = 0;
    for (; at + 64 <= hd; at += 64, spread = nullptr)
        mix_tile16<NG, 4>(p, ld, hd, values, stride, n, at, out, spread);
    if (at + 32 <= hd) {
        mix_tile16<NG, 2>(p, ld, hd, values, stride, n, at, out, spread);
        at += 32;
        spread = nullptr;
    }
    if (at + 16 <= hd) {
        mix_tile16<NG, 1>(p, ld, hd, values, stride, n, at, out, spread);
        at += 16;
        spread = nullptr;
    }
    if (at + 8 <= hd) {
        mix_tile<NG, 1>(p, ld, hd, values, stride, n, at, out, spread);
        at += 8;
    }
    for (uint64_t g = 0; g < NG; ++g)
        for (uint64_t i = at; i < hd; ++i)
            for (uint64_t j = 0; j < n; ++j)
                out[g * hd + i] =
                    std::fma(p[g * ld + j], widen(values[j * stride + i]), out[g * hd + i]);
}

// avx2's operations per score (its bits), three heads per key tile: 24 accumulators beside the
// key vector, within the 32 registers (in an avx2 copy they spilled). From L1 1.35x avx2's
// single heads; from DRAM either streams the keys at one pace.
template <class T>
QF_ATTN_AVX512 void head_scores_avx512(const float* q, uint64_t group, uint64_t hd, const T* keys,
                                       uint64_t stride, uint64_t n, float scale, float* scores,
                                       uint64_t ld, Ahead ahead) {
    scores_heads<3>(q, group, hd, keys, stride, n, scale, scores, ld, ahead);
}

// Heads in fours: 4 heads x 4 chunks is 16 accumulators beside the 4 value vectors.
template <class T>
QF_ATTN_AVX512 void head_mix_avx512(const float* p, uint64_t ld, uint64_t group, uint64_t hd,
                                    const T* values, uint64_t stride, uint64_t n, float* out,
                                    Ahead ahead) {
    static constexpr MixHeads<T> kHeads[] = {mix_heads16<1, T>, mix_heads16<2, T>,
                                             mix_heads16<3, T>, mix_heads16<4, T>};
    Spread spread(ahead, n);
    for (uint64_t g = 0; g < group; g += 4)
        kHeads[std::min<uint64_t>(group - g, 4) - 1](p + g * ld, ld, hd, values, stride, n,
                                                     out + g * hd, g == 0 ? &spread : nullptr);
}

#endif

}  // namespace

namespace {

// scalar: an f16 run's rows widened into floats first (float_row_to_f32: the same floats the
// vector levels widen in registers), then the scalar products.
std::vector<float> widened(const uint16_t* rows, uint64_t stride, uint64_t n, uint64_t hd) {
    std::vector<float> w(n * hd);
    for (uint64_t j = 0; j < n; ++j)
        float_row_to_f32(Isa::scalar, QType::f16,
                         reinterpret_cast<const uint8_t*>(rows + j * stride), w.data() + j * hd,
                         hd);
    return w;
}

template <class T>
void scores_at(Isa isa, const float* q, uint64_t group, uint64_t hd, const T* keys, uint64_t stride,
               uint64_t n, float scale, float* scores, uint64_t ld, [[maybe_unused]] Ahead ahead) {
#if defined(__x86_64__)
    if (isa >= Isa::avx512)
        return head_scores_avx512(q, group, hd, keys, stride, n, scale, scores, ld, ahead);
    if (isa >= Isa::avx2)
        return head_scores_avx2(q, group, hd, keys, stride, n, scale, scores, ld, ahead);
#endif
    if constexpr (std::is_same_v<T, float>) {
        head_scores_scalar(q, group, hd, keys, stride, n, scale, scores, ld);
    } else {
        const auto w = widened(keys, stride, n, hd);
        head_scores_scalar(q, group, hd, w.data(), hd, n, scale, scores, ld);
    }
}

template <class T>
void mix_at(Isa isa, const float* p, uint64_t ld, uint64_t group, uint64_t hd, const T* values,
            uint64_t stride, uint64_t n, float* out, [[maybe_unused]] Ahead ahead) {
#if defined(__x86_64__)
    if (isa >= Isa::avx512) return head_mix_avx512(p, ld, group, hd, values, stride, n, out, ahead);
    if (isa >= Isa::avx2) return head_mix_avx2(p, ld, group, hd, values, stride, n, out, ahead);
#endif
    if constexpr (std::is_same_v<T, float>) {
        head_mix_scalar(p, ld, group, hd, values, stride, n, out);
    } else {
        const auto w = widened(values, stride, n, hd);
        head_mix_scalar(p, ld, group, hd, w.data(), hd, n, out);
    }
}

}  // namespace

void head_scores(Isa isa, const float* q, uint64_t group, uint64_t hd, const float* keys,
                 uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld,
                 Ahead ahead) {
    scores_at(isa, q, group, hd, keys, stride, n, scale, scores, ld, ahead);
}

void head_scores(Isa isa, const float* q, uint64_t group, uint64_t hd, const uint16_t* keys,
                 uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld,
                 Ahead ahead) {
    scores_at(isa, q, group, hd, keys, stride, n, scale, scores, ld, ahead);
}

void head_mix(Isa isa, const float* p, uint64_t ld, uint64_t group, uint64_t hd,
              const float* values, uint64_t stride, uint64_t n, float* out, Ahead ahead) {
    mix_at(isa, p, ld, group, hd, values, stride, n, out, ahead);
}

void head_mix(Isa isa, const float* p, uint64_t ld, uint64_t group, uint64_t hd,
              const uint16_t* values, uint64_t stride, uint64_t n, float* out, Ahead ahead) {
    mix_at(isa, p, ld, group, hd, values, stride, n, out, ahead);
}

}  // namespace qforge
