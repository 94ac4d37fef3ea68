// The importance-weighted grid search (quant/rtn_importance.hpp has the candidates and why).
#include "quant/rtn_importance.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/group_codes.hpp"
#include "quant/rtn_super.hpp"

namespace qforge {

namespace {

// A grid with this scale (nearest binary16), zero and levels (learned-table types; else null), or
// nullopt when the scale overflows fp16, rounds to zero, or is not finite.
std::optional<QGroupParams> grid(double scale, int32_t zero, const int8_t* levels) {
    if (!std::isfinite(scale)) return std::nullopt;
    const uint16_t h = f32_to_f16(static_cast<float>(scale));
    if ((h & 0x7c00) == 0x7c00 || (h & 0x7fff) == 0) return std::nullopt;
    QGroupParams p;
    p.scale_bits = h;
    p.scale = f16_to_f32(h);
    p.zero = zero;
    p.levels = levels;
    return p;
}

int32_t clamp_zero(QType t, double z) {
    return static_cast<int32_t>(std::clamp(std::nearbyint(z), 0.0, double(qtype_max_code(t))));
}

// The N sums of f(j)[i] over j < n, each an InterleavedSum (kernels/cpu/group_codes.hpp).
template <size_t N, class F>
std::array<double, N> interleaved_sums(uint64_t n, F&& f) {
    std::array<InterleavedSum, N> s;
    for (uint64_t j = 0; j < n; ++j) {
        const std::array<double, N> v = f(j);
        for (size_t i = 0; i < N; ++i) s[i].add(j, v[i]);
    }
    std::array<double, N> out;
    for (size_t i = 0; i < N; ++i) out[i] = s[i].total();
    return out;
}

// The least-squares refit of a grid to the codes that `trial` gives the weights (header, A_i).
std::optional<QGroupParams> refit(QType t, const QGroupParams& trial, const int32_t* codes,
                                  const float* w, const double* a, uint64_t n) {
    const QTypeTraits& tr = qtype_traits(t);
    int32_t zero = tr.implicit_zero;
    if (!tr.symmetric) {
        const auto fit = weighted_line_fit(codes, w, a, n);
        if (!fit || !(fit->scale > 0)) return std::nullopt;
        zero = clamp_zero(t, -fit->offset / fit->scale);
    }
    // sum a w (c - zero) and sum a (c - zero)^2: the moments' swc and scc (uniform grids: c is
    // the code), or over the levels.
    double num, den;
    if (qtype_has_levels(t)) {
        const auto sums = interleaved_sums<2>(n, [&](uint64_t j) {
            const double aj = importance_weight(a, j),
                         c = qtype_code_level(t, codes[j], trial.levels) - zero;
            return std::array<double, 2>{aj * w[j] * c, aj * c * c};
        });
        num = sums[0];
        den = sums[1];
    } else {
        const CodeMoments m = code_moments(codes, zero, w, a, n);
        num = m.swc;
        den = m.scc;
    }
    if (!(den > 0)) return std::nullopt;
    const double scale = num / den;
    if (!tr.symmetric && !(scale > 0)) return std::nullopt;
    return grid(scale, zero, trial.levels);
}

}  // namespace

std::optional<LineFit> weighted_line_fit(const int32_t* codes, const float* w, const double* a,
                                         uint64_t n) {
    const auto [s, sc, scc, sw, swc] = code_moments(codes, 0, w, a, n);
    const double det = s * scc - sc * sc;
    if (!(det > 0)) return std::nullopt;
    return LineFit{(s * swc - sc * sw) / det, (scc * sw - sc * swc) / det, scc, swc};
}

double importance_grid_error(QType t, const QGroupParams& p, const float* w, const double* a,
                             uint64_t n) {
    return group_error(t, p, w, a, n);
}

std::optional<QGroupParams> importance_group_grid(QType t, const float* w, const double* a,
                                                  uint64_t n, const int8_t* row_levels) {
    if (qtype_has_super_blocks(t)) {  // the group as a super-block of its own (qtype.hpp)
        const auto sp = importance_super_grid(t, w, a, n);
        if (!sp) return std::nullopt;
        return importance_super_group(t, *sp, w, a, n);
    }
    std::optional<QGroupParams> best = qtype_group_params(t, w, n, row_levels);
    if (!best || best->scale == 0.0f || n == 0) return best;
    const QTypeTraits& tr = qtype_traits(t);
    const int8_t* levels = tr.row_levels ? row_levels : tr.levels;  // null: a uniform grid
    const int8_t* own = tr.row_levels ? row_levels : nullptr;       // what the grids carry
    double best_error = importance_grid_error(t, *best, w, a, n);
    auto consider = [&](const std::optional<QGroupParams>& p) {
        if (!p) return;
        const double e = importance_grid_error(t, *p, w, a, n);
        if (e < best_error) {
            best_error = e;
            best = p;
        }
    };
    // The span the trial grids are built on (header): lo, hi for asymmetric types, m otherwise.
    float lo = 0.0f, hi = 0.0f, m = 0.0f;
    for (uint64_t j = 0; j < n; ++j) {
        lo = std::min(lo, w[j]);
        hi = std::max(hi, w[j]);
        if (std::fabs(w[j]) > std::fabs(m)) m = w[j];
    }
    const double steps = levels         ? -static_cast<double>(levels[0])
                         : tr.symmetric ? (tr.bits == 8 ? 127.0 : 8.0)
                                        : qtype_max_code(t);
    // Trial spans in tenths of a step; level types in whole units (their levels are 11 to 24
    // units apart, so tenths would mostly give the same codes), m on the lowest level or on the
    // highest.
    auto offset = [&](int i) {
        const int steps_off = i - kImportanceSteps / 2;
        return levels ? static_cast<double>(steps_off) : steps_off / 10.0;
    };
    // The refits depend on the trial's codes alone: a trial giving the codes of the one before
    // gives the same refits, so they are not evaluated again (equal errors never replace).
    thread_local std::vector<int32_t> codes, previous;
    codes.resize(n);
    previous.assign(n, INT32_MIN);
    auto try_grid = [&](const std::optional<QGroupParams>& trial) {
        if (!trial) return;
        consider(trial);
        group_codes(t, *trial, w, n, codes.data());
        if (codes == previous) return;
        consider(refit(t, *trial, codes.data(), w, a, n));
        if (a) consider(refit(t, *trial, codes.data(), w, nullptr, n));
        previous.swap(codes);
    };
    for (int i = 0; i < kImportanceSteps; ++i) {
        const double d = steps + offset(i);
        if (!tr.symmetric) {
            const auto s = grid((static_cast<double>(hi) - lo) / d, 0, own);
            if (s) try_grid(grid(s->scale, clamp_zero(t, -lo / s->scale), own));
        } else {
            try_grid(grid(tr.bits == 8 ? std::fabs(m) / d : m / -d, tr.implicit_zero, own));
        }
        if (levels) {
            const double top = levels[15] + offset(i);
            if (top > 0) try_grid(grid(m / top, 0, own));
        }
    }
    return best;
}

QuantStatus quantize_row_importance(QType t, const float* w, const double* importance, uint64_t k,
                                    uint8_t* row) {
    if (!qtype_is_quantized(t) || !importance) return quantize_row_ref(t, w, k, row);
    if (qtype_has_super_blocks(t)) return quantize_row_super(t, w, importance, k, row);
    for (uint64_t j = 0; j < k; ++j)
        if (!std::isfinite(w[j])) return QuantStatus::non_finite;
    const QRowLayout l = *qtype_row_layout(t, k);
    std::vector<int32_t> codes(k);
    std::vector<QGroupParams> groups(l.groups);
    int8_t levels[16] = {};
    if (qtype_has_row_levels(t)) fit_row_levels(w, importance, k, l.group, levels);
    for (uint64_t g = 0; g < l.groups; ++g) {
        const uint64_t b = g * l.group, e = std::min(k, b + l.group);
        auto p = importance_group_grid(t, w + b, importance + b, e - b, levels);
        if (!p) return QuantStatus::scale_overflow;
        groups[g] = *p;
        group_codes(t, *p, w + b, e - b, codes.data() + b);
    }
    pack_row(t, codes.data(), groups.data(), k, row);
    return QuantStatus::ok;
}

}  // namespace qforge
