// Grid refit (quant/grid_refit.hpp has the method).
#include "quant/grid_refit.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

constexpr uint64_t kRefitPanel = 64;  // rows per panel: one thread's unit, one dgemm's height
// Bound on a panel's normal matrices (refit_panel_rows).
constexpr uint64_t kRefitSystemBytes = uint64_t{32} << 20;

// H made whole in place from its lower triangle and diagonal (the upper triangle overwritten by
// their mirror): each group's rows H[J, :] are then one contiguous run, read in place by every
// panel and sweep (copying them out per group, panel and sweep, half of it transposed, was 6% of
// a GPTQ run), with no second k * k copy (1.6 GB at an 8B model's k = 14336).
void mirror_lower(double* h, uint64_t k) {
    for (uint64_t i = 0; i < k; ++i)
        for (uint64_t j = 0; j < i; ++j) h[j * k + i] = h[i * k + j];
}

// The level code c of a group stands for (the group's step multiplies it; the min is apart).
double level(QType t, const QGroupParams& p, int32_t code) {
    return static_cast<double>(qtype_code_level(t, code, p.levels) - p.zero);
}

// out[i][j] = w - q for rows [r0, r0 + n), and g = out * H.
void residuals(QType t, const float* w, uint64_t k, uint64_t groups, uint64_t group,
               const double* h, const int32_t* codes, const QGroupParams* params, uint64_t r0,
               uint64_t n, double* res, double* g) {
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t r = r0 + i;
        for (uint64_t c = 0; c < k; ++c) {
            const QGroupParams& p = params[r * groups + c / group];
            res[i * k + c] = static_cast<double>(w[r * k + c]) -
                             static_cast<double>(qtype_dequantize_value(t, p, codes[r * k + c]));
        }
    }
    cblas_dsymm(CblasRowMajor, CblasRight, CblasLower, static_cast<int>(n), static_cast<int>(k),
                1.0, h, static_cast<int>(k), res, static_cast<int>(k), 0.0, g, static_cast<int>(k));
}

double row_dot(const double* a, const double* b, uint64_t k) {
    double s = 0.0;
    for (uint64_t j = 0; j < k; ++j) s += a[j] * b[j];
    return s;
}

// The stored grids nearest the continuous values of one row: fp16 scales, or super-blocks.
// False when a value does not fit (the row then keeps its former grids).
bool store_grids(QType t, uint64_t group, uint64_t groups, const double* s, const double* m,
                 QGroupParams* p) {
    const uint64_t super = qtype_traits(t).super_block;
    if (!super) {
        for (uint64_t g = 0; g < groups; ++g) {
            const float v = static_cast<float>(s[g]);
            const uint16_t bits = f32_to_f16(v);
            if (!std::isfinite(v) || (bits & 0x7fff) >= 0x7c00) return false;
            p[g].scale_bits = bits;
            p[g].scale = f16_to_f32(bits);
        }
        return true;
    }
    const uint64_t per = super / group;
    for (uint64_t g0 = 0; g0 < groups; g0 += per) {
        const uint64_t n = std::min(per, groups - g0);
        float sc[32], mn[32];
        for (uint64_t g = 0; g < n; ++g) {
            if (!std::isfinite(s[g0 + g]) || !std::isfinite(m[g0 + g])) return false;
            sc[g] = std::max(0.0f, static_cast<float>(s[g0 + g]));
            mn[g] = std::max(0.0f, static_cast<float>(m[g0 + g]));
        }
        const auto sp = qtype_super_from_groups(sc, mn, n);
        if (!sp) return false;
        for (uint64_t g = 0; g < n; ++g) p[g0 + g] = qtype_group_nearest(*sp, sc[g], mn[g]);
    }
    return true;
}

// Rows per panel: kRefitPanel, fewer when their normal matrices (nu x nu doubles each) would
// pass kRefitSystemBytes. A function of the layer's shape alone, so panels stay fixed.
uint64_t refit_panel_rows(uint64_t nu) {
    return std::clamp<uint64_t>(kRefitSystemBytes / (nu * nu * sizeof(double)), 1, kRefitPanel);
}

// The normal matrices M = B^T H B of a panel's n rows (m: n of them, nu x nu, row-major), B the
// k x nu matrix of a row's unknowns (column g: the levels a_J of group g on its columns J; for
// types with a min, column groups + g: -1 on J), from the rows' levels a ([n][k]). The scale
// block a_G^T H_GH a_H comes from one product per group H, prod = A_H H[H, :] over the columns up
// to H's last (the other half by symmetry), then a dot per group G <= H; the min blocks from the
// row-independent sums (H's rows of group H summed, and their group sums). prod: n x k scratch.
void normal_matrices(uint64_t k, uint64_t group, uint64_t groups, uint64_t nu, const double* h,
                     const double* a, const double* sums, const double* ones, uint64_t n,
                     double* prod, double* m) {
    for (uint64_t gh = 0; gh < groups; ++gh) {
        const uint64_t bh = gh * group, eh = std::min(k, bh + group);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                    static_cast<int>(eh), static_cast<int>(eh - bh), 1.0, a + bh,
                    static_cast<int>(k), h + bh * k, static_cast<int>(k), 0.0, prod,
                    static_cast<int>(k));
        for (uint64_t i = 0; i < n; ++i) {
            double* mi = m + i * nu * nu;
            const double* ai = a + i * k;
            const double* pi = prod + i * k;
            for (uint64_t gg = 0; gg <= gh; ++gg) {
                double v = 0.0;
                for (uint64_t c = gg * group; c < std::min(k, (gg + 1) * group); ++c)
                    v += ai[c] * pi[c];
                mi[gg * nu + gh] = mi[gh * nu + gg] = v;
            }
        }
    }
    if (nu == groups) return;
    for (uint64_t i = 0; i < n; ++i) {
        double* mi = m + i * nu * nu;
        const double* ai = a + i * k;
        for (uint64_t gg = 0; gg < groups; ++gg)
            for (uint64_t gh = 0; gh < groups; ++gh) {
                const double* sh = sums + gh * k;
                double v = 0.0;
                for (uint64_t c = gg * group; c < std::min(k, (gg + 1) * group); ++c)
                    v -= ai[c] * sh[c];
                mi[gg * nu + groups + gh] = mi[(groups + gh) * nu + gg] = v;
                mi[(groups + gg) * nu + groups + gh] = ones[gg * groups + gh];
            }
    }
}

}  // namespace

double refit_grids(QType t, const float* w, uint64_t rows, uint64_t k, double* h,
                   const int32_t* codes, QGroupParams* params, int sweeps, ThreadPool* pool) {
    const QRowLayout l = *qtype_row_layout(t, k);
    const uint64_t group = l.group, groups = l.groups;
    if (qtype_traits(t).group == 0)
        throw Error("refit_grids: " + std::string(qtype_traits(t).name) +
                    " has one scale per row: no groups to refit");
    const bool with_min = qtype_traits(t).super_block != 0;
    const uint64_t nu = with_min ? 2 * groups : groups;  // unknowns per row: scales (and mins)
    const uint64_t panel_rows = refit_panel_rows(nu);
    const uint64_t panels = (rows + panel_rows - 1) / panel_rows;
    std::vector<double> row_error(rows, 0.0);
    mirror_lower(h, k);
    // Types with a min: what the min's unknowns see of H is the same for every row: sums[h][c],
    // the sum of H's rows of group h at column c (H 1_h), and their group sums (1_g^T H 1_h).
    std::vector<double> sums(with_min ? groups * k : 0), ones(with_min ? groups * groups : 0);
    for (uint64_t gh = 0; with_min && gh < groups; ++gh) {
        double* s = sums.data() + gh * k;
        for (uint64_t j = gh * group; j < std::min(k, (gh + 1) * group); ++j)
            for (uint64_t c = 0; c < k; ++c) s[c] += h[j * k + c];
        for (uint64_t g = 0; g < groups; ++g)
            for (uint64_t c = g * group; c < std::min(k, (g + 1) * group); ++c)
                ones[g * groups + gh] += s[c];
    }
    auto run = [&](size_t pb, size_t pe) {
        std::vector<double> res(panel_rows * k), g(panel_rows * k), a(panel_rows * k),
            prod(panel_rows * k), m(panel_rows * nu * nu), grad(nu), s(panel_rows * groups),
            mins(panel_rows * groups), before(panel_rows);
        std::vector<QGroupParams> kept(panel_rows * groups);  // the grids before the refit
        std::vector<uint8_t> stored(panel_rows);
        for (uint64_t panel = pb; panel < pe; ++panel) {
            const uint64_t r0 = panel * panel_rows, n = std::min(panel_rows, rows - r0);
            QGroupParams* p0 = params + r0 * groups;
            residuals(t, w, k, groups, group, h, codes, params, r0, n, res.data(), g.data());
            for (uint64_t i = 0; i < n; ++i) {
                before[i] = row_dot(res.data() + i * k, g.data() + i * k, k);
                for (uint64_t c = 0; c < k; ++c)
                    a[i * k + c] = level(t, p0[i * groups + c / group], codes[(r0 + i) * k + c]);
                for (uint64_t gi = 0; gi < groups; ++gi) {
                    s[i * groups + gi] = p0[i * groups + gi].scale;
                    mins[i * groups + gi] = p0[i * groups + gi].min;
                }
            }
            normal_matrices(k, group, groups, nu, h, a.data(), sums.data(), ones.data(), n,
                            prod.data(), m.data());
            for (uint64_t i = 0; i < n; ++i) {
                // The gradient B^T g at the current grids, then block Gauss-Seidel on the small
                // system: each group's step (ds, dm) solves its 2 x 2 (1 x 1) block, and the
                // gradient of every unknown moves by the matrix's columns times the step.
                const double* mi = m.data() + i * nu * nu;
                const double* ai = a.data() + i * k;
                const double* gr = g.data() + i * k;
                for (uint64_t gi = 0; gi < groups; ++gi) {
                    const uint64_t b = gi * group, e = std::min(k, b + group);
                    double ua = 0.0, u1 = 0.0;
                    for (uint64_t c = b; c < e; ++c) {
                        ua += ai[c] * gr[c];
                        u1 -= gr[c];
                    }
                    grad[gi] = ua;
                    if (with_min) grad[groups + gi] = u1;
                }
                for (int sweep = 0; sweep < sweeps; ++sweep)
                    for (uint64_t gi = 0; gi < groups; ++gi) {
                        const uint64_t si = gi, mi1 = groups + gi;
                        const double maa = mi[si * nu + si];
                        const double ma1 = with_min ? mi[si * nu + mi1] : 0.0;
                        const double m11 = with_min ? mi[mi1 * nu + mi1] : 0.0;
                        const double ua = grad[si], u1 = with_min ? grad[mi1] : 0.0;
                        double ds = 0.0, dm = 0.0;
                        const double det = maa * m11 - ma1 * ma1;
                        if (with_min && det > 1e-12 * maa * m11 && maa > 0.0) {
                            ds = (m11 * ua - ma1 * u1) / det;
                            dm = (maa * u1 - ma1 * ua) / det;
                        } else if (maa > 0.0) {
                            ds = ua / maa;
                        }
                        s[i * groups + gi] += ds;
                        mins[i * groups + gi] += dm;
                        const double* cs = mi + si * nu;  // column si (M is symmetric)
                        for (uint64_t v = 0; v < nu; ++v) grad[v] -= cs[v] * ds;
                        if (dm != 0.0) {
                            const double* cm = mi + mi1 * nu;
                            for (uint64_t v = 0; v < nu; ++v) grad[v] -= cm[v] * dm;
                        }
                    }
            }
            // Store, measure again on the stored grids, keep a row's refit only when it is better.
            std::copy(p0, p0 + n * groups, kept.begin());
            for (uint64_t i = 0; i < n; ++i)
                if (!store_grids(t, group, groups, s.data() + i * groups, mins.data() + i * groups,
                                 p0 + i * groups)) {
                    stored[i] = 0;
                    std::copy(kept.begin() + i * groups, kept.begin() + (i + 1) * groups,
                              p0 + i * groups);
                } else {
                    stored[i] = 1;
                }
            residuals(t, w, k, groups, group, h, codes, params, r0, n, res.data(), g.data());
            for (uint64_t i = 0; i < n; ++i) {
                const double after = row_dot(res.data() + i * k, g.data() + i * k, k);
                if (stored[i] && after < before[i]) {
                    row_error[r0 + i] = after;
                } else {
                    std::copy(kept.begin() + i * groups, kept.begin() + (i + 1) * groups,
                              p0 + i * groups);
                    row_error[r0 + i] = before[i];
                }
            }
        }
    };
    parallel_for(pool, panels, run);
    double total = 0.0;
    for (uint64_t r = 0; r < rows; ++r) total += row_error[r];
    return total;
}

}  // namespace qforge
