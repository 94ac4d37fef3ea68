#include "quant/awq.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/cpu/group_codes.hpp"
#include "quant/hessian.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

uint64_t group_size(QType t, uint64_t k) {
    const uint32_t g = qtype_traits(t).group;
    return g == 0 ? k : std::min<uint64_t>(g, k);
}

void require_size(const std::vector<float>& v, uint64_t n, const char* what) {
    if (!v.empty() && v.size() != n)
        throw Error(std::string("awq: ") + what + " has " + std::to_string(v.size()) +
                    " entries, expected " + std::to_string(n));
}

}  // namespace

std::vector<float> awq_scales(const std::vector<double>& x_mean, double alpha) {
    std::vector<float> s(x_mean.size());
    if (s.empty()) return s;
    double lo = 0.0, hi = 0.0;
    for (size_t i = 0; i < s.size(); ++i) {
        const double v = std::max(std::pow(x_mean[i], alpha), static_cast<double>(kAwqMinScale));
        s[i] = static_cast<float>(v);
        lo = i == 0 ? v : std::min(lo, v);
        hi = i == 0 ? v : std::max(hi, v);
    }
    const double norm = std::sqrt(hi * lo);
    for (auto& v : s) v = static_cast<float>(v / norm);
    return s;
}

void awq_fake_quantize(QType t, const float* w, uint64_t rows, uint64_t k, const float* s,
                       float* out, ThreadPool* pool) {
    const uint64_t gs = group_size(t, k);
    std::string failure;  // the first error, raised on the caller's thread
    parallel_for(pool, rows, [&](uint64_t r0, uint64_t r1) {
        std::vector<float> row(k);
        std::vector<int32_t> codes(k);
        int8_t levels[16] = {};  // learned-table types: the scaled row's levels
        for (uint64_t r = r0; r < r1; ++r) {
            for (uint64_t c = 0; c < k; ++c) row[c] = s ? w[r * k + c] * s[c] : w[r * k + c];
            if (qtype_has_row_levels(t)) fit_row_levels(row.data(), nullptr, k, gs, levels);
            for (uint64_t c0 = 0; c0 < k; c0 += gs) {
                const uint64_t n = std::min(gs, k - c0);
                const float* ws = row.data() + c0;
                auto p = qtype_group_params(t, ws, n, levels);
                if (!p) {
                    if (failure.empty())
                        failure = std::to_string(r) + ", column " + std::to_string(c0);
                    return;
                }
                group_codes(t, *p, ws, n, codes.data());
                for (uint64_t j = 0; j < n; ++j) {
                    const float q = qtype_dequantize_value(t, *p, codes[j]);
                    out[r * k + c0 + j] = s ? q / s[c0 + j] : q;
                }
            }
        }
    });
    if (!failure.empty())
        throw Error("awq: the group at row " + failure + " overflows fp16 when scaled for " +
                    std::string(qtype_traits(t).name));
}

AwqScaleSearch awq_search_scales(const std::vector<double>& x_mean,
                                 const std::vector<AwqLinear>& linears, uint64_t k,
                                 const AwqEvaluate& evaluate, int grid, ThreadPool* pool) {
    if (x_mean.size() != k) throw Error("awq: x_mean has the wrong size");
    if (grid < 1) throw Error("awq: the alpha grid needs at least one point");
    AwqScaleSearch r;
    std::vector<std::vector<float>> candidate(linears.size());
    for (int i = 0; i < grid; ++i) {
        const double alpha = static_cast<double>(i) / grid;
        const std::vector<float> s = awq_scales(x_mean, alpha);
        for (size_t l = 0; l < linears.size(); ++l) {
            const AwqLinear& a = linears[l];
            if (!qtype_is_quantized(a.qtype)) {
                candidate[l].assign(a.w, a.w + a.rows * k);
                continue;
            }
            candidate[l].resize(a.rows * k);
            awq_fake_quantize(a.qtype, a.w, a.rows, k, s.data(), candidate[l].data(), pool);
        }
        const double e = evaluate(candidate);
        r.errors.push_back(e);
        if (i == 0 || e < r.errors[static_cast<size_t>(r.best)]) {
            r.best = i;
            r.alpha = alpha;
            r.scales = s;
        }
    }
    return r;
}

namespace {

// trace((W - Q) H (W - Q)^T) with products in T (quadratic_forms or quadratic_forms_f32), each
// difference formed in float64 and then held as T.
template <class T>
double hessian_error(const float* w, const float* q, uint64_t rows, uint64_t k,
                     const std::vector<T>& h, ThreadPool* pool) {
    if (h.size() != k * k) throw Error("awq: H has the wrong size");
    const auto fill = [&](uint64_t r, T* e) {
        for (uint64_t c = 0; c < k; ++c)
            e[c] = static_cast<T>(static_cast<double>(w[r * k + c]) -
                                  static_cast<double>(q[r * k + c]));
    };
    if constexpr (std::is_same_v<T, double>)
        return quadratic_forms(h.data(), k, rows, 1, pool, fill)[0];
    else
        return quadratic_forms_f32(h.data(), k, rows, 1, pool, fill)[0];
}

}  // namespace

double awq_hessian_error(const float* w, const float* q, uint64_t rows, uint64_t k,
                         const std::vector<double>& h, ThreadPool* pool) {
    return hessian_error(w, q, rows, k, h, pool);
}

double awq_hessian_error_f32(const float* w, const float* q, uint64_t rows, uint64_t k,
                             const std::vector<float>& hf, ThreadPool* pool) {
    return hessian_error(w, q, rows, k, hf, pool);
}

std::vector<double> awq_scale_hessian(const std::vector<double>& h, const std::vector<float>& s) {
    const uint64_t k = s.size();
    if (h.size() != k * k) throw Error("awq: H has the wrong size");
    std::vector<double> out(k * k);
    for (uint64_t i = 0; i < k; ++i)
        for (uint64_t j = 0; j < k; ++j)
            out[i * k + j] = h[i * k + j] / (static_cast<double>(s[i]) * s[j]);
    return out;
}

AwqClipStats awq_clip(QType t, float* w, uint64_t rows, uint64_t k, const std::vector<double>& h,
                      ThreadPool* pool) {
    if (h.size() != k * k) throw Error("awq: H has the wrong size");
    const uint64_t gs = group_size(t, k), groups = (k + gs - 1) / gs;
    std::vector<uint64_t> clipped(rows, 0);
    std::string failure;
    parallel_for(pool, rows, [&](uint64_t r0, uint64_t r1) {
        // Candidate i's clamped weights, and its error d_i = Q(c_i) - w: rows of d, and d H_gg.
        std::vector<float> c(kAwqClipSteps * gs);
        std::vector<double> d(kAwqClipSteps * gs), dh(d.size());
        std::vector<int32_t> codes(gs);
        int8_t levels[16] = {};  // learned-table types: the row's levels, before clipping
        for (uint64_t r = r0; r < r1; ++r) {
            if (qtype_has_row_levels(t)) fit_row_levels(w + r * k, nullptr, k, gs, levels);
            for (uint64_t g = 0; g < groups; ++g) {
                const uint64_t c0 = g * gs, n = std::min(gs, k - c0);
                float* wg = w + r * k + c0;
                float amax = 0.0f;
                for (uint64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(wg[j]));
                if (amax == 0.0f) continue;
                for (int i = 0; i < kAwqClipSteps; ++i) {
                    const float m = amax * (1.0f - static_cast<float>(i) / kAwqClipGrid);
                    float* ci = c.data() + static_cast<uint64_t>(i) * n;
                    double* di = d.data() + static_cast<uint64_t>(i) * n;
                    for (uint64_t j = 0; j < n; ++j) ci[j] = std::clamp(wg[j], -m, m);
                    auto p = qtype_group_params(t, ci, n, levels);
                    if (!p) {
                        if (failure.empty())
                            failure = std::to_string(r) + ", column " + std::to_string(c0);
                        return;
                    }
                    group_codes(t, *p, ci, n, codes.data());
                    for (uint64_t j = 0; j < n; ++j)
                        di[j] =
                            static_cast<double>(qtype_dequantize_value(t, *p, codes[j])) - wg[j];
                }
                cblas_dsymm(CblasRowMajor, CblasRight, CblasLower, kAwqClipSteps,
                            static_cast<int>(n), 1.0, h.data() + c0 * k + c0, static_cast<int>(k),
                            d.data(), static_cast<int>(n), 0.0, dh.data(), static_cast<int>(n));
                double best_err = 0.0;
                int best_i = 0;
                for (int i = 0; i < kAwqClipSteps; ++i) {
                    double err = 0.0;
                    for (uint64_t j = 0; j < n; ++j)
                        err += d[static_cast<uint64_t>(i) * n + j] *
                               dh[static_cast<uint64_t>(i) * n + j];
                    if (i == 0 || err < best_err) {
                        best_err = err;
                        best_i = i;
                    }
                }
                if (best_i > 0) {
                    const float* ci = c.data() + static_cast<uint64_t>(best_i) * n;
                    std::copy(ci, ci + n, wg);
                    clipped[r] += 1;
                }
            }
        }
    });
    if (!failure.empty())
        throw Error("awq: the group at row " + failure + " overflows fp16 for " +
                    std::string(qtype_traits(t).name));
    AwqClipStats st;
    st.groups = rows * groups;
    for (auto v : clipped) st.clipped += v;
    return st;
}

void awq_fold(const ModelConfig& c, AwqBlock& b, const AwqBlockScales& s) {
    const uint64_t d = c.hidden_size, inter = c.intermediate_size, qd = c.q_dim();
    require_size(s.qkv, d, "the q/k/v scales");
    require_size(s.vo, qd, "the v -> o scales");
    require_size(s.gate_up, d, "the gate/up scales");
    require_size(s.down, inter, "the down scales");
    if (!s.vo.empty() && !awq_scales_v_to_o(c))
        throw Error("awq: v -> o scales need as many kv heads as heads (v and o differ in shape)");
    auto scale_columns = [](std::vector<float>& w, uint64_t k, const std::vector<float>& sc) {
        for (size_t i = 0; i < w.size(); ++i) w[i] *= sc[i % k];
    };
    auto divide_rows = [](std::vector<float>& w, uint64_t k, const std::vector<float>& sc) {
        for (size_t i = 0; i < w.size(); ++i) w[i] /= sc[i / k];
    };
    auto divide = [](std::vector<float>& v, const std::vector<float>& sc) {
        for (size_t i = 0; i < v.size(); ++i) v[i] /= sc[i];
    };
    if (!s.qkv.empty()) {
        divide(b.attn_norm, s.qkv);
        scale_columns(b.q, d, s.qkv);
        scale_columns(b.k, d, s.qkv);
        scale_columns(b.v, d, s.qkv);
    }
    if (!s.vo.empty()) {
        divide_rows(b.v, d, s.vo);
        divide(b.v_bias, s.vo);
        scale_columns(b.o, qd, s.vo);
    }
    if (!s.gate_up.empty()) {
        divide(b.mlp_norm, s.gate_up);
        scale_columns(b.gate, d, s.gate_up);
        scale_columns(b.up, d, s.gate_up);
    }
    if (!s.down.empty()) {
        divide_rows(b.up, d, s.down);
        scale_columns(b.down, inter, s.down);
    }
}

}  // namespace qforge
