// Grid refit: with a row's codes fixed (GPTQ's, after its column loop), each group's scale (and
// for super-block types its min) is moved to the value that minimises the layer's output error
// on the calibration data, trace((W - Q) H (W - Q)^T), with the full H: GPTQ chose each grid
// before the columns it covers were rounded, from diag(H) alone, so the grid no longer is the
// best one for the codes that came out.
//
// The method, per row (rows are independent): r = w - q and g = H r; the group of columns J has
// q_J = s a_J - m (a_J the codes' levels minus the zero; m only for super-block types, 0
// otherwise), so a step (ds, dm) changes r_J by -B (ds, dm), B = [a_J, -1], and the best step is
// the solution of (B^T H_JJ B) d = B^T g_J (1 x 1 without the min). Groups are visited in order
// and g is updated after each (block Gauss-Seidel), so every step lowers the error and the sweeps
// converge to the joint least-squares values. Then the values are stored as the type stores them:
// the fp16 nearest each scale (zero points and levels unchanged), or for super-block types each
// super-block's d and dmin from its largest scale and min (qtype_super_from_groups) and each
// group's nearest 6-bit sc and mn (scales and mins below 0 clamp to 0). A row keeps its refitted
// grids only when its output error, measured again exactly on the stored grids, is lower.
//
// Cost: per sweep, one update of g per group (a dgemm of the panel's steps by H's rows J), 2 rows
// k^2 flops, and H_JJ a for the panel's rows (one dgemm per group, 2 rows k group flops), plus two
// products with H for the errors before and after: about 6 rows k^2 * 2 flops at 4 sweeps, a few
// times GPTQ's own column loop (rows k^2 * 2); small next to the calibration forward for models up
// to ~1B (SmolLM2: k <= 1536), but an 8B model's down_proj (4096 x 14336) needs about 1e13 flops, a
// few minutes per layer on 2 cores (estimated, not measured; --no-refit skips it).
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
