#include "runtime/generate.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.hpp"
#include "runtime/logits_check.hpp"

namespace qforge {

GenerateResult generate(Backend& backend, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token) {
    const ModelConfig& c = backend.model().config();
    if (prompt.empty()) throw Error("generate: the prompt has no tokens (it needs at least BOS)");
    if (prompt.size() > c.max_position_embeddings)
        throw Error(backend.model().path(), {},
                    "the prompt has " + std::to_string(prompt.size()) +
                        " tokens; the model's context holds " +
                        std::to_string(c.max_position_embeddings) + " positions");
    const uint64_t capacity =
        std::min<uint64_t>(prompt.size() + options.max_new_tokens, c.max_position_embeddings);
    auto cache = backend.new_cache(capacity);
    Sampler sampler(options.sampling, prompt);
    std::vector<float> logits(c.vocab_size);
    GenerateResult result;
    const uint64_t sampleable =
        options.token_count == 0 ? c.vocab_size : std::min(options.token_count, c.vocab_size);
    const auto next_id = [&] {
        if (!all_finite(logits)) {
            const uint64_t at = cache->size() - 1;
            throw_non_finite_logits(
                logits, backend.model().path(),
                "position " + std::to_string(at) +
                    (at + 1 == prompt.size()
                         ? " (the last prompt token)"
                         : " (generated token " + std::to_string(at + 1 - prompt.size()) + ")"));
        }
        // An id without a token cannot be emitted: it gets probability 0, argmax never picks it.
        std::fill(logits.begin() + static_cast<std::ptrdiff_t>(sampleable), logits.end(),
                  -std::numeric_limits<float>::infinity());
        return sampler.sample(logits);
    };

    auto t0 = std::chrono::steady_clock::now();
    backend.forward(prompt, *cache, prompt.size() - 1, logits);
    result.prompt_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    t0 = std::chrono::steady_clock::now();
    while (result.tokens.size() < options.max_new_tokens) {
        const int32_t next = next_id();
        if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) !=
            options.stop_ids.end()) {
            result.stop = GenerateResult::Stop::stop_id;
            break;
        }
        result.tokens.push_back(next);
        if (on_token) on_token(next);
        if (sampler.finished()) {
            result.stop = GenerateResult::Stop::document;
            break;
        }
        if (result.tokens.size() == options.max_new_tokens) break;
        if (cache->size() == cache->capacity()) {
            result.stop = GenerateResult::Stop::context_full;
            break;
        }
        backend.forward({&next, 1}, *cache, 0, logits);
        ++result.decode_steps;
    }
    result.decode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
}

}  // namespace qforge
