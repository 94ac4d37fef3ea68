// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k and top-p, after the OpenAI API's presence and frequency penalties. Deterministic for a
// seed on every platform: the generator is std::mt19937_64 (specified bit for bit by the
// standard) and uniforms are made from its top 53 bits here, not by
// std::uniform_real_distribution (whose algorithm is left to the library).
//
// The penalties count the tokens this sampler has chosen (the completion so far, as the API and
// vLLM define them; not the prompt): before each choice, the logit of a token chosen c > 0 times
// becomes fl(fl(logit - fl(c * frequency_penalty)) - presence_penalty), in float, every other
// logit unchanged. Both are in [-2, 2]; negative values favour repeats.
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
    float presence_penalty = 0.0f;   // subtracted once from a chosen token's logit
    float frequency_penalty = 0.0f;  // subtracted per time a token was chosen
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
    // logits, or (when a penalty applies to a token already chosen) a penalized copy of them.
    std::span<const float> penalized(std::span<const float> logits);
    int32_t choose(std::span<const float> logits);

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;  // (probability or logit, id)
    // With a penalty: how often each token was chosen (grown to the largest id), the ids chosen
    // at least once (in first-chosen order), and the penalized copy of the logits.
    std::vector<uint32_t> counts_;
    std::vector<int32_t> chosen_;
    std::vector<float> penalized_;
};

}  // namespace qforge
