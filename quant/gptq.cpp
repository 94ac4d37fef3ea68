// GPTQ on one linear layer (quant/gptq.hpp has the algorithm and its determinism argument).
//
// Storage: the Hessian is one k * k row-major float64 array whose strict lower triangle keeps H
// (in the column-visiting order) while the upper triangle receives U (inverse_cholesky_upper,
// quant/hessian.hpp). A failed factorisation is retried from the lower triangle; the output
// errors are measured with it (dsymm reads the lower triangle). No second k * k array is needed
// without act-order.
//
// Threads: OpenBLAS runs single-threaded (quant/hessian.hpp says why); rows are processed in
// fixed panels of kPanelRows, each panel's column loop and lazy-update dgemms by one thread.
#include "quant/gptq.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>

#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "quant/grid_refit.hpp"
#include "quant/hessian.hpp"
#include "quant/rtn_importance.hpp"
#include "quant/rtn_super.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

constexpr uint64_t kPanelRows = 64;  // rows per lazy-update dgemm (one thread's unit)

void check_blas_size(uint64_t v, const char* what) {
    if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int>::max()))
        throw Error(std::string("GPTQ: ") + what + " = " + std::to_string(v) +
                    " is outside 1 .. 2^31 - 1");
}

// fn(r) for every r in [0, n), in contiguous parts over the pool's threads (the caller's alone
// when null).
template <class F>
void for_rows(ThreadPool* pool, uint64_t n, F&& fn) {
    parallel_for(pool, n, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) fn(r);
    });
}

std::string where(uint64_t r, uint64_t c) {
    return "[" + std::to_string(r) + "][" + std::to_string(c) + "]";
}

// Super-block types: the super-block's d and dmin from n weights, and a group's grid against
// them; importance-weighted (quant/rtn_super.hpp) when a is given, else the reference min-max.
std::optional<QSuperParams> super_grid(QType t, const float* v, uint64_t n, const double* a) {
    return a ? importance_super_grid(t, v, a, n) : qtype_super_params(t, v, n);
}
QGroupParams super_group_grid(QType t, const QSuperParams& sp, const float* v, uint64_t n,
                              const double* a) {
    return a ? importance_super_group(t, sp, v, a, n) : qtype_group_params_in(t, sp, v, n);
}

}  // namespace

std::optional<QGroupParams> gptq_group_grid(QType t, double mse, const float* v, uint64_t n,
                                            const double* importance, const int8_t* levels) {
    if (importance) return importance_group_grid(t, v, importance, n, levels);
    std::optional<QGroupParams> best = qtype_group_params(t, v, n, levels);
    if (!best || mse <= 0.0 || n == 0) return best;
    auto error = [&](const QGroupParams& p) {
        double sum = 0.0;
        for (uint64_t j = 0; j < n; ++j) {
            const double q = qtype_dequantize_value(t, p, qtype_quantize_value(t, p, v[j]));
            sum += std::pow(std::fabs(q - static_cast<double>(v[j])), mse);
        }
        return sum;
    };
    // The range's ends as qtype_group_params reads them: the element of largest magnitude
    // (symmetric), or min(0, lo) and max(0, hi).
    float lo = 0.0f, hi = 0.0f, m = 0.0f;
    for (uint64_t j = 0; j < n; ++j) {
        lo = std::min(lo, v[j]);
        hi = std::max(hi, v[j]);
        if (std::fabs(v[j]) > std::fabs(m)) m = v[j];
    }
    double best_error = error(*best);
    const bool symmetric = qtype_traits(t).symmetric;
    for (int i = 1; i < kGptqMseShrinkSteps; ++i) {
        const float f = 1.0f - static_cast<float>(i) / static_cast<float>(kGptqMseGrid);
        const float ends[2] = {lo * f, hi * f}, end = m * f;
        const auto p = symmetric ? qtype_group_params(t, &end, 1, levels)
                                 : qtype_group_params(t, ends, 2, levels);
        if (!p) continue;
        const double e = error(*p);
        if (e < best_error) {  // the widest range on ties
            best_error = e;
            best = p;
        }
    }
    return best;
}

namespace {

// The grids of row r fixed before the column loop (one per row, or act-order's static groups),
// from W with its dead inputs zeroed (weight(r, c)); importance_at(c): column c's importance or
// null; levels: the row's learned levels (learned-table types; null otherwise). Super-block
// types: each super-block's d and dmin, then its groups' grids against them.
template <class Weight, class Importance>
void static_row_grids(const GptqOptions& o, uint64_t k, uint64_t r, const Weight& weight,
                      const Importance& importance_at, const int8_t* levels, QGroupParams* params) {
    const QRowLayout l = *qtype_row_layout(o.qtype, k);
    const uint64_t group = l.group, super = qtype_traits(o.qtype).super_block;
    std::vector<float> vals(super ? super : group);
    for (uint64_t b = 0; super && b < k; b += super) {
        const uint64_t e = std::min(k, b + super);
        for (uint64_t c = b; c < e; ++c) vals[c - b] = weight(r, c);
        const auto sp = super_grid(o.qtype, vals.data(), e - b, importance_at(b));
        if (!sp) throw Error("GPTQ: the scale of group " + where(r, b / group) + " overflows fp16");
        for (uint64_t g = b; g < e; g += group)
            params[g / group] = super_group_grid(o.qtype, *sp, vals.data() + (g - b),
                                                 std::min(e, g + group) - g, importance_at(g));
    }
    for (uint64_t g = 0; !super && g < l.groups; ++g) {
        const uint64_t b = g * group, e = std::min(k, b + group);
        for (uint64_t c = b; c < e; ++c) vals[c - b] = weight(r, c);
        auto p = gptq_group_grid(o.qtype, o.mse, vals.data(), e - b, importance_at(b), levels);
        if (!p) throw Error("GPTQ: the scale of group " + where(r, g) + " overflows fp16");
        params[g] = *p;
    }
}

}  // namespace

GptqResult gptq_quantize(const float* w, uint64_t rows, uint64_t k, std::vector<double> h,
                         const GptqOptions& o, ThreadPool* pool) {
    const QTypeTraits& tr = qtype_traits(o.qtype);
    if (tr.is_float) throw Error("GPTQ: " + std::string(tr.name) + " is not a quantized type");
    check_blas_size(rows, "rows");
    check_blas_size(k, "k");
    const auto kk = checked_mul(k, k);
    const auto rk = checked_mul(rows, k);
    if (!kk || !rk) throw Error("GPTQ: the layer's size overflows 64 bits");
    if (h.size() != *kk)
        throw Error("GPTQ: the Hessian has " + std::to_string(h.size()) + " elements, expected " +
                    std::to_string(*kk));
    if (o.block == 0) throw Error("GPTQ: block must be at least 1 column");
    if (!std::isfinite(o.damp) || o.damp < 0.0)
        throw Error("GPTQ: damp " + std::to_string(o.damp) + " is not a finite value >= 0");
    if (o.importance && o.mse > 0.0)
        throw Error("GPTQ: the importance-weighted grid search and mse choose grids differently");
    const uint64_t super = tr.super_block;
    if (super && o.mse > 0.0)
        throw Error("GPTQ: mse's range search has no super-block form; " + std::string(tr.name) +
                    " takes the importance-weighted search or the min-max grid");
    // The inputs' checks over the threads, each row's first non-finite element noted, then the
    // first in order reported.
    std::vector<uint64_t> bad(std::max(rows, k), UINT64_MAX);
    for_rows(pool, rows, [&](uint64_t r) {
        for (uint64_t c = 0; c < k && bad[r] == UINT64_MAX; ++c)
            if (!std::isfinite(w[r * k + c])) bad[r] = c;
    });
    for (uint64_t r = 0; r < rows; ++r)
        if (bad[r] != UINT64_MAX)
            throw Error("GPTQ: weight " + where(r, bad[r]) + " is not finite");
    for_rows(pool, k, [&](uint64_t i) {
        for (uint64_t j = 0; j <= i && bad[i] == UINT64_MAX; ++j)
            if (!std::isfinite(h[i * k + j])) bad[i] = j;
    });
    for (uint64_t i = 0; i < k; ++i) {
        if (bad[i] != UINT64_MAX)
            throw Error("GPTQ: Hessian element " + where(i, bad[i]) + " is not finite");
        if (h[i * k + i] < 0.0)
            throw Error("GPTQ: Hessian diagonal element " + std::to_string(i) + " is negative (" +
                        std::to_string(h[i * k + i]) + ")");
    }

    const QRowLayout layout = *qtype_row_layout(o.qtype, k);
    const uint64_t group = layout.group, groups = layout.groups;

    // Step 1: dead inputs.
    std::vector<double> diag(k), importance(o.importance ? k : 0);
    std::vector<uint8_t> dead(k);
    for (uint64_t i = 0; i < k; ++i) {
        dead[i] = h[i * k + i] == 0.0;
        diag[i] = dead[i] ? 1.0 : h[i * k + i];
        if (o.importance) importance[i] = h[i * k + i];
    }
    // Importance of original columns [c, ...), or null for the unweighted grids.
    auto importance_at = [&](uint64_t c) { return o.importance ? importance.data() + c : nullptr; };
    auto weight = [&](uint64_t r, uint64_t c) { return dead[c] ? 0.0f : w[r * k + c]; };

    // Step 2: the visiting order; perm[i] is the original column visited i-th.
    std::vector<uint64_t> perm(k);
    std::iota(perm.begin(), perm.end(), uint64_t{0});
    if (o.act_order)
        std::stable_sort(perm.begin(), perm.end(),
                         [&](uint64_t a, uint64_t b) { return diag[a] > diag[b]; });

    // Learned-table types: each row's 16 levels, fitted before the loop to the row (dead inputs
    // zeroed), importance-weighted by H's diagonal when the grids are (o.importance), and fixed
    // thereafter, as act-order's static groups, so the error feedback always sees the levels the
    // file will hold. (With a diagonal H, GPTQ is then RTN, or importance RTN, byte for byte.)
    std::vector<int8_t> levels(tr.row_levels ? rows * kRowLevelsBytes : 0);
    auto levels_of = [&](uint64_t r) {
        return tr.row_levels ? levels.data() + r * kRowLevelsBytes : nullptr;
    };
    if (tr.row_levels) {
        auto fit = [&](size_t r0, size_t r1) {
            std::vector<float> vals(k);
            for (uint64_t r = r0; r < r1; ++r) {
                for (uint64_t c = 0; c < k; ++c) vals[c] = weight(r, c);
                fit_row_levels(vals.data(), importance_at(0), k, group, levels_of(r));
            }
        };
        parallel_for(pool, rows, fit);
    }

    // Grids fixed before the loop: one per row (group 0 types), or static groups (act-order).
    const bool dynamic_groups = !o.act_order && tr.group != 0;
    std::vector<QGroupParams> params(rows * groups);
    if (!dynamic_groups)
        for (uint64_t r = 0; r < rows; ++r)
            static_row_grids(o, k, r, weight, importance_at, levels_of(r),
                             params.data() + r * groups);

    // W in visiting order, float64.
    std::vector<double> wk(*rk);
    for_rows(pool, rows, [&](uint64_t r) {
        for (uint64_t i = 0; i < k; ++i) wk[r * k + i] = weight(r, perm[i]);
    });

    // Steps 3 and 4 on H in visiting order (lower triangle filled for act-order's copy).
    std::vector<double> permuted;
    double* a = h.data();
    if (o.act_order) {
        permuted.assign(*kk, 0.0);
        for (uint64_t i = 0; i < k; ++i)
            for (uint64_t j = 0; j <= i; ++j) {
                const uint64_t pi = perm[i], pj = perm[j];
                permuted[i * k + j] = pi >= pj ? h[pi * k + pj] : h[pj * k + pi];
            }
        a = permuted.data();
    }
    std::vector<double> visit_diag(k);
    for (uint64_t i = 0; i < k; ++i) visit_diag[i] = diag[perm[i]];
    double mean_diag = 0.0;  // summed in visiting order: act-order == the pre-permuted problem
    for (uint64_t i = 0; i < k; ++i) mean_diag += visit_diag[i];
    mean_diag /= static_cast<double>(k);

    const BlasSingleThread single_threaded_blas;
    GptqResult res;
    double damp = o.damp;
    while (!inverse_cholesky_upper(a, k, visit_diag, damp * mean_diag, pool)) {
        if (damp >= kGptqMaxDamp)
            throw Error("GPTQ: the Hessian is not positive definite even with damp " +
                        std::to_string(damp) + " (are the calibration inputs finite and varied?)");
        damp = damp > 0.0 ? std::min(2.0 * damp, kGptqMaxDamp) : kGptqFirstRaise;
        ++res.damp_raises;
    }
    res.damp_used = damp;
    auto u = [&](uint64_t i, uint64_t j) { return a[i * k + j]; };  // j >= i

    // Step 5: the column loop, panel by panel of rows: every row is independent given U.
    const uint64_t block = std::min(o.block, k);
    const uint64_t panels = (rows + kPanelRows - 1) / kPanelRows;
    std::vector<int32_t> codes(*rk);
    std::vector<double> row_loss(rows, 0.0), row_sq_error(rows, 0.0), row_dead_sq_error(rows, 0.0);
    std::vector<uint64_t> failed_group(rows, UINT64_MAX);
    std::vector<QSuperParams> supers(super ? rows : 0);  // each row's current super-block
    auto run_panels = [&](size_t pb, size_t pe) {
        std::vector<double> err(kPanelRows * block);
        std::vector<float> vals(dynamic_groups ? std::max(group, super) : 0);
        for (uint64_t panel = pb; panel < pe; ++panel) {
            const uint64_t r0 = panel * kPanelRows, r1 = std::min(rows, r0 + kPanelRows);
            for (uint64_t i1 = 0; i1 < k; i1 += block) {
                const uint64_t i2 = std::min(i1 + block, k), count = i2 - i1;
                for (uint64_t r = r0; r < r1; ++r) {
                    if (failed_group[r] != UINT64_MAX) continue;
                    double* wr = wk.data() + r * k;
                    double* er = err.data() + (r - r0) * count;
                    for (uint64_t i = 0; i < count; ++i) {
                        const uint64_t col = i1 + i;
                        if (dynamic_groups && col % group == 0) {
                            // Weights [col, end) as updated by columns 0 .. col - 1: those in
                            // this block are; those past it still lack this block's updates.
                            auto updated = [&](uint64_t end) {
                                for (uint64_t c = col; c < end; ++c) {
                                    double v = wr[c];
                                    if (c >= i2)
                                        for (uint64_t j = i1; j < col; ++j)
                                            v -= er[j - i1] * u(j, c);
                                    vals[c - col] = static_cast<float>(v);
                                }
                            };
                            // Super-block types: d and dmin fixed at the super-block's first
                            // column, each group's 6-bit sc and mn at its own, so the error
                            // feedback always sees the grid the file will hold.
                            if (super && col % super == 0) {
                                const uint64_t send = std::min(col + super, k);
                                updated(send);
                                const auto sp = super_grid(o.qtype, vals.data(), send - col,
                                                           importance_at(col));
                                if (!sp) {
                                    failed_group[r] = col / group;
                                    break;
                                }
                                supers[r] = *sp;
                            }
                            const uint64_t gend = std::min(col + group, k);
                            updated(gend);
                            // Without act-order, visiting order is column order.
                            const auto p =
                                super ? std::optional<QGroupParams>(
                                            super_group_grid(o.qtype, supers[r], vals.data(),
                                                             gend - col, importance_at(col)))
                                      : gptq_group_grid(o.qtype, o.mse, vals.data(), gend - col,
                                                        importance_at(col), levels_of(r));
                            if (!p) {
                                failed_group[r] = col / group;
                                break;
                            }
                            params[r * groups + col / group] = *p;
                        }
                        const uint64_t oc = perm[col];
                        const QGroupParams& p = params[r * groups + oc / group];
                        const double x = wr[col];
                        const int32_t code =
                            qtype_quantize_value(o.qtype, p, static_cast<float>(x));
                        const double q = qtype_dequantize_value(o.qtype, p, code);
                        const double e = (x - q) / u(col, col);
                        const double e0 = weight(r, oc) - q;  // against the unchanged weight
                        codes[r * k + oc] = code;
                        row_loss[r] += e * e / 2.0;
                        row_sq_error[r] += e0 * e0;
                        if (dead[oc]) row_dead_sq_error[r] += e0 * e0;
                        er[i] = e;
                        const double* urow = a + col * k;
                        for (uint64_t j = col + 1; j < i2; ++j) wr[j] -= e * urow[j];
                    }
                }
                if (i2 < k)  // W[r0:r1, i2:] -= Err1 * U[i1:i2, i2:]
                    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                                static_cast<int>(r1 - r0), static_cast<int>(k - i2),
                                static_cast<int>(count), -1.0, err.data(), static_cast<int>(count),
                                a + i1 * k + i2, static_cast<int>(k), 1.0, wk.data() + r0 * k + i2,
                                static_cast<int>(k));
            }
        }
    };
    parallel_for(pool, panels, run_panels);
    for (uint64_t r = 0; r < rows; ++r)
        if (failed_group[r] != UINT64_MAX)
            throw Error("GPTQ: the scale of group " + where(r, failed_group[r]) +
                        " overflows fp16 on the updated weights");
    double sq_error = 0.0, dead_sq_error = 0.0;
    for (uint64_t r = 0; r < rows; ++r) {
        res.loss += row_loss[r];
        sq_error += row_sq_error[r];
        dead_sq_error += row_dead_sq_error[r];
    }
    // W - Q = Err U (each column's error is err_i U[i][i] plus what earlier columns moved into
    // it), and U H_damped U^T = I, so trace((W - Q) H_damped (W - Q)^T) = ||Err||^2 = 2 * loss
    // exactly; H_damped = H + damp * mean * I with the dead inputs' diagonal 0 made 1. W - Q is
    // 0 there on grids that hold 0 exactly (integer zeros); super-block grids round 0 to their
    // nearest point, so the dead columns' squared error counts once more (0 otherwise).
    // (Clamped at 0: when W is all but exact on the grid, rounding could make it -1e-17.)
    res.output_error = std::max(0.0, 2.0 * res.loss - damp * mean_diag * sq_error - dead_sq_error);

    // The lower triangle of `h` is H as given; put its diagonal back (it held U's).
    if (!o.act_order)
        for (uint64_t i = 0; i < k; ++i) h[i * k + i] = dead[i] ? 0.0 : diag[i];
    // Step 7: the grids refitted to the codes (quant/grid_refit.hpp); the output error is then
    // the refit's own exact measure.
    if (o.refit > 0 && tr.group != 0)
        res.output_error =
            refit_grids(o.qtype, w, rows, k, h.data(), codes.data(), params.data(), o.refit, pool);

    const uint64_t row_bytes = layout.row_bytes;
    res.packed.resize(rows * row_bytes);
    for_rows(pool, rows, [&](uint64_t r) {
        pack_row(o.qtype, codes.data() + r * k, params.data() + r * groups, k,
                 res.packed.data() + r * row_bytes);
    });

    res.rtn_output_error = res.weight_output_norm = std::numeric_limits<double>::quiet_NaN();
    if (o.measure) {
        std::vector<uint8_t> rtn_failed(rows, 0);
        auto fill = [&](uint64_t r, auto* s) {  // row r of W, then of W - RTN
            using T = std::remove_pointer_t<decltype(s)>;
            std::vector<uint8_t> rtn_row(row_bytes);
            std::vector<float> rtn(k);
            const float* wr = w + r * k;
            if (quantize_row_ref(o.qtype, wr, k, rtn_row.data()) != QuantStatus::ok)
                rtn_failed[r] = 1;
            dequantize_row_ref(o.qtype, rtn_row.data(), k, rtn.data());
            for (uint64_t c = 0; c < k; ++c) {
                s[c] = wr[c];
                s[k + c] = static_cast<T>(static_cast<T>(wr[c]) - static_cast<T>(rtn[c]));
            }
        };
        std::vector<double> forms;
        if (o.measure_f32) {
            const std::vector<float> hf(h.begin(), h.end());  // its lower triangle is H's
            forms = quadratic_forms_f32(hf.data(), k, rows, 2, pool, fill);
        } else {
            forms = quadratic_forms(h.data(), k, rows, 2, pool, fill);
        }
        for (uint64_t r = 0; r < rows; ++r)
            if (rtn_failed[r]) throw Error("GPTQ: RTN cannot quantize row " + std::to_string(r));
        res.weight_output_norm = forms[0];
        res.rtn_output_error = forms[1];
    }
    return res;
}

double hessian_output_error(const float* w, QType t, const uint8_t* packed, uint64_t rows,
                            uint64_t k, const std::vector<double>& h, ThreadPool* pool) {
    check_blas_size(rows, "rows");
    check_blas_size(k, "k");
    const auto row_bytes = qtype_row_bytes(t, k);
    const auto kk = checked_mul(k, k);
    if (!row_bytes || !kk || h.size() != *kk)
        throw Error("hessian_output_error: the Hessian does not match k = " + std::to_string(k));
    const BlasSingleThread single_threaded_blas;
    return quadratic_forms(h.data(), k, rows, 1, pool, [&](uint64_t r, double* s) {
        std::vector<float> deq(k);
        dequantize_row_ref(t, packed + r * *row_bytes, k, deq.data());
        for (uint64_t c = 0; c < k; ++c) s[c] = static_cast<double>(w[r * k + c]) - deq[c];
    })[0];
}

}  // namespace qforge
