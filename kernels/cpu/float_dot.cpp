#include "kernels/cpu/float_dot.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/isa.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define QF_X86 1
#endif

namespace qforge {

namespace {

// Scalar loads, one element at a time.
template <QType T>
inline float load1(const uint8_t* w, size_t i) {
    if constexpr (T == QType::f32) {
        float v;
        std::memcpy(&v, w + 4 * i, 4);
        return v;
    } else {
        uint16_t h;
        std::memcpy(&h, w + 2 * i, 2);
        if constexpr (T == QType::f16)
            return f16_to_f32(h);
        else
            return bf16_to_f32(h);
    }
}

// The summation order both versions share, written for 8 "lanes" held in plain arrays.
template <QType T>
float dot_scalar(const uint8_t* w, const float* x, size_t n) {
    float acc[4][8] = {};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int a = 0; a < 4; ++a)
            for (int l = 0; l < 8; ++l) {
                const size_t k = i + 8 * static_cast<size_t>(a) + static_cast<size_t>(l);
                acc[a][l] += load1<T>(w, k) * x[k];
            }
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l)
            acc[0][l] += load1<T>(w, i + static_cast<size_t>(l)) * x[i + static_cast<size_t>(l)];
    float lanes[8];
    for (int l = 0; l < 8; ++l) lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (; i < n; ++i) sum += load1<T>(w, i) * x[i];
    return sum;
}

#ifdef QF_X86
// Prefetching each cache line of the row 4 KiB ahead into L1 (the rows of a product lie one after
// another, so this reaches into the next rows) helps one core and hurts another, so it is chosen
// per CPU (float_row_prefetch). Zen 5: with the hardware prefetcher alone an f16 GEMV kept
// 55-65% of the read bandwidth, with this 95-105% (kernels/README.md, "Float rows at one token").
// Zen 4: this slowed decode, TinyLlama-shape f16 15.3 -> 19.4 tok/s and SmolLM2-135M f16 98.6 ->
// 144.9 without it (5 alternating rounds; a likely cause: the prefetches hold L1 miss buffers
// the hardware streams would use; the same section, 2026-12-05). A prefetch never faults, so
// reaching past the matrix is harmless, and it changes no bit.
constexpr size_t kAheadBytes = 4096;

template <QType T>
__attribute__((target("avx2,fma,f16c"))) inline void prefetch_step(const uint8_t* w, size_t i) {
    constexpr size_t width = T == QType::f32 ? 4 : 2;     // bytes per weight
    for (size_t line = 0; line < 32 * width; line += 64)  // the 32-step's lines
        _mm_prefetch(reinterpret_cast<const char*>(w + width * i + line) + kAheadBytes,
                     _MM_HINT_T0);
}

// QFORGE_FLOAT_ROW_PREFETCH=1 or 0 decides (any other value is ignored); otherwise Zen 5
// prefetches and every other CPU leaves it to the hardware, as llama.cpp's f16 rows do.
bool float_row_prefetch() {
    static const bool on = [] {
        const char* env = std::getenv("QFORGE_FLOAT_ROW_PREFETCH");
        if (env && std::strcmp(env, "1") == 0) return true;
        if (env && std::strcmp(env, "0") == 0) return false;
        return cpu_is_zen5();
    }();
    return on;
}

template <QType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const uint8_t* w, size_t i) {
    if constexpr (T == QType::f32) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + i);
    } else if constexpr (T == QType::f16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
    } else {
        const __m256i wide =
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
}

template <QType T>
__attribute__((target("avx2,fma,f16c"))) void widen_avx2(const uint8_t* w, float* out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load8<T>(w, i));
    for (; i < n; ++i) out[i] = load1<T>(w, i);
}

// The end of a row's dot product from its four accumulators: their sum, its lanes (0+4, 1+5, 2+6,
// 3+7), then (0+2, 1+3), then 0+1 (the scalar version's order), then the tail from element i on.
template <QType T>
__attribute__((target("avx2,fma,f16c"))) inline float finish_dot(__m256 a0, __m256 a1, __m256 a2,
                                                                 __m256 a3, const uint8_t* w,
                                                                 const float* x, size_t i,
                                                                 size_t n) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float sum = _mm_cvtss_f32(h);
    for (; i < n; ++i) sum += load1<T>(w, i) * x[i];
    return sum;
}

template <QType T, bool Prefetch>
__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const uint8_t* w, const float* x,
                                                        size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if constexpr (Prefetch) prefetch_step<T>(w, i);
        a0 = _mm256_fmadd_ps(load8<T>(w, i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load8<T>(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load8<T>(w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load8<T>(w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8<T>(w, i), _mm256_loadu_ps(x + i), a0);
    return finish_dot<T>(a0, a1, a2, a3, w, x, i, n);
}

// Rows w0 and w1 against the same x, side by side: each row's sum in dot_avx2's own order (its
// own four accumulators, the same reduction), so each equals dot_avx2's bits.
template <QType T, bool Prefetch>
__attribute__((target("avx2,fma,f16c"))) void dot2_avx2(const uint8_t* w0, const uint8_t* w1,
                                                        const float* x, size_t n, float* out0,
                                                        float* out1) {
    __m256 a[2][4];
    for (auto& r : a)
        for (auto& v : r) v = _mm256_setzero_ps();
    const uint8_t* w[2] = {w0, w1};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int r = 0; r < 2; ++r) {
            if constexpr (Prefetch) prefetch_step<T>(w[r], i);
            for (int j = 0; j < 4; ++j)
                a[r][j] =
                    _mm256_fmadd_ps(load8<T>(w[r], i + 8 * static_cast<size_t>(j)),
                                    _mm256_loadu_ps(x + i + 8 * static_cast<size_t>(j)), a[r][j]);
        }
    for (; i + 8 <= n; i += 8)
        for (int r = 0; r < 2; ++r)
            a[r][0] = _mm256_fmadd_ps(load8<T>(w[r], i), _mm256_loadu_ps(x + i), a[r][0]);
    *out0 = finish_dot<T>(a[0][0], a[0][1], a[0][2], a[0][3], w0, x, i, n);
    *out1 = finish_dot<T>(a[1][0], a[1][1], a[1][2], a[1][3], w1, x, i, n);
}

template <QType T, bool Prefetch>
void dot_rows_avx2(const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1, const float* x,
                   size_t n, float* y) {
    const uint64_t half = (r1 - r0 + 1) / 2;  // rows of the first run; the second: the rest
    for (uint64_t j = 0; j < half; ++j) {
        const uint64_t a = r0 + j, b = r0 + half + j;
        if (b < r1)
            dot2_avx2<T, Prefetch>(w + a * stride, w + b * stride, x, n, y + (a - r0),
                                   y + (b - r0));
        else
            y[a - r0] = dot_avx2<T, Prefetch>(w + a * stride, x, n);
    }
}

#endif

}  // namespace

bool cpu_has_avx2() { return cpu_isa() >= Isa::avx2; }

void dot_rows(Isa isa, QType qtype, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
              const float* x, size_t n, float* y) {
#ifdef QF_X86
    if (isa >= Isa::avx2 && cpu_has_avx2()) {
        const bool pf = float_row_prefetch();
        switch (qtype) {
            case QType::f32:
                return pf ? dot_rows_avx2<QType::f32, true>(w, stride, r0, r1, x, n, y)
                          : dot_rows_avx2<QType::f32, false>(w, stride, r0, r1, x, n, y);
            case QType::f16:
                return pf ? dot_rows_avx2<QType::f16, true>(w, stride, r0, r1, x, n, y)
                          : dot_rows_avx2<QType::f16, false>(w, stride, r0, r1, x, n, y);
            case QType::bf16:
                return pf ? dot_rows_avx2<QType::bf16, true>(w, stride, r0, r1, x, n, y)
                          : dot_rows_avx2<QType::bf16, false>(w, stride, r0, r1, x, n, y);
            default:
                break;
        }
    }
#endif
    for (uint64_t r = r0; r < r1; ++r) y[r - r0] = dot_row_scalar(qtype, w + r * stride, x, n);
}

namespace detail {
float dot_row_avx2(QType qtype, const uint8_t* w, const float* x, size_t n, bool prefetch) {
#ifdef QF_X86
    switch (qtype) {
        case QType::f32:
            return prefetch ? dot_avx2<QType::f32, true>(w, x, n)
                            : dot_avx2<QType::f32, false>(w, x, n);
        case QType::f16:
            return prefetch ? dot_avx2<QType::f16, true>(w, x, n)
                            : dot_avx2<QType::f16, false>(w, x, n);
        case QType::bf16:
            return prefetch ? dot_avx2<QType::bf16, true>(w, x, n)
                            : dot_avx2<QType::bf16, false>(w, x, n);
        default:
            break;
    }
#else
    (void)prefetch;
#endif
    return dot_row_scalar(qtype, w, x, n);
}
}  // namespace detail

float dot_row_scalar(QType qtype, const uint8_t* w, const float* x, size_t n) {
    switch (qtype) {
        case QType::f32:
            return dot_scalar<QType::f32>(w, x, n);
        case QType::f16:
            return dot_scalar<QType::f16>(w, x, n);
        case QType::bf16:
            return dot_scalar<QType::bf16>(w, x, n);
        default:  // quantized rows go through kernels/cpu/qdot.hpp
            break;
    }
    throw Error("dot_row: quant type code " + std::to_string(static_cast<unsigned>(qtype)) +
                " is not a float row type");
}

float dot_row(QType qtype, const uint8_t* w, const float* x, size_t n) {
#ifdef QF_X86
    if (cpu_has_avx2()) return detail::dot_row_avx2(qtype, w, x, n, float_row_prefetch());
#endif
    return dot_row_scalar(qtype, w, x, n);
}

void float_row_to_f32(Isa isa, QType qtype, const uint8_t* w, float* out, size_t n) {
    switch (qtype) {
        case QType::f32:
            std::memcpy(out, w, 4 * n);
            return;
        case QType::f16:
#ifdef QF_X86
            if (isa >= Isa::avx2) return widen_avx2<QType::f16>(w, out, n);
#endif
            for (size_t i = 0; i < n; ++i) out[i] = load1<QType::f16>(w, i);
            return;
        case QType::bf16:
#ifdef QF_X86
            if (isa >= Isa::avx2) return widen_avx2<QType::bf16>(w, out, n);
#endif
            for (size_t i = 0; i < n; ++i) out[i] = load1<QType::bf16>(w, i);
            return;
        default:
            throw Error("float_row_to_f32: quant type code " +
                        std::to_string(static_cast<unsigned>(qtype)) + " is not a float row type");
    }
}

void row_to_f32(QType qtype, const uint8_t* w, float* out, size_t n) {
    switch (qtype) {
        case QType::f32:
        case QType::f16:
        case QType::bf16:
            return float_row_to_f32(cpu_isa(), qtype, w, out, n);
        default:
            if (static_cast<size_t>(qtype) >= kQTypeCount)
                throw Error("row_to_f32: quant type code " +
                            std::to_string(static_cast<unsigned>(qtype)) +
                            " is not in the qtype table");
            dequantize_row_ref(qtype, w, n, out);
            return;
    }
}

}  // namespace qforge
