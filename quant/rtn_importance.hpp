// Importance-weighted grid search: the scale and zero of one group chosen to minimise
//   E(p) = sum_j a_j (w_j - deq_p(q_p(w_j)))^2
// where a_j >= 0 is the importance of input column j (the diagonal of the layer's Hessian
// H = 2/N X^T X, i.e. twice the mean squared activation of that input on the calibration data)
// and q_p rounds to nearest on grid p. For a fixed grid, rounding to nearest minimises every term
// whatever a_j is, so the search is over grids (scale, zero) only and the stored codes stay the
// type table's (qtype_quantize_value): every kernel and importer reads them unchanged.
//
// The candidates, in this order (the first of equal errors wins, so a group where nothing beats
// the min-max grid keeps it, byte for byte):
//   0.  qtype_group_params: the min-max grid every method uses without importance.
//   For i = 0 .. kImportanceSteps - 1, d_i = L + (i - kImportanceSteps / 2) / 10, where L is the
//   grid's span in steps (asymmetric: 2^bits - 1 steps across [min(0, lo), max(0, hi)];
//   symmetric: the 8 steps (q8: 127) from zero to the element m of largest magnitude):
//   T_i  the trial grid: scale = range / d_i rounded to nearest fp16 (symmetric: m / -d_i for q4s,
//        |m| / d_i for q8, the signs qtype_group_params uses), zero = round(-lo / scale) clamped
//        (symmetric: the implicit zero).
//   A_i  a least-squares refit to the codes c_j that T_i gives, weighted by a: asymmetric, the
//        (scale, offset) minimising sum a (w - scale c - offset)^2, then zero = round(-offset /
//        scale) clamped and scale = sum a w (c - zero) / sum a (c - zero)^2 for that integer
//        zero; symmetric, scale = sum a w (c - z) / sum a (c - z)^2. Scale rounded to nearest
//        fp16; refits with a non-positive denominator, or an asymmetric scale <= 0, are skipped.
//   U_i  the same refit with every a_j = 1 (only when importance is given: else it is A_i).
//   Level types (q4nl_*, q4t_*: w = scale * level, no zero; q4t_* against the row's levels, which
//   quantize_row_importance fits first with the same importance): L = 127 (the lowest level's
//   magnitude) and
//   d_i = L + i - kImportanceSteps / 2 in whole levels, T_i = m / -d_i, and also m / e_i with
//   e_i = 113 + i - kImportanceSteps / 2 (m on the highest level), each with its refits
//   scale = sum a w level / sum a level^2 (llama.cpp's IQ4_NL search: trial scales around
//   max / -127, each refit to its levels by weighted least squares).
// So the candidates of the unweighted search (a == 1: 0, T_i, A_i) are among the weighted one's,
// and its weighted error is never larger than the unweighted choice's (tested against a float64
// brute force). Candidates whose scale overflows fp16 or rounds to zero are skipped. The errors
// are summed in float64 in a fixed order (four interleaved partial sums, columns j mod 4, added
// pairwise): deterministic, independent of threads.
//
// This is llama.cpp's make_qx_quants / make_qkx2_quants idea (scan trial scales around the
// range, refit the scale to the codes by weighted least squares) restated for our grids: integer
// zero points and binary16 scales, chosen by the exact weighted error of the stored grid.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "formats/qtype.hpp"

namespace qforge {

inline constexpr int kImportanceSteps = 21;  // d from L - 1 to L + 1 in tenths

// Weight j's importance: a[j], or 1 for every weight without importances (a null).
inline double importance_weight(const double* a, uint64_t j) { return a ? a[j] : 1.0; }

// The weighted least-squares line w ~ scale * c + offset through n (code, weight) pairs with
// importance a (null: all 1), its sums in float64 in order; scc = sum a c^2 and swc = sum a w c
// give the best line through the origin (scale = swc / scc). nullopt when the codes do not vary.
struct LineFit {
    double scale, offset, scc, swc;
};
std::optional<LineFit> weighted_line_fit(const int32_t* codes, const float* w, const double* a,
                                         uint64_t n);

// The weighted error E(p) of grid p for n weights w with importance a (a null: all 1), float64.
double importance_grid_error(QType t, const QGroupParams& p, const float* w, const double* a,
                             uint64_t n);

// The grid of n finite weights w chosen by the search above; a null means all-1 importance.
// nullopt when even the min-max grid's scale overflows fp16. Learned-table types search against
// the row's levels (fit_row_levels; required), which every candidate grid carries.
std::optional<QGroupParams> importance_group_grid(QType t, const float* w, const double* a,
                                                  uint64_t n, const int8_t* row_levels = nullptr);

// One row of k weights quantized with each group's importance_group_grid (importance: k
// columns), packed as quantize_row_ref packs (pack_row). Same statuses as quantize_row_ref.
// Super-block types: quantize_row_super's search (quant/rtn_super.hpp); importance_group_grid
// for them treats the group as a super-block of its own.
QuantStatus quantize_row_importance(QType t, const float* w, const double* importance, uint64_t k,
                                    uint8_t* row);

}  // namespace qforge
