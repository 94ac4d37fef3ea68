// The importance-weighted grids of the super-block types (quant/rtn_super.hpp has the steps).
#include "quant/rtn_super.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant/rtn_importance.hpp"

namespace qforge {

namespace {

struct FloatGrid {
    double scale = 0.0, min = 0.0;  // w ~ scale * code - min
};

double float_grid_error(const FloatGrid& g, int32_t top, const float* w, const double* a,
                        uint64_t n) {
    double e = 0.0;
    for (uint64_t j = 0; j < n; ++j) {
        const double c =
            g.scale > 0 ? std::clamp(std::nearbyint((w[j] + g.min) / g.scale), 0.0, double(top))
                        : 0.0;
        const double d = w[j] - (g.scale * c - g.min);
        e += importance_weight(a, j) * d * d;
    }
    return e;
}

// Step 1: the group's float grid.
FloatGrid search_group(QType t, const float* w, const double* a, uint64_t n) {
    const int32_t top = qtype_max_code(t);
    double lo = 0.0, hi = 0.0;
    for (uint64_t j = 0; j < n; ++j) {
        lo = std::min(lo, double(w[j]));
        hi = std::max(hi, double(w[j]));
    }
    FloatGrid best{(hi - lo) / top, -lo};
    if (!(hi > lo)) return best;
    double best_error = float_grid_error(best, top, w, a, n);
    std::vector<int32_t> codes(n);
    for (int i = 0; i < kSuperSearchSteps; ++i) {
        const double iscale = (top - 1 + i / 10.0) / (hi - lo);
        for (uint64_t j = 0; j < n; ++j)
            codes[j] = static_cast<int32_t>(
                std::clamp(std::nearbyint(iscale * (w[j] - lo)), 0.0, double(top)));
        const auto fit = weighted_line_fit(codes.data(), w, a, n);
        if (!fit) continue;
        double scale = fit->scale, offset = fit->offset;
        if (offset > 0) {  // the grid must reach 0 from below: offset 0, scale refitted
            offset = 0;
            scale = fit->scc > 0 ? fit->swc / fit->scc : 0.0;
        }
        if (!(scale > 0) || !std::isfinite(scale)) continue;
        const FloatGrid g{scale, -offset};
        const double e = float_grid_error(g, top, w, a, n);
        if (e < best_error) {
            best_error = e;
            best = g;
        }
    }
    return best;
}

}  // namespace

std::optional<QSuperParams> importance_super_grid(QType t, const float* w, const double* a,
                                                  uint64_t n) {
    const uint64_t group = qtype_traits(t).group, groups = (n + group - 1) / group;
    std::vector<float> scale(groups), min(groups);
    for (uint64_t g = 0; g < groups; ++g) {
        const uint64_t b = g * group, m = std::min(n, b + group) - b;
        const FloatGrid fg = search_group(t, w + b, a ? a + b : nullptr, m);
        scale[g] = static_cast<float>(fg.scale);
        min[g] = static_cast<float>(fg.min);
    }
    return qtype_super_from_groups(scale.data(), min.data(), groups);
}

QGroupParams importance_super_group(QType t, const QSuperParams& sp, const float* w,
                                    const double* a, uint64_t n) {
    const FloatGrid fg = search_group(t, w, a, n);
    const QGroupParams nearest =
        qtype_group_nearest(sp, static_cast<float>(fg.scale), static_cast<float>(fg.min));
    QGroupParams best = nearest;
    double best_error = importance_grid_error(t, best, w, a, n);
    for (int ds = -1; ds <= 1; ++ds)
        for (int dm = -1; dm <= 1; ++dm) {
            const int sc = nearest.sc + ds, mn = nearest.mn + dm;
            if ((ds == 0 && dm == 0) || sc < 0 || mn < 0 || sc > kSuperCodeMax ||
                mn > kSuperCodeMax)
                continue;
            const QGroupParams p = qtype_group_nearest(sp, sp.d * static_cast<float>(sc),
                                                       sp.dmin * static_cast<float>(mn));
            const double e = importance_grid_error(t, p, w, a, n);
            if (e < best_error) {
                best_error = e;
                best = p;
            }
        }
    return best;
}

QuantStatus quantize_row_super(QType t, const float* w, const double* importance, uint64_t k,
                               uint8_t* row) {
    for (uint64_t j = 0; j < k; ++j)
        if (!std::isfinite(w[j])) return QuantStatus::non_finite;
    const QTypeTraits& tr = qtype_traits(t);
    const QRowLayout l = *qtype_row_layout(t, k);
    std::vector<int32_t> codes(k);
    std::vector<QGroupParams> groups(l.groups);
    for (uint64_t b = 0; b < k; b += tr.super_block) {
        const uint64_t e = std::min(k, b + tr.super_block);
        const double* ab = importance ? importance + b : nullptr;
        const auto sp = importance_super_grid(t, w + b, ab, e - b);
        if (!sp) return QuantStatus::scale_overflow;
        for (uint64_t g = b; g < e; g += l.group) {
            const uint64_t n = std::min(e, g + l.group) - g;
            const QGroupParams p =
                importance_super_group(t, *sp, w + g, importance ? importance + g : nullptr, n);
            groups[g / l.group] = p;
            for (uint64_t j = g; j < g + n; ++j) codes[j] = qtype_quantize_value(t, p, w[j]);
        }
    }
    pack_row(t, codes.data(), groups.data(), k, row);
    return QuantStatus::ok;
}

}  // namespace qforge
