// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k, top-p and min-p, after the OpenAI API's presence and frequency penalties. Deterministic
// for a seed on every platform: the generator is std::mt19937_64 (specified bit for bit by the
// standard) and uniforms are made from its top 53 bits here, not by
// std::uniform_real_distribution (whose algorithm is left to the library).
//
// Before each choice, in float: a token's logit_bias is added to its logit (the API's: -100
// bans a token in practice, 100 all but forces it); then the repetition penalty p (Hugging Face
// transformers', vLLM's and llama.cpp's; not the OpenAI API's), over the tokens of the context:
// the prompt the sampler was made with and the tokens it has chosen, the last
// `repetition_last_n` of them (0: all, as transformers and vLLM; llama.cpp's default is 64):
// the logit l of each distinct token among them becomes fl(l / p) if l > 0, else fl(l * p);
// then the API's presence and frequency penalties, which count the tokens this sampler has
// chosen (the completion so far, as the API and vLLM define them; not the prompt): the logit of
// a token chosen c > 0 times becomes fl(fl(l - fl(c * frequency_penalty)) - presence_penalty).
// Both are in [-2, 2]; negative values favour repeats, as a repetition penalty below 1 does. Ids
// past the logits' end are ignored. The order is vLLM's (bias, repetition, frequency, presence).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/token_constraint.hpp"

namespace qforge {

// The repetition penalty's range. vLLM takes any value above 0 and llama.cpp any number; past
// these bounds a repeated token is all but forced or all but banned either way, and a positive
// logit divided by a penalty near 0 would overflow to infinity.
inline constexpr float kMinRepetitionPenalty = 0.01f, kMaxRepetitionPenalty = 100.0f;

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
    // In [kMinRepetitionPenalty, kMaxRepetitionPenalty]; 1: none. Above 1 discourages repeats
    // of the context's tokens, below 1 favours them.
    float repetition_penalty = 1.0f;
    uint64_t repetition_last_n = 0;  // the context's last tokens it looks at; 0: all of them
    // Set: only tokens that keep the text a document of the grammar (runtime/token_constraint.hpp)
    // have a chance, after everything above; the stop tokens once the document is whole.
    std::shared_ptr<const TokenGrammar> grammar = nullptr;
};

// One `--logit-bias ID=BIAS` (qforge generate): a token id and a bias in [-100, 100]; throws
// Error naming the option and the text otherwise.
std::pair<int32_t, float> parse_logit_bias(std::string_view text);

// The index of the largest logit; the lowest index on ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
  public:
    // `context`: the prompt's tokens, which the repetition penalty counts with the chosen ones
    // (the rest of the sampling never looks at them).
    explicit Sampler(SamplingParams params, std::span<const int32_t> context = {});
    int32_t sample(std::span<const float> logits);
    // With a grammar: the document is whole and no token may continue it (generation ends).
    bool finished() const { return matcher_ && matcher_->finished(); }
    // A uniform double in [0, 1) from the generator (exposed for tests).
    double uniform();

  private:
    bool repeats() const { return params_.repetition_penalty != 1.0f; }
    // logits, or (with a bias, or a penalty on a token already chosen) an adjusted copy.
    std::span<const float> adjusted(std::span<const float> logits);
    int32_t choose(std::span<const float> logits);
    // choose() over the tokens the grammar allows.
    int32_t choose_allowed(std::span<const float> logits);

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;  // (probability or logit, id)
    // With a penalty: how often each token was chosen (grown to the largest id), the ids chosen
    // at least once (in first-chosen order); the adjusted copy of the logits.
    std::vector<uint32_t> counts_;
    std::vector<int32_t> chosen_;
    std::vector<float> adjusted_;
    // With a repetition penalty: the context's tokens (the prompt's, then the chosen ones; the
    // older ones past the window are dropped now and then), and per id the last choice (counted
    // in `choice_`) whose logits it was penalised in, so each distinct id is penalised once.
    std::optional<TokenMatcher> matcher_;  // with a grammar
    std::vector<float> masked_;
    std::vector<int32_t> context_;
    std::vector<uint64_t> penalised_;
    uint64_t choice_ = 0;
};

}  // namespace qforge
