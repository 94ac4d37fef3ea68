#include "runtime/rope.hpp"

#include <cmath>
#include <numbers>

namespace qforge {

std::vector<double> rope_inv_freq(const ModelConfig& c, bool local) {
    const uint64_t half = c.head_dim / 2;
    std::vector<double> inv(half);
    const double theta = local ? c.rope_local_theta : c.rope_theta;
    for (uint64_t i = 0; i < half; ++i)
        inv[i] =
            1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    if (local) return inv;
    if (c.rope_scaling.type == "linear")
        for (double& f : inv) f /= c.rope_scaling.factor;
    if (c.rope_scaling.type == "llama3") {
        const auto& s = c.rope_scaling;
        const double original = static_cast<double>(s.original_max_position_embeddings);
        const double low_freq_wavelen = original / s.low_freq_factor;
        const double high_freq_wavelen = original / s.high_freq_factor;
        for (double& f : inv) {
            const double wavelen = 2.0 * std::numbers::pi / f;
            if (wavelen > low_freq_wavelen) {
                f /= s.factor;
            } else if (!(wavelen < high_freq_wavelen)) {  // the band between: interpolate
                const double smooth = (original / wavelen - s.low_freq_factor) /
                                      (s.high_freq_factor - s.low_freq_factor);
                f = (1.0 - smooth) * f / s.factor + smooth * f;
            }
        }
    }
    return inv;
}

RopeTable::RopeTable(const ModelConfig& config, uint64_t positions, bool local)
    : half(config.head_dim / 2) {
    const auto inv = rope_inv_freq(config, local);
    cos.resize(positions * half);
    sin.resize(positions * half);
    for (uint64_t p = 0; p < positions; ++p)
        for (uint64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(p) * inv[i];
            cos[p * half + i] = static_cast<float>(std::cos(angle));
            sin[p * half + i] = static_cast<float>(std::sin(angle));
        }
}

}  // namespace qforge
