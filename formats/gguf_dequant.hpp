// ggml's packed blocks, as GGUF files store them, and their dequantization to float32.
//
// Each block type is a struct whose size is checked against the type-traits table
// (formats/gguf.hpp); the formulas are ggml's reference dequantizers (ggml-quants.c,
// dequantize_row_*), evaluated in the same order of float operations, so the results are
// bit-identical to llama.cpp's and to the `gguf` Python package's numpy versions (the tests
// compare against vectors that package wrote). `d`, `dmin` and `m` are IEEE binary16.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "formats/gguf.hpp"

namespace qforge {

inline constexpr uint32_t kGgmlQk = 32;           // elements per block of the 32-element types
inline constexpr uint32_t kGgmlQkK = 256;         // elements per K-quant super-block
inline constexpr uint32_t kGgmlKScaleBytes = 12;  // 8 six-bit scales and 8 six-bit mins

// x = d * (q - 8); q is 4 bits: qs[j] holds element j (low nibble) and j + 16 (high nibble).
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kGgmlQk / 2];
};
// x = d * q + m; nibbles as Q4_0.
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[kGgmlQk / 2];
};
// x = d * (q - 16); q is 5 bits: the low 4 as Q4_0, bit 4 of element j is bit j of qh.
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];  // 32 high bits, little-endian
    uint8_t qs[kGgmlQk / 2];
};
// x = d * q + m; q as Q5_0.
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[kGgmlQk / 2];
};
// x = d * q.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kGgmlQk];
};
// 16 groups of 16: x = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4); q is 2 bits.
struct BlockQ2_K {
    uint8_t scales[kGgmlQkK / 16];  // low nibble scale, high nibble min, per group
    uint8_t qs[kGgmlQkK / 4];       // four 2-bit values per byte, in 32-byte strips
    uint16_t d;                     // scale of the scales
    uint16_t dmin;                  // scale of the mins
};
// 16 groups of 16: x = d * (s[g] - 32) * (q - 4 * !hbit); s are 6-bit, q is 2 low bits + hbit.
struct BlockQ3_K {
    uint8_t hmask[kGgmlQkK / 8];  // the high bit of each element
    uint8_t qs[kGgmlQkK / 4];     // the low 2 bits
    uint8_t scales[12];           // 16 six-bit scales, packed
    uint16_t d;
};
// 8 groups of 32: x = d * sc[g] * q - dmin * mn[g]; sc, mn 6-bit (packed in 12 bytes), q 4-bit.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[kGgmlKScaleBytes];
    uint8_t qs[kGgmlQkK / 2];
};
// As Q4_K with a fifth bit per element in qh.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[kGgmlKScaleBytes];
    uint8_t qh[kGgmlQkK / 8];
    uint8_t qs[kGgmlQkK / 2];
};
// 16 groups of 16: x = d * scales[g] * (q - 32); q is 6 bits (4 in ql, 2 in qh), scales int8.
struct BlockQ6_K {
    uint8_t ql[kGgmlQkK / 2];
    uint8_t qh[kGgmlQkK / 4];
    int8_t scales[kGgmlQkK / 16];
    uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
                  sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34,
              "32-element ggml blocks");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
                  sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210,
              "ggml K-quant super-blocks");

// Dequantizes a whole tensor's bytes (`src.size()` must be a whole number of blocks and `dst`
// hold exactly their elements). Throws an Error naming `file` and `tensor` for a type with no
// dequantizer (its name and the supported list) or inconsistent sizes.
void gguf_dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst,
                     const std::string& file, const std::string& tensor);

// "F32, F16, BF16, Q4_0, ...": the types gguf_dequantize supports, for messages.
std::string gguf_dequantizable_types();

}  // namespace qforge
