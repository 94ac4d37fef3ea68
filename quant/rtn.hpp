// Round-to-nearest (RTN) quantization of a float matrix: each row on its own through the
// reference quantizer (quantize_row_ref, formats/qtype.hpp), rows split over threads.
//
// Determinism: a row's bytes depend only on that row, and every row is written by exactly one
// thread, so the output is byte-identical whatever the number of threads. When rows fail, the
// failure reported is the one of the lowest row, also whatever the number of threads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "formats/qtype.hpp"

namespace qforge {

class ThreadPool;

// Why a row could not be stored, and where: the first offending element of the lowest bad row.
struct RowFailure {
    QuantStatus status;  // non_finite or scale_overflow
    uint64_t row;
    uint64_t col;  // non_finite: the first NaN/Inf; scale_overflow: the largest |w|
    float value;
};

// Converts `rows` rows of `k` weights stored as float type `source` (src: rows * k elements,
// row-major) into `target` rows (out: qtype_tensor_bytes(target, {rows, k}) bytes). `target` may
// be a float type too (rounding to nearest even). Rows are split over `pool`'s threads, or run on
// the caller when pool is null. With `importance` (k values, one per input column, e.g. the
// diagonal of the layer's Hessian), each group's grid is the importance-weighted search's
// (quant/rtn_importance.hpp) instead of the min-max grid. Returns the failure of the lowest bad
// row, if any; `out` is then unspecified.
std::optional<RowFailure> rtn_quantize(QType source, std::span<const uint8_t> src, uint64_t rows,
                                       uint64_t k, QType target, std::span<uint8_t> out,
                                       ThreadPool* pool, const double* importance = nullptr);

}  // namespace qforge
