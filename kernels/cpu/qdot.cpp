// Activation preparation, the scalar reference products and the run-time dispatch of
// kernels/cpu/qdot.hpp. The scalar versions are written for obviousness: one weight at a time,
// codes read through formats/qtype.hpp's accessors.
#include "kernels/cpu/qdot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/half.hpp"
#include "kernels/cpu/float_dot.hpp"

namespace qforge {

namespace {

constexpr uint64_t kBlock = 32;  // activation block: one float scale per 32 int8 codes

}  // namespace

void QActivations::prepare(Mode mode, const float* x, uint64_t n, uint64_t k) {
    mode_ = mode;
    n_ = n;
    k_ = k;
    blocks_ = (k + kBlock - 1) / kBlock;
    const uint64_t padded = blocks_ * kBlock;
    if (mode == Mode::f32) {
        f_.assign(n * padded, 0.0f);
        for (uint64_t t = 0; t < n; ++t) std::copy(x + t * k, x + t * k + k, f_.data() + t * padded);
        return;
    }
    q_.assign(n * padded, 0);
    d_.assign(n * blocks_, 0.0f);
    s_.assign(n * blocks_, 0);
    for (uint64_t t = 0; t < n; ++t) {
        const float* xt = x + t * k;
        for (uint64_t b = 0; b < blocks_; ++b) {
            const uint64_t e = std::min(k, (b + 1) * kBlock);
            float amax = 0.0f;
            bool finite = true;
            for (uint64_t j = b * kBlock; j < e; ++j) {
                finite = finite && std::isfinite(xt[j]);
                amax = std::max(amax, std::fabs(xt[j]));
            }
            float d = amax / 127.0f;
            int8_t* q = q_.data() + t * padded;
            int32_t sum = 0;
            if (!finite) {
                // Codes 0 and a NaN scale: every product with this block is NaN, as in f32 mode.
                d = std::numeric_limits<float>::quiet_NaN();
            } else if (d > 0.0f) {  // d underflows to 0 only for blocks of tiny subnormals
                for (uint64_t j = b * kBlock; j < e; ++j) {
                    const float r = std::clamp(std::nearbyint(xt[j] / d), -127.0f, 127.0f);
                    q[j] = static_cast<int8_t>(r);
                    sum += q[j];
                }
            } else {
                d = 0.0f;
            }
            d_[t * blocks_ + b] = d;
            s_[t * blocks_ + b] = sum;
        }
    }
}

void qmatmul_scalar(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                    const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    const QTypeTraits& tr = qtype_traits(t);
    const uint64_t k = a.k();
    if (k == 0) {
        for (uint64_t tok = t0; tok < t1; ++tok)
            for (uint64_t r = r0; r < r1; ++r) out[(tok - t0) * ldo + (r - r0)] = 0.0f;
        return;
    }
    std::vector<float> wrow(k);
    for (uint64_t r = r0; r < r1; ++r) {
        const uint8_t* row = w + r * stride;
        if (a.mode() == QActivations::Mode::f32 || tr.is_float) {
            // Exact weights (dequantization is exact), then one float product at a time.
            if (tr.is_float)
                row_to_f32(t, row, wrow.data(), k);
            else
                dequantize_row_ref(t, row, k, wrow.data());
            for (uint64_t tok = t0; tok < t1; ++tok) {
                float acc = 0.0f;
                if (a.mode() == QActivations::Mode::f32) {
                    const float* x = a.floats(tok);
                    for (uint64_t j = 0; j < k; ++j) acc += wrow[j] * x[j];
                } else {  // float rows times int8 activations: the dequantized d * q
                    for (uint64_t j = 0; j < k; ++j)
                        acc += wrow[j] * (a.scales(tok)[j / kBlock] *
                                          static_cast<float>(a.codes(tok)[j]));
                }
                out[(tok - t0) * ldo + (r - r0)] = acc;
            }
            continue;
        }
        // int8 mode: per 32-block an exact integer dot product with the zero folded in, scaled
        // by the group's scale times the block's activation scale.
        const QRowLayout l = *qtype_row_layout(t, k);
        for (uint64_t tok = t0; tok < t1; ++tok) {
            const int8_t* q = a.codes(tok);
            float acc = 0.0f;
            for (uint64_t b = 0; b < a.blocks(); ++b) {
                const uint64_t g = b * kBlock / l.group;
                const int32_t z = row_group_zero(t, row, k, g);
                int32_t isum = 0;
                for (uint64_t i = b * kBlock; i < (b + 1) * kBlock; ++i)
                    isum += row_code(t, row, i) * q[i];  // codes past k meet zero activations
                isum -= z * a.sums(tok)[b];
                const float s = row_group_scale(t, row, k, g);
                acc += (s * a.scales(tok)[b]) * static_cast<float>(isum);
            }
            out[(tok - t0) * ldo + (r - r0)] = acc;
        }
    }
}

void qmatmul(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
             const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo) {
    qmatmul_scalar(t, w, stride, r0, r1, a, t0, t1, out, ldo);
}

void dequantize_rows(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                     float* out) {
    for (uint64_t r = 0; r < n; ++r) dequantize_row_ref(t, w + r * stride, k, out + r * k);
}

}  // namespace qforge
