// Perplexity and KL divergence over a tokenized text, by two protocols:
//
// llamacpp (llama-perplexity's default, tools/perplexity/perplexity.cpp): the text is cut into
//   floor(N / ctx) chunks of ctx tokens; when the tokenizer adds BOS, the first token of every
//   chunk is replaced by BOS for the forward pass (the scored targets keep the text's tokens);
//   the logits at positions ctx/2 .. ctx-2 score tokens ctx/2+1 .. ctx-1 of the chunk. It needs
//   at least 2 * ctx tokens, as llama-perplexity does.
// gptq (GPTQ/AutoGPTQ's evaluation, ../shared/data/stories260K/README.md): floor(N / ctx)
//   non-overlapping windows (the partial tail dropped), nothing replaced, tokens 1 .. ctx-1 of
//   every window scored given the earlier tokens of the window. It needs at least ctx tokens.
//
// PPL = exp(mean NLL); its standard error by the delta method, as llama-perplexity reports it:
// stderr(PPL) = PPL * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)).
// With a base model both run over the same chunks in one pass; per scored position:
// KL(base || model) = sum_v p_base(v) (log p_base(v) - log p(v)), whether the two argmaxes agree,
// and dp = p(target) - p_base(target); reported as mean KL with its standard error, top-1
// agreement and RMS(dp) (llama-perplexity's "RMS Δp").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/backend.hpp"

namespace qforge {

enum class PplProtocol : uint8_t { llamacpp, gptq };
std::optional<PplProtocol> ppl_protocol_from_name(std::string_view name);
std::string_view ppl_protocol_name(PplProtocol p);

struct PplPlan {
    PplProtocol protocol = PplProtocol::llamacpp;
    uint64_t ctx = 512;
    uint64_t n_chunks = 0;
    uint64_t first_scored = 0;               // index in a chunk of the first scored token
    std::optional<int32_t> bos_replacement;  // llamacpp with add_bos: each chunk starts with it

    uint64_t scored_per_chunk() const { return ctx - first_scored; }
};

// The chunks to evaluate for `n_tokens` tokens; `max_chunks` 0 means all. Throws qforge::Error
// when the text is too short for the protocol or ctx < 2.
PplPlan plan_perplexity(PplProtocol protocol, uint64_t n_tokens, uint64_t ctx, uint64_t max_chunks,
                        bool add_bos, std::optional<int32_t> bos_id);

// Negative log-likelihoods, accumulated in float64.
struct NllStats {
    double sum = 0.0, sum2 = 0.0;
    uint64_t count = 0;
    void add(double nll) {
        sum += nll;
        sum2 += nll * nll;
        ++count;
    }
    double ppl() const;
    double ppl_stderr() const;  // 0 when count < 2
};

struct KlStats {
    double sum_kl = 0.0, sum_kl2 = 0.0, sum_dp2 = 0.0;
    uint64_t same_top = 0, count = 0;
    double mean_kl() const;
    double kl_stderr() const;
    double top1_agreement() const;
    double rms_dp() const;
};

// -log softmax(logits)[target], in float64.
double token_nll(std::span<const float> logits, int32_t target);

// A chosen token's log-probability under logits (log softmax in float64, as token_nll) and the
// `top` most likely ids with theirs, most likely first (equal logits: the lower id first).
struct TokenLogprobs {
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
};
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, uint32_t top);
// Adds one position's KL, top-1 agreement and dp to `stats`.
void add_kl(std::span<const float> base_logits, std::span<const float> logits, int32_t target,
            KlStats& stats);

struct PplResult {
    NllStats nll;
    std::optional<KlStats> kl;         // with a base model
    std::optional<NllStats> base_nll;  // with a base model: its own perplexity, the same tokens
    uint64_t n_chunks = 0;
    uint64_t tokens_evaluated = 0;  // forward-pass tokens of the model (not counting the base)
    double seconds = 0.0;
};

// Called after every chunk with the chunks done and the statistics so far.
using PplProgress = std::function<void(uint64_t chunks_done, const NllStats& nll)>;

// Runs the plan. `base` may be null; when given, its vocabulary must match the model's.
PplResult run_perplexity(Backend& model, Backend* base, std::span<const int32_t> tokens,
                         const PplPlan& plan, const PplProgress& progress = {});

}  // namespace qforge
