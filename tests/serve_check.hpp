// Serving checks shared by the scheduler tests of the full build (serve_scheduler_test.cpp)
// and the GPU check's (cuda_serve_test.cpp): needs the runtime and the scheduler only, no
// converter or tokenizer.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/generate.hpp"
#include "runtime/sampling.hpp"
#include "serve/scheduler.hpp"

namespace qforge::test {

// `n` random token ids in [1, vocab) (0 is often a special token; any id runs the model).
inline std::vector<int32_t> random_ids(std::mt19937_64& rng, uint64_t n, uint64_t vocab) {
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(1 + rng() % (vocab - 1));
    return ids;
}

// Every token of a stream, until it ends (the scheduler runs on this thread: step() drives it).
struct Collected {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;  // when the request asked for them
    bool finished = false;
    serve::FinishReason reason = serve::FinishReason::length;
    std::string error;
};
inline void drain(serve::SequenceStream& s, Collected& c) {
    auto e = s.wait(std::chrono::milliseconds(0));
    c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
    c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    if (e.finished) {
        c.finished = true;
        c.reason = e.reason;
        c.error = e.error;
    }
}

// The reference for a token's log-probabilities: the last logits row of a fresh cache's forward
// over `tokens`, its log-softmax in float64 (max first, then the
// exponentials' sum in id order), and every id ranked by a full sort (logit, then lower id);
// `ids` > 0: over the first `ids` ids only (those with a token).
struct RowLogprobs {
    std::vector<double> logprob;
    std::vector<int32_t> ranked;
};
inline RowLogprobs reference_logprobs(Backend& backend, const std::vector<int32_t>& tokens,
                                      uint64_t ids = 0) {
    const uint64_t vocab = backend.model().config().vocab_size;
    auto cache = backend.new_cache(tokens.size());
    std::vector<float> logits(vocab);
    backend.forward(tokens, *cache, tokens.size() - 1, logits);
    if (ids != 0) logits.resize(ids);
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (float x : logits) m = std::max(m, static_cast<double>(x));
    for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
    RowLogprobs r;
    for (float x : logits) r.logprob.push_back(static_cast<double>(x) - m - std::log(sum));
    r.ranked.resize(logits.size());
    std::iota(r.ranked.begin(), r.ranked.end(), 0);
    std::stable_sort(r.ranked.begin(), r.ranked.end(), [&](int32_t a, int32_t b) {
        return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
    });
    return r;
}

inline serve::SequenceRequest request(std::vector<int32_t> prompt, uint64_t max_tokens,
                                      SamplingParams sampling = {0.0f, 0, 1.0f, 1}) {
    serve::SequenceRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling = sampling;
    return r;
}

// `n` requests at random arrival (0-2 a step) on `sched`, driven by step() on this thread:
// random prompts of 1-max_prompt tokens (each after one of `starts`, picked at random, when there
// are any), max_tokens 1-10, a random stop id, greedy or sampled with the request's own seed,
// each with and without presence, frequency and repetition penalties and logit biases. Each must
// give generate()'s tokens on `backend` (run first, alone). Returns the steps taken.
inline uint64_t check_random_arrivals(Backend& backend, serve::Scheduler& sched, size_t n,
                                      std::mt19937_64& rng, uint64_t max_prompt = 24,
                                      const std::vector<std::vector<int32_t>>& starts = {}) {
    const ModelConfig& c = backend.model().config();
    struct Case {
        serve::SequenceRequest req;
        std::vector<int32_t> want;
        std::shared_ptr<serve::SequenceStream> stream;
        Collected got;
    };
    std::vector<Case> cases(n);
    for (size_t i = 0; i < cases.size(); ++i) {
        // Greedy and sampled, each also with the API's penalties (on the request's own tokens,
        // which the scheduler's sampler counts as generate's does) and logit biases (sampled:
        // and min-p).
        const auto id = [&] { return static_cast<int32_t>(rng() % c.vocab_size); };
        const SamplingParams kinds[] = {
            {0.0f, 0, 1.0f, 1},
            {0.9f, 20, 0.9f, 100 + i},
            {0.0f, 0, 1.0f, 1, 1.0f, 0.5f, {{id(), 4.0f}, {id(), -100.0f}}},
            {0.9f, 20, 0.9f, 100 + i, 0.5f, -0.25f, {{id(), 2.5f}}, 0.1f}};
        SamplingParams sp = kinds[i % 4];
        if (i % 4 >= 2) {  // and the repetition penalty over the prompt and the request's tokens
            sp.repetition_penalty = i % 4 == 2 ? 1.3f : 0.8f;
            sp.repetition_last_n = i % 4 == 2 ? 0 : 8;  // the whole context, its last 8 tokens
        }
        std::vector<int32_t> prompt;
        if (!starts.empty()) prompt = starts[rng() % starts.size()];
        const auto tail = random_ids(rng, 1 + rng() % max_prompt, c.vocab_size);
        prompt.insert(prompt.end(), tail.begin(), tail.end());
        cases[i].req = request(std::move(prompt), 1 + rng() % 10, sp);
        cases[i].req.stop_ids = {static_cast<int32_t>(rng() % c.vocab_size)};
        GenerateOptions o;
        o.sampling = sp;
        o.max_new_tokens = cases[i].req.max_tokens;
        o.stop_ids = cases[i].req.stop_ids;
        cases[i].want = generate(backend, cases[i].req.prompt, o).tokens;
    }
    const uint64_t steps_before = sched.stats().steps;
    size_t next = 0;
    while (next < cases.size() ||
           std::any_of(cases.begin(), cases.end(), [](auto& k) { return !k.got.finished; })) {
        for (uint64_t arrivals = rng() % 3; arrivals > 0 && next < cases.size(); --arrivals) {
            auto sub = sched.submit(cases[next].req);
            REQUIRE(sub.stream);
            cases[next++].stream = sub.stream;
        }
        sched.step();
        for (auto& k : cases)
            if (k.stream && !k.got.finished) drain(*k.stream, k.got);
    }
    for (size_t i = 0; i < cases.size(); ++i) {
        INFO("request " << i << ": " << cases[i].got.error);
        CHECK(cases[i].got.tokens == cases[i].want);
    }
    return sched.stats().steps - steps_before;
}

}  // namespace qforge::test
