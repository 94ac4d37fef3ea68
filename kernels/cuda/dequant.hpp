// Dequantization helpers shared by the CUDA kernels and the host: __host__ __device__ under nvcc,
// plain inline functions under a C++ compiler, so the CPU tests check the very code the kernels
// run against dequantize_row_ref (formats/qtype.hpp).
//
// The trick that keeps dequantization exact and cheap: a byte b placed in the low mantissa bits of
// the float 2^23 (bits 0x4B000000 | b) is the float 2^23 + b exactly, so one byte permute and one
// subtraction of (2^23 + zero) give (code - zero) as an exact float, with no int-to-float
// conversion (a quarter-rate instruction on most GPUs). The group's scale multiplies afterwards:
//   weight = scale * (code - zero), exact in float32 (11-bit scale times an 8-bit integer),
// bit-identical to the reference. 8-bit codes are signed; XOR 0x80 makes them code + 128, folded
// into the subtracted constant.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define QF_HD __host__ __device__ __forceinline__
#else
#define QF_HD inline
#endif

namespace qforge::cuda {

inline constexpr float kMagic = 8388608.0f;          // 2^23
inline constexpr uint32_t kMagicBits = 0x4B000000u;  // bits of 2^23

QF_HD float u32_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

// CUDA's __byte_perm: byte n of the result is byte (s >> 4n) & 7 of the 8-byte value (b:a).
QF_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(a, b, s);
#else
    const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
    uint32_t r = 0;
    for (uint32_t n = 0; n < 4; ++n) {
        const uint32_t sel = (s >> (4 * n)) & 7u;
        r |= static_cast<uint32_t>((v >> (8 * sel)) & 0xffu) << (8 * n);
    }
    return r;
#endif
}

// IEEE binary16 to float, exact (subnormals, infinities and NaNs included).
QF_HD float f16_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f)
        return u32_as_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
    if (exp != 0) return u32_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
#endif
}

QF_HD float bf16_bits_to_float(uint16_t h) { return u32_as_float(static_cast<uint32_t>(h) << 16); }

// Byte i (0..3) of w as the float 2^23 + byte.
QF_HD float magic_byte(uint32_t w, uint32_t i) {
    return u32_as_float(byte_perm(w, kMagicBits, 0x7650u | i));
}

// The constant subtracted from magic_byte to leave (code - zero): 4-bit codes are unsigned,
// 8-bit codes arrive as code + 128 after the XOR below.
QF_HD float zero_magic(bool eight_bit, int32_t zero) {
    return kMagic + static_cast<float>(zero + (eight_bit ? 128 : 0));
}

// One 32-bit word of a 4-bit chunk (bytes 4j .. 4j+3) holds weights 4j .. 4j+3 in its low nibbles
// and 16+4j .. 16+4j+3 in its high nibbles. Writes (code - zero) for both runs of four.
QF_HD void q4_word_codes(uint32_t w, float zmagic, float lo[4], float hi[4]) {
    const uint32_t l = w & 0x0F0F0F0Fu, h = (w >> 4) & 0x0F0F0F0Fu;
    for (uint32_t i = 0; i < 4; ++i) {
        lo[i] = magic_byte(l, i) - zmagic;
        hi[i] = magic_byte(h, i) - zmagic;
    }
}

// One 32-bit word of 8-bit codes (weights 4j .. 4j+3): (code - zero) for the four.
QF_HD void q8_word_codes(uint32_t w, float zmagic, float out[4]) {
    const uint32_t u = w ^ 0x80808080u;  // signed code c becomes the byte c + 128
    for (uint32_t i = 0; i < 4; ++i) out[i] = magic_byte(u, i) - zmagic;
}

// The 32 weights of chunk `c` of a quantized row (the GPU layout of gpu_format.hpp), exactly as
// dequantize_row_ref computes them. `bits` is 4 or 8; scales and zeros are read from the row.
// `mins_offset` > 0: a super row (4-bit codes, f32 scale at scales_offset and f32 min there per
// 32-weight group): scale * code - min, as the reference's super-block types.
// Used by the embedding lookup and the dequantize-to-fp16 kernel, and by the CPU tests.
QF_HD float f32_at(const uint8_t* p) {
    const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                       (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
    return u32_as_float(u);
}
QF_HD void dequant_quant_chunk(const uint8_t* row, uint32_t bits, uint64_t c,
                               uint64_t chunks_per_group, uint64_t scales_offset,
                               uint64_t zeros_offset, bool has_zeros, int32_t implicit_zero,
                               float out[32], uint64_t mins_offset = 0) {
    const uint64_t g = c / chunks_per_group;
    const uint8_t* sp = row + scales_offset + 2 * g;
    const float scale = mins_offset
                            ? f32_at(row + scales_offset + 4 * g)
                            : f16_bits_to_float(static_cast<uint16_t>(sp[0] | (sp[1] << 8)));
    const float min = mins_offset ? f32_at(row + mins_offset + 4 * g) : 0.0f;
    const int32_t zero = has_zeros ? row[zeros_offset + g] : implicit_zero;
    const float zm = zero_magic(bits == 8, zero);
    if (bits == 4) {
        const uint8_t* p = row + c * 16;
        for (uint32_t j = 0; j < 4; ++j) {
            const uint32_t w = static_cast<uint32_t>(p[4 * j]) |
                               (static_cast<uint32_t>(p[4 * j + 1]) << 8) |
                               (static_cast<uint32_t>(p[4 * j + 2]) << 16) |
                               (static_cast<uint32_t>(p[4 * j + 3]) << 24);
            float lo[4], hi[4];
            q4_word_codes(w, zm, lo, hi);
            for (uint32_t i = 0; i < 4; ++i) {  // - 0.0f changes no bit (the reference's form)
                out[4 * j + i] = scale * lo[i] - min;
                out[16 + 4 * j + i] = scale * hi[i] - min;
            }
        }
    } else {
        const uint8_t* p = row + c * 32;
        for (uint32_t j = 0; j < 8; ++j) {
            const uint32_t w = static_cast<uint32_t>(p[4 * j]) |
                               (static_cast<uint32_t>(p[4 * j + 1]) << 8) |
                               (static_cast<uint32_t>(p[4 * j + 2]) << 16) |
                               (static_cast<uint32_t>(p[4 * j + 3]) << 24);
            float v[4];
            q8_word_codes(w, zm, v);
            for (uint32_t i = 0; i < 4; ++i) out[4 * j + i] = scale * v[i];
        }
    }
}

// fp16 pairs for the tensor-core path: two codes as the halves (1024 + code), exact, from which
// one half2 subtraction of (1024 + zero) leaves (code - zero). `u` holds two bytes of a row.
//   q4: weights b0.lo, b1.lo (low nibbles) and b0.hi, b1.hi (high nibbles);
//   q8: the two signed bytes (as code + 128).
QF_HD uint32_t q4_pair_low(uint32_t u) { return ((u | (u << 8)) & 0x000F000Fu) | 0x64006400u; }
QF_HD uint32_t q4_pair_high(uint32_t u) {
    return (((u | (u << 8)) >> 4) & 0x000F000Fu) | 0x64006400u;
}
QF_HD uint32_t q8_pair(uint32_t u) {
    const uint32_t x = (u ^ 0x8080u) & 0xFFFFu;
    return ((x | (x << 8)) & 0x00FF00FFu) | 0x64006400u;
}
// The half (1024 + zero) [+ 128 for 8-bit codes], as bits: 1024 + v for an integer v < 1024 is
// 0x6400 | v.
QF_HD uint16_t pair_zero_bits(bool eight_bit, int32_t zero) {
    return static_cast<uint16_t>(0x6400u | static_cast<uint32_t>(zero + (eight_bit ? 128 : 0)));
}

}  // namespace qforge::cuda
