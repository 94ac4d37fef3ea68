// GPTQ (Frantar et al., arXiv 2210.17323; IST-DASLab/gptq gptq.py): quantizes a linear layer's
// weights W [rows = out][k = in] column by column, each column's rounding error spread over the
// columns not yet quantized through the upper Cholesky factor U of H^-1, where H = 2/N X^T X is
// the Hessian of the layer's inputs (quant/hessian.hpp). The grid is the type table's
// (formats/qtype.hpp: qtype_group_params, scale rounded up to fp16), the same as RTN's and AWQ's.
//
// The steps, in float64 (W and the inverse Hessian), as in the reference implementation:
//  1. Dead inputs: where H[d][d] == 0, H[d][d] = 1 and W[:, d] = 0 (the input is always zero on
//     the calibration data, so its weights cannot be fitted; the zeroed column also stays out
//     of its group's range).
//  2. Act-order: columns visited in the order of diag(H) descending (a stable sort, so ties keep
//     the original order), always with static groups: every group's grid is computed before the
//     column loop from W (step 1 applied) in original column order, so the packed rows are in
//     original order and inference needs no permutation or g_idx.
//  3. Damping: damp * mean(diag H) is added to the diagonal. If the Cholesky factorisation fails
//     (H not numerically positive definite: fewer tokens than inputs, duplicated inputs), damp
//     doubles (starting from kGptqFirstRaise when it was 0) and the factorisation is retried,
//     up to kGptqMaxDamp; the damp used and the number of raises are reported.
//  4. U = upper Cholesky factor of H^-1, computed as the inverse of a reversed Cholesky factor
//     of H (one dpotrf and one dtrtri: half the flops of inverse-then-factor; gptq.cpp derives
//     it).
//  5. Column loop in blocks of `block` columns with lazy batch updates: inside a block each
//     column's error err = (w - q) / U[i][i] updates the block's later columns at once; the
//     columns after the block get W[:, i2:] -= Err1 * U[i1:i2, i2:] (one dgemm) when it ends.
//     Without act-order each group's grid is computed when the loop reaches the group's first
//     column, on the weights updated by every earlier column (for a group that runs past the
//     block's end, its later columns are brought up to date first). One-grid-per-row types (q8)
//     use a grid computed once per row, before the loop.
//  6. Grids: the type table's min-max grid (qtype_group_params), or with `mse` > 0 the best of
//     that range shrunk by 1 - i/100, i = 0 .. 79, for the least sum |w - q(w)|^mse over the
//     group's weights (the reference implementation's Quantizer with mse=True and GPTQModel's
//     `mse` option, norm 2.4 there): outliers clipped where that lowers the error of the rest.
//     With `importance`, the importance-weighted search instead (quant/rtn_importance.hpp), the
//     importance of column c being H[c][c] as given (0 for dead inputs): the grid that minimises
//     sum_c H[c][c] (w_c - q(w_c))^2, the output error if the inputs were uncorrelated.
//     Super-block types (q4k_g32, q3k_g32): the super-block's fp16 d and dmin are fixed when the
//     loop reaches its first column (from its 256 weights as updated so far: the reference
//     min-max rule, or with importance quant/rtn_super.hpp's search), each group's 6-bit scale
//     and min at the group's first column against them, so every column is rounded on the grid
//     the file stores. mse > 0 is refused for them.
//  7. With `refit` > 0 (grouped types), the codes fixed, each group's scale (and min) is moved to
//     its least-squares value on the full H (quant/grid_refit.hpp): the grids of step 6 were
//     chosen before their columns were rounded, from diag(H) alone. A row keeps the new grids
//     only when its output error is lower; output_error is then measured on the stored rows.
//
// Determinism: OpenBLAS runs single-threaded (BlasSingleThread, quant/hessian.hpp: its own
// threads change results in the last bits); rows are processed in fixed panels, one thread per
// panel, and every product has a geometry that depends only on the shapes. So the bytes depend
// only on the inputs, whatever the number of threads (tested for 1 and 2 pool threads with
// OpenBLAS set to 1 or 2 threads beforehand).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "formats/qtype.hpp"

namespace qforge {

class ThreadPool;

// Damping schedule when the factorisation fails (step 3 above).
inline constexpr double kGptqFirstRaise = 1e-4;  // the first damp tried when 0 was asked
inline constexpr double kGptqMaxDamp = 1.0;      // the mean diagonal itself: no higher
// The grid search of step 6: shrink factors 1 - i / kGptqMseGrid for i < kGptqMseShrinkSteps.
inline constexpr int kGptqMseGrid = 100;
inline constexpr int kGptqMseShrinkSteps = 80;  // down to 0.21 of the range
inline constexpr double kGptqMseNorm = 2.4;     // the norm --mse uses

struct GptqOptions {
    QType qtype = QType::q4_g128;  // any quantized type of the table
    double damp = 0.01;            // fraction of mean(diag H) added to the diagonal
    bool act_order = false;        // visit columns by diag(H) descending (static groups)
    double mse = 0.0;              // > 0: grids searched for the least sum |w - q|^mse (step 6)
    bool importance = false;       // grids by the diag(H)-weighted search (step 6); not with mse
    uint64_t block = 128;          // columns per lazy batch update
    int refit = 0;                 // > 0: grids refitted to the codes, this many sweeps (step 7)
    // Also measure RTN's output error and the weights' output norm on the same H: two products
    // with H, 4 * rows * k^2 flops, more than GPTQ's own column loop (the lead's pipeline may
    // prefer to skip them on big layers).
    bool measure = true;
    // With measure: those two products in float32 (ssymm on H rounded to float32, each row's
    // form summed in float64): about half the time, each (H e)_i within (k + 4) 2^-24 of
    // sum_j |H_ij e_j| (the test derives it). For reports that print four digits: the
    // calibration pipeline's per-linear line and record (GPTQ on SmolLM2-135M: 4.4 -> 2.7 s).
    bool measure_f32 = false;
};

struct GptqResult {
    std::vector<uint8_t> packed;  // rows * qtype_row_bytes(qtype, k): the quantized rows
    double damp_used = 0.0;       // the damp that was applied (>= options.damp)
    int damp_raises = 0;          // how many times it was raised
    // GPTQ's own loss: sum over all weights of (w - q)^2 / U[i][i]^2 / 2, w the updated weight.
    double loss = 0.0;
    // trace(E H E^T) = 2/N ||X E^T||^2, E = W - Q, for the H given (no damping): the output
    // error on the calibration data. Exact and free: 2 * loss - damp * mean(diag H) * ||E||^2
    // (gptq.cpp derives it); hessian_output_error gives the same by a product with H.
    double output_error = 0.0;
    // With options.measure (NaN otherwise), for the same H:
    double rtn_output_error = 0.0;    // RTN's rows (quantize_row_ref of W)
    double weight_output_norm = 0.0;  // trace(W H W^T): relative error = output_error / this
};

// The grid of one group of n weights (step 6): qtype_group_params's, with mse > 0 the searched
// one, or with importance (n values, non-null) the importance-weighted one. nullopt when the
// scale overflows fp16. Learned-table types: against the row's levels (required).
std::optional<QGroupParams> gptq_group_grid(QType t, double mse, const float* v, uint64_t n,
                                            const double* importance = nullptr,
                                            const int8_t* levels = nullptr);

// Quantizes w ([rows][k] float32, row-major, finite) with the Hessian h (k * k, float64,
// symmetric; only its lower triangle and diagonal are read). Row panels are split over `pool`'s
// threads (or run on the caller when null); the factorisation of H runs on the caller's thread.
// Throws qforge::Error on bad arguments, non-finite inputs, a negative diagonal, a factorisation
// that fails even at kGptqMaxDamp, or a group whose scale overflows fp16.
GptqResult gptq_quantize(const float* w, uint64_t rows, uint64_t k, std::vector<double> h,
                         const GptqOptions& o, ThreadPool* pool = nullptr);

// trace((W - Q) H (W - Q)^T) for packed rows of qtype t (rows * qtype_row_bytes(t, k) bytes):
// the output error of any method's rows on the same calibration data (H's lower triangle and
// diagonal are read).
double hessian_output_error(const float* w, QType t, const uint8_t* packed, uint64_t rows,
                            uint64_t k, const std::vector<double>& h, ThreadPool* pool = nullptr);

}  // namespace qforge
