// The reference quantizer and dequantizer of every quantized row type (formats/qtype.hpp has the
// layout and the error bounds). Plain scalar code: the truth the fast kernels are tested against.
#include "formats/qtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.hpp"

namespace qforge {

namespace {

// fp16 of |v| rounded up (toward +inf), so the stored scale never makes a group's range smaller;
// nullopt when it does not fit. Called only for groups with a non-zero range, so the result is at
// least the smallest fp16 subnormal even when v itself underflowed to 0 (float-subnormal weights).
std::optional<uint16_t> f16_round_up(float v) {
    uint16_t h = f32_to_f16(v);
    if (f16_to_f32(h) < v) ++h;  // positive binary16 values are ordered like their bits
    h = std::max<uint16_t>(h, 1);
    if ((h & 0x7c00) == 0x7c00) return std::nullopt;
    return h;
}

void put_f16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }
uint16_t get_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
}

// 3-bit code j: two bit planes (q3_code_position).
void put_q3_code(uint8_t* row, uint64_t j, int32_t code) {
    const Q3CodePosition at = q3_code_position(j);
    uint8_t& lo = row[at.low_byte];
    uint8_t& hi = row[at.high_byte];
    lo = static_cast<uint8_t>((lo & ~(3u << at.low_shift)) | ((code & 3) << at.low_shift));
    hi = static_cast<uint8_t>((hi & ~(1u << at.high_bit)) | ((code >> 2 & 1) << at.high_bit));
}

int32_t get_q3_code(const uint8_t* row, uint64_t j) {
    const Q3CodePosition at = q3_code_position(j);
    return (row[at.low_byte] >> at.low_shift & 3) | (row[at.high_byte] >> at.high_bit & 1) << 2;
}

// Code j of a row: 4-bit codes sit in 16-byte chunks of 32 (weight i low, i + 16 high nibble).
void put_code(const QTypeTraits& tr, uint8_t* row, uint64_t j, int32_t code) {
    if (tr.bits == 8) {
        row[j] = static_cast<uint8_t>(static_cast<int8_t>(code));
        return;
    }
    if (tr.bits == 3) return put_q3_code(row, j, code);
    const uint64_t chunk = j / kCodeChunk, i = j % kCodeChunk;
    uint8_t& b = row[chunk * 16 + i % 16];
    if (i < 16)
        b = static_cast<uint8_t>((b & 0xf0) | code);
    else
        b = static_cast<uint8_t>((b & 0x0f) | (code << 4));
}

int32_t get_code(const QTypeTraits& tr, const uint8_t* row, uint64_t j) {
    if (tr.bits == 8) return static_cast<int8_t>(row[j]);
    if (tr.bits == 3) return get_q3_code(row, j);
    const uint64_t chunk = j / kCodeChunk, i = j % kCodeChunk;
    const uint8_t b = row[chunk * 16 + i % 16];
    return i < 16 ? (b & 0x0f) : (b >> 4);
}

}  // namespace

uint64_t store_float_row(QType t, const float* x, uint64_t n, uint8_t* out) {
    const DType d = qtype_traits(t).dtype;
    for (uint64_t j = 0; j < n; ++j) {
        if (!std::isfinite(x[j])) return j;
        if (d == DType::f32) {
            std::memcpy(out + 4 * j, &x[j], 4);
            continue;
        }
        const uint16_t h = d == DType::f16 ? f32_to_f16(x[j]) : f32_to_bf16(x[j]);
        const uint16_t inf = d == DType::f16 ? 0x7c00 : 0x7f80;
        if ((h & 0x7fff) == inf) return j;  // a finite value rounded to infinity
        put_f16(out + 2 * j, h);
    }
    return n;
}

QuantStatus quantize_row_ref(QType t, const float* w, uint64_t k, uint8_t* row) {
    const QTypeTraits& tr = qtype_traits(t);
    for (uint64_t j = 0; j < k; ++j)
        if (!std::isfinite(w[j])) return QuantStatus::non_finite;
    if (tr.is_float)  // every weight is finite here, so a misfit is an overflow
        return store_float_row(t, w, k, row) == k ? QuantStatus::ok : QuantStatus::scale_overflow;
    const QRowLayout l = *qtype_row_layout(t, k);
    std::vector<int32_t> codes(k);
    std::vector<QGroupParams> groups(l.groups);
    for (uint64_t g = 0; g < l.groups; ++g) {
        const uint64_t b = g * l.group, e = std::min(k, b + l.group);  // real elements only
        auto p = qtype_group_params(t, w + b, e - b);
        if (!p) return QuantStatus::scale_overflow;
        groups[g] = *p;
        for (uint64_t j = b; j < e; ++j) codes[j] = qtype_quantize_value(t, *p, w[j]);
    }
    pack_row(t, codes.data(), groups.data(), k, row);
    return QuantStatus::ok;
}

std::optional<QGroupParams> qtype_group_params(QType t, const float* w, uint64_t n) {
    const QTypeTraits& tr = qtype_traits(t);
    QGroupParams p;
    p.zero = tr.implicit_zero;
    if (tr.symmetric) {
        // The element of largest magnitude (the first one on ties).
        float m = 0.0f;
        for (uint64_t j = 0; j < n; ++j)
            if (std::fabs(w[j]) > std::fabs(m)) m = w[j];
        if (m != 0.0f) {
            // q8: amax / 127, positive. q4s: m / -8, so m lands exactly on code 0 (= -8).
            const float s = tr.bits == 8 ? std::fabs(m) / 127.0f : std::fabs(m) / 8.0f;
            auto h = f16_round_up(s);
            if (!h) return std::nullopt;
            const bool negate = tr.bits == 4 && m > 0.0f;
            p.scale_bits = static_cast<uint16_t>(*h | (negate ? 0x8000 : 0));
        }
    } else {
        float lo = 0.0f, hi = 0.0f;  // the range always includes 0
        for (uint64_t j = 0; j < n; ++j) {
            lo = std::min(lo, w[j]);
            hi = std::max(hi, w[j]);
        }
        if (hi > lo) {
            auto h = f16_round_up((hi - lo) / static_cast<float>(qtype_max_code(t)));
            if (!h) return std::nullopt;
            p.scale_bits = *h;
            p.zero = static_cast<int32_t>(std::clamp(std::nearbyint(-lo / f16_to_f32(p.scale_bits)),
                                                     0.0f, static_cast<float>(qtype_max_code(t))));
        }
    }
    p.scale = f16_to_f32(p.scale_bits);
    return p;
}

int32_t qtype_quantize_value(QType t, const QGroupParams& p, float w) {
    if (p.scale == 0.0f) return p.zero;
    const float r = std::nearbyint(w / p.scale) + static_cast<float>(p.zero);
    return static_cast<int32_t>(std::clamp(r, static_cast<float>(qtype_min_code(t)),
                                           static_cast<float>(qtype_max_code(t))));
}

void pack_row(QType t, const int32_t* codes, const QGroupParams* groups, uint64_t k, uint8_t* row) {
    const QTypeTraits& tr = qtype_traits(t);
    const QRowLayout l = *qtype_row_layout(t, k);
    std::memset(row, 0, l.row_bytes);
    for (uint64_t j = 0; j < k; ++j) put_code(tr, row, j, codes[j]);
    for (uint64_t g = 0; g < l.groups; ++g) {
        put_f16(row + l.scales_offset + 2 * g, groups[g].scale_bits);
        if (!tr.symmetric) row[l.zeros_offset + g] = static_cast<uint8_t>(groups[g].zero);
    }
    // Codes past k: the last group's zero, so they dequantize to exactly 0.
    const int32_t zero = tr.symmetric ? tr.implicit_zero : groups[l.groups - 1].zero;
    for (uint64_t j = k; j < round_up(k, qtype_code_chunk(t)); ++j) put_code(tr, row, j, zero);
}

void dequantize_row_ref(QType t, const uint8_t* row, uint64_t k, float* out) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float) {
        for (uint64_t j = 0; j < k; ++j) {
            if (tr.dtype == DType::f32)
                std::memcpy(&out[j], row + 4 * j, 4);
            else if (tr.dtype == DType::f16)
                out[j] = f16_to_f32(get_f16(row + 2 * j));
            else
                out[j] = bf16_to_f32(get_f16(row + 2 * j));
        }
        return;
    }
    const QRowLayout l = *qtype_row_layout(t, k);
    for (uint64_t j = 0; j < k; ++j) {
        const uint64_t g = j / l.group;
        const float s = f16_to_f32(get_f16(row + l.scales_offset + 2 * g));
        const int32_t z = tr.symmetric ? tr.implicit_zero : row[l.zeros_offset + g];
        out[j] = s * static_cast<float>(get_code(tr, row, j) - z);
    }
}

float row_group_scale(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    const QRowLayout l = *qtype_row_layout(t, k);
    return f16_to_f32(get_f16(row + l.scales_offset + 2 * g));
}

int32_t row_code(QType t, const uint8_t* row, uint64_t j) {
    return get_code(qtype_traits(t), row, j);
}

int32_t row_group_zero(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.symmetric) return tr.implicit_zero;
    return row[qtype_row_layout(t, k)->zeros_offset + g];
}

}  // namespace qforge
