#include "runtime/reference_forward.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"
#include "core/half.hpp"
#include "runtime/rope.hpp"

namespace qforge {

namespace {

using Vec = std::vector<double>;

// y = W x (+ b), W stored [rows][cols].
Vec matvec(const Matrix& w, const Vec& x, const std::vector<float>* bias = nullptr) {
    Vec y(w.rows, 0.0);
    std::vector<float> row(w.cols);
    for (uint64_t r = 0; r < w.rows; ++r) {
        dequantize_row_ref(w.qtype, w.row(r), w.cols, row.data());
        if (w.col_perm) {  // stored column j multiplies input col_perm[j]
            std::vector<float> in_order(w.cols);
            for (uint64_t j = 0; j < w.cols; ++j) in_order[w.col_perm[j]] = row[j];
            row = std::move(in_order);
        }
        double s = 0.0;
        for (uint64_t c = 0; c < w.cols; ++c) s += static_cast<double>(row[c]) * x[c];
        y[r] = s + (bias && !bias->empty() ? (*bias)[r] : 0.0);
    }
    return y;
}

Vec rms_norm(const Vec& x, const std::vector<float>& weight, double eps) {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = weight[i] * x[i] * scale;
    return y;
}

// QK-norm: each head of v (heads of hd) RMS-normalized with the same weight.
void head_norm(Vec& v, uint64_t hd, const std::vector<float>& weight, double eps) {
    for (uint64_t at = 0; at < v.size(); at += hd) {
        const Vec head(v.begin() + static_cast<std::ptrdiff_t>(at),
                       v.begin() + static_cast<std::ptrdiff_t>(at + hd));
        const Vec y = rms_norm(head, weight, eps);
        std::copy(y.begin(), y.end(), v.begin() + static_cast<std::ptrdiff_t>(at));
    }
}

double gelu_tanh(double x) {
    return 0.5 * x *
           (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

void softcap(Vec& v, double cap) {
    if (cap > 0.0)
        for (double& s : v) s = std::tanh(s / cap) * cap;
}

void rope(double* v, const Vec& inv_freq, uint64_t pos) {
    const size_t half = inv_freq.size();
    for (size_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos) * inv_freq[i];
        const double c = std::cos(angle), s = std::sin(angle);
        const double a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

}  // namespace

std::vector<std::vector<double>> reference_forward(const Model& model,
                                                   std::span<const int32_t> tokens, bool kv_f16) {
    const ModelConfig& c = model.config();
    const uint64_t n = tokens.size(), d = c.hidden_size, hd = c.head_dim;
    const Vec global_freq = rope_inv_freq(c);
    const Vec local_freq = c.rope_local_theta > 0.0 ? rope_inv_freq(c, true) : global_freq;
    const ArchitectureFeatures& features = architecture_features(c.arch);
    // Gemma's normalizer: sqrt(hidden_size) as a float32 tensor.
    const double embed_scale =
        features.scaled_embedding ? static_cast<float>(std::sqrt(static_cast<double>(d))) : 1.0;

    std::vector<Vec> x(n, Vec(d));
    for (uint64_t t = 0; t < n; ++t) {
        if (tokens[t] < 0 || static_cast<uint64_t>(tokens[t]) >= c.vocab_size)
            throw Error("reference_forward: token id " + std::to_string(tokens[t]) +
                        " out of range");
        std::vector<float> row(d);
        dequantize_row_ref(model.embed().qtype, model.embed().row(static_cast<uint64_t>(tokens[t])),
                           d, row.data());
        for (uint64_t i = 0; i < d; ++i) x[t][i] = row[i] * embed_scale;
    }

    for (uint64_t layer = 0; layer < c.num_layers; ++layer) {
        const LayerWeights& w = model.layers()[layer];
        const uint64_t window = c.attention_window(layer);
        const Vec& inv_freq = c.local_rope(layer) ? local_freq : global_freq;
        std::vector<Vec> q(n), k(n), v(n);
        for (uint64_t t = 0; t < n; ++t) {
            const Vec h = rms_norm(x[t], w.attn_norm, c.rms_norm_eps);
            q[t] = matvec(w.q, h, &w.q_bias);
            k[t] = matvec(w.k, h, &w.k_bias);
            v[t] = matvec(w.v, h, &w.v_bias);
            if (!w.q_norm.empty()) head_norm(q[t], hd, w.q_norm, c.rms_norm_eps);
            if (!w.k_norm.empty()) head_norm(k[t], hd, w.k_norm, c.rms_norm_eps);
            for (uint64_t head = 0; head < c.num_heads; ++head)
                rope(q[t].data() + head * hd, inv_freq, t);
            for (uint64_t head = 0; head < c.num_kv_heads; ++head)
                rope(k[t].data() + head * hd, inv_freq, t);
            if (kv_f16)
                for (Vec* r : {&k[t], &v[t]})
                    for (double& e : *r) e = f16_to_f32(f32_to_f16(static_cast<float>(e)));
        }
        const uint64_t group = c.num_heads / c.num_kv_heads;
        for (uint64_t t = 0; t < n; ++t) {
            Vec att(c.q_dim(), 0.0);
            for (uint64_t head = 0; head < c.num_heads; ++head) {
                const uint64_t kvh = head / group;
                // Keys at positions above t - window only, in a windowed layer.
                const uint64_t first = window && t + 1 > window ? t + 1 - window : 0;
                Vec scores(t + 1, -INFINITY);
                double max_score = -INFINITY;
                for (uint64_t j = first; j <= t; ++j) {
                    double s = 0.0;
                    for (uint64_t i = 0; i < hd; ++i) s += q[t][head * hd + i] * k[j][kvh * hd + i];
                    s *= c.query_scale();
                    if (c.attn_logit_softcapping > 0.0)
                        s = std::tanh(s / c.attn_logit_softcapping) * c.attn_logit_softcapping;
                    scores[j] = s;
                    max_score = std::max(max_score, scores[j]);
                }
                double sum = 0.0;
                for (double& s : scores) sum += (s = std::exp(s - max_score));
                for (uint64_t j = first; j <= t; ++j)
                    for (uint64_t i = 0; i < hd; ++i)
                        att[head * hd + i] += scores[j] / sum * v[j][kvh * hd + i];
            }
            Vec o = matvec(w.o, att);
            if (features.sandwich_norms) o = rms_norm(o, w.attn_post_norm, c.rms_norm_eps);
            for (uint64_t i = 0; i < d; ++i) x[t][i] += o[i];

            const Vec h = rms_norm(x[t], w.mlp_norm, c.rms_norm_eps);
            Vec gate = matvec(w.gate, h);
            const Vec up = matvec(w.up, h);
            for (size_t i = 0; i < gate.size(); ++i)
                gate[i] = (features.gelu_tanh ? gelu_tanh(gate[i])
                                              : gate[i] / (1.0 + std::exp(-gate[i]))) *
                          up[i];
            Vec down = matvec(w.down, gate);
            if (features.sandwich_norms) down = rms_norm(down, w.mlp_post_norm, c.rms_norm_eps);
            for (uint64_t i = 0; i < d; ++i) x[t][i] += down[i];
        }
    }

    std::vector<Vec> logits(n);
    for (uint64_t t = 0; t < n; ++t) {
        logits[t] = matvec(model.lm_head(), rms_norm(x[t], model.final_norm(), c.rms_norm_eps));
        softcap(logits[t], c.final_logit_softcapping);
    }
    return logits;
}

}  // namespace qforge
