// Grid refit: with a row's codes fixed (GPTQ's, after its column loop), each group's scale (and
// for super-block types its min) is moved to the value that minimises the layer's output error
// on the calibration data, trace((W - Q) H (W - Q)^T), with the full H: GPTQ chose each grid
// before the columns it covers were rounded, from diag(H) alone, so the grid no longer is the
// best one for the codes that came out.
//
// The method, per row (rows are independent): the group of columns J has q_J = s a_J - m (a_J
// the codes' levels minus the zero; m only for super-block types, 0 otherwise), so q = B d with
// d the row's unknowns (a scale per group, and a min) and B the k x nu matrix of their columns
// (a_J, or -1, on J). The error (w - B d)^T H (w - B d) is a quadratic in d with the small
// normal matrix M = B^T H B (nu x nu) and gradient B^T H r, r = w - q. Both are formed once per
// row: H r by one product with H (which also gives the error before), M from one product of the
// row's levels per group with H's rows of that group, over half of H by symmetry (the mins'
// blocks are the same for every row). Then block Gauss-Seidel on the small system: groups in
// order, each step (ds, dm) the solution of its group's 2 x 2 (1 x 1 without the min) block
// against the current gradient, and every unknown's gradient moved by M's columns times the
// step, so every step lowers the error and the sweeps converge to the joint least-squares
// values. (The same iterates as updating H r itself after each group, a k x group product per
// step; the small system makes a sweep cost nu^2 instead of k^2 per row.) Then the values are
// stored as the type stores them: the fp16 nearest each scale (zero points and levels
// unchanged), or for super-block types each super-block's d and dmin from its largest scale and
// min (qtype_super_from_groups) and each group's nearest 6-bit sc and mn (scales and mins below
// 0 clamp to 0). A row keeps its refitted grids only when its output error, measured again
// exactly on the stored grids, is lower.
//
// Cost: three products with H per row, about 2.5 rows k^2 * 2 flops whatever the sweeps (H r
// before and after, M over half of H), against 6 rows k^2 * 2 when each of 4 sweeps updated H r
// itself: on SmolLM2's shapes (576 x 1536, 1536 x 576; 2 threads) 2.2-2.5x faster for q4_g128
// and 1.9-2.1x for q4k_g32, with the same stored grids as that form for every grouped type
// (checked once against it, 40 rows of 544: bit-identical). Memory: each thread's panel of normal
// matrices, nu^2 doubles a row, at most 32 MiB (fewer rows a panel for many groups: an 8B
// model's down_proj in q4k_g32 has nu = 896). An 8B model's down_proj (4096 x 14336) still needs
// about 4e12 flops (estimated; --no-refit skips it).
//
// Determinism: rows in fixed panels, single-threaded BLAS products of shapes that depend only on
// the layer (BlasSingleThread must be alive, quant/hessian.hpp), so the grids do not depend on
// the number of threads.
#pragma once

#include <cstdint>

#include "formats/qtype.hpp"

namespace qforge {

class ThreadPool;

inline constexpr int kGridRefitSweeps = 4;  // Gauss-Seidel sweeps over a row's groups

// Refits params (rows * groups grids of qtype t, groups = its layout's) to codes (rows * k,
// column order) for the weights w (rows * k, float32) and H (k * k row-major; its lower triangle
// and diagonal are read, and its upper triangle is overwritten with their mirror, so h ends
// symmetric: GPTQ's inverse factor, kept there, is no longer needed by then); learned-table grids
// carry their row's levels. Grouped types only (an Error for one scale per row). Returns
// trace((W - Q) H (W - Q)^T) for the grids it leaves in params.
double refit_grids(QType t, const float* w, uint64_t rows, uint64_t k, double* h,
                   const int32_t* codes, QGroupParams* params, int sweeps,
                   ThreadPool* pool = nullptr);

}  // namespace qforge
