// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k, top-p and min-p, after the OpenAI API's presence and frequency penalties. Deterministic
// for a seed on every platform: the generator is std::mt19937_64 (specified bit for bit by the
// standard) and uniforms are made from its top 53 bits here, not by
// std::uniform_real_distribution (whose algorithm is left to the library).
//
// Before each choice, in float: a token's logit_bias is added to its logit (the API's: -100
// bans a token in practice, 100 all but forces it); then the penalties, which count the tokens
// this sampler has chosen (the completion so far, as the API and vLLM define them; not the
// prompt): the logit of a token chosen c > 0 times becomes fl(fl(l - fl(c * frequency_penalty)) -
// presence_penalty). Both penalties are in [-2, 2]; negative values favour repeats. Ids past the
// logits' end are ignored.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace qforge {

struct SamplingParams {
    float temperature = 0.8f;  // 0: greedy
    uint32_t top_k = 40;       // 0: all tokens
    float top_p = 0.95f;       // 1: no nucleus cut
    uint64_t seed = 42;
    float presence_penalty = 0.0f;   // subtracted once from a chosen token's logit
    float frequency_penalty = 0.0f;  // subtracted per time a token was chosen
    std::vector<std::pair<int32_t, float>> logit_bias = {};  // (id >= 0, bias in [-100, 100])
    // In [0, 1]: after top-k and top-p, tokens less likely than min_p times the most likely one
    // are dropped (vLLM's and llama.cpp's min_p); 0: none.
    float min_p = 0.0f;
};

// One `--logit-bias ID=BIAS` (qforge generate): a token id and a bias in [-100, 100]; throws
// Error naming the option and the text otherwise.
std::pair<int32_t, float> parse_logit_bias(std::string_view text);

// The index of the largest logit; the lowest index on ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
  public:
    explicit Sampler(SamplingParams params);
    int32_t sample(std::span<const float> logits);
    // A uniform double in [0, 1) from the generator (exposed for tests).
    double uniform();

  private:
    // logits, or (with a bias, or a penalty on a token already chosen) an adjusted copy.
    std::span<const float> adjusted(std::span<const float> logits);
    int32_t choose(std::span<const float> logits);

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;  // (probability or logit, id)
    // With a penalty: how often each token was chosen (grown to the largest id), the ids chosen
    // at least once (in first-chosen order); the adjusted copy of the logits.
    std::vector<uint32_t> counts_;
    std::vector<int32_t> chosen_;
    std::vector<float> adjusted_;
};

}  // namespace qforge
