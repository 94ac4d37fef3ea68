// Inner loops on float rows stored as f32, f16 or bf16: a scalar version that is
// obviously right, and an AVX2/FMA/F16C version chosen at run time when the CPU has it.
//
// Both versions sum in one fixed order that depends only on the row length (four 8-lane
// accumulators over blocks of 32, then blocks of 8 into the first, the lanes added pairwise,
// then the scalar tail), so a dot product gives the same bits whichever thread runs it, and a
// row converted to f32 first gives the same bits as the row read directly (f16 and bf16 widen to
// f32 exactly). The AVX2 and scalar versions differ only by float rounding (tested).
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/qtype.hpp"
#include "kernels/cpu/isa.hpp"

namespace qforge {

// Whether the AVX2 path (or a level above it) is in use: cpu_isa() >= Isa::avx2 (isa.hpp).
bool cpu_has_avx2();

// sum_i w[i] * x[i] for a stored row w of `n` elements.
float dot_row(QType qtype, const uint8_t* w, const float* x, size_t n);
float dot_row_scalar(QType qtype, const uint8_t* w, const float* x, size_t n);

// y[r - r0] = the dot product of row r (of a matrix whose rows are `stride` bytes apart) with x,
// for rows [r0, r1): at the avx2 level and above dot_row's bits, with the range's two halves read
// side by side (two streams of bytes keep more lines in flight than one: kernels/README.md,
// "Decode: two streams"); below it, dot_row_scalar's.
void dot_rows(Isa isa, QType qtype, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
              const float* x, size_t n, float* y);

// out[i] = w[i] as float32 (exact for every qtype: quantized rows dequantize exactly).
void row_to_f32(QType qtype, const uint8_t* w, float* out, size_t n);
// The same for a float row type (f32, f16, bf16) at level `isa`: exact, so every level gives the
// same bits (F16C and AVX2 from the avx2 level, core/half.hpp's conversions below it). The float
// GEMM's panels and an f16 KV cache's rows (runtime/kv_cache.hpp) widen this way.
void float_row_to_f32(Isa isa, QType qtype, const uint8_t* w, float* out, size_t n);

// out[i] += a * x[i]
inline void axpy(float a, const float* x, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] += a * x[i];
}

// sum_i a[i] * b[i] for short float vectors (attention heads, 8 to 256 wide), inlined: eight
// independent lanes the compiler can keep in one vector register, added in a fixed tree.
inline float dot_short(const float* a, const float* b, size_t n) {
    float lane[8] = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
    float sum =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

namespace detail {
// The AVX2 version of dot_row, whatever cpu_isa() says (the caller checks the CPU has AVX2). Every
// level above AVX2 uses it too: float rows have no wider kernel yet, so their products keep
// these bits on every x86 level. `prefetch`: whether it prefetches the row ahead (a speed choice
// made per CPU, float_dot.cpp; the bits are the same either way).
float dot_row_avx2(QType qtype, const uint8_t* w, const float* x, size_t n, bool prefetch);
}  // namespace detail

}  // namespace qforge
