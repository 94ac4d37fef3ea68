// Text generation: the prompt is prefilled as one batch, then tokens are chosen one at a time
// (runtime/sampling.hpp) and decoded with the same KV cache. Token ids only; the CLI turns them
// into text with the tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/sampling.hpp"

namespace qforge {

struct GenerateOptions {
    SamplingParams sampling;
    uint64_t max_new_tokens = 128;
    std::vector<int32_t> stop_ids;  // generation ends when one is chosen (it is not emitted)
    // Ids from this one on have no token (a tokenizer smaller than the embedding: padding rows,
    // as Qwen2.5 and Phi-3 have); they are never chosen, greedy or sampled. 0: every id has one.
    uint64_t token_count = 0;
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // the new tokens, without the prompt and without a stop id
    // document: a constrained generation's text (a JSON document, a pattern's match) is whole and
    // nothing may continue it (as a stop token would end it, for a vocabulary without one).
    enum class Stop { length, stop_id, context_full, document } stop = Stop::length;
    double prompt_seconds = 0.0;  // prefill
    double decode_seconds = 0.0;  // every decode step
    uint64_t decode_steps = 0;    // forward passes after the prefill
};

// Runs the prompt (non-empty) and generates up to max_new_tokens tokens, calling on_token for
// each as soon as it is chosen. The context holds min(prompt + max_new_tokens,
// max_position_embeddings) positions; a prompt that does not fit is an Error saying so, and
// generation that reaches the end of the context stops with Stop::context_full. Logits that are
// not finite are an Error naming the model and the position.
GenerateResult generate(Backend& backend, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace qforge
