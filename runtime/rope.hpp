// Rotary position embedding, in Hugging Face's rotate-half layout: a head vector x of width d is
// rotated as pairs (x[i], x[i + d/2]) for i < d/2, by the angle position * inv_freq[i].
// (Meta's and llama2.c's original layout rotates adjacent pairs (2i, 2i+1); converters permute
// q/k rows into this layout, see ../shared/data/stories260K/README.md.)
#pragma once

#include <cstdint>
#include <vector>

#include "formats/model_config.hpp"

namespace qforge {

// The inverse frequencies, head_dim / 2 of them, as transformers computes them:
// inv_freq[i] = rope_theta^(-2i / head_dim), then for rope_scaling "llama3" Llama 3.1's
// piecewise rescaling (_compute_llama3_parameters): wavelengths longer than
// original_max_position_embeddings / low_freq_factor are divided by `factor`, those shorter than
// original / high_freq_factor are kept, and the band between is interpolated with
// smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).
// Computed in float64 (transformers uses float32; the difference is below 1e-7 relative).
// For rope_scaling "linear" every frequency is divided by factor. `local`: the sliding layers'
// frequencies of rope_local_theta, without scaling (ModelConfig::local_rope).
std::vector<double> rope_inv_freq(const ModelConfig& config, bool local = false);

// cos and sin of position * inv_freq[i], [positions][head_dim / 2], float32, for the CPU backend.
struct RopeTable {
    uint64_t half = 0;
    std::vector<float> cos, sin;
    RopeTable() = default;
    RopeTable(const ModelConfig& config, uint64_t positions, bool local = false);
};

// Rotates one head vector in place (rotate-half layout).
inline void rope_rotate(float* x, const float* cos, const float* sin, uint64_t half) {
    for (uint64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

}  // namespace qforge
