// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k and top-p. Deterministic for a seed on every platform: the generator is std::mt19937_64
// (specified bit for bit by the standard) and uniforms are made from its top 53 bits here, not
// by std::uniform_real_distribution (whose algorithm is left to the library).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace qforge {

struct SamplingParams {
    float temperature = 0.8f;  // 0: greedy
    uint32_t top_k = 40;       // 0: all tokens
    float top_p = 0.95f;       // 1: no nucleus cut
    uint64_t seed = 42;
};

// The index of the largest logit; the lowest index on ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
  public:
    explicit Sampler(SamplingParams params);
    int32_t sample(std::span<const float> logits);
    // A uniform double in [0, 1) from the generator (exposed for tests).
    double uniform();

  private:
    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;  // (probability or logit, id)
};

}  // namespace qforge
