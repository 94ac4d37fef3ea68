#include "quant/block_forward.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/qdot.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

BlockForward::BlockForward(const ModelConfig& config, uint64_t sequences, uint64_t seq_len,
                           ThreadPool& pool)
    : c_(config), sequences_(sequences), seq_len_(seq_len), pool_(pool), rope_(config, seq_len) {
    if (sequences == 0 || seq_len == 0)
        throw Error("calibration: the batch needs at least one sequence of one token");
}

void BlockForward::rms_norm(const float* x, const std::vector<float>& weight, float* out) const {
    const uint64_t d = c_.hidden_size;
    const double eps = c_.rms_norm_eps;
    pool_.parallel_for(tokens(), [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t) {
            const float* xi = x + t * d;
            double ss = 0.0;
            for (uint64_t i = 0; i < d; ++i) ss += static_cast<double>(xi[i]) * xi[i];
            const auto scale =
                static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
            for (uint64_t i = 0; i < d; ++i) out[t * d + i] = weight[i] * (xi[i] * scale);
        }
    });
}

void BlockForward::linear_f32(const float* w, uint64_t rows, uint64_t cols, const float* x,
                              uint64_t n, float* y) const {
    // y[n][rows] = x[n][cols] * W[rows][cols]^T, in fixed panels of kPanelRows weight rows x
    // kPanelTokens tokens spread over the pool, each one single-threaded sgemm: every output's
    // summation depends only on the shapes, never on the thread count (quant/hessian.hpp's
    // BlasSingleThread must be alive).
    const uint64_t row_panels = (rows + kPanelRows - 1) / kPanelRows;
    const uint64_t token_panels = (n + kPanelTokens - 1) / kPanelTokens;
    pool_.parallel_for(row_panels * token_panels, [&](size_t b, size_t e) {
        for (size_t p = b; p < e; ++p) {
            const uint64_t r0 = (p % row_panels) * kPanelRows, t0 = (p / row_panels) * kPanelTokens;
            const uint64_t nr = std::min(kPanelRows, rows - r0), nt = std::min(kPanelTokens, n - t0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt),
                        static_cast<int>(nr), static_cast<int>(cols), 1.0f, x + t0 * cols,
                        static_cast<int>(cols), w + r0 * cols, static_cast<int>(cols), 0.0f,
                        y + t0 * rows + r0, static_cast<int>(rows));
        }
    });
}

void BlockForward::linear(const Matrix& w, const float* x, uint64_t n, float* y,
                          const std::vector<float>* bias) const {
    std::vector<float> wf(w.rows * w.cols);
    pool_.parallel_for(w.rows, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) row_to_f32(w.qtype, w.row(r), wf.data() + r * w.cols, w.cols);
    });
    linear_f32(wf.data(), w.rows, w.cols, x, n, y);
    if (bias && !bias->empty())
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t r = 0; r < w.rows; ++r) y[t * w.rows + r] += (*bias)[r];
}

void BlockForward::attention(float* q, float* k, const float* v, float* out) const {
    const uint64_t hd = c_.head_dim, qd = c_.q_dim(), kvd = c_.kv_dim(), half = hd / 2;
    const uint64_t group = c_.num_heads / c_.num_kv_heads;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    pool_.parallel_for(tokens(), [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t) {
            const uint64_t pos = t % seq_len_;
            const float* cs = rope_.cos.data() + pos * half;
            const float* sn = rope_.sin.data() + pos * half;
            for (uint64_t h = 0; h < c_.num_heads; ++h) rope_rotate(q + t * qd + h * hd, cs, sn, half);
            for (uint64_t h = 0; h < c_.num_kv_heads; ++h)
                rope_rotate(k + t * kvd + h * hd, cs, sn, half);
        }
    });
    // One task per (token, query head): scores over the keys of its sequence up to itself.
    pool_.parallel_for(tokens() * c_.num_heads, [&](size_t b, size_t e) {
        std::vector<float> s(seq_len_);
        for (size_t task = b; task < e; ++task) {
            const uint64_t t = task / c_.num_heads, h = task % c_.num_heads, kvh = h / group;
            const uint64_t first = t - t % seq_len_, len = t % seq_len_ + 1;
            const float* qh = q + t * qd + h * hd;
            float m = -INFINITY;
            for (uint64_t j = 0; j < len; ++j) {
                s[j] = dot_short(qh, k + (first + j) * kvd + kvh * hd, hd) * scale;
                m = std::max(m, s[j]);
            }
            float sum = 0.0f;
            for (uint64_t j = 0; j < len; ++j) sum += (s[j] = std::exp(s[j] - m));
            const float inv = 1.0f / sum;
            float* o = out + t * qd + h * hd;
            std::fill(o, o + hd, 0.0f);
            for (uint64_t j = 0; j < len; ++j) axpy(s[j] * inv, v + (first + j) * kvd + kvh * hd, o, hd);
        }
    });
}

void BlockForward::swiglu(const float* gate, const float* up, float* out, uint64_t n) const {
    pool_.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    });
}

std::vector<float> embed_tokens(const Model& model, const std::vector<int32_t>& tokens) {
    const uint64_t d = model.config().hidden_size;
    std::vector<float> x(tokens.size() * d);
    for (size_t t = 0; t < tokens.size(); ++t) {
        if (tokens[t] < 0 || static_cast<uint64_t>(tokens[t]) >= model.config().vocab_size)
            throw Error(model.path(), {}, "calibration token id " + std::to_string(tokens[t]) +
                                              " is outside the vocabulary");
        row_to_f32(model.embed().qtype, model.embed().row(static_cast<uint64_t>(tokens[t])),
                   x.data() + t * d, d);
    }
    return x;
}

void run_layer(const BlockForward& f, const LayerWeights& w, std::vector<float>& x) {
    const ModelConfig& c = f.config();
    const uint64_t n = f.tokens(), d = c.hidden_size;
    std::vector<float> h(n * d), q(n * c.q_dim()), k(n * c.kv_dim()), v(n * c.kv_dim()),
        a(n * c.q_dim());
    f.rms_norm(x.data(), w.attn_norm, h.data());
    f.linear(w.q, h.data(), n, q.data(), &w.q_bias);
    f.linear(w.k, h.data(), n, k.data(), &w.k_bias);
    f.linear(w.v, h.data(), n, v.data(), &w.v_bias);
    f.attention(q.data(), k.data(), v.data(), a.data());
    f.linear(w.o, a.data(), n, h.data());
    for (uint64_t i = 0; i < n * d; ++i) x[i] += h[i];
    f.rms_norm(x.data(), w.mlp_norm, h.data());
    std::vector<float> g(n * c.intermediate_size), u(n * c.intermediate_size);
    f.linear(w.gate, h.data(), n, g.data());
    f.linear(w.up, h.data(), n, u.data());
    f.swiglu(g.data(), u.data(), g.data(), g.size());
    f.linear(w.down, g.data(), n, h.data());
    for (uint64_t i = 0; i < n * d; ++i) x[i] += h[i];
}

}  // namespace qforge
