// The float64 operations and bounds of backend_ops_reference.hpp (the derivations are there).
#include "backend_ops_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/half.hpp"

namespace qforge::test {

namespace {
constexpr double kU = kUnitRoundoff;
constexpr double kSecondOrder = 1.01;
constexpr uint64_t kActBlock = 32;  // int8 activation blocks (kernels/cpu/qdot.hpp)

double stored_float(QType qtype, const uint8_t* row, uint64_t j) {
    if (qtype == QType::f32) {
        float v;
        std::copy(row + 4 * j, row + 4 * j + 4, reinterpret_cast<uint8_t*>(&v));
        return v;
    }
    const auto bits = static_cast<uint16_t>(row[2 * j] | row[2 * j + 1] << 8);
    return qtype == QType::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}
}  // namespace

RefMatrix ref_matrix(QType qtype, const uint8_t* data, uint64_t rows, uint64_t cols) {
    RefMatrix m{qtype, rows, cols, std::vector<double>(rows * cols), {}};
    m.magnitude.resize(rows * cols);
    const uint64_t stride = *qtype_row_bytes(qtype, cols);
    const QTypeTraits& tr = qtype_traits(qtype);
    std::vector<float> row(cols);
    for (uint64_t r = 0; r < rows; ++r) {
        const uint8_t* bytes = data + r * stride;
        if (tr.is_float) {
            for (uint64_t j = 0; j < cols; ++j) {
                m.w[r * cols + j] = stored_float(qtype, bytes, j);
                m.magnitude[r * cols + j] = std::fabs(m.w[r * cols + j]);
            }
            continue;
        }
        dequantize_row_ref(qtype, bytes, cols, row.data());
        const uint64_t group = tr.group ? tr.group : cols;
        for (uint64_t j = 0; j < cols; ++j) {
            const double s =
                std::fabs(static_cast<double>(row_group_scale(qtype, bytes, cols, j / group)));
            const double z = std::abs(row_group_zero(qtype, bytes, cols, j / group));
            m.w[r * cols + j] = row[j];
            // Super-block types: |scale * code - min| <= scale * |code| + |min| (min 0 otherwise).
            const double mn =
                std::fabs(static_cast<double>(row_group_min(qtype, bytes, cols, j / group)));
            m.magnitude[r * cols + j] = s * (std::abs(row_code(qtype, bytes, j)) + z) + mn;
        }
    }
    return m;
}

ProductRef ref_product(const RefMatrix& m, uint64_t r, const float* x, double bias, double prior) {
    const uint64_t k = m.cols;
    const double* w = m.w.data() + r * k;
    const double* mag = m.magnitude.data() + r * k;
    ProductRef p;
    p.qtype = m.qtype;
    p.k = k;
    p.value = bias + prior;
    p.magnitude = p.magnitude_int8 = std::fabs(bias) + std::fabs(prior);
    double super_mag = 0.0;
    for (uint64_t b = 0; b < k; b += kActBlock) {
        const uint64_t e = std::min(k, b + kActBlock);
        double amax = 0.0;
        for (uint64_t j = b; j < e; ++j) amax = std::max(amax, std::fabs(double{x[j]}));
        // d = fl(amax / 127) is at most (1 + u) amax / 127; the element error d (1/2 + 2^-16).
        const double err = (1.0 + kU) * amax / 127.0 * (0.5 + 0x1p-16);
        for (uint64_t j = b; j < e; ++j) {
            const double ax = std::fabs(double{x[j]}), aw = std::fabs(w[j]);
            p.value += w[j] * x[j];
            p.act += aw * err;
            p.magnitude_int8 += mag[j] * (ax + err);
            p.sum_w += aw;
            p.sum_x += ax;
            p.sum_wx += aw * ax;
            super_mag += mag[j] * ax;
        }
    }
    // Super-block types' float products sum scale * code * x and min * x apart (the CUDA GEMV's
    // scale * sum code x - min * sum x): their rounding scales with those terms, not |w x|.
    p.magnitude += qtype_has_super_blocks(m.qtype) ? super_mag : p.sum_wx;
    return p;
}

RefValue ProductRef::at(const Numerics& num) const {
    const bool quantized = qtype_is_quantized(qtype);
    const bool int8 = quantized && num.int8_activations;
    const double blocks = static_cast<double>((k + kActBlock - 1) / kActBlock);
    double roundings = static_cast<double>(k) + 1;
    if (num.cpu_kernels) {
        if (!quantized)
            roundings = blocks + 16;
        else if (int8 || !num.scalar)
            roundings = blocks + 8;
    }
    roundings += 2;  // the bias add and the accumulate
    double bound = int8 ? act + roundings * kU * magnitude_int8 : roundings * kU * magnitude;
    if (num.fp16_products) bound += 0x1p-10 * sum_wx + 0x1p-25 * (sum_w + sum_x);
    return {value, kSecondOrder * bound};
}

void ref_norm(const float* x, const std::vector<float>& weight, double eps, uint64_t d,
              std::vector<RefValue>& out) {
    double ss = 0.0;
    for (uint64_t i = 0; i < d; ++i) ss += double{x[i]} * x[i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    out.resize(d);
    for (uint64_t i = 0; i < d; ++i) {
        const double v = double{weight[i]} * x[i] * scale;
        out[i] = {v, kSecondOrder * 3 * kU * std::fabs(v)};
    }
}

RefValue ref_gated(const RefValue& g, const RefValue& up) {
    const double silu = g.value / (1.0 + std::exp(-g.value));
    const double y = silu * up.value;
    const double bound = 1.1 * g.bound * std::fabs(up.value) + std::fabs(silu) * up.bound +
                         1.1 * g.bound * up.bound + 5 * kU * std::fabs(y);
    return {y, kSecondOrder * bound};
}

RefValue ref_gated_gelu(const RefValue& g, const RefValue& up) {
    const double v = g.value, k = std::sqrt(2.0 / std::acos(-1.0));
    const double gelu = 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
    const double y = gelu * up.value;
    const double bound = 1.13 * g.bound * std::fabs(up.value) + std::fabs(gelu) * up.bound +
                         1.13 * g.bound * up.bound + 8 * kU * std::fabs(y) +
                         3 * kU * std::fabs(v * up.value);
    return {y, kSecondOrder * bound};
}

void ref_rope(const float* x, uint64_t head_dim, const std::vector<double>& inv_freq, uint64_t pos,
              std::vector<double>& rotated, std::vector<double>& bound) {
    const uint64_t half = head_dim / 2;
    rotated.resize(head_dim);
    bound.resize(head_dim);
    for (uint64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos) * inv_freq[i];
        const double c = std::cos(angle), s = std::sin(angle), a = x[i], b = x[i + half];
        rotated[i] = a * c - b * s;
        rotated[i + half] = b * c + a * s;
        bound[i] = bound[i + half] = kSecondOrder * 4 * kU * (std::fabs(a) + std::fabs(b));
    }
}

void ref_attention(const std::vector<double>& q, const std::vector<std::vector<double>>& keys,
                   const std::vector<std::vector<double>>& values, uint64_t head_dim,
                   const Numerics& num, std::vector<RefValue>& out) {
    const uint64_t len = keys.size();
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    auto norm = [](const std::vector<double>& v) {
        double s = 0.0;
        for (double e : v) s += e * e;
        return std::sqrt(s);
    };
    std::vector<double> p(len);
    double max_score = -INFINITY, max_key = 0.0;
    for (uint64_t j = 0; j < len; ++j) {
        double s = 0.0;
        for (uint64_t i = 0; i < head_dim; ++i) s += q[i] * keys[j][i];
        p[j] = s * scale;
        max_score = std::max(max_score, p[j]);
        max_key = std::max(max_key, norm(keys[j]));
    }
    double sum = 0.0;
    for (double& e : p) sum += (e = std::exp(e - max_score));
    for (double& e : p) e /= sum;
    const double dlen = static_cast<double>(len), dhd = static_cast<double>(head_dim);
    double score_err = (dhd + 16) * kU * scale * norm(q) * max_key;
    if (num.fp16_kv) score_err += 0x1p-11 * scale * norm(q) * max_key;
    double relative = 2 * score_err + (2 * dlen + 5) * kU;
    if (num.online_softmax) relative += 3 * dlen * kU;
    if (num.fp16_kv) relative += 0x1p-11;
    out.assign(head_dim, {});
    for (uint64_t i = 0; i < head_dim; ++i) {
        double weighted = 0.0;
        for (uint64_t j = 0; j < len; ++j) {
            out[i].value += p[j] * values[j][i];
            weighted += p[j] * std::fabs(values[j][i]);
        }
        out[i].bound = kSecondOrder * relative * weighted;
    }
}

}  // namespace qforge::test
