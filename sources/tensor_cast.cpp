#include "sources/tensor_cast.hpp"

#include <cmath>
#include <cstring>

#include "core/alloc.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace qforge {

namespace {

float load(const uint8_t* p, QType t, uint64_t i) {
    switch (t) {
        case QType::f32: {
            float f;
            std::memcpy(&f, p + 4 * i, 4);
            return f;
        }
        case QType::f16:
        case QType::bf16: {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            return t == QType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        default:  // float sources only
            break;
    }
    return 0.0f;
}

void store(uint8_t* p, QType t, uint64_t i, float f) {
    switch (t) {
        case QType::f32:
            std::memcpy(p + 4 * i, &f, 4);
            return;
        case QType::f16:
        case QType::bf16: {
            const uint16_t h = t == QType::f16 ? f32_to_f16(f) : f32_to_bf16(f);
            std::memcpy(p + 2 * i, &h, 2);
            return;
        }
        default:  // float targets only
            return;
    }
}

// Bit-level test for NaN/Inf (exponent all ones), so the common case, a finite tensor that
// keeps its type, costs one pass of integer compares.
bool all_finite(std::span<const uint8_t> data, QType t) {
    if (t == QType::f32) {
        for (size_t i = 0; i + 4 <= data.size(); i += 4) {
            uint32_t b;
            std::memcpy(&b, data.data() + i, 4);
            if ((b & 0x7f800000u) == 0x7f800000u) return false;
        }
        return true;
    }
    const uint16_t exp_mask = t == QType::f16 ? 0x7c00 : 0x7f80;
    for (size_t i = 0; i + 2 <= data.size(); i += 2) {
        uint16_t h;
        std::memcpy(&h, data.data() + i, 2);
        if ((h & exp_mask) == exp_mask) return false;
    }
    return true;
}

std::string value_text(float f) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
    return buf;
}

}  // namespace

std::span<const uint8_t> cast_tensor(const TensorView& v, QType source, QType target,
                                     const std::string& file, std::vector<uint8_t>& buffer) {
    const uint64_t n = v.data.size() / dtype_info(v.dtype).size;
    const bool narrowing_to_f16 = target == QType::f16 && source != QType::f16;
    const bool narrowing_to_bf16 = target == QType::bf16 && source == QType::f32;
    const bool check_each = !all_finite(v.data, source) || narrowing_to_f16 || narrowing_to_bf16;
    for (uint64_t i = 0; check_each && i < n; ++i) {
        const float f = load(v.data.data(), source, i);
        if (!std::isfinite(f))
            throw Error(file, v.name, "element " + std::to_string(i) + " is " + value_text(f) +
                                          " (weights must be finite)");
        if (narrowing_to_f16 && f16_overflows(f))
            throw Error(file, v.name, "element " + std::to_string(i) + " = " + value_text(f) +
                                          " overflows f16 (max 65504); convert with --dtype f32 or bf16");
        if (narrowing_to_bf16 && std::isinf(bf16_to_f32(f32_to_bf16(f))))
            throw Error(file, v.name, "element " + std::to_string(i) + " = " + value_text(f) +
                                          " overflows bf16");
    }
    if (source == target) return v.data;
    resize_for(buffer, n * dtype_info(qtype_traits(target).dtype).size, file, v.name);
    for (uint64_t i = 0; i < n; ++i) store(buffer.data(), target, i, load(v.data.data(), source, i));
    return buffer;
}

}  // namespace qforge
