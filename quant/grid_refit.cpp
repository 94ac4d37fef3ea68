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

}  // namespace

double refit_grids(QType t, const float* w, uint64_t rows, uint64_t k, double* h,
                   const int32_t* codes, QGroupParams* params, int sweeps, ThreadPool* pool) {
    const QRowLayout l = *qtype_row_layout(t, k);
    const uint64_t group = l.group, groups = l.groups;
    if (qtype_traits(t).group == 0)
        throw Error("refit_grids: " + std::string(qtype_traits(t).name) +
                    " has one scale per row: no groups to refit");
    const bool with_min = qtype_traits(t).super_block != 0;
    const uint64_t panels = (rows + kRefitPanel - 1) / kRefitPanel;
    std::vector<double> row_error(rows, 0.0);
    mirror_lower(h, k);
    auto run = [&](size_t pb, size_t pe) {
        std::vector<double> res(kRefitPanel * k), g(kRefitPanel * k), step(kRefitPanel * group),
            s(kRefitPanel * groups), m(kRefitPanel * groups);
        std::vector<double> before(kRefitPanel), a(kRefitPanel * group), h1s(group),
            ha(kRefitPanel * group);
        std::vector<QGroupParams> kept(kRefitPanel * groups);  // the grids before the refit
        std::vector<uint8_t> stored(kRefitPanel);
        for (uint64_t panel = pb; panel < pe; ++panel) {
            const uint64_t r0 = panel * kRefitPanel, n = std::min(kRefitPanel, rows - r0);
            QGroupParams* p0 = params + r0 * groups;
            residuals(t, w, k, groups, group, h, codes, params, r0, n, res.data(), g.data());
            for (uint64_t i = 0; i < n; ++i) {
                before[i] = row_dot(res.data() + i * k, g.data() + i * k, k);
                for (uint64_t gi = 0; gi < groups; ++gi) {
                    s[i * groups + gi] = p0[i * groups + gi].scale;
                    m[i * groups + gi] = p0[i * groups + gi].min;
                }
            }
            for (int sweep = 0; sweep < sweeps; ++sweep)
                for (uint64_t gi = 0; gi < groups; ++gi) {
                    const uint64_t b = gi * group, e = std::min(k, b + group), nj = e - b;
                    const double* hj = h + b * k;  // H[J, :], exactly symmetric
                    // Row sums of H_JJ, the same for every row of the panel.
                    for (uint64_t j = 0; j < nj; ++j) {
                        double h1 = 0.0;
                        for (uint64_t l2 = 0; l2 < nj; ++l2) h1 += hj[j * k + b + l2];
                        h1s[j] = h1;
                    }
                    // The panel's levels A ([n][nj]: codes minus the zero) and H_JJ a for every
                    // row at once, as one product A H_JJ (H_JJ is exactly symmetric: mirror_lower
                    // made it from one triangle). One single-threaded dgemm of fixed shape: a
                    // per-row loop of the same sums was 9% of a GPTQ run's time (perf).
                    for (uint64_t i = 0; i < n; ++i) {
                        const QGroupParams& p = p0[i * groups + gi];
                        const int32_t* ci = codes + (r0 + i) * k + b;
                        for (uint64_t j = 0; j < nj; ++j) a[i * nj + j] = level(t, p, ci[j]);
                    }
                    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                                static_cast<int>(nj), static_cast<int>(nj), 1.0, a.data(),
                                static_cast<int>(nj), hj + b, static_cast<int>(k), 0.0, ha.data(),
                                static_cast<int>(nj));
                    for (uint64_t i = 0; i < n; ++i) {
                        // u = B^T g_J, M = B^T H_JJ B with B = [a, -1] (or [a]).
                        const double* av = a.data() + i * nj;
                        const double* hai = ha.data() + i * nj;
                        double ua = 0.0, u1 = 0.0, maa = 0.0, ma1 = 0.0, m11 = 0.0;
                        const double* gr = g.data() + i * k + b;
                        for (uint64_t j = 0; j < nj; ++j) {
                            ua += av[j] * gr[j];
                            u1 -= gr[j];
                            maa += av[j] * hai[j];
                            ma1 -= av[j] * h1s[j];
                            m11 += h1s[j];
                        }
                        double ds = 0.0, dm = 0.0;
                        const double det = maa * m11 - ma1 * ma1;
                        if (with_min && det > 1e-12 * maa * m11 && maa > 0.0) {
                            ds = (m11 * ua - ma1 * u1) / det;
                            dm = (maa * u1 - ma1 * ua) / det;
                        } else if (maa > 0.0) {
                            ds = ua / maa;
                        }
                        s[i * groups + gi] += ds;
                        m[i * groups + gi] += dm;
                        double* st = step.data() + i * nj;
                        for (uint64_t j = 0; j < nj; ++j) {
                            st[j] = ds * av[j] - dm;  // the change of q_J
                            res[i * k + b + j] -= st[j];
                        }
                    }
                    // g -= step * H[J, :]
                    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                                static_cast<int>(k), static_cast<int>(nj), -1.0, step.data(),
                                static_cast<int>(nj), hj, static_cast<int>(k), 1.0, g.data(),
                                static_cast<int>(k));
                }
            // Store, measure again on the stored grids, keep a row's refit only when it is better.
            std::copy(p0, p0 + n * groups, kept.begin());
            for (uint64_t i = 0; i < n; ++i)
                if (!store_grids(t, group, groups, s.data() + i * groups, m.data() + i * groups,
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
    if (pool)
        pool->parallel_for(panels, run);
    else
        run(0, panels);
    double total = 0.0;
    for (uint64_t r = 0; r < rows; ++r) total += row_error[r];
    return total;
}

}  // namespace qforge
