#include "quant/rtn.hpp"

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "quant/rtn_importance.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

RowFailure locate_failure(QuantStatus status, const float* w, uint64_t row, uint64_t k) {
    RowFailure f{status, row, 0, w[0]};
    for (uint64_t j = 0; j < k; ++j) {
        if (status == QuantStatus::non_finite) {
            if (!std::isfinite(w[j])) return {status, row, j, w[j]};
        } else if (std::fabs(w[j]) > std::fabs(f.value)) {
            f.col = j;
            f.value = w[j];
        }
    }
    return f;
}

// Rows [begin, end), through `w` (k floats): stops at the first bad row, which is then the
// lowest bad row of the range. Does not allocate or throw (it runs inside a pool region).
std::optional<RowFailure> quantize_rows(QType source, const uint8_t* src, uint64_t src_row_bytes,
                                        uint64_t k, QType target, uint8_t* out,
                                        uint64_t out_row_bytes, uint64_t begin, uint64_t end,
                                        float* w, const double* importance) {
    for (uint64_t r = begin; r < end; ++r) {
        dequantize_row_ref(source, src + r * src_row_bytes, k, w);  // float types: exact
        const QuantStatus s =
            quantize_row_importance(target, w, importance, k, out + r * out_row_bytes);
        if (s != QuantStatus::ok) return locate_failure(s, w, r, k);
    }
    return std::nullopt;
}

}  // namespace

std::optional<RowFailure> rtn_quantize(QType source, std::span<const uint8_t> src, uint64_t rows,
                                       uint64_t k, QType target, std::span<uint8_t> out,
                                       ThreadPool* pool, const double* importance) {
    if (qtype_is_quantized(source))
        throw Error("internal error: rtn_quantize reads float rows, not " +
                    std::string(qtype_traits(source).name));
    const uint64_t src_row = *qtype_row_bytes(source, k);
    const auto out_row = qtype_row_bytes(target, k);
    if (!out_row || src.size() != rows * src_row || out.size() != rows * *out_row)
        throw Error("internal error: rtn_quantize sizes disagree with " + std::to_string(rows) +
                    " x " + std::to_string(k));
    const size_t parts = pool && rows > 1 ? static_cast<size_t>(pool->size()) : 1;
    std::vector<float> scratch(parts * k);
    if (parts == 1)
        return quantize_rows(source, src.data(), src_row, k, target, out.data(), *out_row, 0, rows,
                             scratch.data(), importance);

    std::vector<std::optional<RowFailure>> failures(parts);
    pool->run([&](int t) {
        const size_t i = static_cast<size_t>(t);
        auto [b, e] = split_range(rows, parts, i);
        failures[i] = quantize_rows(source, src.data(), src_row, k, target, out.data(), *out_row, b,
                                    e, scratch.data() + i * k, importance);
    });
    // Parts are in row order, so the first part with a failure holds the lowest bad row.
    for (const auto& f : failures)
        if (f) return f;
    return std::nullopt;
}

}  // namespace qforge
