// The ggml type-traits table and the scalar dequantizers of the types GGUF models use.
//
// Float operations follow ggml's reference order: a K-quant's per-group factor is formed first
// (d * scale, one rounding) and then multiplied by the integer; the few products that are not
// exact in float32 (Q6_K: d * scale is 19 bits, times a 6-bit q) therefore round exactly as
// ggml's do. Every other product here is exact (at most 24 significant bits), so fused or
// unfused multiply-adds give the same bits.
#include "formats/gguf_dequant.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace qforge {

namespace {

template <class Block>
Block load_block(const uint8_t* src, uint64_t i) {
    Block b;  // memcpy: blocks of 18 or 110 bytes need not be aligned for their fields
    std::memcpy(&b, src + i * sizeof(Block), sizeof(Block));
    return b;
}

void f32_to_float(const uint8_t* src, float* dst, uint64_t n) { std::memcpy(dst, src, n * 4); }

void f16_to_float(const uint8_t* src, float* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
    }
}

void bf16_to_float(const uint8_t* src, float* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
    }
}

void q4_0_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i, dst += kGgmlQk) {
        const auto b = load_block<BlockQ4_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (uint32_t j = 0; j < kGgmlQk / 2; ++j) {
            dst[j] = static_cast<float>((b.qs[j] & 0x0f) - 8) * d;
            dst[j + kGgmlQk / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
        }
    }
}

void q4_1_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i, dst += kGgmlQk) {
        const auto b = load_block<BlockQ4_1>(src, i);
        const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
        for (uint32_t j = 0; j < kGgmlQk / 2; ++j) {
            dst[j] = static_cast<float>(b.qs[j] & 0x0f) * d + m;
            dst[j + kGgmlQk / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
        }
    }
}

// The 5-bit values of a Q5_0/Q5_1 block: element j's high bit is bit j of qh.
void q5_values(const uint8_t qh_bytes[4], const uint8_t qs[kGgmlQk / 2], int out[kGgmlQk]) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, 4);
    for (uint32_t j = 0; j < kGgmlQk / 2; ++j) {
        const int h0 = static_cast<int>((qh >> j) << 4 & 0x10);
        const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
        out[j] = (qs[j] & 0x0f) | h0;
        out[j + kGgmlQk / 2] = (qs[j] >> 4) | h1;
    }
}

void q5_0_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    int q[kGgmlQk];
    for (uint64_t i = 0; i < blocks; ++i, dst += kGgmlQk) {
        const auto b = load_block<BlockQ5_0>(src, i);
        const float d = f16_to_f32(b.d);
        q5_values(b.qh, b.qs, q);
        for (uint32_t j = 0; j < kGgmlQk; ++j) dst[j] = static_cast<float>(q[j] - 16) * d;
    }
}

void q5_1_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    int q[kGgmlQk];
    for (uint64_t i = 0; i < blocks; ++i, dst += kGgmlQk) {
        const auto b = load_block<BlockQ5_1>(src, i);
        const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
        q5_values(b.qh, b.qs, q);
        for (uint32_t j = 0; j < kGgmlQk; ++j) dst[j] = static_cast<float>(q[j]) * d + m;
    }
}

void q8_0_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i, dst += kGgmlQk) {
        const auto b = load_block<BlockQ8_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (uint32_t j = 0; j < kGgmlQk; ++j) dst[j] = static_cast<float>(b.qs[j]) * d;
    }
}

void q2_k_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i) {
        const auto b = load_block<BlockQ2_K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        const uint8_t* q = b.qs;
        uint32_t is = 0;
        // Two halves of 128: each 32-byte strip of qs holds four 2-bit planes, one per shift.
        for (uint32_t half = 0; half < kGgmlQkK / 128; ++half, q += 32) {
            for (uint32_t shift = 0; shift < 8; shift += 2) {
                for (uint32_t part = 0; part < 2; ++part) {
                    const uint8_t sc = b.scales[is++];
                    const float dl = d * static_cast<float>(sc & 0x0f);
                    const float ml = dmin * static_cast<float>(sc >> 4);
                    for (uint32_t l = 0; l < 16; ++l)
                        *dst++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
                }
            }
        }
    }
}

// Q3_K's 16 six-bit scales: the low 4 bits are nibbles of bytes 0..7, the high 2 bits are
// bit pairs of bytes 8..11 (ggml's kmask shuffle, written out per scale).
void q3_k_scales(const uint8_t packed[12], int scales[16]) {
    for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? packed[j] & 0x0f : packed[j - 8] >> 4;
        const int high = (packed[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        scales[j] = (low | (high << 4)) - 32;
    }
}

void q3_k_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    int scales[16];
    for (uint64_t i = 0; i < blocks; ++i) {
        const auto b = load_block<BlockQ3_K>(src, i);
        const float d_all = f16_to_f32(b.d);
        q3_k_scales(b.scales, scales);
        const uint8_t* q = b.qs;
        uint8_t m = 1;  // the hmask bit of the current plane
        uint32_t is = 0;
        for (uint32_t half = 0; half < kGgmlQkK / 128; ++half, q += 32) {
            for (uint32_t shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
                for (uint32_t part = 0; part < 2; ++part) {
                    const float dl = d_all * static_cast<float>(scales[is++]);
                    for (uint32_t l = 0; l < 16; ++l) {
                        const uint32_t k = l + 16 * part;
                        const int v = ((q[k] >> shift) & 3) - ((b.hmask[k] & m) ? 0 : 4);
                        *dst++ = dl * static_cast<float>(v);
                    }
                }
            }
        }
    }
}

// Scale and min of group j (0..7) of a Q4_K/Q5_K block (ggml's get_scale_min_k4): groups 0..3
// keep their 6 bits in bytes 0..3 (scale) and 4..7 (min); groups 4..7 take their low 4 bits
// from the nibbles of bytes 8..11 and their top 2 bits from the spare top bits of bytes 0..7.
void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void q4_k_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i) {
        const auto b = load_block<BlockQ4_K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        const uint8_t* q = b.qs;
        for (int g = 0; g < 8; g += 2, q += 32) {
            uint8_t sc, mn;
            k4_scale_min(g, b.scales, sc, mn);
            const float d1 = d * sc, m1 = dmin * mn;
            k4_scale_min(g + 1, b.scales, sc, mn);
            const float d2 = d * sc, m2 = dmin * mn;
            for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
        }
    }
}

void q5_k_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i) {
        const auto b = load_block<BlockQ5_K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        const uint8_t* ql = b.qs;
        uint8_t u1 = 1, u2 = 2;  // the qh bits of the current pair of groups
        for (int g = 0; g < 8; g += 2, ql += 32) {
            uint8_t sc, mn;
            k4_scale_min(g, b.scales, sc, mn);
            const float d1 = d * sc, m1 = dmin * mn;
            k4_scale_min(g + 1, b.scales, sc, mn);
            const float d2 = d * sc, m2 = dmin * mn;
            for (int l = 0; l < 32; ++l)
                *dst++ = d1 * static_cast<float>((ql[l] & 0x0f) + (b.qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *dst++ = d2 * static_cast<float>((ql[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - m2;
            u1 = static_cast<uint8_t>(u1 << 2);
            u2 = static_cast<uint8_t>(u2 << 2);
        }
    }
}

void q6_k_to_float(const uint8_t* src, float* dst, uint64_t blocks) {
    for (uint64_t i = 0; i < blocks; ++i) {
        const auto b = load_block<BlockQ6_K>(src, i);
        const float d = f16_to_f32(b.d);
        const uint8_t* ql = b.ql;
        const uint8_t* qh = b.qh;
        const int8_t* sc = b.scales;
        // Two halves of 128 elements; in each, ql holds 64 bytes (two nibble planes of 32 bytes
        // each) and qh 32 bytes (four 2-bit planes).
        for (uint32_t half = 0; half < kGgmlQkK / 128;
             ++half, dst += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0 & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2 & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
                dst[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
                dst[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
                dst[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
                dst[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
            }
        }
    }
}

// Every ggml type a GGUF file may hold, in id order. Sizes are ggml's (GGML_QUANT_SIZES in the
// `gguf` package); types without a dequantizer are still sized, so their files can be read and
// their tensors named in errors.
// clang-format off
constexpr GgmlTypeTraits kGgmlTypes[] = {
    {GgmlType::f32,     "F32",     1,   4,   f32_to_float},
    {GgmlType::f16,     "F16",     1,   2,   f16_to_float},
    {GgmlType::q4_0,    "Q4_0",    32,  18,  q4_0_to_float},
    {GgmlType::q4_1,    "Q4_1",    32,  20,  q4_1_to_float},
    {GgmlType::q5_0,    "Q5_0",    32,  22,  q5_0_to_float},
    {GgmlType::q5_1,    "Q5_1",    32,  24,  q5_1_to_float},
    {GgmlType::q8_0,    "Q8_0",    32,  34,  q8_0_to_float},
    {GgmlType::q8_1,    "Q8_1",    32,  40,  nullptr},
    {GgmlType::q2_k,    "Q2_K",    256, 84,  q2_k_to_float},
    {GgmlType::q3_k,    "Q3_K",    256, 110, q3_k_to_float},
    {GgmlType::q4_k,    "Q4_K",    256, 144, q4_k_to_float},
    {GgmlType::q5_k,    "Q5_K",    256, 176, q5_k_to_float},
    {GgmlType::q6_k,    "Q6_K",    256, 210, q6_k_to_float},
    {GgmlType::q8_k,    "Q8_K",    256, 292, nullptr},
    {GgmlType::iq2_xxs, "IQ2_XXS", 256, 66,  nullptr},
    {GgmlType::iq2_xs,  "IQ2_XS",  256, 74,  nullptr},
    {GgmlType::iq3_xxs, "IQ3_XXS", 256, 98,  nullptr},
    {GgmlType::iq1_s,   "IQ1_S",   256, 50,  nullptr},
    {GgmlType::iq4_nl,  "IQ4_NL",  32,  18,  nullptr},
    {GgmlType::iq3_s,   "IQ3_S",   256, 110, nullptr},
    {GgmlType::iq2_s,   "IQ2_S",   256, 82,  nullptr},
    {GgmlType::iq4_xs,  "IQ4_XS",  256, 136, nullptr},
    {GgmlType::i8,      "I8",      1,   1,   nullptr},
    {GgmlType::i16,     "I16",     1,   2,   nullptr},
    {GgmlType::i32,     "I32",     1,   4,   nullptr},
    {GgmlType::i64,     "I64",     1,   8,   nullptr},
    {GgmlType::f64,     "F64",     1,   8,   nullptr},
    {GgmlType::iq1_m,   "IQ1_M",   256, 56,  nullptr},
    {GgmlType::bf16,    "BF16",    1,   2,   bf16_to_float},
    {GgmlType::tq1_0,   "TQ1_0",   256, 54,  nullptr},
    {GgmlType::tq2_0,   "TQ2_0",   256, 66,  nullptr},
    {GgmlType::mxfp4,   "MXFP4",   32,  17,  nullptr},
    {GgmlType::nvfp4,   "NVFP4",   64,  36,  nullptr},
    {GgmlType::q1_0,    "Q1_0",    128, 18,  nullptr},
};
// clang-format on

constexpr bool ids_ascending() {
    for (size_t i = 1; i < std::size(kGgmlTypes); ++i)
        if (kGgmlTypes[i - 1].type >= kGgmlTypes[i].type) return false;
    return true;
}
static_assert(ids_ascending(), "kGgmlTypes rows must follow the type ids");

template <class Block>
constexpr bool block_matches(GgmlType t, uint32_t elems) {
    for (const auto& row : kGgmlTypes)
        if (row.type == t) return row.block_bytes == sizeof(Block) && row.block_elems == elems;
    return false;
}
static_assert(block_matches<BlockQ4_0>(GgmlType::q4_0, kGgmlQk) &&
                  block_matches<BlockQ4_1>(GgmlType::q4_1, kGgmlQk) &&
                  block_matches<BlockQ5_0>(GgmlType::q5_0, kGgmlQk) &&
                  block_matches<BlockQ5_1>(GgmlType::q5_1, kGgmlQk) &&
                  block_matches<BlockQ8_0>(GgmlType::q8_0, kGgmlQk) &&
                  block_matches<BlockQ2_K>(GgmlType::q2_k, kGgmlQkK) &&
                  block_matches<BlockQ3_K>(GgmlType::q3_k, kGgmlQkK) &&
                  block_matches<BlockQ4_K>(GgmlType::q4_k, kGgmlQkK) &&
                  block_matches<BlockQ5_K>(GgmlType::q5_k, kGgmlQkK) &&
                  block_matches<BlockQ6_K>(GgmlType::q6_k, kGgmlQkK),
              "each block struct matches its row of kGgmlTypes");

// Ids ggml has retired: Q4_2 and Q4_3 (4, 5); Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (31..33);
// IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8 (36..38).
constexpr uint32_t kRemovedIds[] = {4, 5, 31, 32, 33, 36, 37, 38};

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t id) {
    for (const auto& row : kGgmlTypes)
        if (static_cast<uint32_t>(row.type) == id) return &row;
    return nullptr;
}

const GgmlTypeTraits& ggml_type_traits(GgmlType type) {
    return *ggml_type_traits(static_cast<uint32_t>(type));
}

std::span<const GgmlTypeTraits> ggml_type_table() { return kGgmlTypes; }

bool ggml_type_removed(uint32_t id) {
    return std::find(std::begin(kRemovedIds), std::end(kRemovedIds), id) != std::end(kRemovedIds);
}

std::string gguf_dequantizable_types() {
    std::string s;
    for (const auto& row : kGgmlTypes)
        if (row.to_float) s += (s.empty() ? "" : ", ") + std::string(row.name);
    return s;
}

void gguf_dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst,
                     const std::string& file, const std::string& tensor) {
    const GgmlTypeTraits& t = ggml_type_traits(type);
    if (!t.to_float)
        throw Error(
            file, tensor,
            "ggml type " + std::string(t.name) +
                " cannot be dequantized by qforge (supported: " + gguf_dequantizable_types() + ")");
    if (src.size() % t.block_bytes != 0 || dst.size() != src.size() / t.block_bytes * t.block_elems)
        throw Error(file, tensor,
                    std::to_string(src.size()) + " bytes of " + std::string(t.name) +
                        " do not dequantize to " + std::to_string(dst.size()) + " floats");
    t.to_float(src.data(), dst.data(), src.size() / t.block_bytes);
}

}  // namespace qforge
