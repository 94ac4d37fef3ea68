#include "sources/tensor_cast.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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
    const auto misfit = [&](uint64_t i, float f) {
        if (!std::isfinite(f))
            return Error(file, v.name,
                         "element " + std::to_string(i) + " is " + value_text(f) +
                             " (weights must be finite)");
        if (target == QType::f16)
            return Error(file, v.name,
                         "element " + std::to_string(i) + " = " + value_text(f) +
                             " overflows f16 (max 65504); convert with --dtype f32 or bf16");
        return Error(file, v.name,
                     "element " + std::to_string(i) + " = " + value_text(f) + " overflows bf16");
    };
    if (source == target) {
        if (!all_finite(v.data, source))
            for (uint64_t i = 0; i < n; ++i)
                if (const float f = load(v.data.data(), source, i); !std::isfinite(f))
                    throw misfit(i, f);
        return v.data;
    }
    // Through formats' store_float_row, the one narrowing rule, a chunk at a time.
    const uint64_t out_size = dtype_info(qtype_traits(target).dtype).size;
    resize_for(buffer, n * out_size, file, v.name);
    std::vector<float> chunk(std::min<uint64_t>(n, 4096));
    for (uint64_t i0 = 0; i0 < n; i0 += chunk.size()) {
        const uint64_t m = std::min<uint64_t>(chunk.size(), n - i0);
        for (uint64_t j = 0; j < m; ++j) chunk[j] = load(v.data.data(), source, i0 + j);
        uint8_t* out = buffer.data() + i0 * out_size;
        if (const uint64_t bad = store_float_row(target, chunk.data(), m, out); bad < m)
            throw misfit(i0 + bad, chunk[bad]);
    }
    return buffer;
}

}  // namespace qforge
