// Grids of the super-block types (formats/qtype.hpp: q4k_g32, q3k_g32; w = scale * code - min,
// scale = d * sc, min = dmin * mn, sc and mn 6-bit) chosen with importance, for RTN --calib and
// GPTQ --importance:
//   1. each group's float (scale, min >= 0) by a weighted search: for i = 0 .. kSuperSearchSteps
//      - 1, trial codes c = round((w - lo) * (L - 1 + i / 10) / (hi - lo)) clamped (L the code
//      count, lo = min(0, min w)); the weighted least-squares (scale, offset) for those codes
//      (offset clamped to <= 0 and the scale refitted when it came out positive); the candidate
//      with the least sum a (w - q(w))^2 on the unquantized grid wins, the min-max grid first
//      (llama.cpp's make_qkx2_quants, with our importance);
//   2. d and dmin: the fp16 round-up of the largest group scale and min over 63
//      (qtype_super_from_groups), so the largest fit in 6 bits;
//   3. each group's sc, mn the nearest 6-bit values, then the best of their 3 x 3 neighbours by
//      the weighted error of the stored grid (codes re-fitted to it: round to nearest).
// Without importance (a null) every weight counts 1. Deterministic: float64 sums in column order.
#pragma once

#include <cstdint>
#include <optional>

#include "formats/qtype.hpp"

namespace qforge {

inline constexpr int kSuperSearchSteps = 21;  // trial code counts L - 1 .. L + 1 in tenths

// Steps 1 and 2 for the super-block of n <= 256 weights w (importance a: n values, or null).
std::optional<QSuperParams> importance_super_grid(QType t, const float* w, const double* a,
                                                  uint64_t n);
// Steps 1 and 3 for one group of n <= 32 weights against super-block sp.
QGroupParams importance_super_group(QType t, const QSuperParams& sp, const float* w,
                                    const double* a, uint64_t n);

// One row of a super-block type quantized this way (importance: k values, or null), packed.
QuantStatus quantize_row_super(QType t, const float* w, const double* importance, uint64_t k,
                               uint8_t* row);

}  // namespace qforge
